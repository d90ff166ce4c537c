"""The TVM backend: registered TE kernels as ops a sweep can explore."""

from __future__ import annotations

import importlib
from typing import Any, Iterable, Sequence

import numpy as np

from metaspmd.case import OpCase
from metaspmd.signature import span
from metaspmd.sweep.user_modules import load_module

from .compiled import CompiledKernel, build_kernel
from .registry import REGISTRY, KernelError, KernelRegistry, KernelSpec
from .tensor_ops import TvmOps, dtype_kind_of, random_array, to_tvm

BUILTIN_MODULE = __package__ + ".kernels"
EXAMPLE_SEED = 0


# Import a user's kernel module (a dotted name or a .py file) so its kernels register;
# returns the module name they are registered under.
load_kernel_module = load_module


class _VariantCall:
    """``fn(*tensors, **params)`` for one compiled variant (params must be the variant's own)."""

    def __init__(self, kernel: CompiledKernel):
        self.kernel = kernel

    def __call__(self, *tensors: Any, **params: Any) -> Any:
        if params != dict(self.kernel.params):
            raise ValueError(f"kernel {self.kernel.op} was built for {dict(self.kernel.params)}, called with {params}")
        return self.kernel(*tensors)


def _int_ranges(spec: KernelSpec, kernel: CompiledKernel) -> dict[str, tuple[int, int]]:
    """int_ranges with var-name bounds resolved to the example sizes."""
    sizes = dict(spec.example)
    out = {}
    for name, bounds in spec.int_ranges:
        if name not in kernel.input_names:
            raise KernelError(spec.op, f"int_ranges names {name!r}, which is not an input {list(kernel.input_names)}")
        if dtype_kind_of(kernel.input_dtype(kernel.input_names.index(name))) != "i":
            raise KernelError(spec.op, f"int_ranges names input {name!r}, which is not an integer tensor")
        try:
            low, high = (sizes[b] if isinstance(b, str) else int(b) for b in bounds)
        except (KeyError, ValueError, TypeError):
            raise KernelError(spec.op, f"bad int_ranges bounds {bounds!r} for input {name!r}") from None
        if low >= high:
            raise KernelError(spec.op, f"empty int_ranges [{low}, {high}) for input {name!r}")
        out[name] = (low, high)
    return out


def _make_case(spec: KernelSpec, kernel: CompiledKernel) -> OpCase:
    sizes = dict(spec.example)
    ranges = _int_ranges(spec, kernel)
    shapes = [kernel.input_shape(i, sizes) for i in range(len(kernel.inputs))]
    dtypes = [kernel.input_dtype(i) for i in range(len(kernel.inputs))]
    params = dict(kernel.params)

    def fresh(seed: int) -> tuple[tuple, dict]:
        rng = np.random.default_rng(seed)
        arrays = [
            random_array(shape, dtype, rng, **({"int_range": ranges[name]} if name in ranges else {}))
            for name, shape, dtype in zip(kernel.input_names, shapes, dtypes)
        ]
        return tuple(to_tvm(a) for a in arrays), dict(params)

    args, kwargs = fresh(EXAMPLE_SEED)
    return OpCase(spec.op, _VariantCall(kernel), args, kwargs, arg_names=kernel.input_names, fresh=fresh,
                  exact_sizes=_exact_sizes(spec, kernel))


def _exact_sizes(spec: KernelSpec, kernel: CompiledKernel) -> dict[str, slice]:
    """The input dims the spec's ``exact`` vars size, one slice per input."""
    spans = {name: span(kernel.var_dims(i, spec.exact)) for i, name in enumerate(kernel.input_names)}
    return {name: dims for name, dims in spans.items() if dims is not None}


class TvmBackend:
    """Ops are the kernels that the selected modules registered, named 'tvm.<name>'."""

    name = "tvm"

    def __init__(self, modules: Iterable[str], registry: KernelRegistry = REGISTRY):
        self.modules = tuple(modules)
        self.registry = registry
        self._ops = TvmOps()

    def tensor_ops(self) -> TvmOps:
        return self._ops

    def list_ops(self) -> list[str]:
        return self.registry.ops(self.modules)

    def spec(self, op: str) -> KernelSpec:
        if op not in self.list_ops():
            raise KeyError(f"no TVM kernel named {op!r} in modules {list(self.modules)}")
        return self.registry.get(op)

    def kernels(self, op: str) -> list[CompiledKernel]:
        """Every variant of ``op``, built and compiled (KernelError when the kernel is invalid)."""
        spec = self.spec(op)
        built = [build_kernel(spec, params) for params in spec.variants]
        used = {name for k in built for name in k.variables}
        unknown = sorted(set(dict(spec.example)) - used)
        if unknown:
            raise KernelError(op, f"the example sizes name unknown symbolic var(s) {unknown}")
        return built

    def cases(self, op: str) -> Sequence[OpCase]:
        spec = self.spec(op)
        return [_make_case(spec, k) for k in self.kernels(op)]


def make_backend(kernels: str | Sequence[str] | None = None, builtins: bool = True) -> TvmBackend:
    modules = []
    if builtins:
        modules.append(importlib.import_module(BUILTIN_MODULE).__name__)
    refs = [kernels] if isinstance(kernels, str) else list(kernels or ())
    for ref in refs:
        before = REGISTRY.specs()
        module = load_kernel_module(ref)
        REGISTRY.adopt(before, module)
        if not REGISTRY.ops([module]):  # else the sweep's only word is "no op matches *"
            raise ValueError(f"{ref}: defines no TVM kernel (@metaspmd.backends.tvm.kernel)")
        modules.append(module)
    return TvmBackend(modules)


__all__ = ["TvmBackend", "load_kernel_module", "make_backend"]
