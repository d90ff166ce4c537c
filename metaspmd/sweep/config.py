"""What a sweep runs: its configuration, and how a backend and its ops are found."""

from __future__ import annotations

import difflib
import fnmatch
import importlib
import importlib.util
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

DEFAULT_EXPLORER = "metaspmd.explorer:explore_op"
DEFAULT_TIMEOUT = 60.0
# The per-op limit counts the worker's CPU time, which a loaded machine does not stretch;
# an op blocked or asleep burns none, so a wall-clock guard this many times the limit
# stops true hangs.
WALL_FACTOR = 10.0
# The limit is per this many example calls of the op (its backend's ``cases``): a limit
# counted in work, so that an op with many signatures (a JAX primitive that models call in
# thirty ways) is not cut short on a slow machine where one with few fits.
CASES_PER_TIMEOUT = 20


def limit_units(cases: int) -> int:
    """How many ``timeout``s an op with ``cases`` example calls is given (at least one)."""
    return max(1, math.ceil(cases / CASES_PER_TIMEOUT))


def wall_limit(timeout: float, wall_timeout: float | None) -> float:
    """The hang guard in wall seconds of a limit of ``timeout`` CPU seconds: ``wall_timeout``
    where given, else ``WALL_FACTOR`` times the limit."""
    return wall_timeout if wall_timeout is not None else WALL_FACTOR * timeout


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
    timeout: float = DEFAULT_TIMEOUT  # CPU seconds of the op's worker, per CASES_PER_TIMEOUT example calls
    wall_timeout: float | None = None  # the hang guard, in wall seconds; None: WALL_FACTOR * timeout
    check: bool = False
    resume: bool = False
    backend_options: tuple[tuple[str, str], ...] = ()
    explorer: str = DEFAULT_EXPLORER
    progress: bool = False
    worker_output: bool = False

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise SweepError(f"jobs must be >= 1, got {self.jobs}")
        if not math.isfinite(self.timeout) or self.timeout <= 0:  # inf overflows the timers; nan never expires
            raise SweepError(f"timeout must be a finite number of seconds > 0, got {self.timeout}")
        if self.wall_timeout is not None and (not math.isfinite(self.wall_timeout) or self.wall_timeout <= 0):
            raise SweepError(f"wall_timeout must be a finite number of seconds > 0, got {self.wall_timeout}")
        if self.patterns and not any(p.strip() for p in self.patterns):
            raise SweepError(f"patterns {list(self.patterns)} name no op (no pattern at all selects every op)")
        if self.check and self.resume:
            raise SweepError("--check and --resume do not combine: a check compares every op")

    @property
    def wall_limit(self) -> float:
        return wall_limit(self.timeout, self.wall_timeout)

    @property
    def kernels(self) -> str:
        """The user's modules the backend imports (``--kernels``), for a message; '' for none."""
        kernels = dict(self.backend_options).get("kernels") or ()
        return kernels if isinstance(kernels, str) else " ".join(kernels)


def unwritable(path: Path, folder: bool) -> str:
    """Why ``path`` (a folder to write files in, or a file to write) cannot be written, or
    ''. Tried by creating and removing a temporary file in the nearest existing folder,
    which also catches read-only file systems and a root user's bypassed permission bits."""
    from ..registry_io import path_problem

    path = Path(path)
    problem = path_problem(path, folder)
    if problem:
        return problem
    if path.exists() and not folder and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    where = path if folder else path.parent
    while not where.exists():  # it would be created: its nearest existing parent must be writable
        where = where.parent  # a folder: path_problem refused a file on the way
    try:
        fd, tmp = tempfile.mkstemp(prefix=".metaspmd-write-test.", dir=where)
    except OSError as e:
        return f"{path}: cannot create files in {where} ({e.strerror or e})"
    os.close(fd)
    os.unlink(tmp)
    return ""


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def backend_module(name: str) -> str:
    """The module that provides a backend: a short name ('torch') is looked up under
    metaspmd.backends first, then taken as a module path ('tests_pkg.fake_backend').
    Finds the module without importing it (nor its framework)."""
    if not name.strip():  # an unset shell variable
        raise SweepError(f"--backend {name!r} names no backend (torch, jax, tvm, or a dotted module path)")
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


def unmatched_patterns(ops: Iterable[str], patterns: Iterable[str]) -> str | None:
    """What is wrong with ``patterns`` where one of them matches none of ``ops`` (a typo
    beside a good name would otherwise check less and pass), naming it and the nearest
    names; None where each matches some op."""
    names = sorted(set(ops))
    unmatched = [p for p in patterns if p and not select_ops(names, [p])]
    if not unmatched:
        return None
    near = nearest_ops(names, unmatched)
    return f"no op matches {', '.join(unmatched)}" + (f" (did you mean {' or '.join(near)}?)" if near else "")


def nearest_ops(ops: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """The op names closest to patterns that match none (a typo's likely meaning), best
    first, at most three."""
    names = sorted(set(ops))
    near: list[str] = []
    for p in patterns:
        if p and not any(fnmatch.fnmatchcase(op, p) for op in names):
            close = difflib.get_close_matches(p, names, n=3, cutoff=0.75)
            # a bare name ("abs") is no glob of the full one: the names holding it as a part
            close = close or [op for op in names if p.strip("*") in op.split(".")][:3]
            near += [m for m in close if m not in near]
    return near[:3]


def split_patterns(values: Iterable[str]) -> tuple[str, ...]:
    """--ops 'a*,b*' --ops c -> ('a*', 'b*', 'c')."""
    return tuple(p.strip() for v in values for p in v.split(",") if p.strip())
