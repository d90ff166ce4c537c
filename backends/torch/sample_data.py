"""Special-value inputs: data that makes predicate-like outputs vary.

Random signed data leaves some outputs constant: ``isnan`` never sees a NaN, ``eq.Scalar``
never meets its scalar, ``any`` never meets an all-zero input, ``prod`` of many normal
values underflows and its samples hold zeros anyway. The explorer cannot tell combines
apart on a constant output, so it asks for these inputs when the plain fresh ones leave
an output constant. Trial ``k`` (1, 2, ...) uses one pattern, cycling:

1. lone: all zero (False) but one element, the call's first nonzero scalar where it has
   one, so exactly one shard of an ``any``-like op sees a True (and of ``isin(2, x)`` the
   one 2: planted by chance alone, every shard held a 2, and ``identity`` passed) and
   ``identity`` is refuted while ``reduce(max)`` holds;
2. special: a third replaced by NaN, ±inf, 0 and the call's own scalars and their
   neighbours (so ``isnan`` and ``eq``/``gt`` with a scalar flip), and each scalar at one
   element at least (a histogram's ``min`` and ``max`` bound the values it reads);
3. near one: magnitudes close to one with random signs, half of them exactly one (products
   neither underflow nor overflow; a target read only at exactly ±1 is read; bools mostly
   True);
4. hole: near one but one element zero (False): the ``all``/``prod`` counterpart of lone;
5. zero: all zero (False): the one input where ``any`` is False;
6. nan: all NaN (the largest value for integers, all True for bools);
7. twin: near one, and every tensor shaped like an earlier one of the call a copy of it
   but for one element (zero, False), so ops that compare their inputs (``equal``,
   ``allclose``) see them agree on every shard but one: ``identity`` is refuted where
   ``reduce(min)`` holds.

All seven verify combines, and all seven must leave an output constant before the explorer
calls it shape-determined (``full_like``, ``fill``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

PATTERNS = ("lone", "special", "near_one", "hole", "zero", "nan", "twin")


def call_scalars(args: Any, kwargs: Any) -> list[float]:
    """The numeric non-tensor arguments of a call (bools excluded; infinities kept)."""
    return [
        float(x) for x in tree_leaves((list(args), dict(kwargs)))
        if isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)
    ]


def _held_scalars(x: torch.Tensor, scalars: list[float]) -> list[float]:
    """The call's scalars a tensor of ``x``'s dtype holds as they are: every one for floats,
    the whole ones for integers."""
    floating = x.dtype.is_floating_point or x.dtype.is_complex
    return [s for s in scalars if floating or (math.isfinite(s) and s.is_integer())]


def _special_pool(x: torch.Tensor, scalars: list[float], nonfinite: tuple[float, ...]) -> torch.Tensor:
    """Values to plant: the call's scalars make up half the pool (so ``ne(x, s)`` flips on
    every trial), their neighbours, zero, one and minus one (a ``target`` read only where
    it is exactly ±1: ``cosine_embedding_loss`` of random targets is 0 throughout) and, for
    floats, ``nonfinite``."""
    floating = x.dtype.is_floating_point or x.dtype.is_complex
    own = _held_scalars(x, scalars)
    others = [0.0, 1.0, -1.0] + [v for s in own if math.isfinite(s) for v in (s + 1, s - 1)]
    if floating:
        others += list(nonfinite)
    values = own * max(1, len(others) // max(1, len(own))) + others
    pool = torch.tensor(values, dtype=torch.float64)
    if not floating and x.dtype != torch.bool:
        info = torch.iinfo(x.dtype)
        pool = pool.clamp(info.min, info.max)
    return pool.to(x.dtype)


def _with_each_scalar(x: torch.Tensor, scalars: list[float]) -> torch.Tensor:
    """``x`` with each of the call's finite scalars it can hold at one element, spread evenly
    (no draw: later tensors' data stays as it was). Planted by chance alone, none landed in
    a 6-element ``histc(x, 4, 100, 200)``: every output was zero, and a Partial ``self``
    passed as ``identity``."""
    own = [v for v in dict.fromkeys(_held_scalars(x, scalars)) if math.isfinite(v)]
    if x.dtype == torch.bool or not own or x.numel() < len(own):
        return x
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        info = torch.iinfo(x.dtype)
        own = [min(max(v, info.min), info.max) for v in own]
    flat = x.flatten().clone()
    flat[[j * x.numel() // len(own) for j in range(len(own))]] = torch.tensor(own, dtype=torch.float64).to(x.dtype)
    return flat.reshape(x.shape)


def _near_one(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if x.dtype == torch.bool:
        return torch.rand(x.shape, generator=gen) < 0.9
    sign = torch.where(torch.rand(x.shape, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    if x.dtype.is_floating_point or x.dtype.is_complex:
        # half of them exactly 1: a target read only where it is exactly 1 or -1
        # (cosine_embedding_loss's) is 0 throughout on magnitudes merely near it
        magnitude = torch.exp(torch.empty(x.shape, dtype=torch.float64).uniform_(-0.2, 0.2, generator=gen))
        magnitude = torch.where(torch.rand(x.shape, generator=gen) < 0.5, 1.0, magnitude)
        return (sign * magnitude).to(x.dtype)
    twos = torch.where(torch.rand(x.shape, generator=gen) < 0.1, 2.0, 1.0).to(torch.float64)
    out = sign * twos
    if x.dtype == torch.uint8:
        out = out.abs()
    return out.to(x.dtype)


def _one_element(x: torch.Tensor, base: torch.Tensor, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``base`` with one element, at a random position, taken from ``value``."""
    mask = torch.zeros(x.numel(), dtype=torch.bool)
    mask[int(torch.randint(0, x.numel(), (1,), generator=gen))] = True
    return torch.where(mask.reshape(x.shape), value, base)


def _inject(x: torch.Tensor, pattern: str, scalars: list[float], gen: torch.Generator,
            nonfinite: tuple[float, ...], hole: float) -> torch.Tensor:
    if x.numel() == 0 or x.layout != torch.strided:
        return x
    zero = torch.zeros_like(x)
    if pattern == "zero":
        return zero
    if pattern == "nan":
        if x.dtype == torch.bool:
            return torch.ones_like(x)
        if x.dtype.is_floating_point or x.dtype.is_complex:
            return torch.full_like(x, math.nan)
        return torch.full_like(x, torch.iinfo(x.dtype).max)
    if pattern == "special":
        pool = _special_pool(x, scalars, nonfinite)
        picks = pool[torch.randint(0, len(pool), x.shape, generator=gen)]
        return _with_each_scalar(torch.where(torch.rand(x.shape, generator=gen) < 1 / 3, picks, x), scalars)
    near = _near_one(x, gen)
    if x.dtype == torch.bool:
        near = torch.ones_like(x) if pattern == "hole" else near
    if pattern == "lone":  # the call's first nonzero scalar where it has one (isin(2, x): one 2)
        own = [] if x.dtype == torch.bool else [v for v in _held_scalars(x, scalars) if math.isfinite(v) and v != 0]
        return _one_element(x, zero, torch.full_like(x, own[0]) if own else near, gen)
    if pattern == "hole":
        floating = x.dtype.is_floating_point or x.dtype.is_complex
        return _one_element(x, near, torch.full_like(x, hole) if floating else zero, gen)
    return near


def with_special_values(args: tuple, kwargs: dict, k: int, seed: int,
                        nonfinite: tuple[float, ...] = (math.nan, math.inf, -math.inf),
                        hole: float = 0.0) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with every tensor refilled by pattern ``k`` (see the module doc);
    ``nonfinite``: what the special pattern plants beside the scalars and zero; ``hole``:
    the hole pattern's one float element."""
    pattern = PATTERNS[(k - 1) % len(PATTERNS)]
    scalars = call_scalars(args, kwargs)
    gen = torch.Generator().manual_seed(seed)

    firsts: dict[tuple, torch.Tensor] = {}  # twin: the first tensor of each shape and dtype

    def refill(x):
        if not isinstance(x, torch.Tensor):
            return x
        if pattern != "twin" or x.numel() == 0 or x.layout != torch.strided:
            return _inject(x, pattern, scalars, gen, nonfinite, hole)
        first = firsts.get((x.shape, x.dtype))
        if first is None:
            first = firsts[(x.shape, x.dtype)] = _near_one(x, gen)
            return first
        return _one_element(x, first, torch.zeros_like(x), gen)

    new_args, new_kwargs = tree_map(refill, (list(args), dict(kwargs)))
    return tuple(new_args), new_kwargs


def with_sentinel(names: tuple[str, ...], args: tuple, kwargs: dict, index: str, argument: str,
                  default: Any) -> tuple[tuple, dict]:
    """The call with ``argument``'s value (``default`` where the call leaves it out) at the
    first element of the index input ``index``: a label the op skips (``ignore_index``)
    meets one shard only, so a combine that counts every label (a mean of shard means) is
    refuted. Unchanged where the input is missing or holds fewer than two labels (one
    skipped label would leave nothing to compute, and every combine would hold on the
    constant), or the value is not an int."""
    args, kwargs = tuple(args), dict(kwargs)
    value = kwargs.get(argument, args[names.index(argument)] if argument in names[: len(args)] else default)
    if not isinstance(value, int) or isinstance(value, bool):
        return args, kwargs
    position = names.index(index) if index in names[: len(args)] else None
    x = args[position] if position is not None else kwargs.get(index)
    if not isinstance(x, torch.Tensor) or x.numel() < 2 or x.is_floating_point():
        return args, kwargs
    planted = x.clone()
    planted[(0,) * planted.dim()] = value
    if position is not None:
        return args[:position] + (planted,) + args[position + 1:], kwargs
    return args, {**kwargs, index: planted}


def with_nan_specks(args: tuple, kwargs: dict, k: int, seed: int) -> tuple[tuple, dict]:
    """``with_special_values`` with NaN alone among finite data: the special pattern plants
    no inf, and the hole is a NaN. An op that skips NaN (nanmean) then sees shards with
    different NaN counts, which a planted inf would hide (the mean is inf on every shard
    that holds one); the hole puts the one NaN on one shard."""
    return with_special_values(args, kwargs, k, seed, nonfinite=(math.nan,), hole=math.nan)


def with_one_nonfinite(args: tuple, kwargs: dict, k: int, seed: int) -> tuple[tuple, dict]:
    """Finite data near one, but for one element of one float tensor: NaN, inf or -inf,
    tensor and value cycling with ``k``. An op that checks for non-finite values (AMP's
    unscale) then sees them on some inputs and not on others, as a Partial input whose one
    part holds the inf; the seven patterns above seldom leave one tensor of a list finite
    beside another that is not (a 0-d tensor takes a planted value a third of the time)."""
    def fillable(x) -> bool:
        return isinstance(x, torch.Tensor) and x.dtype.is_floating_point and x.numel() > 0 and x.layout == torch.strided

    gen = torch.Generator().manual_seed(seed)
    floats = [x for x in tree_leaves((list(args), dict(kwargs))) if fillable(x)]
    target = floats[(k - 1) % len(floats)] if floats else None
    value = (math.nan, math.inf, -math.inf)[(k - 1) % 3]

    def refill(x):
        if not fillable(x):
            return x
        near = _near_one(x, gen)
        return _one_element(x, near, torch.full_like(x, value), gen) if x is target else near

    new_args, new_kwargs = tree_map(refill, (list(args), dict(kwargs)))
    return tuple(new_args), new_kwargs


def with_ramps(args: tuple, kwargs: dict, k: int, seed: int) -> tuple[tuple, dict]:
    """Every float tensor evenly spaced and ascending in row-major order, over ranges that
    overlap ([-0.5 or 0 or 0.5] to [1 or 1.5 or 2], shifting with the tensor's place and
    ``k``): a histogram's sorted edges then span many of its points. Random data leaves a
    5-d histogram of 5 points empty on every trial (a point lands in all five ranges
    almost never), so any combine passed, Partial edges as ``identity`` included."""
    floats = [x for x in tree_leaves((list(args), dict(kwargs)))
              if isinstance(x, torch.Tensor) and x.dtype.is_floating_point and x.layout == torch.strided]

    def refill(x):
        if not any(x is f for f in floats) or x.numel() == 0:
            return x
        j = next(n for n, f in enumerate(floats) if x is f)
        low, high = -0.5 + 0.5 * ((j + k) % 3), 1.0 + 0.5 * ((j + 2 * k) % 3)
        return torch.linspace(low, high, x.numel(), dtype=torch.float64).to(x.dtype).reshape(x.shape)

    new_args, new_kwargs = tree_map(refill, (list(args), dict(kwargs)))
    return tuple(new_args), new_kwargs


def _integers(shape: tuple[int, ...], gen: torch.Generator, complex_: bool) -> torch.Tensor:
    """Integers in [-2, 2] (complex: in both parts), float64 or complex128."""
    real = torch.randint(-2, 3, shape, generator=gen).to(torch.float64)
    if not complex_:
        return real
    return torch.complex(real, torch.randint(-2, 3, shape, generator=gen).to(torch.float64))


def _full_rank_factor(rows: int, rank: int, pivots: list[int], gen: torch.Generator,
                      complex_: bool) -> torch.Tensor:
    """A (rows, rank) integer factor of column rank ``rank`` exactly: its rows at ``pivots``
    (``rank`` distinct rows) form a lower triangle whose diagonal is 1 or 2 in either sign.
    Integers drawn freely leave a small factor singular now and then, and a trial meant to
    be of full rank was not."""
    factor = _integers((rows, rank), gen, complex_)
    diagonal = torch.randint(1, 3, (rank,), generator=gen) * (torch.randint(0, 2, (rank,), generator=gen) * 2 - 1)
    for j, row in enumerate(pivots):
        factor[row, j + 1:] = 0
        factor[row, j] = float(diagonal[j])
    return factor


def _shaped_factor(rows: int, rank: int, shape: str, gen: torch.Generator, complex_: bool) -> torch.Tensor:
    """A (rows, rank) factor of column rank ``rank``, its rows shaped: 'duplicated' copies
    the first half's rows into the second half, 'zero' zeroes the second half (both hold
    their rank in the rows they keep: ``rank`` is at most ``rows - rows // 2``), 'spread'
    keeps ``rank`` rows spread from the first to the last and zeroes the rest, 'plain'
    keeps every row."""
    half = rows // 2
    spread = shape == "spread" and rank > 1
    pivots = torch.linspace(0, rows - 1, rank).round().long().tolist() if spread else list(range(rank))
    factor = _full_rank_factor(rows, rank, pivots, gen, complex_)
    if shape == "duplicated":
        factor[rows - half:] = factor[:half]
    elif shape == "zero":
        factor[rows - half:] = 0
    elif shape == "spread":
        kept = torch.zeros(rows, dtype=torch.bool)
        kept[pivots] = True
        factor[~kept] = 0
    return factor


def _low_rank_matrix(m: int, n: int, rank: int, symmetric: bool, shape: str, gen: torch.Generator,
                     complex_: bool) -> torch.Tensor:
    """An m x n matrix of rank ``rank`` exactly: integer factors (m, rank) and (n, rank) of
    full column rank, so the product is exact and its zero singular values fall below any
    default tolerance. ``symmetric`` (square only): F diag(d) F^H, as a Hermitian kernel
    reads it from one triangle. ``shape`` (``LOW_RANK_SHAPES``) shapes the rows of F
    ('duplicated', 'zero'), or of the right factor, the columns ('duplicated_cols',
    'zero_cols'; the rows where symmetric), or both ('spread'; see ``_shaped_factor``)."""
    cols = shape.endswith("_cols") or shape == "spread"
    rows = shape.removesuffix("_cols") if symmetric or not shape.endswith("_cols") else "plain"
    left = _shaped_factor(m, rank, rows, gen, complex_)
    if symmetric:
        d = torch.randint(1, 3, (rank,), generator=gen).to(torch.float64)
        d = d * torch.where(torch.rand(rank, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
        return (left * d.to(left.dtype)) @ left.mH
    right = _shaped_factor(n, rank, shape.removesuffix("_cols") if cols else "plain", gen, complex_)
    return left @ right.mT


# One matrix shape per trial, in turn, each refuting some combine of cut ranks at any size
# (shard count, halo) of the matrix: all of them come round within SPECIAL_TRIALS (7).
# 'spread' (full rank, held by rows and columns spread from first to last): every block,
# overlapping ones too, misses some of it, so no max, min or single block's rank is the
# whole's; 'duplicated' (the second half's rows repeat the first's) and its columns' twin:
# the blocks' ranks add up to more than the whole's; 'none': rank 0; 'zero' (the second
# half zero) and its twin: a block of rank 0 beside the whole's; 'plain': a product of
# random factors, of a rank in between.
LOW_RANK_SHAPES = ("spread", "duplicated", "duplicated_cols", "none", "zero", "zero_cols", "plain")


def _rank_and_shape(m: int, n: int, t: int) -> tuple[int, str]:
    """The rank and shape of the t-th matrix (trial k's matrix b of a batch: t = k - 1 + b)
    of an m x n rank query: a rank the shape can hold, changing with t."""
    p = min(m, n)
    shape = LOW_RANK_SHAPES[t % len(LOW_RANK_SHAPES)]
    if shape == "spread":
        return p, shape
    if shape == "none":
        return 0, "plain"
    if shape == "plain":
        return 1 + t % p, shape
    length = n if shape.endswith("_cols") else m
    return 1 + t % min(p, length - length // 2), shape


def with_low_rank(args: tuple, kwargs: dict, k: int, seed: int) -> tuple[tuple, dict]:
    """The first float tensor of at least two dims (the matrix of a rank query) refilled
    with matrices of chosen ranks, the other float tensors (its tolerances) with positive
    values spread over its singular values' range: 2**u for u uniform in [-3, 5], or in
    [-6, 0] for ``rtol`` (a fraction of the largest singular value).

    Random matrices have full rank, on every row block as on the whole, so the ranks of row
    blocks added up, and a Partial summand's rank was the whole's. Here matrix ``b`` of the
    batch in trial ``k`` takes shape ``LOW_RANK_SHAPES[(k - 1 + b) % 7]`` and a rank that
    shape holds (``_rank_and_shape``): within 7 trials, at any size, full rank spread over
    the matrix, rank 0, and blocks whose ranks neither add up to nor equal the whole's. A
    square matrix is Hermitian on odd ``k``, which a Hermitian rank (eigenvalues of one
    triangle) reads as low rank too. A cut that keeps each matrix whole on one shard
    computes every rank as the whole call does."""
    def fillable(x) -> bool:
        return (isinstance(x, torch.Tensor) and (x.dtype.is_floating_point or x.dtype.is_complex)
                and x.layout == torch.strided and x.numel() > 0)

    gen = torch.Generator().manual_seed(seed)
    floats = [x for x in tree_leaves((list(args), dict(kwargs))) if fillable(x)]
    matrix = next((x for x in floats if x.dim() >= 2), None)

    def refill(x, relative: bool = False):
        if not fillable(x):
            return x
        if x is not matrix:  # a nonzero singular value of the integer matrices is 0.1 to 40
            low, high = (-6, 0) if relative else (-3, 5)
            return (2.0 ** torch.empty(x.shape, dtype=torch.float64).uniform_(low, high, generator=gen)).to(x.dtype)
        *batch, m, n = x.shape
        out = torch.empty((math.prod(batch), m, n), dtype=torch.complex128 if x.dtype.is_complex else torch.float64)
        for b in range(out.shape[0]):
            rank, shape = _rank_and_shape(m, n, k - 1 + b)
            out[b] = _low_rank_matrix(m, n, rank, m == n and k % 2 == 1, shape, gen, x.dtype.is_complex)
        return out.reshape(x.shape).to(x.dtype)

    new_kwargs = {name: tree_map(lambda x, rel=name == "rtol": refill(x, rel), value) for name, value in kwargs.items()}
    return tuple(tree_map(refill, list(args))), new_kwargs


__all__ = ["LOW_RANK_SHAPES", "PATTERNS", "call_scalars", "with_low_rank", "with_nan_specks", "with_one_nonfinite",
           "with_ramps", "with_sentinel", "with_special_values"]
