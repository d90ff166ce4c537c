"""Keeping DTensor's masked Partial where its mask lines up.

A row-cut ``embedding`` (and ``gather`` of an input cut along its dim) gives a
``_MaskPartial``: each rank's output holds garbage where its shard lacked the index, and
the reduction zeroes those positions by a mask shaped like the indices before it sums.
DTensor 2.13's view, slice, reduction and concatenation rules pass a Partial through as
it is, the mask too, so the mask is later laid on a tensor whose positions have moved:
``e.transpose(0, 1)`` of a (3, 3) batch of indices zeroes the wrong elements, with no
error, and most other shapes raise an IndexError from the mask. Guarded: a masked Partial
is reduced before any op that would run on it; ops that reduce it first (DTensor's
pointwise rules do) and those that make one run as they did.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# the guard's name in RegisterReport.guarded
MASKS_REDUCED = "DTensor reduces a masked Partial (a row-cut embedding's) before an op could move its positions"


def _is_mask(p: Any) -> bool:
    from torch.distributed.tensor.placement_types import _MaskPartial

    return isinstance(p, _MaskPartial)


def _masked(spec: Any) -> bool:
    return any(_is_mask(p) for p in getattr(spec, "placements", ()))


def _runs_on_masks(output_sharding, op_schema) -> bool:
    """Does the op run on a masked Partial (in the schema DTensor redistributes to, else
    the call's own)? Its local outputs then hold the garbage rows, whatever it calls them."""
    ran = output_sharding.redistribute_schema if output_sharding.needs_redistribute else None
    return any(_masked(s) for s in (ran or op_schema).args_spec)


def _reduced(op_schema):
    """``op_schema`` with every masked Partial of its tensor arguments replaced by Replicate."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSchema
    from torch.utils._pytree import tree_map

    def unmask(x):
        if isinstance(x, DTensorSpec) and _masked(x):
            placements = tuple(Replicate() if _is_mask(p) else p for p in x.placements)
            return DTensorSpec(x.mesh, placements, tensor_meta=x.tensor_meta)
        return x

    return OpSchema(op_schema.op, tree_map(unmask, op_schema.args_schema), tree_map(unmask, op_schema.kwargs_schema),
                    schema_info=op_schema.schema_info)


def guarded(propagate):
    """``propagate`` (DTensor's propagation of an op schema) that, where the op would run
    on a masked Partial, propagates with the masked inputs Replicate and has DTensor
    redistribute them so (the reduction applies the mask where it belongs). The lookup
    that makes one takes its indices Replicate, so it runs as before."""
    def propagate_op_sharding(op_schema):
        found = propagate(op_schema)
        if not any(_masked(s) for s in op_schema.args_spec) or not _runs_on_masks(found, op_schema):
            return found
        reduced = _reduced(op_schema)
        out = propagate(reduced)
        if out.needs_redistribute:
            return out
        return dataclasses.replace(out, redistribute_schema=reduced, needs_redistribute=True)

    return propagate_op_sharding


_SAVED: dict = {}  # the propagator -> its own cached propagate_op_sharding, while guarded


def guard(propagator) -> bool:
    """Put the guard in ``propagator`` (both of its entry points, the cached one DTensor's
    dispatch uses and the uncached one its C++ fast path falls back to); False where it is
    there already."""
    if propagator in _SAVED:
        return False
    from torch.distributed.tensor._sharding_prop import LocalLRUCache

    own = type(propagator).propagate_op_sharding_non_cached.__get__(propagator)
    _SAVED[propagator] = propagator.propagate_op_sharding
    propagator.propagate_op_sharding_non_cached = guarded(own)
    propagator.propagate_op_sharding = LocalLRUCache(propagator.propagate_op_sharding_non_cached)
    return True


def unguard(propagator) -> None:
    if propagator not in _SAVED:
        return
    propagator.propagate_op_sharding = _SAVED.pop(propagator)
    propagator.__dict__.pop("propagate_op_sharding_non_cached", None)
