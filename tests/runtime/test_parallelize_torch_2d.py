"""parallelize() on a 2x2 DTensor mesh (dp, tp) with data parallelism across nodes: where a
step's traffic asks for it, the plan is the one people write by hand, the batch cut on dp
and Megatron on tp, and it matches one device."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

import metaspmd  # noqa: E402
from metaspmd import planner  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models import MLP  # noqa: E402

R, S0, S1 = planner.Replicate(), planner.Shard(0), planner.Shard(1)
ACROSS_NODES = {"dp": (10e-6, 25e9)}  # tp keeps the intra-node default, 5 us and 100 GB/s


@pytest.mark.parametrize("dim,batch", [(256, 8192), pytest.param(512, 8192, marks=pytest.mark.slow)])
def test_a_large_batch_mlp_is_data_parallel_on_dp_and_megatron_on_tp(fake_world_of, cache, dim, batch):
    """Many tokens per weight: cutting the batch on the slow axis costs one bucketed gradient
    all-reduce of half the weights a step, Megatron on the fast one two activation
    reductions; the other arrangements cost more."""
    fake_world_of(4)
    torch.manual_seed(0)
    model, x = MLP(dim, 4 * dim), torch.randn(batch, dim)
    with LocalTensorMode(frozenset(range(4))):
        mesh = DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
        p = metaspmd.parallelize(model, mesh, (x,), cache=cache, links=ACROSS_NODES)
        out, grads = p(x)
    names = dict(zip(p.captured.param_names, p.captured.ir.input_list))
    x_var = p.captured.ir.input_list[len(names)]
    assert p.plan.placement(x_var.name) == (S0, R)
    megatron = {"fc1.weight": (R, S0), "fc1.bias": (R, S0), "fc2.weight": (R, S1)}
    assert {n: p.plan.placement(names[n].name) for n in megatron} == megatron
    ref = model(x)
    ref_grads = torch.autograd.grad(ref.sum(), list(model.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(4096, 3)

    def forward(self, ids):
        return self.emb(ids) * 2.0


def test_a_vocab_parallel_lookup_on_two_axes_runs_and_matches_one_device(fake_world_of, cache):
    """Under a budget a third of the table, with the positions replicated, the table is cut
    by its rows. DTensor masks a row-cut lookup along one mesh axis only (cut along both, it
    raises "MaskBuffer has been materialized with conflicting data"): the plan cuts it so,
    and the lookup matches one device."""
    from torch.distributed.tensor import Replicate

    fake_world_of(4)
    torch.manual_seed(0)
    model, ids = Lookup(), torch.tensor([[3, 17, 4000, 1025], [2048, 9, 77, 4095]])
    with LocalTensorMode(frozenset(range(4))):
        mesh = DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
        p = metaspmd.parallelize(model, mesh, (ids,), cache=cache, backward=False, memory_budget=16_000,
                                 constraints={0: (Replicate(), Replicate())})
        out = p(ids)
    table = p.plan.strategy("embedding").inputs[0]
    assert S0 in table and table != (S0, S0), p.explain()
    assert p.plan.memory <= 16_000
    torch.testing.assert_close(out, model(ids))
