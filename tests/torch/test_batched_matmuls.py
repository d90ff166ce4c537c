"""Batched matmuls traced as view(merge) -> bmm -> view(split) are captured as one
aten.matmul on the unmerged operands: the same values, and a plan can keep attention's
heads cut through them (Megatron's attention on separate Q/K/V projections)."""

import copy
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard  # noqa: E402

from metaspmd.backends.torch import capture as capture_module  # noqa: E402
from metaspmd.backends.torch.batched_matmuls import unmerge_batched_matmuls  # noqa: E402
from metaspmd.backends.torch.parallelize import parallelize  # noqa: E402
from metaspmd.cache import RuleCache  # noqa: E402
from metaspmd.placement import Shard as PlannedShard  # noqa: E402

aten = torch.ops.aten
WORLD = 4


class Attention(nn.Module):
    """Causal self-attention with separate Q, K and V projections, [b, H, t, dh] heads."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)).masked_fill(
            ~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        return self.proj((F.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, d))


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_the_attention_bmms_become_matmuls_with_the_same_values(monkeypatch):
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(2, 8, 32)
    monkeypatch.setattr(capture_module, "unmerge_batched_matmuls", lambda gm: 0)
    merged = capture_module.capture(model, (x,)).gm
    assert _targets(merged).count(aten.bmm.default) == 6  # q k^T, att v, and four in the backward
    unmerged = copy.deepcopy(merged)
    assert unmerge_batched_matmuls(unmerged) == 6
    assert aten.bmm.default not in _targets(unmerged) and _targets(unmerged).count(aten.matmul.default) == 6
    args = ([p.detach() for p in model.parameters()], [], x)
    for a, b in zip(torch.utils._pytree.tree_leaves(merged(*args)), torch.utils._pytree.tree_leaves(unmerged(*args))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_a_bmm_of_tensors_that_were_never_merged_is_left_alone():
    def fn(a, b):
        return torch.bmm(a, b).relu()

    c = capture_module.capture(fn, (torch.randn(4, 3, 5), torch.randn(4, 5, 2)))
    assert aten.bmm.default in _targets(c.gm) and aten.matmul.default not in _targets(c.gm)


def test_megatron_attention_keeps_the_heads_cut_and_matches_one_device(fake_world_of, tmp_path):
    """Q/K/V column-parallel and the output projection row-parallel: every batched matmul
    of the forward and backward keeps the heads (dim 1) cut, and the plan matches one
    device."""
    fake_world_of(WORLD)
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(2, 8, 32)
    R, S0, S1 = (Replicate(),), (Shard(0),), (Shard(1),)
    megatron = {0: R, **{f"{n}.{w}": S0 for n in "qkv" for w in ("weight", "bias")},
                "proj.weight": S1, "proj.bias": R}
    with LocalTensorMode(frozenset(range(WORLD))):
        p = parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (x,), cache=RuleCache(tmp_path),
                        constraints=megatron)
        out, grads = p(x)
    matmuls = [n for n in p.captured.ir.op_list if n.op == "aten.matmul.default"]
    assert len(matmuls) == 6
    for n in matmuls:
        assert p.plan.strategy(n.name).outputs[0] == (PlannedShard(1),), p.plan.table()
    ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, torch.autograd.grad(ref.sum(), list(model.parameters()))):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_the_plan_is_no_dearer_than_megatron(fake_world_of, tmp_path):
    """Under a budget that forbids replicated weights, the planner's plan of the separate
    Q/K/V attention costs no more than Megatron's (its weights pinned, the planner filling
    the rest), as costed by the same model."""
    from metaspmd import planner
    from metaspmd.resolve import resolve
    from metaspmd.runtime import runtime_for

    fake_world_of(WORLD)
    torch.manual_seed(0)
    model, x = Attention(64, 4), torch.randn(4, 16, 64)
    R, S0, S1 = (Replicate(),), (Shard(0),), (Shard(1),)
    megatron = {0: R, **{f"{n}.{w}": S0 for n in "qkv" for w in ("weight", "bias")},
                "proj.weight": S1, "proj.bias": R}
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        rt = runtime_for(mesh)(mesh)
        with rt.quiet():
            c = rt.capture(model, (x,))
            found, _ = resolve(c.ir, lambda n: rt.node_call(c, n), rt.ops, rt.name, RuleCache(tmp_path))

    def planned(budget, constraints=None):
        return planner.plan(c.ir, rt.strategies(c, found), rt.planner_mesh(mesh), memory_budget=budget,
                            ties=rt.ties(c), target=rt.target, constraints=rt.constraints(c, constraints or {}),
                            **rt.plan_options(c))

    replicated = planned(None, {n: R for n, _ in model.named_parameters()})
    budget = 0.9 * replicated.memory
    best, expert = planned(budget), planned(budget, megatron)
    assert best.memory <= budget
    assert best.total_cost <= expert.total_cost * (1 + 1e-9), (best.total_cost, expert.total_cost)
