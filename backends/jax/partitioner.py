"""custom_partitioning driven by a generated JAX table entry.

``partitioned(fn, entry)`` wraps a single-output function with
jax.experimental.custom_partitioning: Shardy propagates with the entry's factor rule
(``shardy``: the rule with its reduction and need-replication factors), and the partition
callback runs ``fn`` on the local shards exactly as one of the entry's verified strategies
says, projected onto ``JAX_PARTITION``: a Partial(sum) output finished with a ``psum``, an
argreduce output (argmax over a cut dim) with an all-gather of (value, position) pairs.
Operand shardings that match no verified strategy are replicated first, so the result is
always right.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import PartitionSpec

from metaspmd.placement import Partial, Replicate, Shard
from metaspmd.spec import ArgReduce, ShardIn
from metaspmd.table import Entry, rule_entry
from metaspmd.target import JAX_PARTITION, project

from .collectives import arg_reduce
from .shardings import cut_along


def _sharded_dims(spec: PartitionSpec, rank: int) -> dict[str, int]:
    """mesh axis -> the operand dim it shards (one axis per dim)."""
    out = {}
    for d, entry in enumerate(tuple(spec) + (None,) * (rank - len(spec))):
        for axis in (entry if isinstance(entry, tuple) else (entry,)):
            if axis is not None:
                out[axis] = d
    return out


def _plain(entry: Entry) -> list[tuple[tuple, int | None, object]]:
    """The entry's strategies the callback runs as they are (inputs Shard or Replicate, one
    output): (input dims, output dim, pending finish: None, 'sum' or the ArgReduce)."""
    out = []
    for s in rule_entry("", entry).all_strategies():
        # inputs as they are: no Partial, no positions to move, no slice to even out
        if not all(isinstance(p, Replicate) or (isinstance(p, ShardIn) and p.plain) for p in s.inputs):
            continue
        a = project(s, JAX_PARTITION)
        if not a or len(a.outputs) != 1:
            continue
        (o,) = a.outputs
        pending = None
        if isinstance(o, Partial):
            pending = o.op if o.op == "sum" else next(c for c in s.outputs[0].options if isinstance(c, ArgReduce))
        out.append((tuple(p.dim if isinstance(p, Shard) else None for p in a.inputs),
                    o.dim if isinstance(o, Shard) else None, pending))
    return out


def _choose(strategies, specs: list[PartitionSpec], ranks: list[int]):
    """(axis, strategy) when the operands are sharded over one axis as a verified strategy
    says, or None (then everything is replicated)."""
    by_axis = [_sharded_dims(s, r) for s, r in zip(specs, ranks)]
    axes = {a for m in by_axis for a in m}
    if len(axes) != 1:
        return None
    (axis,) = axes
    dims = tuple(m.get(axis) for m in by_axis)
    for s in strategies:
        if s[0] == dims:
            return axis, s
    return None


def _divides(chosen, shapes: list[tuple[int, ...]], mesh_shape) -> bool:
    """Does the mesh axis split every dim the chosen strategy shards evenly?"""
    axis, (dims, _, _) = chosen
    return all(dim is None or shape[dim] % mesh_shape[axis] == 0 for dim, shape in zip(dims, shapes))


def partitioned(fn: Callable, entry: Entry) -> Callable:
    """``fn`` with a custom partitioning from a ``metaspmd.generated.jax_rules`` entry."""
    if not entry.shardy:
        raise ValueError("the entry's strategies fit no Shardy factor rule")
    rule, reduction_factors, need_replication_factors = entry.shardy
    strategies = _plain(entry)
    wrapped = custom_partitioning(fn)

    def partition(mesh, arg_shapes, result_shape):
        specs = [a.sharding.spec for a in arg_shapes]
        ranks = [len(a.shape) for a in arg_shapes]
        rank_out = len(result_shape.shape)
        chosen = _choose(strategies, specs, ranks)
        if chosen is not None and not _divides(chosen, [a.shape for a in arg_shapes], mesh.shape):
            chosen = None  # uneven shards are padded: padding would join a sum or win an argmax
        if chosen is None:
            arg_shardings = tuple(cut_along(mesh, None, None, r) for r in ranks)
            return mesh, fn, cut_along(mesh, None, None, rank_out), arg_shardings
        axis, (in_dims, out_dim, pending) = chosen
        arg_shardings = tuple(cut_along(mesh, axis, dim, r) for dim, r in zip(in_dims, ranks))
        out_sharding = cut_along(mesh, axis, out_dim, rank_out)

        def lower(*args):
            out = fn(*args)
            if pending == "sum":
                return jax.lax.psum(out, axis)
            if isinstance(pending, ArgReduce):  # positions along input I's cut dim
                return arg_reduce(pending, out, args[pending.input], in_dims[pending.input], axis)
            return out

        return mesh, lower, out_sharding, arg_shardings

    wrapped.def_partition(
        partition=partition,
        sharding_rule=rule,
        reduction_factors=reduction_factors,
        need_replication_factors=need_replication_factors,
    )
    return wrapped
