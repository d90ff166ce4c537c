"""The calls a model makes to a user's custom ops, as example calls for the sweep.

A module swept with ``tools/sweep.py --kernels`` may list models in ``METASPMD_MODELS``:
zero-argument callables, each returning ``(model, inputs)``. Each model runs forward and
backward under a dispatch mode that records every call of the module's ops, so the sweep
explores them at the signatures the model uses, without examples written by hand.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from . import catalog
from .samples import BASE_SEED, call_signature

MODELS_ATTR = "METASPMD_MODELS"

Call = tuple[tuple, dict]


class _Recorder(TorchDispatchMode):
    """Records the first call per signature of each op in ``namespaces``, with detached
    copies of its arguments (a model of many layers repeats its calls)."""

    def __init__(self, namespaces: frozenset[str]):
        super().__init__()
        self.namespaces = namespaces
        self.calls: list[tuple[Any, Call]] = []
        self._seen: set[tuple[Any, str]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in self.namespaces:
            key = (func, call_signature(func, args, kwargs))
            if key not in self._seen:
                self._seen.add(key)
                copy = tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, (tuple(args), dict(kwargs)))
                self.calls.append((func, copy))
        return func(*args, **kwargs)


def _run_forward_and_backward(model: Callable[..., Any], inputs: Sequence[Any]) -> None:
    out = model(*inputs)
    grads = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if grads:  # a backward that calls the module's ops (a fused kernel's own backward op)
        sum(t.float().sum() for t in grads).backward()


def model_calls(models: Sequence[Callable[[], tuple[Any, Sequence[Any]]]], namespaces: frozenset[str],
                where: str) -> dict[str, list[Call]]:
    """The calls ``models`` make, forward and backward, of ops in ``namespaces``, by catalog
    name. Each model is built and run under its own seed, so every worker of a sweep
    records the same calls. ``where`` names the module in errors."""
    calls: dict[str, list[Call]] = {}
    for k, make in enumerate(models):
        label = f"{where}: {MODELS_ATTR}[{k}]"
        if not callable(make):
            raise ValueError(f"{label} is not callable: give a function that returns (model, inputs)")
        recorder = _Recorder(namespaces)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(BASE_SEED + k)
            try:
                model, inputs = make()
                with recorder:
                    _run_forward_and_backward(model, tuple(inputs))
            except Exception as e:
                raise ValueError(f"{label} failed: {type(e).__name__}: {e}") from e
        if not recorder.calls:
            raise ValueError(f"{label} calls no op of {', '.join(sorted(namespaces))}")
        for func, call in recorder.calls:
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


__all__ = ["MODELS_ATTR", "model_calls", "unique_calls"]
