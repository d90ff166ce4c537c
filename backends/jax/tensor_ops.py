"""The tensor-ops protocol on jax.Array (CPU).

Shards and combines go through numpy: every eager jax op would compile once per new
shape, and the explorer makes many shapes. Results come back as jax arrays of the same
dtype, so the op under test always sees jax inputs. Arrays of extended dtypes (PRNG keys)
have no numpy form; they are sliced and joined with lax and compared on their key data.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from metaspmd.tensor_ops import BOOL, COMPLEX, FLOAT, INT, OTHER, close_tensors


def float_bits(x: jax.Array) -> jax.Array:
    """A float array's bits as integers of its width; any other array as it is."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return lax.bitcast_convert_type(x, {8: jnp.int64, 4: jnp.int32, 2: jnp.int16, 1: jnp.int8}[x.dtype.itemsize])
    return x


def _is_extended(x: jax.Array) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.extended)


def kind_of(dtype) -> str:
    """The dtype kind (metaspmd.tensor_ops) of a jax or numpy dtype."""
    if jnp.issubdtype(dtype, jax.dtypes.extended):
        return OTHER
    if dtype == np.bool_:
        return BOOL
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return COMPLEX
    if jnp.issubdtype(dtype, jnp.floating):
        return FLOAT
    if jnp.issubdtype(dtype, jnp.integer):
        return INT
    return OTHER


def _np(x: jax.Array) -> np.ndarray:
    return np.asarray(x)


def _back(a: np.ndarray, like: jax.Array) -> jax.Array:
    # device_put, not jnp.asarray: asarray compiles a conversion for every new shape
    # (about 20 ms each, and every shard of every cut is a new shape)
    return jax.device_put(np.asarray(a, dtype=like.dtype))


class JaxOps:
    """TensorOps for jax.Array."""

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, jax.Array)

    def shape(self, x: jax.Array) -> tuple[int, ...]:
        return tuple(int(s) for s in x.shape)

    def dtype_kind(self, x: jax.Array) -> str:
        return kind_of(x.dtype)

    def dtype_name(self, x: jax.Array) -> str:
        return str(x.dtype)

    def narrow(self, x, dim, start, length):
        if _is_extended(x):
            return lax.slice_in_dim(x, start, start + length, axis=dim)
        index = [slice(None)] * x.ndim
        index[dim] = slice(start, start + length)
        return _back(_np(x)[tuple(index)].copy(), x)

    def concat(self, xs: Sequence[jax.Array], dim: int):
        xs = list(xs)
        if _is_extended(xs[0]):
            return lax.concatenate(xs, dim)
        return _back(np.concatenate([_np(x) for x in xs], axis=dim), xs[0])

    def _binary(self, a, b, f):
        return _back(f(_np(a), _np(b)), a)

    def add(self, a, b):
        return self._binary(a, b, np.logical_or if a.dtype == np.bool_ else np.add)

    def sub(self, a, b):
        return self._binary(a, b, np.subtract)

    def multiply(self, a, b):
        return self._binary(a, b, np.logical_and if a.dtype == np.bool_ else np.multiply)

    def maximum(self, a, b):
        return self._binary(a, b, np.maximum)

    def minimum(self, a, b):
        return self._binary(a, b, np.minimum)

    def scale(self, x, factor: float):
        return _back(_np(x) * factor, x)

    def logaddexp(self, a, b):
        return self._binary(a, b, np.logaddexp)

    def to_numpy(self, x):
        a = _np(x)
        return a.astype(np.float32) if a.dtype.kind == "V" or a.dtype.name in ("bfloat16", "float16") else a

    def from_numpy(self, a, like):
        return _back(a, like)

    def bitwise_xor(self, a, b):
        return self._binary(a, b, np.bitwise_xor)

    def add_scalar(self, x, amount):
        a = _np(x)  # in int64, wrapping back: unsigned positions below zero are out of range too
        return _back((a.astype(np.int64) + amount).astype(a.dtype), x)

    def sqrt(self, x):
        return _back(np.sqrt(_np(x)), x)

    def close(self, actual: Any, expected: Any) -> bool:
        if self.is_tensor(actual) and self.is_tensor(expected) and (_is_extended(actual) or _is_extended(expected)):
            # PRNG keys have no numpy form: compared on their key data
            return (actual.shape == expected.shape and actual.dtype == expected.dtype
                    and bool(np.array_equal(_np(jax.random.key_data(actual)), _np(jax.random.key_data(expected)))))
        return close_tensors(self, actual, expected)

    def opaque(self, x: Any) -> str:
        return ""  # every array here is dense: close() compares it

    def one_nonfinite_value(self, x) -> bool:
        if _is_extended(x) or self.dtype_kind(x) not in (FLOAT, COMPLEX):
            return False
        a = _np(x)
        return a.size > 0 and (bool(np.isnan(a).all()) or bool(np.isinf(a).all() and (a == a.flat[0]).all()))

    def zeros_like(self, x):
        if _is_extended(x):
            return x
        return _back(np.zeros(x.shape, dtype=x.dtype), x)

    def random_like(self, x: jax.Array, seed: int):
        kind = self.dtype_kind(x)
        rng = np.random.default_rng(seed)
        if kind == BOOL:
            return _back(rng.integers(0, 2, x.shape).astype(bool), x)
        if kind == FLOAT:
            return _back(rng.standard_normal(x.shape), x)
        if kind == COMPLEX:
            return _back(rng.standard_normal(x.shape) + 1j * rng.standard_normal(x.shape), x)
        if kind == INT:
            info = np.iinfo(x.dtype)
            lo, hi = (0, 200) if info.min == 0 else (-100, 100)
            return _back(rng.integers(lo, min(hi, int(info.max)), x.shape), x)
        return x

    def clone(self, x):
        if _is_extended(x):
            return x
        return _back(_np(x).copy(), x)
