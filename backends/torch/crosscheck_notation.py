"""Our rules in DTensor's notation, and back.

ShardIn(d) is S(d) and PartialInput(op) is P(op) on inputs; gather(dim=d), reduce(op) and
identity are S(d), P(op) and R on outputs. A rule is an input placement tuple with a
non-replicated input and the output placements it gives (``OurRule``); the cross-checks
(DTensor's rules, other calls of a signature) read a registry entry's rules through
``our_rules``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from metaspmd.rules import RuleEntry
from metaspmd.spec import REDUCE_OPS, Combine, Gather, Identity, InputPlacement, PartialInput, Reduce, Replicate, ShardIn
from metaspmd.target import lined_up

from .crosscheck_dtensor import NORM2, PARTIAL_RE, SHARD_RE, STRIDED_SHARD_RE, Key

RULE_STATUSES = ("ok", "derived")
NO_EXAMPLES = ("no-sample", "nondeterministic", "skipped")  # record statuses reached before any example ran


# Reduce ops DTensor's Partial names differently (c10d's names).
DTENSOR_REDUCE_NAMES = {"prod": "product"}
OUR_REDUCE_NAMES = {v: k for k, v in DTENSOR_REDUCE_NAMES.items()}


def input_key(p: InputPlacement) -> str | None:
    """DTensor's name for an input placement; None when it has none (input halo, proportional
    cut, index offset)."""
    if isinstance(p, ShardIn):
        return f"S({p.dim})" if p.plain else None
    if isinstance(p, PartialInput):
        return f"P({DTENSOR_REDUCE_NAMES.get(p.op, p.op)})"
    return "R" if isinstance(p, Replicate) else None


def output_key(c: Combine) -> str | None:
    """DTensor's name for a combine; None when it has none (halo, overlap, reverse, scan, xor,
    argreduce). A block gather is DTensor's _StridedShard: block b of every shard, then
    block b + 1."""
    if isinstance(c, Gather):
        if c.plain or (c.even and c.block == 1):  # an even gather is DTensor's Shard on even cuts
            return f"S({c.dim})"
        return f"_S({c.dim}, {c.block})" if not (c.halo or c.halo_end or c.reverse or c.overlap) else None
    if isinstance(c, Reduce):
        if c.op == "xor":
            return None  # no Partial placement folds by xor
        return NORM2 if c.op == "norm2" else f"P({DTENSOR_REDUCE_NAMES.get(c.op, c.op)})"
    if isinstance(c, Identity):
        return "R"
    return None


def parse_input(key: str) -> InputPlacement:
    if key == "R":
        return Replicate()
    m = SHARD_RE.match(key)
    if m:
        return ShardIn(int(m[1]))
    m = PARTIAL_RE.match(key)
    if m and OUR_REDUCE_NAMES.get(m[1], m[1]) in REDUCE_OPS:
        return PartialInput(OUR_REDUCE_NAMES.get(m[1], m[1]))
    raise ValueError(f"no input placement of ours for {key!r}")


def parse_output(key: str) -> Combine | None:
    """Our combine for a DTensor output placement; None for the ones we have no combine
    for (_StridedShard, _NormPartial, ...)."""
    if key == "R":
        return Identity()
    m = SHARD_RE.match(key)
    if m:
        return Gather(int(m[1]))
    m = STRIDED_SHARD_RE.match(key)
    if m:
        return Gather(int(m[1]), block=int(m[2]))
    if key == NORM2:
        return Reduce("norm2")
    m = PARTIAL_RE.match(key)
    if m and OUR_REDUCE_NAMES.get(m[1], m[1]) in REDUCE_OPS:
        return Reduce(OUR_REDUCE_NAMES.get(m[1], m[1]))
    return None


def fmt_rule(inputs: Key, outputs: Key) -> str:
    return f"({', '.join(inputs)}) -> ({', '.join(outputs)})"


@dataclass(frozen=True)
class OurRule:
    """One strategy of an entry: per output, the placements it may take (alternatives)."""

    inputs: Key
    options: tuple[tuple[str, ...], ...]  # DTensor names of each output's combines
    placements: tuple[InputPlacement, ...]
    combines: tuple[tuple[Combine, ...], ...]
    expressible: bool  # every input, and some combine of every output, has a DTensor name

    def gives(self, outputs: Key) -> bool:
        return self.expressible and len(outputs) == len(self.options) and all(
            o in opts for o, opts in zip(outputs, self.options)
        )

    def text(self) -> str:
        if self.expressible:
            return fmt_rule(self.inputs, tuple(" | ".join(o) for o in self.options))
        outs = ", ".join(" | ".join(str(c) for c in cs) for cs in self.combines)
        return f"({', '.join(str(p) for p in self.placements)}) -> ({outs})"


def bool_key(key: str) -> str:
    """The one name of a bool output's Partial: sum, like max, is logical or (DTensor says
    P(sum) where the explorer, which tries only max and min on bools, finds P(max))."""
    return "P(max)" if key == "P(sum)" else key


def our_rules(entry: RuleEntry | None, shapes: Sequence[tuple[int, ...]] | None = None) -> list[OurRule]:
    """The entry's strategies with at least one non-replicated input; with ``shapes`` (a
    call's input shapes), only those the runtime applies there (``target.lined_up``)."""
    if entry is None or entry.status not in RULE_STATUSES:
        return []
    bools = [r.dtype == "bool" for r in entry.results]
    rules = []
    strategies = entry.all_strategies()
    for s in strategies if shapes is None else lined_up(strategies, shapes):
        if all(isinstance(p, Replicate) for p in s.inputs):
            continue
        ins = tuple(input_key(p) for p in s.inputs)
        opts = tuple(
            tuple(dict.fromkeys(bool_key(k) if j < len(bools) and bools[j] else k
                                for k in map(output_key, o.options) if k))
            for j, o in enumerate(s.outputs)
        )
        rules.append(OurRule(
            tuple(k or str(p) for k, p in zip(ins, s.inputs)), opts, s.inputs, tuple(o.options for o in s.outputs),
            None not in ins and all(opts),
        ))
    return rules
