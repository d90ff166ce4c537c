"""custom_partitioning driven by a generated JAX table rule.

``partitioned(fn, rule)`` wraps a single-output function with
jax.experimental.custom_partitioning: Shardy propagates with the rule's factor string
(``sharding_rule`` with its reduction and need-replication factors), and the partition
callback runs ``fn`` on the local shards exactly as one of the rule's verified strategies
says, finishing a Partial(sum) output with a ``psum`` and an argreduce output (argmax over
a cut dim) with an all-gather of (value, position) pairs. Operand shardings that match no
verified strategy are replicated first, so the result is always right.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from metaspmd.spec import ArgReduce

from .collectives import arg_reduce


def _sharded_dims(spec: PartitionSpec, rank: int) -> dict[str, int]:
    """mesh axis -> the operand dim it shards (one axis per dim)."""
    out = {}
    for d, entry in enumerate(tuple(spec) + (None,) * (rank - len(spec))):
        for axis in (entry if isinstance(entry, tuple) else (entry,)):
            if axis is not None:
                out[axis] = d
    return out


def _choose(rule, specs: list[PartitionSpec], ranks: list[int]):
    """(axis, strategy) when the operands are sharded over one axis as a verified strategy
    says, or None (then everything is replicated)."""
    by_axis = [_sharded_dims(s, r) for s, r in zip(specs, ranks)]
    axes = {a for m in by_axis for a in m}
    if len(axes) != 1:
        return None
    (axis,) = axes
    dims = tuple(m.get(axis) for m in by_axis)
    for s in rule.strategies:
        if s.inputs == dims and not any(s.partial_inputs):
            return axis, s
    return None


def _divides(chosen, shapes: list[tuple[int, ...]], mesh_shape) -> bool:
    """Does the mesh axis split every dim the chosen strategy shards evenly?"""
    axis, strategy = chosen
    return all(dim is None or shape[dim] % mesh_shape[axis] == 0 for dim, shape in zip(strategy.inputs, shapes))


def partitioned(fn: Callable, rule) -> Callable:
    """``fn`` with a custom partitioning from a ``metaspmd.generated.jax_rules.Rule``."""
    wrapped = custom_partitioning(fn)

    def partition(mesh, arg_shapes, result_shape):
        specs = [a.sharding.spec for a in arg_shapes]
        ranks = [len(a.shape) for a in arg_shapes]
        rank_out = len(result_shape.shape)
        chosen = _choose(rule, specs, ranks)
        if chosen is not None and not _divides(chosen, [a.shape for a in arg_shapes], mesh.shape):
            chosen = None  # uneven shards are padded: padding would join a sum or win an argmax
        if chosen is None:
            arg_shardings = tuple(NamedSharding(mesh, PartitionSpec()) for _ in arg_shapes)
            return mesh, fn, NamedSharding(mesh, PartitionSpec()), arg_shardings
        axis, strategy = chosen
        arg_shardings = tuple(
            NamedSharding(mesh, PartitionSpec(*(axis if d == dim else None for d in range(r))))
            for dim, r in zip(strategy.inputs, ranks)
        )
        out_dim = strategy.outputs[0]
        out_sharding = NamedSharding(mesh, PartitionSpec(*(axis if d == out_dim else None for d in range(rank_out))))
        pending = strategy.partial_outputs[0]

        def lower(*args):
            out = fn(*args)
            if pending == "sum":
                return jax.lax.psum(out, axis)
            if pending.startswith("arg"):  # 'argmax:I': positions along input I's cut dim
                op, i = pending[3:].split(":")
                return arg_reduce(ArgReduce(op, int(i)), out, args[int(i)], strategy.inputs[int(i)], axis)
            return out

        return mesh, lower, out_sharding, arg_shardings

    wrapped.def_partition(
        partition=partition,
        sharding_rule=rule.sharding_rule,
        reduction_factors=rule.reduction_factors,
        need_replication_factors=rule.need_replication_factors,
    )
    return wrapped
