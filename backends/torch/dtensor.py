"""The DTensor adapter: projected placements (``metaspmd.placement``) as
``torch.distributed.tensor`` placements, and whether DTensor has a rule of its own.

``register()``, ``register_op`` and ``parallelize`` all place values through here.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._ops._math_ops import (
    _NormPartial,  # reduce(norm2); DTensor keeps it private
)

from metaspmd import placement as mp


def to_dtensor(p: mp.Placement):
    """One mesh axis's placement as DTensor's."""
    if isinstance(p, mp.Shard):
        return Shard(p.dim)
    if isinstance(p, mp.Partial):
        if p.op in mp.ARG_PARTIAL_OPS:
            raise ValueError(f"DTensor has no placement for {p}: positions pending an arg-reduction")
        return _NormPartial(2) if p.op == "norm2" else Partial(p.op)
    return Replicate()


def to_dtensor_placements(ps) -> tuple:
    """A placement per mesh axis (or per tensor of a rule) as DTensor's."""
    return tuple(to_dtensor(p) for p in ps)


def from_dtensor(p) -> mp.Placement:
    """DTensor's placement (or metaspmd's, kept) as metaspmd's."""
    if isinstance(p, (mp.Shard, mp.Partial, mp.Replicate)):
        return p
    if isinstance(p, Shard):
        return mp.Shard(p.dim)
    if isinstance(p, _NormPartial):
        return mp.Partial("norm2")
    if isinstance(p, Partial):
        return mp.Partial(p.reduce_op)
    if isinstance(p, Replicate):
        return mp.REPLICATE
    raise TypeError(f"not a placement: {p!r}")


def dtensor_has_rule(op: torch._ops.OpOverload, handlers: bool = True) -> bool:
    """Whether DTensor runs ``op`` its own way: a rule, or (``handlers``) a custom handler,
    which runs before any rule, so a strategy installed beside it would never be consulted.
    A runtime that checks DTensor's answer against a plan asks for rules only: a handler
    (``as_strided``'s refuses any DTensor) proposes no placements to check."""
    p = DTensor._op_dispatcher.sharding_propagator
    rule = op in p.op_single_dim_strategy_funcs or op in p.op_strategy_funcs or op in p.op_to_rules
    return rule or (handlers and op in DTensor._op_dispatcher._custom_op_handlers)


def rewrites_shape_args(func: torch._ops.OpOverload) -> bool:
    """Does DTensor rewrite the op's size arguments to each rank's local sizes before it
    runs a shard (views, factories, upsample backward, group norm's N, squeeze)? A call
    replayed from the global arguments is then not the call a rank makes."""
    p = DTensor._op_dispatcher.sharding_propagator
    return (func in p.op_to_shape_and_stride_idx or func in p.op_to_scalar_shape_adjuster
            or func in p.squeeze_op_to_dims_variant)


__all__ = ["dtensor_has_rule", "from_dtensor", "rewrites_shape_args", "to_dtensor", "to_dtensor_placements"]
