"""The torch backend: ATen op catalog with sample inputs, and the tensor-ops protocol.

The sweep's backend (``TorchBackend``: the op catalog, OpInfo samples) loads on first use,
so ``register()`` and ``parallelize`` do not pay for it.
"""

from __future__ import annotations

from typing import Any


def get_backend(**options) -> Any:
    """The backend the sweep uses; options: cache_dir, max_signatures, schema_samples, opinfos,
    kernels (modules of custom ops to sweep instead of ATen's)."""
    from .backend import TorchBackend

    return TorchBackend(**options)


def __getattr__(name: str) -> Any:
    if name == "TorchBackend":
        from .backend import TorchBackend

        return TorchBackend
    if name == "TorchOps":
        from .tensor_ops import TorchOps

        return TorchOps
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TorchBackend", "TorchOps", "get_backend"]
