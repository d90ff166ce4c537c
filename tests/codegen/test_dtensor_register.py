"""After register(), ATen ops that DTensor 2.13 cannot run (NotImplementedError) run on
DTensor with the generated rules and match single-device results (fake process group +
LocalTensorMode, mesh of 4)."""

import math
import sys
import warnings
from pathlib import Path

import pytest

# the module fixtures are set up once, on one worker (--dist loadgroup), not on each
pytestmark = pytest.mark.xdist_group("dtensor_register")
torch = pytest.importorskip("torch")
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

from metaspmd import placement as mp  # noqa: E402
from metaspmd import spec as spec_  # noqa: E402
from metaspmd.backends.torch import (  # noqa: E402
    catalog, dtensor_empty, dtensor_handlers, dtensor_rules, get_backend, table)
from metaspmd.target import DTENSOR_REGISTER, projections  # noqa: E402
from metaspmd.backends.torch.parallelize import redistribute  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.custom_ops import rms_norm  # noqa: E402

WORLD = 4

# Every one raised NotImplementedError on DTensor in torch 2.13 before register() (checked
# again below, op by op, before any rule is installed).
OPS = [
    "aten._adaptive_avg_pool3d_backward.default", "aten._add_relu.Scalar", "aten._add_relu.Tensor",
    "aten._aminmax.default", "aten._aminmax.dim", "aten._cdist_backward.default",
    "aten._conj_physical.default", "aten._convolution.default",
    "aten._convolution.deprecated", "aten._dirichlet_grad.default", "aten._embedding_bag_backward.default",
    "aten._embedding_bag_per_sample_weights_backward.default", "aten._lazy_clone.default",
    "aten._masked_softmax.default", "aten._masked_softmax_backward.default", "aten._neg_view.default",
    "aten._neg_view_copy.default", "aten._pad_enum.default", "aten._pdist_backward.default",
    "aten._pdist_forward.default", "aten._prelu_kernel_backward.default", "aten._reshape_alias_copy.default",
    "aten._reshape_copy.default", "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
    "aten._standard_gamma_grad.default", "aten._trilinear.default", "aten.addbmm.default",
    "aten.as_strided_copy.default", "aten.as_strided_scatter.default", "aten.avg_pool2d_backward.default",
    "aten.avg_pool3d_backward.default", "aten.col2im.default", "aten.copy.default",
    "aten.detach_copy.default", "aten.fft_ihfft2.default",
    "aten.fft_ihfftn.default", "aten.fill.Tensor", "aten.fractional_max_pool2d_backward.default",
    "aten.fractional_max_pool3d_backward.default", "aten.hardshrink_backward.default",
    "aten.hardsigmoid_backward.default", "aten.hardswish_backward.default", "aten.hardtanh_backward.default",
    "aten.im2col.default", "aten.lift_fresh_copy.default", "aten.log_sigmoid_backward.default",
    "aten.masked_scatter.default", "aten.masked_scatter_backward.default", "aten.masked_select_backward.default",
    "aten.max_pool3d_with_indices_backward.default", "aten.multi_margin_loss.default",
    "aten.multi_margin_loss_backward.default",
    "aten.multilabel_margin_loss_backward.default", "aten.multilabel_margin_loss_forward.default",
    "aten.put.default", "aten.reflection_pad1d.default", "aten.reflection_pad1d_backward.default",
    "aten.reflection_pad2d.default", "aten.reflection_pad2d_backward.default", "aten.reflection_pad3d.default",
    "aten.reflection_pad3d_backward.default", "aten.replication_pad1d.default",
    "aten.replication_pad1d_backward.default", "aten.replication_pad2d.default",
    "aten.replication_pad2d_backward.default", "aten.replication_pad3d.default",
    "aten.replication_pad3d_backward.default", "aten.scatter.reduce", "aten.scatter.value_reduce",
    "aten.scatter_reduce.two", "aten.slow_conv3d.default", "aten.slow_conv3d_forward.default",
    "aten.softshrink_backward.default", "aten.unfold.default", "aten.unfold_backward.default",
    "aten.unfold_copy.default",
]


def _no_empty_shard(size: int) -> bool:
    # DTensor shards like torch.chunk: with ceil-sized chunks, trailing ranks may get nothing.
    return size >= WORLD and math.ceil(size / WORLD) * (WORLD - 1) < size


def _pick(backend, op_name):
    """An example call and a non-trivial table strategy for it."""
    op = catalog.overload_named(op_name)
    for case in backend.cases(op_name):
        tensors = [a for a in case.args if isinstance(a, torch.Tensor)]
        if any(isinstance(a, (list, tuple)) and any(isinstance(y, torch.Tensor) for y in a) for a in case.args):
            continue
        for ins, outs in dtensor_rules.dtensor_placements(op, case.args, dict(case.kwargs)):
            if any(isinstance(p, (Shard, Partial)) for p in ins) and all(
                _no_empty_shard(t.shape[p.dim]) for t, p in zip(tensors, ins) if isinstance(p, Shard)
            ):
                return op, case, ins
    return None


def _distributed(case, ins, mesh):
    """The case's args and kwargs with every tensor leaf (in lists too) placed, in order."""
    placements = iter(ins)

    def place(a):
        if not isinstance(a, torch.Tensor):
            return a
        p = next(placements)
        if isinstance(p, Partial):
            return redistribute(distribute_tensor(a, mesh, [Replicate()]), mesh, (p,))
        return distribute_tensor(a, mesh, [p])

    return torch.utils._pytree.tree_map(place, (tuple(case.args), dict(case.kwargs)))


def _full_on_every_rank(x):
    """A DTensor's global value as a plain tensor, checking every simulated rank agrees."""
    if not isinstance(x, DTensor):
        return x
    full = x.full_tensor()
    ranks = list(full._local_tensors.values()) if isinstance(full, LocalTensor) else [full]
    for r in ranks[1:]:
        torch.testing.assert_close(r, ranks[0], equal_nan=True)
    return ranks[0]


@pytest.fixture(scope="module")
def backend():
    return get_backend()  # one backend: each new one reads the whole sample index again


F = torch.nn.functional
# Calls DTensor 2.13 answers wrong on its own rules (dtensor_rules.REFUTED): a convolution's
# input cut along a spatial dim, cosine_embedding_loss with its second input's columns cut,
# and gather with its index's rows cut where it has fewer than self.
_G = torch.Generator().manual_seed(0)
CONV_X, CONV_W = torch.randn(4, 3, 8, 8, generator=_G), torch.randn(4, 3, 3, 3, generator=_G)
COS_A, COS_B, COS_T = torch.randn(4, 8, generator=_G), torch.randn(4, 8, generator=_G), torch.tensor([1., -1., 1., -1.])
# gather's index cut along its rows, fewer than self's
GATHER_SELF, GATHER_INDEX = torch.randn(12, 4, generator=_G), torch.randint(0, 4, (4, 4), generator=_G)


def _gather_1(x, index):
    return torch.gather(x, 1, index)


def _refuted_calls(mesh):
    """(conv2d of a height-cut input, cosine_embedding_loss of a column-cut input, conv2d of a
    batch-cut input, gather of a row-cut index from a replicated and a row-cut self): each
    output's placements and full value (or why there is none: the ranks disagree)."""
    out = []
    for fn, args in ((F.conv2d, ((CONV_X, Shard(2)), (CONV_W, Replicate()))),
                     (F.cosine_embedding_loss, ((COS_A, Replicate()), (COS_B, Shard(1)), (COS_T, Replicate()))),
                     (F.conv2d, ((CONV_X, Shard(0)), (CONV_W, Replicate()))),
                     (_gather_1, ((GATHER_SELF, Replicate()), (GATHER_INDEX, Shard(0)))),
                     (_gather_1, ((GATHER_SELF, Shard(0)), (GATHER_INDEX, Shard(0))))):
        got = fn(*(distribute_tensor(t, mesh, [p]) for t, p in args), **({"padding": 1} if fn is F.conv2d else {}))
        try:
            out.append((got.placements, _full_on_every_rank(got)))
        except AssertionError as e:
            out.append((got.placements, e))
    return out


# One call per op that REFUTED_AT names (but fill_, cosine_embedding_loss's above), at a call
# it refutes, with the placement of REFUTED_AT_X that shows it (no shard empty): the reductions
# whose dim=[] means every dim (keepdim=True; the out= ones with a replicated out of the
# result's shape), which DTensor 2.13's rules read as no dim; and the scans, arg-reductions and
# the gradients of select and narrow along (or before) a cut dim counted from the end.
REFUTED_AT_X = torch.randn(8, 6, generator=_G).abs() + 0.5
_A = torch.ops.aten
_ROWS, _COLUMNS = Shard(0), Shard(1)
REFUTED_AT_CALLS = {
    "aten.amax.default": (lambda x, o: _A.amax.default(x, [], True), _ROWS),
    "aten.amax.out": (lambda x, o: _A.amax.out(x, [], True, out=o), _ROWS),
    "aten.amin.default": (lambda x, o: _A.amin.default(x, [], True), _ROWS),
    "aten.amin.out": (lambda x, o: _A.amin.out(x, [], True, out=o), _ROWS),
    "aten.linalg__powsum.default": (lambda x, o: _A.linalg__powsum.default(x, 3, [], True), _ROWS),
    "aten.linalg_vector_norm.default": (lambda x, o: _A.linalg_vector_norm.default(x, 2, [], True), _ROWS),
    "aten.logsumexp.default": (lambda x, o: _A.logsumexp.default(x, [], True), _ROWS),
    "aten.mean.dim": (lambda x, o: _A.mean.dim(x, [], True), _ROWS),
    "aten.mean.out": (lambda x, o: _A.mean.out(x, [], True, out=o), _ROWS),
    "aten.nansum.default": (lambda x, o: _A.nansum.default(x, [], True), _ROWS),
    "aten.std.correction": (lambda x, o: _A.std.correction(x, [], correction=1, keepdim=True), _ROWS),
    "aten.std.correction_out": (lambda x, o: _A.std.correction_out(x, [], correction=1, keepdim=True, out=o), _ROWS),
    "aten.sum.dim_IntList": (lambda x, o: _A.sum.dim_IntList(x, [], True), _ROWS),
    "aten.var.correction": (lambda x, o: _A.var.correction(x, [], correction=1, keepdim=True), _ROWS),
    "aten.var.correction_out": (lambda x, o: _A.var.correction_out(x, [], correction=1, keepdim=True, out=o), _ROWS),
    "aten.var_mean.correction": (lambda x, o: _A.var_mean.correction(x, [], correction=1, keepdim=True)[0], _ROWS),
    "aten.var_mean.correction_out": (lambda x, o: _A.var_mean.correction_out(
        x, [], correction=1, keepdim=True, out0=o, out1=o.clone())[0], _ROWS),
    "aten.cumsum.default": (lambda x, o: torch.cumsum(x, -1), _COLUMNS),
    "aten.cumprod.default": (lambda x, o: torch.cumprod(x, -2), _ROWS),
    "aten.logcumsumexp.default": (lambda x, o: torch.logcumsumexp(x, -1), _COLUMNS),
    "aten.argmax.default": (lambda x, o: torch.argmax(x, -2), _ROWS),
    "aten.argmin.default": (lambda x, o: torch.argmin(x, -2, keepdim=True), _ROWS),
    # keepdim=True, which DTensor's logsumexp rule reads from the keywords only
    "aten.logsumexp.default:keepdim": (lambda x, o: torch.logsumexp(x, 0, keepdim=True), _COLUMNS),
    # the gradient of select(t, -1, 1) for a t of shape (8, 6, 3), cut along its rows
    "aten.select_backward.default": (lambda x, o: _A.select_backward.default(x, [8, 6, 3], -1, 1), _ROWS),
    # the gradient of narrow(t, -1, 2, 6) for a t of shape (8, 10), cut along the narrowed dim
    "aten.slice_backward.default": (lambda x, o: _A.slice_backward.default(x, [8, 10], -1, 2, 8, 1), _COLUMNS),
}


def _refuted_at_calls(mesh) -> dict:
    """Each REFUTED_AT_CALLS call on its cut input: its full value, or the error it raised."""
    out = {}
    for name, (fn, placement) in REFUTED_AT_CALLS.items():
        try:
            got = fn(distribute_tensor(REFUTED_AT_X, mesh, [placement]),
                     distribute_tensor(torch.zeros(1, 1), mesh, [Replicate()]))
            out[name] = _full_on_every_rank(got)
        except Exception as e:  # noqa: BLE001 -- DTensor's IndexError, or ranks that disagree
            out[name] = e
    return out


# Ops whose DTensor rule cuts dim 1 as channels, called on unbatched inputs (channels, then
# spatial dims), each input cut along dim 1: its first spatial dim.
_POOLED2, _IDX2 = F.max_pool2d(torch.randn(4, 8, 8, generator=_G), 2, return_indices=True)
_POOLED3, _IDX3 = F.max_pool3d(torch.randn(4, 8, 8, 8, generator=_G), 2, return_indices=True)
UNBATCHED_CALLS = {  # name: (fn, inputs, placements)
    "aten._adaptive_avg_pool2d_backward.default": (
        _A._adaptive_avg_pool2d_backward.default,
        [torch.randn(8, 7, 7, generator=_G), torch.randn(8, 16, 8, generator=_G)], [_COLUMNS] * 2),
    "aten.max_unpool2d.default": (
        lambda v, i: F.max_unpool2d(v, i, 2, output_size=(8, 8)), [_POOLED2, _IDX2], [_COLUMNS] * 2),
    "aten.max_unpool3d.default": (
        lambda v, i: F.max_unpool3d(v, i, 2, output_size=(8, 8, 8)), [_POOLED3, _IDX3], [_COLUMNS] * 2),
}
# Ops whose DTensor rule does not read an argument that changes what the op sums, called
# with it set and the batch cut: the counts of scale_grad_by_freq, and the mean of nll_loss
# over targets some of which are ignored (ignore_index -100) or with weighted classes.
_IDS = torch.tensor([[1, 1, 1, 2], [3, 1, 4, 4], [0, 2, 2, 2], [5, 1, 1, 3]] * 2)
_TARGETS = torch.tensor([0, 1, -100, -100, -100, 2, 3, 4])
_TARGETS2D = torch.randint(0, 5, (8, 3, 3), generator=_G)
UNREAD_ARGUMENT_CALLS = {  # name: (fn, inputs, placements)
    "aten.embedding_dense_backward.default": (
        lambda g, i: _A.embedding_dense_backward.default(g, i, 6, -1, True),
        [torch.randn(8, 4, 5, generator=_G), _IDS], [_ROWS] * 2),
    "aten.nll_loss_forward.default": (
        lambda x, t: _A.nll_loss_forward.default(x, t, None, 1, -100)[0],
        [torch.randn(8, 5, generator=_G), _TARGETS], [_ROWS] * 2),
    "aten.nll_loss2d_forward.default": (
        lambda x, t, w: _A.nll_loss2d_forward.default(x, t, w, 1, -100)[0],
        [torch.randn(8, 5, 3, 3, generator=_G), _TARGETS2D, torch.rand(5, generator=_G) + 0.5],
        [_ROWS, _ROWS, Replicate()]),
}


# Ops whose DTensor rule passes a Partial input through where the op, at the call's
# arguments, is not linear in it (Partial(sum): a @ b with a's columns and b's rows cut) or
# not non-decreasing (Partial(max): m.amax(0) of m cut along dim 0).
_ONES = torch.ones(2, 4, dtype=torch.float64)
_CANCEL = torch.tensor([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0], [2.0, 0.5, 1.0], [-2.0, -0.5, -1.0]],
                       dtype=torch.float64)  # each rank's part is nonzero; their sum, exactly 0
_FRACTIONS = torch.full((4, 3), 0.6, dtype=torch.float64)  # parts of 0.6, a sum of 2.4
_PARTS = torch.randn(4, 8, 5, generator=_G, dtype=torch.float64)
_PARTS[0, 0, 0] = -50.0  # rank 0's part, far below the others'
_PARTS_INF = _PARTS.clone()
_PARTS_INF[1, 0, 1] = float("inf")
_INTS = torch.randint(-300, 300, (4, 8, 6), generator=_G)  # some wrap as int8
_UNSIGNED = torch.randint(0, 10, (4, 8, 6), generator=_G).to(torch.uint8)  # negated, they wrap
_SUM_PARTS, _MAX_PARTS = [_COLUMNS, _ROWS], [_ROWS]
PARTIAL_INPUT_CALLS = {  # name: (fn, inputs, placements)
    "aten.linalg__powsum.default": (lambda a, b: torch.linalg._powsum(a @ b, 2), [_ONES, _CANCEL], _SUM_PARTS),
    "aten.any.default": (lambda a, b: torch.any(a @ b), [_ONES, _CANCEL], _SUM_PARTS),
    "aten.any.dim": (lambda a, b: torch.any(a @ b, 0), [_ONES, _CANCEL], _SUM_PARTS),
    "aten.any.dims": (lambda a, b: _A.any.dims(a @ b, [0, 1]), [_ONES, _CANCEL], _SUM_PARTS),
    "aten.sum.default": (lambda a, b: torch.sum(a @ b, dtype=torch.int64), [_ONES, _FRACTIONS], _SUM_PARTS),
    "aten.sum.dim_IntList": (lambda a, b: torch.sum(a @ b, 1, dtype=torch.int64), [_ONES, _FRACTIONS], _SUM_PARTS),
    "aten.linalg_vector_norm.default": (
        lambda m: torch.linalg.vector_norm(m.amax(0), float("inf")), [_PARTS], _MAX_PARTS),
    "aten.norm.Scalar": (lambda m: _A.norm.Scalar(m.amax(0), float("inf")), [_PARTS], _MAX_PARTS),
    "aten.threshold.default": (lambda m: F.threshold(m.amax(0), 0.0, 5.0), [_PARTS], _MAX_PARTS),
    "aten.nan_to_num.default": (lambda m: torch.nan_to_num(m.amax(0), posinf=-5.0), [_PARTS_INF], _MAX_PARTS),
    # a 2-norm of row-cut columns is pending as a _NormPartial, whose reduce_op reads 'sum'
    "aten.sum.default: a norm's Partial": (
        lambda x: torch.linalg.vector_norm(x, 2, dim=0).sum(), [_PARTS[0]], _MAX_PARTS),
    "aten.sum.dim_IntList: a norm's Partial": (
        lambda x: torch.linalg.vector_norm(x, 3, dim=0).sum(0), [_PARTS[0]], _MAX_PARTS),
    "aten._fft_c2c.default": (lambda m: torch.fft.fft(m.amax(0), dim=0).real, [_PARTS], _MAX_PARTS),
    "aten._fft_r2c.default": (lambda m: torch.view_as_real(torch.fft.rfft(m.amin(0), dim=1)), [_PARTS], _MAX_PARTS),
    "aten._to_copy.default": (lambda i: i.amax(0).to(torch.int8), [_INTS], _MAX_PARTS),
    "aten.view.dtype": (lambda m: m.amax(0).view(torch.int64), [_PARTS], _MAX_PARTS),
    "aten.neg.default": (lambda u: torch.neg(u.amax(0)), [_UNSIGNED], _MAX_PARTS),
}
CALL_GROUPS = {"unbatched calls": UNBATCHED_CALLS, "unread-argument calls": UNREAD_ARGUMENT_CALLS,
               "partial-input calls": PARTIAL_INPUT_CALLS}


def _placed_calls(mesh, calls: dict) -> dict:
    """Each call of ``calls`` on its inputs placed as it says: its full value, or the error."""
    out = {}
    for name, (fn, ins, placements) in calls.items():
        try:
            out[name] = _full_on_every_rank(fn(*[distribute_tensor(t, mesh, [p]) for t, p in zip(ins, placements)]))
        except Exception as e:  # noqa: BLE001 -- DTensor's own errors on the flat indices
            out[name] = e
    return out


# Losses DTensor derives a rule for from their decomposition, whose mean gives Partial(avg):
# on an uneven cut of rows (10 over 4 ranks) the ranks' means are of unequal shards.
UNEVEN_X, UNEVEN_Y = torch.randn(10, 7, generator=_G), torch.randn(10, 7, generator=_G)
EVEN_X, EVEN_Y = torch.randn(8, 12, generator=_G), torch.randn(8, 12, generator=_G)
MEAN_LOSSES = {
    "mse_loss": F.mse_loss, "smooth_l1_loss": F.smooth_l1_loss,
    "soft_margin_loss": lambda x, y: F.soft_margin_loss(x, y.sign()),
    "binary_cross_entropy_with_logits": lambda x, y: F.binary_cross_entropy_with_logits(x, y.sigmoid()),
}


def _mean_losses(mesh, x=UNEVEN_X, y=UNEVEN_Y) -> dict:
    """Each of MEAN_LOSSES on row-cut inputs: (placements, full value) or the error."""
    out = {}
    for name, fn in MEAN_LOSSES.items():
        try:
            got = fn(distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(y, mesh, [Shard(0)]))
            out[name] = (got.placements, _full_on_every_rank(got))
        except Exception as e:  # noqa: BLE001 -- ranks that disagree
            out[name] = (None, e)
    return out


@pytest.fixture(scope="module")
def results(fake_world_of, backend, tmp_path_factory):
    from metaspmd.cache import RuleCache

    warnings.filterwarnings("ignore")
    fake_world_of(WORLD)
    picks = {name: _pick(backend, name) for name in OPS}
    expected = {name: case.fn(*case.args, **case.kwargs) for name, (_, case, _) in picks.items()}
    out = {}
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        before = {}
        for name, pick in picks.items():
            op, case, ins = pick
            try:
                args, kwargs = _distributed(case, ins, mesh)
                case.fn(*args, **kwargs)
                before[name] = "ran"
            except NotImplementedError:
                before[name] = "NotImplementedError"
        plain = _refuted_calls(mesh)
        plain_refuted_at = _refuted_at_calls(mesh)
        plain_losses = _mean_losses(mesh)
        plain_groups = {group: _placed_calls(mesh, calls) for group, calls in CALL_GROUPS.items()}
        # Everything DTensor lacks: composite ops (cdist) decompose into others (_cdist_forward).
        # And DTensor's refuted rules replaced; a call the table misses is explored live.
        report = dtensor_rules.register(replace_refuted=True, cache=RuleCache(tmp_path_factory.mktemp("rules")))
        for name, pick in picks.items():
            op, case, ins = pick
            try:
                args, kwargs = _distributed(case, ins, mesh)
                got = torch.utils._pytree.tree_map(_full_on_every_rank, case.fn(*args, **kwargs))
            except Exception as e:  # reported by the op's own test
                got = e
            out[name] = (before[name], got, expected[name], ins)
        replaced = _refuted_calls(mesh)
        replaced_refuted_at = _refuted_at_calls(mesh)
        replaced_losses = _mean_losses(mesh)
        replaced_groups = {group: _placed_calls(mesh, calls) for group, calls in CALL_GROUPS.items()}
        even_losses = _mean_losses(mesh, EVEN_X, EVEN_Y)
    out["refuted calls"] = (plain, replaced)
    out["refuted-at calls"] = (plain_refuted_at, replaced_refuted_at)
    out["mean losses"] = (plain_losses, replaced_losses, even_losses)
    out.update({group: (plain_groups[group], replaced_groups[group]) for group in CALL_GROUPS})
    yield out, report
    dtensor_rules.unregister(report)  # leave DTensor as other tests expect it


def test_a_report_of_few_skipped_ops_says_why():
    """register_op's report printed "skipped 1" alone; the reason was in .skipped only."""
    one = dtensor_rules.RegisterReport(skipped={"mylib.parts.default": "returns something other than plain tensors"})
    assert str(one).endswith("skipped 1 (mylib.parts.default: returns something other than plain tensors)")
    many = dtensor_rules.RegisterReport(skipped={f"op{i}": "no rule" for i in range(4)})
    assert str(many).endswith("skipped 4")


def test_register_reports_what_it_installed(results):
    _, report = results
    assert len(report.installed) >= 50, str(report)
    assert "installed" in str(report)


@pytest.mark.parametrize("name", OPS)
def test_op_runs_sharded_and_matches(results, name):
    out, report = results
    before, got, expected, ins = out[name]
    assert before == "NotImplementedError", f"DTensor already runs {name}"
    assert name in report.installed
    assert not isinstance(got, Exception), f"{type(got).__name__}: {got}"
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_a_norm2_rule_reduces_by_the_2_norm(results):
    """_pdist_forward over a cut feature dim gives DTensor's _NormPartial(2): each rank's
    distances over its columns, combined by the 2-norm when DTensor replicates them."""
    from torch.distributed.tensor._ops._math_ops import _NormPartial

    op = torch.ops.aten._pdist_forward.default
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    rules = dtensor_rules.dtensor_placements(op, (x, 2.0), {})
    assert ((Shard(1),), (_NormPartial(2),)) in rules, rules
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        got = op(distribute_tensor(x, mesh, [Shard(1)]), 2.0)
        assert isinstance(got.placements[0], _NormPartial)
        full = _full_on_every_rank(got)
    torch.testing.assert_close(full, op(x, 2.0), rtol=1e-5, atol=1e-6)


def test_a_view_whose_shards_rewrite_sizes_gets_no_cut_from_register(results):
    """DTensor runs an installed rule's op on each shard with the call's own arguments. The
    table's derived Shard(0) rule of squeeze_copy holds where a shard squeezes the globally
    removed dims only; DTensor's call squeezed a shard of one row too, and failed. register()
    installs its uncut rules only, and DTensor gathers the rows first."""
    _, report = results
    assert "aten.squeeze_copy.default" in report.installed
    op = torch.ops.aten.squeeze_copy.default
    x = torch.randn(WORLD, 1, 6, 1, generator=torch.Generator().manual_seed(0))
    cut = (mp.Shard(0),)  # the table's row cut, which DTensor would run unrewritten
    projected = projections(dtensor_rules.lookup(op, (x,), {}), DTENSOR_REGISTER)
    assert any((a.inputs, a.outputs) == (cut, cut) for a in projected)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        got = op(distribute_tensor(x, mesh, [Shard(0)]))
        assert got.placements == (Replicate(),)
        full = _full_on_every_rank(got)
    torch.testing.assert_close(full, op(x))


def test_a_lookup_whose_row_cut_dtensor_masks_is_never_installed(monkeypatch):
    # the table's (Shard(0), Replicate) -> Partial(sum) embedding strategy is DTensor's own,
    # masked one: a DTensor without that rule must not get it unmasked from the table
    assert "aten.embedding.default" in DTENSOR_REGISTER.masked_ops
    monkeypatch.setattr(dtensor_rules, "dtensor_has_rule", lambda op: False)
    report = dtensor_rules.register(["aten.embedding.default"])
    try:
        assert not report.installed and "masks positions" in report.skipped["aten.embedding.default"]
    finally:  # its empty-shard guard stays until then: a later test found DTensor patched
        dtensor_rules.unregister(report)


def test_register_op_explores_a_custom_op_and_installs_its_rules(fake_world_of, tmp_path):
    """Before: DTensor cannot run the custom op at all. register_op explores it on one
    example call and installs the verified rules: a row-cut input stays cut through it
    (no collective), and a cut of the normalized dim, which no rule keeps, is gathered
    first; both match one device."""
    from metaspmd.cache import RuleCache

    fake_world_of(WORLD)
    op = torch.ops.metaspmd_examples.rms_norm.default
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 6, 16, generator=g), torch.randn(16, generator=g)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        dx, dw = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(w, mesh, [Replicate()])
        with pytest.raises(NotImplementedError):
            op(dx, dw, 1e-6)
        report = dtensor_rules.register_op(op, (x, w, 1e-6), cache=RuleCache(tmp_path))
        try:
            assert report.installed == ["metaspmd_examples.rms_norm.default"], report.skipped
            rows = op(dx, dw, 1e-6)
            assert rows.placements == (Shard(0),)
            normalized = op(distribute_tensor(x, mesh, [Shard(2)]), dw, 1e-6)
            assert normalized.placements != (Shard(2),)
            full = [_full_on_every_rank(t) for t in (rows, normalized)]
        finally:
            dtensor_rules.unregister(report)
    for got in full:
        torch.testing.assert_close(got, rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_a_call_the_table_misses_gets_verified_cuts_of_its_own(fake_world_of, tmp_path):
    """The table holds _add_relu.Scalar at other=2; a call at other=0.25 is another
    signature. register() finds its rules as parallelize finds a table miss's (neighbouring
    signatures' rules verified at the call, or live), cached: it stays cut, as one device."""
    from metaspmd.cache import RuleCache

    fake_world_of(WORLD)
    mesh = DeviceMesh("cpu", list(range(WORLD)))
    op = torch.ops.aten._add_relu.Scalar
    x = torch.randn(8, 6)
    assert table.lookup(op, (x, 2), {}) and table.lookup(op, (x, 0.25), {}) is None
    report = dtensor_rules.register(["aten._add_relu.Scalar"], cache=RuleCache(tmp_path))
    try:
        with LocalTensorMode(WORLD):
            got = op(distribute_tensor(x, mesh, [Shard(1)]), 0.25)
            assert got.placements == (Shard(1),)
            full = _full_on_every_rank(got)
    finally:
        dtensor_rules.unregister(report)
    torch.testing.assert_close(full, op(x, 0.25))


@torch.library.custom_op("metaspmd_test::first_rows_of_table", mutates_args=())
def first_rows_of_table(x: torch.Tensor) -> torch.Tensor:
    return x[:32] * 2  # a row count held inside the kernel, past the sizes a sweep tries


@first_rows_of_table.register_fake
def _(x):
    return torch.empty(min(x.shape[0], 32), x.shape[1])


def _rows_and_columns(op, mesh, short, long):
    """The op on DTensor, its input cut by rows: the short call's placements, the long
    call's global value."""
    with LocalTensorMode(WORLD):
        at_short = op(distribute_tensor(short, mesh, [Shard(0)])).placements
        return at_short, _full_on_every_rank(op(distribute_tensor(long, mesh, [Shard(0)])))


def test_a_users_table_rules_are_installed_as_verified_at_each_calls_sizes(fake_world_of, tmp_path):
    """A table swept at 12 rows keeps first_rows' row gather (true below 32 rows).
    register() installed it at every size: a call of 64 rows, cut in four, kept each rank's
    16 rows and gave 64 rows for one device's 32. A user's table rules are candidates
    verified at each call's own sizes, as parallelize verifies them."""
    from metaspmd.backends.torch.samples import call_signature
    from metaspmd.cache import RuleCache
    from metaspmd.table import Entry

    fake_world_of(WORLD)
    mesh = DeviceMesh("cpu", list(range(WORLD)))
    op = torch.ops.metaspmd_test.first_rows_of_table.default
    short, long = torch.randn(12, 4), torch.randn(64, 4)
    swept = {str(op): {call_signature(op, (short,), {}): Entry("[[S1, S2]]", "{S1: gather(dim=0), S2: gather(dim=1)}")}}
    table.add_table(swept)
    try:
        report = dtensor_rules.register([str(op)], cache=RuleCache(tmp_path))
        try:
            assert report.installed == [str(op)], report
            at_short, full = _rows_and_columns(op, mesh, short, long)
        finally:
            dtensor_rules.unregister(report)
    finally:
        table.remove_table(swept)
    assert at_short == (Shard(0),)  # the table's row gather, verified at 12 rows
    torch.testing.assert_close(full, op(long))


@torch.library.custom_op("metaspmd_test::first_row_away_if_float32", mutates_args=())
def first_row_away_if_float32(x: torch.Tensor) -> torch.Tensor:
    return x - x[:1] if x.dtype == torch.float32 else x * 2  # rows cut at float64 only


first_row_away_if_float32.register_fake(lambda x: torch.empty_like(x))


def test_add_table_after_register_says_its_ops_wait_for_register_again(tmp_path):
    """register() installs what the tables hold when it runs: a user's op added after it had
    no rule in DTensor, which raised NotImplementedError at its first call, no word of why."""
    from metaspmd.backends.torch.samples import call_signature
    from metaspmd.cache import RuleCache
    from metaspmd.table import Entry

    op = torch.ops.metaspmd_test.first_rows_of_table.default
    added = {str(op): {call_signature(op, (torch.randn(12, 4),), {}): Entry("[[S1, S2]]", "{S1: gather(dim=0), S2: gather(dim=1)}")}}
    report = dtensor_rules.register(["aten._add_relu.Scalar"], cache=RuleCache(tmp_path))
    try:
        assert dtensor_rules._OWNERS  # this register() or an earlier one installed something
        with pytest.warns(UserWarning, match=r"add_table after register\(\): metaspmd_test.first_rows_of_table.default "
                                             r"has no rule in DTensor until register\(\) runs again"):
            table.add_table(added)
    finally:
        table.remove_table(added)
        dtensor_rules.unregister(report)


def test_register_ops_rules_of_its_example_are_verified_at_a_calls_other_dtype(fake_world_of, tmp_path):
    """Explored at float64, its row cut served a float32 call of the same shapes, whose kernel
    takes the first row away: each rank took its own first row."""
    from metaspmd.cache import RuleCache

    fake_world_of(WORLD)
    mesh = DeviceMesh("cpu", list(range(WORLD)))
    op = torch.ops.metaspmd_test.first_row_away_if_float32.default
    report = dtensor_rules.register_op(op, (torch.randn(8, 4, dtype=torch.float64),), cache=RuleCache(tmp_path))
    try:
        assert report.installed == [str(op)], report
        # what its rules were verified at, for any op (torch's own were kept for every size)
        assert [layouts for layouts, _ in dtensor_rules._EXPLORED[op].values()] == [(((8, 4), torch.float64),)]
        x = torch.randn(8, 4)
        with LocalTensorMode(WORLD):
            full = _full_on_every_rank(op(distribute_tensor(x, mesh, [Shard(0)])))
    finally:
        dtensor_rules.unregister(report)
    torch.testing.assert_close(full, op(x))


def test_register_ops_rules_of_its_example_are_verified_at_a_calls_other_sizes(fake_world_of, tmp_path):
    """register_op explores first_rows on a call of 12 rows, where the row gather holds; a
    call of 64 rows has its own rules, verified at its sizes, and matches one device."""
    from metaspmd.cache import RuleCache

    fake_world_of(WORLD)
    mesh = DeviceMesh("cpu", list(range(WORLD)))
    op = torch.ops.metaspmd_test.first_rows_of_table.default
    short, long = torch.randn(12, 4), torch.randn(64, 4)
    report = dtensor_rules.register_op(op, (short,), cache=RuleCache(tmp_path))
    try:
        assert report.installed == [str(op)], report
        at_short, full = _rows_and_columns(op, mesh, short, long)
    finally:
        dtensor_rules.unregister(report)
    assert at_short == (Shard(0),)
    torch.testing.assert_close(full, op(long))


@pytest.mark.parametrize("op, make", [
    ("aten.binomial.default", lambda: (torch.full((8, 6), 50.0), torch.full((8, 6), 0.5))),
    ("aten.normal.Tensor_float", lambda: (torch.randn(8, 6), 2.7)),  # a std the table holds
    ("aten.exponential.default", lambda: (torch.zeros(8, 6),)),  # a fill: its input's shape alone
])
def test_a_registered_random_op_draws_what_one_device_draws(fake_world_of, op, make):
    """Ranks seed alike (LocalTensorMode's simulated generators do): each drawing its own
    shard, every shard would hold the first shard's draw. register() runs the random ops it
    installs drawn whole, so the cut output is the draw one device makes."""
    fake_world_of(WORLD)
    mesh = DeviceMesh("cpu", list(range(WORLD)))
    overload = catalog.overload_named(op)
    args = make()
    torch.manual_seed(3)
    expected = overload(*args)
    report = dtensor_rules.register([op])
    try:
        # installed now, or by the module's register() where its fixture is alive in this process
        assert DTensor._op_dispatcher._custom_op_handlers.get(overload) is dtensor_handlers.drawing_handler, report
        with LocalTensorMode(WORLD):
            placed = [distribute_tensor(a, mesh, [Shard(0)]) if isinstance(a, torch.Tensor) else a for a in args]
            torch.manual_seed(3)
            got = overload(*placed)
            outs = got if isinstance(got, tuple) else (got,)
            assert all(o.placements == (Shard(0),) for o in outs)
            full = [_full_on_every_rank(o) for o in outs]
    finally:
        dtensor_rules.unregister(report)
    for g, e in zip(full, expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(g, e)
    assert not torch.equal(full[0][:2], full[0][2:4])  # not the first shard's draw again


def test_a_table_miss_explored_under_dtensor_leaves_the_programs_generator(fake_world_of, tmp_path):
    """DTensor asks for a custom op's strategies in the middle of a program: the stand-ins
    its live exploration runs on come from a generator of their own, so the program's next
    draw (a dropout mask) is the one it would have been without metaspmd."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from metaspmd.cache import RuleCache

    fake_world_of(2)
    mesh = DeviceMesh("cpu", [0, 1])

    def spec(shape):
        t = torch.empty(shape)
        return DTensorSpec(mesh, (Replicate(),), TensorMeta(t.shape, t.stride(), t.dtype))

    torch.manual_seed(0)
    state = torch.get_rng_state()
    rules = dtensor_rules._call_rules(torch.ops.metaspmd_examples.rms_norm.default,
                                      (spec((8, 6, 16)), spec((16,)), 1e-6), {}, RuleCache(tmp_path))
    assert rules  # explored live: rms_norm has no table entry
    assert torch.equal(torch.get_rng_state(), state)


def test_a_table_rule_shards_dims_of_one_length_only(fake_world_of):
    """gather's index narrower than self, both cut along a dim it does not gather: each
    shard would take self's columns at its own bounds, not the index's. The installed
    strategy function passes such a rule over, and keeps it where the lengths agree."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from metaspmd.backends.torch.catalog import exact_sizes, positional_names
    from metaspmd.signature import signature

    fake_world_of(2)
    mesh = DeviceMesh("cpu", [0, 1])

    def spec(shape, dtype):
        t = torch.empty(shape, dtype=dtype)
        return DTensorSpec(mesh, (Replicate(),), TensorMeta(t.shape, t.stride(), t.dtype))

    op = torch.ops.aten.gather.default
    same = (spec((4, 6), torch.float32), 0, spec((4, 6), torch.int64))
    narrow = (spec((4, 6), torch.float32), 0, spec((4, 4), torch.int64))
    sig = signature(table._SPEC_OPS, positional_names(op), same, {}, exact_sizes(op))
    assert sig == signature(table._SPEC_OPS, positional_names(op), narrow, {}, exact_sizes(op))
    columns = spec_.Strategy("S1", (spec_.ShardIn(1), spec_.ShardIn(1)), (spec_.OutputCombine.parse("gather(dim=1)"),))
    rules = (columns,)
    strategies = dtensor_rules._strategy_fn(op, lambda args, kwargs: rules)
    assert [ins for _, ins in strategies(*same)] == [[Replicate(), Replicate()], [Shard(1), Shard(1)]]
    assert [ins for _, ins in strategies(*narrow)] == [[Replicate(), Replicate()]]


def _leaves(case) -> list:
    return [t for t in torch.utils._pytree.tree_leaves((tuple(case.args), dict(case.kwargs)))
            if isinstance(t, torch.Tensor)]


def _run_placed(case, ins, mesh, expected):
    """Run the case on DTensor with its tensor leaves placed as ``ins``; '' when it matches
    one device on every rank, else what went wrong."""
    try:
        args, kwargs = _distributed(case, ins, mesh)
        got = torch.utils._pytree.tree_map(_full_on_every_rank, case.fn(*args, **kwargs))
        with _disable_current_modes():  # compared as plain tensors, outside the simulation
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    except Exception as e:  # noqa: BLE001 -- collected and reported per op
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return ""


def _replicated_and_cut(backend, name, mesh, want=None):
    """Every example call of the op (``want`` filters them) run all-replicated, and the
    first with a verified cut that DTensor shards without empty shards run with it: ('' or
    the first failure, whether a cut ran, how many calls ran)."""
    op = catalog.overload_named(name)
    try:
        with _disable_current_modes():  # samples are made as plain tensors
            cases = [c for c in backend.cases(name) if want is None or want(c)]
    except Exception:  # noqa: BLE001 -- no example call here
        cases = []
    cut, ran = False, 0
    for case in cases:
        leaves = _leaves(case)
        if not leaves or any(t.is_complex() for t in leaves):
            continue
        try:
            with _disable_current_modes():
                expected = case.fn(*case.args, **case.kwargs)
        except Exception:  # noqa: BLE001, S112 -- the call fails without DTensor too
            continue
        ran += 1
        why = _run_placed(case, (Replicate(),) * len(leaves), mesh, expected)
        if why:
            return f"all-replicated: {why}", cut, ran
        if cut:
            continue
        for ins, _ in dtensor_rules.dtensor_placements(op, case.args, dict(case.kwargs)):
            if len(ins) == len(leaves) and any(isinstance(p, (Shard, Partial)) for p in ins) and all(
                    _no_empty_shard(t.shape[p.dim]) for t, p in zip(leaves, ins) if isinstance(p, Shard)):
                why = _run_placed(case, ins, mesh, expected)
                if why:
                    return f"cut {ins}: {why}", cut, ran
                cut = True
                break
    return "", cut, ran


# Ops with tensor lists, optional tensors or tensor keywords, which DTensor rejected even
# all-replicated (input_specs(k) != strategies(n)) while the strategies placed positional
# arguments only.
LIST_OPS = {
    "aten._chunk_cat.default": None,
    "aten.block_diag.default": None,
    "aten._unsafe_masked_index.default": None,
    "aten._unsafe_masked_index_put_accumulate.default": None,
}


@pytest.mark.parametrize("name", sorted(LIST_OPS))
def test_ops_with_tensor_lists_and_optional_tensors_run_replicated_and_cut(results, backend, name):
    _, report = results
    assert name in report.installed
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        why, cut, ran = _replicated_and_cut(backend, name, mesh, LIST_OPS[name])
    assert ran and not why, why or "no example call"
    assert cut, f"no verified cut of {name} ran"


def test_segment_reduce_with_keyword_tensors_runs_on_dtensor(results):
    """segment_reduce takes its tensors of segments (lengths or offsets) as optional keyword
    tensors. By offsets (OpInfo's _segment_reduce.offsets), which the table has no rule for,
    DTensor gathers the cut data and runs it replicated; by lengths with an initial value,
    the verified cut of the data's columns stays cut. Both as one device."""
    _, report = results
    assert "aten.segment_reduce.default" in report.installed
    op = torch.ops.aten.segment_reduce.default
    g = torch.Generator().manual_seed(0)
    data, offsets, lengths = torch.randn(6, 8, generator=g), torch.tensor([0, 2, 2, 6]), torch.tensor([2, 0, 4])
    by_lengths = {"lengths": lengths, "initial": 1}
    assert ((Shard(1), Replicate()), (Shard(1),)) in dtensor_rules.dtensor_placements(op, (data, "max"), by_lengths)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        cut = distribute_tensor(data, mesh, [Shard(1)])
        got_offsets = op(cut, "sum", offsets=distribute_tensor(offsets, mesh, [Replicate()]))
        got_lengths = op(cut, "max", lengths=distribute_tensor(lengths, mesh, [Replicate()]), initial=1)
        assert got_lengths.placements == (Shard(1),)
        full = [_full_on_every_rank(t) for t in (got_offsets, got_lengths)]
    torch.testing.assert_close(full[0], op(data, "sum", offsets=offsets))
    torch.testing.assert_close(full[1], op(data, "max", **by_lengths))


def _installed_ops_run(backend, names) -> tuple[dict, int, int]:
    """Each named op on its example calls under DTensor: (op -> why it failed, ops run with
    a verified cut, ops run at all). Not the out= overloads (the reductions REFUTED_AT
    replaces): the sweep's calls of them allocate their outs inside, as plain tensors, which
    DTensor refuses beside DTensors; REFUTED_AT_CALLS runs them with DTensor outs."""
    failed, cuts, ran = {}, 0, 0
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        for name in names:
            if catalog.out_arg_names(catalog.overload_named(name)):
                continue
            why, cut, n = _replicated_and_cut(backend, name, mesh)
            ran += n > 0
            cuts += cut
            if why:
                failed[name] = why
    # DTensor accepts every installed strategy list, whatever the schema's shape
    rejected = {k: v for k, v in failed.items() if "input_specs(" in v}
    assert not rejected, rejected
    # no wrong value (pinv's rcond cut, wrong on DTensor's own rule for the op it decomposes
    # into, runs on the verified strategies that replace it)
    wrong = {k: v for k, v in failed.items() if "not close" in v or "not equal" in v}
    assert not wrong, wrong
    return failed, cuts, ran


def test_every_tenth_installed_op_runs_replicated_and_with_a_verified_cut(results, backend):
    """The check below on every tenth op register() installs (sorted by name), for the
    default run: all of them take about a minute. Its bound on failures is looser than the
    full run's (40, about 6.5%; 35 of 613 fail there, DTensor's machinery): a tenth taken by
    position gathers as many as 8 of them in 62."""
    _, report = results
    names = sorted(report.installed)[::10]
    failed, cuts, ran = _installed_ops_run(backend, names)
    assert len(failed) <= 0.15 * len(names), "\n".join(f"{k}: {v}" for k, v in sorted(failed.items()))
    assert ran >= 0.9 * len(names) and cuts >= 0.5 * len(names), (ran, cuts, len(names))


@pytest.mark.slow
def test_every_installed_op_runs_replicated_and_with_a_verified_cut(results, backend):
    """Each op register() installs, on its example calls: all-replicated (DTensor accepts
    the strategies whatever the schema's shape), and with one verified cut, against one
    device."""
    _, report = results
    failed, cuts, ran = _installed_ops_run(backend, report.installed)
    # the rest are DTensor's machinery (composite decompositions mixing plain tensors, data-
    # dependent output shapes, as_strided), a handful
    assert len(failed) <= 40, "\n".join(f"{k}: {v}" for k, v in sorted(failed.items()))
    assert ran >= 0.9 * len(report.installed), (ran, len(report.installed))
    assert cuts >= 0.5 * len(report.installed), (cuts, len(report.installed))


def test_dtensor_answers_the_refuted_calls_wrong_on_its_own_rules(results):
    """What REFUTED records, on plain DTensor 2.13: a height-cut convolution returns the
    wrong shape; cosine_embedding_loss with column-cut input2 the wrong value; gather with
    a row-cut index shorter than self wrong values. (When DTensor
    fixes them, this fails: the replacement is then no longer needed.)"""
    out, _ = results
    (conv, cos, _, *gathers), _ = out["refuted calls"]
    assert isinstance(conv[1], AssertionError) or conv[1].shape != F.conv2d(CONV_X, CONV_W, padding=1).shape
    assert not torch.allclose(cos[1], F.cosine_embedding_loss(COS_A, COS_B, COS_T))
    for placements, got in gathers:
        assert isinstance(got, AssertionError) or not torch.equal(got, _gather_1(GATHER_SELF, GATHER_INDEX))


def test_refuted_calls_run_right_under_the_replacement(results):
    """Under register(replace_refuted=True) the same calls match one device, shapes and values;
    the batch-cut convolution, right before, stays right and stays cut (a verified rule)."""
    out, report = results
    assert set(dtensor_rules.REFUTED) <= set(report.replaced)
    (_, _, plain_batch, *_), (conv, cos, batch, *gathers) = out["refuted calls"]
    want = F.conv2d(CONV_X, CONV_W, padding=1)
    torch.testing.assert_close(conv[1], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cos[1], F.cosine_embedding_loss(COS_A, COS_B, COS_T))
    for placements, got in gathers:
        torch.testing.assert_close(got, _gather_1(GATHER_SELF, GATHER_INDEX), rtol=0, atol=0)
    torch.testing.assert_close(plain_batch[1], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batch[1], want, rtol=1e-5, atol=1e-5)
    assert batch[0] == (Shard(0),)


CONVS = {  # (input, weight) shapes; the input is cut along its last (spatial) dim
    "conv1d": ((2, 3, 8), (4, 3, 3)), "conv2d": ((2, 3, 8, 8), (4, 3, 3, 3)),
    "conv3d": ((1, 2, 4, 4, 8), (3, 2, 3, 3, 3)), "conv_transpose1d": ((2, 3, 8), (3, 4, 3)),
    "conv_transpose2d": ((2, 3, 8, 8), (3, 4, 3, 3)), "conv_transpose3d": ((1, 2, 4, 4, 8), (2, 3, 3, 3, 3)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_a_spatially_cut_convolution_and_its_gradients_match_one_device_under_the_replacement(results, name):
    _, report = results
    assert "aten.convolution.default" in report.replaced
    fn = getattr(F, name)
    g = torch.Generator().manual_seed(1)
    x, w = (torch.randn(s, generator=g, requires_grad=True) for s in CONVS[name])
    want = fn(x, w, padding=1)
    want_grads = torch.autograd.grad(want.sum(), (x, w))
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        dx, dw = distribute_tensor(x, mesh, [Shard(x.ndim - 1)]), distribute_tensor(w, mesh, [Replicate()])
        got = fn(dx, dw, padding=1)
        full = got.full_tensor()
        grads = torch.autograd.grad(full.sum(), (dx, dw))
        got_full = _full_on_every_rank(got)
        got_grads = [_full_on_every_rank(t) for t in grads]
    assert got_full.shape == want.shape
    torch.testing.assert_close(got_full, want.detach(), rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_pinv_with_cut_keyword_thresholds_matches_one_device_under_the_replacement(results):
    """linalg_pinv.rcond_tensor decomposes into atol_rtol_tensor with rtol= a keyword:
    DTensor's own rule left the cut thresholds where they were and called the output
    Replicate; the verified strategies that replace it keep the cut (Shard(0) out)."""
    _, report = results
    assert "aten.linalg_pinv.atol_rtol_tensor" in report.replaced
    g = torch.Generator().manual_seed(0)
    a, r = torch.randn(4, 6, generator=g, dtype=torch.float64), torch.rand(4, 6, generator=g, dtype=torch.float64)
    want = torch.linalg.pinv(a, rcond=r)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        got = torch.linalg.pinv(distribute_tensor(a, mesh, [Replicate()]), rcond=distribute_tensor(r, mesh, [Shard(0)]))
        assert got.placements == (Shard(0),)
        full = _full_on_every_rank(got)
    torch.testing.assert_close(full, want)


# --- bad input to the table and registration APIs: refused when given, naming it ---

from metaspmd.table import Entry  # noqa: E402


@pytest.mark.parametrize("rules,error,message", [
    ({"aten.mm.default": 5}, TypeError,
     r"rule table entry 'aten.mm.default': expected an op name -> \{signature: Entry\}, got str -> int 5"),
    ("junk", TypeError, r"a rule table is a dict op -> \{signature: Entry\} .*, got a str"),
    ({"aten.mm.default": {"self:f[*,*] mat2:f[*,*]": ("[[S1, N], [N, S2]]", "{}")}}, TypeError,
     (r"rule table entry 'aten.mm.default', signature 'self:f\[\*,\*\] mat2:f\[\*,\*\]': expected a str "
      r"signature -> metaspmd.table.Entry, got str -> tuple")),
    ({"aten.mm.default": {"self:f[*,*] mat2:f[*,*]": Entry("[[S1, Q], [N, S2]]", "{S1: gather(dim=0), S2: gather(dim=1)}")}}, ValueError,
     r"rule table entry 'aten.mm.default', signature 'self:f\[\*,\*\] mat2:f\[\*,\*\]': .* does not parse"),
    # a key no lookup would match: the op was then replicated, and the warning blamed live exploration
    ({"aten.mm.default": {"self:f[*,* mat2:f[*,*]": Entry("[[S1, N], [N, S2]]", "{S1: gather(dim=0), S2: gather(dim=1)}")}},
     ValueError, r"rule table entry 'aten.mm.default': signature 'self:f\[\*,\* mat2:f\[\*,\*\]' is not one "
     r"metaspmd writes: expected tensor dims"),
    ({"aten.mm.default": {"self:f[*,*] other:f[*,*]": Entry("[[S1, N], [N, S2]]", "{S1: gather(dim=0), S2: gather(dim=1)}")}},
     ValueError, r"rule table entry 'aten.mm.default', signature 'self:f\[\*,\*\] other:f\[\*,\*\]': "
     r"aten.mm.default takes no argument 'other'"),
    # the registry loader refuses these; the table kept the cut and dropped the Partial
    ({"aten.mm.default": {"self:f[*,*] mat2:f[*,*]": Entry("[[S1, N], [N, S2]]", "{S1: gather(dim=0), S2: gather(dim=1)}",
                                                          "[[S1(sum)], []]")}},
     ValueError, r"signature 'self:f\[\*,\*\] mat2:f\[\*,\*\]': partial: partial input 0: S1 cuts that input too"),
    ({"aten.mm.default": {"self:f[*,*] mat2:f[*,*]": Entry("[[S1, N], [N, S2]]", "{S1: gather(dim=0), S2: gather(dim=1), "
                                                                                 "S3: reduce(sum)}")}},
     ValueError, r"combine: unknown label S3: no input is sharded or partial under it"),
])
def test_add_table_refuses_what_is_no_table_and_keeps_the_tables(rules, error, message):
    before = table.table().entries("aten.mm.default")
    with pytest.raises(error, match=message):
        table.add_table(rules)
    assert table.table().entries("aten.mm.default") is before  # nothing added: later lookups unharmed
    x = torch.randn(4, 6)
    assert table.lookup(torch.ops.aten.mm.default, (x, x.T), {})


def test_register_takes_one_op_name_as_that_op():
    report = dtensor_rules.register(ops="aten.mm.default")
    try:
        assert set(report.skipped) | set(report.installed) == {"aten.mm.default"}, report
    finally:
        dtensor_rules.unregister(report)
    with pytest.raises(TypeError, match=r"ops must be op names such as \"aten.mm.default\", got 5 of type int"):
        dtensor_rules.register(ops=["aten.mm.default", 5])
    with pytest.raises(TypeError, match=r"ops must be op names .* or None, got 5 of type int"):
        dtensor_rules.register(ops=5)


def test_register_takes_a_packet_as_each_of_its_overloads():
    """A packet iterates as its overloads' bare names ("default"): each was skipped as
    "no rule in the table" and nothing was registered."""
    report = dtensor_rules.register(torch.ops.aten.mm)
    try:
        named = set(report.skipped) | set(report.installed)
        assert named == {f"aten.mm.{o}" for o in torch.ops.aten.mm.overloads()}, report
        assert report.skipped["aten.mm.default"] == "DTensor has its own rule"
    finally:
        dtensor_rules.unregister(report)


@pytest.mark.parametrize("call,message", [
    (lambda: dtensor_rules.register(["aten.mm.default"], replace_refuted="no"),
     r"replace_refuted must be a bool \(True: .*\), got a str 'no'"),
    (lambda: dtensor_rules.register(["aten.mm.default"], cache="/tmp/rules"),
     r"cache must be a metaspmd.cache.RuleCache or None, got a str '/tmp/rules': pass "
     r"metaspmd.cache.RuleCache\('/tmp/rules'\)"),
    (lambda: dtensor_rules.register_op(rms_norm, (torch.randn(4, 16), torch.randn(16), 1e-6), cache="/tmp/rules"),
     r"cache must be a metaspmd.cache.RuleCache or None, got a str '/tmp/rules'"),
])
def test_register_refuses_options_of_the_wrong_type_before_any_work(call, message, monkeypatch):
    monkeypatch.setattr(dtensor_rules, "_install", lambda *a: pytest.fail("installed"))
    with pytest.raises(TypeError, match=message):
        call()


@pytest.mark.parametrize("op,args,error,message", [
    (torch.ops.aten.mm, (torch.randn(2, 3), torch.randn(3, 2)), TypeError,
     (r"register_op takes one overload of an op, got the packet torch.ops.aten.mm \(overloads: default, .*\): "
      r"pass one of them, e.g. torch.ops.aten.mm.default")),
    (torch.ops.metaspmd_examples.rms_norm.default, torch.randn(4, 3), TypeError,
     r"args must be a tuple of the op's positional arguments, got a torch.Tensor \(for one argument write \(x,\)\)"),
    (len, (1,), TypeError, r"register_op takes an op overload .* got a builtin_function_or_method"),
    (torch.ops.metaspmd_examples.rms_norm.default, (torch.randn(4, 3), torch.randn(3), 1e-6, 2), TypeError,
     r"the example call of metaspmd_examples.rms_norm.default does not fit its schema \(metaspmd_examples::rms_norm"
     r".*\): it takes at most 3 positional arguments, got 4"),
    (torch.ops.aten.mm.default, (torch.randn(2, 3),), TypeError, r"aten.mm.default .*: argument 'mat2' is missing"),
])
def test_register_op_refuses_what_is_no_overload_or_no_call(op, args, error, message):
    with pytest.raises(error, match=message):
        dtensor_rules.register_op(op, args)


@pytest.mark.parametrize("example,error,message", [
    (lambda x, w: (x, "w", 1e-6), ValueError,
     r"^the example call of metaspmd_examples\.rms_norm\.default fails, so it shows no rule: RuntimeError: .*"
     r"Expected a value of type 'Tensor' for argument 'weight' but instead found type 'str'\. Pass a call the op runs$"),
    (lambda x, w: (x, torch.randn(5), 1e-6), ValueError,
     r"fails, so it shows no rule: RuntimeError: The size of tensor a \(16\) must match the size of tensor b \(5\)"),
    (lambda x, w: (x.to("meta"), w.to("meta"), 1e-6), TypeError,
     r"has a tensor of shape \[8, 16\] on the meta device, which holds no values to explore"),
])
def test_register_op_refuses_an_example_the_op_refuses_though_its_signature_is_cached(tmp_path, monkeypatch,
                                                                                       example, error, message):
    """The wildcard signature of a good call (``x:f[*,*] weight:f[*]``) also covers a weight
    of the wrong length: a cached entry would install without the example ever running."""
    from metaspmd.cache import RuleCache

    x, w = torch.randn(8, 16), torch.randn(16)
    dtensor_rules.unregister(dtensor_rules.register_op(rms_norm, (x, w, 1e-6), cache=RuleCache(tmp_path)))
    monkeypatch.setattr(dtensor_rules, "_install", lambda *a: pytest.fail("installed"))
    with pytest.raises(error, match=message):
        dtensor_rules.register_op(rms_norm, example(x, w), cache=RuleCache(tmp_path))


def test_register_op_runs_the_example_on_copies_of_its_tensors(tmp_path, monkeypatch):
    """In this process where no child can be forked (CUDA started): an in-place op's
    example must not write the caller's tensor."""
    from metaspmd.backends.torch import rules_at_runtime
    from metaspmd.cache import RuleCache

    monkeypatch.setattr(rules_at_runtime, "live_exploration", lambda: None)
    x = torch.randn(8, 6)
    before = x.clone()
    report = dtensor_rules.register_op(torch.ops.aten.cumsum_.default, (x, 1), cache=RuleCache(tmp_path))
    dtensor_rules.unregister(report)
    assert torch.equal(x, before)


def test_register_op_takes_a_custom_op_object_as_the_op_it_defines(tmp_path):
    from metaspmd.cache import RuleCache

    assert not isinstance(rms_norm, torch._ops.OpOverload)  # torch.library.custom_op's CustomOpDef
    x, w = torch.randn(8, 6, 16), torch.randn(16)
    report = dtensor_rules.register_op(rms_norm, (x, w, 1e-6), cache=RuleCache(tmp_path))
    try:
        assert report.installed == ["metaspmd_examples.rms_norm.default"], report.skipped
    finally:
        dtensor_rules.unregister(report)


@torch.library.custom_op("metaspmd_test::doubled_without_fake", mutates_args=())
def doubled_without_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_register_op_skips_an_op_dtensor_cannot_find_shapes_of_and_says_why(tmp_path):
    """DTensor works out a call's output shapes on fake tensors: a custom op with no fake
    kernel was reported installed, and its first call on DTensor then failed."""
    from metaspmd.cache import RuleCache

    op = torch.ops.metaspmd_test.doubled_without_fake.default
    report = dtensor_rules.register_op(op, (torch.randn(8, 4),), cache=RuleCache(tmp_path))
    assert not report.installed and not any(tmp_path.iterdir())  # refused before exploring
    assert "DTensor cannot find its output shapes on fake tensors" in report.skipped[str(op)]
    assert "register_fake" in str(report)


def test_every_op_refuted_at_some_calls_is_called_at_one(results):
    called = {key.split(":")[0] for key in set(REFUTED_AT_CALLS).union(*CALL_GROUPS.values())} | {
        "aten.fill_.Scalar", "aten.gather.default"}  # (their refuted calls: "refuted calls")
    assert called == set(dtensor_rules.REFUTED_AT)


@pytest.mark.parametrize(("group", "name"), [(g, n) for g, calls in CALL_GROUPS.items() for n in sorted(calls)])
def test_a_call_dtensor_misreads_matches_one_device_under_the_replacement(results, group, name):
    """Unbatched pooling: DTensor's rule cuts dim 1 as the channels, but it is the first
    spatial dim (the adaptive pooling gradient was wrong, max_unpool failed). An argument
    DTensor's rule does not read: embedding's gradient scaled by index counts summed each
    rank's own counts; nll_loss's mean averaged the ranks' means over their own targets not
    ignored. A Partial input passed through an op not linear (or not non-decreasing) in it at
    the call's arguments: each rank's part transformed on its own. (When DTensor fixes them,
    the first assert fails.)"""
    out, report = results
    plain, replaced = (found[name] for found in out[group])
    fn, ins, _ = CALL_GROUPS[group][name]
    want = fn(*ins)
    assert isinstance(plain, Exception) or plain.shape != want.shape or not (
        torch.allclose(plain, want) if want.is_floating_point() else torch.equal(plain, want)), plain
    assert name.split(":")[0] in report.replaced
    assert not isinstance(replaced, Exception), f"{type(replaced).__name__}: {replaced}"
    torch.testing.assert_close(replaced, want)


# The same ops at calls DTensor's rule reads right: they keep it, and its cut (name: fn,
# inputs, their placements, the output's placement under DTensor's rule).
KEPT_CALLS = {
    "aten.embedding_dense_backward.default": (
        lambda g, i: _A.embedding_dense_backward.default(g, i, 6, -1, False),
        *UNREAD_ARGUMENT_CALLS["aten.embedding_dense_backward.default"][1:], Partial("sum")),
    "aten.nll_loss_forward.default": (
        lambda x, t: _A.nll_loss_forward.default(x, t, None, 2, -100)[0],  # reduction='sum'
        *UNREAD_ARGUMENT_CALLS["aten.nll_loss_forward.default"][1:], Partial("sum")),
    "aten._adaptive_avg_pool2d_backward.default": (  # batched: dim 1 is the channels
        _A._adaptive_avg_pool2d_backward.default,
        [torch.randn(2, 8, 7, 7, generator=_G), torch.randn(2, 8, 16, 8, generator=_G)], [_COLUMNS] * 2, _COLUMNS),
    "aten.threshold.default": (  # value <= threshold: non-decreasing, Partial(max) passes
        lambda m: F.threshold(m.amax(0), 0.0, -5.0), [_PARTS], _MAX_PARTS, Partial("max")),
    "aten.sum.default": (lambda a, b: torch.sum(a @ b), [_ONES, _FRACTIONS], _SUM_PARTS, Partial("sum")),
    "aten.gather.default": (  # index as long as self along the cut rows (log-probabilities of targets)
        _gather_1, [torch.randn(8, 12, generator=_G), torch.randint(0, 12, (8, 3), generator=_G)], [_ROWS] * 2,
        _ROWS),
}


@pytest.mark.parametrize("name", sorted(KEPT_CALLS))
def test_a_call_dtensor_reads_right_keeps_its_rule_and_its_cut(results, name):
    """A call of an op refuted at some calls only, at a call it is not refuted at, runs
    DTensor's own rule: a strategy function or, expanded to the mesh, a single-dim strategy."""
    _, report = results
    assert name in report.replaced
    fn, ins, placements, want = KEPT_CALLS[name]
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        got = fn(*[distribute_tensor(t, mesh, [p]) for t, p in zip(ins, placements)])
        placed, full = got.placements, _full_on_every_rank(got)
    assert placed == (want,)
    torch.testing.assert_close(full, fn(*ins))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_batch_cut_loss_reduces_scalars_not_the_input(fake_world_of, tmp_path, reduction):
    """cross_entropy of batch-cut logits with padded targets: plain DTensor's mean is the
    ranks' means averaged (wrong); the verified rules of the mean gathered the logits, every
    rank computing the whole loss. register() runs the mean as its sum over its total
    weight: two scalar all-reduces, the logits' gradient kept cut, and right."""
    from torch.distributed.tensor.debug import CommDebugMode

    from metaspmd.cache import RuleCache

    fake_world_of(WORLD)
    x, t = UNREAD_ARGUMENT_CALLS["aten.nll_loss_forward.default"][1]
    x = x.double()
    whole = x.clone().requires_grad_()
    want = F.cross_entropy(whole, t, reduction=reduction)
    want.backward()
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        report = dtensor_rules.register(cache=RuleCache(tmp_path))
        try:
            cut, targets = distribute_tensor(x, mesh, [_ROWS]).requires_grad_(), distribute_tensor(t, mesh, [_ROWS])
            with CommDebugMode() as comms:
                loss = F.cross_entropy(cut, targets, reduction=reduction)
                loss.backward()
            got, grad = _full_on_every_rank(loss), _full_on_every_rank(cut.grad)
            handler = DTensor._op_dispatcher._custom_op_handlers.get(torch.ops.aten.nll_loss_forward.default)
        finally:
            dtensor_rules.unregister(report)
    assert handler is dtensor_handlers.mean_as_sum_handler  # (this register()'s, or an earlier one's still in place)
    torch.testing.assert_close(got, want.detach())
    torch.testing.assert_close(grad, whole.grad)
    assert cut.grad.placements == (_ROWS,)
    counts = {str(k).split(".")[-1]: n for k, n in comms.get_comm_counts().items()}
    assert set(counts) <= {"all_reduce"} and counts.get("all_reduce", 0) <= 2, counts


def test_a_call_that_leaves_an_output_none_keeps_the_cuts_of_the_others(fake_world_of, tmp_path):
    """The first convolution of a batch-cut net: its input needs no gradient, so the
    backward's output_mask leaves grad_input None, and the verified strategies of that call
    place two outputs of the schema's three. They were dropped, and the batch was gathered
    on every rank; now the weight's and bias's gradients stay Partial(sum), as on plain
    DTensor, with no communication."""
    from torch.distributed.tensor.debug import CommDebugMode

    from metaspmd.cache import RuleCache

    fake_world_of(WORLD)
    g = torch.Generator().manual_seed(6)
    x, w, b = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((8, 3, 6, 6), (4, 3, 3, 3), (4,)))
    want = [t.clone().requires_grad_() for t in (w, b)]
    F.conv2d(x, *want, padding=1).sum().backward()
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        report = dtensor_rules.register(cache=RuleCache(tmp_path))
        try:
            params = [distribute_tensor(t, mesh, [Replicate()]).requires_grad_() for t in (w, b)]
            cut = distribute_tensor(x, mesh, [_ROWS])
            with CommDebugMode() as comms:
                F.conv2d(cut, *params, padding=1).sum().backward()
            grads = [(p.grad.placements, _full_on_every_rank(p.grad)) for p in params]
        finally:
            dtensor_rules.unregister(report)
    assert comms.get_total_counts() == 0, comms.get_comm_counts()
    for (placements, got), expected in zip(grads, want):
        assert placements == (Partial("sum"),)
        torch.testing.assert_close(got, expected.grad)


@pytest.mark.parametrize("transposed", [False, True])
def test_an_absent_output_stays_absent_on_a_mesh_of_two_dims(fake_world_of, tmp_path, transposed):
    """A bias-free convolution's backward leaves grad_bias None. Strategies that placed it
    and strategies that did not expanded, over a 2 x 2 mesh, into a spec of both,
    ``(Replicate(), None)``, which the uneven-cut guard could not read: the backward failed
    with "'NoneType' object has no attribute 'is_partial'"."""
    from metaspmd.cache import RuleCache

    fake_world_of(WORLD)
    conv = F.conv_transpose2d if transposed else F.conv2d
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 9, 9, generator=g, dtype=torch.float64)
    w = torch.randn(*((2, 3) if transposed else (3, 2)), 1, 3, generator=g, dtype=torch.float64)
    want = [t.clone().requires_grad_() for t in (x, w)]
    conv(*want, stride=2).sum().backward()
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", [[0, 1], [2, 3]])
        report = dtensor_rules.register(cache=RuleCache(tmp_path))
        try:
            ins = [distribute_tensor(t, mesh, placed).requires_grad_()
                   for t, placed in ((x, [_ROWS, Replicate()]), (w, [Replicate(), Shard(0)]))]
            conv(*ins, stride=2).sum().backward()
            grads = [_full_on_every_rank(t.grad) for t in ins]
        finally:
            dtensor_rules.unregister(report)
    for got, expected in zip(grads, want):
        torch.testing.assert_close(got, expected.grad)


@pytest.mark.parametrize("name", sorted(REFUTED_AT_CALLS))
def test_a_call_refuted_at_runs_right_under_the_replacement(results, name):
    """On DTensor's own rule the call is wrong (each rank's reduction or scan of its own
    slice, called one cut result) or fails; under register() it matches one device. (When
    DTensor fixes it, the first part fails: the replacement is then no longer needed.)"""
    out, report = results
    plain, replaced = (calls[name] for calls in out["refuted-at calls"])
    want = REFUTED_AT_CALLS[name][0](REFUTED_AT_X, torch.zeros(1, 1))
    assert isinstance(plain, Exception) or not torch.allclose(plain, want), plain
    assert name.split(":")[0] in report.replaced
    assert not isinstance(replaced, Exception), f"{type(replaced).__name__}: {replaced}"
    torch.testing.assert_close(replaced, want)


def test_the_gradient_of_an_inf_norm_counts_its_maxima_once(results):
    """norm(p=inf)'s backward splits the gradient among the maxima, counted by
    sum(mask, dim=[], keepdim=True): on a row-cut input DTensor's rule counted each rank's
    own maxima, and every rank but the one holding the maximum divided by 0. Other calls of
    sum keep DTensor's rule."""
    x = REFUTED_AT_X.clone()
    x[5, 2] = 10.0
    want = torch.func.grad(lambda t: torch.linalg.vector_norm(t, float("inf")))(x)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        xd = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_()
        torch.linalg.vector_norm(xd, float("inf")).backward()
        got = _full_on_every_rank(xd.grad)
        rows = torch.ops.aten.sum.dim_IntList(distribute_tensor(x, mesh, [Shard(0)]), [1], True)
        assert rows.placements == (Shard(0),)  # DTensor's own rule, not refuted there
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("shape", [(8, 6, 3), (10, 6, 3), (4, 8)])
def test_the_gradient_of_select_from_the_end_keeps_the_cut(results, shape):
    """select(t, -1, i)'s gradient on a row-cut t: DTensor's rule for select_backward
    called it cut along dim 1, and its shards failed or, at (4, 8), broadcast into wrong
    values. Under register() it matches one device and stays cut along the rows, evenly or
    not (10 over 4): DTensor restates the gradient's sizes from the output's local shape
    itself, so cut strategies install."""
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
    want = torch.func.grad(lambda v: (v.select(-1, 1) * v.select(-1, 2)).sum())(t)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        td = distribute_tensor(t, mesh, [Shard(0)]).requires_grad_()
        (td.select(-1, 1) * td.select(-1, 2)).sum().backward()
        placements, got = td.grad.placements, _full_on_every_rank(td.grad)
    assert placements == (Shard(0),)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", sorted(MEAN_LOSSES))
def test_a_mean_from_a_decomposition_is_no_mean_of_uneven_shards(results, name):
    """DTensor's rule from the loss's decomposition, traced on one device where every cut is
    even, calls the mean of 10 rows over 4 ranks Partial(avg): the mean of the ranks' means,
    wrong (when DTensor fixes it, the first assert fails). register() drops such a strategy
    where an input is cut unevenly; on an even cut it stays, and is right
    (binary_cross_entropy_with_logits runs the table's rules, which register() installs)."""
    out, report = results
    plain, replaced, even = out["mean losses"]
    want = MEAN_LOSSES[name](UNEVEN_X, UNEVEN_Y)
    assert plain[name][0] == (Partial("avg"),) and not torch.allclose(plain[name][1], want)
    assert dtensor_rules.DECOMPOSED_EVEN in report.guarded
    assert replaced[name][0] != (Partial("avg"),)
    torch.testing.assert_close(replaced[name][1], want)
    if f"aten.{name}.default" not in report.installed:  # DTensor's own strategy, derived, stays
        assert even[name][0] == (Partial("avg"),)
    torch.testing.assert_close(even[name][1], MEAN_LOSSES[name](EVEN_X, EVEN_Y))


def test_the_machinery_guards_are_the_whole_registers_and_go_with_it(results):
    """The guards of DTensor's machinery (its decomposition path, its masked Partial) are
    put by a register() of every op, once: a call that names ops puts none (but the
    empty-shard guard, for its ops), and
    unregistering that call leaves them; unregistering the one that put them takes them
    back (done here on the guards alone, so the module's register() stays)."""
    from torch.distributed.tensor import _sharding_prop

    _, report = results
    propagator = DTensor._op_dispatcher.sharding_propagator
    decomp = propagator.decomp_strategy
    assert "propagate_strategy" in vars(decomp) and "propagate_op_sharding_non_cached" in vars(propagator)
    again = dtensor_rules.register(["aten.mm.default"])
    assert again.guarded == [dtensor_empty.EMPTY_SHARDS_TRIED]  # for mm alone
    dtensor_rules.unregister(again)
    assert "propagate_strategy" in vars(decomp) and "propagate_op_sharding_non_cached" in vars(propagator)
    assert _sharding_prop._select_min_cost_strategy is dtensor_empty._select_taken  # the whole register()'s
    cached = propagator.propagate_op_sharding
    dtensor_rules._unguard_decompositions(report)
    dtensor_rules._unguard_masks(report)
    try:
        assert "propagate_strategy" not in vars(decomp) and "propagate_op_sharding_non_cached" not in vars(propagator)
        assert propagator.propagate_op_sharding is not cached  # DTensor's own cache is back
    finally:
        dtensor_rules._guard_decompositions(report)
        dtensor_rules._guard_masks(report)
    assert set(report.guarded) == {dtensor_rules.DECOMPOSED_EVEN, dtensor_rules.DECOMPOSED_WRITES,
                                   dtensor_rules.RULES_WRITES, dtensor_empty.EMPTY_SHARDS_TRIED,
                                   dtensor_rules.MASKS_REDUCED, dtensor_rules.IN_PLACE_FALLBACK}


def test_an_output_cut_to_another_length_stays_cut_on_even_cuts_only(results):
    """pixel_shuffle of a width cut gathers the ranks' outputs, each twice its input's
    width: right as a concatenation, but DTensor takes a cut's local lengths to be
    torch.chunk's. Of 5 columns over 4 ranks (2, 2, 1, 0) the outputs hold 4, 4, 2 and 0
    columns, which DTensor read as 3, 3, 3 and 1 (the rule DTensor derives from the
    decomposition, and the verified one register() installs, alike). On such a cut the
    strategy goes; on an even one (8 columns) it stays."""
    _, report = results
    assert "aten.pixel_shuffle.default" in report.installed
    g = torch.Generator().manual_seed(2)
    for width, cut in ((5, False), (8, True)):
        x = torch.randn(2, 12, 3, width, generator=g)
        with LocalTensorMode(frozenset(range(WORLD))):
            mesh = DeviceMesh("cpu", list(range(WORLD)))
            got = F.pixel_shuffle(distribute_tensor(x, mesh, [Shard(3)]), 2)
            full = _full_on_every_rank(got)
        assert (got.placements == (Shard(3),)) == cut, (width, got.placements)
        torch.testing.assert_close(full, F.pixel_shuffle(x, 2))


def test_a_calls_output_shapes_are_its_own(results):
    """Where a cut is uneven, the installed strategies are checked against the call's output
    shapes. DTensor's cached shape propagation keys on the arguments its schema info names
    only: aminmax over dim 1 got the shapes of aminmax over every dim, called just before
    (0-d), and failed (IndexError)."""
    x = torch.randn(5, 5, 5, generator=torch.Generator().manual_seed(3))
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        whole = torch.aminmax(distribute_tensor(x, mesh, [Replicate()]))
        along = torch.ops.aten.aminmax.default(distribute_tensor(x, mesh, [Replicate()]), dim=1)
        got = [_full_on_every_rank(t) for t in (*whole, *along)]
    for g, w in zip(got, (*torch.aminmax(x), *torch.aminmax(x, dim=1))):
        torch.testing.assert_close(g, w)


def test_an_op_whose_rules_dtensor_cannot_run_runs_replicated_and_keeps_a_cut_that_holds(results):
    """hash_tensor's rules over a hashed dim reduce by xor, which DTensor has no Partial for,
    and DTensor has no rule or decomposition of it: before register() every call raised
    NotImplementedError. After, a call runs, replicated where no verified strategy keeps its
    cut, and row-cut where one does (hashing along dim 1)."""
    _, report = results
    assert "aten.hash_tensor.default" in report.installed
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(5))
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        whole = torch.hash_tensor(distribute_tensor(x, mesh, [Shard(0)]))
        rows = torch.hash_tensor(distribute_tensor(x, mesh, [Shard(0)]), dim=1)
        got = [(t.placements, _full_on_every_rank(t)) for t in (whole, rows)]
    assert [p for p, _ in got] == [(Replicate(),), (Shard(0),)]
    torch.testing.assert_close(got[0][1], torch.hash_tensor(x), rtol=0, atol=0)
    torch.testing.assert_close(got[1][1], torch.hash_tensor(x, dim=1), rtol=0, atol=0)


# A data-parallel training step on real ranks: a batch-cut input through replicated
# weights, cross_entropy with padded targets, a fused Adam step (its gradients Partial(sum)).
DATA_PARALLEL = """
g = torch.Generator().manual_seed(7)
x, w0 = torch.randn(8, 6, generator=g, dtype=torch.float64), torch.randn(6, 5, generator=g, dtype=torch.float64)
t = torch.randint(0, 5, (8,), generator=g)
t[:3] = -100  # padding, all on rank 0's rows: the ranks' means and the mean differ
w = torch.nn.Parameter(w0.clone())
want_loss = F.cross_entropy(x @ w, t)
want_loss.backward()
torch.optim.Adam([w], lr=0.1, fused=True).step()
wd = torch.nn.Parameter(distribute_tensor(w0.clone(), mesh, [Replicate()]))
loss = F.cross_entropy(distribute_tensor(x, mesh, [Shard(0)]) @ wd, distribute_tensor(t, mesh, [Shard(0)]))
loss.backward()
got["grad"] = bool(torch.allclose(wd.grad.full_tensor(), w.grad))
torch.optim.Adam([wd], lr=0.1, fused=True).step()
got["loss"] = bool(torch.allclose(loss.full_tensor(), want_loss))
got["step"] = bool(torch.allclose(wd.full_tensor(), w.detach()))
"""


@pytest.mark.slow  # two processes that import torch, twice
@pytest.mark.parametrize("registered", [False, True])
def test_a_data_parallel_step_on_two_gloo_ranks(on_two_gloo_ranks, registered):
    """Plain DTensor's loss is the mean of the ranks' means, wrong with padded targets (its
    gradient, scaled by the whole total weight, is right); under register() the loss is its
    sum over its weight (two scalar all-reduces), and the fused step, which register() had
    refused for its Partial(sum) gradient, reads it: all match one device."""
    for got in on_two_gloo_ranks(DATA_PARALLEL, registered):
        assert got == {"grad": True, "loss": registered, "step": True}, got
