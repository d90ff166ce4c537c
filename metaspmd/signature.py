"""Canonical call signatures: what a rule depends on, as one readable string.

A rule depends on the ranks of the tensor inputs, on which dims are size 1 (broadcast)
or empty, on the dtype kind (float / complex / int / bool), and on the non-tensor
arguments. Exact sizes do not enter, so one entry serves every call of that shape class:

    self:f[*,*] mat2:f[*,*]
    self:f[*,*,*] dim=[-1] keepdim=True
    tensors:[f[*,*],f[*,*],f[*,*]] dim=0

Ops whose rules depend on the sizes themselves (a reshape maps dims by them) are keyed by
their exact sizes instead (``exact_sizes``): ``self:f[5,4,6] size=[20,6]``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .tensor_ops import TensorOps


def tensor_token(ops: TensorOps, x: Any, exact_sizes: bool = False) -> str:
    dims = ",".join("*" if s > 1 and not exact_sizes else str(s) for s in ops.shape(x))
    return f"{ops.dtype_kind(x)}[{dims}]"


def value_token(ops: TensorOps, x: Any, exact_sizes: bool = False) -> str:
    """A stable token for any argument value (tensors included)."""
    if ops.is_tensor(x):
        return tensor_token(ops, x, exact_sizes)
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
        return "[" + ",".join(value_token(ops, y, exact_sizes) for y in x) + "]"
    if isinstance(x, dict):
        return "{" + ",".join(f"{k}:{value_token(ops, x[k], exact_sizes)}" for k in sorted(x)) + "}"
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
              exact_sizes: bool = False) -> str:
    parts = []
    for name, value in arg_items(arg_names, args, kwargs):
        sep = ":" if has_tensor(ops, value) else "="
        parts.append(f"{name}{sep}{value_token(ops, value, exact_sizes)}")
    return " ".join(parts)


def split_signature(sig: str) -> list[tuple[str, str, str]]:
    """``'self:f[*,*] dim=-1'`` -> ``[('self', ':', 'f[*,*]'), ('dim', '=', '-1')]``."""
    out = []
    for token in sig.split(" ") if sig else ():
        name, sep, value = token.partition(":") if ":" in token.split("=", 1)[0] else token.partition("=")
        out.append((name, sep or "=", value))
    return out
