"""A backend for sweep tests: numpy ops that explore cleanly, and ops that misbehave in
every way a real framework can (raise, hang, segfault, abort, exit).

Loaded by module name (``--backend fake_backend``) in the sweep's worker processes, so
it must be importable from the tests folder.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import numpy as np
import tqdm

from metaspmd.case import NoSample, OpCase, Skip
from metaspmd.explorer import explore_op as _explore_op

from .numpy_ops import NumpyOps


def _arrays(seed: int, *shapes) -> tuple:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s) for s in shapes)


def _case(op: str, fn, shapes, arg_names, **kwargs) -> OpCase:
    return OpCase(
        op=op, fn=fn, args=_arrays(0, *shapes), kwargs=kwargs, arg_names=arg_names,
        fresh=lambda seed: (_arrays(seed + 1, *shapes), dict(kwargs)),
    )


def _raise():
    raise ValueError("no kernel for this dtype")


def _report_threads():
    raise ValueError(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")


def _hang():
    # A disabled progress bar first, as torch.fx's Interpreter opens: its lock must not leak
    # when the worker is killed.
    tqdm.tqdm(disable=True).close()
    # a beat every 0.1 s into $FAKE_HANG_BEATS, if set: tests see whether the hung worker lives on
    beats = os.environ.get("FAKE_HANG_BEATS")
    for _ in range(36000):
        if beats:
            with open(beats, "a") as f:
                f.write(".")
        time.sleep(0.1)


def _once():
    # With $FAKE_ONCE_MARK set, crashes its worker the first time (leaving the mark), as a
    # worker killed for memory on a loaded machine would; then explores like fake.add.
    mark = os.environ.get("FAKE_ONCE_MARK")
    if mark and not os.path.exists(mark):
        open(mark, "w").close()
        os.kill(os.getpid(), signal.SIGSEGV)
    return [_case("fake.once", np.add, [(4, 6), (4, 6)], ("self", "other"))]


def _spin():
    # A CPU-bound hang: only the CPU-time limit stops it.
    while True:
        pass


def _busy(cpu_seconds: float):
    # Burns this much CPU time, then explores like fake.add: on a loaded machine it takes
    # longer in wall time, never in CPU time.
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        pass
    return [_case("fake.busy", np.add, [(4, 6), (4, 6)], ("self", "other"))]


def _many():
    # 45 example calls (fake.add at 45 lengths): a sweep gives it three times the limit
    # (config.limit_units), which explore_op below spends burning $FAKE_MANY_S of CPU first.
    return [_case("fake.many", np.add, [(4, n), (4, n)], ("self", "other")) for n in range(2, 47)]


def _nap():
    # Waits $FAKE_NAP_S seconds of wall time (default 2), burning no CPU, as an op starved
    # of CPU on a loaded machine does; then explores like fake.add.
    time.sleep(float(os.environ.get("FAKE_NAP_S", "2")))
    return [_case("fake.nap", np.add, [(4, 6), (4, 6)], ("self", "other"))]


def _killed():
    # As the kernel's out-of-memory killer ends a worker: the machine's doing, not the op's.
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)


def _orphan():
    # Starts a process that beats into $FAKE_ORPHAN_BEATS every 0.1 s, then hangs: the
    # time limit kills the worker, and its process must go with it.
    beat = "import sys, time\nwhile True:\n    open(sys.argv[1], 'a').write('.')\n    time.sleep(0.1)\n"
    subprocess.Popen([sys.executable, "-c", beat, os.environ["FAKE_ORPHAN_BEATS"]])
    time.sleep(3600)


def _oom():
    # fake.add whose runs fail to allocate after $FAKE_OOM_AFTER of them (default 20), in
    # torch's allocator's words: a machine short of memory, mid-verification.
    after, runs = int(os.environ.get("FAKE_OOM_AFTER", "20")), [0]

    def add(a, b):
        runs[0] += 1
        if runs[0] > after:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 192 bytes")
        return np.add(a, b)

    return [_case("fake.oom", add, [(4, 6), (4, 6)], ("self", "other"))]


def _segfault():
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(10)


# op -> what cases(op) does. Explorable ops return their cases; the rest misbehave.
_OPS = {
    "fake.add": lambda: [_case("fake.add", np.add, [(4, 6), (4, 6)], ("self", "other"))],
    "fake.matmul": lambda: [_case("fake.matmul", np.matmul, [(4, 6), (6, 8)], ("self", "other"))],
    "fake.sum": lambda: [_case("fake.sum", np.sum, [(6, 4)], ("self",), axis=0)],
    "fake.nosample": lambda: (_ for _ in ()).throw(NoSample("no sample input")),
    "fake.skipped": lambda: (_ for _ in ()).throw(Skip("skipped", "in-place variant")),
    "fake.random": lambda: [OpCase("fake.random", lambda x: x + np.random.random(x.shape), _arrays(0, (4,)),
                                   arg_names=("self",), deterministic=False)],
    "fake.raise": _raise,
    "fake.threads": _report_threads,  # its failure reason shows the worker's thread limit
    "fake.escape": lambda: [],  # explore_op below raises for it
    "fake.exit": lambda: sys.exit(3),
    "fake.interrupt": lambda: (_ for _ in ()).throw(KeyboardInterrupt()),
    "fake.hang": _hang,
    "fake.segv": _segfault,
    "fake.once": _once,
    "fake.abort": os.abort,
}

# Listed only with the backend option slow=1: the time-limit and kill tests' ops.
_SLOW_OPS = {
    "fake.spin": _spin,
    "fake.busy": lambda: _busy(float(os.environ.get("FAKE_BUSY_S", "1"))),
    "fake.nap": _nap,
    "fake.many": _many,
    "fake.killed": _killed,
    "fake.oom": _oom,
    "fake.orphan": _orphan,
}


class FakeBackend:
    name = "fake"

    def __init__(self, prepare_seconds: float = 0.0, slow: bool = False):
        self.prepare_seconds = prepare_seconds
        self.ops = {**_OPS, **(_SLOW_OPS if slow else {})}

    def prepare(self) -> None:
        """Slow one-time set-up, which must not count against any op's time limit."""
        time.sleep(self.prepare_seconds)

    def tensor_ops(self) -> NumpyOps:
        return NumpyOps()

    def list_ops(self) -> list[str]:
        return sorted(self.ops)

    def cases(self, op: str):
        return self.ops[op]()


def get_backend(fail: str = "", prepare_seconds: str = "0", slow: str = "") -> FakeBackend:
    if fail:
        raise RuntimeError(f"cannot start: {fail}")
    return FakeBackend(float(prepare_seconds), slow=bool(slow))


def explore_op(backend, op):
    """The real explorer, except that 'fake.escape' raises out of it (an explorer bug), in
    colour where FAKE_COLOUR is set, and the op FAKE_UNWRITABLE names gets a reason with a
    bell in it, which no rule file may hold."""
    if op == "fake.escape":
        colour = ("\x1b[31m", "\x1b[0m") if os.environ.get("FAKE_COLOUR") else ("", "")
        raise RuntimeError(f"{colour[0]}explorer bug{colour[1]} at 0x7f3a2b1c9d40 in /opt/somewhere/explorer.py\n"
                           "second line")
    if op == os.environ.get("FAKE_UNWRITABLE"):
        return dataclasses.replace(_explore_op(backend, op), reason="rings a bell \a")
    if op == "fake.many":  # its calls counted first (the sweep's worker reports them), then the work
        backend.cases(op)
        end = time.process_time() + float(os.environ.get("FAKE_MANY_S", "0"))
        while time.process_time() < end:
            pass
    return _explore_op(backend, op)
