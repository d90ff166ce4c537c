"""TVM backend: TE kernels registered with ``@kernel``, compiled once with symbolic shapes.

``get_backend(kernels="pkg.module" or "path/to/file.py")`` also imports a user's module so
its ``@kernel`` decorators register; its kernels are listed next to the built-in catalog.
"""

from __future__ import annotations

from typing import Sequence

from .backend import TvmBackend, load_kernel_module, make_backend
from .compiled import CompiledKernel, build_kernel
from .registry import REGISTRY, KernelError, KernelRegistry, KernelSpec, kernel
from .tensor_ops import TvmOps


def get_backend(kernels: str | Sequence[str] | None = None, builtins: bool = True) -> TvmBackend:
    """The sweep's entry point: the built-in catalog plus the kernels of ``kernels``."""
    return make_backend(kernels, builtins)


__all__ = [
    "CompiledKernel", "KernelError", "KernelRegistry", "KernelSpec", "REGISTRY", "TvmBackend", "TvmOps",
    "build_kernel", "get_backend", "kernel", "load_kernel_module",
]
