"""parallelize() on DTensor (fake process group + LocalTensorMode, mesh of 4): planned
models match single-device outputs and gradients."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

from metaspmd.backends.torch.parallelize import parallelize  # noqa: E402
from metaspmd.cache import RuleCache  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models import MLP, GPTBlock  # noqa: E402

WORLD = 4


@pytest.fixture(scope="module")
def fake_world():
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=WORLD)
    yield


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return RuleCache(tmp_path_factory.mktemp("rules"))


def run_planned(model, x, cache, **kw):
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        p = parallelize(model, mesh, (x,), cache=cache, **kw)
        out, grads = p(x)
    ref = model(x)
    ref_grads = torch.autograd.grad(ref.sum(), list(model.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    return p


@pytest.mark.parametrize("budget", [None, 300_000])
def test_mlp_matches_single_device(fake_world, cache, budget):
    torch.manual_seed(0)
    p = run_planned(MLP(64, 256), torch.randn(8, 64), cache, memory_budget=budget)
    if budget is not None:
        assert p.plan.memory <= budget
        assert any(n.strategy.label != "R" for n in p.plan.nodes)  # the budget forces sharding


def test_gpt_block_matches_single_device(fake_world, cache):
    torch.manual_seed(0)
    p = run_planned(GPTBlock(32, 4, 128), torch.randn(2, 8, 32), cache, memory_budget=None)
    assert p.stats.table + p.stats.cache + p.stats.live == len(p.captured.ir)


def test_rules_come_from_cache_second_time(fake_world, cache):
    torch.manual_seed(0)
    p = run_planned(MLP(64, 256), torch.randn(8, 64), cache)
    assert p.stats.live == 0


def test_memory_budget_gives_megatron_mlp(fake_world, cache):
    """Column-parallel first linear, row-parallel second (bias Partial), one collective
    on the block's forward output."""
    torch.manual_seed(0)
    p = run_planned(MLP(512, 2048), torch.randn(8, 512), cache, memory_budget=20e6)
    first, second = p.plan.strategy("addmm"), p.plan.strategy("addmm_1")
    assert [str(x[0]) for x in first.inputs[1:]] == ["R", "S(1)"] and str(first.outputs[0][0]) == "S(1)"
    assert [str(x[0]) for x in second.inputs] == ["P(sum)", "S(1)", "S(0)"] and str(second.outputs[0][0]) == "P(sum)"
    forward_output = [r for r in p.plan.reshards if r.var == "addmm_1"]
    assert len(forward_output) == 1 and forward_output[0].cost > 0
