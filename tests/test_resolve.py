"""Live exploration of a graph's table misses: several calls explored at once on threads
give the entries that one at a time gives."""

import sys
import threading
from pathlib import Path

import pytest

from metaspmd.cache import RuleCache
from metaspmd.case import OpCase
from metaspmd.ir import MetaIR, MetaOp, MetaVar
from metaspmd.registry_io import dump_record
from metaspmd.resolve import NodeCall, resolve
from metaspmd.rules import make_record

np = pytest.importorskip("numpy")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_backend.numpy_ops import NumpyOps

RAN_ON: set[str] = set()  # the threads the ops ran on


def add(a, b):
    RAN_ON.add(threading.current_thread().name)
    return np.add(a, b)


def values(*shapes) -> tuple:
    rng = np.random.default_rng(0)  # the same example values on every exploration
    return tuple(rng.standard_normal(shape) for shape in shapes)


x, w, v = MetaVar("x", (6, 4)), MetaVar("w", (4, 5)), MetaVar("v", (6, 4))
y, s, t = MetaVar("y", (6, 5)), MetaVar("s", (6, 4)), MetaVar("t", (4,))
IR = MetaIR((x, w, v), (
    MetaOp("mm", "matmul", (x, w), {}, (y,)),
    MetaOp("add", "add", (x, v), {}, (s,)),
    MetaOp("sum", "sum", (s,), {}, (t,)),
    MetaOp("add_again", "add", (x, v), {}, (MetaVar("s2", (6, 4)),)),  # the same call: explored once
), (y, t))
CALLS = {
    "matmul": NodeCall("self:f[*,*] other:f[*,*]", None, lambda: OpCase(
        "matmul", np.matmul, values((6, 4), (4, 5)), {}, ("self", "other"))),
    "add": NodeCall("self:f[*,*] other:f[*,*]", None, lambda: OpCase(
        "add", add, values((6, 4), (6, 4)), {}, ("self", "other"))),
    "sum": NodeCall("self:f[*,*] axis=0", None, lambda: OpCase(
        "sum", np.sum, values((6, 4)), {"axis": 0}, ("self",))),
}


def entries(cache: RuleCache) -> dict[str, str]:
    return {op: dump_record(make_record(op, "numpy", [cache.get("numpy", op, call.signature)]))
            for op, call in CALLS.items()}


def test_threads_explore_the_same_entries_as_one_at_a_time(tmp_path):
    found = {}
    for threads in (1, 3):
        RAN_ON.clear()
        cache = RuleCache(tmp_path / str(threads))
        strategies, stats = resolve(IR, lambda node: CALLS[node.op], NumpyOps(), "numpy", cache, threads=threads)
        assert (stats.live, stats.cache, len(stats.live_seconds)) == (3, 1, 3)
        assert strategies["add"] == strategies["add_again"] and strategies["mm"]
        found[threads] = (strategies, entries(cache))
        assert (RAN_ON == {threading.current_thread().name}) == (threads == 1), RAN_ON
    assert found[1] == found[3]


def unbind_rows(a):
    return list(a)


def unbind_call(rows: int) -> NodeCall:
    return NodeCall("self:f[*,*]", None, lambda: OpCase("unbind", unbind_rows, values((rows, 3)), {}, ("self",)),
                    pieces=rows)


def test_calls_of_one_signature_split_into_other_numbers_of_pieces_have_entries_of_their_own(tmp_path):
    """Two unbinds of one signature, of 4 rows and of 6: each node gets rules of its own
    number of outputs, and a second run finds both in the cache (one file held only the
    last written, so every run explored the other again)."""
    a, b = MetaVar("a", (4, 3)), MetaVar("b", (6, 3))
    ir = MetaIR((a, b), (
        MetaOp("four", "unbind", (a,), {}, tuple(MetaVar(f"a{i}", (3,)) for i in range(4))),
        MetaOp("six", "unbind", (b,), {}, tuple(MetaVar(f"b{i}", (3,)) for i in range(6))),
    ), ())
    calls = {"four": unbind_call(4), "six": unbind_call(6)}
    for run, (live, cached) in enumerate([(2, 0), (0, 2)]):
        strategies, stats = resolve(ir, lambda node: calls[node.name], NumpyOps(), "numpy", RuleCache(tmp_path))
        assert (stats.live, stats.cache) == (live, cached), run
        assert strategies["four"] and {len(s.outputs) for s in strategies["four"]} == {4}
        assert strategies["six"] and {len(s.outputs) for s in strategies["six"]} == {6}


def tril_exp(a):
    return np.tril(np.exp(a))  # nonlinear: no Partial input either


def broken(a):
    raise RuntimeError("this kernel is broken")


def test_stats_tell_a_verified_replicate_only_node_from_one_with_no_rule(tmp_path):
    """A square matrix's lower triangle (of its exponential) holds no cut (explored: a verified answer, said as
    such), an op that raises on every call has no rule at all: the stats name them apart."""
    m, lower, out = MetaVar("m", (5, 5)), MetaVar("lower", (5, 5)), MetaVar("out", (5, 5))
    ir = MetaIR((m,), (MetaOp("tril", "tril", (m,), {}, (lower,)),
                       MetaOp("broken", "broken", (lower,), {}, (out,))), (out,))
    calls = {"tril": NodeCall("m:f[*,*]", None, lambda: OpCase("tril", tril_exp, values((5, 5)), {}, ("m",))),
             "broken": NodeCall("a:f[*,*]", None, lambda: OpCase("broken", broken, values((5, 5)), {}, ("a",)))}
    with pytest.warns(UserWarning):  # the broken op's failure is said when it is explored
        strategies, stats = resolve(ir, lambda node: calls[node.name], NumpyOps(), "numpy", RuleCache(tmp_path))
    assert strategies["tril"] == () and strategies["broken"] == ()
    assert list(stats.replicate_only) == ["tril"] and list(stats.unexplorable) == ["broken"], stats
    assert "1 replicated (no cut holds), 1 replicated (no rule)" in str(stats)
