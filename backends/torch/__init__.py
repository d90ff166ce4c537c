"""The torch backend: ATen op catalog with sample inputs, and the tensor-ops protocol."""

from __future__ import annotations

from .backend import TorchBackend
from .tensor_ops import TorchOps


def get_backend(**options) -> TorchBackend:
    """The backend the sweep uses; options: cache_dir, max_signatures, schema_samples, opinfos,
    kernels (modules of custom ops to sweep instead of ATen's)."""
    return TorchBackend(**options)


__all__ = ["TorchBackend", "TorchOps", "get_backend"]
