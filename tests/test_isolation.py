"""Work run in a forked child: a crash, a hang or an exception there fails that task
alone, and live exploration survives an op that crashes on some of its shards."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from metaspmd.isolation import ChildFailed, ForkServer, Isolation, can_fork

np = pytest.importorskip("numpy")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_backend.numpy_ops import NumpyOps  # noqa: E402

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs os.fork")
ISOLATION = Isolation(timeout=10.0)


def _crash():
    os.kill(os.getpid(), signal.SIGSEGV)


def test_each_task_fails_alone_and_the_next_one_gets_a_fresh_child():
    parent = os.getpid()
    tasks = {"pid": os.getpid, "crash": _crash, "raise": lambda: 1 / 0, "value": lambda: np.arange(4) * 2}
    with ForkServer(tasks, ISOLATION) as server:
        first = server.run("pid")
        assert first != parent and server.run("pid") == first  # one child serves both
        with pytest.raises(ChildFailed, match="SIGSEGV") as crashed:
            server.run("crash")
        assert crashed.value.crashed
        with pytest.raises(ChildFailed, match="raised ZeroDivisionError") as raised:
            server.run("raise")
        assert not raised.value.crashed
        np.testing.assert_array_equal(server.run("value"), np.arange(4) * 2)
        assert server.run("pid") not in (parent, first)


def _spin():
    while True:
        pass


def test_a_task_that_spins_is_stopped_at_its_limit_of_cpu_time():
    start = time.perf_counter()
    with pytest.raises(ChildFailed, match=r"timed out after 0\.5 s of CPU time") as hung:
        Isolation(timeout=0.5).run(_spin)
    assert hung.value.timed_out and not hung.value.crashed and time.perf_counter() - start < 10


def test_a_task_that_hangs_asleep_is_stopped_by_the_wall_clock_guard():
    start = time.perf_counter()
    with pytest.raises(ChildFailed, match=r"no answer after 1 s of wall time \(hung: 0\.\d s of CPU time\)") as hung:
        Isolation(timeout=0.5, wall_timeout=1.0).run(lambda: time.sleep(60))
    assert hung.value.timed_out and time.perf_counter() - start < 10


def test_a_task_slowed_past_its_limit_in_wall_time_but_not_in_cpu_time_finishes():
    """A loaded machine stretches wall time, not CPU time: live exploration must not give
    up an op there that it explores on a quiet machine (simulated by sleeping)."""
    def slowed():
        time.sleep(1.5)
        return "done"

    assert Isolation(timeout=0.5, wall_timeout=30.0).run(slowed) == "done"


def test_an_interrupted_task_stops_its_child_at_once():
    """Ctrl-C during live exploration waited 5 s for the busy child to take its stop."""
    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    start = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            with ForkServer({"sleep": lambda: time.sleep(30)}, Isolation(timeout=60.0)) as server:
                server.run("sleep")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.perf_counter() - start < 3


def _add_same_shapes(x, y):
    # like a kernel that trusts its shapes: a shard of one input alone crashes the process
    if x.shape != y.shape:
        os.kill(os.getpid(), signal.SIGFPE)
    return x + y


@pytest.mark.slow  # a fresh child per crashing shard, 10 s; the runtime's crash test runs in the default job
def test_live_exploration_finds_the_rules_of_an_op_that_crashes_on_some_shards(tmp_path):
    from metaspmd.cache import RuleCache
    from metaspmd.case import OpCase
    from metaspmd.ir import MetaIR, MetaOp, MetaVar
    from metaspmd.resolve import NodeCall, resolve

    x, y = MetaVar("x", (6, 4)), MetaVar("y", (6, 4))
    ir = MetaIR((x, y), (MetaOp("add", "add_same_shapes", (x, y), {}, (MetaVar("out", (6, 4)),)),), ())
    values = (np.random.randn(6, 4), np.random.randn(6, 4))
    call = NodeCall("x:f[*,*] y:f[*,*]", None, lambda: OpCase("add_same_shapes", _add_same_shapes, values, {}, ("x", "y")))
    strategies, stats = resolve(ir, lambda op: call, NumpyOps(), "numpy", RuleCache(tmp_path), isolation=ISOLATION)
    assert stats.live == 1 and not stats.unexplorable
    cuts = {tuple(s.inputs) for s in strategies["add"]}
    assert len(cuts) >= 2  # each dim of both inputs, cut alike


def _crash_or_hang_on_shards(x, y):
    if x.shape != y.shape or x.shape[0] < 6:  # a shard of one input alone, or rows cut: crashes
        os.kill(os.getpid(), signal.SIGFPE)
    if x.shape[1] < 4:  # columns cut: hangs
        time.sleep(60)
    return x + y


def test_after_a_crash_the_first_call_that_hangs_ends_the_exploration(tmp_path):
    """Explored again call by call after a crash, an op that also hangs costs one time
    limit, not one per hanging call, and stays replicated: its checks were cut short."""
    from metaspmd.cache import RuleCache
    from metaspmd.case import OpCase
    from metaspmd.ir import MetaIR, MetaOp, MetaVar
    from metaspmd.resolve import LiveExplorationWarning, NodeCall, resolve

    x, y = MetaVar("x", (6, 4)), MetaVar("y", (6, 4))
    ir = MetaIR((x, y), (MetaOp("add", "crash_or_hang", (x, y), {}, (MetaVar("out", (6, 4)),)),), ())
    values = (np.random.randn(6, 4), np.random.randn(6, 4))
    call = NodeCall("x:f[*,*] y:f[*,*]", None, lambda: OpCase("crash_or_hang", _crash_or_hang_on_shards, values, {},
                                                               ("x", "y")))
    start = time.perf_counter()
    with pytest.warns(LiveExplorationWarning, match=r"crash_or_hang \(node add\): live exploration failed.*timed out"):
        strategies, stats = resolve(ir, lambda op: call, NumpyOps(), "numpy", RuleCache(tmp_path),
                                    isolation=Isolation(timeout=1.0, wall_timeout=1.0))
    assert time.perf_counter() - start < 8  # one limit (1 s) and the forks, not a limit per hanging call
    assert strategies["add"] == () and "no answer after 1 s of wall time" in stats.unexplorable["add"]
    assert not list(tmp_path.rglob("*.yaml"))  # a failure is not cached: the next run explores again


_KILLED_PARENT = """
import sys, time
from metaspmd.isolation import ForkServer, Isolation

def beat():
    for _ in range(600):
        with open(sys.argv[1], "a") as f:
            f.write(".")
        time.sleep(0.1)

with ForkServer({0: beat}, Isolation(timeout=600)) as server:
    server.run(0)
"""


def test_a_hung_task_stops_when_its_parent_is_killed(outlives_killed_parent):
    assert not outlives_killed_parent(_KILLED_PARENT), "the hung task outlived its killed parent"
