"""Rule entries and op records: the content of one registry file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Union

from .spec import (
    CombineSpec, IndependentSpec, Layer, OffsetSpec, PartialSpec, ShardSpec, Strategy, joint_strategies, strategies,
)

SCHEMA_VERSION = 1
# Bump with every soundness fix of the explorer or verifier, or any change of what an
# entry means: rules that live exploration cached under an older version are then never
# trusted, but explored again (the rule cache keys its folders by this number).
VERIFIER_VERSION = 9  # 2: live cases run out= and in-place ops on fresh outs and cloned inputs; 3: inputs read
# only at 0 or ±1 (hinge_embedding_loss) are not Partial beside identity, NaN ties refute argreduce;
# 4: the call's scalars planted in special values, stand-ins of calls with value bounds checked at the call;
# 5: rank queries meet every low-rank matrix shape on one matrix (a 2 x 6 matrix's row cut passed as a sum);
# 6: data past the call's value arguments (index_fill(x, 0, i, 3.0)'s index cut passed as a max);
# 7: jax select_n's which redrawn per trial (a False flag's other case passed as identity);
# 8: argreduce meets a line's extreme as a zero of each sign (jax top_k orders +0.0 above -0.0);
# 9: data at and past every value argument, ints too; exact ±1 and a lone scalar among special values
# Joint strategies of independent parts offered per entry: (labels per part + 1) ** parts
# grows fast for long lists; the single labels always remain.
JOINT_LIMIT = 64

# Entry statuses. 'ok': explored and verified strategies; 'derived': derived from shape
# arithmetic and verified; 'replicate-only': explored, no strategy holds; 'failed': the
# op could not be run or explored on this example (reason says why).
ENTRY_STATUSES = ("ok", "derived", "replicate-only", "failed")
# Op statuses add those that stop before any example runs; 'composite': an op with bodies
# (control flow) whose rules are its body's ops' rules, composed where it is called (the
# reason says how), so it has no entries of its own.
OP_STATUSES = ENTRY_STATUSES + ("nondeterministic", "no-sample", "composite", "skipped")
# Entry statuses whose strategies (possibly none) were verified: the entries a rule table
# holds, and what a rule diff counts as present
VERIFIED = ("ok", "derived")


@dataclass(frozen=True)
class TensorArg:
    """A tensor in a replayable example: shape and dtype only."""

    shape: tuple[int, ...]
    dtype: str


ExampleValue = Union[TensorArg, None, bool, int, float, str, tuple]


@dataclass(frozen=True)
class Example:
    """The concrete call an entry was discovered and verified on, under schema names."""

    args: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Verification:
    """What the verifier ran before accepting the entry's strategies."""

    trials: int
    shard_counts: tuple[int, ...]
    uneven: bool


@dataclass(frozen=True)
class RuleEntry:
    signature: str
    status: str
    shard: ShardSpec
    partial: PartialSpec
    combine: CombineSpec
    example: Example
    verified: Verification | None = None
    reason: str = ""
    notes: tuple[str, ...] = ()
    results: tuple[TensorArg, ...] = ()  # the example's tensor outputs, in flattening order
    independent: IndependentSpec | None = None  # parts whose labels may share a mesh axis
    offset: OffsetSpec | None = None  # index inputs offset per shard (gather/scatter positions)
    # further tables, for strategies that cut a dim the tables before already label
    more: tuple[Layer, ...] = ()

    def strategies(self) -> Iterator[Strategy]:
        """One strategy per label, in label order."""
        yield from strategies(self.shard, self.partial, self.combine, self.offset)
        for layer in self.more:
            yield from layer.strategies()

    def layers(self) -> tuple[Layer, ...]:
        """The first tables and the further ones."""
        return (Layer(self.shard, self.partial, self.combine, self.offset),) + self.more

    def joint_strategies(self, limit: int = JOINT_LIMIT) -> list[Strategy]:
        """Labels of independent parts sharing one mesh axis (``S1+S3``)."""
        return joint_strategies(list(self.strategies()), self.independent, limit)

    def all_strategies(self, limit: int = JOINT_LIMIT) -> list[Strategy]:
        """What a planner or rule table may choose from on one mesh axis."""
        return list(self.strategies()) + self.joint_strategies(limit)

    @property
    def n_inputs(self) -> int:
        return len(self.shard.inputs)


@dataclass(frozen=True)
class OpRecord:
    """One registry file: an op, its overall status, and its entries sorted by signature."""

    op: str
    backend: str
    status: str
    entries: tuple[RuleEntry, ...] = ()
    reason: str = ""

    def entry(self, signature: str) -> RuleEntry | None:
        for e in self.entries:
            if e.signature == signature:
                return e
        return None


def summarize_status(entries: tuple[RuleEntry, ...]) -> tuple[str, str]:
    """The op status from its entries: the best outcome any signature reached."""
    if not entries:
        return "no-sample", "no example call"
    statuses = {e.status for e in entries}
    for s in ("ok", "derived", "replicate-only"):
        if s in statuses:
            return s, ""
    return "failed", entries[0].reason


def make_record(op: str, backend: str, entries) -> OpRecord:
    entries = tuple(sorted(entries, key=lambda e: e.signature))
    status, reason = summarize_status(entries)
    return OpRecord(op, backend, status, entries, reason)


__all__ = [
    "ENTRY_STATUSES", "Example", "JOINT_LIMIT", "OP_STATUSES", "OpRecord", "RuleEntry", "SCHEMA_VERSION",
    "TensorArg", "VERIFIER_VERSION", "Verification", "make_record", "summarize_status",
]
