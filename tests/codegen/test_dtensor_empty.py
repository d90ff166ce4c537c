"""register() gives no rank an empty shard that the op's kernel refuses (dtensor_empty): a
cut of a dim shorter than the ranks, or 5 over 4 (2, 2, 1, 0), on DTensor's own rules and
the verified ones alike."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402
from torch.distributed.tensor.placement_types import _StridedShard  # noqa: E402

from metaspmd.backends.torch import dtensor_empty, dtensor_rules  # noqa: E402

WORLD = 4
_G = torch.Generator().manual_seed(5)


def _t(*shape):
    return torch.randn(*shape, generator=_G, dtype=torch.float64)


# (name, fn, inputs, placements): each call leaves one rank an empty shard its kernel refuses
CALLS = [
    ("max of everything (DTensor's rule)", torch.max, (_t(3, 5),), [Shard(0)]),
    ("amax over the cut dim", lambda x: torch.amax(x, 0), (_t(3, 5),), [Shard(0)]),
    ("aminmax of a cut vector", lambda x: torch.aminmax(x, dim=-1)[0], (_t(5),), [Shard(0)]),
    ("conv_transpose2d cut along the height", lambda x, w: F.conv_transpose2d(x, w, dilation=2),
     (_t(2, 1, 6, 9), _t(1, 2, 1, 3)), [Shard(2), Replicate()]),
    ("conv2d cut along the height, padded", lambda x, w: F.conv2d(x, w, padding="same", dilation=2),
     (_t(4, 2, 9, 7), _t(4, 2, 1, 3)), [Shard(2), Replicate()]),
]


def _whole(x):
    """A DTensor's global value as one plain tensor (``reconcile`` checks the ranks agree)."""
    full = x.full_tensor()
    return full.reconcile() if isinstance(full, LocalTensor) else full


def _run(fn, inputs, placements):
    def run(mesh):
        try:
            out = fn(*(distribute_tensor(t, mesh, [p]) for t, p in zip(inputs, placements)))
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"[:200]
        return _whole(out) if isinstance(out, DTensor) else out
    return run


@pytest.mark.parametrize("name, fn, inputs, placements", CALLS, ids=[c[0] for c in CALLS])
def test_a_kernel_that_refuses_an_empty_shard_is_given_none(plain_and_registered, tmp_path, name, fn, inputs,
                                                            placements):
    found, report = plain_and_registered(_run(fn, inputs, placements), tmp_path, WORLD)
    assert isinstance(found["plain"], str), found["plain"]  # the empty shard's kernel raised
    assert not isinstance(found["register()"], str), found["register()"]
    torch.testing.assert_close(found["register()"], fn(*inputs))
    assert dtensor_empty.EMPTY_SHARDS_TRIED in report.guarded


def test_a_kernel_that_takes_an_empty_shard_keeps_its_cut(plain_and_registered, tmp_path):
    """A row-cut sum of 3 rows over 4 ranks: the empty rank sums to zero, and the cut stays
    (no rank gathers the rows)."""
    x = _t(3, 5)

    def run(mesh):
        out = torch.sum(distribute_tensor(x, mesh, [Shard(0)]) * 2, 0)
        return out.placements, _whole(out)

    found, _ = plain_and_registered(run, tmp_path, WORLD)
    assert found["register()"][0] == found["plain"][0]
    torch.testing.assert_close(found["register()"][1], torch.sum(x * 2, 0))


# (name, fn, input, placement): a view or expand of a tensor whose cut leaves a rank none of
# it (6 over 4 ranks: 2, 2, 2, 0); DTensor restates the sizes for each rank's shard
VIEWS = [
    ("flatten into a strided cut", lambda x: x.flatten(0, 1), _t(8, 6, 4), Shard(1)),
    ("view splitting the rows", lambda x: x.view(2, 4, 6, 4), _t(8, 6, 4), Shard(1)),
    ("flatten before the cut", lambda x: x.flatten(0, 1), _t(10, 6, 3), Shard(2)),
    ("reshape into a strided cut", lambda x: x.reshape(10, 18), _t(10, 6, 3), Shard(2)),
    ("expand a cut vector", lambda x: x.expand(8, 6), _t(6), Shard(0)),
    ("view a cut vector as a column", lambda x: x.view(6, 1), _t(6), Shard(0)),
]


@pytest.mark.parametrize("name, fn, x, placement", VIEWS, ids=[c[0] for c in VIEWS])
def test_a_view_of_a_cut_that_empties_a_rank_keeps_dtensors_cut(plain_and_registered, tmp_path, name, fn, x,
                                                                placement):
    """The guard tried these views with the call's whole sizes on a rank's empty shard,
    which always raises: every such view was replicated by an all-gather (an uneven
    Megatron MLP's gradients came back Replicate, its step 2.3x slower). Tried with the
    sizes DTensor gives the rank, they keep plain DTensor's cut and move nothing."""
    from torch.distributed.tensor.debug import CommDebugMode

    def run(mesh):
        cut = distribute_tensor(x, mesh, [placement])
        with CommDebugMode() as comms:
            out = fn(cut)
        return out.placements, comms.get_total_counts(), _whole(out)

    found, _ = plain_and_registered(run, tmp_path, WORLD)
    assert found["register()"][:2] == found["plain"][:2] == (found["plain"][0], 0), found
    torch.testing.assert_close(found["register()"][2], fn(x))


def test_the_guard_covers_the_ops_a_call_names_and_leaves_with_it(fake_world_of):
    from torch.distributed.tensor import _sharding_prop

    fake_world_of(WORLD)
    own = _sharding_prop._select_min_cost_strategy
    x = _t(3, 5)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        report = dtensor_rules.register(["aten.amax.default"])
        try:
            assert _sharding_prop._select_min_cost_strategy is not own
            torch.testing.assert_close(_whole(torch.amax(distribute_tensor(x, mesh, [Shard(0)]), 0)), torch.amax(x, 0))
            with pytest.raises(RuntimeError, match="numel"):  # max is not among the ops named
                torch.max(distribute_tensor(x, mesh, [Shard(0)]))
        finally:
            dtensor_rules.unregister(report)
    assert _sharding_prop._select_min_cost_strategy is own


def test_local_shapes_are_dtensors_cuts(fake_world_of):
    """Rows cut over both dims of a 2 x 2 mesh, torch.chunk's pieces cut again: 3 rows give
    2 and 1, then 1 and 1, and 1 and 0; a column cut over the second dim gives 2 and 1."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    fake_world_of(WORLD)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", [[0, 1], [2, 3]])
        meta = TensorMeta(torch.Size([3, 3]), (3, 1), torch.float32)
        rows = DTensorSpec(mesh, (Shard(0), Shard(0)), tensor_meta=meta)
        both = DTensorSpec(mesh, (Shard(0), Shard(1)), tensor_meta=meta)
        assert dtensor_empty.local_shapes(rows) == ((1, 3), (1, 3), (1, 3), (0, 3))
        assert dtensor_empty.local_shapes(both) == ((2, 2), (2, 1), (1, 2), (1, 1))
        strided = DTensorSpec(mesh, (_StridedShard(0, split_factor=3), Replicate()), tensor_meta=meta)
        assert dtensor_empty.local_shapes(strided) is None  # not chunk's pieces: not read


# each rank of two holds one row of x (1 and 0 of a row-cut 1-row w): amax over w's rows and
# a convolution cut along a 3-row height (2 and 1 rows, then 1 and 0 after padding 'valid')
ON_GLOO = """
g = torch.Generator().manual_seed(0)
x, w = torch.randn(1, 5, generator=g, dtype=torch.float64), torch.randn(1, 1, 3, 4, generator=g, dtype=torch.float64)
k = torch.randn(1, 2, 1, 2, generator=g, dtype=torch.float64)
try:
    got["amax"] = torch.allclose(torch.amax(distribute_tensor(x, mesh, [Shard(0)]), 0).full_tensor(), torch.amax(x, 0))
except Exception as e:
    got["amax"] = str(e)[:80]
try:
    out = F.conv_transpose2d(distribute_tensor(w, mesh, [Shard(2)]), distribute_tensor(k, mesh, [Replicate()]),
                             dilation=2)
    got["conv"] = torch.allclose(out.full_tensor(), F.conv_transpose2d(w, k, dilation=2))
except Exception as e:
    got["conv"] = str(e)[:80]
"""


@pytest.mark.slow  # two processes that import torch
def test_every_gloo_rank_picks_the_same_strategy_and_runs(on_two_gloo_ranks):
    """The kernel is tried on every rank alike (the same shapes, data from a fixed seed), so
    the ranks agree on the strategy and none waits on a collective the others skip. (Plain
    DTensor is not run here: one rank's kernel raises, and the other would wait on it.)"""
    for got in on_two_gloo_ranks(ON_GLOO, True):
        assert got == {"amax": True, "conv": True}, got


@torch.library.custom_op("metaspmd_test::refuses_everything", mutates_args=())
def _refuses_everything(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("a user's op, run where it should not be")


def test_only_aten_ops_that_draw_nothing_are_tried(fake_world_of):
    """A user's op (or a collective) could wait on the other ranks, and a random op's draw
    would move the generator: neither is run to see whether it takes an empty shard."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema, OpSpec

    fake_world_of(WORLD)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        meta = TensorMeta(torch.Size([3, 5]), (5, 1), torch.float32)
        cut = DTensorSpec(mesh, (Shard(0),), tensor_meta=meta)  # 1, 1, 1 and 0 rows

        def refuses(op, *rest):
            return dtensor_empty.kernel_refuses(op, OpSpec(cut, [cut]), OpSchema(op, (cut, *rest), {}))

        assert refuses(torch.ops.aten.amax.default, [0])  # tried: amax over no rows raises
        assert not refuses(torch.ops.metaspmd_test.refuses_everything.default)
        state = torch.get_rng_state()
        assert not refuses(torch.ops.aten.bernoulli.p, 0.5)
        assert torch.equal(torch.get_rng_state(), state)
