"""The tensor-ops protocol on torch tensors."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from metaspmd.tensor_ops import BOOL, COMPLEX, FLOAT, INT, OTHER, close, close_tensors


# dtypes whose tensors numpy() gives as they are (to_numpy widens the others), by name
_NUMPY_NAMES = {d: str(d).removeprefix("torch.") for d in (
    torch.float64, torch.float32, torch.complex128, torch.complex64, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}

_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64)


def dtype_kind(d: torch.dtype) -> str:
    if d == torch.bool:
        return BOOL
    if d.is_complex:
        return COMPLEX
    if d.is_floating_point:
        return FLOAT
    return INT if d in _INT_DTYPES else OTHER


class TorchOps:
    """TensorOps for torch.Tensor (CPU)."""

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor)

    def shape(self, x: torch.Tensor) -> tuple[int, ...]:
        return tuple(x.shape)

    def dtype_kind(self, x: torch.Tensor) -> str:
        return dtype_kind(x.dtype)

    def dtype_name(self, x: torch.Tensor) -> str:
        return str(x.dtype).removeprefix("torch.")

    def narrow(self, x, dim, start, length):
        return x.narrow(dim, start, length).clone()

    def concat(self, xs: Sequence[torch.Tensor], dim: int):
        return torch.cat(list(xs), dim)

    def add(self, a, b):
        return torch.logical_or(a, b) if a.dtype == torch.bool else a + b

    def sub(self, a, b):
        return a - b

    def multiply(self, a, b):
        return torch.logical_and(a, b) if a.dtype == torch.bool else a * b

    def maximum(self, a, b):
        return torch.maximum(a, b)

    def logaddexp(self, a, b):
        return torch.logaddexp(a, b)

    def to_numpy(self, x):
        x = x.detach().cpu().resolve_conj().resolve_neg()  # numpy() refuses the lazy bits
        if x._is_zerotensor():  # _efficientzerotensor's: zeros with no storage, which numpy() refuses
            x = torch.zeros(x.shape, dtype=x.dtype)
        if x.is_floating_point() and x.dtype not in (torch.float32, torch.float64):
            x = x.float()  # bfloat16 and float8 kinds have no numpy form; float16 as float32 too
        elif x.is_complex() and x.dtype not in (torch.complex64, torch.complex128):
            x = x.to(torch.complex64)  # complex32
        return x.numpy()

    def from_numpy(self, a, like):
        a = np.asarray(a)  # ascontiguousarray makes a 0-d array 1-d: its shape is put back
        return torch.from_numpy(np.ascontiguousarray(a)).reshape(a.shape).to(like.dtype)

    def bitwise_xor(self, a, b):
        return torch.bitwise_xor(a, b)

    def add_scalar(self, x, amount):
        return x + amount

    def sqrt(self, x):
        return torch.sqrt(x)

    def minimum(self, a, b):
        return torch.minimum(a, b)

    def scale(self, x, factor: float):
        return (x * factor).to(x.dtype)

    def close(self, actual: Any, expected: Any) -> bool:
        if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
            # the explorer compares up to 10^5 pairs per op: plain CPU tensors of one
            # dtype that numpy holds as it is skip close_tensors' checks, which hold for
            # them (both tensors, one dtype kind, neither sparse nor quantized), and
            # to_numpy's steps, which leave them as they are
            name = _NUMPY_NAMES.get(actual.dtype)
            if (name is not None and expected.dtype == actual.dtype and actual.layout == torch.strided
                    and expected.layout == torch.strided):
                if actual.shape != expected.shape:
                    return False
                try:
                    a, e = actual.numpy(), expected.numpy()
                except (RuntimeError, TypeError):  # grad, a conj or neg bit, not on the CPU
                    pass
                else:
                    return close(a, e, name)
        if self.is_tensor(actual) and self.dtype_kind(actual) == OTHER and not self.opaque(actual):
            # bit dtypes have no numpy form
            return self.is_tensor(expected) and actual.dtype == expected.dtype and bool(torch.equal(actual, expected))
        return close_tensors(self, actual, expected)

    def opaque(self, x: Any) -> str:
        if x.is_quantized:
            return "a quantized tensor"
        if x.layout != torch.strided:
            return f"a tensor of layout {str(x.layout).removeprefix('torch.').lstrip('_')}"
        return ""

    def one_nonfinite_value(self, x) -> bool:
        if x.layout != torch.strided or x.numel() == 0 or not (x.dtype.is_floating_point or x.dtype.is_complex):
            return False
        return bool(torch.isnan(x).all()) or bool(torch.isinf(x).all() and (x == x.flatten()[0]).all())

    def zeros_like(self, x):
        return torch.zeros_like(x)

    def random_like(self, x: torch.Tensor, seed: int):
        # laid out as x: kernels pick their code path by layout (MKL's GEMM by which operand
        # is column-major), and a Partial input's summands p and x - p on two paths did not
        # cancel exactly (mm's mat2 on AVX-512), so its Partial rule passed on some CPUs only
        return torch.empty_like(x).copy_(self._random(x, seed))

    def _random(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        if x.dtype == torch.bool:  # vary the density by seed so any/all-like outputs vary too
            return torch.rand(x.shape, generator=g) < (0.1, 0.5, 0.9)[seed % 3]
        if x.dtype.is_floating_point or x.dtype.is_complex:
            return torch.randn(x.shape, generator=g, dtype=x.dtype)
        if x.dtype == torch.uint8:
            return torch.randint(0, 200, x.shape, generator=g, dtype=x.dtype)
        if self.dtype_kind(x) == INT:
            return torch.randint(-100, 100, x.shape, generator=g, dtype=x.dtype)
        return x

    def clone(self, x):
        return x.clone()
