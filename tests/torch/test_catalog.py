"""The torch op catalog, its sample inputs and the derived rules of view ops."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # the OpInfo database needs it

from metaspmd import reproducible, reshape  # noqa: E402
from metaspmd.backends.torch import TorchBackend, get_backend  # noqa: E402
from metaspmd.backends.torch import catalog, samples, schema_samples, views  # noqa: E402
from metaspmd.case import NoSample, OpCase, Skip  # noqa: E402
from metaspmd.explorer import explore_case, explore_op  # noqa: E402
from metaspmd.signature import signature  # noqa: E402
from metaspmd.spec import Gather, OutputCombine, PartialInput, Replicate, ShardIn  # noqa: E402

# A handful of OpInfos captured in memory: seconds, not the full index.
OPINFOS = ("mm", "add", "sum", "gather", "index_select", "permute", "transpose", "reshape", "view", "split", "view_as")


@pytest.fixture(scope="module")
def backend() -> TorchBackend:
    return get_backend(opinfos=OPINFOS)


def _gather_rules(rule, block: bool = False) -> dict[int, int]:
    """Derived candidates of a one-input view op as {input dim: output gather dim}; the
    plain gathers, or with ``block`` the block gathers as {input dim: (dim, block)}. Cuts
    with local params (the dim a slice indexes) are left out."""
    out = {}
    for placements, combines in rule.candidates:
        (p,) = placements
        if p.local:
            continue
        (c,) = {o for o in combines}
        assert isinstance(p, ShardIn) and len(c.options) == 1 and isinstance(c.first, Gather)
        if c.first.block > 1 and block:
            out[p.dim] = (c.first.dim, c.first.block)
        elif c.first.block == 1 and not block and not c.first.even:  # even gathers apart
            out[p.dim] = c.first.dim
    return out


# --------------------------------------------------------------------------- catalog


def test_list_ops_covers_every_aten_overload(backend):
    ops = backend.list_ops()
    assert len(ops) > 3000
    assert ops == sorted(ops) and len(set(ops)) == len(ops)
    assert "aten.mm.default" in ops and "aten.add.Tensor" in ops and "aten.add_.Tensor" in ops
    assert backend.resolve("aten.mm.default") is torch.ops.aten.mm.default
    assert str(backend.resolve("aten.sum.dim_IntList")) == "aten.sum.dim_IntList"
    with pytest.raises(KeyError):
        catalog.resolve("aten.no_such_op.default")


def test_functional_siblings():
    assert catalog.functional_sibling("aten.add_.Tensor") == "aten.add.Tensor"
    assert catalog.functional_sibling("aten.add.out") == "aten.add.Tensor"
    assert catalog.functional_sibling("aten.sum.IntList_out") == "aten.sum.dim_IntList"
    assert catalog.functional_sibling("aten.full.out") == "aten.full.default"
    assert catalog.functional_sibling("aten.mm.default") is None
    # in place, by argument types: float_power.Scalar raises a number to a tensor's power
    assert catalog.functional_sibling("aten.float_power_.Scalar") == "aten.float_power.Tensor_Scalar"
    assert catalog.functional_sibling("aten.pow_.Tensor") == "aten.pow.Tensor_Tensor"
    assert catalog.functional_sibling("aten.polygamma_.default") == "aten.polygamma.default"  # none matches


def test_partly_uninitialized_and_uncheckable_random_ops_are_skipped(backend):
    """Random ops with a checkable form are explored (tests/torch/test_random_ops.py)."""
    for op in ("aten._resize_output_.default", "aten.poisson.default"):
        with pytest.raises(Skip) as info:
            backend.cases(op)
        assert info.value.status == "nondeterministic", op


def test_set_gives_self_the_sources_data_whatever_self_held(backend):
    """It was skipped as "output is uninitialized memory": its output is the source's data
    (a Storage, a tensor's, or a window of one), and self's values are dropped."""
    for op in ("aten.set_.source_Tensor", "aten.set_.source_Storage", "aten.set_.source_Tensor_storage_offset"):
        (case, *_) = backend.cases(op)
        first, again = case.call(case.args, case.kwargs, False, None), case.call(case.args, case.kwargs, False, None)
        assert torch.equal(first, again), op
        other_self = (torch.randn_like(case.args[0]), *case.args[1:])
        assert torch.equal(case.call(other_self, case.kwargs, False, None), first), op


def test_ops_with_unspecified_values_get_rules_on_shapes(backend):
    """empty_like defines only shape and dtype: a shard's local empty_like has the shard's
    shape, so Shard(d) gathers on d; a full-size local output (identity) is refused."""
    from metaspmd.backends.torch.backend import torch_case

    x = torch.randn(6, 4)
    e = explore_case(torch_case(torch.ops.aten.empty_like.default, (x,), {}, torch.ops.aten.empty_like.default),
                     backend.tensor_ops())
    assert e.status == "ok"
    combines = {label: [str(o) for o in outs] for label, outs in e.combine.by_label}
    assert sorted(c for c in combines.values() if "gather" in c[0]) == [["gather(dim=0)"], ["gather(dim=1)"]]
    assert any("shape-determined" in n for n in e.notes)


def _scalar_case(backend, func, args):
    from metaspmd.backends.torch.backend import torch_case

    return explore_case(torch_case(func, args, {}, func), backend.tensor_ops())


def _strategies(entry) -> set[str]:
    from metaspmd.spec import strategies

    return {f"{tuple(str(p) for p in s.inputs)} -> {' ; '.join(str(o) for o in s.outputs)}"
            for s in strategies(entry.shard, entry.partial, entry.combine, entry.offset)}


def test_scalar_returns_are_explored_as_0d_tensors(backend):
    """sym_size(x, 0) of a row shard is the shard's row count, and the counts sum to the
    global one; a column shard already has the global row count. numel sums over any
    shard; item of a Partial(sum) scalar is a partial sum."""
    x = torch.randn(6, 4, dtype=torch.float64)
    size = _scalar_case(backend, torch.ops.aten.sym_size.int, (x, 0))
    assert size.status == "ok" and size.results[0].dtype == "int64"
    assert _strategies(size) == {"('S(0)',) -> reduce(sum)", "('S(1)',) -> identity", "('P(sum)',) -> identity"}
    numel = _scalar_case(backend, torch.ops.aten.sym_numel.default, (x,))
    assert {"('S(0)',) -> reduce(sum)", "('S(1)',) -> reduce(sum)"} <= _strategies(numel)
    item = _scalar_case(backend, torch.ops.aten._local_scalar_dense.default, (torch.tensor(2.5, dtype=torch.float64),))
    assert _strategies(item) == {"('P(sum)',) -> reduce(sum)"}


def test_whole_tensor_predicates_hold_on_every_shard_not_each(backend):
    """equal and allclose are True only where every shard's answer is: reduce(min). OpInfo's
    allclose samples make other close to self everywhere or nowhere, so every shard agrees
    on them and identity passed too; special-value trials (one input a twin of the other
    but for one element) refute it."""
    from metaspmd.backends.torch.backend import torch_case

    def close_everywhere(seed: int) -> tuple[tuple, dict]:  # OpInfo's allclose samples, in kind
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(5, generator=g, dtype=torch.float64)
        return (a, a + 1e-3 * torch.randn(5, generator=g, dtype=torch.float64), 0.1, 0.01), {}

    func = torch.ops.aten.allclose.default
    e = explore_case(torch_case(func, *close_everywhere(0), func, fresh=close_everywhere), backend.tensor_ops())
    assert _strategies(e) == {"('S(0)', 'S(0)') -> reduce(min)"}
    a = torch.randn(6, 4, dtype=torch.float64)
    equal = _scalar_case(backend, torch.ops.aten.equal.default, (a, a.clone()))
    assert _strategies(equal) == {"('S(0)', 'S(0)') -> reduce(min)", "('S(1)', 'S(1)') -> reduce(min)"}


def test_queries_of_the_tensor_object_or_of_shapes_say_why_they_get_no_rule(backend):
    for op, reason in [("aten.sym_stride.int", catalog.OBJECT_QUERY_REASON),
                       ("aten.is_contiguous.default", catalog.OBJECT_QUERY_REASON),
                       ("aten.is_same_size.default", catalog.SHAPE_COMPARISON_REASON)]:
        with pytest.raises(Skip) as info:
            backend.cases(op)
        assert (info.value.status, info.value.reason) == ("replicate-only", reason), op
    # a matrix rank is explored, on matrices of chosen ranks (tests/torch/test_rank_queries.py)
    rank = backend.cases("aten.linalg_matrix_rank.atol_rtol_tensor")
    assert rank and all(c.special_always for c in rank)


# --------------------------------------------------------------------------- OpInfo samples


def test_mm_and_add_cases_have_sensible_signatures(backend):
    ops = backend.tensor_ops()
    cases = backend.cases("aten.mm.default")
    mm = [c for c in cases if not c.reserve]
    assert 1 <= len(mm) <= 4 and cases[:len(mm)] == mm  # spare samples after the first four
    sigs = {signature(ops, c.arg_names, c.args, c.kwargs) for c in mm}
    assert "self:f[*,*] mat2:f[*,*]" in sigs
    assert len(sigs) == len(mm)  # one case per signature
    assert mm[0].arg_names == ("self", "mat2")
    assert all(x.dtype == torch.float64 for c in mm for x in c.args if x.dtype.is_floating_point)  # float64 truth
    add = backend.cases("aten.add.Tensor")
    assert any(s.startswith("self:f[") and "other:f[" in s for s in (signature(ops, c.arg_names, c.args, c.kwargs) for c in add))
    assert {ops.dtype_kind(c.args[0]) for c in add} >= {"f", "i"}  # int64 samples add signatures


def test_an_unread_input_may_be_partial_beside_any_cut():
    # at reduction none nll_loss_backward never reads total_weight: beside the batch cut it
    # may be Partial, as DTensor's rule has it
    backend = get_backend(opinfos=("nn.functional.nll_loss",))
    ops = backend.tensor_ops()
    case = next(c for c in backend.cases("aten.nll_loss_backward.default")
                if signature(ops, c.arg_names, c.args, c.kwargs, c.exact_sizes).startswith(
                    "grad_output:f[*] self:f[*,*] target:i[*] weight=None reduction=0"))
    e = explore_case(case, ops)
    rules = {s.inputs: [o.first for o in s.outputs] for s in e.strategies()}
    assert rules[(ShardIn(0), ShardIn(0), ShardIn(0), PartialInput())] == [Gather(0)]


def test_an_op_that_merges_equal_neighbours_is_verified_where_they_are_equal():
    # random floats hold no equal neighbours, where unique_consecutive of a row cut passed as
    # a gather; special values (all zero among them) repeat across a shard boundary
    backend = get_backend(opinfos=("unique_consecutive",))
    ops = backend.tensor_ops()
    case = next(c for c in backend.cases("aten.unique_consecutive.default")
                if signature(ops, c.arg_names, c.args, c.kwargs, c.exact_sizes) == "self:f[*,*]")
    assert case.special_always
    assert explore_case(case, ops).status == "replicate-only"


def test_a_nonfinite_check_is_verified_on_nan_and_inf():
    # AMP's unscale sets found_inf to 1 on every shard that holds a NaN or inf: cut
    # gradients give found_inf as the max of the shards'. Its Partial rules on self and
    # found_inf hold on finite data only: a Partial found_inf adds up to the shard count, a
    # Partial self whose one part holds the inf sets found_inf on that shard alone. One
    # non-finite element in one tensor at a time shows each. The gradients are linear in
    # inv_scale, and found_inf does not read it: that Partial rule stands
    from metaspmd.backends.torch.sample_data import with_one_nonfinite

    backend = get_backend(opinfos=())
    ops = backend.tensor_ops()
    case = next(iter(backend.cases("aten._amp_foreach_non_finite_check_and_unscale.default")))
    assert case.special_always and case.special is with_one_nonfinite
    e = explore_case(case, ops)
    assert e.status == "ok" and str(e.shard) == "[[S1, S2], [S1, S2], [], []]", e.shard
    assert str(e.partial) == "[[], [], [], [S3(sum)]]", e.partial
    assert {label: [str(c) for c in outs] for label, outs in e.combine.by_label} == {
        "S1": ["gather(dim=0)", "gather(dim=0)", "reduce(max)"], "S2": ["gather(dim=1)", "gather(dim=1)", "reduce(max)"],
        "S3": ["reduce(sum)", "reduce(sum)", "identity"]}
    for k in range(1, 5):  # the k-th tensor holds the one non-finite element
        (self_, found_inf, inv_scale), _ = with_one_nonfinite(case.args, {}, k, seed=k)
        tensors = [*self_, found_inf, inv_scale]
        assert [int((~torch.isfinite(x)).sum()) for x in tensors] == [int(i == k - 1) for i in range(4)]


def test_a_histogram_is_verified_where_its_points_land_in_bins():
    # OpInfo's 5-d histogram of 5 random points is empty on every trial, so every combine
    # passed: Partial bin edges as identity, a row cut as identity. Ascending ramps put
    # points in the bins, and only the row cut's sum and a Partial weight's sum stand
    from metaspmd.backends.torch.sample_data import with_ramps

    backend = get_backend(opinfos=("histogramdd",))
    ops = backend.tensor_ops()
    case = next(c for c in backend.cases("aten._histogramdd_from_bin_tensors.default") if "weight" in c.kwargs)
    assert case.special_always and case.special is with_ramps
    e = explore_case(case, ops)
    assert e.status == "ok" and not any(e.partial.inputs[1:6]), e.partial  # the edges: never Partial
    assert {label: [str(c) for c in outs] for label, outs in e.combine.by_label} == {
        "S1": ["reduce(sum)"], "S2": ["reduce(sum)"]}, e.combine


def test_a_condition_is_data_not_an_index():
    # where(c, 0, other) with a 0-d c that stayed True on every trial was zero throughout, so
    # a Partial other passed as identity; any bools are a valid condition, and False gives other
    backend = get_backend(opinfos=("where",))
    case = next(c for c in backend.cases("aten.where.ScalarSelf") if c.args[0].dim() == 0 and c.args[2].dim() == 3)
    assert "condition" not in case.fixed
    e = explore_case(case, backend.tensor_ops())
    partial = {p.label for p in e.partial.inputs[1]}
    assert [[str(c) for c in outs] for label, outs in e.combine.by_label if label in partial] == [["reduce(sum)"]], e


def test_fresh_keeps_signature_and_index_validity(backend):
    ops = backend.tensor_ops()
    for op in ("aten.gather.default", "aten.index_select.default"):
        case = next(c for c in backend.cases(op) if c.args[0].dtype.is_floating_point)
        assert case.fresh is not None and "index" in case.fixed
        sig = signature(ops, case.arg_names, case.args, case.kwargs)
        a1, k1 = case.fresh(1)
        a2, k2 = case.fresh(2)
        assert signature(ops, case.arg_names, a1, k1) == sig
        assert [tuple(x.shape) for x in a1 if isinstance(x, torch.Tensor)] == [
            tuple(x.shape) for x in case.args if isinstance(x, torch.Tensor)
        ]
        assert not torch.equal(a1[0], case.args[0]) and not torch.equal(a1[0], a2[0])
        assert a1[0].dtype == torch.float64
        dim = a1[1]
        index = a1[2]
        assert int(index.min()) >= 0 and int(index.max()) < a1[0].shape[dim]
        case.fn(*a1, **k1)  # the regenerated call is valid


def test_samples_do_not_search_the_stack_for_a_running_unittest(monkeypatch):
    """OpInfo's sample_inputs looks for the unittest.TestCase running it (inspect.stack(),
    most of a small op's exploration time). The samples must not depend on who calls, so
    the search is skipped: it is never called, the samples come out the same, and the
    search is back in place afterwards."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    def searched():
        raise AssertionError("extract_test_fn was called")

    monkeypatch.setattr(common_utils, "extract_test_fn", searched)
    monkeypatch.setattr(core, "extract_test_fn", searched)
    info = samples._opinfo("mm", "")
    first = [s.input for _, s in samples._samples_of(info, "forward", torch.float32, 0, 3)]
    again = [s.input for _, s in samples._samples_of(info, "forward", torch.float32, 0, 3)]
    assert len(first) == 3 and all(torch.equal(a, b) for a, b in zip(first, again))
    assert common_utils.extract_test_fn is searched and core.extract_test_fn is searched


def test_cache_round_trip(tmp_path):
    call = samples.SampleCall(
        "aten.clone.default", "self:f[*,*] memory_format=torch.contiguous_format",
        (torch.randn(3, 4),), {"memory_format": torch.contiguous_format},
        samples.SampleRef("clone", "", "float32", "forward", 2, 0), True, True,
    )
    index = {"aten.clone.default": (call,)}
    path = tmp_path / "index.pt"
    samples.write_index(path, index)
    back = samples.read_index(path)
    (got,) = back["aten.clone.default"]
    assert got.ref == call.ref and got.signature == call.signature and got.float64 and got.regenerable
    assert torch.equal(got.args[0], call.args[0]) and got.kwargs == {"memory_format": torch.contiguous_format}


def test_composite_overloads_are_captured_from_their_opinfos():
    """einsum and linear decompose above any dispatch mode (CompositeImplicitAutograd): a
    second round under the Python dispatcher records them, regenerably (snapshotting their
    inputs calls composite ops too, which must not recurse), and torch's own Python kernels
    are back afterwards."""
    einsum, upsample = torch.ops.aten.einsum.default, torch.ops.aten.upsample_nearest2d.default
    before = {func: dict(func.py_kernels) for func in (einsum, upsample)}
    index = samples.build_index(opinfos=("einsum", "nn.functional.linear"))
    assert {func: dict(func.py_kernels) for func in (einsum, upsample)} == before
    assert not torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)
    assert {"aten.einsum.default", "aten.linear.default", "aten.mm.default"} <= index.keys()
    call = next(c for c in index["aten.linear.default"] if c.regenerable and "bias:f" in c.signature)
    assert call.ref.opinfo == "nn.functional.linear"
    args, _ = samples.regenerate(call, seed=3)
    assert [a.shape for a in args] == [a.shape for a in call.args] and not torch.equal(args[0], call.args[0])


def test_samples_with_an_empty_tensor_do_not_crowd_out_the_others():
    """unfold's first 81 OpInfo samples have an empty batch, more than MAX_SAMPLES: they once
    filled im2col's whole index, where no cut can be told apart. They count toward no cap,
    and the signatures chosen first are the non-empty ones."""
    index = samples.build_index(opinfos=("nn.functional.unfold",))
    calls = index["aten.im2col.default"]
    chosen = calls[: samples.MAX_SIGNATURES]
    assert all(0 not in c.args[0].shape for c in chosen), [c.signature for c in calls]
    assert any(c.ref.sample >= samples.MAX_SAMPLES for c in chosen)
    backend = get_backend(opinfos=("nn.functional.unfold",))
    entry = explore_case(backend.cases("aten.im2col.default")[0], backend.tensor_ops())
    assert any(s.inputs == (ShardIn(0),) for s in entry.all_strategies())  # the batch cut


def test_uniform_masks_are_drawn_anew_so_rules_see_both_branches():
    """OpInfo's _unsafe_masked_index samples mask with True throughout. Rules verified on
    that mask alone held for one branch of ``where(mask, self[indices], fill)``: a Partial
    self summed to the sum of the fills where the mask is False. The index draws such a
    mask anew, with both values, and the rule is gone."""
    from metaspmd.spec import PartialInput

    backend = get_backend(opinfos=("_unsafe_masked_index",))
    op = "aten._unsafe_masked_index.default"
    calls = backend.index[op]
    assert calls and all(m.any() and not m.all() for m in (c.args[1] for c in calls))
    assert not any(c.regenerable for c in calls if c.ref.opinfo == "_unsafe_masked_index")
    case = next(c for c in backend.cases(op) if c.args[0].dtype.is_floating_point and c.args[0].dim() == 2
                and c.args[3] != 0)
    entry = explore_case(case, backend.tensor_ops())
    assert entry.status == "ok"
    assert not [s for s in entry.all_strategies() if isinstance(s.inputs[0], PartialInput)]


def test_only_ops_that_decompose_on_cpu_count_as_composite():
    composite = set(catalog.composite_implicit_overloads())
    assert torch.ops.aten.einsum.default in composite and torch.ops.aten.linear.default in composite
    # a CPU kernel of their own: the composite kernel serves other backends
    assert torch.ops.aten.silu_backward.default not in composite and torch.ops.aten.mm.default not in composite


# --------------------------------------------------------------------------- schema-built, in-place, out


def test_core_op_without_opinfo_gets_schema_sample(backend):
    func = torch.ops.aten.adaptive_avg_pool1d.default
    assert catalog.is_core(func) and "aten.adaptive_avg_pool1d.default" not in backend.index
    (case,) = backend.cases("aten.adaptive_avg_pool1d.default")
    out = case.fn(*case.args, **case.kwargs)
    assert isinstance(out, torch.Tensor)
    a1, k1 = case.fresh(5)
    assert [x.shape for x in a1 if isinstance(x, torch.Tensor)] == [x.shape for x in case.args if isinstance(x, torch.Tensor)]
    assert not torch.equal(a1[0], case.args[0])
    entry = explore_case(case, backend.tensor_ops())
    assert entry.status == "ok"


def test_split_sizes_are_guessed_to_sum_to_the_split_dim(backend):
    (case,) = backend.cases("aten.split.sizes")
    x, sizes = case.args[:2]
    assert sum(sizes) == x.shape[0] and len(sizes) == 2
    assert [p.shape[0] for p in case.fn(*case.args, **case.kwargs)] == sizes


def test_a_schema_built_reduction_keeps_dims_to_cut():
    # var.dim's dim is a required Optional: None would reduce every dim, leaving no rule
    backend = get_backend(opinfos=(), schema_samples=True)
    (case,) = backend.cases("aten.var.dim")
    assert case.args[1] == [0]
    entry = explore_case(case, backend.tensor_ops())
    assert entry.status == "ok" and str(entry.shard) == "[[N, S1]]"


def test_a_schema_built_sorted_sequence_is_sorted():
    # bucketize's boundaries must ascend: on random ones a value of 2 lies above them all,
    # its bucket is their count on every trial, and the sum of the shards' counts passed
    # without telling anything (an output constant throughout, "shape-determined")
    backend = get_backend(opinfos=(), schema_samples=True)
    (case,) = backend.cases("aten.bucketize.Scalar")
    boundaries = case.args[1]
    assert torch.equal(boundaries, boundaries.sort().values)
    fresh = case.fresh(1)[0][1]
    assert torch.equal(fresh, fresh.sort().values) and not torch.equal(fresh, boundaries)
    entry = explore_case(case, backend.tensor_ops())
    assert str(entry.shard) == "[[S1]]" and not any("shape-determined" in n for n in entry.notes), entry


def test_schema_built_fake_quantizers_quantize():
    # quant_min = quant_max = 1 quantized every input to one level, an output no data could
    # vary; a per-tensor quantizer's scale and zero point cut along with self were read at
    # each shard's [0], so a zero point that rounded below one on five draws in five passed
    # a cut of it as reduce(max); and random switches (observer_on, fake_quant_on) were off
    # on most draws, so the observer's self cuts held on the path that skips quantizing
    backend = get_backend(opinfos=(), schema_samples=True)
    ops = backend.tensor_ops()
    (case,) = backend.cases("aten._fake_quantize_learnable_per_tensor_affine.default")
    _, scale, zero_point, quant_min, quant_max = case.args[:5]
    assert (quant_min, quant_max) == (0, 255) and scale.shape == zero_point.shape == (1,)
    entry = explore_case(case, ops)
    assert entry.status == "ok" and all(s.inputs[1:3] == (Replicate(), Replicate()) for s in entry.strategies())

    (case,) = backend.cases("aten.fused_moving_avg_obs_fake_quant.default")
    observer_on, fake_quant_on = case.args[1:3]
    assert observer_on.item() == fake_quant_on.item() == 1.0
    switches = {tuple(t.item() for t in case.fresh(seed)[0][1:3]) for seed in range(1, 5)}
    assert switches <= {(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)} and len(switches) > 1
    # each shard's own running min and max give it its own scale: no cut of self holds
    assert explore_case(case, ops).status == "replicate-only"


def test_inplace_case_does_not_mutate_its_inputs(backend):
    case = backend.cases("aten.add_.Tensor")[0]
    before = [x.clone() for x in case.args if isinstance(x, torch.Tensor)]
    out1 = case.fn(*case.args, **case.kwargs)
    out2 = case.fn(*case.args, **case.kwargs)
    assert torch.equal(out1, out2)
    assert all(torch.equal(a, b) for a, b in zip(before, [x for x in case.args if isinstance(x, torch.Tensor)]))


def test_out_overload_allocates_its_outputs(backend):
    (case, *_) = backend.cases("aten.add.out")
    assert "out" not in case.kwargs
    got = case.fn(*case.args, **case.kwargs)
    assert torch.equal(got, torch.ops.aten.add.Tensor(*case.args, **case.kwargs))


def test_square_matrices_are_guessed_batched_first():
    # linalg.inv rejects every rectangular guess; a batch of square matrices has a dim to cut
    backend = get_backend(opinfos=(), schema_samples=True)
    (case,) = backend.cases("aten.linalg_inv.default")
    assert case.args[0].shape == (2, 4, 4)
    entry = explore_case(case, backend.tensor_ops())
    assert entry.status == "ok" and str(entry.shard) == "[[S1, N, N]]"


def test_an_out_overload_takes_its_out_dtype_from_its_sibling_schema_sample():
    # fft_rfft.out rejects every real out tensor its own guesses allocate; fft_rfft's
    # schema-built sample runs, and its complex result says what the out must be
    backend = get_backend(opinfos=(), schema_samples=True)
    (case,) = backend.cases("aten.fft_rfft.out")
    (functional,) = backend.cases("aten.fft_rfft.default")
    got = case.fn(*case.args, **case.kwargs)
    assert got.dtype == torch.complex128 and "out" not in case.kwargs
    assert torch.equal(got, torch.ops.aten.fft_rfft.default(*case.args, **case.kwargs))
    assert [a.shape for a in case.fresh(7)[0]] == [a.shape for a in functional.args]
    ops = backend.tensor_ops()
    assert str(explore_case(case, ops).shard) == str(explore_case(functional, ops).shard) == "[[S1, N]]"


def test_fused_optimizer_gets_zero_d_steps_and_a_guarded_call():
    # Adam needs one 0-d step count per parameter, and amsgrad on (the filler fills
    # max_exp_avg_sqs); its kernel walks every list by the parameters' sizes, so a shard of
    # one list beside whole others must be refused, not run (it corrupts the heap)
    backend = get_backend(opinfos=(), schema_samples=True)
    (case,) = backend.cases("aten._fused_adam.default")
    steps = case.args[5]
    assert [t.shape for t in steps] == [(), ()] and case.kwargs["amsgrad"] is True
    grads_cut = list(case.args)
    grads_cut[1] = [g[:2] for g in case.args[1]]
    with pytest.raises(ValueError, match="inconsistent shards"):
        case.fn(*grads_cut, **case.kwargs)
    entry = explore_case(case, backend.tensor_ops())
    assert entry.status == "ok" and str(entry.shard).startswith("[[S1, S2], [S1, S2]")


def test_a_schema_guess_must_run_on_fresh_seeds_too():
    # quantile's q is drawn like any tensor: a seed whose q leaves [0, 1] rejects the guess
    calls = []

    def run(args, kwargs):
        calls.append(args)
        if len(calls) == 3:
            raise RuntimeError("values out of range")

    func = torch.ops.aten.quantile.default
    guess, error = schema_samples.find_schema_sample(run, func)
    # the first guess ran on the base seed and one fresh seed, failed on the next; the
    # second ran on all of them
    assert guess is not None and len(calls) == 3 + 1 + samples.FRESH_SEEDS
    assert guess != next(schema_samples.schema_guesses())


def test_a_guess_of_0d_tensors_only_is_taken_last():
    # AMP's unscale wants found_inf and inv_scale of one element: the first guesses make
    # every tensor 4x6 and fail, the 0-d one runs but leaves no dim to cut; a later guess
    # (the tensors after the first 0-d) runs with gradients of some length
    func = torch.ops.aten._amp_foreach_non_finite_check_and_unscale.default
    guess, error = schema_samples.find_schema_sample(lambda a, k: func(*a, **k), func)
    assert guess is not None and guess.shape and guess.scalar_tensors, guess
    args, _ = schema_samples.schema_inputs(func, guess, samples.BASE_SEED)
    assert [t.dim() for t in args[0]] == [len(guess.shape)] * 2 and args[1].dim() == args[2].dim() == 0
    # where nothing else runs, the 0-d guess stands
    is_nonzero = torch.ops.aten.is_nonzero.default
    guess, error = schema_samples.find_schema_sample(lambda a, k: is_nonzero(*a, **k), is_nonzero)
    assert guess is not None and guess.shape == () and error == ""


def test_no_cpu_kernel_stops_the_guessing():
    calls = []

    def run(args, kwargs):
        calls.append(1)
        raise NotImplementedError("Could not run 'aten::foo' with arguments from the 'CPU' backend.")

    guess, error = schema_samples.find_schema_sample(run, torch.ops.aten.add.Tensor)
    assert guess is None and error.startswith("NotImplementedError: Could not run") and len(calls) == 1


def test_op_without_any_sample_says_why():
    backend = get_backend(opinfos=(), schema_samples=True)
    with pytest.raises(NoSample, match="schema-built inputs fail"):
        backend.cases("aten._cudnn_rnn_flatten_weight.default")


def test_an_op_that_runs_on_some_cpus_only_is_left_unswept_saying_so():
    """NNPACK's convolution was said to crash on guessed inputs; it runs on CPUs NNPACK
    takes and not on others, so its rules would depend on the machine that swept them."""
    backend = get_backend(opinfos=(), schema_samples=True)
    for op in ("aten._nnpack_spatial_convolution.default", "aten._nnpack_spatial_convolution.out"):
        with pytest.raises(NoSample, match=r"NNPACK's kernel runs on some CPUs only .*depend on the machine"):
            backend.cases(op)


# --------------------------------------------------------------------------- views


def _rule_for(func, *args):
    rule = views.derive(func, args, {})
    assert rule is not None
    return rule


def test_permute_and_transpose_candidates():
    x = torch.randn(2, 3, 4)
    rule = _rule_for(torch.ops.aten.permute.default, x, [2, 0, 1])
    assert _gather_rules(rule) == {0: 1, 1: 2, 2: 0}
    rule = _rule_for(torch.ops.aten.transpose.int, x, 0, -1)
    assert _gather_rules(rule) == {0: 2, 1: 1, 2: 0}


def test_reshape_candidates_and_local_shapes():
    x = torch.randn(4, 6, 5)
    rule = _rule_for(torch.ops.aten.view.default, x, [24, 5])
    assert _gather_rules(rule) == {0: 0, 2: 1}  # dim 1 is not the leading dim of its merge group
    local = x[:2]  # a shard of dim 0
    assert torch.equal(rule.fn(local, [24, 5]), local.reshape(12, 5))
    rule = _rule_for(torch.ops.aten.view.default, torch.randn(24, 5), [4, 6, 5])
    assert _gather_rules(rule) == {1: 2}  # splitting dim 0 would need shards divisible by 6
    assert reshape.reshape_mapping((2, 1, 6), (2, 6)) == {0: 0, 2: 1}


def test_a_dim_merged_behind_others_gathers_in_blocks():
    """flatten of [4, 6] cut along its 6: each shard holds a piece of every row, and the
    output interleaves them, row by row (DTensor's _StridedShard(0, 4))."""
    x = torch.randn(4, 6, 5)
    rule = _rule_for(torch.ops.aten.view.default, x, [24, 5])
    assert _gather_rules(rule, block=True) == {1: (0, 4)}
    local = x[:, :2].contiguous()
    assert torch.equal(rule.fn(local, [24, 5]), local.reshape(8, 5))
    assert reshape.reshape_block_mapping((2, 5, 5), (50,)) == {1: (0, 2), 2: (0, 10)}
    assert reshape.reshape_block_mapping((24, 5), (4, 6, 5)) == {}  # a split, not a merge
    flat = _rule_for(torch.ops.aten.flatten.using_ints, torch.randn(4, 6))
    assert _gather_rules(flat, block=True) == {1: (0, 4)}


def test_every_view_whose_shards_run_a_rewritten_call_says_so():
    """DTensor runs an installed rule's op on each shard with the call's own arguments, so
    register() keeps no cut of an op whose shards rewrite them (squeeze_copy must not
    squeeze a shard of one row). That relies on shards_rewrite_call naming every such op:
    checked here on every sample call of every view-like op."""
    full = get_backend()
    rewritten, kept = set(), set()
    for name, calls in full.index.items():
        op = catalog.resolve(name)
        if not views.is_view_like(op):
            continue
        for call in calls:
            rule = views.derive(op, tuple(call.args), dict(call.kwargs))
            if rule is not None:
                (kept if rule.fn is op else rewritten).add(name)
    assert not {n for n in rewritten if not views.shards_rewrite_call(catalog.resolve(n))}
    assert {"aten.squeeze_copy.default", "aten.view.default", "aten.as_strided_copy.default"} <= rewritten
    # flatten shares unflatten's handler, which rewrites unflatten's sizes: said conservatively
    assert {n for n in kept - rewritten if views.shards_rewrite_call(catalog.resolve(n))} == {"aten.flatten.using_ints"}
    assert "aten.permute_copy.default" in kept


def test_reshapes_are_keyed_by_their_exact_sizes():
    """view of [2, 3, 4] as [6, 4] merges dims 0 and 1; of [4, 3, 2] it cannot: one key
    for both would give the second the first's rules."""
    from metaspmd.backends.torch import table
    from metaspmd.backends.torch.backend import torch_case
    from metaspmd.backends.torch.tensor_ops import TorchOps

    view = torch.ops.aten.view.default
    calls = [((torch.randn(2, 3, 4, dtype=torch.float64), [6, 4]), {}),
             ((torch.randn(4, 3, 2, dtype=torch.float64), [6, 4]), {})]
    sigs = [samples.call_signature(view, a, k) for a, k in calls]
    assert sigs == ["self:f[2,3,4] size=[6,4]", "self:f[4,3,2] size=[6,4]"]
    cuts = []
    for args, kwargs in calls:
        entry = explore_case(torch_case(view, args, kwargs, view), TorchOps())
        assert entry.signature == samples.call_signature(view, args, kwargs)
        cuts.append({s.inputs[0].dim for s in entry.strategies() if isinstance(s.inputs[0], ShardIn)})
    # dim 1 of [2, 3, 4] in blocks of 2; [4, 3, 2] maps dim 0 onto the 6 on even cuts only (2 shards)
    assert cuts == [{0, 1, 2}, {0}]
    assert [str(s.outputs[0]) for s in entry.strategies() if isinstance(s.inputs[0], ShardIn)] == [
        "gather(dim=0, even=true)"]
    # the table and DTensor's registered rules look reshapes up by the same exact key
    assert table.op_info(view).exact_sizes and not table.op_info(torch.ops.aten.flatten.using_ints).exact_sizes
    flat = samples.call_signature(torch.ops.aten.flatten.using_ints, (torch.randn(2, 3, 4), 0, 1), {})
    assert flat == "self:f[*,*,*] start_dim=0 end_dim=1"
    # _reshape_copy is a reshape of its own, not the _copy form of a view named _reshape
    copy = samples.call_signature(torch.ops.aten._reshape_copy.default, (torch.randn(2, 3, 4), [6, 4]), {})
    assert copy == "self:f[2,3,4] size=[6,4]"
    # at exact sizes the explorer looks for blocks of any count: view_as of [5, 5, 5] as [25, 5]
    # cut along dim 1 interleaves 5
    view_as = torch.ops.aten.view_as.default
    args = (torch.randn(5, 5, 5, dtype=torch.float64), torch.randn(25, 5, dtype=torch.float64))
    entry = explore_case(torch_case(view_as, args, {}, view_as), TorchOps())
    assert [str(o) for s in entry.strategies() if s.inputs[0] == ShardIn(1) for o in s.outputs] == ["gather(dim=0, block=5)"]


def test_a_convolution_is_keyed_by_its_kernel_extent():
    """The halo is the kernel's extent: the weight's dims after its two channel dims (the
    first of conv_tbc's) are written out; the channels stay size-free."""
    from metaspmd.backends.torch import table

    conv = torch.ops.aten.convolution.default
    args = (torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 5), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert samples.call_signature(conv, args, {}).startswith("input:f[*,*,*,*] weight:f[*,*,3,5] bias=None ")
    assert table.op_info(conv).exact_sizes == {"weight": slice(2, None)}
    tbc = samples.call_signature(torch.ops.aten.conv_tbc.default, (torch.randn(5, 2, 3), torch.randn(3, 3, 4), torch.randn(4), 1), {})
    assert tbc == "self:f[*,*,*] weight:f[3,*,*] bias:f[*] pad=1"


def test_select_split_and_squeeze_candidates():
    x = torch.randn(4, 1, 6)
    select = _rule_for(torch.ops.aten.select.int, x, 2, 3)
    assert _gather_rules(select) == {0: 0}
    split = _rule_for(torch.ops.aten.split.Tensor, torch.randn(4, 6), 2, 1)
    assert split.candidates == (((ShardIn(0),), (OutputCombine((Gather(0),)),) * 3),
                                ((ShardIn(1, local=True),), (OutputCombine((Gather(1),)),) * 3))
    squeeze = _rule_for(torch.ops.aten.squeeze.default, x)
    assert _gather_rules(squeeze) == {0: 0, 2: 1}
    shard = x[:1]  # a shard of size 1 keeps its dim: only the global size-1 dim goes
    assert squeeze.fn(shard).shape == (1, 6)


def test_a_slice_or_select_of_the_cut_dim_runs_with_its_positions_re_based():
    """slice [1:8:3] of 10 rows takes rows 1, 4, 7: a shard of rows [5, 10) takes its row 7
    as its own row 2; split_with_sizes takes each piece's part; select takes the row from the
    shard that holds it and zeros elsewhere, so the shards sum."""
    from metaspmd.backends.torch.backend import make_runner, torch_case
    from metaspmd.backends.torch.local_params import localizer

    x = torch.arange(20.0).reshape(10, 2)
    slicing = localizer(torch.ops.aten.slice.Tensor, (x, 0, 1, 8, 3), {})
    assert slicing({0: (0, 5, 10, 10)})(x[5:]).tolist() == [[14.0, 15.0]]
    assert slicing({0: (0, 0, 5, 10)})(x[:5]).tolist() == [[2.0, 3.0], [8.0, 9.0]]
    assert slicing({0: (0, 8, 10, 10)})(x[8:]).shape == (0, 2)
    assert localizer(torch.ops.aten.slice.Tensor, (x, 0, 0, 10), {})({0: (0, 0, 5, 10)}) is None  # whole dim
    pieces = localizer(torch.ops.aten.split_with_sizes.default, (x, [2, 3, 5], 0), {})({0: (0, 3, 6, 10)})(x[3:6])
    assert [p.shape[0] for p in pieces] == [0, 2, 1]
    held = localizer(torch.ops.aten.select.int, (x, 0, -2), {})
    assert held({0: (0, 5, 10, 10)})(x[5:]).tolist() == [16.0, 17.0] and not held({0: (0, 0, 5, 10)})(x[:5]).any()
    func = torch.ops.aten.select.int
    entry = explore_case(torch_case(func, (torch.randn(5, 6, 5, dtype=torch.float64), 1, 2), {}, make_runner(func)),
                         get_backend(opinfos=()).tensor_ops())
    assert "S2(local)" in str(entry.shard) and "reduce(sum)" in str(entry.combine), entry


def test_expand_rewrites_sizes_for_shards():
    x = torch.randn(4, 1)
    rule = _rule_for(torch.ops.aten.expand.default, x, [3, 4, 5])
    assert _gather_rules(rule) == {0: 1}
    assert rule.fn(x[:2], [3, 4, 5]).shape == (3, 2, 5)


def test_backward_kernels_are_guarded_unless_known_shape_safe():
    aten = torch.ops.aten
    assert catalog.trusts_matching_shapes(aten.native_batch_norm_backward.default)
    assert catalog.trusts_matching_shapes(aten.max_pool2d_with_indices_backward.default)
    for func in (aten.to_dense_backward.default, aten.rrelu_with_noise_backward.default):
        assert not catalog.trusts_matching_shapes(func)
    # in training rrelu's backward is noise * grad: self, of any shape, is never read
    g, noise = torch.randn(6, dtype=torch.float64), torch.rand(6, dtype=torch.float64)
    got = aten.rrelu_with_noise_backward.default(g, torch.randn(2, dtype=torch.float64), noise, 0.1, 0.3, True, False)
    assert torch.equal(got, noise * g)


def test_out_overloads_of_views_derive_from_their_functional_sibling():
    """squeeze_copy.out run as is squeezes a shard's own size-1 dims; it writes what
    squeeze_copy returns, so a shard runs that op's derived form (global size-1 dims only)."""
    from metaspmd.backends.torch.backend import make_runner, torch_case

    func = torch.ops.aten.squeeze_copy.out
    x = torch.randn(5, 1, 5, 1, dtype=torch.float64)
    case = torch_case(func, (x,), {}, make_runner(func))
    assert _gather_rules(views.ViewRule(case.fn, case.candidates)) == {0: 0, 2: 1}
    assert case.fn(x[:1]).shape == (1, 5)
    assert any("derived as aten.squeeze_copy.default" in n for n in case.notes)
    entry = explore_case(case, get_backend(opinfos=()).tensor_ops())
    assert entry.status == "derived" and str(entry.shard) == "[[S1, N, S2, N]]"


def test_a_derived_rule_is_proposed_on_the_first_trial_whose_shards_differ():
    """t of the sample [-9, -9]: its halves are equal and prove nothing; the fresh trials decide."""
    from metaspmd.backends.torch.backend import torch_case

    func = torch.ops.aten.t.default
    entry = explore_case(torch_case(func, (torch.tensor([-9, -9]),), {}, func), get_backend(opinfos=()).tensor_ops())
    assert entry.status == "derived" and str(entry.shard) == "[[S1]]", entry


def test_unflatten_into_one_real_size_takes_it_as_minus_one_on_a_shard():
    rule = _rule_for(torch.ops.aten.unflatten.int, torch.randn(6, 4), 0, [1, 6])
    assert _gather_rules(rule) == {0: 1, 1: 2}
    assert rule.fn(torch.randn(2, 4), 0, [1, 6]).shape == (1, 2, 4)
    assert _gather_rules(_rule_for(torch.ops.aten.unflatten.int, torch.randn(6, 4), 0, [2, 3])) == {1: 2}


def test_batch_norm_backward_in_training_reads_no_running_stats():
    """In training the running statistics are unread (None gives the same gradients), so the
    shape guard lets them be cut; in eval mode the kernel reads them unchecked, and it does not."""
    from metaspmd.backends.torch.backend import make_runner, torch_case

    func = torch.ops.aten.native_batch_norm_backward.default
    f64 = dict(dtype=torch.float64)
    g, x, w, rm, rv, sm, si = (torch.randn(4, 6, 5, **f64), torch.randn(4, 6, 5, **f64), *[torch.rand(6, **f64) + 0.5 for _ in range(5)])
    for train, unread in ((True, {"running_mean", "running_var"}), (False, {"save_mean", "save_invstd"})):
        args = (g, x, w, rm, rv, sm, si, train, 1e-5, [True, True, True])
        assert catalog.unread_arg_names(func, args, {}) == unread
        fn = torch_case(func, args, {}, make_runner(func)).fn
        cut = args[:3] + (rm[:3],) + args[4:]
        if train:
            assert all(torch.equal(a, b) for a, b in zip(fn(*cut), func(*args)))
        else:
            with pytest.raises(ValueError, match="inconsistent shards"):
                fn(*cut)


def test_batch_norm_backward_in_eval_mode_is_cut_by_batch_and_by_channel():
    """In eval mode the saved statistics are empty and unread: the shape guard once held their
    length 0 against the channels and refused every cut, so a frozen batch norm's backward
    was replicated (its input gradient and the gradients of weight and bias all-gathered)."""
    from metaspmd.backends.torch.rules_at_runtime import call_of
    from metaspmd.resolve import explore_call

    func = torch.ops.aten.native_batch_norm_backward.default
    g, x = torch.randn(8, 4, 6, 6), torch.randn(8, 4, 6, 6)
    w, rm, rv, empty = torch.randn(4), torch.randn(4), torch.rand(4) + 0.5, torch.empty(0)
    entry = explore_call(call_of(func, (g, x, w, rm, rv, empty, empty, False, 1e-5, [True, True, True]), {}),
                         get_backend(opinfos=()).tensor_ops())
    rules = {s.inputs[:5]: [str(o) for o in s.outputs] for s in entry.all_strategies()}
    batch = (ShardIn(0), ShardIn(0), Replicate(), Replicate(), Replicate())
    channel = (ShardIn(1), ShardIn(1), ShardIn(0), ShardIn(0), ShardIn(0))
    assert rules[batch] == ["gather(dim=0)", "reduce(sum)", "reduce(sum)"], entry
    assert rules[channel] == ["gather(dim=1)", "gather(dim=0)", "gather(dim=0)"], entry


def test_an_empty_reserve_is_no_per_channel_statistic_to_the_shape_guard():
    """batch_norm_backward's reserve is empty (CPU): held as a 1-D tensor of length 0 against
    the channels, it made the guard refuse every channel cut, and the op had none."""
    from metaspmd.backends.torch.backend import make_runner, torch_case

    func = torch.ops.aten.batch_norm_backward.default
    g, x = torch.randn(4, 6, 5, dtype=torch.float64), torch.randn(4, 6, 5, dtype=torch.float64)
    w, rm, rv, sm, sv = (torch.rand(6, dtype=torch.float64) + 0.5 for _ in range(5))
    reserve = torch.empty(0, dtype=torch.uint8)
    args = (g, x, w, rm, rv, sm, sv, True, 1e-5, [True, True, True], reserve)
    fn = torch_case(func, args, {}, make_runner(func)).fn
    cut = (g[:, :3], x[:, :3], w[:3], rm, rv, sm[:3], sv[:3]) + args[7:]
    whole = func(*args)
    for part, full, dim in zip(fn(*cut), whole, (1, 0, 0)):
        torch.testing.assert_close(part, full.narrow(dim, 0, 3))
    with pytest.raises(ValueError, match="inconsistent shards"):
        fn(g[:, :3], x[:, :3], w, rm, rv, sm[:3], sv[:3], *args[7:])  # weight left whole


def test_pdist_backward_refuses_pairs_cut_apart_from_the_rows():
    """_pdist_backward reads grad and pdist by the number of pairs of self's rows, unchecked:
    with them cut and self whole it read past their end, and the rules found changed from
    run to run. Such shards are refused; a cut of self's columns stays."""
    from metaspmd.backends.torch.backend import torch_case

    func = torch.ops.aten._pdist_backward.default
    x = torch.randn(5, 4, dtype=torch.float64)
    pdist = torch.pdist(x, 1.0)
    grad = torch.randn_like(pdist)
    fn = torch_case(func, (grad, x, 1.0, pdist), {}, func).fn
    with pytest.raises(ValueError, match="one element per pair"):
        fn(grad[:5], x, 1.0, pdist[:5])
    assert fn(grad, x[:, :2].contiguous(), 1.0, pdist).shape == (5, 2)


def test_sum_to_size_gathers_kept_dims_and_sums_the_rest():
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    rule = _rule_for(torch.ops.aten.sum_to_size.default, x, [4, 1])
    got = {p[0].dim: str(c[0]) for p, c in rule.candidates}
    assert got == {1: "gather(dim=0)", 0: "reduce(sum)", 2: "reduce(sum)"}
    assert torch.allclose(rule.fn(x[:, :2], [4, 1]), x[:, :2].sum((0, 2)).reshape(2, 1))
    e = explore_case(OpCase("aten.sum_to_size.default", rule.fn, (x, [4, 1]), {}, ("self", "size"),
                            candidates=rule.candidates), get_backend(opinfos=()).tensor_ops())
    assert e.status == "derived" and len(list(e.strategies())) == 3 + 1  # and a Partial self


def test_view_as_reads_other_for_its_global_shape_only():
    """view_as is view(self, other.shape) (DTensor runs it so): a shard of self is viewed to
    the size rewritten from its local shape, and other's shard is never read."""
    x, other = torch.randn(4, 6, 5), torch.randn(24, 5)
    rule = _rule_for(torch.ops.aten.view_as.default, x, other)
    assert rule.candidates is None and "global shape only" in rule.notes[0]  # explored, not derived
    local = x[:2]
    for other_shard in (other, other[:7], other[:, :2]):
        assert torch.equal(rule.fn(local, other_shard), local.reshape(12, 5))
    expand_as = _rule_for(torch.ops.aten.expand_as.default, torch.randn(4, 1), torch.randn(3, 4, 5))
    assert expand_as.fn(torch.randn(2, 1), torch.randn(1, 1, 1)).shape == (3, 2, 5)


def test_resize_to_as_many_elements_is_a_reshape_of_a_copy():
    """resize_ of [4, 6, 5] to [24, 5] restrides the data: a reshape, each shard's size
    rewritten from its own; it runs on a copy, and its signature pins every size."""
    from metaspmd.backends.torch.backend import make_runner, torch_case

    func = torch.ops.aten.resize_.default
    x = torch.randn(4, 6, 5, dtype=torch.float64)
    before = x.clone()
    case = torch_case(func, (x, [24, 5]), {}, make_runner(func))
    assert _gather_rules(views.ViewRule(case.fn, case.candidates)) == {0: 0, 2: 1}
    assert _gather_rules(views.ViewRule(case.fn, case.candidates), block=True) == {1: (0, 4)}
    assert torch.equal(case.fn(x[:2], [24, 5]), x[:2].reshape(12, 5)) and torch.equal(x, before)
    entry = explore_case(case, get_backend(opinfos=()).tensor_ops())
    assert entry.status == "derived" and entry.signature == "self:f[4,6,5] size=[24,5]"
    assert str(entry.shard) == "[[S1, S2, S3]]"
    resize_as = _rule_for(torch.ops.aten.resize_as_.default, x, torch.randn(24, 5))
    assert torch.equal(resize_as.fn(x[:, :3].contiguous(), torch.randn(1, 1)), x[:, :3].reshape(12, 5))


def test_a_resize_to_another_number_of_elements_is_not_explored(monkeypatch):
    """Grown, the new elements are uninitialized memory; shrunk, what is kept is a prefix of
    the storage, which no shard holds: such calls are dropped, an op left with none is
    nondeterministic."""
    func, x = torch.ops.aten.resize_.default, torch.randn(4, 6)
    assert catalog.keeps_numel(func, (x, [6, 4]), {}) and catalog.keeps_numel(torch.ops.aten.mm.default, (x, x), {})
    assert not catalog.keeps_numel(func, (x, [5, 6]), {}) and not catalog.keeps_numel(func, (x, [3, 6]), {})
    assert not catalog.keeps_numel(torch.ops.aten.resize_as_.default, (x, torch.randn(7)), {})
    backend = get_backend(opinfos=())
    grown = OpCase("aten.resize_.default", func, (x, [5, 6]), {}, ("self", "size"))
    same = OpCase("aten.resize_.default", func, (x, [6, 4]), {}, ("self", "size"))
    monkeypatch.setattr(backend, "_all_cases", lambda op: [grown, same])
    assert backend.cases("aten.resize_.default") == [same]
    monkeypatch.setattr(backend, "_all_cases", lambda op: [grown])
    with pytest.raises(Skip, match="uninitialized memory") as skip:
        backend.cases("aten.resize_.default")
    assert skip.value.status == "nondeterministic"


def test_group_norm_shards_take_its_sizes_from_their_own_input():
    """native_group_norm restates its input's sizes (N, C, HxW), and its kernel checks them:
    a shard of the batch runs it with its own N, as DTensor's scalar shape adjuster does, and
    the batch cut is found forward and backward."""
    from metaspmd.backends.torch.backend import make_runner, torch_case

    f64 = dict(dtype=torch.float64)
    x, w, b = torch.randn(4, 6, 5, **f64), torch.randn(6, **f64), torch.randn(6, **f64)
    forward, backward = torch.ops.aten.native_group_norm.default, torch.ops.aten.native_group_norm_backward.default
    args = (x, w, b, 4, 6, 5, 2, 1e-5)
    out, mean, rstd = forward(*args)
    local = views.local_sizes(forward, forward)(x[:3], *args[1:])
    assert all(torch.allclose(got, want[:3]) for got, want in zip(local, (out, mean, rstd)))
    assert views.shards_rewrite_call(forward) and views.local_sizes(torch.ops.aten.mm.default, forward) is forward
    ops = get_backend(opinfos=()).tensor_ops()
    batch = (ShardIn(0), Replicate(), Replicate())
    entry = explore_case(torch_case(forward, args, {}, make_runner(forward)), ops)
    assert [str(o) for s in entry.all_strategies() if s.inputs == batch for o in s.outputs] == ["gather(dim=0)"] * 3
    grad_args = (torch.randn_like(x), x, mean, rstd, w, 4, 6, 5, 2, [True, True, True])
    entry = explore_case(torch_case(backward, grad_args, {}, make_runner(backward)), ops)
    batch = (ShardIn(0),) * 4 + (Replicate(),)
    assert [str(o) for s in entry.all_strategies() if s.inputs == batch for o in s.outputs] == [
        "gather(dim=0)", "reduce(sum)", "reduce(sum)"]


def test_view_as_explores_other_as_a_part_of_its_own(backend):
    """Other's placement is free: (R, S(k)) -> R and every joint with self's strategies."""
    case = next(c for c in backend.cases("aten.view_as.default") if c.args[0].dtype.is_floating_point)
    e = explore_case(case, backend.tensor_ops())
    assert e.independent is not None
    rules = {s.inputs: [str(o.first) for o in s.outputs] for s in e.all_strategies()}
    assert rules[(ShardIn(0), Replicate())] == ["gather(dim=0)"]
    assert rules[(Replicate(), ShardIn(1))] == ["identity"]
    assert rules[(ShardIn(0), ShardIn(1))] == ["gather(dim=0)"]


# --------------------------------------------------------------------------- end to end


def test_view_cases_carry_candidates(backend):
    case = next(c for c in backend.cases("aten.view.default") if c.args[0].dtype.is_floating_point)
    assert case.candidates and case.fn is not torch.ops.aten.view.default
    (mm,) = backend.cases("aten.mm.default")[:1]
    assert mm.candidates is None


def test_permute_explores_to_a_derived_entry(backend):
    record = explore_op(backend, "aten.permute.default")
    assert record.status == "derived"
    entry = next(e for e in record.entries if e.signature.startswith("self:f["))
    assert entry.status == "derived" and entry.combine.by_label


@pytest.mark.parametrize("op, sig, combine", [
    ("aten.mm.default", "self:f[*,*] mat2:f[*,*]", "{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)"),
    ("aten.index_select.default", None, None),
    ("aten.sum.dim_IntList", None, None),
    ("aten.add.Tensor", None, None),
])
def test_end_to_end(backend, op, sig, combine):
    record = explore_op(backend, op)
    assert record.status == "ok", record
    if sig:
        entry = record.entry(sig)
        assert entry is not None and str(entry.combine).startswith(combine)
        assert str(entry.shard) == "[[S1, S2], [S2, S3]]"


def test_runner_returns_side_effects_and_keeps_inputs():
    from metaspmd.backends.torch.backend import make_runner

    func = torch.ops.aten._native_batch_norm_legit.default
    x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
    mean, var = torch.zeros(3), torch.ones(3)
    out = make_runner(func)(x, w, b, mean, var, True, 0.5, 1e-5)
    assert len(out) == 5  # output, save_mean, save_invstd, then the updated running stats
    assert torch.equal(mean, torch.zeros(3)) and torch.equal(var, torch.ones(3))  # cloned, not mutated
    assert torch.allclose(out[3], 0.5 * x.mean(dim=(0, 2)))


def test_guard_refuses_inconsistent_shards():
    from metaspmd.backends.torch.backend import consistent_shards_only

    func = torch.ops.aten._adaptive_avg_pool2d_backward.default
    grad, x = torch.randn(4, 2, 2), torch.randn(4, 6, 6)
    fn = consistent_shards_only(func, (grad, x), {})
    assert fn(grad[:2], x[:2]).shape == (2, 6, 6)  # both sharded on dim 0: fine
    with pytest.raises(ValueError):
        fn(grad[:2], x)  # only the gradient sharded: the kernel would read out of bounds
    assert catalog.trusts_matching_shapes(func) and not catalog.trusts_matching_shapes(torch.ops.aten.mm.default)


def test_convolution_backward_checks_its_own_shapes_and_cuts_its_batch():
    """convolution_backward raises on a spatial cut of grad_output alone rather than reading
    past it; its batch it sizes by input's (guarded exactly, not by the shared guard): its
    weight (as high in rank as the others) stays whole beside a cut batch, which the shared
    guard refused, and data parallelism gets its rule."""
    func = torch.ops.aten.convolution_backward.default
    assert catalog.trusts_matching_shapes(func) and catalog.exact_guard(func) == "conv_output"
    grad, x, w = torch.randn(4, 4, 6, dtype=torch.float64), torch.randn(4, 2, 8, dtype=torch.float64), torch.randn(
        4, 2, 3, dtype=torch.float64)
    params = [[4], [1], [0], [1], False, [0], 1, [True, True, True]]
    with pytest.raises(RuntimeError):
        func(grad[:, :, :3], x, w, *params)
    entry = explore_case(OpCase("cb", func, (grad, x, w, *params)), TorchBackend().tensor_ops())
    batch = entry.shard.inputs[0][0].label
    assert batch and entry.shard.inputs[1][0].label == batch and all(d.label != batch for d in entry.shard.inputs[2])
    assert [str(o) for o in entry.combine.as_dict()[batch]] == ["gather(dim=0)", "reduce(sum)", "reduce(sum)"]


def test_convolution_double_backward_is_guarded_exactly_and_cuts_its_batch():
    """The shared guard kept the weights (as high in rank as the batch's tensors) whole
    beside a cut batch, and so refused it: the exact guard takes one convolution's shapes,
    refuses any other (gO not the forward's output of self and weight), and data
    parallelism gets its rule."""
    from metaspmd.backends.torch.backend import torch_case

    func = torch.ops.aten._convolution_double_backward.default
    assert catalog.exact_guard(func) == "conv_double_output"
    r = functools.partial(torch.randn, dtype=torch.float64)
    ggI, ggW, ggb, gO, w, x = r(4, 2, 8), r(3, 2, 3), r(3), r(4, 3, 6), r(3, 2, 3), r(4, 2, 8)
    params = ([1], [0], [1], False, [0], 1, [True, True, True])
    case = torch_case(func, (ggI, ggW, ggb, gO, w, x, *params), {}, func)
    with pytest.raises(ValueError, match="one convolution's"):
        case.fn(ggI, ggW, ggb, gO[:2], w, x, *params)  # gO's batch cut alone
    entry = explore_case(case, TorchBackend().tensor_ops())
    batch = entry.shard.inputs[0][0].label
    assert batch and entry.shard.inputs[3][0].label == batch and entry.shard.inputs[5][0].label == batch
    assert all(d.label != batch for d in entry.shard.inputs[4])
    assert [str(o) for o in entry.combine.as_dict()[batch]] == ["gather(dim=0)", "gather(dim=0)", "reduce(sum)"]


def test_cholesky_solve_helper_cuts_its_batch_and_columns_and_never_its_factor_alone():
    """Its kernel hands LAPACK self's sizes and reads A by them (a cut of A alone corrupted
    the heap): the exact guard refuses any A that is not a square factor of self's rows
    and batch, and the hand-built sample finds the batch and right-hand-side column cuts."""
    from metaspmd.backends.torch import hand_samples
    from metaspmd.backends.torch.backend import torch_case

    func = torch.ops.aten._cholesky_solve_helper.default
    assert catalog.exact_guard(func) == "square_factor" and hand_samples.guess_for(func) is not None
    args, kwargs = hand_samples.inputs(func, hand_samples.guess_for(func), 0)
    case = torch_case(func, args, kwargs, func)
    b, factor, upper = args
    for cut in (factor[:, :2], factor[:, :, :2], factor[:1]):
        with pytest.raises(ValueError, match="square factor"):
            case.fn(b, cut, upper)
    entry = explore_case(case, TorchBackend().tensor_ops())
    assert entry.status == "ok"
    assert sorted(str(c) for o in entry.combine.as_dict().values() for c in o) == [
        "gather(dim=0)", "gather(dim=2)", "reduce(sum)"]  # batch, columns, a Partial right-hand side


def test_guard_refuses_a_batch_cut_in_one_input_only():
    """lu_unpack sizes its work by LU_data's batch and writes past a buffer when the pivots'
    batch is whole: such local calls are refused, a batch cut in both runs."""
    from metaspmd.backends.torch.backend import batches_alike

    func = torch.ops.aten.lu_unpack.default
    lu, pivots = torch.linalg.lu_factor(torch.randn(4, 3, 3))
    fn = batches_alike(func, catalog.positional_names(func), catalog.batch_tied(func))
    assert fn(lu[:2], pivots[:2])[0].shape == (2, 3, 3)
    with pytest.raises(ValueError):
        fn(lu[:2], pivots)  # unguarded: free(): invalid next size, the process aborts


def test_guard_refuses_a_reflection_padding_as_long_as_its_input():
    """reflection_pad2d's backward trusts its padding to be shorter than self, as the forward
    checks: a proportional cut of grad_output and self that leaves a shorter self is refused."""
    from metaspmd.backends.torch.backend import padding_within

    func = torch.ops.aten.reflection_pad2d_backward.default
    assert catalog.reflects(func) and not catalog.reflects(torch.ops.aten.reflection_pad2d.default)
    fn = padding_within(func, catalog.positional_names(func))
    x = torch.randn(1, 2, 4, 5)
    grad = torch.randn(1, 2, 6, 9)
    assert fn(grad, x, [2, 2, 1, 1]).shape == x.shape
    with pytest.raises(ValueError):
        fn(grad[:, :, :3], x[:, :, :1], [2, 2, 1, 1])  # unguarded: the process aborts


def test_integer_sample_data_is_checked_on_blind_data_too():
    """argmin's OpInfo sample draws 12 integers from a narrow range: on its lucky splits the
    largest local index equals the global one, so P(max) held on the sample's data alone.
    Blind trials join in for integer data and refute it: a flattened index has no combine."""
    argmin = get_backend(opinfos=("argmin",))
    cases = [c for c in argmin.cases("aten.argmin.default") if c.args[0].dtype == torch.int64 and not c.reserve]
    assert cases
    for case in cases:
        assert explore_case(case, argmin.tensor_ops()).status == "replicate-only"


def test_dims_that_index_values_address_are_never_cut():
    """adaptive_max_pool2d_backward's indices are flat positions in self's H x W plane: a
    local call on a cut plane would write past it, so it is refused before the kernel runs."""
    from metaspmd.backends.torch.backend import torch_case

    func = torch.ops.aten.adaptive_max_pool2d_backward.default
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    out, idx = torch.ops.aten.adaptive_max_pool2d.default(x, [3, 3])
    case = torch_case(func, (torch.randn_like(out), x, idx), {}, func)
    with pytest.raises(ValueError, match="self"):
        case.fn(torch.randn_like(out)[:, :, :2], x[:, :, :3], idx[:, :, :2])
    assert case.fn(torch.randn_like(out)[:1], x[:1], idx[:1]).shape == (1, 3, 6, 6)  # the batch dim is free


def test_ctc_loss_backward_is_explored_with_its_addressed_dims_whole():
    """Its lengths lists and targets address T, the batch and the classes; a cut of any of
    them segfaulted the sweep worker. Explored in this process: a crash fails the run."""
    from metaspmd.backends.torch.backend import torch_case
    from metaspmd.backends.torch.tensor_ops import TorchOps

    func = torch.ops.aten._ctc_loss_backward.default
    log_probs = torch.randn(12, 4, 5, dtype=torch.float64).log_softmax(-1)
    targets = torch.randint(1, 5, (4, 3))
    lengths, target_lengths = [12] * 4, [3, 2, 3, 1]
    nll, alpha = torch.ops.aten._ctc_loss.default(log_probs, targets, lengths, target_lengths)
    args = (torch.rand(4, dtype=torch.float64), log_probs, targets, lengths, target_lengths, nll, alpha, 0)
    entry = explore_case(torch_case(func, args, {}, func), TorchOps())
    assert entry.status == "ok" and not any(isinstance(p, ShardIn) for s in entry.strategies() for p in s.inputs)
    assert [str(s.inputs[0]) for s in entry.strategies()] == ["P(sum)"]  # linear in grad


def test_ops_that_crash_on_special_values_get_none():
    """A NaN grid crashes grid_sampler_2d_backward (SIGSEGV): its cases carry no special
    values, which the explorer would otherwise try on Partial inputs left whole."""
    from metaspmd.backends.torch.backend import torch_case, make_runner

    func = catalog.resolve("aten.grid_sampler_2d_backward.default")
    assert "aten.grid_sampler_2d_backward.default" in catalog.CRASH_ON_SPECIAL_VALUES
    assert torch_case(func, (), {}, make_runner(func)).special is None
    mm = catalog.resolve("aten.mm.default")
    assert torch_case(mm, (), {}, make_runner(mm)).special is not None


def test_unset_buffers_are_filled_alike_on_every_build():
    """torch.empty's garbage in copy_'s self changed which samples ranked first from one
    index build to the next: the build fills it (NaN), then with seeded random values."""
    from metaspmd.backends.torch.samples import _captured_values, filled_memory

    before = torch.utils.deterministic.fill_uninitialized_memory, torch.are_deterministic_algorithms_enabled()
    with filled_memory():
        buffer = torch.empty(3, 4, dtype=torch.float64)
    assert torch.isnan(buffer).all()
    assert (torch.utils.deterministic.fill_uninitialized_memory, torch.are_deterministic_algorithms_enabled()) == before
    src = torch.arange(12.0).reshape(3, 4)
    (a, s), _ = _captured_values((buffer, src), {}, seed=0)
    (b, _), _ = _captured_values((buffer, src), {}, seed=0)
    assert torch.equal(a, b) and not torch.isnan(a).any() and len(set(a.flatten().tolist())) == 12
    assert torch.equal(s, src) and s is not src  # data stays as it is, snapshotted


def test_memory_a_kernel_allocates_holds_the_same_bytes_on_every_build():
    """A kernel's own buffer that a sample reads unwritten (repeat's backward hands one to
    narrow) held the heap's leftovers, so two index builds differed there. Under
    filled_memory every CPU allocation holds c10's junk pattern, whatever the heap held
    (torch.empty shows it where fill_uninitialized_memory is off), and the allocator is as
    it was afterwards."""
    from metaspmd.backends.torch.samples import _junk_fill_flag, _junk_filled_allocations, filled_memory

    flag = _junk_fill_flag()
    assert flag is not None  # the torch this project pins exports it
    before = flag.value
    with filled_memory():
        assert flag.value
    assert flag.value == before
    with _junk_filled_allocations():
        allocated = torch.empty(64, dtype=torch.int64)
    assert flag.value == before
    assert allocated.tolist() == [0x7FEDBEEF7FEDBEEF] * 64


@pytest.mark.slow  # two index builds in fresh processes (the heap's leftovers differ there)
def test_the_index_is_the_same_bytes_on_every_build(tmp_path):
    """The samples of repeat's and linalg.eig's OpInfos, built in two processes, hold the
    same bytes, among them narrow's and resolve_conj's, which read buffers that backward
    kernels allocate and leave unwritten."""
    script = ("import sys, torch; from metaspmd.backends.torch import samples as s; "
              "index = s.build_index(opinfos=('repeat', 'linalg.eig')); "
              "torch.save({op: [torch.utils._pytree.tree_leaves((c.args, c.kwargs)) for c in calls] "
              "for op, calls in index.items()}, sys.argv[1])")
    built = []
    for k in range(2):
        path = tmp_path / f"index{k}.pt"
        subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=600,
                       env=reproducible.child_env())
        built.append(torch.load(path, weights_only=True))
    assert {"aten.narrow.default", "aten.resolve_conj.default"} <= built[0].keys()
    assert built[0].keys() == built[1].keys()

    def raw(x):  # the bytes, NaN payloads and signed zeros included, in a layout of its own
        x = torch.empty(x.shape, dtype=x.dtype).copy_(x)
        x = torch.view_as_real(x) if x.is_complex() else x
        return x.reshape(-1).view(torch.uint8) if x.numel() else x

    for op in built[0]:
        for a, b in zip(built[0][op], built[1][op], strict=True):
            for x, y in zip(a, b, strict=True):
                if isinstance(x, torch.Tensor):
                    assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(raw(x), raw(y)), op
                else:
                    assert x == y, op


# --------------------------------------------------------------------------- custom ops (--kernels)


def test_a_module_of_custom_ops_is_swept_on_its_example_calls():
    root = Path(__file__).resolve().parents[2]
    backend = TorchBackend(kernels=str(root / "examples" / "custom_ops.py"))
    assert backend.list_ops() == ["metaspmd_examples.rms_norm.default"]
    cases = backend.cases("metaspmd_examples.rms_norm.default")
    assert [c.args[0].shape for c in cases] == [(4, 6, 8), (6, 8), (2, 3, 4, 8)]  # the last from its model
    entry = explore_case(cases[0], backend.tensor_ops())
    assert entry.status == "ok" and str(entry.shard) == "[[S1, S2, N], [N]]"  # never the normalized dim


MODEL_MODULE = """
import torch

@torch.library.custom_op("metaspmd_model_ns::scale_rows", mutates_args=())
def scale_rows(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x * s[:, None]

@torch.library.custom_op("metaspmd_model_ns::scale_rows_backward", mutates_args=())
def scale_rows_backward(grad: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return grad * s[:, None]

def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])

def _backward(ctx, grad):
    (s,) = ctx.saved_tensors
    return scale_rows_backward(grad, s), None

scale_rows.register_autograd(_backward, setup_context=_setup)

class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.s = torch.nn.Parameter(torch.randn(5))

    def forward(self, x):
        for _ in range(3):
            x = scale_rows(x, self.s)
        return x

METASPMD_MODELS = [lambda: (Stack(), (torch.randn(5, 4, requires_grad=True),))]
"""


def test_a_module_s_models_give_the_calls_they_make_forward_and_backward(tmp_path):
    module = tmp_path / "model_module.py"
    module.write_text(MODEL_MODULE)
    backend = TorchBackend(kernels=str(module))
    forward, backward = "metaspmd_model_ns.scale_rows.default", "metaspmd_model_ns.scale_rows_backward.default"
    assert sorted(backend.list_ops()) == [forward, backward]
    (case,) = backend.cases(forward)  # three layers call it alike: one signature, one case
    assert [a.shape for a in case.args] == [(5, 4), (5,)] and not case.args[0].requires_grad
    (grad_case,) = backend.cases(backward)  # called only by the backward pass
    assert [a.shape for a in grad_case.args] == [(5, 4), (5,)]
    entry = explore_case(case, backend.tensor_ops())
    assert entry.status == "ok" and str(entry.shard) == "[[S1, S2], [S1]]"
    # every build records the same values: the sweep's workers explore the same examples
    again = TorchBackend(kernels=str(module)).cases(forward)[0]
    assert torch.equal(again.args[0], case.args[0])


def _twice_module(tmp_path, name: str, namespace: str, tail: str) -> str:
    """A module file defining ``namespace::twice``, then ``tail``."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import torch\n"
        f"@torch.library.custom_op('{namespace}::twice', mutates_args=())\n"
        "def twice(x: torch.Tensor) -> torch.Tensor:\n"
        "    return 2 * x\n" + tail + "\n")
    return str(path)


def test_a_module_without_custom_ops_or_with_a_wrong_example_or_model_says_so(tmp_path):
    plain = tmp_path / "plain_module.py"
    plain.write_text("import torch\nscale = 2\n")
    with pytest.raises(ValueError, match="plain_module.py: defines no torch custom op"):
        TorchBackend(kernels=str(plain))
    wrong = _twice_module(tmp_path, "wrong_examples", "metaspmd_test_ns",
                          "METASPMD_EXAMPLES = {'metaspmd_test_ns::thrice': [((torch.ones(2),), {})]}")
    with pytest.raises(ValueError, match="wrong_examples.py: METASPMD_EXAMPLES names 'metaspmd_test_ns::thrice'"):
        TorchBackend(kernels=wrong)
    failing = _twice_module(tmp_path, "failing_model", "metaspmd_fail_ns",
                            "METASPMD_MODELS = [lambda: (twice, (torch.ones(2),)), lambda: (twice, (torch.ones(2), 3))]")
    with pytest.raises(ValueError, match=r"failing_model.py: METASPMD_MODELS\[1\] failed: RuntimeError: .*expected at most 1"):
        TorchBackend(kernels=failing)
    unused = _twice_module(tmp_path, "unused_model", "metaspmd_unused_ns",
                           "METASPMD_MODELS = [lambda: (torch.nn.Linear(2, 2), (torch.ones(2),))]")
    with pytest.raises(ValueError, match=r"unused_model.py: METASPMD_MODELS\[0\] calls no op of metaspmd_unused_ns"):
        TorchBackend(kernels=unused)


@pytest.mark.parametrize("tail, message", [
    ("METASPMD_EXAMPLES = [((torch.ones(2),), {})]", r"METASPMD_EXAMPLES must be a dict of op name .* got list"),
    ("METASPMD_EXAMPLES = {3: []}", r"METASPMD_EXAMPLES\[3\]: the key must be an op name"),
    ("METASPMD_EXAMPLES = {'{ns}::twice': [((torch.ones(2),),)]}",
     r"METASPMD_EXAMPLES\['{ns}::twice'\]\[0\] must be an \(args, kwargs\) pair"),
    ("METASPMD_EXAMPLES = {'{ns}::twice': ((torch.ones(2),), {})}",
     r"METASPMD_EXAMPLES\['{ns}::twice'\]\[0\] must be an \(args, kwargs\) pair"),
    ("METASPMD_EXAMPLES = {'{ns}::twice': []}", r"METASPMD_EXAMPLES\['{ns}::twice'\] must be a non-empty list"),
    ("METASPMD_EXAMPLES = {'{ns}::twice': [((torch.ones(2), 3), {})]}",
     r"METASPMD_EXAMPLES\['{ns}::twice'\]\[0\] does not fit the op's schema .*at most 1 positional"),
    ("METASPMD_EXAMPLES = {'{ns}::twice': [((), {'y': torch.ones(2)})]}",
     r"METASPMD_EXAMPLES\['{ns}::twice'\]\[0\] does not fit .*no argument 'y'"),
    ("METASPMD_EXAMPLES = {'aten::mm': [((torch.ones(2, 2), torch.ones(2, 2)), {})]}",
     r"METASPMD_EXAMPLES\['aten::mm'\]: not an op of this module \(its namespaces: {ns}\)"),
    ("METASPMD_MODELS = None", r"METASPMD_MODELS must be a list of functions .* got NoneType"),
])
def test_malformed_examples_and_models_are_refused_naming_the_entry(tmp_path, tail, message):
    """Each was an AttributeError or an unpacking error naming no file or entry, or (a call
    that does not fit the schema) the op's failed file and exit 0, or (another module's op,
    an empty list) nothing at all."""
    ns = f"metaspmd_bad_{abs(hash(tail)) % 10**8}"
    module = _twice_module(tmp_path, f"bad_{ns}", ns, tail.replace("{ns}", ns))
    with pytest.raises(ValueError, match=f"bad_{ns}.py: " + message.replace("{ns}", ns)):
        TorchBackend(kernels=module)


@pytest.mark.parametrize("first", ["defines", "imports"])
def test_two_kernel_files_one_importing_the_other_load_it_once(tmp_path, monkeypatch, first):
    """A file given to --kernels was imported under metaspmd's own name, and a neighbour's
    `import` of it by its plain name imported it again: its Library("ns", "DEF") then
    failed ("Only a single TORCH_LIBRARY can be used to register the namespace")."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    ns = f"metaspmd_twofiles_{first}"
    defines, imports = tmp_path / f"{ns}_defines.py", tmp_path / f"{ns}_imports.py"
    defines.write_text("import torch\n"
                       f"LIB = torch.library.Library('{ns}', 'DEF')\n"
                       f"LIB.define('halve(Tensor x) -> Tensor')\n"
                       f"LIB.impl('halve', lambda x: x / 2, 'CompositeExplicitAutograd')\n")
    imports.write_text(f"import torch\nimport {defines.stem}  # noqa: F401\n\n"
                       f"@torch.library.custom_op('{ns}::third', mutates_args=())\n"
                       "def third(x: torch.Tensor) -> torch.Tensor:\n"
                       "    return x / 3\n")
    files = [str(defines), str(imports)] if first == "defines" else [str(imports), str(defines)]
    backend = TorchBackend(kernels=files)
    assert {f"{ns}.halve.default", f"{ns}.third.default"} <= set(backend.list_ops())


def test_a_custom_out_overload_that_does_not_resize_gets_outs_shaped_by_its_functional_one(tmp_path):
    """Its example's out= tensor was allocated empty, as ATen's out kernels resize it; a
    kernel writing by copy_ failed (size 0 against 4) and the op's file said failed."""
    module = tmp_path / "noresize_out.py"
    module.write_text(
        "import torch\n"
        "LIB = torch.library.Library('metaspmd_noresize', 'DEF')\n"
        "LIB.define('scale(Tensor x, float s) -> Tensor')\n"
        "LIB.define('scale.out(Tensor x, float s, *, Tensor(a!) out) -> Tensor(a!)')\n"
        "LIB.impl('scale', lambda x, s: x * s, 'CompositeExplicitAutograd')\n"
        "def scale_out(x, s, *, out):\n"
        "    return out.copy_(x * s)\n"
        "LIB.impl('scale.out', scale_out, 'CompositeExplicitAutograd')\n"
        "METASPMD_EXAMPLES = {'metaspmd_noresize.scale.out': [((torch.randn(6, 4), 3.0), {'out': torch.empty(6, 4)})]}\n")
    backend = TorchBackend(kernels=str(module))
    entry = explore_case(backend.cases("metaspmd_noresize.scale.out")[0], backend.tensor_ops())
    assert entry.status == "ok" and str(entry.shard) == "[[S1, S2]]", entry


def test_a_recurrent_layer_refuses_hidden_states_cut_apart():
    """lstm reads c0 by h0's sizes, unchecked: an h0 with more layers than c0 crashed the
    process (SIGSEGV). Hidden states of two shapes, or not one per layer and direction,
    are refused; a batch cut of all of them runs."""
    from metaspmd.backends.torch.backend import torch_case

    func = torch.ops.aten.lstm.input
    x, h0, c0 = torch.randn(4, 3, 2, dtype=torch.float64), torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(2, 3, 5, dtype=torch.float64)
    params = [torch.randn(*s, dtype=torch.float64) for s in ((20, 2), (20, 5), (20,), (20,), (20, 5), (20, 5), (20,), (20,))]
    rest = (params, True, 2, 0.0, True, False, False)
    fn = torch_case(func, (x, [h0, c0], *rest), {}, func).fn
    with pytest.raises(ValueError, match="hidden states"):
        fn(x, [torch.cat([h0, h0, h0]), c0], *rest)
    with pytest.raises(ValueError, match="hidden states"):
        fn(x, [h0[:1], c0[:1]], *rest)
    out, hy, cy = fn(x[:, :2], [h0[:, :2], c0[:, :2]], *rest)
    assert out.shape == (4, 2, 5) and hy.shape == cy.shape == (2, 2, 5)


def test_onednn_recurrent_layers_have_no_rule_for_their_opaque_workspace():
    reason = catalog.no_rule_reason(torch.ops.aten.mkldnn_rnn_layer_backward.default)
    assert reason == catalog.no_rule_reason(torch.ops.aten.mkldnn_rnn_layer.default) and "workspace" in reason


def test_a_vmap_batch_wrapper_has_no_rule_for_what_no_op_outside_vmap_reads():
    """Its record said "failed: Batching rule not implemented for aten::is_nonzero", an error
    of the explorer's comparison, not of the op."""
    func = torch.ops.aten._add_batch_dim.default
    wrapped = func(torch.randn(4, 6), 1, 1)
    assert wrapped.shape == (4,)  # dim 1 is the level's batch, hidden from ops outside it
    with pytest.raises(RuntimeError, match="Batching rule not implemented"):
        repr(wrapped)
    assert "BatchedTensor" in catalog.no_rule_reason(func)


def test_cdist_backward_refuses_a_grid_unlike_its_rows():
    """_cdist_backward reads grad and cdist as x1's rows by x2's rows, unchecked. Its own
    guard refuses grids of other sizes; the shared guard it replaces kept x1's rows whole
    beside a cut grad, so it had batch cuts only."""
    from metaspmd.backends.torch.backend import torch_case

    func = torch.ops.aten._cdist_backward.default
    x1, x2 = torch.randn(5, 3, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    cdist = torch.cdist(x1, x2, p=2.0)
    grad = torch.randn_like(cdist)
    fn = torch_case(func, (grad, x1, x2, 2.0, cdist), {}, func).fn
    with pytest.raises(ValueError, match="x1's rows by x2's rows"):
        fn(grad[:, :3], x1, x2, 2.0, cdist[:, :3])
    with pytest.raises(ValueError, match="x1's rows by x2's rows"):
        fn(grad, x1[:, :2], x2, 2.0, cdist)
    rows = fn(grad[:2], x1[:2], x2, 2.0, cdist[:2])
    assert torch.allclose(rows, func(grad, x1, x2, 2.0, cdist)[:2])


def test_in_place_squeeze_is_derived_and_keeps_a_one_row_shard():
    """squeeze_ of every size-1 dim: a shard one row long must keep that row, so shards
    squeeze the globally removed dims only, each on a copy (the call restrides self in
    place, and the explorer calls the rule's function on the example's own tensor)."""
    x = torch.randn(5, 1, 4, 1)
    rule = _rule_for(torch.ops.aten.squeeze_.default, x)
    assert _gather_rules(rule) == {0: 0, 2: 1}
    shard = x[:1]
    assert rule.fn(shard).shape == (1, 4) and shard.shape == (1, 1, 4, 1)


def test_unpacking_a_packed_sequence_refuses_batch_sizes_it_cannot_trust():
    """_pad_packed_sequence reads data's rows by batch_sizes, sorted longest first, without
    checking: a reordered batch_sizes aborted the process. Such calls, and data of another
    row count, are refused; a cut of the feature dim runs."""
    from metaspmd.backends.torch.backend import torch_case

    func = torch.ops.aten._pad_packed_sequence.default
    sizes = torch.tensor([3, 3, 2, 1])
    data = torch.randn(9, 4, dtype=torch.float64)
    fn = torch_case(func, (data, sizes, False, 0.0, 4), {}, func).fn
    with pytest.raises(ValueError, match="batch_sizes"):
        fn(data, torch.tensor([1, 2, 3, 3]), False, 0.0, 4)
    with pytest.raises(ValueError, match="batch_sizes"):
        fn(data[:5], sizes, False, 0.0, 4)
    padded, lengths = fn(data[:, :2], sizes, False, 0.0, 4)
    assert torch.equal(padded, func(data, sizes, False, 0.0, 4)[0][..., :2]) and lengths.tolist() == [4, 3, 2]


def test_weight_norm_refuses_v_cut_beside_a_whole_g():
    """_weight_norm_interface walks g by v's size along dim, unchecked (SIGABRT when v
    alone was cut): the shared shape guard keeps them cut alike."""
    from metaspmd.backends.torch.backend import torch_case

    func = torch.ops.aten._weight_norm_interface.default
    v, g = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 1, dtype=torch.float64)
    fn = torch_case(func, (v, g, 0), {}, func).fn
    with pytest.raises(ValueError, match="inconsistent shards"):
        fn(v[:3], g, 0)
    w, norms = fn(v[:3], g[:3], 0)
    assert torch.allclose(w, func(v, g, 0)[0][:3])


def test_unbind_of_a_dim_of_two_is_derived_not_failed():
    """The check of reduces on three shards lengthens the cut dim to three: unbind along it
    then gives three outputs, which cannot speak to the two of the example (it raised
    IndexError, and the entry failed). Such a trial is uninformative."""
    from metaspmd.backends.torch.backend import make_runner, torch_case

    func = torch.ops.aten.unbind.int
    e = explore_case(torch_case(func, (torch.randn(2, 3, 5, dtype=torch.float64),), {}, make_runner(func)),
                     get_backend(opinfos=()).tensor_ops())
    assert e.status == "derived" and [str(c) for c in e.combine.as_dict()["S2"]] == ["gather(dim=0)", "gather(dim=0)"]


def test_ctc_loss_runs_with_the_memory_it_leaves_unwritten_filled():
    """_ctc_loss leaves log_alpha unwritten past each target's length: run under torch's NaN
    fill, two runs agree and the explorer can judge it. No cut holds: log_alpha is as long as
    the longest target of the batch, so a shard of the batch can make it shorter."""
    from metaspmd.backends.torch.backend import torch_case
    from metaspmd.backends.torch.tensor_ops import TorchOps

    op = torch.ops.aten._ctc_loss.Tensor
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(6, 4, 5, dtype=torch.float64, generator=g).log_softmax(2),
            torch.randint(1, 5, (4, 3), generator=g), torch.tensor([6, 5, 6, 4]), torch.tensor([3, 2, 1, 3]))
    assert catalog.nondeterministic_reason(op) is None
    case = torch_case(op, args, {}, op)
    first, second = case.fn(*args), case.fn(*args)
    assert first[1].isnan().any()
    torch.testing.assert_close(first, second, equal_nan=True, rtol=0, atol=0)
    entry = explore_case(case, TorchOps())
    assert entry.status == "replicate-only", entry.reason
