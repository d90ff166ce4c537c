"""Worker processes for the sweep. Each worker process loads the backend by module name,
so a framework is imported only where ops run, and a worker that hangs or crashes
(segfault, abort, out of memory) takes down only itself: a fresh worker takes its place,
and the op gets a 'failed' record saying why (or, out of time, is reported as such: the
sweep then keeps its previous file). Op failures are data, not errors.

A backend may define ``prepare()``: one-time set-up (building a sample index, warming a
compile cache) that each worker runs while it starts, outside the per-op time limit. The
first worker starts alone, so a set-up that fills an on-disk cache does so once.

Worker protocol over one pipe per worker (requests from the parent, replies from the
worker):

    worker -> ("ready", backend_name)        once the backend is loaded
    worker -> ("fatal", message)             the backend could not be loaded
    ("list",)        -> ("ops", [op, ...])
    ("explore", op, *args)  -> ("done", op, record, seconds)
    None             -> the worker exits

Other tools reuse the pool for other work on ops (the torch cross-check): a ``Task`` names
the function a worker runs on each op in place of the sweep's explorer, and what stands
for the result of an op whose worker failed.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .. import reproducible
from ..case import OutOfMemory
from ..registry_io import refuse_unwritable
from ..rules import OpRecord
from .config import (
    CASES_PER_TIMEOUT, SweepConfig, SweepError, backend_module, limit_units, load_backend, resolve_callable,
)
from .failures import describe_exception, describe_exit, describe_fatal, failed_record

# Loading a backend (importing a framework, scanning its op database) and listing its ops
# are not op work, so the per-op limit does not apply; this only stops a stuck start.
STARTUP_TIMEOUT = 600.0
# Ops a worker explored before an op, reported with it (Outcome.after).
HISTORY = 3
# How often the parent reads a busy worker's CPU time, at most: an op overshoots its CPU
# limit by about this much times its threads.
CPU_POLL_S = 0.25
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") and "SC_CLK_TCK" in os.sysconf_names else 100


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, all threads, and reaped children) of a live process, read
    from /proc; None where there is no /proc (not Linux) or the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # fields after the command name, which may hold spaces and parentheses: state is [0]
        fields = stat[stat.rindex(b")") + 2:].split()
        return sum(int(v) for v in fields[11:15]) / _TICKS  # utime, stime, cutime, cstime
    except (OSError, ValueError, IndexError):
        return None

# --------------------------------------------------------------------------- worker side

# Thread-pool sizes that frameworks read when they load (torch, numpy's BLAS, TVM).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS")


# Ops run on one thread in every worker, whatever --jobs is (its default, the CPU count,
# uses every core). A parallel kernel's sums differ in the last bits with its thread count
# (the sample index is built on one thread for that reason), so a check at a tolerance's
# edge could go another way with --jobs below the core count, or on a machine with more
# cores. Pools of a thread per core also oversubscribe: measured on 2 cores, 2 torch
# workers with default pools ran ops 6x slower than 1 worker.
WORKER_THREADS = 1


def _limit_threads() -> None:
    for var in THREAD_ENV:
        os.environ[var] = str(WORKER_THREADS)


def silence_output() -> None:
    """Send this process's stdout and stderr, at the file-descriptor level, to /dev/null.

    For worker processes: framework warnings (C++ ones too) and the prints of ops such as
    ``aten._print`` from thousands of calls would bury the parent's progress bar and
    report; what matters comes back in the results.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


def unshared_progress_lock() -> None:
    """Give tqdm a lock of this process only. tqdm makes a named, cross-process semaphore
    for its first bar, a disabled one too (torch.fx's Interpreter opens one per run), and
    a worker killed before it exits (still loading when the sweep ends) cannot unlink it:
    the resource tracker then warns of a leak at exit. A worker's bars are never shown."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def exit_with_parent(interval: float = 0.5) -> None:
    """Exit this worker process soon after its parent dies, whatever it is running.

    A parent stopped by SIGTERM or SIGKILL (a CI time limit, ``timeout``, a closed
    session) cannot kill its workers, and a worker notices only at its next message:
    one in a hung op, or a cross-check worker with a chunk of ops still to go, would
    run on for minutes or hours. A daemon thread watches for the parent's exit (the
    process is then re-parented) and ends the process at once.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="metaspmd-exit-with-parent", daemon=True).start()


def die_with_parent() -> None:
    """Have the kernel kill this worker when its parent dies (Linux's PR_SET_PDEATHSIG),
    where ``exit_with_parent``'s thread cannot run: an op that holds the GIL (a regular
    expression's backtracking, a C loop) kept its worker running, orphaned, after the
    parent was killed. The parent must spawn its workers from a thread that lives as long
    as the pool (the sweep's own): the signal follows the spawning thread's exit."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def _freeze_loaded() -> None:
    """Take what the backend has loaded so far (a framework's modules, an op database, a
    sample index: ~520k objects for torch) out of the garbage collector's generations.
    They live as long as the worker, yet every full collection scanned them all again
    (~0.27 s each for torch, several per hundred ops). Called once the backend is ready
    and again after the worker's first op, since backends load some of it on first use
    (torch's OpInfo database). Garbage is collected first, so that nothing dead is kept
    out of reach of the collector."""
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class Task:
    """What a pool's workers do with an op in place of exploring it: ``run`` is called as
    ``run(backend, op, *args)`` in a worker and returns the op's result (anything that
    pickles); ``failed`` as ``failed(backend_name, op, reason)`` gives the result of an op
    that raised, timed out or took its worker down. Both are 'module:function' references,
    resolved where they run."""

    run: str
    failed: str = "metaspmd.sweep.failures:failed_record"


def _worker_main(conn, module: str, options: tuple, explorer: str, show_output: bool,
                 failed: str | None = None) -> None:
    # The parent owns Ctrl-C: it stops the sweep and kills the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a process group of its own, which the parent kills whole: processes an op starts
    # (a subprocess left running) go with their worker, not on, orphaned, after the sweep
    os.setpgrp()
    exit_with_parent()
    die_with_parent()
    unshared_progress_lock()
    _limit_threads()
    if not show_output:
        silence_output()
    else:
        os.dup2(2, 1)  # keep the parent's stdout for the summary
    try:
        instance = load_backend(module, options)
        explore = resolve_callable(explorer)
        on_failure = resolve_callable(failed) if failed else failed_record
        name = instance.name
        prepare = getattr(instance, "prepare", None)
        if callable(prepare):  # slow one-time set-up (sample index, compile caches)
            prepare()
        _freeze_loaded()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which aborts
        conn.send(("fatal", describe_fatal(exc)))
        return
    _report_cases(instance, conn)
    conn.send(("ready", name))
    first = True
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
        op, args = request[1], request[2:]
        start = time.perf_counter()
        try:
            with _state_kept(instance):
                record = explore(instance, op, *args)
            if failed is None and (not isinstance(record, OpRecord) or (record.op, record.backend) != (op, name)):
                got = f"{record.backend}/{record.op}" if isinstance(record, OpRecord) else type(record).__name__
                record = failed_record(name, op, f"explorer returned {got} instead of a record of {name}/{op}")
            elif failed is None:
                refuse_unwritable(record)  # text no rule file may hold (a control character) is the op's failure, here
        except OutOfMemory as exc:  # the machine's limit: the parent retries it, then keeps its file
            conn.send(("out of memory", op, f"out of memory: {exc}", time.perf_counter() - start))
            continue
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - op failures are data
            # (the worker ignores SIGINT: a KeyboardInterrupt is the op's own raise)
            record = on_failure(name, op, describe_exception(exc))
        seconds = time.perf_counter() - start
        try:
            conn.send(("done", op, record, seconds))
        except Exception as exc:  # noqa: BLE001 - e.g. a record that does not pickle
            conn.send(("done", op, on_failure(name, op, f"unsendable record: {describe_exception(exc)}"), seconds))
        if first:  # after the reply, so that the op's own time does not count the collection
            first = False
            _freeze_loaded()


@contextlib.contextmanager
def _state_kept(instance: Any):
    """Run an op in the process state the worker had before it, restored after: an op that
    changes a global setting (the working folder, an environment variable, Python's or
    numpy's random state, or the framework's own: ``torch.set_default_dtype``) would
    change the results of the ops its worker explores after it, so that a file would
    depend on which ops ran before it in the same worker. The backend's ``op_state()``,
    where it has one, keeps its framework's settings."""
    cwd, environ = os.getcwd(), dict(os.environ)
    py_random, np_random = random.getstate(), np.random.get_state()
    framework = getattr(instance, "op_state", None)
    try:
        with framework() if callable(framework) else contextlib.nullcontext():
            yield
    finally:
        if os.getcwd() != cwd:
            os.chdir(cwd)
        if os.environ != environ:
            os.environ.clear()
            os.environ.update(environ)
        random.setstate(py_random)
        np.random.set_state(np_random)


def _report_cases(instance: Any, conn) -> None:
    """Have the backend's ``cases`` tell the parent how many example calls an op has: its
    time limit is counted per ``CASES_PER_TIMEOUT`` of them (``limit_units``)."""
    cases = getattr(instance, "cases", None)
    if not callable(cases):
        return

    def reported(op: str, *args, **kwargs):
        out = list(cases(op, *args, **kwargs))
        conn.send(("cases", op, len(out)))
        return out

    try:
        instance.cases = reported
    except (AttributeError, TypeError):  # a backend that takes no attributes (slots): one limit per op
        pass


# --------------------------------------------------------------------------- parent side


@dataclass
class _Worker:
    proc: Any
    conn: Any
    born: float = field(default_factory=time.monotonic)
    ready: bool = False
    op: str | None = None
    started: float = 0.0
    cpu_started: float | None = None  # the worker's CPU time when its op was sent
    cases: int = 0  # the op's example calls, as its worker reported them (0: not yet)
    history: list[str] = field(default_factory=list)  # the ops it explored, in order

    @property
    def busy(self) -> bool:
        return self.op is not None

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        try:  # what the op started, in the worker's group (alive or not, the group may be)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # no such group left (or not the worker's yet)
            pass
        self.conn.close()


@dataclass(frozen=True)
class Outcome:
    """One op as the pool finished it: its record, exploration time, and the ops its worker
    explored before it (the last few), so that a result that depends on a worker's history
    can be replayed in that order."""

    op: str
    record: OpRecord  # a Task's pool: the task's result
    seconds: float
    after: tuple[str, ...] = ()
    retried: str = ""  # why its first try failed, where a crash or time limit sent it round again
    timed_out: bool = False  # its last try ran out of time, or was killed by SIGKILL (record: the failure result)


class WorkerPool:
    """Long-lived worker processes, each with the backend loaded once.

    ``run(ops, on_outcome)`` explores ops, at most one per worker at a time, and calls
    ``on_outcome`` in the parent as each finishes. A worker past the time limit is killed;
    a worker that dies is replaced; either way its op is tried once more (a worker killed
    for memory fails once only), and gets a 'failed' record if it fails again, with
    ``Outcome.timed_out`` set where that was a time limit or a SIGKILL (the machine's doing,
    not the op's: the sweep keeps the op's file).

    The limit (``config.timeout``) counts the worker's CPU time since the op was sent, so
    an op slowed by a loaded machine gets the time it needs: wall-clock speed must not
    change a sweep's result. An op that burns no CPU (asleep, blocked on a lock or a pipe)
    is stopped by a wall-clock guard, ``config.wall_limit``. Without /proc (not Linux)
    the limit counts wall time.

    ``task``: run it on each op instead of the sweep's explorer (``Task``).
    """

    def __init__(self, config: SweepConfig, task: Task | None = None):
        self.config = config
        self.task = task
        self._failure_result = resolve_callable(task.failed) if task else failed_record
        self._args: Mapping[str, tuple] = {}
        self._ctx = multiprocessing.get_context("spawn")  # fork is unsafe with threaded frameworks
        self._workers: list[_Worker] = []
        self._pending: deque[str] = deque()
        self._retried: dict[str, str] = {}  # op -> why its first try failed
        self._module = backend_module(config.backend)
        self.backend_name: str | None = None

    # ---- lifecycle

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        c = self.config
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self._module, c.backend_options, self.task.run if self.task else c.explorer, c.worker_output,
                  self.task.failed if self.task else None),
            # Not a daemon: ops may start processes of their own; close() reaps workers.
            daemon=False,
            name="metaspmd-sweep-worker",
        )
        with reproducible.for_children():  # results must not depend on the process or the machine
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
            raise SweepError(f"backend {self.config.backend!r} did not load within {STARTUP_TIMEOUT:g}s{self._loading()}")
        self._handle_startup(worker, self._recv(worker))

    def _loading(self) -> str:
        """What else loading the backend did, for a message: a module of the user's imported
        (``--kernels``, which may be what hangs)."""
        return f" (loading imports --kernels {self.config.kernels})" if self.config.kernels else ""

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

    def run(self, ops: Iterable[str], on_outcome: Callable[[Outcome], None],
            args: Mapping[str, tuple] | None = None) -> None:
        """``args``: more arguments for the explorer or task, by op."""
        self._pending = pending = deque(ops)
        self._args = args or {}
        if not pending:
            return
        while len(self._workers) < min(self.config.jobs, len(pending)):
            self._spawn()
        while pending or any(w.busy for w in self._workers):
            for w in self._workers:
                if w.ready and not w.busy and pending:
                    w.op, w.started, w.cases = pending.popleft(), time.monotonic(), 0
                    w.cpu_started = cpu_seconds(w.proc.pid)  # idle since its last op: the op's baseline
                    w.conn.send(("explore", w.op, *self._args.get(w.op, ())))
            # Retire idle workers once nothing is left to hand out.
            if not pending:
                for w in [w for w in self._workers if w.ready and not w.busy]:
                    w.conn.send(None)
                    self._retire(w)
            now = time.monotonic()
            # CPU time grows no faster than wall time per thread: wake when the least CPU
            # left could be spent (or within CPU_POLL_S), or at the wall guard.
            deadlines = [now + min(CPU_POLL_S, max(0.0, self._limit(w) - self._used(w, now)))
                         for w in self._workers if w.busy]
            deadlines += [w.started + self._wall_limit(w) for w in self._workers if w.busy]
            deadlines += [w.born + STARTUP_TIMEOUT for w in self._workers if not w.ready]
            # capped: a far deadline (a tool's "no time limit") is more than the system's wait takes
            timeout = min(max(0.0, min(deadlines) - time.monotonic()), STARTUP_TIMEOUT) if deadlines else None
            waitables = [w.conn for w in self._workers] + [w.proc.sentinel for w in self._workers]
            ready = set(wait(waitables, timeout)) if waitables else set()
            for w in list(self._workers):
                if w.conn in ready or w.proc.sentinel in ready:
                    self._service(w, on_outcome)
            now = time.monotonic()
            if any(not w.ready and now - w.born >= STARTUP_TIMEOUT for w in self._workers):
                raise SweepError(f"a new worker did not load backend {self.config.backend!r} within "
                                 f"{STARTUP_TIMEOUT:g}s{self._loading()}")
            for w in [w for w in self._workers if w.busy]:
                used = self._used(w, now)
                if used >= self._limit(w):
                    # of CPU time, as --help says
                    reason = f"timeout after {self._limit(w):g}s{self._per_cases(w)}"
                elif now - w.started >= self._wall_limit(w):
                    reason = (f"timeout: no result after {self._wall_limit(w):g}s of wall time{self._per_cases(w)} "
                              f"(hung: {used:.1f}s of CPU time)")
                else:
                    continue
                self._failed(w, reason, now - w.started, on_outcome, timed_out=True)
                self._replace(w)

    def _limit(self, worker: _Worker) -> float:
        """The CPU seconds a busy worker's op is given: ``timeout`` per CASES_PER_TIMEOUT
        example calls (one ``timeout`` until the worker says how many it has)."""
        return self.config.timeout * limit_units(worker.cases)

    def _wall_limit(self, worker: _Worker) -> float:
        return self.config.wall_limit * limit_units(worker.cases)

    @staticmethod
    def _per_cases(worker: _Worker) -> str:
        """What a timeout's reason adds where the op was given more than one limit."""
        if limit_units(worker.cases) == 1:
            return ""
        return f" for {worker.cases} example calls (the limit per {CASES_PER_TIMEOUT})"

    @staticmethod
    def _used(worker: _Worker, now: float) -> float:
        """The CPU seconds a busy worker has spent on its op (wall seconds without /proc)."""
        if worker.cpu_started is None:
            return now - worker.started
        cpu = cpu_seconds(worker.proc.pid)  # None: the worker just died, which its sentinel reports
        return cpu - worker.cpu_started if cpu is not None else 0.0

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
            elif message[0] == "cases" and message[1] == worker.op:
                worker.cases = message[2]
            elif message[0] == "done" and message[1] == worker.op:
                self._finish(worker, message[2], message[3], on_outcome)
            elif message[0] == "out of memory" and message[1] == worker.op:
                # as an op killed by the kernel's out-of-memory killer: a second try in a
                # fresh worker, then the previous file kept (an allocation that failed
                # says nothing of the rules, which the explorer would drop as failing)
                self._failed(worker, message[2], message[3], on_outcome, timed_out=True)
                self._replace(worker)
                return
        # The worker is dead.
        worker.proc.join()
        if not worker.ready:
            self._handle_startup(worker, None)  # raises
        if worker.busy:
            # SIGKILL from outside (our own time limit kills from _retire, after _failed): the
            # kernel's out-of-memory killer, or someone's kill -9. The machine's doing, not the
            # op's, so it keeps its file as an op out of time does.
            killed = worker.proc.exitcode == -signal.SIGKILL
            reason = "killed by SIGKILL (out of memory, or another process)" if killed else describe_exit(
                worker.proc.exitcode)
            self._failed(worker, reason, time.monotonic() - worker.started, on_outcome, timed_out=killed)
        self._replace(worker)

    def _failed(self, worker: _Worker, reason: str, seconds: float, on_outcome, timed_out: bool = False) -> None:
        """The op of a worker that timed out or died: next in line for a second try, or,
        after one, recorded as failed."""
        if worker.op not in self._retried:
            self._retried[worker.op] = reason
            self._pending.appendleft(worker.op)
            worker.op = None
            return
        self._finish(worker, self._failure_result(self.backend_name, worker.op, reason), seconds, on_outcome,
                     timed_out)

    def _finish(self, worker: _Worker, record: OpRecord, seconds: float, on_outcome, timed_out: bool = False) -> None:
        op, worker.op = worker.op, None
        after = tuple(worker.history[-HISTORY:])
        worker.history.append(op)
        on_outcome(Outcome(op, record, seconds, after, self._retried.get(op, ""), timed_out))

    def _replace(self, worker: _Worker) -> None:
        self._retire(worker)
        if self._pending:  # no fresh worker (and framework start-up) for nothing to do
            self._spawn()
