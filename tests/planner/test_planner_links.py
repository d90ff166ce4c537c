"""Per-axis links (``Mesh.with_links``, ``parallelize(links=...)``): a slow axis is priced as
slow, the planner moves traffic off it, and a bad link is refused by name."""

import pytest

from metaspmd.planner import Mesh, Replicate, build_problem, evaluate, plan
from metaspmd.planner.synthetic import mlp

pytest.importorskip("mip")

R = Replicate()
MIB = 2**20
PINNED = {"mm2": (R, R)}


def test_a_named_axis_gets_its_link_and_the_others_keep_theirs():
    mesh = Mesh.of((2, 4), ("dp", "tp")).with_links({"dp": (10e-6, 25e9)})
    dp, tp = mesh.axes
    assert (dp.alpha, dp.beta) == (10e-6, 1 / 25e9)
    assert tp == Mesh.of((2, 4), ("dp", "tp")).axes[1]
    assert Mesh.of(4).with_links(None) == Mesh.of(4)


@pytest.mark.parametrize("links,message", [
    ({"pp": (0, 1e9)}, "no mesh axis named 'pp'"),
    ({"dp": (0, 0)}, "bytes per second > 0"),
    ({"dp": (-1, 1e9)}, ">= 0"),
    ({"dp": (0, float("inf"))}, "finite"),
    ({"dp": 25e9}, "expected (seconds per message, bytes per second)"),
    ({"dp": (1e-6, 10**400)}, "both finite; got (1e-06, 100000000000000000...0000000000000000000)"),  # not 401 digits
])
def test_a_bad_link_is_refused_by_name(links, message):
    with pytest.raises(ValueError, match=r"links.*" + message.replace("(", r"\(").replace(")", r"\)")):
        Mesh.of((2, 2), ("dp", "tp")).with_links(links)


def test_links_that_are_no_dict_are_refused_not_read_as_letters():
    with pytest.raises(TypeError, match=r"links must be a dict .* got 'fast': write \{'dp': \(10e-6, 25e9\)\}"):
        Mesh.of((2, 2), ("dp", "tp")).with_links("fast")


def test_the_planner_moves_traffic_off_a_slow_axis():
    ir, strategies = mlp(64, 1024, 4096)
    fast = Mesh.of((2, 2), ("a", "b"))
    slow = fast.with_links({"a": (5e-6, 1e6)})  # 1 MB/s: any bulk transfer on "a" dominates
    on_fast = plan(ir, strategies, fast, memory_budget=16 * MIB, output_placements=PINNED)
    on_slow = plan(ir, strategies, slow, memory_budget=16 * MIB, output_placements=PINNED)
    # the fast mesh's plan, run where "a" is slow, costs far more than the plan made for it
    same_labels = {n: on_fast.strategy(n).label for n in ("x", "w1", "mm1", "relu", "w2", "mm2")}
    kept = evaluate(build_problem(ir, strategies, slow, memory_budget=16 * MIB, output_placements=PINNED), same_labels)
    assert on_slow.memory <= 16 * MIB
    assert on_slow.total_cost < 0.6 * kept.total_cost
