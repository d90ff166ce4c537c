"""Run work in a forked child process, so that a kernel that crashes (segfault, SIGFPE,
abort) or hangs takes down only the child.

The sweep explores every op in worker processes. At runtime, an op the tables lack is
explored on the model's own shapes, where shards no sample tried can reach a kernel's
unchecked corner: torch 2.13's CPU flash attention divides by zero (SIGFPE) when the
query has fewer heads than the key. A forked child shares the recorded values without
pickling them; one child serves all the tasks known when it forks, since a fork of a
process holding torch and a model costs tens of milliseconds.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import pickle
import signal
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping

from .sweep.failures import clean_reason, describe_exit
from .sweep.config import wall_limit
from .sweep.workers import CPU_POLL_S, cpu_seconds, exit_with_parent


class ChildFailed(Exception):
    """The child process crashed, hung past its time limit, or raised; says which."""

    def __init__(self, reason: str, crashed: bool = False, timed_out: bool = False):
        super().__init__(reason)
        self.crashed = crashed  # killed by a signal or an exit, not a time limit or an exception
        self.timed_out = timed_out


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


@dataclass(frozen=True)
class Isolation:
    """Each task in a forked child with a time limit. ``setup`` runs first in each child:
    a framework that used a thread pool before the fork must not use it after (torch's
    OpenMP pool hangs a forked child).

    As in the sweep, ``timeout`` counts the child's CPU time, so a task slowed by a loaded
    machine gets the time it needs; a task that burns none (asleep, blocked) is stopped
    after ``wall_timeout`` seconds of wall time (None: ``WALL_FACTOR * timeout``). Without
    /proc (not Linux) ``timeout`` counts wall time."""

    timeout: float
    setup: Callable[[], None] | None = None
    wall_timeout: float | None = None

    @property
    def wall_limit(self) -> float:
        return wall_limit(self.timeout, self.wall_timeout)

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` computed in a child of its own; its value must pickle."""
        with ForkServer({0: fn}, self) as server:
            return server.run(0)


class ForkServer:
    """One forked child that runs, by key, tasks known before the fork, one at a time. A
    task that crashes or hangs the child raises ChildFailed; the next task forks a fresh
    child from the parent, which still holds everything the tasks need."""

    def __init__(self, tasks: Mapping[Hashable, Callable[[], Any]], isolation: Isolation):
        self.tasks, self.isolation = dict(tasks), isolation
        self._child = self._conn = None

    def run(self, key: Hashable) -> Any:
        if self._child is None:
            self._start()
        self._conn.send_bytes(pickle.dumps(key))
        self._await_answer()
        try:
            kind, value = pickle.loads(self._conn.recv_bytes())
        except EOFError:  # the child died before it could answer
            raise ChildFailed(describe_exit(self._stop()), crashed=True) from None
        if kind == "raised":
            raise ChildFailed(f"raised {value}")
        return value

    def _await_answer(self) -> None:
        """Returns once the child has answered or died; stops it at the time limits."""
        limits = self.isolation
        started, cpu_started = time.monotonic(), cpu_seconds(self._child.pid)
        while True:
            now = time.monotonic()
            cpu_now = cpu_seconds(self._child.pid) if cpu_started is not None else None
            used = now - started if cpu_now is None else cpu_now - cpu_started  # gone: wall, as without /proc
            if used >= limits.timeout:
                reason = f"timed out after {limits.timeout:g} s of CPU time"
            elif now - started >= limits.wall_limit:
                reason = f"timed out: no answer after {limits.wall_limit:g} s of wall time (hung: {used:.1f} s of CPU time)"
            else:
                # CPU time grows no faster than wall time on one thread: wake when the CPU
                # left could be spent (or within CPU_POLL_S), or at the wall guard
                wait = min(CPU_POLL_S, limits.timeout - used, started + limits.wall_limit - now)
                if self._conn.poll(max(0.0, wait)):
                    return
                continue
            self._stop()
            raise ChildFailed(reason, timed_out=True)

    def close(self) -> None:
        if self._child is not None:
            try:
                self._conn.send_bytes(pickle.dumps(None))
                self._child.join(timeout=5)
            except OSError:
                pass
            self._stop()

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and self._child is not None:
            self._stop()  # Ctrl-C or an error mid-task: the child may be busy, not waiting to be told
        else:
            self.close()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child_end = ctx.Pipe()
        self._child = ctx.Process(target=_serve, args=(child_end, self.tasks, self.isolation.setup), daemon=True)
        with warnings.catch_warnings():
            # JAX, once started in this process, warns at any fork that its threads may
            # deadlock the child. The child runs only these tasks, which never enter JAX
            # (the torch runtime isolates torch ops; JAX explores in process).
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
            self._child.start()
        child_end.close()

    def _stop(self) -> int | None:
        if self._child.is_alive():
            self._child.kill()
        self._child.join()
        self._conn.close()
        code = self._child.exitcode
        self._child = self._conn = None
        return code


_CRASH_SIGNALS = tuple(getattr(signal, name) for name in ("SIGSEGV", "SIGFPE", "SIGABRT", "SIGBUS", "SIGILL")
                       if hasattr(signal, name))


def _serve(conn, tasks: dict, setup: Callable[[], None] | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C, and stops the child itself
    # A crash is the parent's to report, in one line: no stack dumps from faulthandler or
    # from handlers a library installed in the parent (CBC's prints a page per crash).
    faulthandler.disable()
    for crash in _CRASH_SIGNALS:
        signal.signal(crash, signal.SIG_DFL)
    exit_with_parent()  # a parent killed outright must not leave a hung task running
    if setup is not None:
        setup()
    while True:
        try:
            key = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if key is None:
            return
        try:  # plain pickle: the pipe's own would hand torch tensors over as shared memory
            answer = pickle.dumps(("value", tasks[key]()))
        except Exception as e:
            answer = pickle.dumps(("raised", f"{type(e).__name__}: {clean_reason(str(e))}\n{traceback.format_exc()}"))
        conn.send_bytes(answer)
