"""The sweep engine: explore every op of a backend in isolated worker processes and keep
the registry in step with the results.

The engine imports no framework. Each worker process loads the backend by module name,
so a framework is imported only where ops run, and a worker that hangs or crashes
(segfault, abort, out of memory) takes down only itself: the op gets a 'failed' record
saying why and a fresh worker takes its place. Op failures are data, not errors.

A backend may define ``prepare()``: one-time set-up (building a sample index, warming a
compile cache) that each worker runs while it starts, outside the per-op time limit. The
first worker starts alone, so a set-up that fills an on-disk cache does so once.

Worker protocol over one pipe per worker (requests from the parent, replies from the
worker):

    worker -> ("ready", backend_name)        once the backend is loaded
    worker -> ("fatal", message)             the backend could not be loaded
    ("list",)        -> ("ops", [op, ...])
    ("explore", op)  -> ("done", op, record, seconds)
    None             -> the worker exits
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import json
import multiprocessing
import os
import re
import signal
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Iterable

from .rules import OpRecord

DEFAULT_EXPLORER = "metaspmd.explorer:explore_op"
DEFAULT_TIMEOUT = 60.0
# Loading a backend (importing a framework, scanning its op database) and listing its ops
# are not op work, so the per-op limit does not apply; this only stops a stuck start.
STARTUP_TIMEOUT = 600.0
# Summary rows, in print order: op statuses (metaspmd.rules.OP_STATUSES).
SUMMARY_STATUSES = ("ok", "derived", "replicate-only", "nondeterministic", "no-sample", "skipped", "failed")


class SweepError(Exception):
    """The sweep cannot run at all (unknown backend, no op matched, backend fails to load)."""


# --------------------------------------------------------------------------- config


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


# --------------------------------------------------------------------------- failures

_PATH_RE = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.+@~-]+){2,}")
_ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]{6,}")
MAX_REASON = 300


def clean_reason(text: str) -> str:
    """First line, without machine paths or memory addresses, so records stay
    byte-identical across machines and runs."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0].strip() if lines else ""
    line = _PATH_RE.sub(lambda m: re.split(r"[\\/]", m.group(0))[-1], line)
    line = _ADDRESS_RE.sub("0x…", line)
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 1] + "…"


def describe_exception(exc: BaseException) -> str:
    message = clean_reason(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"crashed: {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"crashed: signal {-exitcode}"
    return f"crashed: exit code {exitcode}"


def failed_record(backend: str, op: str, reason: str) -> OpRecord:
    return OpRecord(op=op, backend=backend, status="failed", entries=(), reason=reason)


# --------------------------------------------------------------------------- worker side

# Thread-pool sizes that frameworks read when they load (torch, numpy's BLAS, TVM).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS")


def worker_threads(jobs: int, cpus: int | None = None) -> int:
    """Threads per worker so that the workers together use each core once."""
    return max(1, (cpus or os.cpu_count() or 1) // jobs)


def _limit_threads(threads: int) -> None:
    # Workers that each spin up a thread per core oversubscribe the machine: measured on
    # 2 cores, 2 torch workers with default pools ran ops 6x slower than 1 worker.
    for var in THREAD_ENV:
        os.environ.setdefault(var, str(threads))


def _worker_main(conn, module: str, options: tuple, explorer: str, show_output: bool, threads: int) -> None:
    # The parent owns Ctrl-C: it stops the sweep and kills the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _limit_threads(threads)
    if not show_output:
        # Framework warnings and prints from thousands of ops would bury the progress
        # bar and the summary; what matters is in the records.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    else:
        os.dup2(2, 1)  # keep the parent's stdout for the summary
    try:
        instance = load_backend(module, options)
        explore = resolve_callable(explorer)
        name = instance.name
        prepare = getattr(instance, "prepare", None)
        if callable(prepare):  # slow one-time set-up (sample index, compile caches)
            prepare()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which aborts
        conn.send(("fatal", describe_exception(exc)))
        return
    conn.send(("ready", name))
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone
            return
        if request is None:
            return
        if request[0] == "list":
            conn.send(("ops", list(instance.list_ops())))
            continue
        op = request[1]
        start = time.perf_counter()
        try:
            record = explore(instance, op)
            if not isinstance(record, OpRecord) or (record.op, record.backend) != (op, name):
                got = f"{record.backend}/{record.op}" if isinstance(record, OpRecord) else type(record).__name__
                record = failed_record(name, op, f"explorer returned {got} instead of a record of {name}/{op}")
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - op failures are data
            record = failed_record(name, op, describe_exception(exc))
        seconds = time.perf_counter() - start
        try:
            conn.send(("done", op, record, seconds))
        except Exception as exc:  # noqa: BLE001 - e.g. a record that does not pickle
            conn.send(("done", op, failed_record(name, op, f"unsendable record: {describe_exception(exc)}"), seconds))


# --------------------------------------------------------------------------- parent side


@dataclass
class _Worker:
    proc: Any
    conn: Any
    born: float = field(default_factory=time.monotonic)
    ready: bool = False
    op: str | None = None
    started: float = 0.0

    @property
    def busy(self) -> bool:
        return self.op is not None

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


@dataclass(frozen=True)
class Outcome:
    """One op as the pool finished it: its record and exploration time."""

    op: str
    record: OpRecord
    seconds: float


class WorkerPool:
    """Long-lived worker processes, each with the backend loaded once.

    ``run(ops, on_outcome)`` explores ops, at most one per worker at a time, and calls
    ``on_outcome`` in the parent as each finishes. A worker past the time limit is killed;
    a worker that dies is replaced; either way its op gets a 'failed' record.
    """

    def __init__(self, config: SweepConfig):
        self.config = config
        self._ctx = multiprocessing.get_context("spawn")  # fork is unsafe with threaded frameworks
        self._workers: list[_Worker] = []
        self._pending: deque[str] = deque()
        self._module = backend_module(config.backend)
        self.backend_name: str | None = None

    # ---- lifecycle

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        c = self.config
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self._module, c.backend_options, c.explorer, c.worker_output, worker_threads(c.jobs)),
            # Not a daemon: ops may start processes of their own; close() reaps workers.
            daemon=False,
            name="metaspmd-sweep-worker",
        )
        proc.start()
        child.close()
        worker = _Worker(proc, parent)
        self._workers.append(worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)

    def close(self) -> None:
        """Stop every worker: idle ones are asked to exit, busy ones (an interrupted
        sweep) are killed at once."""
        for w in self._workers:
            if w.ready and not w.busy:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
        deadline = time.monotonic() + 2.0
        for w in self._workers:
            if w.ready and not w.busy:
                w.proc.join(max(0.0, deadline - time.monotonic()))
            w.kill()
        self._workers.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- start-up

    def _await_ready(self, worker: _Worker) -> None:
        """Block until a fresh worker has loaded the backend."""
        if not worker.conn.poll(STARTUP_TIMEOUT):
            self._retire(worker)
            raise SweepError(f"backend {self.config.backend!r} did not load within {STARTUP_TIMEOUT:g}s")
        self._handle_startup(worker, self._recv(worker))

    def _handle_startup(self, worker: _Worker, message) -> None:
        if message is None:
            exitcode = worker.proc.exitcode if not worker.proc.is_alive() else None
            self._retire(worker)
            raise SweepError(f"backend {self.config.backend!r} worker {describe_exit(exitcode)} while loading")
        if message[0] == "fatal":
            self._retire(worker)
            raise SweepError(f"cannot load backend {self.config.backend!r}: {message[1]}")
        worker.ready = True
        self.backend_name = message[1]

    def start(self) -> str:
        """Start one worker and return the backend's name."""
        self._await_ready(self._spawn())
        return self.backend_name

    def list_ops(self) -> list[str]:
        worker = next(w for w in self._workers if w.ready and not w.busy)
        worker.conn.send(("list",))
        if not worker.conn.poll(STARTUP_TIMEOUT):
            self._retire(worker)
            raise SweepError(f"backend {self.config.backend!r} did not list its ops within {STARTUP_TIMEOUT:g}s")
        message = self._recv(worker)
        if message is None or message[0] != "ops":
            exitcode = worker.proc.exitcode
            self._retire(worker)
            raise SweepError(f"backend {self.config.backend!r} worker {describe_exit(exitcode)} while listing ops")
        return list(message[1])

    # ---- the sweep loop

    @staticmethod
    def _recv(worker: _Worker):
        try:
            return worker.conn.recv()
        except (EOFError, OSError):
            worker.proc.join(1.0)
            return None

    def run(self, ops: Iterable[str], on_outcome: Callable[[Outcome], None]) -> None:
        self._pending = pending = deque(ops)
        if not pending:
            return
        while len(self._workers) < min(self.config.jobs, len(pending)):
            self._spawn()
        while pending or any(w.busy for w in self._workers):
            for w in self._workers:
                if w.ready and not w.busy and pending:
                    w.op, w.started = pending.popleft(), time.monotonic()
                    w.conn.send(("explore", w.op))
            # Retire idle workers once nothing is left to hand out.
            if not pending:
                for w in [w for w in self._workers if w.ready and not w.busy]:
                    w.conn.send(None)
                    self._retire(w)
            deadlines = [w.started + self.config.timeout for w in self._workers if w.busy]
            deadlines += [w.born + STARTUP_TIMEOUT for w in self._workers if not w.ready]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            waitables = [w.conn for w in self._workers] + [w.proc.sentinel for w in self._workers]
            ready = set(wait(waitables, timeout)) if waitables else set()
            for w in list(self._workers):
                if w.conn in ready or w.proc.sentinel in ready:
                    self._service(w, on_outcome)
            now = time.monotonic()
            if any(not w.ready and now - w.born >= STARTUP_TIMEOUT for w in self._workers):
                raise SweepError(f"a new worker did not load backend {self.config.backend!r} within {STARTUP_TIMEOUT:g}s")
            for w in [w for w in self._workers if w.busy and now - w.started >= self.config.timeout]:
                reason = f"timeout after {self.config.timeout:g}s"
                self._finish(w, failed_record(self.backend_name, w.op, reason), now - w.started, on_outcome)
                self._replace(w)

    def _service(self, worker: _Worker, on_outcome) -> None:
        """Handle everything a worker said, then its death if it died."""
        while True:
            alive = worker.proc.is_alive()
            if not worker.conn.poll():
                if alive:
                    return
                break
            message = self._recv(worker)
            if message is None:
                break
            if not worker.ready:
                self._handle_startup(worker, message)
            elif message[0] == "done" and message[1] == worker.op:
                self._finish(worker, message[2], message[3], on_outcome)
        # The worker is dead.
        worker.proc.join()
        if not worker.ready:
            self._handle_startup(worker, None)  # raises
        if worker.busy:
            reason = describe_exit(worker.proc.exitcode)
            self._finish(worker, failed_record(self.backend_name, worker.op, reason),
                         time.monotonic() - worker.started, on_outcome)
        self._replace(worker)

    def _finish(self, worker: _Worker, record: OpRecord, seconds: float, on_outcome) -> None:
        op, worker.op = worker.op, None
        on_outcome(Outcome(op, record, seconds))

    def _replace(self, worker: _Worker) -> None:
        self._retire(worker)
        if self._pending:  # no fresh worker (and framework start-up) for nothing to do
            self._spawn()


# --------------------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class OpResult:
    """One op in a sweep report. ``change`` is set in check mode: 'added', 'changed' or
    'unchanged' against the registry file."""

    op: str
    status: str
    reason: str
    seconds: float
    change: str = ""


@dataclass(frozen=True)
class SweepReport:
    backend: str
    results: tuple[OpResult, ...]
    resumed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # check mode: registry files of ops no longer listed
    wall_s: float = 0.0
    check: bool = False

    def counts(self) -> Counter:
        return Counter(r.status for r in self.results)

    def changes(self) -> list[tuple[str, str]]:
        """(kind, op or file name) for every difference a check found, sorted."""
        found = [(r.change, r.op) for r in self.results if r.change in ("added", "changed")]
        found += [("removed", name) for name in self.removed]
        return sorted(found, key=lambda c: (c[1], c[0]))

    @property
    def ops_per_s(self) -> float:
        return len(self.results) / self.wall_s if self.wall_s > 0 else 0.0


def _loads_cleanly(path: Path, op: str, backend: str) -> bool:
    from . import registry_io

    if not path.is_file():
        return False
    try:
        record = registry_io.load_record(path)
    except Exception:  # noqa: BLE001 - any unreadable file is redone
        return False
    return record.op == op and record.backend == backend


def run_sweep(config: SweepConfig) -> SweepReport:
    """Run one sweep as configured; raises SweepError when it cannot run at all."""
    from . import registry_io

    started = time.perf_counter()
    results: dict[str, OpResult] = {}
    with WorkerPool(config) as pool:
        backend = pool.start()
        ops = select_ops(pool.list_ops(), config.patterns)
        if not ops:
            raise SweepError(f"no op of backend {backend!r} matches {', '.join(config.patterns) or '*'}")
        _check_file_names(registry_io, config.out_root, backend, ops)
        resumed = tuple(op for op in ops if config.resume
                        and _loads_cleanly(registry_io.record_path(config.out_root, backend, op), op, backend))
        todo = [op for op in ops if op not in set(resumed)]

        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="op", file=sys.stderr, disable=not config.progress,
                   desc=f"sweep {backend}", dynamic_ncols=True)
        failed = 0

        def on_outcome(outcome: Outcome) -> None:
            nonlocal failed
            record = outcome.record
            change = ""
            if config.check:
                change = _compare(registry_io, config.out_root, record)
            else:
                registry_io.write_record(config.out_root, record)
            results[outcome.op] = OpResult(outcome.op, record.status, record.reason, outcome.seconds, change)
            if record.status == "failed":
                failed += 1
                bar.set_postfix(failed=failed, refresh=False)
            bar.update(1)

        try:
            pool.run(todo, on_outcome)
        finally:
            bar.close()

    removed: tuple[str, ...] = ()
    if config.check and not config.patterns:
        removed = _stale_files(registry_io, config.out_root, backend, ops)
    return SweepReport(
        backend=backend,
        results=tuple(results[op] for op in sorted(results)),
        resumed=resumed,
        removed=removed,
        wall_s=time.perf_counter() - started,
        check=config.check,
    )


def _check_file_names(registry_io, root: Path, backend: str, ops: list[str]) -> None:
    """Fail before any work when an op name cannot be a registry file name."""
    bad = []
    for op in ops:
        try:
            registry_io.record_path(root, backend, op)
        except ValueError:
            bad.append(op)
    if bad:
        raise SweepError(f"{len(bad)} op name(s) not usable as registry file names: {', '.join(bad[:5])}")


def _compare(registry_io, root: Path, record: OpRecord) -> str:
    path = registry_io.record_path(root, record.backend, record.op)
    if not path.is_file():
        return "added"
    return "unchanged" if path.read_text(encoding="utf-8") == registry_io.dump_record(record) else "changed"


def _stale_files(registry_io, root: Path, backend: str, ops: list[str]) -> tuple[str, ...]:
    expected = {registry_io.record_path(root, backend, op).name for op in ops}
    folder = registry_io.record_path(root, backend, ops[0]).parent
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.name for p in folder.glob("*.yaml") if p.name not in expected))


# --------------------------------------------------------------------------- reporting


def format_summary(report: SweepReport) -> str:
    counts = report.counts()
    failed = [r for r in report.results if r.status == "failed"]
    timeouts = sum(r.reason.startswith("timeout") for r in failed)
    crashes = sum(r.reason.startswith("crashed") for r in failed)
    rows = [("backend", report.backend), ("ops", str(len(report.results)))]
    if report.resumed:
        rows.append(("resumed (skipped)", str(len(report.resumed))))
    for status in SUMMARY_STATUSES:
        if status == "skipped" and not counts[status]:
            continue
        value = str(counts[status])
        if status == "failed" and (timeouts or crashes):
            value += f"  (timeouts {timeouts}, crashes {crashes})"
        rows.append((status if status != "ok" else "with rules (ok)", value))
    rows += [("wall time", f"{report.wall_s:.1f} s"), ("ops/s", f"{report.ops_per_s:.2f}")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def format_changes(report: SweepReport) -> str:
    return "\n".join(f"{kind:<8} {name}" for kind, name in report.changes())


def timings_json(report: SweepReport, jobs: int) -> str:
    """Per-op timings, kept out of the registry so its files stay byte-identical."""
    data = {
        "backend": report.backend,
        "jobs": jobs,
        "wall_s": round(report.wall_s, 3),
        "ops": {r.op: {"seconds": round(r.seconds, 4), "status": r.status} for r in report.results},
    }
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


__all__ = [
    "DEFAULT_EXPLORER", "DEFAULT_TIMEOUT", "OpResult", "Outcome", "SweepConfig", "SweepError",
    "SweepReport", "WorkerPool", "backend_module", "clean_reason", "describe_exception",
    "describe_exit", "failed_record", "format_changes", "format_summary", "load_backend",
    "run_sweep", "select_ops", "split_patterns", "timings_json",
]
