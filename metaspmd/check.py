"""The one shard-run-combine check: a strategy's inputs cut for n shards, the op run on
each shard, and the combines that rebuild every global output from the local ones.

The explorer, the torch cross-check and the jax cross-check all check rules through
here, so halos, proportional cuts, Partial parts, index offsets and local params are
handled once. Callers choose only how a dim is cut (``Bounds``: near-equal, skewed, as
torch.chunk) and how a Partial input is split (``Parts``), and read the verdict their
own way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .combine import CutInput, Padding, follower_ranges, follower_shards, holds, offset_positions, shard_with_halo
from .spec import Combine, IndexOffset, InputPlacement, PartialInput, ShardIn
from .tensor_ops import TensorOps

Bounds = Callable[[int], "list[tuple[int, int]] | None"]  # a dim's size -> (start, length) per shard
Parts = Callable[[int, Any, str], list]  # (input index, its value, Partial op) -> one part per shard
LocalParams = Mapping[int, "tuple[int, int, int, int]"]  # input -> (dim, start, stop, size): OpCase.localize


@dataclass(frozen=True)
class Cut:
    """The inputs a strategy cuts by their own length (``ShardIn`` that does not follow), in
    input order: where each shard starts and ends, and the shards, halos included."""

    n: int
    bounds: Mapping[int, list[tuple[int, int]]] = field(default_factory=dict)
    shards: Mapping[int, list] = field(default_factory=dict)
    # what stopped the cutting; the inputs before it are cut, so a caller can still judge them
    why: str = ""

    def starts(self) -> list[int] | None:
        """Each shard's start on the first cut, which index offsets and proportional cuts follow."""
        first = next(iter(self.bounds.values()), None)
        return None if first is None else [start for start, _ in first]

    def values(self, placements: Sequence[InputPlacement]) -> dict[int, CutInput]:
        """The inputs cut without a halo, whose values and starts an argreduce reads."""
        return {i: CutInput(self.shards[i], placements[i].dim, [s for s, _ in b])
                for i, b in self.bounds.items() if not placements[i].halo}


# (input index, its value, dim, (start, length) per shard, halo) -> its shards: a caller may
# keep them for its next cut of the same input (the explorer's memo)
ShardOf = Callable[[int, Any, int, "list[tuple[int, int]]", int], list]


def cut_inputs(ops: TensorOps, leaves: Sequence[Any], placements: Sequence[InputPlacement], n: int,
               bounds: Bounds, shard: ShardOf | None = None) -> Cut:
    """Cut every input that ``placements`` cut by its own length into ``n`` shards (by
    ``shard``, default ``shard_with_halo``); stops at the first dim that ``bounds`` cannot
    cut (``Cut.why``)."""
    shard = shard or (lambda i, x, dim, b, halo: shard_with_halo(ops, x, dim, b, halo))
    got: dict[int, list[tuple[int, int]]] = {}
    shards: dict[int, list] = {}
    for i, p in enumerate(placements):
        if isinstance(p, ShardIn) and not p.follows:
            size = ops.shape(leaves[i])[p.dim]
            b = bounds(size)
            if b is None:
                return Cut(n, got, shards, f"a dim of size {size} cannot be cut in {n}")
            got[i], shards[i] = b, shard(i, leaves[i], p.dim, b, p.halo)
    return Cut(n, got, shards)


@dataclass(frozen=True)
class Sharded:
    """A strategy's inputs for each of n shards, ready to run."""

    inputs: tuple[tuple[Any, ...], ...]  # per shard, the op's local input leaves
    local: tuple[LocalParams, ...]  # per shard, the ranges its local params are re-based to
    plain: Cut  # the inputs cut by their own length
    placements: Sequence[InputPlacement]
    pieces: Mapping[int, list]  # per input that is not whole, its piece on each shard

    @property
    def cut(self) -> dict[int, CutInput]:
        """What argreduce reads beside the local outputs (made when asked: most runs never do)."""
        return self.plain.values(self.placements)

    def run(self, call: Callable[[list, LocalParams], Any]) -> list:
        """``call(local leaves, local params)`` on every shard, in order; exceptions propagate."""
        return [call(list(leaves), local) for leaves, local in zip(self.inputs, self.local)]


def shard_inputs(ops: TensorOps, leaves: Sequence[Any], placements: Sequence[InputPlacement], cut: Cut,
                 parts: Parts, padding: Padding | None = None, whole: Sequence[Any] | None = None) -> Sharded | str:
    """Every input's piece per shard, given its plain ``cut``: inputs cut in proportion follow
    the first plain cut (reaching past the dim where the op pads it, ``padding``), Partial
    inputs split by ``parts``, index offsets moved by each shard's start. ``whole``: the
    inputs as every shard sees those it does not cut (default ``leaves``; positions clamped
    into range where the shards run a dropping form). A string says why it cannot be done."""
    if cut.why:
        return cut.why
    whole = leaves if whole is None else whole
    pieces: dict[int, list] = dict(cut.shards)
    local: list[dict] = [{} for _ in range(cut.n)]
    for i, b in cut.bounds.items():
        p = placements[i]
        for k, (start, length) in enumerate(b if p.local else ()):
            local[k][i] = (p.dim, start, start + length, ops.shape(leaves[i])[p.dim])
    reference = next(iter(cut.bounds.values()), None)
    if any(isinstance(p, ShardIn) and p.follows for p in placements):
        if reference is None:
            return "a proportional cut with no plain cut to follow"
        followers = follower_shards(ops, leaves, placements, reference, padding)
        if followers is None:
            return "a proportional cut does not fit its plain cut's length"
        for i, spans in follower_ranges(ops, leaves, placements, reference, padding).items():
            if placements[i].local:  # the op pads only the part of a shard's range past the dim
                for k, (start, stop) in enumerate(spans):
                    local[k][i] = (placements[i].dim, start, stop, ops.shape(leaves[i])[placements[i].dim])
        pieces.update(followers)
    for i, p in enumerate(placements):
        if isinstance(p, IndexOffset):
            if reference is None:
                return "an index offset with no cut to follow"
            pieces[i] = offset_positions(ops, whole[i], cut.starts(), p.component)
        elif isinstance(p, PartialInput):
            pieces[i] = parts(i, leaves[i], p.op)
    columns = [pieces.get(i) for i in range(len(whole))]
    inputs = tuple(tuple([x if c is None else c[k] for x, c in zip(whole, columns)]) for k in range(cut.n))
    return Sharded(inputs, tuple(local), cut, placements, pieces)


def surviving(ops: TensorOps, options: Sequence[Sequence[Combine]], locals_: Sequence[Sequence[Any]],
              globals_: Sequence[Any], cut: Mapping[int, CutInput] | None = None) -> list[list[Combine]]:
    """Per output, the combines of ``options`` that rebuild it from the shards' outputs."""
    return [[c for c in opts if holds(ops, c, [loc[j] for loc in locals_], globals_[j], cut)]
            for j, opts in enumerate(options)]
