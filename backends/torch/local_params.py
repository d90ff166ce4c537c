"""Local params (DimLabel.local) for ATen ops that index one dim: ``slice`` and ``narrow``
keep the positions a shard holds, ``split`` and its kin each piece's part of the shard,
``select`` and ``unbind`` the pieces the shard holds (zeros for the others, which the
shards' sum ignores). A shard's call is the same selection written for its own part:
``slice`` with re-based bounds, ``split_with_sizes`` with the pieces' local sizes.

The positions an op takes along its dim are read off the op itself, run on a meta tensor
of the global size (a split's pieces) or on the positions themselves (a slice's step), so
every overload and argument spelling (``chunk``, ``tensor_split`` by indices, negative
dims and indices) is handled the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from .views import bound_args, view_base

_RANGE = frozenset({"slice", "narrow"})
_PIECES = frozenset({"split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "chunk", "unsafe_chunk",
                     "tensor_split"})
_HELD = frozenset({"select", "unbind"})
LOCAL_BASES = _RANGE | _PIECES | _HELD

Cuts = Mapping[int, tuple[int, int, int, int]]


def _positions(func, x: torch.Tensor, rest: tuple, kwargs: dict, dim: int, size: int) -> list[list[int]]:
    """Per output, the positions along ``dim`` of a tensor of ``size`` there that it takes."""
    if view_base(func) in _HELD:
        index = bound_args(func, (x, *rest), kwargs).get("index")
        return [[index % size]] if index is not None else [[t] for t in range(size)]
    shape = [1] * x.dim()
    shape[dim] = size
    out = func(torch.arange(size).reshape(shape), *rest, **kwargs)
    return [p.flatten().tolist() for p in (out if isinstance(out, (list, tuple)) else [out])]


def _local_slice(dim: int, held: list[int], start: int) -> Callable[[torch.Tensor], torch.Tensor]:
    step = held[1] - held[0] if len(held) > 1 else 1
    first, stop = (held[0] - start, held[-1] - start + 1) if held else (0, 0)
    return lambda x: torch.ops.aten.slice.Tensor(x, dim, first, stop, step)


def localizer(func, args: tuple, kwargs: dict) -> Callable[[Cuts], Callable[..., Any] | None] | None:
    """``OpCase.localize`` for a functional call of an op in ``LOCAL_BASES``, or None."""
    if view_base(func) not in LOCAL_BASES or not args or not isinstance(args[0], torch.Tensor):
        return None
    x, rest = args[0], tuple(args[1:])
    dim = bound_args(func, args, kwargs).get("dim", 0) % max(x.dim(), 1)
    base = view_base(func)

    def localize(cuts: Cuts) -> Callable[..., Any] | None:
        if set(cuts) != {0} or cuts[0][0] != dim:
            return None
        _, start, stop, size = cuts[0]
        positions = _positions(func, x, rest, kwargs, dim, size)
        if base in _RANGE:
            (every,) = positions
            if every == list(range(size)):
                return None  # the whole dim: a plain cut, nothing to re-base
            piece = _local_slice(dim, [p for p in every if start <= p < stop], start)
            return lambda *a, **_: piece(a[0])
        if base in _PIECES:
            sizes = [sum(start <= p < stop for p in piece) for piece in positions]
            return lambda *a, **_: list(torch.ops.aten.split_with_sizes.default(a[0], sizes, dim))

        def held(*a: Any, **_: Any):
            local = a[0]
            zero = torch.zeros(local.shape[:dim] + local.shape[dim + 1:], dtype=local.dtype)
            out = [local.select(dim, t - start) if start <= t < stop else zero for (t,) in positions]
            return out[0] if base == "select" else out

        return held

    return localize


__all__ = ["LOCAL_BASES", "localizer"]
