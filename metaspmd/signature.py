"""Canonical call signatures: what a rule depends on, as one readable string.

A rule depends on the ranks of the tensor inputs, on which dims are size 1 (broadcast)
or empty, on the dtype kind (float / complex / int / bool), and on the non-tensor
arguments. Exact sizes do not enter, so one entry serves every call of that shape class:

    self:f[*,*] mat2:f[*,*]
    self:f[*,*,*] dim=[-1] keepdim=True
    tensors:[f[*,*],f[*,*],f[*,*]] dim=0

Ops whose rules depend on some sizes themselves are keyed by those exact sizes
(``exact_sizes``: an argument name -> a slice of its dims): a reshape maps dims by all of
them, ``self:f[5,4,6] size=[20,6]``; a convolution's halo is its kernel's extent,
``weight:f[*,*,3,3]``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from .tensor_ops import TensorOps

# Every dim of an argument keyed by its exact size (a reshape's).
ALL_DIMS = slice(None)


def span(dims: Sequence[int]) -> slice | None:
    """The slice from the first to the last of ``dims`` (None for none): an argument's
    exact-size dims as one slice; a dim between them pinned too only makes the key coarser."""
    return slice(min(dims), max(dims) + 1) if dims else None


def pinned_dims(exact: slice | None, rank: int) -> range:
    """The dims of a rank-``rank`` tensor that ``exact`` (a slice of its dims) pins."""
    return range(rank)[exact] if exact is not None else range(0)


def tensor_token(ops: TensorOps, x: Any, exact: slice | None = None) -> str:
    shape = ops.shape(x)
    pinned = pinned_dims(exact, len(shape))
    dims = ",".join("*" if s > 1 and d not in pinned else str(s) for d, s in enumerate(shape))
    return f"{ops.dtype_kind(x)}[{dims}]"


def value_token(ops: TensorOps, x: Any, exact: slice | None = None) -> str:
    """A stable token for any argument value (tensors included); ``exact``: the dims of its
    tensors written with their sizes."""
    if ops.is_tensor(x):
        return tensor_token(ops, x, exact)
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return repr(x)
    if isinstance(x, complex):
        return repr(x)
    if isinstance(x, str):
        return repr(x)
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(value_token(ops, y, exact) for y in x) + "]"
    if isinstance(x, dict):
        return "{" + ",".join(f"{k}:{value_token(ops, x[k], exact)}" for k in sorted(x)) + "}"
    # dtypes, layouts, memory formats, enums: their own string form, without spaces
    return str(x).replace(" ", "")


def has_tensor(ops: TensorOps, x: Any) -> bool:
    if ops.is_tensor(x):
        return True
    if isinstance(x, (list, tuple)):
        return any(has_tensor(ops, y) for y in x)
    return False


def arg_items(arg_names: tuple[str, ...], args: tuple, kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Name every argument: positional ones by schema name (or argN), then keywords sorted."""
    items = [(arg_names[i] if i < len(arg_names) else f"arg{i}", a) for i, a in enumerate(args)]
    items += [(k, kwargs[k]) for k in sorted(kwargs)]
    return items


def signature(ops: TensorOps, arg_names: tuple[str, ...], args: tuple, kwargs: Mapping[str, Any],
              exact_sizes: Mapping[str, slice] | None = None) -> str:
    """``exact_sizes``: argument name -> the slice of its dims whose sizes key the rules."""
    exact_sizes = exact_sizes or {}
    parts = []
    for name, value in arg_items(arg_names, args, kwargs):
        sep = ":" if has_tensor(ops, value) else "="
        parts.append(f"{name}{sep}{value_token(ops, value, exact_sizes.get(name))}")
    return " ".join(parts)


def split_signature(sig: str) -> list[tuple[str, str, str]]:
    """``'self:f[*,*] dim=-1'`` -> ``[('self', ':', 'f[*,*]'), ('dim', '=', '-1')]``."""
    out = []
    for token in sig.split(" ") if sig else ():
        name, sep, value = token.partition(":") if ":" in token.split("=", 1)[0] else token.partition("=")
        out.append((name, sep or "=", value))
    return out
