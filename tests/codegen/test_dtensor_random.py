"""DTensor's own random ops on a CPU mesh: its RNG tracker serves cuda-like meshes only, so
every rank drew its shard from the generator state all ranks share, the same values on
every shard (a dropout mask repeating across shards). Under register() they are drawn whole
on every rank, each keeping its shard: the values one device draws with that seed."""

import warnings

import pytest

torch = pytest.importorskip("torch")
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import Shard, distribute_tensor  # noqa: E402

from metaspmd.backends.torch import dtensor_handlers, dtensor_rules  # noqa: E402

F = torch.nn.functional
WORLD = 4
# (name, fn of a row-cut (8, 6) DTensor of ones): each op of dtensor_handlers.DRAWN_ON_CPU
DRAWS = {
    "native_dropout": lambda x: F.dropout(x, 0.5),
    "rand_like": torch.rand_like,
    "randn_like": torch.randn_like,
    "randint_like": lambda x: torch.randint_like(x, 0, 1000),
    "randint_like.low_dtype": lambda x: torch.randint_like(x, 3, 1000),
    "bernoulli": lambda x: torch.bernoulli(x * 0.5),
    "normal_": lambda x: x.normal_(),
    "uniform_": lambda x: x.uniform_(),
    "bernoulli_.float": lambda x: x.bernoulli_(0.5),
}


def _shards(x) -> list:
    """Each simulated rank's local values."""
    return [t for _, t in sorted(x._local_tensor._local_tensors.items())]


def _repeats(mesh, fn) -> bool:
    """Does every rank hold the same values for its shard?"""
    torch.manual_seed(0)
    shards = _shards(fn(distribute_tensor(torch.ones(8, 6), mesh, [Shard(0)])))
    return all(torch.equal(s, shards[0]) for s in shards[1:])


def test_each_op_dtensor_draws_is_covered():
    ops = {str(op) for op in torch.distributed.tensor.DTensor._op_dispatcher._random_ops}
    factories = {"aten.rand.default", "aten.randn.default", "aten.randint_like.low_dtype_out"}
    assert set(dtensor_handlers.DRAWN_ON_CPU) == ops - factories
    assert len(DRAWS) == len(dtensor_handlers.DRAWN_ON_CPU)


@pytest.mark.parametrize("name", list(DRAWS))
def test_shards_are_drawn_apart(fake_world_of, tmp_path, name):
    from metaspmd.cache import RuleCache

    warnings.filterwarnings("ignore")
    fake_world_of(WORLD)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        plain = _repeats(mesh, DRAWS[name])
        report = dtensor_rules.register(cache=RuleCache(tmp_path))
        try:
            registered = _repeats(mesh, DRAWS[name])
        finally:
            dtensor_rules.unregister(report)
    assert plain and not registered


RANK = """
    for name, fn in (("dropout", lambda x: F.dropout(x, 0.5)), ("uniform_", lambda x: x.uniform_())):
        torch.manual_seed(0)
        want = fn(torch.ones(8, 6))
        torch.manual_seed(0)
        x = fn(distribute_tensor(torch.ones(8, 6), mesh, [Shard(0)]))
        halves = x.full_tensor().split(4)
        got[name] = {"one device": bool(torch.equal(x.full_tensor(), want)),
                     "repeats": bool(torch.equal(halves[0], halves[1]))}
        del x, halves
"""



@pytest.mark.slow  # two processes that import torch, twice
@pytest.mark.parametrize("registered", [False, True])
def test_a_row_cut_dropout_on_two_gloo_ranks_draws_what_one_device_draws(on_two_gloo_ranks, registered):
    for got in on_two_gloo_ranks(RANK, registered):
        for name, found in got.items():
            assert found == {"one device": registered, "repeats": not registered}, (name, found)
