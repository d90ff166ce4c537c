"""Combines that held on the example's data or sizes only, and the checks that refute them.

Each op here had a registry rule that failed on other calls of its signature: the example's
output values were all 0 or 1 (a product of identical shards passed for identity), no two
shards' points met in one histogram bin (a max passed for the sum), an output was empty at
the example's sizes (every combine passed), no shard was one element wide (DTensor's
``torch.chunk`` split leaves one), an out= kernel returned its empty out, or a tolerance
wider than an ulp passed nextafter's Partial inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch.backend import make_runner, torch_case  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.spec import Identity, Reduce, ShardIn, strategies  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")
aten = torch.ops.aten
OPS = TorchOps()
F64 = torch.float64


def _explore(func, args, kwargs=None):
    return explore_case(torch_case(func, tuple(args), dict(kwargs or {}), make_runner(func)), OPS)


def _backend(opinfos):
    from metaspmd.backends.torch import get_backend

    return get_backend(opinfos=opinfos)


def _rules(entry):
    return list(strategies(entry.shard, entry.partial, entry.combine, entry.offset))


def test_identity_keeps_no_sum_or_product_of_identical_shards():
    """offset2bag of two bags is 0 and 1, so the product of two shards' copies equals it;
    with three bags (2 * 2 = 4, not 2) it does not: identity alone stands."""
    w = torch.randn(10, 6, dtype=F64)
    indices, offsets = torch.tensor([0, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 2])
    entry = _explore(aten._embedding_bag_forward_only.default,
                     [w, indices, offsets, False, 0, False, torch.rand(8, dtype=F64)])
    rules = _rules(entry)
    assert rules
    for rule in rules:
        for out in rule.outputs:
            if Identity() in out.options:
                assert not [c for c in out.options if isinstance(c, Reduce) and c != Reduce("avg")], rule
    column_cut = [r for r in rules if r.inputs[0] == ShardIn(1)]
    assert column_cut and column_cut[0].outputs[1].options == (Identity(),)


def test_a_histogram_cut_sums_and_never_takes_the_max():
    """Five points in a hundred bins rarely share a bin across shards: the max of the
    shards' histograms passed on OpInfo's data, and fails once one shard repeats another's."""
    cases = [c for c in _backend(("histc",)).cases("aten.histc.default") if 100 in c.args[1:] + tuple(c.kwargs.values())]
    cuts = [r for case in cases for r in _rules(explore_case(case, OPS)) if r.inputs[0] == ShardIn(0)]
    assert cuts and all(r.outputs[0].options == (Reduce("sum"),) for r in cuts), cuts


def test_an_output_empty_at_the_example_sizes_is_verified_where_it_is_not():
    """gels' residuals are empty while A has fewer rows than columns, so every combine
    passed there; at more rows they are a gather of a cut right-hand side. No rule of the
    empty example stands."""
    a, b = torch.randn(2, 3, dtype=F64), torch.randn(2, 3, dtype=F64)
    entry = _explore(aten.linalg_lstsq.default, [a, b], {"driver": "gels"})
    assert entry.status == "replicate-only" and not _rules(entry)
    # more rows than columns: residuals have elements from the start, and the cut of b's
    # columns is found with its gather
    tall = _explore(aten.linalg_lstsq.default, [torch.randn(5, 3, dtype=F64), torch.randn(5, 4, dtype=F64)],
                    {"driver": "gels"})
    cols = [r for r in _rules(tall) if r.inputs[1] == ShardIn(1)]
    assert any("gather(dim=0)" in [str(c) for c in r.outputs[1].options] for r in cols), _rules(tall)
    # so the sweep leads with a tall matrix (OpInfo's are wide): its rule holds for wide
    # calls of the signature too, where each shard's residuals are empty as the whole's
    (case, *_) = _backend(("linalg.lstsq",)).cases("aten.linalg_lstsq.default")
    assert case.args[0].shape[0] > case.args[0].shape[1] and case.kwargs["driver"] == "gels"


def test_a_plain_gather_holds_on_shards_one_element_wide():
    """An align_corners interpolation maps a one-wide shard by 0/0: the plain gather of its
    width held on every near-equal and skewed split of 20 columns and fails on 19 and 1."""
    x = torch.randn(6, 3, 10, 20, dtype=F64)
    entry = _explore(aten._upsample_bilinear2d_aa.vec, [x, None, True, [0.8, 1.0]])
    width = [r for r in _rules(entry) if r.inputs[0] == ShardIn(3)]
    assert all("gather(dim=3)" not in [str(c) for c in r.outputs[0].options] for r in width), width
    # the batch and channel cuts stand
    assert {ShardIn(0), ShardIn(1)} <= {r.inputs[0] for r in _rules(entry)}


def test_an_out_kernel_that_returns_its_empty_out_is_run_on_a_sized_one():
    """binary_cross_entropy_backward's out= kernel leaves an empty out empty: every
    combine passed on its [0] result. The sweep's case now passes an out shaped as the
    functional op's result, and the rules are those of the values."""
    cases = _backend(("nn.functional.binary_cross_entropy",)).cases("aten.binary_cross_entropy_backward.grad_input")
    assert cases
    for case in cases:
        out = case.fn(*case.args, **case.kwargs)
        first = out[0] if isinstance(out, (tuple, list)) else out
        assert first.numel() > 0, [getattr(a, "shape", a) for a in case.args]


def test_an_ulp_step_is_compared_bit_for_bit():
    """nextafter of summed parts differs from the sum of the parts' nextafters by about an
    ulp, which any tolerance passes; compared as bits, no Partial rule stands, and the cuts
    do."""
    x, y = torch.randn(6, 4, dtype=F64), torch.randn(6, 4, dtype=F64)
    rules = _rules(_explore(aten.nextafter.default, [x, y]))
    assert {r.inputs for r in rules} == {(ShardIn(0), ShardIn(0)), (ShardIn(1), ShardIn(1))}
