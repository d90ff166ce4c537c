"""Per-op work estimates from shapes alone: FLOPs and bytes touched.

Matmul-like ops cost 2 * output elements * contraction length; convolutions
2 * output elements * (weight elements per output channel); everything else one
operation per element of its largest tensor. Called with per-device (local) shapes, so a
strategy that splits the contraction divides the work as it should.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

Shape = tuple[int, ...]

MATMUL_NAMES = frozenset({
    "mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "addmv", "mv", "linear", "dot", "vdot",
    "dot_general", "einsum", "_scaled_mm",
})
CONV_NAMES = frozenset({"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_general_dilated"})

_DTYPE_BYTES = {
    "bool": 1, "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2, "half": 2,
    "int32": 4, "uint32": 4, "float32": 4, "float": 4,
    "int64": 8, "uint64": 8, "float64": 8, "double": 8, "complex64": 8,
    "complex128": 16,
}


def dtype_bytes(dtype: str) -> int:
    name = dtype.rsplit(".", 1)[-1].lower()
    if name in _DTYPE_BYTES:
        return _DTYPE_BYTES[name]
    m = re.search(r"(\d+)$", name)
    return max(1, int(m[1]) // 8) if m else 4


def numel(shape: Shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def op_names(op: str) -> set[str]:
    """The dotted parts of an op id: 'aten.mm.default' -> {'aten', 'mm', 'default'}."""
    return set(op.split("."))


def is_matmul(op: str) -> bool:
    return bool(op_names(op) & MATMUL_NAMES)


def is_conv(op: str) -> bool:
    return bool(op_names(op) & CONV_NAMES)


def _contraction(op: str, ins: Sequence[Shape], out: Shape, kwargs: Mapping[str, Any]) -> float:
    names = op_names(op)
    mats = [s for s in ins if len(s) >= 1]
    if "dot_general" in names:
        dn = kwargs.get("dimension_numbers")
        try:
            (lc, _rc), _ = dn
            return float(numel(tuple(ins[0][d] for d in lc)))
        except (TypeError, ValueError, IndexError):
            pass
    if "linear" in names and mats:
        return float(mats[0][-1])
    if len(mats) >= 2:
        a, b = mats[-2], mats[-1]  # addmm/baddbmm put the bias first
        if {"mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "_scaled_mm"} & names:
            return float(a[-1])
        # einsum and the rest: exact for a plain contraction without batch dims.
        if numel(out):
            return math.sqrt(max(1.0, numel(a) * numel(b) / numel(out)))
    return 1.0


def flops(op: str, ins: Sequence[Shape], outs: Sequence[Shape], kwargs: Mapping[str, Any] | None = None) -> float:
    kwargs = kwargs or {}
    out_elems = float(max((numel(s) for s in outs), default=0))
    if is_matmul(op) and outs:
        return 2.0 * out_elems * _contraction(op, ins, outs[0], kwargs)
    if is_conv(op) and len(ins) >= 2 and ins[1]:
        w = ins[1]
        return 2.0 * out_elems * numel(w) / max(1, w[0])
    return float(max([numel(s) for s in (*ins, *outs)] or [0]))


__all__ = ["CONV_NAMES", "MATMUL_NAMES", "dtype_bytes", "flops", "is_conv", "is_matmul", "numel", "op_names"]
