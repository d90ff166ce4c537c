"""The calls a model makes to a user's custom ops, as example calls for the sweep.

A module swept with ``tools/sweep.py --kernels`` may list models in ``METASPMD_MODELS``:
zero-argument callables, each returning ``(model, inputs)``. Each model runs forward and
backward under a dispatch mode that records every call of the module's ops, so the sweep
explores them at the signatures the model uses, without examples written by hand.

A dispatch mode never sees a CompositeImplicitAutograd overload (``lstm``, ``lstm_cell``):
it decomposes above the Python key. With ``composite``, each model's forward runs a second
time, rebuilt under the same seed, with the calls of those overloads that the model itself
makes recorded (``composite_calls``), not those another op makes while it runs. Both runs
fill uninitialized memory, as the sample index does, so every run records the same calls.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from . import catalog
from .composite_calls import CompositeRecorder, composite_kernels, composite_names
from .samples import BASE_SEED, call_signature, filled_memory

MODELS_ATTR = "METASPMD_MODELS"

Call = tuple[tuple, dict]


class Calls:
    """The first call per signature of each op in ``namespaces`` (a model of many layers
    repeats its calls), with detached copies of its arguments."""

    def __init__(self, namespaces: frozenset[str]):
        self.namespaces = namespaces
        self.calls: list[tuple[Any, Call]] = []
        self._seen: set[tuple[Any, str]] = set()

    def record(self, func, args: tuple, kwargs: dict) -> None:
        if func.namespace in self.namespaces:
            key = (func, call_signature(func, args, kwargs))
            if key not in self._seen:
                self._seen.add(key)
                copy = tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, (tuple(args), dict(kwargs)))
                self.calls.append((func, copy))


class _Recorder(TorchDispatchMode):
    """Records the calls that reach the Python dispatch key into ``calls``."""

    def __init__(self, calls: Calls):
        super().__init__()
        self.found = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.found.record(func, args, kwargs)
        return func(*args, **kwargs)


def _composite_recorder(calls: Calls) -> CompositeRecorder:
    """Records the model's own calls of composite overloads (within ``composite_kernels``)
    into ``calls``."""
    names = composite_names()

    def on_call(func, args, kwargs) -> None:  # recorded at once: no commit to run after the call
        if catalog.op_name(func) in names:
            calls.record(func, args, kwargs)

    return CompositeRecorder(on_call, outermost=True)


def _run_forward_and_backward(model: Callable[..., Any], inputs: Sequence[Any]) -> None:
    out = model(*inputs)
    grads = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if grads:  # a backward that calls the module's ops (a fused kernel's own backward op)
        sum(t.float().sum() for t in grads).backward()


@contextlib.contextmanager
def built(make: Callable[[], tuple[Any, Sequence[Any]]], seed: int) -> Iterator[tuple[Any, Sequence[Any]]]:
    """``make()``'s (model, inputs), built under ``seed`` and used with uninitialized memory
    filled, as the sample index is: every run, in any worker, records the same calls."""
    with torch.random.fork_rng(devices=[]), filled_memory():
        torch.manual_seed(seed)
        yield make()


def _recorded(make: Callable[[], tuple[Any, Sequence[Any]]], seed: int, calls: Calls, composite: bool) -> None:
    """Build the model under ``seed`` and run it, recording into ``calls`` its plain calls,
    forward and backward, or with ``composite`` the composite calls of its forward (the
    backward's are autograd's own, made on buffers it has not written yet)."""
    with built(make, seed) as (model, inputs):
        if composite:
            with composite_kernels(), _composite_recorder(calls):
                model(*inputs)
        else:
            with _Recorder(calls):
                _run_forward_and_backward(model, tuple(inputs))


def model_calls(models: Sequence[Callable[[], tuple[Any, Sequence[Any]]]], namespaces: frozenset[str],
                where: str, composite: bool = False) -> dict[str, list[Call]]:
    """The calls ``models`` make, forward and backward, of ops in ``namespaces``, by catalog
    name; with ``composite``, the forward's calls of composite overloads too, after the
    others. Each model is built and run under its own seed, so every worker of a sweep
    records the same calls. ``where`` names the module in errors."""
    calls: dict[str, list[Call]] = {}
    for k, make in enumerate(models):
        label = f"{where}: {MODELS_ATTR}[{k}]"
        if not callable(make):
            raise ValueError(f"{label} is not callable: give a function that returns (model, inputs)")
        found = Calls(namespaces)
        try:
            for pass_composite in (False, True) if composite else (False,):
                _recorded(make, BASE_SEED + k, found, pass_composite)
        except Exception as e:
            raise ValueError(f"{label} failed: {type(e).__name__}: {e}") from e
        if not found.calls:
            raise ValueError(f"{label} calls no op of {', '.join(sorted(namespaces))}")
        for func, call in found.calls:
            calls.setdefault(catalog.op_name(func), []).append(call)
    return calls


def unique_calls(func, calls: Sequence[Call]) -> list[Call]:
    """``calls`` with one call per signature, the first of each kept."""
    seen, out = set(), []
    for args, kwargs in calls:
        key = call_signature(func, args, kwargs)
        if key not in seen:
            seen.add(key)
            out.append((args, kwargs))
    return out


__all__ = ["MODELS_ATTR", "Calls", "built", "model_calls", "unique_calls"]
