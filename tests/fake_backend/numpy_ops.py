"""TensorOps over numpy arrays: enough for the explorer to run the fake backend's ops.
Test-only; the real backends live under backends/."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from metaspmd.tensor_ops import BOOL, COMPLEX, FLOAT, INT, OTHER, close_tensors


class NumpyOps:
    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def shape(self, x: np.ndarray) -> tuple[int, ...]:
        return tuple(x.shape)

    def dtype_kind(self, x: np.ndarray) -> str:
        return {"f": FLOAT, "c": COMPLEX, "i": INT, "u": INT, "b": BOOL}.get(x.dtype.kind, OTHER)

    def dtype_name(self, x: np.ndarray) -> str:
        return x.dtype.name

    def narrow(self, x, dim, start, length):
        return np.take(x, np.arange(start, start + length), axis=dim)

    def concat(self, xs: Sequence[np.ndarray], dim: int):
        return np.concatenate(list(xs), axis=dim)

    def add(self, a, b):
        return np.logical_or(a, b) if a.dtype == bool else a + b

    def sub(self, a, b):
        return a - b

    def multiply(self, a, b):
        return np.logical_and(a, b) if a.dtype == bool else a * b

    def maximum(self, a, b):
        return np.maximum(a, b)

    def minimum(self, a, b):
        return np.minimum(a, b)

    def scale(self, x, factor: float):
        return (x * factor).astype(x.dtype)

    def logaddexp(self, a, b):
        return np.logaddexp(a, b)

    def to_numpy(self, x):
        return np.asarray(x)

    def from_numpy(self, a, like):
        return np.asarray(a, dtype=like.dtype)

    def bitwise_xor(self, a, b):
        return np.bitwise_xor(a, b)

    def add_scalar(self, x, amount):
        return (x.astype(np.int64) + amount).astype(x.dtype)

    def sqrt(self, x):
        return np.sqrt(x).astype(x.dtype)

    def close(self, actual: Any, expected: Any) -> bool:
        return close_tensors(self, actual, expected)

    def opaque(self, x: Any) -> str:
        return ""  # every array here is dense: close() compares it

    def one_nonfinite_value(self, x) -> bool:
        if x.size == 0 or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.complexfloating)):
            return False
        return bool(np.isnan(x).all()) or bool(np.isinf(x).all() and (x == x.flat[0]).all())

    def zeros_like(self, x):
        return np.zeros_like(x)

    def random_like(self, x: np.ndarray, seed: int):
        rng = np.random.default_rng(seed)
        kind = self.dtype_kind(x)
        if kind == BOOL:
            return rng.integers(0, 2, x.shape).astype(bool)
        if kind == FLOAT:
            return rng.standard_normal(x.shape).astype(x.dtype)
        if kind == INT:
            return rng.integers(-100, 100, x.shape).astype(x.dtype)
        return x.copy()

    def clone(self, x):
        return x.copy()
