"""The GPT block (batch 8, seq 64, hidden 256, 4 heads) on a mesh of 4 under a budget that
no plan with replicated weights fits: with even reshape rules (a cut through nn.Linear's
3-D views and into the heads) the planner finds a plan no dearer than Megatron's (its
weights column/row parallel, q, k, v and the scores cut by head), cheaper than without
them, and the plan matches one device."""

import dataclasses
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

from metaspmd.backends.torch.capture import capture  # noqa: E402
from metaspmd.backends.torch.parallelize import parallelize  # noqa: E402
from metaspmd.backends.torch.rules_at_runtime import node_call  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.placement import Replicate, Shard  # noqa: E402
from metaspmd.planner import Infeasible, Mesh, build_problem, solve  # noqa: E402
from metaspmd.resolve import resolve  # noqa: E402
from metaspmd.target import DTENSOR_PLAN  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models import GPTBlock  # noqa: E402

WORLD, BUDGET = 4, 6e6
pytestmark = pytest.mark.slow  # live exploration of the block's 55 reshapes and backward ops at full size


def _block():
    torch.manual_seed(0)
    return GPTBlock(256, 4, 1024), torch.randn(8, 64, 256)


def _splits_a_cut_dim(plan, node) -> bool:
    """A reshape whose cut input dim is split into several output dims (an even rule)."""
    (x,), (y,) = node.input_vars, node.outputs
    (p,), (q,) = plan.strategy(node.name).inputs[0], plan.strategy(node.name).outputs[0]
    return isinstance(p, Shard) and isinstance(q, Shard) and len(y.shape) > len(x.shape) and (
        x.shape[p.dim] != y.shape[q.dim])


def test_the_planner_beats_megatron_with_even_reshape_rules(cache):
    model, x = _block()
    c = capture(model, (x,))
    rules, _ = resolve(c.ir, lambda op: node_call(c, op), TorchOps(), "torch", cache)
    params = dict(zip(c.param_names, c.ir.input_list))
    out = {n.name: n.outputs[0].name for n in c.ir.op_list}
    R, S0, S1, S2 = (Replicate(),), (Shard(0),), (Shard(1),), (Shard(2),)
    megatron = {params["qkv.weight"].name: S0, params["qkv.bias"].name: S0, params["proj.weight"].name: S1,
                params["proj.bias"].name: R, params["fc1.weight"].name: S0, params["fc1.bias"].name: S0,
                params["fc2.weight"].name: S1, params["fc2.bias"].name: R,
                **{out[k]: S1 for k in ("transpose", "transpose_1", "transpose_2", "_softmax")},  # q, k, v by head
                out["_unsafe_view_5"]: S2, out["view_9"]: S2}
    mesh, ties = Mesh.of((WORLD,)), c.parameter_gradient_ties()

    def planned(target=DTENSOR_PLAN, constraints=None):
        return solve(build_problem(c.ir, rules, mesh, ties=ties, target=target, memory_budget=BUDGET,
                                   constraints=constraints), "cbc", 120)

    with pytest.raises(Infeasible):  # the budget forbids replicated weights
        planned(constraints={v.name: R for v in params.values()})
    best, by_megatron = planned(), planned(constraints=megatron)
    without = planned(dataclasses.replace(DTENSOR_PLAN, even_shards=False))
    print(f"planner {best.total_cost * 1e6:.1f} us, Megatron {by_megatron.total_cost * 1e6:.1f} us, "
          f"planner without even rules {without.total_cost * 1e6:.1f} us")
    assert best.total_cost <= by_megatron.total_cost * (1 + 1e-6)
    assert best.total_cost < without.total_cost
    assert any(_splits_a_cut_dim(best, n) for n in c.ir.op_list if "view" in n.op)


def test_the_plan_matches_one_device(fake_world, cache):
    model, x = _block()
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        p = parallelize(model, mesh, (x,), cache=cache, memory_budget=BUDGET)
        out, grads = p(x)
    assert any(_splits_a_cut_dim(p.plan, n) for n in p.captured.ir.op_list if "view" in n.op), p.explain()
    ref = model(x)
    ref_grads = torch.autograd.grad(ref.sum(), list(model.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads):  # a gradient sums thousands of float32 terms, each plan in its own order
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5 * max(1.0, float(r.abs().max())))
