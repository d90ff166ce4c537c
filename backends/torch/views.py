"""Sharding rules of view-like ops, derived from shape arithmetic.

Shard-and-combine cannot explore ops whose non-tensor arguments spell out sizes (a
local ``view(x, [4, 6])`` fails on a shard), so for these ops the rule is derived: which
input dim lands on which output dim. The derived strategies become ``OpCase.candidates``
and the explorer still verifies each one numerically.

The backward ops of upsampling, ``select`` and ``slice`` are treated the same way: they
take the forward input's sizes as an argument, which a shard rewrites. ``view_as``,
``reshape_as`` and ``expand_as`` read ``other`` for its global shape only (DTensor runs
them as ``view(self, other.shape)``): a shard runs the base op with that size, rewritten
from self's local shape, and other may be placed any way.

Each rule comes with the function a shard runs: the op itself when its arguments do not
depend on sizes (permute, select, split, ...), otherwise a wrapper that rewrites the
size arguments from the local input (view, reshape, expand, as_strided) the way a
runtime would before calling the op on a shard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from metaspmd.reshape import (
    Candidate, cut_candidates, reshape_block_mapping, reshape_candidates, reshape_even_mapping, reshape_mapping,
    reshape_sizes, single_cuts,
)
from metaspmd.spec import Gather, OutputCombine, Reduce, ShardIn

from . import catalog


@dataclass(frozen=True)
class ViewRule:
    """The function a shard runs, and the derived strategies to verify; ``candidates`` is
    None where the explorer searches as usual (``view_as``: other's shape is fixed, and
    which placements of self and other work is found, not derived)."""

    fn: Callable[..., Any]
    candidates: tuple[Candidate, ...] | None
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------- helpers


def bound_args(func, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Argument values by schema name, defaults filled in."""
    out: dict[str, Any] = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _with_arg(func, args: tuple, kwargs: dict, name: str, value: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with argument ``name`` set to ``value``."""
    names = [a.name for a in func._schema.arguments]
    i = names.index(name)
    if i < len(args):
        return args[:i] + (value,) + args[i + 1:], dict(kwargs)
    return args, {**kwargs, name: value}


def _norm(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


def _permutation(func, x: torch.Tensor, args: tuple, kwargs: dict) -> dict[int, int]:
    """Input dim -> output dim of a pure dim permutation, read off a meta tensor with distinct sizes."""
    probe = torch.empty([2 + i for i in range(x.dim())], device="meta")
    out = func(probe, *args[1:], **kwargs)
    sizes = list(out.shape)
    return {d: sizes.index(2 + d) for d in range(x.dim())}


def _reshape_fn(func, size_arg: str, src: tuple[int, ...], dst: tuple[int, ...], mapping: dict[int, int]):
    """Calls the op with the target size recomputed from the local input's sharded dims."""

    def fn(*args, **kwargs):
        x = args[0]
        size = list(dst)
        for d, (local, full) in enumerate(zip(x.shape, src)):
            if local == full:
                continue
            if d not in mapping:
                raise ValueError(f"dim {d} of the input cannot be sharded through this reshape")
            o = mapping[d]
            if dst[o] * local % full:  # a split dim cut unevenly: no whole output rows
                raise ValueError(f"a shard of {local} of dim {d}'s {full} is no whole part of output dim {o}")
            size[o] = dst[o] * local // full
        args, kwargs = _with_arg(func, tuple(args), dict(kwargs), size_arg, size)
        return func(*args, **kwargs)

    return fn


# --------------------------------------------------------------------------- per op


def _reshape(func, x, args, kwargs):
    src, dst = tuple(x.shape), tuple(func(x, *args[1:], **kwargs).shape)
    size_arg = "size" if "size" in bound_args(func, args, kwargs) else "shape"
    return ViewRule(_reshape_fn(func, size_arg, src, dst, reshape_sizes(src, dst)), reshape_candidates(src, dst))


def _resize(func, x, args, kwargs):
    """``resize_`` to as many elements as self holds (the only calls the sweep explores, see
    ``catalog.RESIZING``) restrides its data as contiguous: on contiguous data, a reshape.
    Both the probe and every shard run it on a copy, as the sweep runs in-place ops."""
    rule = _reshape(func, x.clone(), (x.clone(), *args[1:]), kwargs)
    reshape = rule.fn

    def fn(self, *args, **kwargs):
        return reshape(self.clone(), *args, **kwargs)

    return ViewRule(fn, rule.candidates, ("a reshape of contiguous data: the call keeps self's number of elements",))


def _flatten_like(func, x, args, kwargs):
    # flatten/unflatten take dims, not the sizes of the other dims: a shard runs the op as is,
    # but unflatten's explicit sizes pin the dim it splits. A shard gives the first of them
    # that is not 1 as -1: where it is the only one (unflatten(0, [1, 6])) the cut dim maps
    # onto it on any cut; where others follow (unflatten(2, [4, 64])), on even cuts only.
    src, dst = tuple(x.shape), tuple(func(x, *args[1:], **kwargs).shape)
    mapping, blocks, even = reshape_mapping(src, dst), reshape_block_mapping(src, dst), reshape_even_mapping(src, dst)
    b = bound_args(func, args, kwargs)
    if "sizes" not in b:
        return ViewRule(func, cut_candidates(mapping, blocks, src, even))
    dim, sizes = _norm(b["dim"], x.dim()), list(b["sizes"])
    blocks.pop(dim, None)
    free = [k for k, size in enumerate(sizes) if size != 1]
    if not free:
        mapping.pop(dim, None)
        even.pop(dim, None)
        return ViewRule(func, cut_candidates(mapping, blocks, src, even))
    local_sizes = sizes[: free[0]] + [-1] + sizes[free[0] + 1:]

    def fn(*args, **kwargs):
        args, kwargs = _with_arg(func, tuple(args), dict(kwargs), "sizes", local_sizes)
        return func(*args, **kwargs)

    return ViewRule(fn, cut_candidates(mapping, blocks, src, even))


def _permute_like(func, x, args, kwargs):
    return ViewRule(func, single_cuts(_permutation(func, x, args, kwargs), tuple(x.shape)))


def _unsqueeze(func, x, args, kwargs):
    dim = _norm(bound_args(func, args, kwargs)["dim"], x.dim() + 1)
    return ViewRule(func, single_cuts({d: d + (d >= dim) for d in range(x.dim())}, tuple(x.shape)))


def _squeeze(func, x, args, kwargs):
    b = bound_args(func, args, kwargs)
    rank = x.dim()
    if "dim" in b and b["dim"] is not None:
        targets = b["dim"] if isinstance(b["dim"], (list, tuple)) else [b["dim"]]
        targets = {_norm(d, rank) for d in targets}
    else:
        targets = set(range(rank))
    removed = sorted(d for d in targets if x.shape[d] == 1)
    mapping = {d: d - sum(r < d for r in removed) for d in range(rank) if d not in removed}
    # A shard of size 1 must not be squeezed: shards squeeze exactly the globally removed dims.
    # squeeze_ restrides self in place: it runs on a copy, as the sweep runs in-place ops.
    base = catalog.aten_base(func)
    by_dims = getattr(getattr(torch.ops.aten, base), "dims")
    own = (lambda t: t.clone()) if base.endswith("_") else (lambda t: t)

    def fn(*args, **kwargs):
        return by_dims(own(args[0]), removed)

    return ViewRule(fn, single_cuts(mapping, tuple(x.shape)))


def _expand(func, x, args, kwargs):
    size = list(bound_args(func, args, kwargs)["size"])
    off = len(size) - x.dim()
    kept = [d for d in range(x.dim()) if x.shape[d] != 1 and size[d + off] in (-1, x.shape[d])]
    local_size = list(size)
    for d in kept:
        local_size[d + off] = -1  # keep the (local) input size

    def fn(*args, **kwargs):
        args, kwargs = _with_arg(func, tuple(args), dict(kwargs), "size", local_size)
        return func(*args, **kwargs)

    return ViewRule(fn, single_cuts({d: d + off for d in kept}, tuple(x.shape)))


def _sum_to_size(func, x, args, kwargs):
    """Sums the broadcast dims away: a kept dim gathers (its size rewritten to the shard's),
    a summed one reduces by sum."""
    size = list(bound_args(func, args, kwargs)["size"])
    off = x.dim() - len(size)
    kept = {d: d - off for d in range(off, x.dim()) if x.shape[d] != 1 and size[d - off] == x.shape[d]}

    def fn(*args, **kwargs):
        local = list(size)
        for d, o in kept.items():
            local[o] = args[0].shape[d]
        args, kwargs = _with_arg(func, tuple(args), dict(kwargs), "size", local)
        return func(*args, **kwargs)

    summed = tuple(((ShardIn(d),), (OutputCombine((Reduce("sum"),)),))
                   for d in range(x.dim()) if d not in kept and x.shape[d] >= 2)
    return ViewRule(fn, single_cuts(kept, tuple(x.shape)) + summed)


def _index_dim(func, x, args, kwargs, drops: bool):
    """Ops that index one dim (select, slice, narrow, split, unbind): other dims pass through.
    The indexed dim itself is cut with local params (DimLabel.local): each shard takes the
    positions it holds (gathered), or the pieces it holds (select, unbind: summed)."""
    b = bound_args(func, args, kwargs)
    dim = _norm(b.get("dim", 0), x.dim())
    out = func(x, *args[1:], **kwargs)
    n_out = len(out) if isinstance(out, (list, tuple)) else 1
    mapping = {d: d - (drops and d > dim) for d in range(x.dim()) if d != dim}
    combine = Reduce("sum") if drops else Gather(dim)
    local = ((ShardIn(dim, local=True),), (OutputCombine((combine,)),) * n_out) if x.dim() and x.shape[dim] >= 2 else None
    return ViewRule(func, single_cuts(mapping, tuple(x.shape), n_out) + ((local,) if local else ()))


def _split_dim(func, x, args, kwargs, dim: int):
    out = func(x, *args[1:], **kwargs)
    mapping = {d: d for d in range(x.dim()) if d != dim}
    return ViewRule(func, single_cuts(mapping, tuple(x.shape), len(out)))


def _diagonal(func, x, args, kwargs):
    b = bound_args(func, args, kwargs)
    d1, d2 = _norm(b["dim1"], x.dim()), _norm(b["dim2"], x.dim())
    rest = [d for d in range(x.dim()) if d not in (d1, d2)]
    return ViewRule(func, single_cuts({d: i for i, d in enumerate(rest)}, tuple(x.shape)))


def _same_dims(func, x, args, kwargs, keep_last: bool = True):
    dims = range(x.dim() if keep_last else x.dim() - 1)
    return ViewRule(func, single_cuts({d: d for d in dims}, tuple(x.shape)))


def _view_dtype(func, x, args, kwargs):
    dtype = bound_args(func, args, kwargs)["dtype"]
    if torch.empty((), dtype=dtype).element_size() != x.element_size():
        return None
    return _same_dims(func, x, args, kwargs)


def _as_strided(func, x, args, kwargs):
    """as_strided that only reorders (and possibly narrows from 0) the dims of a contiguous input."""
    b = bound_args(func, args, kwargs)
    size, stride = list(b["size"]), list(b["stride"])
    if not x.is_contiguous() or b.get("storage_offset") not in (None, 0) or x.numel() == 0:
        return None
    cstride = x.stride()
    mapping, used = {}, set()
    for o, (s, st) in enumerate(zip(size, stride)):
        if s == 1:
            continue
        match = [d for d in range(x.dim()) if x.shape[d] >= s and cstride[d] == st and x.shape[d] > 1 and d not in used]
        if len(match) != 1:
            return None
        used.add(match[0])
        if s == x.shape[match[0]]:
            mapping[match[0]] = o

    def fn(*args, **kwargs):
        t = args[0]
        local_size, local_stride = list(size), list(stride)
        for d, o in mapping.items():
            local_size[o] = t.shape[d]
        for o in range(len(size)):
            for d in used:
                if stride[o] == cstride[d] and size[o] != 1:
                    local_stride[o] = t.stride(d)
        args, kwargs = _with_arg(func, tuple(args), dict(kwargs), "size", local_size)
        args, kwargs = _with_arg(func, args, kwargs, "stride", local_stride)
        return func(*args, **kwargs)

    return ViewRule(fn, single_cuts(mapping, tuple(x.shape)))


def _sizes_follow_grad(func, x, args, kwargs, size_arg: str, mapping: dict[int, int]) -> ViewRule:
    """Backward ops that take the forward input's sizes (``input_size``): grad_output dim d
    is input dim ``mapping[d]``, so a shard of d rewrites that size from the local
    grad_output, as DTensor does before running the op on a shard."""
    full = list(bound_args(func, args, kwargs)[size_arg])

    def fn(*args, **kwargs):
        size = list(full)
        for d, o in mapping.items():
            size[o] = args[0].shape[d]
        args, kwargs = _with_arg(func, tuple(args), dict(kwargs), size_arg, size)
        return func(*args, **kwargs)

    return ViewRule(fn, single_cuts(mapping, tuple(x.shape)))


def _upsample_backward(func, x, args, kwargs):
    return _sizes_follow_grad(func, x, args, kwargs, "input_size", {0: 0, 1: 1})  # batch and channels


def _select_backward(func, x, args, kwargs):
    b = bound_args(func, args, kwargs)
    dim = _norm(b["dim"], len(b["input_sizes"]))
    return _sizes_follow_grad(func, x, args, kwargs, "input_sizes", {d: d + (d >= dim) for d in range(x.dim())})


def _slice_backward(func, x, args, kwargs):
    b = bound_args(func, args, kwargs)
    dim = _norm(b["dim"], x.dim())
    return _sizes_follow_grad(func, x, args, kwargs, "input_sizes", {d: d for d in range(x.dim()) if d != dim})


_UPSAMPLE_BACKWARD = (
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
    "_upsample_lanczos2d_aa",
)

_SPLIT_DIM = {"hsplit": lambda rank: 1 if rank > 1 else 0, "vsplit": lambda rank: 0, "dsplit": lambda rank: 2}

_BY_BASE: dict[str, Callable] = {
    "view": _reshape, "_unsafe_view": _reshape, "reshape": _reshape, "_reshape_copy": _reshape,
    "resize": _resize, "resize_": _resize,
    "flatten": _flatten_like, "unflatten": _flatten_like,
    "permute": _permute_like, "transpose": _permute_like, "t": _permute_like, "swapaxes": _permute_like,
    "swapdims": _permute_like, "movedim": _permute_like, "moveaxis": _permute_like, "adjoint": _permute_like,
    "numpy_T": _permute_like, "mT": _permute_like,
    "unsqueeze": _unsqueeze, "squeeze": _squeeze, "squeeze_": _squeeze, "expand": _expand, "broadcast_to": _expand,
    "sum_to_size": _sum_to_size,
    "select": lambda f, x, a, k: _index_dim(f, x, a, k, drops=True),
    "unbind": lambda f, x, a, k: _index_dim(f, x, a, k, drops=True),
    "slice": lambda f, x, a, k: _index_dim(f, x, a, k, drops=False),
    "narrow": lambda f, x, a, k: _index_dim(f, x, a, k, drops=False),
    "split": lambda f, x, a, k: _index_dim(f, x, a, k, drops=False),
    "split_with_sizes": lambda f, x, a, k: _index_dim(f, x, a, k, drops=False),
    "unsafe_split": lambda f, x, a, k: _index_dim(f, x, a, k, drops=False),
    "unsafe_split_with_sizes": lambda f, x, a, k: _index_dim(f, x, a, k, drops=False),
    "chunk": lambda f, x, a, k: _index_dim(f, x, a, k, drops=False),
    "unsafe_chunk": lambda f, x, a, k: _index_dim(f, x, a, k, drops=False),
    "tensor_split": lambda f, x, a, k: _index_dim(f, x, a, k, drops=False),
    "diagonal": _diagonal,
    "alias": _same_dims, "detach": _same_dims, "lift_fresh": _same_dims, "view_as_real": _same_dims,
    "view_as_complex": lambda f, x, a, k: _same_dims(f, x, a, k, keep_last=False),
    "as_strided": _as_strided,
    "select_backward": _select_backward, "slice_backward": _slice_backward,
    **{name + "_backward": _upsample_backward for name in _UPSAMPLE_BACKWARD},
}


# op -> the view it runs with other's shape as the size
_SHAPE_OF_OTHER = {"view_as": "view", "reshape_as": "reshape", "expand_as": "expand", "resize_as": "resize",
                   "resize_as_": "resize_"}
SHAPE_OF_OTHER_NOTE = ("{other} is read for its global shape only: a shard runs {base}(self, {other}'s shape) with "
                       "the size rewritten from self's local shape")


def _shape_of_other(func, args: tuple, kwargs: dict) -> ViewRule:
    b = bound_args(func, args, kwargs)
    base_name = _SHAPE_OF_OTHER[view_base(func)]
    base = getattr(torch.ops.aten, base_name).default
    other = "the_template" if "the_template" in b else "other"  # resize_as_ names it so
    size = list(b[other].shape)
    inner = _BY_BASE[base_name](base, b["self"], (b["self"], size), {})

    def fn(self, other):  # other's shard is never read: its global shape is the size
        return inner.fn(self, size)

    return ViewRule(fn, None, (SHAPE_OF_OTHER_NOTE.format(other=other, base=base_name),))


# Handlers whose shards may run the op with arguments rewritten from the local shard (sizes,
# strides, the dims a squeeze removes): a runtime that calls the op on its shards with the
# call's own arguments, as DTensor does for a rule installed with register_sharding, gets
# wrong shapes from a cut input there. Partial and replicated inputs keep their global
# shape, so the call's own arguments are the rewritten ones for them.
_REWRITING = frozenset({_reshape, _resize, _flatten_like, _squeeze, _expand, _sum_to_size, _as_strided, _select_backward,
                        _slice_backward, _upsample_backward})


def _handler(func) -> Callable | None:
    """The function that derives ``func``'s rule from a call, if it is view-like."""
    base = view_base(func)
    if func._overloadname == "dtype" and base == "view":
        return _view_dtype
    if base in _SPLIT_DIM:
        return lambda f, x, a, k: _split_dim(f, x, a, k, _SPLIT_DIM[base](x.dim()))
    return _BY_BASE.get(base)


# Ops that restate an input's sizes as arguments (group norm's N, C and HxW, which the
# kernel checks against the input): a shard takes them from its local input, as DTensor's
# scalar shape adjuster does for native_group_norm. Op -> the input whose sizes they restate:
# N its dim 0, C its dim 1, HxW the product of the rest.
_SIZES_OF_INPUT = {"native_group_norm": "input", "native_group_norm_backward": "input"}


def local_sizes(func, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a call of ``func``) with the sizes ``func`` restates (``_SIZES_OF_INPUT``)
    taken from its local input; ``fn`` itself for every other op. Cuts that the restated
    sizes do not survive (a channel cut through a group) are left for numerics to refuse."""
    source = _SIZES_OF_INPUT.get(catalog.aten_base(func))
    if source is None:
        return fn

    def fn_local(*args, **kwargs):
        x = bound_args(func, args, kwargs)[source]
        for name, size in (("N", x.shape[0]), ("C", x.shape[1]), ("HxW", math.prod(x.shape[2:]))):
            args, kwargs = _with_arg(func, tuple(args), dict(kwargs), name, size)
        return fn(*args, **kwargs)

    return fn_local


def shards_rewrite_call(func) -> bool:
    """May a shard of ``func`` run with arguments other than the call's? (Then its derived
    rules cut inputs only where the runtime rewrites them as ``ViewRule.fn`` or
    ``local_sizes`` does.)"""
    return (view_base(func) in _SHAPE_OF_OTHER or _handler(func) in _REWRITING
            or catalog.aten_base(func) in _SIZES_OF_INPUT)


def view_base(func) -> str:
    """The op's name without the ``_copy`` suffix of functional view variants."""
    base = catalog.aten_base(func)
    return base[: -len("_copy")] if base.endswith("_copy") and base != "_copy" else base


def is_view_like(func) -> bool:
    return view_base(func) in _BY_BASE or view_base(func) in _SPLIT_DIM or view_base(func) in _SHAPE_OF_OTHER


def derive(func, args: tuple, kwargs: dict) -> ViewRule | None:
    """The derived rule for one example call, or None when the op (or this call) has none."""
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    if view_base(func) in _SHAPE_OF_OTHER:
        try:
            return _shape_of_other(func, tuple(args), dict(kwargs))
        except Exception:
            return None
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    if len(tensors) != 1:
        return None
    handler = _handler(func)
    if handler is None:
        return None
    try:
        return handler(func, args[0], tuple(args), dict(kwargs))
    except Exception:
        return None  # an unusual call: let the explorer treat it as an ordinary op


__all__ = ["ViewRule", "derive", "is_view_like", "local_sizes", "shards_rewrite_call", "view_base"]
