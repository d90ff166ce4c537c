"""Registry records translated into the terms each framework speaks.

Only strategies a framework can run survive: no halo, no block, no proportional cut, and
only the reduce ops its Partial placement knows. Everything here is derived from validated
model objects, never from raw YAML text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from metaspmd.rules import OpRecord, TensorArg
from metaspmd.spec import (
    ArgReduce, Gather, Identity, IndexOffset, OutputCombine, PartialInput, Reduce, Replicate, ShardIn, Strategy,
)

DTENSOR_PARTIAL_OPS = ("sum", "avg", "max", "min")
# reduce(avg) holds on equal shards only; DTensor shards unevenly (torch.chunk) whenever a
# size does not divide, so a table consulted for any shape must not offer it. norm2 is
# DTensor's _NormPartial(2), which reduces by the 2-norm when redistributed.
TABLE_OUTPUT_REDUCE_OPS = ("sum", "max", "min", "norm2")
JAX_REDUCTION_OPS = ("sum",)
# Ops whose own DTensor rule moves positions into a row-cut operand and masks those outside
# each shard (_MaskPartial: a vocab-parallel embedding), which is what a verified offset
# marked drop says: in the table their positions enter Replicate, and DTensor does the rest.
DTENSOR_MASKS = frozenset({"aten.embedding.default"})
_IDENT_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class CodegenError(ValueError):
    pass


def check_op_name(op: str) -> str:
    if not isinstance(op, str) or not _IDENT_RE.match(op):
        raise CodegenError(f"op name {op!r} is not a plain identifier")
    return op


@dataclass(frozen=True)
class Placement:
    """A DTensor-style placement: kind is 'Shard', 'Partial' or 'Replicate'."""

    kind: str
    dim: int = 0
    op: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("Shard", "Partial", "Replicate"):
            raise CodegenError(f"bad placement kind {self.kind!r}")
        if not isinstance(self.dim, int) or self.dim < 0:
            raise CodegenError(f"bad placement dim {self.dim!r}")
        if self.kind == "Partial" and self.op not in DTENSOR_PARTIAL_OPS + ("norm2",):
            raise CodegenError(f"bad partial op {self.op!r}")

    def code(self) -> str:
        """Python source for torch.distributed.tensor placements (values validated above)."""
        if self.kind == "Shard":
            return f"Shard({self.dim})"
        if self.kind == "Partial":
            return "_NormPartial(2)" if self.op == "norm2" else f"Partial({self.op!r})"
        return "Replicate()"


REPLICATE = Placement("Replicate")


def _input_placement(p, masked: bool = False) -> Placement | None:
    if isinstance(p, Replicate) or (masked and isinstance(p, IndexOffset) and p.drop):
        return REPLICATE
    if isinstance(p, ShardIn):
        return Placement("Shard", p.dim) if p.plain else None
    if isinstance(p, PartialInput):
        return Placement("Partial", op=p.op) if p.op in DTENSOR_PARTIAL_OPS else None
    return None


def _output_placement(out: OutputCombine) -> Placement | None:
    """The first alternative a framework can express (options are cheapest first)."""
    for c in out.options:
        if isinstance(c, Gather) and c.plain:
            return Placement("Shard", c.dim)
        if isinstance(c, Identity):
            return REPLICATE
        if isinstance(c, Reduce) and c.op in TABLE_OUTPUT_REDUCE_OPS:
            return Placement("Partial", op=c.op)
    return None


@dataclass(frozen=True)
class PlacementRule:
    inputs: tuple[Placement, ...]
    outputs: tuple[Placement, ...]


def placement_rule(s: Strategy, masked: bool = False) -> PlacementRule | None:
    """The strategy in DTensor placements, or None; ``masked``: the op is in DTENSOR_MASKS."""
    ins = tuple(_input_placement(p, masked) for p in s.inputs)
    outs = tuple(_output_placement(o) for o in s.outputs)
    if any(p is None for p in ins + outs):
        return None
    return PlacementRule(ins, outs)  # type: ignore[arg-type]


def placement_rules(record: OpRecord) -> dict[str, tuple[PlacementRule, ...]]:
    """signature -> runnable placement rules, for entries with verified strategies."""
    check_op_name(record.op)
    out: dict[str, tuple[PlacementRule, ...]] = {}
    for e in record.entries:
        if e.status not in ("ok", "derived"):
            continue
        masked = record.op in DTENSOR_MASKS
        rules = tuple(dict.fromkeys(r for r in (placement_rule(s, masked) for s in e.all_strategies()) if r is not None))
        if rules:
            out[e.signature] = rules
    return out


# --------------------------------------------------------------------------- JAX / Shardy


@dataclass(frozen=True)
class JaxStrategy:
    """One strategy on one mesh axis: per input and output, the sharded dim (or None).

    ``partial_outputs``: per output, the pending reduction ('sum') when the output is
    Partial, else ''; 'argmax:I' or 'argmin:I' for positions along input I's cut dim, which
    the partition finishes by sharing (value, position) pairs. Such an output has no sharded
    dim. ``partial_inputs``: per input, 'sum' for a Partial one; an index offset as the rule
    model writes it ('O', 'O(0)', 'O(0, drop)') for positions into the cut dim, which the
    compiler moves and masks itself (the input enters Replicate); 'local' for a cut dim the
    op slices or splits (DimLabel.local), whose uneven pieces the compiler evens out; else ''.
    """

    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    partial_inputs: tuple[str, ...]
    partial_outputs: tuple[str, ...]


@dataclass(frozen=True)
class ShardyRule:
    """A Shardy-style einsum rule: ``"s1 s2, s2 s3 -> s1 s3"`` with its special factors."""

    rule: str
    reduction_factors: tuple[str, ...]
    need_replication_factors: tuple[str, ...]
    permutation_factors: tuple[str, ...] = ()


def _arg_reduction(out: OutputCombine) -> str:
    """'argmax:I' or 'argmin:I' where the output's only combine is an argreduce, else ''."""
    c = out.options[0]
    return f"arg{c.op}:{c.input}" if len(out.options) == 1 and isinstance(c, ArgReduce) else ""


def _local(p) -> bool:
    return isinstance(p, ShardIn) and p.local and not p.follows


def _compiler_finished(s: Strategy) -> JaxStrategy | None:
    """A strategy that the JAX compiler finishes itself: argreduce outputs (it shares
    (value, position) pairs), index-offset inputs (it moves and masks the positions) or
    local params (it evens out a slice's pieces); its other placements plain."""
    args = [_arg_reduction(o) for o in s.outputs]
    marks = [str(p) if isinstance(p, IndexOffset) else "local" if _local(p) else "" for p in s.inputs]
    if not any(args + marks) or not all(
        isinstance(p, (Replicate, IndexOffset)) or (isinstance(p, ShardIn) and (p.plain or _local(p))) for p in s.inputs
    ):
        return None  # Partial inputs, input halos, proportional cuts: no JAX spelling here
    outs = [None if a else _output_placement(o) for a, o in zip(args, s.outputs)]
    if any(p is None for a, p in zip(args, outs) if not a):
        return None
    if "local" in marks and any(p is None or p.kind != "Shard" for p in outs):
        return None  # the compiler evens out a slice's pieces; unstack's held pieces are no Shard
    if any(p.kind == "Partial" and (any(args) or p.op not in JAX_REDUCTION_OPS) for p in outs if p):
        return None
    return JaxStrategy(
        tuple(p.dim if isinstance(p, ShardIn) else None for p in s.inputs),
        tuple(p.dim if p is not None and p.kind == "Shard" else None for p in outs),
        tuple(marks),
        tuple(a or (p.op if p.kind == "Partial" else "") for a, p in zip(args, outs)),
    )


def jax_strategies(entry) -> tuple[JaxStrategy, ...]:
    out = []
    for s in entry.all_strategies():
        rule = placement_rule(s)
        if rule is None:
            finished = _compiler_finished(s)
            if finished is not None:
                out.append(finished)
            continue
        if any(p.kind == "Partial" and p.op not in JAX_REDUCTION_OPS for p in rule.inputs + rule.outputs):
            continue
        out.append(JaxStrategy(
            tuple(p.dim if p.kind == "Shard" else None for p in rule.inputs),
            tuple(p.dim if p.kind == "Shard" else None for p in rule.outputs),
            tuple(p.op if p.kind == "Partial" else "" for p in rule.inputs),
            tuple(p.op if p.kind == "Partial" else "" for p in rule.outputs),
        ))
    return tuple(dict.fromkeys(out))


def shardy_rule(entry) -> ShardyRule | None:
    """The entry's strategies as one Shardy factor rule, or None when it cannot be one.

    A label becomes a factor when it shards one dim per operand (no halo), no Partial
    inputs and no index offsets (the partition callback runs the op as it is, positions
    unmoved), and every output either gathers it on a dim of the same size (pass-through)
    or reduces it by sum or argreduce (reduction factor). Every other dim gets its own factor, listed
    as need-replication, so propagation never shards what no verified rule covers.
    """
    in_shapes = [t.shape for _, v in entry.example.args for t in _tensor_args(v)]
    out_shapes = [r.shape for r in entry.results]
    if not out_shapes or any(len(s) == 0 for s in in_shapes + out_shapes):
        return None
    partial_labels = entry.partial.labels() | (entry.offset.labels() if entry.offset else set())
    in_f = [[None] * len(s) for s in in_shapes]
    out_f = [[None] * len(s) for s in out_shapes]
    reduction = []
    for label, outs in entry.combine.by_label:
        if label in partial_labels:
            continue
        dims = [(i, d, lab.plain) for i, row in enumerate(entry.shard.inputs) for d, lab in enumerate(row) if lab.label == label]
        if not dims or not all(plain for _, _, plain in dims):
            continue
        size = in_shapes[dims[0][0]][dims[0][1]]
        gathers, reduces = [], 0
        for j, o in enumerate(outs):
            first = _output_placement(o)
            if first is not None and first.kind == "Shard" and out_shapes[j][first.dim] == size and out_f[j][first.dim] is None:
                gathers.append((j, first.dim))
            elif (first is not None and first.kind == "Partial" and first.op == "sum") or _arg_reduction(o):
                reduces += 1
        if len(gathers) + reduces != len(outs) or (gathers and reduces):
            continue
        name = label.lower()
        for i, d, _ in dims:
            in_f[i][d] = name
        for j, d in gathers:
            out_f[j][d] = name
        if reduces:
            reduction.append(name)
    need = []
    counter = 0
    for table in (in_f, out_f):
        for row in table:
            for d, f in enumerate(row):
                if f is None:
                    counter += 1
                    row[d] = f"r{counter}"
                    need.append(row[d])
    text = ", ".join(" ".join(r) for r in in_f) + " -> " + ", ".join(" ".join(r) for r in out_f)
    return ShardyRule(text, tuple(reduction), tuple(need))


def _tensor_args(v):
    if isinstance(v, TensorArg):
        return [v]
    if isinstance(v, tuple):
        return [t for x in v for t in _tensor_args(x)]
    return []
