"""Local params (DimLabel.local): a primitive's params that name positions along an
operand dim, re-based to one shard of it.

A slice keeps the part of its range the shard holds, a split the part of each piece, an
unstack the pieces the shard holds (zeros for the others), a pad pads only the outer ends
of the outer shards, and a padded window op pads only where the shard's range reaches past
the operand (``padding_of``). The calls are
``backend.PrimitiveCall`` with their params along the cut dim already the shard's
(``rebased``); along the other dims they still follow the operands.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import numpy as np

from .params import flatten_operands


def _rebase_slice(params: dict, d: int, start: int, stop: int, size: int) -> dict | None:
    """The slice's positions along ``d`` that [start, stop) holds, counted from ``start``."""
    first, limit = params["start_indices"][d], params["limit_indices"][d]
    stride = params["strides"][d] if params.get("strides") else 1
    if first == 0 and limit == size and stride == 1:
        return None  # the whole dim: a plain cut, nothing to re-base
    low = first + -(-(max(start, first) - first) // stride) * stride  # first position held
    high = min(stop, limit)
    starts, limits = list(params["start_indices"]), list(params["limit_indices"])
    starts[d], limits[d] = (low - start, high - start) if low < high else (0, 0)
    return {**params, "start_indices": tuple(starts), "limit_indices": tuple(limits)}


def _rebase_split(params: dict, d: int, start: int, stop: int, size: int) -> dict | None:
    """Each piece's part in [start, stop)."""
    if d != params["axis"]:
        return None
    ends = np.cumsum(params["sizes"])
    sizes = tuple(max(0, min(stop, int(e)) - max(start, int(e) - n)) for e, n in zip(ends, params["sizes"]))
    return {**params, "sizes": sizes}


def _rebase_pad(params: dict, d: int, start: int, stop: int, size: int) -> dict | None:
    """Low padding on the first shard only, high on the last; the others end with the
    interior padding that follows their last element (a negative low or high crops)."""
    config = [tuple(c) for c in params["padding_config"]]
    low, high, interior = config[d]
    if not (low or high or interior):
        return None
    config[d] = (low if start == 0 else 0, high if stop == size else interior, interior)
    return {**params, "padding_config": tuple(config)}


_REBASE = {"slice": _rebase_slice, "split": _rebase_split, "pad": _rebase_pad}


def _unstack_held(call, d: int, start: int, stop: int, size: int) -> Callable[..., Any] | None:
    """unstack of a shard of its axis: the pieces it holds, zeros for the others (which the
    shards' sum then ignores)."""
    if d != call.params["axis"]:
        return None

    def held(*args: Any, **_plain_params: Any) -> list:
        (x,) = flatten_operands(args)
        pieces = call.prim.bind(x, **call.params)
        zero = jax.numpy.zeros(pieces[0].shape if pieces else x.shape[:d] + x.shape[d + 1:], x.dtype)
        return [pieces[t - start] if start <= t < stop else zero for t in range(size)]

    return held


# window ops that pad an operand: which operand, its padding param
_PADDED_OPERAND = {"select_and_scatter_add": 1, "select_and_scatter": 0}


def padding_of(call) -> Callable[[int, int], tuple[int, int] | None] | None:
    """``OpCase.padding``: how far a window op reads past each of its operand's dims."""
    operand = _PADDED_OPERAND.get(call.prim.name)
    if operand is None:
        return None

    def padding(leaf: int, dim: int) -> tuple[int, int] | None:
        low, high = call.params["padding"][dim] if leaf == operand else (0, 0)
        return (int(low), int(high)) if low or high else None

    return padding


def _rebase_padding(call, leaf: int, d: int, start: int, stop: int, size: int):
    """A padded window op on the part [start, stop) of its operand's dim ``d`` of ``size``, a
    range that reaches past the dim where the op pads: only that part is padded."""
    (low, high), padding = call.params["padding"][d], [tuple(p) for p in call.params["padding"]]
    if leaf != _PADDED_OPERAND[call.prim.name] or not (-low <= start <= stop <= size + high):
        return None
    padding[d] = (max(0, -start), max(0, stop - size))
    return _as_given(call, dict(call.params, padding=tuple(padding)), leaf, d)


def _as_given(call, params: dict, leaf: int, d: int):
    """The call with ``params`` already fitted to a shard of operand ``leaf``'s dim ``d``:
    bound as they are along it, fitted to the operands along the others."""
    return dataclasses.replace(call, params=params, rebased=(leaf, d))


def localizer(call) -> Callable[[Mapping[int, tuple[int, int, int, int]]], Callable[..., Any] | None] | None:
    """``OpCase.localize`` for a primitive whose params name positions along an operand dim:
    slice bounds, split sizes, unstack pieces and a window op's padding, re-based to a
    shard of the operand."""
    name = call.prim.name
    if name not in _REBASE and name not in _PADDED_OPERAND and name != "unstack":
        return None

    def localize(cuts: Mapping[int, tuple[int, int, int, int]]) -> Callable[..., Any] | None:
        if name in _PADDED_OPERAND and len(cuts) == 1:
            ((leaf, cut),) = cuts.items()
            return _rebase_padding(call, leaf, *cut)
        if set(cuts) != {0}:
            return None
        d, start, stop, size = cuts[0]
        if name == "unstack":
            return _unstack_held(call, d, start, stop, size)
        params = _REBASE[name](dict(call.params), d, start, stop, size)
        return None if params is None else _as_given(call, params, 0, d)

    return localize


__all__ = ["localizer", "padding_of"]
