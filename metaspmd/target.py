"""What each framework can run, and the one projection of a verified rule onto it.

A rule strategy (``metaspmd.spec.Strategy``) says how to split an op over one mesh axis in
the rule model's own terms: halos, proportional cuts, Partial inputs, index offsets, several
combines per output. A framework runs only part of that. A ``Target`` says which part, and
``project`` is the only function that turns a rule strategy into placements on one mesh
axis (Shard, Partial, Replicate) or says why it cannot. The planner, ``register()``,
``register_op``, JAX's custom partitioning and both runtimes all go through it, so a rule
from the table and the same rule explored live become the same placements.

Targets differ in what their runtime finishes by itself:

- DTensor (``DTENSOR_REGISTER``, ``DTENSOR_PLAN``) runs plain placements only. A table
  installed with ``register_sharding`` is consulted for any shape, and DTensor cuts uneven
  sizes as ``torch.chunk`` does, so a ``reduce(avg)`` output and an even gather (a reshape
  that splits a cut dim), which hold on equal shards only, are left out there; a plan knows
  every shape and cuts evenly (the planner's strict mode), so it keeps both. ``norm2`` is DTensor's ``_NormPartial(2)``: ``register`` may
  leave an output in it, the planner's cost model has no such reduction.
- JAX under ``jit`` (``JAX_PLAN``) has Shardy and GSPMD behind it: positions along a cut
  reduced dim (argreduce), positions offset by each shard's start (gather and scatter into
  a cut operand), a slice of a cut dim (local params) and a window read past a shard's
  ends (halos) are finished by the partitioner.
- JAX's ``custom_partitioning`` callback (``JAX_PARTITION``) runs one op on its shards
  with ``psum`` and (value, position) all-gathers: Partial(sum) and argreduce outputs.

No target holds a sparse tensor (``sparse_outputs``): the rules of an ATen op that makes
one (``to_sparse``, ``sparse_coo_tensor``) are verified on its output's dense values, but
DTensor wraps the sparse local shards and then cannot redistribute or gather them (its
collectives call ``contiguous()`` and ``view``, which sparse layouts lack).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence, Union

from . import spec
from .placement import Partial, Placement, REPLICATE, Shard


@dataclass(frozen=True)
class Target:
    """What one framework's runtime runs of a rule strategy on one mesh axis.

    ``input_reduce_ops`` / ``output_reduce_ops``: the Partial states it takes and holds;
    ``arg_reduce``: an output of positions along a cut reduced dim, finished by the
    framework (``Partial("argmax")``); ``index_offset``: positions into a cut operand enter
    Replicate and the framework offsets and masks them; ``masked_ops``: ops whose dropping
    offsets (``O(drop)``) the framework's own rule masks, the same for those ops only
    (DTensor's vocab-parallel embedding); ``local_params``: a slice, split or pad of a cut
    dim, the framework evening out the pieces; ``halos``: a window op's input read past its
    shard's ends, the framework exchanging the edge rows; ``fill_ops``: ops that, given only
    scalars, the framework computes in place under any output placement; ``even_shards``:
    every call is planned with its shapes known and cut evenly, so a strategy that holds
    only where each dim it cuts divides by the shard count (``gather(dim, even=true)``) is
    run, and the planner keeps it where the call's dims divide; ``sparse_outputs``: it runs
    ops whose outputs are sparse tensors (``makes_sparse``)."""

    name: str
    input_reduce_ops: frozenset[str]
    output_reduce_ops: frozenset[str]
    arg_reduce: bool = False
    index_offset: bool = False
    masked_ops: frozenset[str] = frozenset()
    local_params: bool = False
    halos: bool = False
    fill_ops: frozenset[str] = frozenset()
    even_shards: bool = False
    sparse_outputs: bool = False


# ATen's names for the ops that give a sparse tensor (COO, CSR/CSC, BSR/BSC) from any
# input: to_sparse and its layouts, the sparse constructors (checked and _unsafe), and
# gather's sparse backward.
_SPARSE_MAKERS = re.compile(r"aten\.(_?to_sparse\w*|_?sparse_\w*tensor\w*|_gather_sparse_backward)\.")


def makes_sparse(op: str) -> bool:
    """Does the op (``aten.to_sparse.default``) give a sparse tensor?"""
    return bool(_SPARSE_MAKERS.match(op))


# The reductions a planned value may be left in: c10d's (DTensor) and XLA's all-reduces.
# A Partial input by product is no placement of either: no framework splits a replicated
# value into factors.
_PLANNED_OUTPUT_REDUCES = frozenset({"sum", "max", "min", "prod", "avg"})
_PLANNED_INPUT_REDUCES = frozenset(spec.REDUCE_OPS) - {"prod"}

# DTensor's own embedding rule moves a row cut's positions and masks them (_MaskPartial),
# which is what a verified offset marked drop says
_DTENSOR_MASKED = frozenset({"aten.embedding.default"})
DTENSOR_REGISTER = Target(
    "DTensor register_sharding", frozenset({"sum", "avg", "max", "min"}), frozenset({"sum", "max", "min", "norm2"}),
    masked_ops=_DTENSOR_MASKED,
)
DTENSOR_PLAN = Target("DTensor plan", _PLANNED_INPUT_REDUCES, _PLANNED_OUTPUT_REDUCES, masked_ops=_DTENSOR_MASKED,
                      even_shards=True)
JAX_PLAN = Target(
    "JAX plan", _PLANNED_INPUT_REDUCES, _PLANNED_OUTPUT_REDUCES, arg_reduce=True, index_offset=True,
    local_params=True, halos=True, fill_ops=frozenset({"jax.broadcast_in_dim", "jax.iota"}), even_shards=True,
)
JAX_PARTITION = Target(
    "JAX custom_partitioning", frozenset({"sum"}), frozenset({"sum"}), arg_reduce=True, index_offset=True,
    local_params=True,
)


@dataclass(frozen=True)
class AxisStrategy:
    """A rule strategy projected onto a target: one placement per tensor input and output.
    ``exchange``: the framework moves data between the axis's shards to run it (local
    params, halos); ``even``: it holds only where every cut dim, inputs' and outputs',
    divides by the shard count (an even gather), which the planner checks per call;
    ``masked``: the framework's own rule masks the positions this cut moves (a
    ``masked_ops`` lookup), which it does on one mesh axis of a call only: DTensor's
    row-cut embedding keeps one mask per lookup, and a table cut along its rows by two
    axes raises "MaskBuffer has been materialized with conflicting data"."""

    label: str
    inputs: tuple[Placement, ...]
    outputs: tuple[Placement, ...]
    exchange: bool = False
    even: bool = False
    masked: bool = False


@dataclass(frozen=True)
class Refusal:
    """Why a target cannot run a rule strategy."""

    label: str
    reason: str

    def __bool__(self) -> bool:  # a refusal reads as "no projection"
        return False


def _local(p: spec.InputPlacement) -> bool:
    """A plain cut whose shards run the op with their own params (a slice of the cut dim)."""
    return isinstance(p, spec.ShardIn) and p.local and not p.follows


def _halo(p: spec.InputPlacement) -> bool:
    """A cut by the dim's own length that each shard reads past its ends."""
    return isinstance(p, spec.ShardIn) and p.halo > 0 and not p.follows and not p.local


def _halo_dropped(g: spec.Gather) -> bool:
    """A gather that only drops each shard's halo: Shard(dim) once the halo is dropped."""
    return g.block == 1 and not g.reverse and not g.overlap


def _input(p: spec.InputPlacement, target: Target, op: str) -> Placement | str:
    """The input's placement, or why the target cannot give it."""
    if isinstance(p, spec.ShardIn):
        if p.plain or (_local(p) and target.local_params) or (_halo(p) and target.halos):
            return Shard(p.dim)
        return f"input cut {p} is no plain Shard here"
    if isinstance(p, spec.PartialInput):
        return Partial(p.op) if p.op in target.input_reduce_ops else f"no Partial({p.op}) input"
    if isinstance(p, spec.IndexOffset):
        if target.index_offset or (p.drop and op in target.masked_ops):
            return REPLICATE  # the framework moves (and masks) the positions itself
        return f"positions offset per shard ({p}) are not moved here"
    return REPLICATE


# Replicate beats Shard beats Partial: every option is an equally valid result, and a
# replicated or cut value is the cheapest to consume; a plain gather beats one that drops
# halos.
_RANK_IDENTITY, _RANK_GATHER, _RANK_HALO, _RANK_SUM, _RANK_REDUCE, _RANK_ARG = range(6)


def output_placement(c: spec.OutputCombine, target: Target) -> tuple[Placement | None, bool]:
    """The best runnable combine of one output (None: none runs here), and whether it
    drops halos."""
    best, _, halo = _output_option(c, target)
    return best, halo


def _output_option(c: spec.OutputCombine, target: Target) -> tuple[Placement | None, spec.Combine | None, bool]:
    """The best runnable combine of one output as a placement, the combine itself, and
    whether it drops halos."""
    best: Placement | None = None
    chosen: spec.Combine | None = None
    rank, halo = 99, False
    for option in c.options:
        dropped = False
        if isinstance(option, spec.Identity):
            p, r = REPLICATE, _RANK_IDENTITY
        elif isinstance(option, spec.Gather) and option.even:
            if not target.even_shards:
                continue
            p, r = Shard(option.dim), _RANK_GATHER
        elif isinstance(option, spec.Gather):
            dropped = not option.plain
            if dropped and not (target.halos and _halo_dropped(option)):
                continue
            p, r = Shard(option.dim), _RANK_HALO if dropped else _RANK_GATHER
        elif isinstance(option, spec.Reduce) and option.op in target.output_reduce_ops:
            p, r = Partial(option.op), _RANK_SUM if option.op == "sum" else _RANK_REDUCE
        elif isinstance(option, spec.ArgReduce) and target.arg_reduce:
            p, r = Partial("arg" + option.op), _RANK_ARG
        else:
            continue
        if r < rank or (r == rank and chosen is not None and _even(chosen) and not _even(option)):
            best, chosen, rank, halo = p, option, r, dropped  # a gather on any split beats an even one
    return best, chosen, halo


def _even(c: spec.Combine) -> bool:
    return isinstance(c, spec.Gather) and c.even


def project(s: spec.Strategy, target: Target, op: str = "") -> AxisStrategy | Refusal:
    """``s`` as placements the target runs on one mesh axis, or a Refusal saying why not.
    ``op``: the op's name, for targets that treat some ops apart (``masked_ops``, sparse outputs)."""
    if makes_sparse(op) and not target.sparse_outputs:
        return Refusal(s.label, f"{target.name}: {op} gives a sparse tensor, which no placement here holds "
                                "(a distributed tensor of sparse shards cannot be redistributed or gathered)")
    ins = []
    for i, p in enumerate(s.inputs):
        placed = _input(p, target, op)
        if isinstance(placed, str):
            return Refusal(s.label, f"{target.name}: input {i}: {placed}")
        ins.append(placed)
    options = [_output_option(c, target) for c in s.outputs]
    for j, (p, _, _) in enumerate(options):
        if p is None:
            why = " (it holds on even cuts only)" if any(_even(c) for c in s.outputs[j].options) else ""
            return Refusal(s.label, f"{target.name}: output {j}: no combine of {s.outputs[j]} runs here{why}")
    chosen = [(p, halo) for p, _, halo in options]
    outs = tuple(p for p, _ in chosen)
    local = any(_local(p) for p in s.inputs)
    if local and not all(isinstance(p, Shard) for p in outs):
        # the framework evens out a slice's pieces; unstack's held pieces are no Shard
        return Refusal(s.label, f"{target.name}: a slice of a cut dim must give cut outputs")
    exchange = local or any(_halo(p) for p in s.inputs) or any(dropped for _, dropped in chosen)
    even = any(_even(c) for _, c, _ in options)
    masked = not target.index_offset and spec.drops(s.inputs)
    return AxisStrategy(s.label, tuple(ins), outs, exchange, even, masked)  # type: ignore[arg-type]


def projections(rules: Iterable[spec.Strategy], target: Target, op: str = "") -> list[AxisStrategy]:
    """The rule strategies the target runs, projected, duplicates (same placements) dropped:
    one that holds on any split stands for an even-only one of the same placements."""
    out: list[AxisStrategy] = []
    seen: dict[tuple, int] = {}
    for s in rules:
        a = project(s, target, op)
        if not a:
            continue
        key = (a.inputs, a.outputs)
        if key not in seen:
            seen[key] = len(out)
            out.append(a)
        elif out[seen[key]].even and not a.even:
            out[seen[key]] = a
    return out


def cuts_line_up(s: spec.Strategy, shapes: Sequence[tuple[int, ...]], by_label: dict[str, spec.Strategy]) -> bool:
    """Do the dims each label of ``s`` cuts have one length in this call? A label cuts its
    dims at the same bounds, which the explorer verifies on dims of one length only: a
    gather's index narrower than self, cut with it along a dim it does not gather, would
    take the wrong columns on every shard but the first. A joint of independent parts
    (``S1+S3``) checks each part's own label (``by_label``: the op's strategies by label)."""
    parts = (by_label.get(label) for label in s.label.split(spec.JOINT_SEPARATOR)) if spec.JOINT_SEPARATOR in s.label \
        else (s,)
    for part in parts:
        if part is None:
            continue
        lengths = {shapes[i][p.dim] for i, p in enumerate(part.inputs)
                   if isinstance(p, spec.ShardIn) and not p.follows and i < len(shapes) and p.dim < len(shapes[i])}
        if len(lengths) > 1:
            return False
    return True



def lined_up(rules: Sequence[spec.Strategy], shapes: Sequence[tuple[int, ...]]) -> list[spec.Strategy]:
    """The strategies of one op (``rules``: all of them, joints too) whose cuts line up at a
    call with these input shapes (``cuts_line_up``): those the runtime applies there."""
    by_label = {s.label: s for s in rules}
    return [s for s in rules if cuts_line_up(s, shapes, by_label)]


Projection = Union[AxisStrategy, Refusal]

__all__ = [
    "AxisStrategy", "DTENSOR_PLAN", "DTENSOR_REGISTER", "JAX_PARTITION", "JAX_PLAN", "Projection", "Refusal", "Target",
    "cuts_line_up", "lined_up", "makes_sparse", "output_placement", "project", "projections",
]
