"""Shape arithmetic of reshapes: which input dim lands on which output dim, and how.

One copy for every backend: torch derives its view rules from it (a local ``view(x, [4, 6])``
fails on a shard as written, so the strategies are derived and then verified numerically,
``OpCase.candidates``), and the JAX backend rewrites a shard's ``new_sizes`` from its groups
(``backends/jax/params.py``) so that its explorer can search reshapes as it searches any op.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from .spec import Gather, InputPlacement, OutputCombine, ShardIn

Candidate = tuple[tuple[InputPlacement, ...], tuple[OutputCombine, ...]]
Shape = Sequence[int]


def reshape_groups(src: Shape, dst: Shape) -> list[tuple[list[int], list[int]]]:
    """Split two shapes of equal numel (no zeros) into minimal runs of dims with equal
    products; a trailing size-1 dim is a group of its own with nothing on the other side."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj, pi, pj = [], [], 1, 1
        if i < len(src):
            pi, i = src[i], i + 1
            gi.append(i - 1)
        if j < len(dst):
            pj, j = dst[j], j + 1
            gj.append(j - 1)
        while pi != pj:
            if pi < pj and i < len(src):
                pi, i = pi * src[i], i + 1
                gi.append(i - 1)
            elif pj < pi and j < len(dst):
                pj, j = pj * dst[j], j + 1
                gj.append(j - 1)
            else:
                raise ValueError(f"shapes {tuple(src)} and {tuple(dst)} do not split into runs of equal products")
        groups.append((gi, gj))
    return groups


def reshape_mapping(src: Shape, dst: Shape) -> dict[int, int]:
    """Input dims a reshape keeps shardable: the leading non-1 dim of a group that merges
    into (or equals) one non-1 output dim. Sharding that dim shards the output dim in order,
    whatever the shard sizes; a dim split into several outputs needs even shards
    (``reshape_even_mapping``)."""
    return _leading_dims(src, dst, lambda ins, outs: len(outs) == 1)


def reshape_even_mapping(src: Shape, dst: Shape) -> dict[int, int]:
    """Input dims a reshape keeps shardable on even cuts only: the leading non-1 dim of a
    group that splits into several non-1 output dims ([8, 256] as [8, 4, 64]; [6, 4] as
    [4, 6]) maps onto the group's leading non-1 output dim. A cut into n equal shards is n
    equal runs of the group's elements, and those are n equal runs of output rows exactly
    where n divides that output dim too: gather(dim=o, even=true), DTensor's view rule for
    a split. With every size known to the planner, it keeps the cut where both divide."""
    return _leading_dims(src, dst, lambda ins, outs: len(outs) > 1 and math.gcd(src[ins[0]], dst[outs[0]]) > 1)


def _leading_dims(src: Shape, dst: Shape, keeps: Callable[[list[int], list[int]], bool]) -> dict[int, int]:
    """For each group of a reshape whose non-1 input and output dims ``keeps`` accepts, its
    leading non-1 input dim -> its leading non-1 output dim."""
    if 0 in src or 0 in dst:
        return {}
    mapping = {}
    for gi, gj in reshape_groups(src, dst):
        ins = [d for d in gi if src[d] != 1]
        outs = [o for o in gj if dst[o] != 1]
        if ins and keeps(ins, outs):
            mapping[ins[0]] = outs[0]
    return mapping


def reshape_block_mapping(src: Shape, dst: Shape) -> dict[int, tuple[int, int]]:
    """Input dims merged into one output dim behind others: {dim: (output dim, block)}.
    Cutting such a dim leaves every shard one block per index of the dims in front of it
    (block = their product), and the output is those blocks interleaved: gather(dim=o,
    block=B), DTensor's _StridedShard(o, B) (flatten of [4, 6] cut along its 6)."""
    if 0 in src or 0 in dst:
        return {}
    out = {}
    for gi, gj in reshape_groups(src, dst):
        outs = [o for o in gj if dst[o] != 1]
        if len(outs) != 1:
            continue
        block = 1
        for d in gi:
            if src[d] != 1 and block > 1:
                out[d] = (outs[0], block)
            block *= src[d]
    return out


def reshape_sizes(src: Shape, dst: Shape) -> dict[int, int]:
    """Every input dim a reshape keeps shardable (plain, block or even cut) -> the output
    dim whose size a shard's reshape takes from it: a shard rewrites only that size."""
    blocks = reshape_block_mapping(src, dst)
    return {**reshape_mapping(src, dst), **{d: o for d, (o, _) in blocks.items()}, **reshape_even_mapping(src, dst)}


def single_cuts(mapping: dict[int, int], shape: Shape, n_outputs: int = 1) -> tuple[Candidate, ...]:
    """One candidate per input dim of at least 2: Shard(d) -> gather(mapping[d]) on every output."""
    return tuple(
        ((ShardIn(d),), tuple(OutputCombine((Gather(o),)) for _ in range(n_outputs)))
        for d, o in sorted(mapping.items())
        if shape[d] >= 2
    )


def reshape_candidates(src: Shape, dst: Shape) -> tuple[Candidate, ...]:
    """A reshape's strategies to verify: plain gathers where a cut dim leads its group,
    block gathers where it merges in behind others, even gathers where it splits."""
    return cut_candidates(reshape_mapping(src, dst), reshape_block_mapping(src, dst), src,
                          reshape_even_mapping(src, dst))


def cut_candidates(mapping: dict[int, int], blocks: dict[int, tuple[int, int]], shape: Shape,
                   even: dict[int, int] | None = None) -> tuple[Candidate, ...]:
    """The plain gathers of ``mapping``, the block gathers of ``blocks`` and the even
    gathers of ``even`` (the three maps above, or a part of them)."""
    return single_cuts(mapping, shape) + tuple(
        ((ShardIn(d),), (OutputCombine((Gather(o, block=block),)),))
        for d, (o, block) in sorted(blocks.items()) if shape[d] >= 2
    ) + tuple(((ShardIn(d),), (OutputCombine((Gather(o, even=True),)),)) for d, o in sorted((even or {}).items()))


__all__ = [
    "Candidate", "cut_candidates", "reshape_block_mapping", "reshape_candidates", "reshape_even_mapping",
    "reshape_groups", "reshape_mapping", "reshape_sizes", "single_cuts",
]
