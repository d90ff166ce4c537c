"""The tensor-ops protocol on TVM runtime tensors.

TVM's runtime tensors carry no arithmetic of their own, so every operation round-trips
through numpy: explorer inputs are small, and this keeps the ops exact and obvious.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tvm

from metaspmd.tensor_ops import BOOL, FLOAT, INT, OTHER, close_tensors

_INT_RANGE = (-100, 100)  # wide enough that shards of an int tensor differ


def to_tvm(a: np.ndarray) -> tvm.runtime.Tensor:
    return tvm.runtime.tensor(np.ascontiguousarray(a))


def dtype_kind_of(name: str) -> str:
    if name == "bool":
        return BOOL
    if name.startswith(("float", "bfloat")):
        return FLOAT
    if name.startswith(("int", "uint")):
        return INT
    return OTHER


class TvmOps:
    """TensorOps for tvm.runtime.Tensor (CPU)."""

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, tvm.runtime.Tensor)

    def shape(self, x: tvm.runtime.Tensor) -> tuple[int, ...]:
        return tuple(int(s) for s in x.shape)

    def dtype_kind(self, x: tvm.runtime.Tensor) -> str:
        return dtype_kind_of(self.dtype_name(x))

    def dtype_name(self, x: tvm.runtime.Tensor) -> str:
        return str(x.dtype)

    def narrow(self, x, dim: int, start: int, length: int):
        index = [slice(None)] * len(x.shape)
        index[dim] = slice(start, start + length)
        return to_tvm(x.numpy()[tuple(index)])

    def concat(self, xs: Sequence[tvm.runtime.Tensor], dim: int):
        return to_tvm(np.concatenate([x.numpy() for x in xs], axis=dim))

    def add(self, a, b):
        x, y = a.numpy(), b.numpy()
        return to_tvm(np.logical_or(x, y) if x.dtype == np.bool_ else x + y)

    def sub(self, a, b):
        return to_tvm(a.numpy() - b.numpy())

    def multiply(self, a, b):
        x, y = a.numpy(), b.numpy()
        return to_tvm(np.logical_and(x, y) if x.dtype == np.bool_ else x * y)

    def maximum(self, a, b):
        return to_tvm(np.maximum(a.numpy(), b.numpy()))

    def minimum(self, a, b):
        return to_tvm(np.minimum(a.numpy(), b.numpy()))

    def scale(self, x, factor: float):
        a = x.numpy()
        return to_tvm((a * factor).astype(a.dtype))

    def logaddexp(self, a, b):
        return to_tvm(np.logaddexp(a.numpy(), b.numpy()))

    def to_numpy(self, x):
        return x.numpy()

    def from_numpy(self, a, like):
        return to_tvm(np.asarray(a, dtype=like.numpy().dtype))

    def bitwise_xor(self, a, b):
        return to_tvm(np.bitwise_xor(a.numpy(), b.numpy()))

    def add_scalar(self, x, amount):
        a = x.numpy()
        return to_tvm((a.astype(np.int64) + amount).astype(a.dtype))

    def sqrt(self, x):
        a = x.numpy()
        return to_tvm(np.sqrt(a).astype(a.dtype))

    def close(self, actual: Any, expected: Any) -> bool:
        return close_tensors(self, actual, expected)

    def opaque(self, x: Any) -> str:
        return ""  # every array here is dense: close() compares it

    def one_nonfinite_value(self, x) -> bool:
        a = x.numpy()
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating)):
            return False
        return a.size > 0 and (bool(np.isnan(a).all()) or bool(np.isinf(a).all() and (a == a.flat[0]).all()))

    def zeros_like(self, x):
        return to_tvm(np.zeros(self.shape(x), dtype=x.numpy().dtype))

    def random_like(self, x, seed: int):
        return to_tvm(random_array(self.shape(x), self.dtype_name(x), np.random.default_rng(seed)))

    def clone(self, x):
        return to_tvm(x.numpy().copy())


def random_array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator, int_range=_INT_RANGE) -> np.ndarray:
    """Signed, non-degenerate values: normal floats, wide-range ints, fair-coin bools."""
    kind = dtype_kind_of(dtype)
    if kind == FLOAT:
        return rng.standard_normal(shape).astype(dtype)
    if kind == INT:
        low, high = int_range
        if dtype.startswith("uint"):
            low = max(low, 0)
        return rng.integers(low, high, size=shape).astype(dtype)
    if kind == BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    raise ValueError(f"no random values for dtype {dtype}")
