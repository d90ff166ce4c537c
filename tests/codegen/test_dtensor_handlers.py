"""register()'s handlers for ops DTensor refuses for machinery reasons (dtensor_handlers):
data-dependent output shapes run all-replicated, DTensor's logsumexp and as_strided
extended where they raise. Values and shapes against one device on a fake process group of
4 with LocalTensorMode; DTensor's own answers where it had them unchanged."""

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from metaspmd.backends.torch import dtensor_handlers, dtensor_rules
from metaspmd.backends.torch.parallelize import redistribute
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.utils._python_dispatch import _disable_current_modes

WORLD = 4
REGISTRY = Path(__file__).resolve().parents[2] / "registry" / "torch"
ALL = sorted(set(dtensor_handlers.REPLICATED) | set(dtensor_handlers.REPLICATE_ONLY) | set(dtensor_handlers.EXTENDED)
             | set(dtensor_handlers.INPLACE_VIEWS))
G = torch.Generator().manual_seed(0)
X = torch.where(torch.rand(8, 4, generator=G) > 0.5, torch.randn(8, 4, generator=G), torch.zeros(8, 4))
INTS = torch.randint(0, 5, (8,), generator=G)
SIGNAL, WINDOW = torch.randn(100, generator=G), torch.hann_window(10)
# made here, outside LocalTensorMode, where a draw would differ by rank
CTC = (torch.randn(12, 4, 5, generator=G).log_softmax(2), torch.randint(1, 5, (10,), generator=G),
       torch.tensor([12, 10, 12, 8]), torch.tensor([3, 1, 4, 2]))


def _status(name: str) -> str:
    for line in (REGISTRY / f"{name}.yaml").read_text().splitlines():
        if line.startswith("status:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{name}: no status line in its registry file")


def _full(x):
    """A DTensor's (or a tuple's) global value, every simulated rank agreeing."""
    if isinstance(x, (tuple, list)):
        return type(x)(_full(t) for t in x)
    if not isinstance(x, DTensor):
        return x
    full = x.full_tensor()
    ranks = list(full._local_tensors.values()) if isinstance(full, LocalTensor) else [full]
    for r in ranks[1:]:
        assert r.shape == ranks[0].shape and torch.equal(r, ranks[0])
    return ranks[0]


def test_every_replicated_op_is_deterministic_in_the_registry():
    """The all-replicated strategy is sound for a deterministic op: the registry's status
    says the sweep ran it so (ok, derived, replicate-only)."""
    for name in dtensor_handlers.REPLICATED:
        assert _status(name) in ("ok", "derived", "replicate-only"), name
    for name in dtensor_handlers.REPLICATE_ONLY:
        assert _status(name) == "replicate-only", name


def test_every_data_dependent_op_dtensor_lacks_is_handled_or_has_a_reason():
    """Ops tagged with a data-dependent output (shape or value) are the ones DTensor's
    fake-tensor propagation refuses: each one DTensor has no rule for is run all-replicated
    (composite ones decompose before DTensor sees them; out= variants write their inputs)."""
    from metaspmd.backends.torch.dtensor import dtensor_has_rule

    tags = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)
    missing = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        packet = getattr(torch.ops.aten, qualified[6:], None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            name = f"aten.{qualified[6:]}.{overload}"
            if not any(t in op.tags for t in tags) or op._schema.is_mutable or dtensor_has_rule(op) \
                    or torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
                continue
            if name not in dtensor_handlers.REPLICATED:
                missing.append(name)
    assert not missing, missing


@pytest.fixture(scope="module")
def mesh(fake_world_of):
    warnings.filterwarnings("ignore")
    fake_world_of(WORLD)
    with LocalTensorMode(frozenset(range(WORLD))):
        yield DeviceMesh("cpu", list(range(WORLD)))


@pytest.fixture(scope="module")
def before(mesh):
    """What plain DTensor does with the calls below, before any handler is installed."""
    out = {}
    calls = {"nonzero": lambda: torch.nonzero(distribute_tensor(X, mesh, [Replicate()])),
             "logsumexp 0-d": lambda: torch.logsumexp(distribute_tensor(torch.tensor(0.5), mesh, [Replicate()]), 0),
             "as_strided": lambda: torch.as_strided(distribute_tensor(X, mesh, [Replicate()]), (3, 2), (1, 2)),
             "logsumexp rows": lambda: torch.logsumexp(distribute_tensor(X, mesh, [Shard(0)]), 1),
             "transpose_": lambda: distribute_tensor(X, mesh, [Shard(0)]).transpose_(0, 1),
             "linspace": lambda: torch.linspace(-2.0, distribute_tensor(torch.tensor(3.0), mesh, [Replicate()]), 5)}
    for key, call in calls.items():
        try:
            out[key] = call()
        except Exception as e:  # noqa: BLE001 -- what DTensor does is the answer here
            out[key] = e
    return out


# table rules register() installs that these calls need: masked_select's backward scatters
# into zeros (masked_scatter); stft pads its signal by reflection; ctc_loss's backward
WITH = ALL + ["aten._ctc_loss_backward.Tensor", "aten.masked_scatter.default", "aten.reflection_pad1d.default"]


_AGAIN: list = []  # reports of a test's register() again, which the module's fixture takes back too


@pytest.fixture(scope="module")
def handled(mesh, before):
    report = dtensor_rules.register(WITH)
    yield report
    for r in (report, *_AGAIN):
        dtensor_rules.unregister(r)


def test_plain_dtensor_refuses_what_the_handlers_run(before):
    assert isinstance(before["nonzero"], RuntimeError) and "nonzero" in str(before["nonzero"])
    assert isinstance(before["logsumexp 0-d"], RuntimeError) and "reduce_dims" in str(before["logsumexp 0-d"])
    assert isinstance(before["as_strided"], RuntimeError)
    assert isinstance(before["transpose_"], NotImplementedError)
    assert isinstance(before["linspace"], NotImplementedError)


def test_register_reports_the_handlers(handled):
    assert set(handled.handled) == set(ALL), handled.handled
    # none for the handled ops (DTensor could not run one) but the replaced: logsumexp's
    # rule, refuted at dim=[], runs beside the handler for a 0-d input
    assert handled.installed == WITH[len(ALL):] + sorted(set(ALL) & set(dtensor_rules.REFUTED))
    assert "aten.logsumexp.default" in handled.replaced


@pytest.mark.parametrize("placement", [Replicate(), Shard(0), Shard(1), Partial()])
def test_nonzero_masked_select_and_unique_match_one_device(mesh, handled, placement):
    """Whatever the input's placement (a Partial one summed first), the outputs are
    Replicate and equal one device's, shapes and values."""
    if isinstance(placement, Partial):
        dx = redistribute(distribute_tensor(X, mesh, [Replicate()]), mesh, (Partial(),))
    else:
        dx = distribute_tensor(X, mesh, [placement])
    got = {
        "nonzero": torch.nonzero(dx),
        "masked_select": torch.masked_select(dx, dx > 0),
        "unique": torch.unique(dx, sorted=True, return_inverse=True, return_counts=True),
        "unique_consecutive": torch.unique_consecutive(dx, return_counts=True),
        "argwhere": torch.argwhere(dx),
    }
    for key, value in got.items():
        for t in value if isinstance(value, tuple) else (value,):
            assert t.placements == (Replicate(),), key
    want = {
        "nonzero": torch.nonzero(X), "masked_select": torch.masked_select(X, X > 0),
        "unique": torch.unique(X, sorted=True, return_inverse=True, return_counts=True),
        "unique_consecutive": torch.unique_consecutive(X, return_counts=True), "argwhere": torch.argwhere(X),
    }
    for key, w in want.items():
        g = _full(got[key])
        for a, b in zip(g if isinstance(g, tuple) else (g,), w if isinstance(w, tuple) else (w,)):
            assert a.shape == b.shape, key
            torch.testing.assert_close(a, b, msg=key)


def test_masked_select_gradient_and_bincount_and_allclose(mesh, handled):
    x = X.clone().requires_grad_(True)
    want = torch.masked_select(x, X > 0)
    (want_grad,) = torch.autograd.grad((want * torch.arange(want.numel())).sum(), x)
    dx = distribute_tensor(x.detach(), mesh, [Shard(0)]).requires_grad_(True)
    got = torch.masked_select(dx, distribute_tensor(X > 0, mesh, [Shard(0)]))
    full = _full(got)
    (grad,) = torch.autograd.grad((got.full_tensor() * torch.arange(full.numel())).sum(), dx)
    torch.testing.assert_close(full, want.detach())
    torch.testing.assert_close(_full(grad), want_grad)
    torch.testing.assert_close(_full(torch.bincount(distribute_tensor(INTS, mesh, [Shard(0)]))), torch.bincount(INTS))
    d = distribute_tensor(X, mesh, [Shard(0)])
    assert torch.allclose(d, d) is True
    assert torch.allclose(d, d + 1) is False


def test_ctc_loss_runs_replicated_with_the_same_log_alpha_on_every_rank(mesh, handled):
    """_ctc_loss's log_alpha is as long as the longest target (a value), and the op leaves
    it unwritten past each target's length: run replicated under torch's NaN fill of new
    memory, every rank holds the same log_alpha, and the loss and its gradient are one
    device's."""
    log_probs, targets, input_lengths, target_lengths = CTC
    x = log_probs.clone().requires_grad_(True)
    want = torch.nn.functional.ctc_loss(x, targets, input_lengths, target_lengths)
    (want_grad,) = torch.autograd.grad(want, x)
    dx = distribute_tensor(log_probs, mesh, [Shard(1)]).requires_grad_(True)
    placed = [distribute_tensor(t, mesh, [Replicate()]) for t in (targets, input_lengths, target_lengths)]
    got = torch.nn.functional.ctc_loss(dx, *placed)
    (grad,) = torch.autograd.grad(got, dx)
    torch.testing.assert_close(_full(got), want.detach())
    torch.testing.assert_close(_full(grad), want_grad)
    _, log_alpha = torch.ops.aten._ctc_loss.Tensor(dx.detach(), *placed, 0, False)
    assert log_alpha.placements == (Replicate(),)
    ranks = list(log_alpha.to_local()._local_tensors.values())
    assert ranks[0].isnan().any()  # the unwritten part, filled
    for r in ranks[1:]:
        torch.testing.assert_close(r, ranks[0], equal_nan=True, rtol=0, atol=0)


def test_a_plain_tensor_mixed_in_is_refused_as_dtensor_refuses_it(mesh, handled):
    """The handler unwraps as DTensor does: a plain mask of many elements may differ by
    rank, so it is not taken as replicated."""
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        torch.masked_select(distribute_tensor(X, mesh, [Replicate()]), X > 0)


def test_combinations_decomposes_onto_the_handler(mesh, handled):
    """combinations of one element masks with a one-element plain tensor, which DTensor
    takes as replicated: it now runs (one of the decompositions that mixed tensors)."""
    x = torch.tensor([1.5])
    got = torch.combinations(distribute_tensor(x, mesh, [Replicate()]), r=1)
    torch.testing.assert_close(_full(got), torch.combinations(x, r=1))


def test_logsumexp_of_a_0d_tensor_runs_and_dtensor_keeps_its_own_rule_elsewhere(mesh, before, handled):
    s = torch.tensor(0.5)
    got = torch.logsumexp(distribute_tensor(s, mesh, [Replicate()]), 0, keepdim=True)
    torch.testing.assert_close(_full(got), torch.logsumexp(s, 0, keepdim=True))
    rows = torch.logsumexp(distribute_tensor(X, mesh, [Shard(0)]), 1)
    assert rows.placements == before["logsumexp rows"].placements == (Shard(0),)  # DTensor's strategy, unchanged
    torch.testing.assert_close(_full(rows), torch.logsumexp(X, 1))


def test_as_strided_views_a_replicated_tensor_and_refuses_reads_outside_it(mesh, handled):
    dx = distribute_tensor(X, mesh, [Replicate()])
    got = torch.as_strided(dx, (3, 2), (1, 2), 1)
    torch.testing.assert_close(_full(got), torch.as_strided(X, (3, 2), (1, 2), 1))
    assert got._local_tensor.untyped_storage().data_ptr() == dx._local_tensor.untyped_storage().data_ptr() \
        or isinstance(got._local_tensor, LocalTensor)  # a view of the local tensor
    same = torch.as_strided(dx, X.shape, X.stride())  # DTensor's own identity view, unchanged
    torch.testing.assert_close(_full(same), X)
    with pytest.raises(RuntimeError):
        torch.as_strided(dx, (2,), (1,), X.numel() - 1)  # reads one element past the tensor
    with pytest.raises(RuntimeError):
        torch.as_strided(distribute_tensor(X, mesh, [Shard(0)]), (3, 2), (1, 2))  # cut: no rank holds it all


def test_unregister_gives_dtensor_its_own_back(mesh, handled):
    dtensor_rules.unregister(handled)
    try:
        with pytest.raises(RuntimeError):
            torch.nonzero(distribute_tensor(X, mesh, [Replicate()]))
        with pytest.raises(RuntimeError):
            torch.logsumexp(distribute_tensor(torch.tensor(0.5), mesh, [Replicate()]), 0)
    finally:
        _AGAIN.append(dtensor_rules.register(WITH))
        assert set(_AGAIN[-1].handled) == set(ALL)  # as the module's fixture left it


def test_an_in_place_transpose_moves_the_cut_and_stft_runs(mesh, handled):
    """transpose_ of a row-cut tensor: DTensor's own transpose map, in place (the rows'
    cut is now dim 1, no data moved); stft, whose decomposition frames the signal with
    as_strided and transposes the frames in place, as one device from a cut signal."""
    d = distribute_tensor(X, mesh, [Shard(0)])
    local = d._local_tensor
    out = d.transpose_(0, 1)
    assert out is d and d.placements == (Shard(1),) and d.shape == (4, 8)
    assert d._local_tensor is local  # transposed where it lies
    torch.testing.assert_close(_full(d), X.t())
    got = torch.stft(distribute_tensor(SIGNAL, mesh, [Shard(0)]), 10, window=distribute_tensor(WINDOW, mesh, [Replicate()]),
                     return_complex=True)
    full = _full(got)
    with _disable_current_modes():  # complex values compared as plain tensors
        torch.testing.assert_close(full, torch.stft(SIGNAL, 10, window=WINDOW, return_complex=True))


def test_linspace_and_logspace_with_a_tensor_end_run_replicated(mesh, handled):
    end = torch.tensor(3.0)
    d_end = distribute_tensor(end, mesh, [Replicate()])
    for got, want in ((torch.linspace(-2.0, d_end, 5), torch.linspace(-2.0, end, 5)),
                      (torch.logspace(0.5, d_end, 4, base=2.0), torch.logspace(0.5, end, 4, base=2.0)),
                      (torch.logspace(d_end, 1.0, 4), torch.logspace(end, 1.0, 4))):
        assert got.placements == (Replicate(),)
        torch.testing.assert_close(_full(got), want)


def test_a_cut_keyword_tensor_is_replicated_first_where_no_strategy_keeps_it(mesh):
    """histogramdd's weight= is a keyword tensor, which DTensor never redistributes; no
    verified strategy keeps it cut (each rank would count its own weights). Plain register()
    strategies leave nothing to choose (the op cannot run); the keyword handler replicates
    the weights and asks again. Replicated weights keep DTensor's path as it was."""
    ops = ["aten._histogramdd_bin_edges.default", "aten._histogramdd_from_bin_cts.default"]
    with _disable_current_modes():
        x, w = torch.rand(8, 2, generator=G), torch.rand(8, generator=G)
        want = torch.histogramdd(x, bins=[2, 2], weight=w).hist
    report = dtensor_rules.register(ops)
    try:
        assert "aten._histogramdd_from_bin_cts.default" in report.handled
        for px, pw in ((Replicate(), Replicate()), (Replicate(), Shard(0)), (Shard(0), Shard(0))):
            got = torch.histogramdd(distribute_tensor(x, mesh, [px]), bins=[2, 2], weight=distribute_tensor(w, mesh, [pw]))
            torch.testing.assert_close(_full(got.hist), want)
        dtensor_handlers.uninstall(["aten._histogramdd_from_bin_cts.default"])  # strategies alone: refused clearly
        with pytest.raises(RuntimeError, match="keyword tensors"):
            torch.histogramdd(distribute_tensor(x, mesh, [Replicate()]), bins=[2, 2],
                              weight=distribute_tensor(w, mesh, [Shard(0)]))
    finally:
        dtensor_rules.unregister(report)


# The same handlers across real processes (gloo): the redistribution is a real all-gather and
# each rank's Replicate output is computed on its own.
RANK = textwrap.dedent("""
    import gc, json, sys
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from metaspmd.backends.torch import dtensor_handlers, dtensor_rules
    rank, store = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    mesh = DeviceMesh("cpu", [0, 1])
    g = torch.Generator().manual_seed(0)
    x = torch.where(torch.rand(6, 4, generator=g) > 0.5, torch.randn(6, 4, generator=g), torch.zeros(6, 4))
    report = dtensor_rules.register(sorted(dtensor_handlers.REPLICATED))
    d = distribute_tensor(x, mesh, [Shard(0)])
    got = {"nonzero": torch.nonzero(d), "masked_select": torch.masked_select(d, d > 0),
           "unique": torch.unique(d, return_counts=True)[1]}
    want = {"nonzero": torch.nonzero(x), "masked_select": torch.masked_select(x, x > 0),
            "unique": torch.unique(x, return_counts=True)[1]}
    print(json.dumps({k: [str(v.placements), v.to_local().shape == want[k].shape
                          and bool(torch.equal(v.to_local(), want[k]))] for k, v in got.items()}))
    dtensor_rules.unregister(report)
    # DTensors freed after the process group, as the interpreter exits, abort the process
    # (torch 2.13 with gloo): freed first
    del d, got
    gc.collect()
    dist.destroy_process_group()
""")


@pytest.mark.slow  # two processes that import torch
def test_the_handlers_on_two_gloo_ranks_match_one_device(tmp_path):
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(tmp_path / "store")], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    for p in ranks:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert got == {k: ["(Replicate(),)", True] for k in ("nonzero", "masked_select", "unique")}, got
