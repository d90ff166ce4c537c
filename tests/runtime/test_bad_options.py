"""Bad options to ``parallelize`` fail before any work (capture, rule lookup, exploration:
seconds) with an error that names the option and its value and says what to pass.
Constraints are checked right after capture, before rule lookup, naming the user's key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from metaspmd import planner, runtime
from metaspmd.cache import RuleCache

pytestmark = pytest.mark.timeout(120)

SOLVERS = ", ".join(map(repr, planner.SOLVER_CHOICES))  # the planner's list, whatever it holds


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if parallelize gets as far as finding the mesh's runtime."""
    monkeypatch.setattr(runtime, "runtime_for", lambda mesh: pytest.fail("parallelize went past its option checks"))


@pytest.mark.parametrize("option,error,message", [
    ({"cache": "/tmp/rules"}, TypeError,
     (r"cache must be a metaspmd.cache.RuleCache or None, got a str '/tmp/rules': "
      r"pass metaspmd.cache.RuleCache\('/tmp/rules'\)")),
    ({"cache": Path("/tmp/rules")}, TypeError, r"cache must be a metaspmd.cache.RuleCache .* got a pathlib\..*Path"),
    ({"cache": False}, TypeError, r"cache must be a metaspmd.cache.RuleCache or None, got False: pass .*RuleCache\("),
    ({"cost_model": "fast"}, TypeError, r"cost_model must be a metaspmd.planner.CostModel or None, got a str 'fast'"),
    ({"solver": "bogus"}, ValueError, f"solver must be one of {re.escape(SOLVERS)}, got 'bogus'"),
    ({"solver": None}, ValueError, "solver must be one of .*, got None"),
    ({"memory_budget": 10**400}, ValueError, r"memory_budget must be a finite number > 0, got 10+\.\.\. \(401 characters\)"),
    ({"time_limit": 10**400}, ValueError, r"time_limit must be a finite number > 0, got 10+\.\.\. \(401 characters\)"),
    ({"time_limit": "10"}, TypeError, "time_limit must be a number or None, got '10'"),
    ({"backward": "no"}, TypeError, r"backward must be a bool .* got a str 'no'"),
    ({"backward": 0}, TypeError, r"backward must be a bool .* got an int 0"),
    ({"constraints": [("weight", ("S0",))]}, TypeError, r"constraints must be a dict .* got a list"),
])
def test_a_bad_option_is_named_before_any_work(no_work, option, error, message):
    # the checks are the core's: any mesh, any framework (the runtime is never reached)
    with pytest.raises(error, match=message):
        runtime.parallelize(lambda x: x, object(), (1.0,), **option)


def test_good_options_pass_the_checks(tmp_path):
    runtime.check_options((1.0,), 2**30, 5, solver=planner.SOLVER_CHOICES[-1], cache=RuleCache(tmp_path),
                          cost_model=planner.CostModel(planner.Mesh.of((4,), ("x",))), constraints={},
                          options={"backward": False, "loss_fn": None})
    runtime.check_options([1.0], None, None)  # every option left at its default


# --- torch: constraints, right after capture and before rule lookup ---

WORLD = 4


@pytest.fixture(scope="module")
def torch_world(fake_world_of):
    torch = pytest.importorskip("torch")
    fake_world_of(WORLD)
    return torch


@pytest.fixture
def no_lookup(monkeypatch):
    """Fails the test if parallelize looks rules up (the slow part: exploration)."""
    monkeypatch.setattr(runtime, "resolve", lambda *a, **k: pytest.fail("rules were looked up"))


def _parallelize(torch, constraints, mesh=None, **kw):
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.parallelize import parallelize

    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", mesh if mesh is not None else list(range(WORLD)))
        p = parallelize(model, mesh, (x,), constraints=constraints, **kw)
        out, _ = p(x)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    return p


def _constraint_error(torch, constraints, error, message, mesh=None):
    with pytest.raises(error, match=message):
        _parallelize(torch, constraints, mesh)


def test_an_unknown_key_is_refused_before_rule_lookup(torch_world, no_lookup):
    from torch.distributed.tensor import Shard

    _constraint_error(torch_world, {"wieght": (Shard(0),)}, KeyError,
                      r"^constraint on 'wieght': no such value \(inputs are 'weight', 'bias', 0, 'input 0', or name")


def test_a_parameter_named_like_a_node_and_a_number_input_are_answered_by_the_users_names(torch_world, tmp_path):
    """``placement("t")`` answered for the trace's transpose node ``t`` rather than the
    parameter ``t`` a constraint had pinned; a number input's name raised a bare KeyError."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard

    from metaspmd.backends.torch.parallelize import parallelize

    class Scaled(torch_world.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch_world.nn.Linear(8, 8)
            self.t = torch_world.nn.Parameter(torch_world.rand(8) + 0.5)

        def forward(self, x, scale):
            return self.fc(x) / self.t * scale

    model, x = Scaled(), torch_world.randn(8, 8)
    with LocalTensorMode(frozenset(range(WORLD))):
        p = parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (x, 2.0), cache=RuleCache(tmp_path),
                        constraints={"t": (Shard(0),)})
    assert "t" in {n.name for n in p.plan.nodes}  # the trace's own node of that name
    assert p.plan.placement("t") == (planner.Shard(0),)
    with pytest.raises(planner.PlannerError, match=r"^'input 1' is arg\d+_\d+, a number the trace holds as a "
                                                   r"constant: it has no placement$"):
        p.plan.placement("input 1")


def test_a_tied_weight_is_pinned_and_answered_by_either_of_its_names(torch_world, tmp_path):
    """named_parameters() lists a tied weight once, under its first name: the second
    (``dec.weight``, a state_dict key) was refused as naming nothing."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard

    from metaspmd.backends.torch.parallelize import parallelize

    class Tied(torch_world.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch_world.nn.Linear(16, 8, bias=False)
            self.dec = torch_world.nn.Linear(16, 8, bias=False)
            self.dec.weight = self.head.weight

        def forward(self, x):
            return self.head(x) + self.dec(x * 2)

    model, x = Tied(), torch_world.randn(8, 16)
    with LocalTensorMode(frozenset(range(WORLD))):
        p = parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (x,), cache=RuleCache(tmp_path),
                        constraints={"dec.weight": (Shard(1),)})
        out, grads = p(x)
    torch_world.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert p.plan.placement("dec.weight") == p.plan.placement("head.weight") == (planner.Shard(1),)


def test_an_input_is_pinned_by_its_position_or_by_the_name_the_plan_shows(torch_world):
    from torch.distributed.tensor import Replicate, Shard

    from metaspmd import planner

    p = _parallelize(torch_world, {"input 0": (Shard(0),), "weight": (Replicate(),)})
    assert p.plan.placement(0) == p.plan.placement("input 0") == (planner.Shard(0),)


def test_too_many_placements_name_the_key_and_the_mesh_axes(torch_world, no_lookup):
    from torch.distributed.tensor import Shard

    _constraint_error(torch_world, {"weight": (Shard(0), Shard(1))}, ValueError,
                      r"constraint on 'weight': 2 placements .* but the mesh has 1 axis: give one placement per mesh axis")


def test_one_placement_on_a_2d_mesh_is_refused_naming_the_key(torch_world, no_lookup):
    from torch.distributed.tensor import Shard

    _constraint_error(torch_world, {"weight": Shard(0)}, TypeError,
                      r"constraint on 'weight': one placement Shard\(dim=0\), but the mesh has 2 axes: "
                      "give one placement per mesh axis", mesh=[[0, 1], [2, 3]])


@pytest.mark.parametrize("value,error,message", [
    (lambda S: (S(2),), ValueError, r"constraint on 'weight': Shard\(dim=2\) names dim 2, but the value has shape \(8, 8\)"),
    (lambda S: (S(-3),), ValueError, r"constraint on 'weight': Shard\(dim=-3\) names dim -3, but the value has shape \(8, 8\)"),
    (lambda S: ("S0",), TypeError, r"constraint on 'weight': 'S0' is not a placement: pass Shard\(dim\), Replicate\(\)"),
    (lambda S: 0, TypeError, r"constraint on 'weight': expected a tuple of placements, one per mesh axis, got 0 of type int"),
])
def test_a_bad_placement_names_the_key(torch_world, no_lookup, value, error, message):
    from torch.distributed.tensor import Shard

    _constraint_error(torch_world, {"weight": value(Shard)}, error, message)


def test_a_negative_shard_dim_and_a_single_placement_on_a_1d_mesh_are_taken(torch_world, tmp_path):
    """DTensor's Shard(-1) is the last dim; one placement on a 1-D mesh is that axis's."""
    from torch.distributed.tensor import Shard

    from metaspmd import placement as mp

    p = _parallelize(torch_world, {"weight": (Shard(-1),), "bias": Shard(0)}, cache=RuleCache(tmp_path))
    weight, bias = (p.captured.ir.input_list[p.captured.param_names.index(n)].name for n in ("weight", "bias"))
    assert p.plan.placement(weight) == (mp.Shard(1),)
    assert p.plan.placement(bias) == (mp.Shard(0),)


@pytest.mark.parametrize("option,message", [
    ({"los_fn": None}, r"unknown option 'los_fn' \(did you mean 'loss_fn'\?\): on a torch\..*DeviceMesh it takes "
                       r"memory_budget, .*, backward, loss_fn$"),
    ({"params": {}}, r"unknown option 'params': on a torch\..*DeviceMesh it takes"),  # JAX's, not torch's
])
def test_an_option_the_meshs_runtime_does_not_take_is_named_with_those_it_does(torch_world, option, message):
    """It was the runtime class's own TypeError (TorchRuntime.__init__() got an unexpected
    keyword argument), naming an internal class and no option it takes."""
    from torch.distributed.device_mesh import DeviceMesh

    with pytest.raises(TypeError, match=message):
        runtime.parallelize(lambda x: x * 2, DeviceMesh("cpu", list(range(WORLD))), (torch_world.randn(4),), **option)
