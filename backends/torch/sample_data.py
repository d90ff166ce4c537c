"""Special-value inputs: data that makes predicate-like outputs vary.

Random signed data leaves some outputs constant: ``isnan`` never sees a NaN, ``eq.Scalar``
never meets its scalar, ``any`` never meets an all-zero input, ``prod`` of many normal
values underflows and its samples hold zeros anyway. The explorer cannot tell combines
apart on a constant output, so it asks for these inputs when the plain fresh ones leave
an output constant. Trial ``k`` (1, 2, ...) uses one pattern, cycling:

1. lone: all zero (False) but one element, so exactly one shard of an ``any``-like op
   sees a True and ``identity`` is refuted while ``reduce(max)`` holds;
2. special: a third replaced by NaN, ±inf, 0 and the call's own scalars and their
   neighbours (so ``isnan`` and ``eq``/``gt`` with a scalar flip);
3. near one: magnitudes close to one with random signs (products neither underflow nor
   overflow; bools mostly True);
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


def _special_pool(x: torch.Tensor, scalars: list[float], nonfinite: tuple[float, ...]) -> torch.Tensor:
    """Values to plant: the call's scalars make up half the pool (so ``ne(x, s)`` flips on
    every trial), their neighbours, zero and, for floats, ``nonfinite``."""
    floating = x.dtype.is_floating_point or x.dtype.is_complex
    own = [s for s in scalars if floating or (math.isfinite(s) and s.is_integer())]
    others = [0.0] + [v for s in own if math.isfinite(s) for v in (s + 1, s - 1)]
    if floating:
        others += list(nonfinite)
    values = own * max(1, len(others) // max(1, len(own))) + others
    pool = torch.tensor(values, dtype=torch.float64)
    if not floating and x.dtype != torch.bool:
        info = torch.iinfo(x.dtype)
        pool = pool.clamp(info.min, info.max)
    return pool.to(x.dtype)


def _near_one(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if x.dtype == torch.bool:
        return torch.rand(x.shape, generator=gen) < 0.9
    sign = torch.where(torch.rand(x.shape, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    if x.dtype.is_floating_point or x.dtype.is_complex:
        magnitude = torch.exp(torch.empty(x.shape, dtype=torch.float64).uniform_(-0.2, 0.2, generator=gen))
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
        return torch.where(torch.rand(x.shape, generator=gen) < 1 / 3, picks, x)
    near = _near_one(x, gen)
    if x.dtype == torch.bool:
        near = torch.ones_like(x) if pattern == "hole" else near
    if pattern == "lone":
        return _one_element(x, zero, near, gen)
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


__all__ = ["PATTERNS", "call_scalars", "with_nan_specks", "with_one_nonfinite", "with_ramps", "with_special_values"]
