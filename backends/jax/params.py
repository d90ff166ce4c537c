"""Primitive params as explorer arguments: plain values for signatures and examples, and
the same params recomputed for shard shapes.

The explorer calls an op on shards with the example's non-tensor arguments unchanged.
Most params stay valid on smaller inputs (axes, dimension numbers, windows), but a few
embed the global shape (broadcast_in_dim's ``shape``, reshape's ``new_sizes``, full-range
slice sizes); ``for_shards`` rewrites those from the local input shapes so that shard
rules such as "a broadcast operand dim gathers along its output dim" can be found.
"""

from __future__ import annotations

import enum
import math
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from jax._src import core

from metaspmd.reshape import reshape_groups
from metaspmd.signature import ALL_DIMS, span

# Params that never change a sharding rule: kept out of signatures and examples. (The
# accumulation type changes the output dtype, not how shards combine.)
NOT_IN_SIGNATURE = frozenset({"accuracy", "precision", "out_sharding", "sharding", "preferred_element_type"})

Shapes = Sequence[tuple[int, ...]]


# --------------------------------------------------------------------------- plain values


def _jaxpr_text(j: Any) -> str:
    """A short, stable name for a computation param: its primitives in order."""
    inner = j.jaxpr if isinstance(j, core.ClosedJaxpr) else j
    return "{" + ",".join(e.primitive.name for e in inner.eqns) + "}"


def plain(value: Any) -> Any:
    """A YAML-safe, deterministic stand-in for one param value (None for callables)."""
    if isinstance(value, enum.Enum):  # before int: IntEnum values are ints too
        return f"{type(value).__name__}.{value.name}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return str(np.dtype(value))
    if isinstance(value, (core.Jaxpr, core.ClosedJaxpr)):
        return _jaxpr_text(value)
    if isinstance(value, core.Primitive):
        return value.name
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # dimension-number records
        return str(value).replace(" ", "")
    if isinstance(value, (tuple, list)):
        return tuple(plain(v) for v in value)
    if hasattr(value, "platform") and hasattr(value, "id"):  # a jax Device
        return str(value.platform)
    if isinstance(value, type):
        return value.__name__
    if callable(value):
        return None
    return str(value).replace(" ", "")


# Params that spell out sizes a primitive's rules do not depend on, beyond which are 1: a
# broadcast's output shape (an operand dim gathers along the output dim it lands on whatever
# its length, and the dims the broadcast adds are copies no input cut reaches), and the new
# sizes of a reshape that only inserts or removes dims of 1 (each dim of 2 or more keeps
# its place among the others: expand_dims, squeeze). Signatures write them as a tensor's
# dims are written, ``*`` for 2 or more (``size_pattern``), so that one table entry serves
# every model's sizes. A reshape that merges or splits dims keeps its sizes: they decide
# its rules (exact_sizes).
SIZE_PATTERN_PARAMS = {"broadcast_in_dim": "shape", "reshape": "new_sizes"}


def size_pattern(sizes: Sequence[int]) -> str:
    """``(8, 16, 1)`` -> ``'[*,*,1]'``: sizes of 0 and 1 as they are, the others as ``*``."""
    return "[" + ",".join(str(n) if n in (0, 1) else "*" for n in sizes) + "]"


def _patterned(prim: str, params: Mapping[str, Any], shapes: Shapes) -> str | None:
    """The param of ``prim`` its signature writes as a size pattern at these operand
    shapes, or None."""
    if prim == "reshape" and (params.get("dimensions") is not None or len(shapes) != 1
                              or [n for n in shapes[0] if n != 1] != [n for n in params["new_sizes"] if n != 1]):
        return None
    return SIZE_PATTERN_PARAMS.get(prim)


def signature_params(prim: str, params: Mapping[str, Any], shapes: Shapes) -> dict[str, Any]:
    """The params a rule of ``prim`` can depend on, as plain values, under the primitive's
    own names; ``shapes``: its operands' (SIZE_PATTERN_PARAMS as size patterns where the
    rules do not depend on the sizes)."""
    out = {}
    patterned = _patterned(prim, params, shapes)
    for name in sorted(params):
        if name in NOT_IN_SIGNATURE:
            continue
        if name == patterned:
            out[name] = size_pattern(params[name])
            continue
        value = plain(params[name])
        if value is None and params[name] is not None:  # a callable: described by its jaxpr twin
            continue
        out[name] = value
    return out


def generalizes(prim: str, params: Mapping[str, Any], shapes: Shapes) -> bool:
    """Does a call's signature hold at other sizes, or does it name a model's own (a
    reshape that merges or splits dims, an iota's shape, a split's sizes, a slice's
    bounds)? A signature of the latter kind matches no other model."""
    return prim not in SIZED_PRIMITIVES or _patterned(prim, params, shapes) is not None


# The slicing primitives' operand and the param that sizes its slice, per dim.
_SPANNING = {"slice": "x", "dynamic_slice": "operand", "gather": "operand"}


def _ints(value: Any) -> tuple[int, ...]:
    """A tuple of ints from a raw param or its signature_params text ('(1,2,10)')."""
    if isinstance(value, str):
        return tuple(int(v) for v in re.findall(r"-?\d+", value))
    return tuple(int(v) for v in value)


def spanning_dims(prim: str, params: Mapping[str, Any], shape: Sequence[int]) -> list[int]:
    """The operand dims of 2 or more that a slicing primitive takes whole: its shards take
    their own length there (``for_shards``), which is the global slice only while the
    slice spans the dim, so those sizes key its rules."""
    if prim == "slice":
        starts, limits = _ints(params["start_indices"]), _ints(params["limit_indices"])
        return [d for d, (s, lim, n) in enumerate(zip(starts, limits, shape)) if n >= 2 and s == 0 and lim == n]
    sizes = _ints(params["slice_sizes"])
    return [d for d, (k, n) in enumerate(zip(sizes, shape)) if n >= 2 and k == n]


def first_shape(args: Sequence[Any]) -> tuple[int, ...] | None:
    """The first operand's shape (an array's or an aval's), for ``exact_sizes``."""
    return tuple(int(n) for n in args[0].shape) if args and hasattr(args[0], "shape") else None


def exact_sizes(prim: str, params: Mapping[str, Any], operand: Sequence[int] | None = None) -> dict[str, slice]:
    """The operand dims whose sizes key the primitive's rules (OpCase.exact_sizes): every
    dim of a reshape's operand, which maps dims by their sizes (new_sizes [6, 4] merges dims
    0 and 1 of [2, 3, 4] and splits dim 0 of [4, 3, 2]), unless it only inserts or removes
    dims of 1 (its new sizes then a pattern, as signature_params writes them); a
    convolution kernel's spatial extent, which sets its halo: rhs_spec's dims after the two
    feature dims; the dims a slice, dynamic slice or gather of an ``operand`` of that shape
    takes whole (``spanning_dims``: a slice of 10 of a dim of 10 is the whole dim, of a dim
    of 20 is not). ``params``: raw or as signature_params gives them (a reshape's: as it
    gives them)."""
    if prim == "reshape":  # not where its sizes are written as a pattern (signature_params)
        return {} if isinstance(params.get("new_sizes"), str) else {"x": ALL_DIMS}
    if prim in _SPANNING:
        if operand is None:
            raise ValueError(f"jax.{prim}: the operand's shape keys its rules; none given")
        pinned = span(spanning_dims(prim, params, operand))
        return {_SPANNING[prim]: pinned} if pinned else {}
    if prim != "conv_general_dilated":
        return {}
    numbers = params.get("dimension_numbers")
    if hasattr(numbers, "rhs_spec"):
        rhs = tuple(numbers.rhs_spec)
    else:
        found = re.search(r"rhs_spec=\(([\d,]*)\)", str(numbers))
        if found is None:
            raise ValueError(f"jax.{prim}: no rhs_spec in dimension_numbers {numbers!r}")
        rhs = tuple(int(d) for d in found.group(1).split(",") if d)
    spatial = span(rhs[2:])
    return {"rhs": spatial} if spatial else {}


# --------------------------------------------------------------------------- operand names

# Names of a primitive's operands, after the jax.lax function that binds it. A name ending
# in '*' takes a list of operands; its length comes from _VARIADIC_COUNT or the rest.
_OPERANDS: dict[str, tuple[str, ...]] = {
    "dot_general": ("lhs", "rhs"),
    "ragged_dot_general": ("lhs", "rhs", "group_sizes"),
    "conv_general_dilated": ("lhs", "rhs"),
    "gather": ("operand", "start_indices"),
    "dynamic_slice": ("operand", "start_indices*"),
    "dynamic_update_slice": ("operand", "update", "start_indices*"),
    "pad": ("operand", "padding_value"),
    "clamp": ("min", "x", "max"),
    "select_n": ("which", "cases*"),
    "concatenate": ("operands*",),
    "sort": ("operands*",),
    "reduce": ("operands*", "init_values*"),
    "reduce_window": ("operands*", "init_values*"),
    "select_and_gather_add": ("tangents", "operand"),
    "select_and_scatter_add": ("source", "operand"),
    "triangular_solve": ("a", "b"),
    "tridiagonal_solve": ("dl", "d", "du", "b"),
    "cholesky_update": ("r", "w"),
    "householder_product": ("a", "taus"),
    "ormqr": ("a", "taus", "c"),
    "random_gamma": ("key", "a"),
    "rng_bit_generator": ("key",),
    "threefry2x32": ("key1", "key2", "x1", "x2"),
    "igamma": ("a", "x"),
    "igammac": ("a", "x"),
    "igamma_grad_a": ("a", "x"),
    "regularized_incomplete_beta": ("a", "b", "x"),
    "polygamma": ("m", "x"),
    "zeta": ("x", "q"),
    "complex": ("x", "y"),
    "atan2": ("x", "y"),
    "nextafter": ("x1", "x2"),
    "stack": ("operands*",),
}
_SCATTERS = ("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max")
for _name in _SCATTERS:
    _OPERANDS[_name] = ("operand", "scatter_indices", "updates")


def _variadic_count(prim: str, n: int) -> int:
    if prim in ("reduce", "reduce_window"):
        return n // 2
    return -1  # the rest


def operand_names(prim: str, n: int) -> tuple[tuple[str, bool], ...]:
    """(name, takes a list) per argument of the explorer's call, for ``n`` operands."""
    names = _OPERANDS.get(prim)
    if names is None:
        if n == 1:
            names = ("x",)
        elif n == 2:
            names = ("x", "y")
        else:
            names = ("operands*",)
    return tuple((name.rstrip("*"), name.endswith("*")) for name in names)


def group_operands(prim: str, operands: Sequence[Any]) -> tuple[tuple[str, ...], tuple]:
    """Arrange flat operands as the explorer's positional args: (arg_names, args)."""
    layout = operand_names(prim, len(operands))
    names, args, i = [], [], 0
    for k, (name, is_list) in enumerate(layout):
        if is_list:
            count = _variadic_count(prim, len(operands))
            if count < 0:
                count = len(operands) - i - sum(1 for _, lst in layout[k + 1 :] if not lst)
            args.append(list(operands[i : i + count]))
            i += count
        else:
            if i >= len(operands):
                break
            args.append(operands[i])
            i += 1
        names.append(name)
    if i != len(operands):
        raise ValueError(f"{prim}: operand layout {layout} does not fit {len(operands)} operands")
    return tuple(names), tuple(args)


def flatten_operands(args: Sequence[Any]) -> list[Any]:
    out = []
    for a in args:
        out.extend(a if isinstance(a, list) else [a])
    return out


# --------------------------------------------------------------------------- shard shapes


def _changed(global_shapes: Shapes, local_shapes: Shapes) -> bool:
    return any(tuple(g) != tuple(l) for g, l in zip(global_shapes, local_shapes))


def _broadcast_in_dim(params, g: Shapes, l: Shapes):
    shape = list(params["shape"])
    for i, d in enumerate(params["broadcast_dimensions"]):
        if g[0][i] == shape[d]:  # not a size-1 broadcast: the output dim follows the input
            shape[d] = l[0][i]
    return {**params, "shape": tuple(shape)}


def _reshape(params, g: Shapes, l: Shapes):
    if params.get("dimensions") is not None:
        return params
    new = list(params["new_sizes"])
    for gi, gj in reshape_groups(g[0], new):
        local = math.prod(l[0][d] for d in gi)
        if local == math.prod(g[0][d] for d in gi):
            continue
        major = next((d for d in gj if new[d] != 1), None)
        rest = math.prod(new[d] for d in gj if d != major)
        if major is None or local % rest:
            raise ValueError("this shard does not reshape to whole output rows")
        new[major] = local // rest
    return {**params, "new_sizes": tuple(new)}


def _full_range(sizes: Sequence[int], g: tuple[int, ...], l: tuple[int, ...]) -> tuple[int, ...]:
    """Sizes that span a whole global dim follow the local dim."""
    return tuple(ll if s == gg else s for s, gg, ll in zip(sizes, g, l))


def _slice(params, g: Shapes, l: Shapes):
    starts, limits = params["start_indices"], params["limit_indices"]
    new = tuple(ll if (s == 0 and lim == gg) else lim for s, lim, gg, ll in zip(starts, limits, g[0], l[0]))
    return {**params, "limit_indices": new}


def _dynamic_slice(params, g: Shapes, l: Shapes):
    return {**params, "slice_sizes": _full_range(params["slice_sizes"], g[0], l[0])}


def _gather(params, g: Shapes, l: Shapes):
    return {**params, "slice_sizes": _full_range(params["slice_sizes"], g[0], l[0])}


_ADAPT: dict[str, Callable[[dict, Shapes, Shapes], dict]] = {
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "slice": _slice,
    "dynamic_slice": _dynamic_slice,
    "gather": _gather,
}

SHAPE_PARAMS = frozenset(_ADAPT)  # primitives whose params follow the shard shapes
SIZED_PRIMITIVES = SHAPE_PARAMS | {"iota", "split"}  # and those whose params name sizes too


def _geqp3_shapes(shapes: Shapes) -> bool:
    a, jpvt = shapes
    return tuple(jpvt) == tuple(a[:-2]) + (a[-1],)


def _ormqr_shapes(shapes: Shapes) -> bool:
    a, taus, c = shapes
    return tuple(taus[:-1]) == tuple(a[:-2]) and taus[-1] <= min(a[-2:]) and tuple(c[:-2]) == tuple(a[:-2])


# LAPACK-backed primitives whose abstract evaluation lets inconsistent operand shapes
# through: geqp3 then corrupts the heap, ormqr prints a LAPACK error. Shards that break
# these relations are refused before the call.
_SHAPE_GUARDS: dict[str, Callable[[Shapes], bool]] = {"geqp3": _geqp3_shapes, "ormqr": _ormqr_shapes}


def check_shapes(prim: str, shapes: Shapes) -> None:
    guard = _SHAPE_GUARDS.get(prim)
    if guard is not None and not guard(shapes):
        raise ValueError(f"{prim}: inconsistent operand shapes {list(map(tuple, shapes))}")


def for_shards(prim: str, params: Mapping[str, Any], global_shapes: Shapes, local_shapes: Shapes) -> dict:
    """``params`` rewritten for inputs of ``local_shapes`` (unchanged on the global shapes)."""
    params = dict(params)
    if prim in _ADAPT and _changed(global_shapes, local_shapes):
        return _ADAPT[prim](params, global_shapes, local_shapes)
    return params
