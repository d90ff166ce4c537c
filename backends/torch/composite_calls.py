"""Recording calls of CompositeImplicitAutograd overloads (einsum, linear, nll_loss,
conv_transpose2d, quantile, ...).

These ops decompose above the Python dispatch key, so a dispatch mode sees only the ops
they call, never them. Under the Python dispatcher, ``composite_kernels`` gives each a
Python kernel at that key which hands the call to the innermost ``CompositeRecorder`` and
then runs the op's own C++ decomposition.

The Python dispatcher is not the C++ one: torch's own Python kernels at the autograd keys
(upsample and batch norm decompositions) run instead of the C++ kernels, and a few ops
resolve differently (``addr_`` accepts a 0-d self). So only composite calls are recorded
under it; every other op is captured by the plain dispatch mode, as before.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.utils._python_dispatch import TorchDispatchMode

from . import catalog

OnCall = Callable[[Any, tuple, dict], Callable[[], None] | None]

_CIA = torch._C.DispatchKey.CompositeImplicitAutograd
_AUTOGRAD_KEYS = (_CIA, torch._C.DispatchKey.Autograd)
_ACTIVE: list["CompositeRecorder"] = []  # the recorders entered, innermost last
_DEPTH = [0]  # calls running now, one within another (composite ones; with _Running, all)


@functools.lru_cache(maxsize=1)
def composite_names() -> frozenset[str]:
    return frozenset(catalog.op_name(func) for func in catalog.composite_implicit_overloads())


class _Running(TorchDispatchMode):
    """Counts every op that reaches the Python dispatch key as running while it runs."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        _DEPTH[0] += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            _DEPTH[0] -= 1


class CompositeRecorder:
    """Within ``composite_kernels``: hands every composite call to ``on_call(func, args,
    kwargs)`` before running it; what that returns, if anything, is called once the call
    has succeeded (as the dispatch-mode recorder of ``samples`` does). With ``outermost``,
    only calls made while no other op runs: the calls a program makes, not ``matmul``'s
    ``resolve_conj`` of its own unwritten output, nor one an attention kernel makes."""

    def __init__(self, on_call: OnCall, outermost: bool = False):
        self.on_call = on_call
        self.outermost = outermost
        self._running = _Running() if outermost else contextlib.nullcontext()

    def __enter__(self) -> "CompositeRecorder":
        _ACTIVE.append(self)
        self._running.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._running.__exit__(*exc)
        _ACTIVE.remove(self)


def _offer(func, args: tuple, kwargs: dict) -> Callable[[], None] | None:
    """The innermost recorder's ``on_call``, with every recorder deaf meanwhile: the
    composite ops that snapshotting the inputs calls are no calls of the sample."""
    if not _ACTIVE or _ACTIVE[-1].outermost and _DEPTH[0]:
        return None
    entered = _ACTIVE[:]
    _ACTIVE.clear()
    try:
        return entered[-1].on_call(func, args, kwargs)
    finally:
        _ACTIVE[:] = entered


def _recording_kernel(func) -> Callable:
    def run(*args, **kwargs):
        commit = _offer(func, args, kwargs)
        _DEPTH[0] += 1
        try:
            out = func._op_dk(_CIA, *args, **kwargs)
        finally:
            _DEPTH[0] -= 1
        if commit is not None:
            commit()
        return out

    return run


@functools.lru_cache(maxsize=None)
def _kernel_of(func) -> Callable:
    """``func``'s recording kernel, made once per process (entries reinstall the same one)."""
    return _recording_kernel(func)


@functools.lru_cache(maxsize=1)
def _installs() -> tuple[tuple[dict, Callable], ...]:
    """Each composite overload's Python kernels (the dict itself: an overload makes it once
    and only changes it) with its recording kernel: the same for the whole process."""
    return tuple((f.py_kernels, _kernel_of(f)) for f in catalog.composite_implicit_overloads())


_KERNELLED: list = [-1, (), ()]  # sys.modules' size when scanned, the overloads, those touched


def _kernelled() -> tuple[tuple, tuple]:
    """The overloads with torch's own Python kernels at the autograd keys (most have none),
    and every overload ``composite_kernels`` changes (those and the composite ones). Python
    kernels are registered when a module is imported, so the scan of every overload is made
    again only after an import, not on every entry."""
    if _KERNELLED[0] != len(sys.modules):
        keys = set(_AUTOGRAD_KEYS)
        found = tuple(f for f in catalog.aten_overloads() if f.py_kernels and not keys.isdisjoint(f.py_kernels))
        touched = set(catalog.composite_implicit_overloads()) | set(found)  # by their dicts, as _installs has them
        _KERNELLED[:] = [len(sys.modules), found, tuple((f.py_kernels, f._dispatch_cache) for f in touched)]
    return _KERNELLED[1], _KERNELLED[2]


@contextlib.contextmanager
def composite_kernels() -> Iterator[None]:
    """The Python dispatcher on, each composite overload's calls reaching the recorders,
    torch's Python kernels at the autograd keys set aside; all as it was on exit. Only
    the overloads changed here have their dispatch caches cleared: entered once per
    regenerated sample (thousands of times in a sweep), this must stay cheap."""
    installs = _installs()
    cia, autograd = _AUTOGRAD_KEYS
    kernelled, touched = _kernelled()
    saved = [(f, {k: f.py_kernels.pop(k) for k in _AUTOGRAD_KEYS if k in f.py_kernels}) for f in kernelled]
    try:
        for kernels, kernel in installs:
            kernels[cia] = kernel
        for _, cache in touched:
            cache.clear()
        with enable_python_dispatcher():
            yield
    finally:
        for kernels, cache in touched:
            kernels.pop(cia, None)
            kernels.pop(autograd, None)
            cache.clear()
        for func, kernels in saved:
            func.py_kernels.update(kernels)
            func._dispatch_cache.clear()


__all__ = ["CompositeRecorder", "composite_kernels", "composite_names"]
