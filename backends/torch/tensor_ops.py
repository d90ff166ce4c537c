"""The tensor-ops protocol on torch tensors."""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np
import torch

from metaspmd.tensor_ops import BOOL, COMPLEX, FLOAT, INT, OTHER, close, close_tensors


# dtypes whose tensors numpy() gives as they are (to_numpy widens the others), by name
_NUMPY_NAMES = {d: str(d).removeprefix("torch.") for d in (
    torch.float64, torch.float32, torch.complex128, torch.complex64, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}

# Sparse layouts whose tensors are compared and combined through their dense values
_SPARSE = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
_BLOCKED = (torch.sparse_bsr, torch.sparse_bsc)
_STRIDED = torch.strided
# float8 kinds: CPU kernels convert and copy them (and _scaled_mm multiplies them) but do no
# arithmetic or random draws in them; TorchOps computes in float32 and rounds back
FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                             "float8_e8m0fnu") if hasattr(torch, n))

_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64)


def dtype_kind(d: torch.dtype) -> str:
    if d == torch.bool:
        return BOOL
    if d.is_complex:
        return COMPLEX
    if d.is_floating_point:
        return FLOAT
    return INT if d in _INT_DTYPES else OTHER


def is_sparse(x: Any) -> bool:
    """A tensor of a sparse layout (COO or compressed)."""
    return isinstance(x, torch.Tensor) and x.layout in _SPARSE


def invalid_sparse(x: torch.Tensor) -> str:
    """Why the sparse tensor ``x`` breaks its layout's invariants (indices out of range,
    compressed indices out of order), or '' where it holds them. An unchecked constructor
    (``_sparse_csr_tensor_unsafe``) given a cut of its indices makes such a tensor, whose
    ``to_dense`` reads out of bounds."""
    try:
        if x.layout == torch.sparse_coo:
            torch._validate_sparse_coo_tensor_args(x._indices(), x._values(), x.shape)
        else:
            row_major = x.layout in (torch.sparse_csr, torch.sparse_bsr)
            compressed, plain = (x.crow_indices(), x.col_indices()) if row_major else (x.ccol_indices(), x.row_indices())
            torch._validate_sparse_compressed_tensor_args(compressed, plain, x.values(), x.shape, x.layout)
    except (RuntimeError, ValueError, IndexError) as e:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ""


def _dense(x: torch.Tensor) -> torch.Tensor:
    """A sparse tensor's dense values (a strided tensor as it is); ValueError for a sparse
    tensor that breaks its invariants."""
    if x.layout not in _SPARSE:
        return x
    why = invalid_sparse(x)
    if why:
        raise ValueError(f"an invalid {_layout_name(x)} tensor: {why}")
    return x.to_dense()


def _layout_name(x: torch.Tensor) -> str:
    return str(x.layout).removeprefix("torch.").lstrip("_")


def _structure(x: torch.Tensor) -> tuple:
    """What a sparse tensor's layout fixes besides its values: layout, sparse and dense dims
    and, blocked, the block size."""
    if x.layout not in _SPARSE:
        return (x.layout,)
    return (x.layout, x.sparse_dim(), x.dense_dim(), _blocksize(x))


def _blocksize(x: torch.Tensor) -> tuple[int, ...] | None:
    if x.layout not in _BLOCKED:
        return None
    batch = x.dim() - x.sparse_dim() - x.dense_dim()
    return tuple(x.values().shape[batch + 1:batch + 3])  # values: (*batch, nnz, *block, *dense)


def _like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The dense ``value`` in ``like``'s sparse layout (sparse and dense dims, block size)."""
    if like.layout == torch.sparse_coo:
        return value.to_sparse(like.sparse_dim())
    return value.to_sparse(layout=like.layout, blocksize=_blocksize(like), dense_dim=like.dense_dim())


def _dense_op(f):
    """Method ``f`` on tensors computed through a sparse operand's dense values, its result
    given back in that operand's layout: a combine rebuilds a sparse output (gathers its
    local outputs, sums them) as the values it stands for, and the result keeps the layout
    the op gives, so a combined value compares with the op's own output layout for layout.
    Float8 operands are computed in float32 and the result rounded back to their dtype."""
    @functools.wraps(f)
    def wrapped(self, x, *rest):
        # the explorer calls these ~10^5 times per op on strided tensors: checked first, cheaply
        other = rest[0] if rest and isinstance(rest[0], torch.Tensor) else None
        if x.layout is _STRIDED and x.dtype not in FLOAT8 and (
                other is None or (other.layout is _STRIDED and other.dtype not in FLOAT8)):
            return f(self, x, *rest)
        float8 = x.dtype if x.dtype in FLOAT8 else other.dtype if other is not None and other.dtype in FLOAT8 else None
        if float8 is not None:
            wide = [y.float() if isinstance(y, torch.Tensor) and y.dtype in FLOAT8 else y for y in (x, *rest)]
            return wrapped(self, *wide).to(float8)
        sparse = x if x.layout in _SPARSE else other if other is not None and other.layout in _SPARSE else None
        if sparse is None:  # another layout (mkldnn): as torch gives it
            return f(self, x, *rest)
        return _like(f(self, _dense(x), *(_dense(y) if isinstance(y, torch.Tensor) else y for y in rest)), sparse)
    return wrapped


class TorchOps:
    """TensorOps for torch.Tensor (CPU). Sparse COO and compressed tensors take part through
    their dense values (``to_dense``): the explorer verifies a sparse output's combines on
    its values and layout, and its arithmetic keeps the layout (``_dense_op``)."""

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor)

    def shape(self, x: torch.Tensor) -> tuple[int, ...]:
        return tuple(x.shape)

    def dtype_kind(self, x: torch.Tensor) -> str:
        return dtype_kind(x.dtype)

    def dtype_name(self, x: torch.Tensor) -> str:
        return str(x.dtype).removeprefix("torch.")

    @_dense_op
    def narrow(self, x, dim, start, length):
        if x.is_contiguous() and not (x.is_quantized or x.is_conj() or x.is_neg()):
            return x.narrow_copy(dim, start, length)  # one call; contiguous, as the clone would be
        return x.narrow(dim, start, length).clone()  # keeps a permuted layout where it can

    def concat(self, xs: Sequence[torch.Tensor], dim: int):
        for x in xs:  # a loop, not a generator: most calls join two to four strided shards
            if x.layout in _SPARSE:
                return _like(torch.cat([_dense(y) for y in xs], dim), x)
        return torch.cat(list(xs), dim)

    @_dense_op
    def add(self, a, b):
        return torch.logical_or(a, b) if a.dtype == torch.bool else a + b

    @_dense_op
    def sub(self, a, b):
        return a - b

    @_dense_op
    def multiply(self, a, b):
        return torch.logical_and(a, b) if a.dtype == torch.bool else a * b

    @_dense_op
    def maximum(self, a, b):
        return torch.maximum(a, b)

    @_dense_op
    def logaddexp(self, a, b):
        return torch.logaddexp(a, b)

    def to_numpy(self, x):
        x = _dense(x.detach()).cpu().resolve_conj().resolve_neg()  # numpy() refuses the lazy bits
        if x._is_zerotensor():  # _efficientzerotensor's: zeros with no storage, which numpy() refuses
            x = torch.zeros(x.shape, dtype=x.dtype)
        if x.is_floating_point() and x.dtype not in (torch.float32, torch.float64):
            x = x.float()  # bfloat16 and float8 kinds have no numpy form; float16 as float32 too
        elif x.is_complex() and x.dtype not in (torch.complex64, torch.complex128):
            x = x.to(torch.complex64)  # complex32
        return x.numpy()

    def from_numpy(self, a, like):
        a = np.asarray(a)  # ascontiguousarray makes a 0-d array 1-d: its shape is put back
        value = torch.from_numpy(np.ascontiguousarray(a)).reshape(a.shape).to(like.dtype)
        return _like(value, like) if like.layout in _SPARSE else value

    @_dense_op
    def bitwise_xor(self, a, b):
        return torch.bitwise_xor(a, b)

    @_dense_op
    def add_scalar(self, x, amount):
        return x + amount

    @_dense_op
    def sqrt(self, x):
        return torch.sqrt(x)

    @_dense_op
    def minimum(self, a, b):
        return torch.minimum(a, b)

    @_dense_op
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
                if torch.equal(actual, expected):  # most gathers rebuild the exact bits: ~15x cheaper
                    return True
                try:
                    a, e = actual.numpy(), expected.numpy()
                except (RuntimeError, TypeError):  # grad, a conj or neg bit, not on the CPU
                    pass
                else:
                    return close(a, e, name)
        if is_sparse(actual) or is_sparse(expected):
            # through the dense values, once both have one sparse structure
            if not (self.is_tensor(actual) and self.is_tensor(expected)) or _structure(actual) != _structure(expected):
                return False
            if invalid_sparse(actual) or invalid_sparse(expected):
                return False
            return self.close(_dense(actual), _dense(expected))
        if self.is_tensor(actual) and self.dtype_kind(actual) == OTHER and not self.opaque(actual):
            # bit dtypes have no numpy form
            return self.is_tensor(expected) and actual.dtype == expected.dtype and bool(torch.equal(actual, expected))
        return close_tensors(self, actual, expected)

    def opaque(self, x: Any) -> str:
        if x.is_quantized:
            return "a quantized tensor"
        if x.layout in _SPARSE:
            why = invalid_sparse(x)
            return f"an invalid {_layout_name(x)} tensor ({why})" if why else ""
        if x.layout != torch.strided:
            return f"a tensor of layout {_layout_name(x)}"
        return ""

    def one_nonfinite_value(self, x) -> bool:
        if x.layout is _STRIDED and x.dtype in (torch.float64, torch.float32) and x.is_contiguous():
            try:  # the common case, answered by one numpy call where a value is finite
                a = x.numpy()
            except (RuntimeError, TypeError):  # grad, a neg bit, not on the CPU
                pass
            else:
                if a.size and np.isfinite(a).any():
                    return False
        if x.layout in _SPARSE and not invalid_sparse(x):
            x = x.to_dense()
        if x.layout != torch.strided or x.numel() == 0 or not (x.dtype.is_floating_point or x.dtype.is_complex):
            return False
        return bool(torch.isnan(x).all()) or bool(torch.isinf(x).all() and (x == x.flatten()[0]).all())

    @_dense_op
    def zeros_like(self, x):
        return torch.zeros_like(x)

    def random_like(self, x: torch.Tensor, seed: int):
        # laid out as x: kernels pick their code path by layout (MKL's GEMM by which operand
        # is column-major), and a Partial input's summands p and x - p on two paths did not
        # cancel exactly (mm's mat2 on AVX-512), so its Partial rule passed on some CPUs only
        values = self._random(x, seed)
        if values is not x and x.layout is _STRIDED and x.is_contiguous():
            return values  # drawn contiguous, as empty_like would lay it out
        return torch.empty_like(x).copy_(values)

    def _random(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        if x.dtype == torch.bool:  # vary the density by seed so any/all-like outputs vary too
            return torch.rand(x.shape, generator=g) < (0.1, 0.5, 0.9)[seed % 3]
        if x.dtype in FLOAT8:
            return torch.randn(x.shape, generator=g).to(x.dtype)
        if x.dtype.is_floating_point or x.dtype.is_complex:
            return torch.randn(x.shape, generator=g, dtype=x.dtype)
        if x.dtype == torch.uint8:
            return torch.randint(0, 200, x.shape, generator=g, dtype=x.dtype)
        if self.dtype_kind(x) == INT:
            return torch.randint(-100, 100, x.shape, generator=g, dtype=x.dtype)
        return x

    def clone(self, x):
        return x.clone()
