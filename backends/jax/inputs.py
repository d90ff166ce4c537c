"""Operand data that can tell combines apart.

Programs feed primitives whatever their tests needed: constants, bool arrays that are all
True, floats that never compare equal, integers too small to survive a shift. Trials built
from such data agree with every combine. ``condition`` replaces what carries no
information with fresh random values, keeps what a contract constrains (indices, group
sizes, pivots), and gives a few primitives data of the kind their semantics need.
"""

from __future__ import annotations

import jax
import numpy as np

from metaspmd.tensor_ops import COMPLEX, FLOAT, INT, OTHER

from .params import group_operands
from .tensor_ops import JaxOps

# Operands whose values the program built to satisfy a contract (in-range indices, group
# sizes that add up, pivots): kept as captured even when they repeat across seeds. (Fresh
# trials draw new valid indices for gather, scatter and dynamic slicing: see indices.py.)
_STRUCTURED = {
    "gather": {"start_indices"}, "dynamic_slice": {"start_indices"}, "dynamic_update_slice": {"start_indices"},
    "select_n": {"which"}, "ragged_dot_general": {"group_sizes"}, "lu_pivots_to_permutation": {"x"},
    "rng_bit_generator": {"key"},
    **{name: {"scatter_indices"} for name in ("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min",
                                              "scatter-max")},
}
# A reduction's init values must be the identity of its computation (jax.lax.reduce: "if
# violated the result is undefined"; XLA returns a lone element and drops the init). They
# are set to that identity where the computation is one known primitive, else keep the
# program's value, and are never cut, refilled or made Partial.
IDENTITY_OPERANDS = {"reduce": frozenset({"init_values"}), "reduce_window": frozenset({"init_values"})}
# Integer operands that are values put into the output, not positions into an operand: the
# halo search may lengthen a dim beside them.
VALUE_OPERANDS = {"pad": frozenset({"padding_value"}), **IDENTITY_OPERANDS}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


def _key_like(x: jax.Array, seed: int) -> jax.Array:
    data = np.asarray(jax.random.key_data(x))
    bits = np.random.default_rng(seed).integers(0, 2**32, data.shape, dtype=np.uint64).astype(data.dtype)
    return jax.random.wrap_key_data(bits, impl=jax.random.key_impl(x))


def _with_ties(operands: list, seed: int) -> list:
    """Equality tests on continuous data are all False: coarsen floats so values repeat."""
    return [jax.numpy.round(x / 2) if JaxOps().dtype_kind(x) == FLOAT else x for x in operands]


def _with_non_finite(operands: list, seed: int) -> list:
    out = []
    for i, x in enumerate(operands):
        if JaxOps().dtype_kind(x) == FLOAT:
            a = np.array(x)
            r = np.random.default_rng(seed * 31 + i).random(a.shape)
            a[r < 0.15], a[(r >= 0.15) & (r < 0.3)] = np.inf, np.nan
            x = jax.numpy.asarray(a)
        out.append(x)
    return out


def _with_zeros(operands: list, seed: int) -> list:
    """A cast to bool is True on every random value: zeros in about half the elements, the
    one value it maps apart (a float 0/1 mask cast to bool; any other cast reads them as
    any value)."""
    out = []
    for i, x in enumerate(operands):
        if JaxOps().dtype_kind(x) in (FLOAT, COMPLEX, INT):
            a = np.array(x)
            a[np.random.default_rng(seed * 31 + i).random(a.shape) < 0.5] = 0
            x = jax.numpy.asarray(a, dtype=x.dtype)
        out.append(x)
    return out


def _random_bit_patterns(operands: list, seed: int) -> list:
    """Small integers bitcast to floats are denormals that compare equal, and shift to zero:
    use every bit."""
    out = []
    for i, x in enumerate(operands):
        if JaxOps().dtype_kind(x) == INT:
            info = np.iinfo(np.dtype(x.dtype))
            r = np.random.default_rng(seed * 31 + i)
            x = jax.numpy.asarray(r.integers(info.min, info.max, x.shape, dtype=np.dtype(x.dtype), endpoint=True))
        out.append(x)
    return out


def _shift_amounts(operands: list, seed: int) -> list:
    """Shifts by at least the bit width give constant results: keep amounts in range."""
    x, y = operands
    bits = np.iinfo(np.dtype(y.dtype)).bits
    x = _random_bit_patterns([x], seed)[0]
    return [x, jax.numpy.asarray(np.abs(np.asarray(y).astype(np.int64)) % bits, dtype=y.dtype)]


_SPECIAL_DATA = {
    "eq": _with_ties, "ne": _with_ties, "eq_to": _with_ties, "is_finite": _with_non_finite,
    "shift_left": _shift_amounts, "shift_right_logical": _shift_amounts, "shift_right_arithmetic": _shift_amounts,
    "bitcast_convert_type": _random_bit_patterns, "convert_element_type": _with_zeros,
}


def condition(prim: str, operands: list, reference: list, seed: int) -> list:
    """Operands fit to tell combines apart. A value that repeats across seeds (a program
    constant) or is constant within itself (bool data that is all True) would make every
    trial alike; it gets fresh random values, unless it is structured data."""
    ops = JaxOps()
    names = [name for name, value in zip(*group_operands(prim, operands))
             for _ in (value if isinstance(value, list) else [value])]
    keep = _STRUCTURED.get(prim, set()) | IDENTITY_OPERANDS.get(prim, set())
    out = []
    for i, (x, ref, name) in enumerate(zip(operands, reference, names)):
        kind = ops.dtype_kind(x)
        if name in keep:
            out.append(x)
        elif kind == OTHER:
            constant = np.array_equal(np.asarray(jax.random.key_data(x)), np.asarray(jax.random.key_data(ref)))
            out.append(_key_like(x, seed * 31 + i) if constant else x)
        else:
            a = np.asarray(x)
            flat = a.size > 1 and _same(a, np.full_like(a, a.flat[0]))
            out.append(ops.random_like(x, seed * 31 + i) if flat or _same(a, np.asarray(ref)) else x)
    return _SPECIAL_DATA.get(prim, lambda xs, seed: xs)(out, seed)


def _identity(name: str, dtype: np.dtype) -> object | None:
    """The identity of the binary primitive ``name`` on ``dtype``, or None."""
    if name == "add" or (name in ("or", "xor") and dtype.kind in "biu"):
        return False if dtype.kind == "b" else 0
    if name == "mul":
        return 1
    if name == "and" and dtype.kind in "biu":
        return True if dtype.kind == "b" else -1 if dtype.kind == "i" else np.iinfo(dtype).max
    if name in ("max", "min"):
        low = name == "max"
        if dtype.kind == "f":
            return -np.inf if low else np.inf
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return info.min if low else info.max
        if dtype.kind == "b":
            return not low
    return None


def with_identity_inits(prim: str, params: dict, operands: list) -> list:
    """``operands`` with a reduction's init values set to the identity of its computation,
    where that is a single known primitive (add, mul, max, min, and, or, xor)."""
    if prim not in IDENTITY_OPERANDS:
        return operands
    eqns = params["jaxpr"].eqns
    if len(eqns) != 1:
        return operands  # a variadic computation (arg-reductions): the program's value stands
    names = [name for name, value in zip(*group_operands(prim, operands))
             for _ in (value if isinstance(value, list) else [value])]
    out = []
    for x, name in zip(operands, names):
        value = _identity(eqns[0].primitive.name, np.dtype(x.dtype)) if name == "init_values" else None
        out.append(jax.numpy.full(x.shape, value, x.dtype) if value is not None else x)
    return out
