"""The tensor-ops protocol on torch tensors."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from metaspmd.tensor_ops import BOOL, COMPLEX, FLOAT, INT, OTHER

# Tolerances per floating dtype: (rtol, atol relative to the largest magnitude involved).
_TOL = {
    torch.float64: (1e-7, 1e-9),
    torch.complex128: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.complex64: (1e-4, 1e-5),
}
_LOW_TOL = (2e-2, 1e-2)  # float16 / bfloat16


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
        x = x.detach().cpu()
        return (x.float() if x.dtype in (torch.bfloat16, torch.float16) else x).numpy()

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
        if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
            return False
        if actual.shape != expected.shape or self.dtype_kind(actual) != self.dtype_kind(expected):
            return False
        if actual.layout != torch.strided or expected.layout != torch.strided or actual.is_quantized or expected.is_quantized:
            return False
        a, e = actual.detach(), expected.detach()
        if not (a.dtype.is_floating_point or a.dtype.is_complex):
            return bool(torch.equal(a, e.to(a.dtype)))
        if a.numel() == 0:
            return True
        rtol, atol_rel = _TOL.get(a.dtype, _LOW_TOL)
        a64 = a.to(torch.complex128 if a.dtype.is_complex else torch.float64)
        e64 = e.to(a64.dtype)
        finite = torch.isfinite(e64)
        scale = float(e64[finite].abs().max()) if bool(finite.any()) else 0.0
        near = torch.isclose(a64, e64, rtol=rtol, atol=atol_rel * max(scale, 1e-30), equal_nan=True)
        if bool(near.all()):
            return True
        if a.dtype.is_complex:
            return False
        # A kernel that passes through twice its result (sinh as (e^x - e^-x) / 2) overflows
        # on one code path and not on another: AVX2 lanes give sinh(89) = inf in float32,
        # the scalar tail 2.2e38, so where a shard boundary falls moves the overflow. A
        # value within a factor 2 of the largest finite one equals the infinity of its sign.
        edge = torch.finfo(a.dtype).max / 2
        overflow = ((torch.isinf(a64) & (e64.abs() >= edge)) | (torch.isinf(e64) & (a64.abs() >= edge))) & (
            torch.sign(a64) == torch.sign(e64))
        return bool((near | overflow).all())

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
