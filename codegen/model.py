"""What codegen derives from registry records beyond the rule model itself.

The tables keep the rule model (``metaspmd.table``); what a framework runs of a rule is
decided at lookup, by ``metaspmd.target``. The one derived form written into a table is
JAX's Shardy factor rule for ``custom_partitioning``, built from validated model objects,
never from raw YAML text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from metaspmd.rules import TensorArg
from metaspmd.spec import ArgReduce, OutputCombine
from metaspmd.target import JAX_PARTITION, output_placement
from metaspmd.placement import Partial, Shard

_IDENT_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class CodegenError(ValueError):
    pass


def check_op_name(op: str) -> str:
    if not isinstance(op, str) or not _IDENT_RE.match(op):
        raise CodegenError(f"op name {op!r} is not a plain identifier")
    return op


@dataclass(frozen=True)
class ShardyRule:
    """A Shardy-style einsum rule: ``"s1 s2, s2 s3 -> s1 s3"`` with its special factors."""

    rule: str
    reduction_factors: tuple[str, ...]
    need_replication_factors: tuple[str, ...]
    permutation_factors: tuple[str, ...] = ()


def _arg_reduction(out: OutputCombine) -> bool:
    """The output's only combine is an argreduce (positions along a cut dim)."""
    return len(out.options) == 1 and isinstance(out.options[0], ArgReduce)


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
            first, _ = output_placement(o, JAX_PARTITION)
            if isinstance(first, Shard) and out_shapes[j][first.dim] == size and out_f[j][first.dim] is None:
                gathers.append((j, first.dim))
            elif first == Partial("sum") or _arg_reduction(o):
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
