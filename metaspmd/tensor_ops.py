"""The tensor-ops protocol: everything the framework-free core needs from a tensor library.

Each backend (torch, jax, tvm) implements it once; the explorer, verifier and combine
functions talk to tensors only through it, so the core never imports a framework.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from . import pytree

# Dtype kinds: the only dtype facts the core reasons about.
FLOAT, COMPLEX, INT, BOOL, OTHER = "f", "c", "i", "b", "o"

# (rtol, atol relative to the largest finite magnitude of the expected value) per dtype
# name; every other floating dtype (float16, bfloat16, float8 kinds, complex32) is low.
TOLERANCES = {
    "float64": (1e-7, 1e-9),
    "complex128": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "complex64": (1e-4, 1e-5),
}
LOW_TOLERANCE = (2e-2, 1e-2)
# Ops (by base name, the same in torch and jax) whose result is a step of one ulp: any
# tolerance passes a combine within it (Partial parts each stepped by their own ulp), so
# the backends compare their outputs as the integers of their bits.
ULP_STEPS = frozenset({"nextafter"})


def compared_as_bits(fn: Callable[..., Any], is_tensor: Callable[[Any], bool], bits: Callable[[Any], Any]) -> Callable[..., Any]:
    """``fn`` with every tensor output ``x`` (``is_tensor``) replaced by ``bits(x)``, the
    integers of a float's bits (a backend's bitcast; other tensors as they are): compared
    exactly, so a combine must rebuild every bit, as gathers and identity do."""
    def as_bits(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return pytree.replace(out, is_tensor, [bits(x) for x in pytree.leaves(out, is_tensor)])

    return as_bits


_INEXACT = ("float", "bfloat", "complex")  # dtype names compared within a tolerance
_MAX = np.maximum.reduce


@functools.lru_cache(maxsize=None)
def largest_finite(dtype: str) -> float | None:
    """The largest finite value of the real floating dtype ``dtype``, or None where neither
    numpy nor ml_dtypes (bfloat16, float8 kinds) knows it."""
    try:
        return float(np.finfo(dtype).max)
    except (TypeError, ValueError):
        pass
    try:
        import ml_dtypes  # numpy's extension dtypes, not a framework

        return float(ml_dtypes.finfo(getattr(ml_dtypes, dtype)).max)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=None)
def largest_integer(dtype: str) -> float | None:
    """The largest value of the integer dtype ``dtype``, or None where numpy does not know it."""
    try:
        return float(np.iinfo(dtype).max)
    except (TypeError, ValueError):
        return None


def close(actual: np.ndarray, expected: np.ndarray, dtype: str, scale: float = 0.0) -> bool:
    """Are two arrays of one shape equal, the soundness test every rule rests on?

    ``dtype`` is ``actual``'s dtype name in its framework (its values may have been widened
    to reach numpy: bfloat16 as float32). Integer and bool values compare exactly; floating
    ones within ``TOLERANCES`` scaled to the largest finite magnitude expected, or to
    ``scale`` where that is larger (the summands a sum was rebuilt from), NaN matching NaN
    at the same position.
    """
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return False
    if not dtype.startswith(_INEXACT):
        return bool(np.array_equal(a, e.astype(a.dtype)))
    if a.size == 0:
        return True
    rtol, atol_rel = TOLERANCES.get(dtype, LOW_TOLERANCE)
    wide = np.complex128 if a.dtype.kind == "c" or e.dtype.kind == "c" else np.float64
    a64, e64 = a.astype(wide, copy=False), e.astype(wide, copy=False)  # read, never written
    size = np.abs(e64)
    # ndarray.max, without its Python wrapper (a frame per call, on up to 10^5 calls per op)
    top = float(_MAX(size, axis=None))
    # A kernel that passes through twice its result (sinh as (e^x - e^-x) / 2) overflows
    # on one code path and not on another: AVX2 lanes give sinh(89) = inf in float32, the
    # scalar tail 2.2e38, so where a shard boundary falls moves the overflow. A value
    # within a factor 2 of the largest finite one equals the infinity of its sign (real
    # dtypes numpy or ml_dtypes know). With no expected value infinite or near it (most
    # calls), nothing is excused: an element that is not near decides.
    largest = None if wide is np.complex128 else largest_finite(dtype)
    edge = math.inf if largest is None else largest / 2
    strict = largest is None or top < edge
    # np.isclose(a64, e64, rtol, atol, equal_nan=True), spelled out: its argument checks
    # cost more than the arithmetic on the small tensors compared here. Where every
    # expected value is finite (the largest magnitude is), its isfinite(e) term holds
    # throughout, its NaN term nowhere, and its a == e term implies the tolerance one.
    if math.isfinite(top):
        atol = atol_rel * max(top, scale, 1e-30)
        # unequal data rarely has its first elements near (Python numbers: their arithmetic
        # gives inf and NaN without numpy's warnings; NaN decides nothing)
        x, y = a64.item(0), e64.item(0)
        if strict and abs(x - y) > atol + rtol * abs(y):
            return False
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a64 - e64)
        # the largest difference decides most other calls alone (NaN, where actual has one,
        # decides none): within atol every element is near; beyond atol plus rtol of the
        # largest magnitude, that element is not
        worst = _MAX(diff, axis=None)
        if worst <= atol:
            return True
        if strict and worst > atol + rtol * top:
            return False
        near = diff <= atol + rtol * size
    else:
        finite = np.isfinite(e64)
        atol = atol_rel * max(scale, float(size[finite].max()) if finite.any() else 0.0, 1e-30)
        with np.errstate(invalid="ignore", over="ignore"):
            near = ((np.abs(a64 - e64) <= atol + rtol * size) & finite | (a64 == e64)
                    | (np.isnan(a64) & np.isnan(e64)))
    if near.all():
        return True
    if strict:
        return False
    far = ~near  # (near | overflow).all(), read where it is not near
    a64, e64 = a64[far], e64[far]
    overflow = ((np.isinf(a64) & (np.abs(e64) >= edge)) | (np.isinf(e64) & (np.abs(a64) >= edge))) & (
        np.sign(a64) == np.sign(e64))
    return bool(overflow.all())


def close_tensors(ops: "TensorOps", actual: Any, expected: Any, scale: float = 0.0) -> bool:
    """``TensorOps.close`` for any backend whose tensors reach numpy: both tensors, of one
    shape and dtype kind, comparable (not ``opaque``), and ``close`` as arrays (``scale``:
    as there)."""
    if not (ops.is_tensor(actual) and ops.is_tensor(expected)):
        return False
    if ops.shape(actual) != ops.shape(expected) or ops.dtype_kind(actual) != ops.dtype_kind(expected):
        return False
    if ops.opaque(actual) or ops.opaque(expected):
        return False
    return close(ops.to_numpy(actual), ops.to_numpy(expected), ops.dtype_name(actual), scale)


@runtime_checkable
class TensorOps(Protocol):
    """Small protocol over one tensor library. Tensors are opaque to the core."""

    def is_tensor(self, x: Any) -> bool:
        """True for a tensor leaf of an op's inputs or outputs."""

    def shape(self, x: Any) -> tuple[int, ...]: ...

    def dtype_kind(self, x: Any) -> str:
        """One of FLOAT, COMPLEX, INT, BOOL, OTHER."""

    def dtype_name(self, x: Any) -> str:
        """The library's own dtype name without prefix, e.g. 'float32', 'int64'."""

    def narrow(self, x: Any, dim: int, start: int, length: int) -> Any:
        """A copy of x[..., start:start+length, ...] along dim."""

    def concat(self, xs: Sequence[Any], dim: int) -> Any: ...

    def add(self, a: Any, b: Any) -> Any: ...

    def sub(self, a: Any, b: Any) -> Any: ...

    def multiply(self, a: Any, b: Any) -> Any: ...

    def maximum(self, a: Any, b: Any) -> Any: ...

    def minimum(self, a: Any, b: Any) -> Any: ...

    def scale(self, x: Any, factor: float) -> Any:
        """x * factor, keeping x's dtype (used for reduce(avg))."""

    def add_scalar(self, x: Any, amount: int) -> Any:
        """x + amount of an integer tensor, keeping its dtype (positions moved into a
        shard's own range, for an index offset)."""

    def sqrt(self, x: Any) -> Any:
        """Elementwise square root of a floating tensor (used for reduce(norm2))."""

    def logaddexp(self, a: Any, b: Any) -> Any:
        """log(exp(a) + exp(b)) of floating tensors, without overflow (used for scan(logsumexp))."""

    def to_numpy(self, x: Any) -> Any:
        """x's values as a numpy array (bfloat16 and half as float32), for combines that
        compare values (argreduce)."""

    def from_numpy(self, a: Any, like: Any) -> Any:
        """The numpy array ``a`` as a tensor of ``like``'s dtype."""

    def bitwise_xor(self, a: Any, b: Any) -> Any:
        """Elementwise exclusive or of integer or bool tensors (used for reduce(xor))."""

    def close(self, actual: Any, expected: Any) -> bool:
        """Same shape and dtype kind, and equal values: ``close_tensors``, the one
        comparison every backend makes (exact for integer and bool tensors; for floating
        tensors a tolerance scaled to the magnitudes involved, NaN matching NaN)."""

    def opaque(self, x: Any) -> str:
        """What keeps ``close`` from comparing x (a quantized tensor, one of a layout the
        backend has no dense values for, a sparse one that breaks its invariants), or '' where
        nothing does: an op whose outputs it cannot compare cannot have a combine verified."""

    def one_nonfinite_value(self, x: Any) -> bool:
        """x has elements and every one is NaN, or every one is the same infinity (never for
        integer and bool tensors). A mix of NaN, +inf and -inf still has a pattern to compare."""

    def zeros_like(self, x: Any) -> Any: ...

    def random_like(self, x: Any, seed: int) -> Any:
        """Fresh signed, non-degenerate random values of x's shape and dtype.

        Floats: standard normal. Integers: signed values from a range wide enough that
        shards differ. Bools: fair coin flips.
        """

    def clone(self, x: Any) -> Any: ...
