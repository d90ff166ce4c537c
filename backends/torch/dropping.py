"""Dropping forms of torch ops that look rows up by position: what a shard runs under an
offset marked drop (``OffsetIn.drop``).

A shard holding rows [a, b) of a table receives the positions less a. Those outside its rows
must read zero, so that the shards' outputs sum to the lookup; the kernels instead raise on
them (``embedding``: "index out of range"). The dropping form looks the valid ones up and
zeroes the others: DTensor's ``_MaskPartial``, here found and verified like any rule.
``gather`` masks element by element (its output has the index's shape). The scatters write
rows by position: a shard of self's rows keeps the writes that land in them, and its output
is its rows of the global one.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import catalog


def _masked(looked_up: torch.Tensor, valid: torch.Tensor, dim: int) -> torch.Tensor:
    """``looked_up`` with the positions ``valid`` marks false zeroed along ``dim``, where
    the positions' own dims sit (embedding: every dim but the last)."""
    shape = [1] * looked_up.dim()
    shape[dim: dim + valid.dim()] = valid.shape
    return torch.where(valid.reshape(shape), looked_up, torch.zeros((), dtype=looked_up.dtype))


def _embedding(runner: Callable[..., Any]) -> Callable[..., Any]:
    def drop(weight, indices, *rest, **kwargs):
        valid = (indices >= 0) & (indices < weight.shape[0])
        return _masked(runner(weight, torch.where(valid, indices, 0), *rest, **kwargs), valid, 0)

    return drop


def _along_dim(runner: Callable[..., Any], elementwise: bool) -> Callable[..., Any]:
    """``index_select`` (the positions take the place of dim ``dim``) or, ``elementwise``,
    ``gather`` (one position per output element)."""
    def drop(self, dim, index, *rest, **kwargs):
        d = dim % self.dim() if self.dim() else 0
        valid = (index >= 0) & (index < (self.shape[d] if self.dim() else 1))
        return _masked(runner(self, dim, torch.where(valid, index, 0), *rest, **kwargs), valid, 0 if elementwise else d)

    return drop


def _index_select(runner: Callable[..., Any]) -> Callable[..., Any]:
    return _along_dim(runner, elementwise=False)


def _gather(runner: Callable[..., Any]) -> Callable[..., Any]:
    return _along_dim(runner, elementwise=True)


def _scatter(runner: Callable[..., Any]) -> Callable[..., Any]:
    """``scatter`` and its kin, ``index_add``/``index_copy``/``index_fill`` (positions along
    ``dim`` to write): positions outside the shard write to one extra slot past its end,
    which is cut off, so each shard takes exactly the writes that land in its rows."""
    def drop(self, dim, index, *rest, **kwargs):
        if not self.dim() or not isinstance(dim, int):  # a 0-d self has no rows; a named dim, no cut
            return runner(self, dim, index, *rest, **kwargs)
        d = dim % self.dim()
        size = self.shape[d]
        spare = torch.zeros([*self.shape[:d], 1, *self.shape[d + 1:]], dtype=self.dtype)
        valid = (index >= 0) & (index < size)
        out = runner(torch.cat([self, spare], d), dim, torch.where(valid, index, size), *rest, **kwargs)
        return out.narrow(d, 0, size)

    return drop


def _renorm_rows(runner: Callable[..., Any]) -> Callable[..., Any]:
    """``embedding_renorm`` (in place, functional, out=): a shard of self's rows renormalizes
    the rows it holds; positions outside them are left out."""
    def drop(self, indices, *rest, **kwargs):
        return runner(self, indices[(indices >= 0) & (indices < self.shape[0])], *rest, **kwargs)

    return drop


_SCATTERS = ("scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_fill")
# Out= overloads too: their runner returns the out tensors it filled.
_FORMS = {
    f"aten.{name}.{overload}": form
    for name, form in (("embedding", _embedding), ("index_select", _index_select), ("gather", _gather))
    for overload in ("default", "out")
} | {f"aten.{name}.{overload}": _renorm_rows
     for name, overload in (("embedding_renorm_", "default"), ("embedding_renorm", "default"), ("embedding_renorm", "out"))}


def dropping_form(func: torch._ops.OpOverload, runner: Callable[..., Any]) -> Callable[..., Any] | None:
    """The dropping form of ``func`` run through ``runner``, or None where it has none."""
    form = _FORMS.get(catalog.op_name(func))
    if form is None and catalog.aten_base(func).rstrip("_") in _SCATTERS:  # in-place and out= too
        form = _scatter
    return form(runner) if form is not None else None


__all__ = ["dropping_form"]
