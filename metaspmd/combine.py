"""Splitting inputs into shards and recombining local outputs (the combine functions)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .spec import ARG_REDUCE_OPS, ArgReduce, Combine, Gather, GatherPositions, Identity, Reduce, Scan, ShardIn
from .tensor_ops import BOOL, COMPLEX, FLOAT, INT, TensorOps, close_tensors

# The longest last dim of an integer output tried as rows of positions, one element per dim of
# the cut input (nonzero of a tensor of up to this many dims).
MAX_POSITION_VECTOR = 8


@dataclass(frozen=True)
class Split:
    """How one dim of size ``size`` is cut into ``n`` shards.

    ``skew`` makes the first shard larger than the rest, so uneven splits are exercised
    beyond the near-equal ones that ``size % n != 0`` already gives; ``narrow`` leaves every
    shard after the first one element wide, as ``torch.chunk`` (DTensor's split) does to a
    last shard (7 over 4: 2, 2, 2, 1).
    """

    n: int
    skew: bool = False
    narrow: bool = False

    def bounds(self, size: int) -> list[tuple[int, int]] | None:
        """(start, length) per shard, or None when ``size`` cannot be cut this way."""
        b = _bounds(self.n, self.skew, size, self.narrow)
        return None if b is None else list(b)

    def is_even(self, size: int) -> bool:
        b = self.bounds(size)
        return b is not None and len({length for _, length in b}) == 1


@functools.lru_cache(maxsize=4096)  # asked for every shard run and every evenness test
def _bounds(n: int, skew: bool, size: int, narrow: bool = False) -> tuple[tuple[int, int], ...] | None:
    if size < n:
        return None
    if narrow:
        lengths = [size - (n - 1)] + [1] * (n - 1)
    elif skew:
        rest = max(1, size // (2 * n))
        lengths = [size - rest * (n - 1)] + [rest] * (n - 1)
    else:
        q, r = divmod(size, n)
        lengths = [q + (1 if i < r else 0) for i in range(n)]
    if any(length <= 0 for length in lengths):
        return None
    starts = [sum(lengths[:i]) for i in range(n)]
    return tuple(zip(starts, lengths))


@dataclass(frozen=True)
class CutInput:
    """One input's shards along its cut ``dim`` and their starts: what a combine that reads
    input values (argreduce) needs beside the local outputs."""

    shards: Sequence[Any]
    dim: int
    starts: Sequence[int]


def shard_with_halo(ops: TensorOps, x: Any, dim: int, bounds: list[tuple[int, int]], halo: int) -> list[Any]:
    """The shards of x along dim; each extended by ``halo`` neighbour elements per side."""
    size = ops.shape(x)[dim]
    out = []
    for start, length in bounds:
        lo, hi = max(0, start - halo), min(size, start + length + halo)
        out.append(ops.narrow(x, dim, lo, hi - lo))
    return out


def proportional_bounds(bounds: list[tuple[int, int]], scale: int, extend: int, size: int) -> list[tuple[int, int]] | None:
    """A follower dim's shards (DimLabel's scale and extend) from its strategy's plain cut;
    None where the dim's ``size`` is not the plain dim's in that proportion."""
    start, length = bounds[-1]
    if scale * (start + length) + extend != size:
        return None
    return [(scale * s, scale * n + extend) for s, n in bounds]


Padding = Callable[[int, int], "tuple[int, int] | None"]  # OpCase.padding


def follower_ranges(ops: TensorOps, leaves: Sequence[Any], placements: Sequence[Any],
                    reference: list[tuple[int, int]], padding: Padding | None = None
                    ) -> dict[int, list[tuple[int, int]]] | None:
    """(start, stop) per shard of each input cut in proportion (``ShardIn.follows``), given
    the bounds of their strategy's plain cut; None where a length is out of proportion. A
    cut with local params follows the dim as the op pads it (``padding(input, dim)``: low,
    high), so its outer ranges reach past the dim's ends by that padding."""
    out = {}
    for i, p in enumerate(placements):
        if isinstance(p, ShardIn) and p.follows:
            low, high = (padding(i, p.dim) if p.local and padding else None) or (0, 0)
            if p.local and not low + high:
                return None  # nothing the op pads: no local params to re-base
            bounds = proportional_bounds(reference, p.scale, p.extend, ops.shape(leaves[i])[p.dim] + low + high)
            if bounds is None:
                return None
            out[i] = [(start - low, start - low + length) for start, length in bounds]
    return out


def follower_shards(ops: TensorOps, leaves: Sequence[Any], placements: Sequence[Any],
                    reference: list[tuple[int, int]], padding: Padding | None = None) -> dict[int, list[Any]] | None:
    """The shards of the inputs cut in proportion: their ``follower_ranges`` within the dim."""
    ranges = follower_ranges(ops, leaves, placements, reference, padding)
    if ranges is None:
        return None
    out = {}
    for i, spans in ranges.items():
        size = ops.shape(leaves[i])[placements[i].dim]
        bounds = [(max(start, 0), min(stop, size) - max(start, 0)) for start, stop in spans]
        if any(length < 0 for _, length in bounds):
            return None
        out[i] = shard_with_halo(ops, leaves[i], placements[i].dim, bounds, 0)
    return out


def offset_positions(ops: TensorOps, x: Any, starts: Sequence[int], component: int | None) -> list[Any]:
    """Per shard, integer positions ``x`` less that shard's start: every element, or element
    ``component`` of the last dim (an index vector)."""
    if component is None:
        return [ops.add_scalar(x, -start) for start in starts]
    d = len(ops.shape(x)) - 1
    size = ops.shape(x)[d]
    before = [ops.narrow(x, d, 0, component)] if component else []
    after = [ops.narrow(x, d, component + 1, size - component - 1)] if component + 1 < size else []
    moved = ops.narrow(x, d, component, 1)
    return [ops.concat(before + [ops.add_scalar(moved, -start)] + after, d) for start in starts]


def partial_summands(ops: TensorOps, x: Any, n: int, seed: int, spread: float = 1.0, aligned: bool = False) -> list[Any]:
    """n signed random tensors that add up to x (a Partial(sum) version of x); the random
    ones have standard deviation ``spread``. ``aligned`` (floats): wherever x is finite and
    not zero, each part is a fraction of x instead, of x's sign, so an infinity elsewhere
    times the parts adds up to that infinity, as it does times x. Parts of both signs give
    inf + -inf there: IEEE arithmetic that breaks every linear rule, not the op's doing."""
    parts = [ops.random_like(x, seed * 7919 + i) for i in range(n - 1)]
    if spread != 1.0:
        parts = [ops.scale(p, spread) for p in parts]
    if aligned and ops.dtype_kind(x) == FLOAT:
        value = np.asarray(ops.to_numpy(x))
        finite = np.isfinite(value) & (value != 0)
        # fractions in (0, 1/n): the last part keeps more than 1/n of x
        parts = [ops.from_numpy(np.where(finite, value * np.abs(a) / (n * (1 + np.abs(a))), a).astype(value.dtype), x)
                 for a in (np.asarray(ops.to_numpy(p)) for p in parts)]
    last = x
    for p in parts:
        last = ops.sub(last, p)
    return parts + [last]


def partial_factors(ops: TensorOps, x: Any, n: int, seed: int, spread: float = 1.0) -> list[Any]:
    """n tensors whose product is x (a Partial(prod) version of x): random factors of
    either sign, 2**(spread * u) for u uniform in [-1, 1), then x over their product."""
    rng = np.random.default_rng(seed)
    value = np.asarray(ops.to_numpy(x))
    parts = [rng.choice([-1.0, 1.0], value.shape) * 2.0 ** (spread * rng.uniform(-1, 1, value.shape))
             for _ in range(n - 1)]
    last = value / np.prod(parts, axis=0) if parts else value
    return [ops.from_numpy(p.astype(value.dtype), x) for p in parts] + [ops.from_numpy(last.astype(value.dtype), x)]


def partial_parts(ops: TensorOps, x: Any, op: str, n: int, seed: int, spread: float = 1.0,
                  aligned: bool = False) -> list[Any]:
    """n tensors that reduce by ``op`` (sum or prod) to x (``aligned``: ``partial_summands``)."""
    if op == "prod":
        return partial_factors(ops, x, n, seed, spread)
    return partial_summands(ops, x, n, seed, spread, aligned)


def reduce_ops_for(kind: str, even: bool) -> tuple[str, ...]:
    """The reduce ops worth trying for an output of dtype kind ``kind``."""
    if kind == FLOAT:
        return ("sum", "max", "min", "prod") + (("avg",) if even else ()) + ("norm2",)
    if kind == COMPLEX:  # max and min where the library orders complex numbers (jax: lexicographically)
        return ("sum", "max", "min", "prod") + (("avg",) if even else ())
    if kind == INT:
        return ("sum", "max", "min", "prod", "xor")
    if kind == BOOL:
        return ("max", "min", "xor")
    return ()


def scan_ops_for(kind: str) -> tuple[str, ...]:
    """The scan ops worth trying for an output of dtype kind ``kind``."""
    if kind == FLOAT:
        return ("sum", "prod", "max", "min", "logsumexp")
    if kind in (INT, COMPLEX):  # complex max and min in numpy's and jax's lexicographic order
        return ("sum", "prod", "max", "min")
    if kind == BOOL:
        return ("max", "min")
    return ()


def candidate_combines(
    ops: TensorOps, locals_: Sequence[Any], global_: Any, even: bool, max_halo: int = 0, max_block: int = 4,
    cut: Mapping[int, CutInput] | None = None,
) -> list[Combine]:
    """Every combine whose shapes fit, cheapest first; numerics decide later. ``cut``: the
    cut inputs by position, whose values an integer output may hold the arg-max or arg-min of."""
    gshape = ops.shape(global_)
    lshapes = [ops.shape(x) for x in locals_]
    if any(len(s) != len(gshape) for s in lshapes):
        return []
    n = len(locals_)
    out: list[Combine] = []
    for d in range(len(gshape)):
        if any(s[:d] + s[d + 1 :] != gshape[:d] + gshape[d + 1 :] for s in lshapes):
            continue
        total = sum(s[d] for s in lshapes)
        for lo in range(max_halo + 1):  # dropped from the start of every shard but the first ...
            for hi in range(max_halo + 1):  # ... and from the end of every shard but the last
                # sides one apart cover pad's (1, 2) and a window of 2; wider skews passed only
                # where the rows they shift are zero (triu far above the diagonal). A shard may
                # give a plain gather nothing (a mask cut with its rows), though not all of them
                # (an empty output proves nothing); apply_combine refuses a halo that leaves a
                # shard nothing of its own.
                if abs(lo - hi) <= 1 and total > 0 and total - (lo + hi) * (n - 1) == gshape[d]:
                    out.append(Gather(d, lo, 1, hi))
        # sums of neighbours' overlapping ends (an or, for bools); every shard keeps some of
        # its own (an overlap of a whole shard is a reduce(sum) of the shards); kept only
        # where no halo gather holds
        overlap, rest = divmod(total - gshape[d], n - 1) if n > 1 else (0, 1)
        if not rest and 0 < overlap < min(s[d] for s in lshapes):
            out.append(Gather(d, overlap=overlap))
        if total == gshape[d] and total > 0:  # kept only where no plain gather holds
            out.append(Gather(d, reverse=True))
            out += [Scan(d, op, reverse) for reverse in (False, True) for op in scan_ops_for(ops.dtype_kind(global_))]
            if cut and ops.dtype_kind(global_) == INT:  # positions along the cut dim (nonzero)
                if len(gshape) == 1:
                    out.append(GatherPositions(d))
                elif d < len(gshape) - 1:  # rows of positions, one element per dim of the input
                    out += [GatherPositions(d, c) for c in range(min(gshape[-1], MAX_POSITION_VECTOR))]
        if total == gshape[d] and max_block > 1:
            for block in range(2, max_block + 1):
                if all(s[d] % block == 0 and s[d] > 0 for s in lshapes):
                    out.append(Gather(d, 0, block))
    if all(s == gshape for s in lshapes):
        out.append(Identity())
        out += [Reduce(op) for op in reduce_ops_for(ops.dtype_kind(global_), even)]
        if ops.dtype_kind(global_) == INT:
            out += [ArgReduce(op, i) for i, c in sorted((cut or {}).items())
                    if ops.dtype_kind(c.shards[0]) in (FLOAT, INT, BOOL) for op in ARG_REDUCE_OPS]
    return out


_FOLDS = {"sum": "add", "avg": "add", "prod": "multiply", "max": "maximum", "min": "minimum",
          "logsumexp": "logaddexp", "xor": "bitwise_xor"}  # TensorOps' methods by name


def _fold(ops: TensorOps, op: str):
    """The elementwise binary function that reduces or scans by ``op``."""
    return getattr(ops, _FOLDS[op])


def _scan(ops: TensorOps, combine: Scan, locals_: Sequence[Any]) -> Any:
    """Fold every shard's local scan with the carry of the shards before it (after it, for a
    reverse scan): the edge slice of their already combined output."""
    fold = _fold(ops, combine.op)
    d = combine.dim
    order = range(len(locals_) - 1, -1, -1) if combine.reverse else range(len(locals_))
    pieces: list[Any] = [None] * len(locals_)
    carry = None
    for i in order:
        x = locals_[i] if carry is None else fold(locals_[i], carry)  # carry broadcasts along d
        pieces[i] = x
        size = ops.shape(x)[d]
        if size:
            carry = ops.narrow(x, d, 0 if combine.reverse else size - 1, 1)
    return ops.concat(pieces, d)


def _arg_reduce(ops: TensorOps, combine: ArgReduce, locals_: Sequence[Any], cut: Mapping[int, CutInput] | None) -> Any:
    """Global positions from each shard's local ones: the winner's, plus its shard's start."""
    src = (cut or {}).get(combine.input)
    if src is None:
        raise ValueError(f"{combine} needs the shards of input {combine.input}")
    best_value = best_position = None
    for local, shard, start in zip(locals_, src.shards, src.starts):
        position = np.asarray(ops.to_numpy(local)).astype(np.int64)
        values = np.asarray(ops.to_numpy(shard))
        if values.dtype.kind not in "biuf" or position.ndim not in (values.ndim, values.ndim - 1):
            raise ValueError("no ordered values to index")
        if position.size and (position.min() < 0 or position.max() >= values.shape[src.dim]):
            raise ValueError("a local position outside its shard")
        index = position if position.ndim == values.ndim else np.expand_dims(position, src.dim)
        value = np.take_along_axis(values, index, axis=src.dim)
        if value.shape != index.shape:
            raise ValueError("positions and values do not line up")
        value = value.reshape(position.shape)
        if best_value is None:
            best_value, best_position = value, position + start
            continue
        wins = value > best_value if combine.op == "max" else value < best_value
        if values.dtype.kind == "f":  # NaN beats every number, and the first NaN stays
            wins = (wins | np.isnan(value)) & ~np.isnan(best_value)
        best_value = np.where(wins, value, best_value)
        best_position = np.where(wins, position + start, best_position)
    return ops.from_numpy(best_position, locals_[0])


def _gather_positions(ops: TensorOps, combine: GatherPositions, locals_: Sequence[Any],
                      cut: Mapping[int, CutInput] | None) -> Any:
    """Each shard's positions moved by its start along the cut dim, then concatenated."""
    starts = {tuple(c.starts) for c in (cut or {}).values()}
    if len(starts) != 1:
        raise ValueError(f"{combine} needs one start per shard")
    pieces = []
    for local, start in zip(locals_, next(iter(starts))):
        positions = np.array(ops.to_numpy(local))
        if positions.dtype.kind not in "iu":
            raise ValueError("positions are integers")
        if combine.component is None:
            positions += start
        elif positions.ndim and combine.component < positions.shape[-1]:
            positions[..., combine.component] += start
        else:
            raise ValueError(f"no element {combine.component} in the last dim of {positions.shape}")
        pieces.append(ops.from_numpy(positions, local))
    return ops.concat(pieces, combine.dim)


def _overlap_add(ops: TensorOps, combine: Gather, locals_: Sequence[Any]) -> Any:
    """Concatenate with each shard's first ``overlap`` elements added onto the last ones
    of the output so far."""
    d, k = combine.dim, combine.overlap
    acc = locals_[0]
    for x in locals_[1:]:
        size, got = ops.shape(x)[d], ops.shape(acc)[d]
        if size < k or got < k:
            raise ValueError(f"a shard shorter than the overlap of {k} along dim {d}")
        pieces = [ops.narrow(acc, d, 0, got - k), ops.add(ops.narrow(acc, d, got - k, k), ops.narrow(x, d, 0, k))]
        acc = ops.concat(pieces + ([ops.narrow(x, d, k, size - k)] if size > k else []), d)
    return acc


def apply_combine(ops: TensorOps, combine: Combine, locals_: Sequence[Any],
                  cut: Mapping[int, CutInput] | None = None) -> Any:
    """The global output that ``combine`` builds from the local outputs (and, for an
    argreduce, from the values of the cut input it names; for positions, from the shards'
    starts)."""
    if isinstance(combine, ArgReduce):
        return _arg_reduce(ops, combine, locals_, cut)
    if isinstance(combine, GatherPositions):
        return _gather_positions(ops, combine, locals_, cut)
    if isinstance(combine, Scan):
        return _scan(ops, combine, locals_)
    if isinstance(combine, Identity):
        return locals_[0]
    if isinstance(combine, Reduce) and combine.op == "norm2":
        acc = ops.multiply(locals_[0], locals_[0])
        for x in locals_[1:]:
            acc = ops.add(acc, ops.multiply(x, x))
        return ops.sqrt(acc)
    if isinstance(combine, Reduce):
        fold = _fold(ops, combine.op)
        acc = locals_[0]
        for x in locals_[1:]:
            acc = fold(acc, x)
        return ops.scale(acc, 1.0 / len(locals_)) if combine.op == "avg" else acc
    if combine.reverse:
        return ops.concat(list(locals_)[::-1], combine.dim)
    if combine.overlap:
        return _overlap_add(ops, combine, locals_)
    d, n = combine.dim, len(locals_)
    pieces = []
    for i, x in enumerate(locals_):
        size = ops.shape(x)[d]
        lo = combine.halo if i > 0 else 0
        hi = size - (combine.halo_end if i < n - 1 else 0)
        if (combine.halo or combine.halo_end) and hi <= lo:
            # a shard that keeps none of its own output: not this combine (a replicated
            # output would "gather" from the first and last shards' halves)
            raise ValueError(f"shard {i} keeps no element along dim {d}")
        pieces.append(ops.narrow(x, d, lo, hi - lo) if (lo, hi) != (0, size) else x)
    if combine.block == 1:
        return ops.concat(pieces, d)
    blocks = []
    for b in range(combine.block):
        for x in pieces:
            step = ops.shape(x)[d] // combine.block
            blocks.append(ops.narrow(x, d, b * step, step))
    return ops.concat(blocks, d)


def holds(ops: TensorOps, combine: Combine, locals_: Sequence[Any], global_: Any,
          cut: Mapping[int, CutInput] | None = None) -> bool:
    """Does ``combine`` rebuild ``global_`` from ``locals_`` exactly (within tolerance)?

    A sum rounds at its summands' size, not its result's: where the locals nearly cancel
    (a Partial input's parts of spread 8 around data near zero), the tolerance is scaled
    to the largest local. Scaled to the result alone, a true rule's verdict turned on the
    kernel's summation order (convolution_backward on one thread or two)."""
    try:
        if isinstance(combine, Identity):
            return all(ops.close(x, global_) for x in locals_)
        combined = apply_combine(ops, combine, locals_, cut)
        if ops.close(combined, global_):
            return True
        return combine in _SUMS and close_tensors(ops, combined, global_, _largest_magnitude(ops, locals_))
    except Exception:  # shapes that do not line up, dtype mismatches: not a valid combine
        return False


_SUMS = (Reduce("sum"), Reduce("avg"))


def _largest_magnitude(ops: TensorOps, xs: Sequence[Any]) -> float:
    """The largest finite magnitude among the floating tensors ``xs`` (0 where none)."""
    top = 0.0
    for x in xs:
        if ops.is_tensor(x) and ops.dtype_kind(x) in (FLOAT, COMPLEX) and not ops.opaque(x):
            size = np.abs(np.asarray(ops.to_numpy(x), dtype=np.complex128 if ops.dtype_kind(x) == COMPLEX else np.float64))
            finite = size[np.isfinite(size)]
            if finite.size:
                top = max(top, float(finite.max()))
    return top
