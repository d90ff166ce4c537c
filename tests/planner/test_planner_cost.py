import itertools

import numpy as np
import pytest

from metaspmd.ir import MetaVar
from metaspmd.planner.cost import CostModel, Device, regathers
from metaspmd.planner.flops import dtype_bytes, flops
from metaspmd.planner.mesh import Mesh
from metaspmd.placement import Partial, Replicate, Shard
from metaspmd.planner.problem import _edge_factors
from metaspmd.planner.strategies import tensor_placements

R, P = Replicate(), Partial("sum")
ALPHA, BW = 1e-5, 1e9
NBYTES = 64 * 32 * 4


@pytest.fixture
def cm():
    return CostModel(Mesh.of(4, alpha=ALPHA, bandwidth=BW))


def kinds(cm, src, dst, shape=(64, 32)):
    return [s.kind for s in cm.reshard_steps(shape, "float32", src, dst)]


def test_collectives_follow_the_ring_alpha_beta_formulas(cm):
    launch = cm.device.collective_launch
    ag = 3 * ALPHA + 3 / 4 * NBYTES / BW
    assert cm.all_gather(0, NBYTES) == pytest.approx(launch + ag)
    assert cm.reduce_scatter(0, NBYTES) == pytest.approx(launch + ag)
    assert cm.all_reduce(0, NBYTES) == pytest.approx(launch + 2 * ag)
    assert cm.all_to_all(0, NBYTES) == pytest.approx(launch + 3 * ALPHA + 3 / 4 * NBYTES / 4 / BW)


def test_one_all_reduce_is_cheaper_than_all_gather_plus_reduce_scatter(cm):
    """The per-call launch cost breaks the DP (all-reduce) vs FSDP (all-gather + reduce-scatter) tie."""
    assert cm.device.collective_launch > 0
    assert cm.all_reduce(0, NBYTES) < cm.all_gather(0, NBYTES) + cm.reduce_scatter(0, NBYTES)
    assert CostModel(Mesh.of(1)).all_reduce(0, NBYTES) == 0.0


@pytest.mark.parametrize("src,dst,kind,collective", [
    (Shard(0), R, "all-gather", "all_gather"),
    (P, R, "all-reduce", "all_reduce"),
    (P, Shard(1), "reduce-scatter", "reduce_scatter"),
    (Shard(0), Shard(1), "all-to-all", "all_to_all"),
])
def test_reshard_picks_the_collective(cm, src, dst, kind, collective):
    assert kinds(cm, (src,), (dst,)) == [kind]
    assert cm.reshard((64, 32), "float32", (src,), (dst,)) == pytest.approx(getattr(cm, collective)(0, NBYTES))


def test_replicate_to_shard_or_partial_is_free(cm):
    assert kinds(cm, (R,), (Shard(0),)) == ["slice"]
    assert cm.reshard((64, 32), "float32", (R,), (Shard(0),)) == 0.0
    assert cm.reshard((64, 32), "float32", (R,), (P,)) == 0.0
    assert cm.reshard((64, 32), "float32", (Shard(0),), (Shard(0),)) == 0.0


def test_shard_to_partial_goes_through_replicate(cm):
    assert kinds(cm, (Shard(0),), (P,)) == ["all-gather", "zero"]


def test_other_axes_shrink_the_bytes_moved():
    cm = CostModel(Mesh.of((2, 4), alpha=0.0, bandwidth=BW), Device(collective_launch=0.0))
    full = cm.reshard((64, 32), "float32", (R, P), (R, R))
    split = cm.reshard((64, 32), "float32", (Shard(0), P), (Shard(0), R))
    assert split == pytest.approx(full / 2)
    # axis 0 gathers first (while axis 1 is still sharded), then axis 1 gathers the rest
    both = cm.reshard((64, 32), "float32", (Shard(0), Shard(1)), (R, R))
    assert both == pytest.approx(cm.all_gather(0, NBYTES / 4) + cm.all_gather(1, NBYTES))


@pytest.mark.parametrize("shape", [(8,), (2, 4), (2, 2, 2)])
def test_edge_factors_sum_to_the_reshard_cost(shape):
    mesh = Mesh.of(shape, alpha=[1e-6 * (i + 1) for i in range(len(shape))],
                   bandwidth=[1e9 * (i + 1) for i in range(len(shape))])
    cm = CostModel(mesh)
    var = MetaVar("t", (16, 8, 32))
    places = tensor_placements(var.shape, mesh)
    places += [tuple(P if a == 0 else x for a, x in enumerate(p)) for p in places]
    dense = sum(f.dense() for f in _edge_factors(cm, var, places, places))
    want = np.array([[cm.reshard(var.shape, var.dtype, a, b) for b in places] for a in places])
    np.testing.assert_allclose(dense, want, rtol=1e-12, atol=0)
    assert want.max() > 0


def test_matmul_flops_follow_the_contraction():
    assert flops("aten.mm.default", [(8, 16), (16, 4)], [(8, 4)]) == 2 * 8 * 4 * 16
    assert flops("aten.addmm.default", [(4,), (8, 16), (16, 4)], [(8, 4)]) == 2 * 8 * 4 * 16
    assert flops("aten.bmm.default", [(3, 8, 16), (3, 16, 4)], [(3, 8, 4)]) == 2 * 3 * 8 * 4 * 16
    dn = (((1,), (0,)), ((), ()))
    assert flops("dot_general", [(8, 16), (16, 4)], [(8, 4)], {"dimension_numbers": dn}) == 2 * 8 * 4 * 16
    # a contraction split over 4 devices leaves a quarter of the work per device
    whole = flops("aten.mm.default", [(8, 16), (16, 4)], [(8, 4)])
    assert flops("aten.mm.default", [(8, 4), (4, 4)], [(8, 4)]) == whole / 4
    assert flops("aten.relu.default", [(8, 16)], [(8, 16)]) == 128
    assert flops("aten.cummax.default", [(8, 16)], [(8, 16)]) == 128  # not a matmul despite the letters


def test_compute_is_a_roofline():
    cm = CostModel(Mesh.of(4), Device(peak_flops=1e12, memory_bandwidth=1e11))
    heavy = cm.compute("aten.mm.default", [(512, 512), (512, 512)], [(512, 512)])
    assert heavy == pytest.approx(2 * 512**3 / 1e12)
    light = cm.compute("aten.relu.default", [(512, 512)], [(512, 512)])
    assert light == pytest.approx(2 * 512 * 512 * 4 / 1e11)


def test_memory_counts_local_bytes():
    cm = CostModel(Mesh.of((2, 4)))
    assert cm.memory((64, 32), "float32", (Shard(0), Shard(1))) == 64 * 32 * 4 / 8
    assert cm.memory((64, 32), "bfloat16", (P, R)) == 64 * 32 * 2
    assert dtype_bytes("torch.float16") == 2 and dtype_bytes("int64") == 8 and dtype_bytes("bool") == 1


def test_every_placement_pair_costs_at_least_zero_and_identity_is_free():
    cm = CostModel(Mesh.of((2, 2)))
    places = tensor_placements((8, 8), cm.mesh) + [(P, R), (R, P), (P, P)]
    for a, b in itertools.product(places, places):
        c = cm.reshard((8, 8), "float32", a, b)
        local = all(x == y or isinstance(x, Replicate) for x, y in zip(a, b)) and not any(
            regathers(axis, a, b) for axis in range(2))
        assert c >= 0 and (c == 0) == (a == b or local)


def test_a_cut_reordered_by_an_earlier_axis_is_gathered_first():
    """A dim cut on both axes of a 2x4 mesh is cut dp-major: device (i, j) holds piece
    4i + j of 8. From [R, S(1)] (piece j of 4) that is no local slice, and a reduce-scatter
    on dp from [P, S(1)] gives pieces in tp-major order: the tp cut is gathered first (XLA
    compiles these to a gather of the whole tensor). Cuts of other dims stay local."""
    cm = CostModel(Mesh.of((2, 4), ("dp", "tp")))
    steps = lambda a, b: [str(s) for s in cm.reshard_steps((128, 1024), "float32", a, b)]  # noqa: E731
    assert steps((R, Shard(1)), (Shard(1), Shard(1))) == ["slice@dp", "all-gather@tp", "slice@tp"]
    assert steps((P, Shard(1)), (Shard(1), Shard(1))) == ["reduce-scatter@dp", "all-gather@tp", "slice@tp"]
    assert steps((Shard(1), Shard(1)), (R, Shard(1))) == ["all-gather@dp", "all-gather@tp", "slice@tp"]
    assert steps((Shard(1), R), (Shard(1), Shard(1))) == ["slice@tp"]  # the inner cut of a local piece
    assert steps((R, Shard(1)), (Shard(0), Shard(1))) == ["slice@dp"]


class _ViewFn:
    """Stands for an op callable whose schema marks it a view (torch's OpOverload.is_view)."""

    is_view = True


def test_view_ops_cost_no_compute_under_any_strategy():
    from metaspmd.ir import MetaIR, MetaOp
    from metaspmd.planner.problem import build_problem
    from metaspmd.planner.synthetic import transpose_rules

    x, y = MetaVar("x", (512, 256)), MetaVar("y", (256, 512))

    def compute(fn):
        ir = MetaIR((x,), (MetaOp("t", "aten.t.default", (x,), {}, (y,), fn),), (y,))
        problem = build_problem(ir, {"t": transpose_rules(2)}, Mesh.of(4))
        return problem.compute[problem.index("t")]

    assert np.all(compute(_ViewFn()) == 0.0)  # a view of the local shard moves no data
    copy = compute(None)  # an op not known to alias pays its memory traffic
    assert copy.min() > 0 and copy.max() > copy.min()


def test_a_pending_arg_reduction_gathers_one_value_and_position_per_device(cm):
    # argmax over a cut dim: every device contributes its (value, position) pair; the cost
    # is an all-gather of twice the output from each of the 4 devices, not an all-reduce
    arg = Partial("argmax")
    assert kinds(cm, (arg,), (R,)) == ["all-gather"]
    assert cm.reshard((64, 32), "float32", (arg,), (R,)) == pytest.approx(cm.all_gather(0, 2 * 4 * NBYTES))


def test_a_fused_reduction_pays_its_bytes_and_a_share_of_the_fixed_cost(cm):
    launch = cm.device.collective_launch
    quarter = cm.fused(0.25)
    assert quarter.all_reduce(0, NBYTES) == pytest.approx(0.25 * (launch + 6 * ALPHA) + 2 * 3 / 4 * NBYTES / BW)
    assert quarter.reduce_scatter(0, NBYTES) == pytest.approx(0.25 * (launch + 3 * ALPHA) + 3 / 4 * NBYTES / BW)
    assert quarter.all_gather(0, NBYTES) == cm.all_gather(0, NBYTES)  # only reductions ride in buckets
    assert cm.fused(1.0) is cm and cm.fused(0.25) is quarter
    with pytest.raises(ValueError, match="share"):
        cm.fused(0.0)
