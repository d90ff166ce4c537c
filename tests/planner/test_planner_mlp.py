"""The 2-layer MLP y = relu(x @ w1) @ w2: the planner rediscovers Megatron under a memory
budget and data parallelism with a large batch, and never loses to hand-written plans."""

import itertools

import pytest

from metaspmd.planner import Mesh, Replicate, Shard, build_problem, evaluate, make_plan, plan
from metaspmd.planner.reduce import Reductions
from metaspmd.planner.synthetic import mlp

pytest.importorskip("mip")

R = Replicate()
MIB = 2**20
MESH = Mesh.of(4)
DIM, HIDDEN = 1024, 4096  # each weight is 16 MiB in float32

MEGATRON = {"x": "R", "w1": "S(1)", "mm1": "S3", "relu": "S2", "w2": "S(0)", "mm2": "S2"}
DATA_PARALLEL = {"x": "S(0)", "w1": "R", "mm1": "S1", "relu": "S1", "w2": "R", "mm2": "S1"}
FSDP = {"x": "S(0)", "w1": "S(0)", "mm1": "S1", "relu": "S1", "w2": "S(0)", "mm2": "S1"}


def test_memory_budget_gives_megatron_with_one_all_reduce():
    ir, strategies = mlp(64, DIM, HIDDEN)
    result = plan(ir, strategies, MESH, memory_budget=16 * MIB, output_placements={"mm2": (R,)})
    assert result.placement("w1") == (Shard(1),)  # column parallel
    assert result.placement("w2") == (Shard(0),)  # row parallel
    assert result.placement("x") == (R,)
    assert result.collectives() == ["all-reduce@d0"]
    assert result.memory <= 16 * MIB
    assert result.status == "optimal"


def test_large_batch_without_budget_gives_data_parallelism():
    ir, strategies = mlp(8192, DIM, HIDDEN)
    result = plan(ir, strategies, MESH)
    assert result.placement("x") == (Shard(0),)
    assert result.placement("w1") == (R,) and result.placement("w2") == (R,)
    assert [result.strategy(n).label for n in ("mm1", "relu", "mm2")] == ["S1", "S1", "S1"]
    assert result.comm_cost == 0.0


@pytest.mark.parametrize("batch,budget", [(64, 16 * MIB), (64, None), (8192, None), (8192, 100 * MIB)])
def test_plan_never_loses_to_hand_written_plans(batch, budget):
    ir, strategies = mlp(batch, DIM, HIDDEN)
    problem = build_problem(ir, strategies, MESH, memory_budget=budget, output_placements={"mm2": (R,)})
    result = plan(ir, strategies, MESH, memory_budget=budget, output_placements={"mm2": (R,)})
    fits = 0
    for labels in (MEGATRON, DATA_PARALLEL, FSDP):
        hand = evaluate(problem, labels)
        if budget is None or hand.memory <= budget:
            fits += 1
            assert result.total_cost <= hand.total_cost * (1 + 1e-9)
    assert fits >= 1


def test_fsdp_pays_weight_all_gathers_and_saves_memory():
    ir, strategies = mlp(64, DIM, HIDDEN)
    problem = build_problem(ir, strategies, MESH)
    fsdp, dp = evaluate(problem, FSDP), evaluate(problem, DATA_PARALLEL)
    assert sorted(fsdp.collectives()) == ["all-gather@d0", "all-gather@d0"]
    assert fsdp.memory < dp.memory - 20 * MIB


@pytest.mark.parametrize("budget", [None, 0.1 * MIB, 0.13 * MIB])  # all-Replicate peaks at 0.160 MiB
def test_ilp_equals_brute_force_over_every_plan(budget):
    ir, strategies = mlp(16, 64, 256)
    problem = build_problem(ir, strategies, Mesh.of(2), memory_budget=budget)
    cp = problem.choice
    best = min(
        (cp.evaluate(a) for a in itertools.product(*(range(n.size) for n in cp.nodes)) if cp.feasible(a)),
    )
    for reductions in (Reductions.none(), Reductions()):
        result = plan(ir, strategies, Mesh.of(2), memory_budget=budget, reductions=reductions)
        assert result.total_cost == pytest.approx(best, rel=1e-9)


def test_beam_finds_a_feasible_plan_no_cheaper_than_the_ilp():
    ir, strategies = mlp(64, DIM, HIDDEN)
    ilp = plan(ir, strategies, MESH, memory_budget=16 * MIB)
    beam = plan(ir, strategies, MESH, memory_budget=16 * MIB, solver="beam", reductions=Reductions.none())
    assert beam.memory <= 16 * MIB
    assert beam.total_cost >= ilp.total_cost * (1 - 1e-12)


def test_two_axis_mesh_plan_beats_hand_written_hybrid():
    mesh = Mesh.of((2, 2), ("dp", "tp"))
    ir, strategies = mlp(4096, DIM, HIDDEN)
    problem = build_problem(ir, strategies, mesh, memory_budget=64 * MIB)
    result = plan(ir, strategies, mesh, memory_budget=64 * MIB)
    hybrid = evaluate(problem, {"x": "S(0),R", "w1": "R,S(1)", "mm1": "S1,S3", "relu": "S1,S2",
                                "w2": "R,S(0)", "mm2": "S1,S2"})
    assert hybrid.memory <= 64 * MIB
    assert result.memory <= 64 * MIB
    assert result.total_cost <= hybrid.total_cost * (1 + 1e-9)


def test_plan_table_lists_every_node_and_the_totals():
    ir, strategies = mlp(64, DIM, HIDDEN)
    result = plan(ir, strategies, MESH, memory_budget=16 * MIB, output_placements={"mm2": (R,)})
    text = result.table()
    for name in ("x", "w1", "w2", "mm1", "relu", "mm2"):
        assert any(line.startswith(name + " ") for line in text.splitlines())
    assert "all-reduce@d0" in text and "budget 16.00 MiB" in text and "total" in text
    assert "memory peak at " in text and "solver cbc: optimal" in text and "gap 0.00%" in text
    assert result.total_cost == pytest.approx(result.compute_cost + result.comm_cost)
    # the plan of the same assignment, rebuilt, costs the same
    problem = build_problem(ir, strategies, MESH, memory_budget=16 * MIB, output_placements={"mm2": (R,)})
    labels = {n.name: n.strategy.label for n in result.nodes}
    again = make_plan(problem, problem.assignment(labels))
    assert again.total_cost == pytest.approx(result.total_cost)


def test_equal_cost_input_placement_takes_the_least_memory():
    """Replicate-then-slice and a sharded input cost the same time; the plan keeps the
    input that takes less memory (a sharded batch), for the ILP and the beam alike."""
    from metaspmd.ir import MetaIR, MetaOp, MetaVar
    from metaspmd.planner.api import lighter_inputs
    from metaspmd.planner.synthetic import elementwise_rules

    x, y = MetaVar("x", (4096, 64)), MetaVar("y", (4096, 64))
    ir = MetaIR((x,), (MetaOp("relu", "aten.relu.default", (x,), {}, (y,)),), (y,))
    strategies = {"relu": elementwise_rules(2)}
    for solver in ("ilp", "beam"):
        result = plan(ir, strategies, MESH, solver=solver)
        assert isinstance(result.placement("x")[0], Shard) and result.comm_cost == 0.0
    # whatever the solver's pick among the ties, a Replicate input next to a sharded op moves
    problem = build_problem(ir, strategies, MESH)
    tied = problem.assignment({"x": "R", "relu": "S1"})
    better = lighter_inputs(problem, tied)
    i = problem.index("x")
    assert problem.strategies[i][tied[i]].label == "R" and problem.strategies[i][better[i]].label == "S(0)"
    assert problem.choice.evaluate(better) == problem.choice.evaluate(tied)
    assert problem.choice.memory(better) < problem.choice.memory(tied)


def test_a_budget_no_plan_meets_names_the_least_any_plan_needs():
    import re

    from metaspmd.planner import Infeasible

    ir, strategies = mlp(64, DIM, HIDDEN)
    with pytest.raises(Infeasible, match=r"the least any plan needs is [\d,]+") as err:
        plan(ir, strategies, MESH, memory_budget=1 * MIB)
    least = float(re.search(r"needs is ([\d,]+)", str(err.value))[1].replace(",", ""))
    assert 1 * MIB < least < 16 * MIB  # both weights cut four ways is 8 MiB
    assert plan(ir, strategies, MESH, memory_budget=least).memory <= least * (1 + 1e-9)


def test_a_2d_plan_is_never_worse_than_its_devices_planned_as_one_axis():
    """The 1-D plan of the mesh's devices, each choice on every axis, is a candidate of the
    N-D plan (``api._flattened``): it is the diagonal of the 1-D plan, fits the budget, and
    the N-D plan costs no more than it."""
    from metaspmd.planner import api

    ir, strategies = mlp(64, DIM, HIDDEN)
    square = Mesh.of((2, 4))
    one = plan(ir, strategies, Mesh.of(8), memory_budget=8 * MIB, output_placements={"mm2": (R,)})
    problem = build_problem(ir, strategies, square, memory_budget=8 * MIB, output_placements={"mm2": (R, R)})
    flat = api._flattened(problem, strategies, {"memory_budget": 8 * MIB}, None, {"mm2": (R, R)}, api.solve)
    assert flat is not None
    diagonal = make_plan(problem, flat)
    for node in one.nodes:
        assert diagonal.strategy(node.name).outputs == tuple(p * 2 for p in node.strategy.outputs)
    assert diagonal.memory <= 8 * MIB
    two = plan(ir, strategies, square, memory_budget=8 * MIB, output_placements={"mm2": (R, R)})
    assert two.total_cost <= diagonal.total_cost * (1 + 1e-9)


def test_a_full_assignment_restricted_to_the_reduced_problem_expands_back_on_the_kept_nodes():
    from metaspmd.planner.reduce import reduce_problem

    ir, strategies = mlp(64, DIM, HIDDEN)
    problem = build_problem(ir, strategies, Mesh.of((2, 2)), memory_budget=16 * MIB)
    reduced = reduce_problem(problem.choice, Reductions())
    full = list(plan(ir, strategies, Mesh.of((2, 2)), memory_budget=16 * MIB).nodes)
    assignment = [problem.choice_of(n.name, n.strategy.label) for n in full]
    start = reduced.restrict(assignment)
    assert len(start) == len(reduced.problem.nodes)
    assert reduced.expand(start) == assignment
