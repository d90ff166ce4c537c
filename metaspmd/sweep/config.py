"""What a sweep runs: its configuration, and how a backend and its ops are found."""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

DEFAULT_EXPLORER = "metaspmd.explorer:explore_op"
DEFAULT_TIMEOUT = 60.0


class SweepError(Exception):
    """The sweep cannot run at all (unknown backend, no op matched, backend fails to load)."""


@dataclass(frozen=True)
class SweepConfig:
    """One sweep. ``backend`` is a short name ('torch' -> metaspmd.backends.torch) or a
    dotted module path; the module's ``get_backend(**backend_options)`` builds it."""

    backend: str
    out_root: Path
    patterns: tuple[str, ...] = ()
    jobs: int = 1
    timeout: float = DEFAULT_TIMEOUT
    check: bool = False
    resume: bool = False
    backend_options: tuple[tuple[str, str], ...] = ()
    explorer: str = DEFAULT_EXPLORER
    progress: bool = False
    worker_output: bool = False

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise SweepError(f"jobs must be >= 1, got {self.jobs}")
        if self.timeout <= 0:
            raise SweepError(f"timeout must be > 0, got {self.timeout}")
        if self.check and self.resume:
            raise SweepError("--check and --resume do not combine: a check compares every op")


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def backend_module(name: str) -> str:
    """The module that provides a backend: a short name ('torch') is looked up under
    metaspmd.backends first, then taken as a module path ('tests_pkg.fake_backend').
    Finds the module without importing it (nor its framework)."""
    for module in (f"metaspmd.backends.{name}", name) if "." not in name else (name,):
        if _module_exists(module):
            return module
    raise SweepError(f"unknown backend {name!r} (no module metaspmd.backends.{name} or {name})")


def load_backend(module: str, options: Iterable[tuple[str, str]] = ()):
    return importlib.import_module(module).get_backend(**dict(options))


def resolve_callable(ref: str) -> Callable[..., Any]:
    """'package.module:function' -> the function."""
    module, _, attr = ref.partition(":")
    if not attr:
        raise SweepError(f"bad callable reference {ref!r} (expected module:function)")
    return getattr(importlib.import_module(module), attr)


def select_ops(ops: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """Ops matching any glob (fnmatch, case-sensitive); every op when there is none."""
    patterns = [p for p in patterns if p]
    ops = sorted(set(ops))
    if not patterns:
        return ops
    return [op for op in ops if any(fnmatch.fnmatchcase(op, p) for p in patterns)]


def split_patterns(values: Iterable[str]) -> tuple[str, ...]:
    """--ops 'a*,b*' --ops c -> ('a*', 'b*', 'c')."""
    return tuple(p.strip() for v in values for p in v.split(",") if p.strip())
