"""The runtime backend interface: a numpy runtime (tests/fake_backend/runtime.py), written
against metaspmd.runtime alone, plans and runs a small graph through metaspmd.parallelize."""

import sys
from pathlib import Path

import numpy as np
import pytest

import metaspmd
from metaspmd.cache import RuleCache
from metaspmd.placement import Replicate
from metaspmd.runtime import runtime_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_backend.runtime import FakeMesh, NumpyRuntime, call  # noqa: E402


def mlp(x, w1, w2):
    return call("tanh", call("matmul", call("relu", call("matmul", x, w1)), w2))


def example(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((8, 16)), rng.standard_normal((16, 32)), rng.standard_normal((32, 16))


def test_the_mesh_type_picks_its_runtime():
    assert runtime_for(FakeMesh(4)) is NumpyRuntime
    with pytest.raises(TypeError, match="no runtime for a builtins.str mesh"):
        runtime_for("not a mesh")


def test_a_numpy_graph_is_planned_and_runs_sharded(tmp_path):
    """Under a budget that keeps the weights off every device whole, the plan cuts them;
    run on four simulated devices it gives the single-device result."""
    x, w1, w2 = example()
    whole = metaspmd.parallelize(mlp, FakeMesh(4), (x, w1, w2), cache=RuleCache(tmp_path))
    # every node explored live, the two matmuls (one signature) once
    assert (whole.stats.table, whole.stats.live, whole.stats.cache) == (0, 3, 1)
    weights = (w1.nbytes + w2.nbytes)
    cut = metaspmd.parallelize(mlp, FakeMesh(4), (x, w1, w2), cache=RuleCache(tmp_path), memory_budget=weights)
    assert cut.stats.cache == 4  # the second capture finds the explored rules cached
    placed = [cut.plan.placement(v.name) for v in cut.captured.ir.input_list[1:]]
    assert any(p != (Replicate(),) for p in placed), cut.plan.table()
    for planned in (whole, cut):
        np.testing.assert_allclose(planned(x, w1, w2), mlp(x, w1, w2), rtol=1e-10)
        other = example(1)  # the plan holds for any values of the captured shapes
        np.testing.assert_allclose(planned(*other), mlp(*other), rtol=1e-10)


def test_a_users_constraint_is_kept(tmp_path):
    """The first weight pinned to a row cut: the plan keeps it there, and still runs right."""
    from metaspmd.placement import Shard

    x, w1, w2 = example()
    p = metaspmd.parallelize(mlp, FakeMesh(4), (x, w1, w2), cache=RuleCache(tmp_path), constraints={1: (Shard(0),)})
    assert p.plan.placement("in1") == (Shard(0),)
    np.testing.assert_allclose(p(x, w1, w2), mlp(x, w1, w2), rtol=1e-10)
    with pytest.raises(KeyError, match="constraint on 'w9'"):
        metaspmd.parallelize(mlp, FakeMesh(4), (x, w1, w2), cache=RuleCache(tmp_path), constraints={"w9": (Shard(0),)})


def test_links_reach_the_planner_and_an_unknown_axis_is_refused_first(tmp_path, monkeypatch):
    """``links=`` prices the named axis as given; a name the mesh lacks fails before capture."""
    import metaspmd.runtime as runtime

    x, w1, w2 = example()
    seen = []
    real_plan = runtime.planner.plan
    monkeypatch.setattr(runtime.planner, "plan", lambda ir, s, mesh, **kw: seen.append(mesh) or real_plan(ir, s, mesh, **kw))
    p = metaspmd.parallelize(mlp, FakeMesh(4), (x, w1, w2), cache=RuleCache(tmp_path), links={"x": (1e-5, 2e9)})
    assert (seen[0].axes[0].alpha, seen[0].axes[0].beta) == (1e-5, 1 / 2e9)
    np.testing.assert_allclose(p(x, w1, w2), mlp(x, w1, w2), rtol=1e-10)
    captured = []
    monkeypatch.setattr(NumpyRuntime, "capture", lambda *a: captured.append(a))
    with pytest.raises(ValueError, match="links: no mesh axis named 'pp'"):
        metaspmd.parallelize(mlp, FakeMesh(4), (x, w1, w2), cache=RuleCache(tmp_path), links={"pp": (0, 1e9)})
    assert captured == []
