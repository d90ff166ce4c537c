"""Node strategies on a mesh, built from 1-D rule strategies (metaspmd.spec.Strategy).

A rule strategy says how to split one op over one mesh axis. On an N-D mesh a node
strategy picks one rule strategy per axis; applying them axis after axis (outer axis
first) is what DTensor's placements tuple means, so two axes may split the same tensor
dim (``[S(0), S(0)]``) or different ones. Combinations whose shards do not divide the
tensor (strict mode) or mix reduce ops on one tensor are dropped.

Rule strategies with a halo, block or proportional cut, or a reduce no Partial placement
names (norm2), are skipped: DTensor and JAX cannot run them. Two more count only where the
runtime's compiler finishes them (``Finishes``; JAX's does, DTensor has no such state):
positions along a cut reduced dim (argreduce) come out ``Partial("argmax")`` /
``Partial("argmin")``, pending an arg-reduction; positions offset by each shard's start (a
gather, scatter or update slice into a cut operand) enter Replicate, and the compiler offsets
and masks them; a slice, split or pad of a cut dim (local params) keeps it cut, and the
compiler moves the uneven pieces into even shards (``NodeStrategy.exchanges``); a window op
whose cut input is read past its shard (a halo: convolution, pooling) keeps it cut, and the
compiler sends each shard its neighbours' edge rows (an exchange too).
The all-Replicate strategy is always present, so every op can be placed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Sequence

from .. import spec
from .mesh import Mesh
from .placement import Partial, Placement, Placements, REPLICATE, Replicate, Shard, is_valid, placements_str

REPLICATE_LABEL = "R"
# Reduces the runtimes' Partial placements take. norm2 (DTensor's _NormPartial(2)) is left
# out: the planner's Partial placement names a c10d reduce op, and JAX has no such state.
RUNNABLE_REDUCE_OPS = ("sum", "max", "min", "prod", "avg")


@dataclass(frozen=True)
class Finishes:
    """What the runtime's compiler finishes on its own beyond plain placements.
    ``arg_reduce``: an arg-reduction over a cut dim (XLA all-gathers (value, position) pairs);
    ``index_offset``: a gather, scatter or update slice whose operand is cut along a dim its
    positions index (Shardy offsets and masks them: a vocab-parallel embedding lookup);
    ``local_params``: a slice, split or pad of a cut dim, each shard running its own part
    (ShardIn.local): Shardy's permutation factor, which evens the pieces out with collective
    permutes rather than gathering the input; ``fill_ops``: ops that, given only scalars (a
    fill from a constant, an iota), the compiler computes where each part of the output
    lives, so that output may take any placement without communication or a whole copy;
    ``halos``: a window op (convolution, reduce_window) whose cut input each shard reads
    past its ends (ShardIn.halo), the output's halo dropped (a plain cut to the compiler):
    the partitioner exchanges the edge rows with the neighbours, GSPMD's spatial
    partitioning, where a planner without it gathers the whole input."""

    arg_reduce: bool = False
    index_offset: bool = False
    local_params: bool = False
    fill_ops: frozenset[str] = frozenset()
    halos: bool = False


PLACEMENTS_ONLY = Finishes()  # DTensor
JAX_FINISHES = Finishes(arg_reduce=True, index_offset=True, local_params=True,
                        fill_ops=frozenset({"jax.broadcast_in_dim", "jax.iota"}), halos=True)


@dataclass(frozen=True)
class AxisStrategy:
    """One rule strategy in planner placements: per tensor input, per output."""

    label: str
    inputs: tuple[Placement, ...]
    outputs: tuple[Placement, ...]
    exchange: bool = False  # the compiler moves data between the axis's shards (local params)


@dataclass(frozen=True)
class NodeStrategy:
    """A strategy of one node on the whole mesh: per tensor input and per output, one
    placement per mesh axis. ``label`` names the rule strategy of each axis ('S1,R').
    ``exchanges``: the mesh axes along which the node itself moves data between shards
    (a slice of a cut dim: a neighbour exchange of its output's shards)."""

    label: str
    inputs: tuple[Placements, ...]
    outputs: tuple[Placements, ...]
    exchanges: tuple[int, ...] = ()

    def __str__(self) -> str:
        ins = " ".join("[" + placements_str(p) + "]" for p in self.inputs)
        outs = " ".join("[" + placements_str(p) + "]" for p in self.outputs)
        return f"{self.label}: {ins} -> {outs}"


def _local(p: spec.InputPlacement) -> bool:
    """A plain cut whose shards run the op with their own params (a slice of the cut dim)."""
    return isinstance(p, spec.ShardIn) and p.local and not p.follows


def _halo(p: spec.InputPlacement) -> bool:
    """A cut by the dim's own length that each shard reads past its ends."""
    return isinstance(p, spec.ShardIn) and p.halo > 0 and not p.follows and not p.local


def _input_placement(p: spec.InputPlacement, finishes: Finishes = PLACEMENTS_ONLY) -> Placement | None:
    if isinstance(p, spec.ShardIn):
        runs = p.plain or (_local(p) and finishes.local_params) or (_halo(p) and finishes.halos)
        return Shard(p.dim) if runs else None
    if isinstance(p, spec.PartialInput):  # DTensor cannot partition a replicated value by product
        return Partial(p.op) if p.op != "prod" else None
    if isinstance(p, spec.IndexOffset):  # Replicate to the framework, which moves the positions
        return REPLICATE if finishes.index_offset else None  # itself, or not at all
    return REPLICATE


def _output_placement(c: spec.OutputCombine, finishes: Finishes = PLACEMENTS_ONLY) -> tuple[Placement | None, bool]:
    """The runnable combine of one output, and whether it drops halos; Replicate beats
    Shard beats Partial because it is the cheapest to consume (all options are equally
    valid results), and a plain gather beats one that drops halos."""
    best: Placement | None = None
    rank, halo = 99, False
    for option in c.options:
        dropped = False
        if isinstance(option, spec.Identity):
            p, r = REPLICATE, 0
        elif isinstance(option, spec.Gather):
            dropped = not option.plain
            if dropped and not (finishes.halos and _halo_dropped(option)):
                continue
            p, r = Shard(option.dim), 1 + dropped
        elif isinstance(option, spec.Reduce) and option.op in RUNNABLE_REDUCE_OPS:
            p, r = Partial(option.op), 3 if option.op == "sum" else 4
        elif isinstance(option, spec.ArgReduce) and finishes.arg_reduce:
            p, r = Partial("arg" + option.op), 5
        else:
            continue
        if r < rank:
            best, rank, halo = p, r, dropped
    return best, halo


def _halo_dropped(g: spec.Gather) -> bool:
    """A gather that only drops each shard's halo: Shard(dim) once the halo is dropped."""
    return g.block == 1 and not g.reverse and not g.overlap


def cuts_line_up(s: spec.Strategy, shapes: Sequence[tuple[int, ...]], by_label: dict[str, spec.Strategy]) -> bool:
    """Do the dims each label of ``s`` cuts have one length in this call? A label cuts its
    dims at the same bounds, which the explorer verifies on dims of one length only: a
    gather's index narrower than self, cut with it along a dim it does not gather, would
    take the wrong columns on every shard but the first. A joint of independent parts
    (``S1+S3``) checks each part's own label (``by_label``: the op's strategies by label)."""
    for part in (by_label.get(label) for label in s.label.split("+")) if "+" in s.label else (s,):
        if part is None:
            continue
        lengths = {shapes[i][p.dim] for i, p in enumerate(part.inputs)
                   if isinstance(p, spec.ShardIn) and not p.follows and i < len(shapes) and p.dim < len(shapes[i])}
        if len(lengths) > 1:
            return False
    return True


def axis_strategy(s: spec.Strategy, finishes: Finishes = PLACEMENTS_ONLY) -> AxisStrategy | None:
    """The rule strategy in placements, or None when the runtime could not run it."""
    ins = tuple(_input_placement(p, finishes) for p in s.inputs)
    chosen = [_output_placement(c, finishes) for c in s.outputs]
    outs = tuple(p for p, _ in chosen)
    if any(p is None for p in ins) or any(p is None for p in outs):
        return None
    local = any(_local(p) for p in s.inputs)
    if local and not all(isinstance(p, Shard) for p in outs):
        return None  # the compiler evens out a slice's pieces; unstack's held pieces are no Shard
    exchange = local or any(_halo(p) for p in s.inputs) or any(dropped for _, dropped in chosen)
    return AxisStrategy(s.label, ins, outs, exchange)  # type: ignore[arg-type]


def axis_strategies(rules: Iterable[spec.Strategy], n_inputs: int, n_outputs: int,
                    finishes: Finishes = PLACEMENTS_ONLY) -> list[AxisStrategy]:
    """Runnable rule strategies of the right arity, deduplicated, after all-Replicate."""
    out = [AxisStrategy(REPLICATE_LABEL, (REPLICATE,) * n_inputs, (REPLICATE,) * n_outputs)]
    seen = {(out[0].inputs, out[0].outputs)}
    for s in rules:
        a = axis_strategy(s, finishes)
        if a is None or len(a.inputs) != n_inputs or len(a.outputs) != n_outputs:
            continue
        key = (a.inputs, a.outputs)
        if key not in seen:
            seen.add(key)
            out.append(a)
    return out


def compose(
    per_axis: Sequence[AxisStrategy],
    mesh: Mesh,
    in_shapes: Sequence[tuple[int, ...]],
    out_shapes: Sequence[tuple[int, ...] | None],
    strict: bool = True,
) -> list[NodeStrategy]:
    """Every valid choice of one rule strategy per mesh axis. ``out_shapes[i] is None``
    marks a non-tensor output (always Replicate)."""
    result: list[NodeStrategy] = []
    seen: set = set()
    shape = mesh.shape
    for combo in itertools.product(per_axis, repeat=mesh.ndim):
        ins = tuple(tuple(s.inputs[i] for s in combo) for i in range(len(in_shapes)))
        outs = tuple(tuple(s.outputs[i] for s in combo) for i in range(len(out_shapes)))
        if not all(is_valid(p, sh, shape, strict) for p, sh in zip(ins, in_shapes)):
            continue
        if not all(
            all(isinstance(x, Replicate) for x in p) if sh is None else is_valid(p, sh, shape, strict)
            for p, sh in zip(outs, out_shapes)
        ):
            continue
        if (ins, outs) in seen:
            continue
        seen.add((ins, outs))
        exchanges = tuple(axis for axis, s in enumerate(combo) if s.exchange)
        result.append(NodeStrategy(",".join(s.label for s in combo), ins, outs, exchanges))
    return result


def tensor_placements(shape: tuple[int, ...], mesh: Mesh, strict: bool = True) -> list[Placements]:
    """Every valid Replicate/Shard placement of a stored tensor (graph inputs are never Partial)."""
    options: list[Placement] = [REPLICATE] + [Shard(d) for d in range(len(shape))]
    return [p for p in itertools.product(options, repeat=mesh.ndim) if is_valid(p, shape, mesh.shape, strict)]


__all__ = [
    "AxisStrategy", "NodeStrategy", "REPLICATE_LABEL", "axis_strategies", "axis_strategy", "compose", "cuts_line_up",
    "tensor_placements",
]
