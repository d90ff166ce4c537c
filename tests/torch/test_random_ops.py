"""Random ops: fills, deterministic limits and factories get rules that hold in distribution."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # the OpInfo database needs it

from metaspmd.backends.torch import catalog, get_backend, random_ops  # noqa: E402
from metaspmd.backends.torch.backend import torch_case  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.case import Skip  # noqa: E402
from metaspmd.explorer import explore_case, explore_op  # noqa: E402
from metaspmd.spec import Gather, ShardIn  # noqa: E402

aten = torch.ops.aten
F64 = torch.float64


@pytest.fixture(scope="module")
def backend():
    return get_backend(opinfos=("bernoulli", "uniform", "multinomial", "randn", "normal"))


def _combines(entry) -> list:
    return [c for outs in entry.combine.as_dict().values() for o in outs for c in o.options]


def test_named_random_overloads_exist():
    names = set(catalog.all_overloads())
    assert random_ops.FILL_OVERLOADS <= names
    assert set(random_ops.LIMITS) <= names


def test_a_fill_gathers_shards_and_adds_no_draws_together():
    """uniform_'s values depend on no input value: zeroed, any combine of the right shape
    would pass, but a sum or max of draws is not a draw, and identity needs equal streams."""
    x = torch.randn(6, 4, dtype=F64)
    e = explore_case(torch_case(aten.uniform_.default, (x, 0.0, 1.0), {}, aten.uniform_.default), TorchOps())
    assert e.status == "ok"
    assert e.partial.is_empty()
    assert {str(c) for c in _combines(e)} == {"gather(dim=0)", "gather(dim=1)"}
    assert random_ops.FILL_NOTE in e.notes


def test_without_the_random_flag_the_fill_would_get_unsound_combines():
    """The guard is what keeps reduce(sum) out: the same zeroed op, not marked random."""
    x = torch.randn(6, 4, dtype=F64)
    case = torch_case(aten.uniform_.default, (x, 0.0, 1.0), {}, aten.uniform_.default)
    e = explore_case(replace(case, random=False), TorchOps())
    assert not e.partial.is_empty() or any(not isinstance(c, Gather) for c in _combines(e))


def test_bernoulli_is_checked_in_its_limit_and_keeps_its_signature(backend):
    record = explore_op(backend, "aten.bernoulli.default")
    assert record.status == "ok"
    for entry in record.entries:
        if entry.status == "ok":
            assert all(isinstance(c, Gather) for c in _combines(entry))
            assert any("p rounded to 0 or 1" in n for n in entry.notes)


def test_multinomial_shards_rows_not_categories(backend):
    """One-hot rows with replacement: a row shard samples its own rows, a category shard
    returns local indices. Calls without replacement have no deterministic limit."""
    cases = [c for c in backend.cases("aten.multinomial.default") if not c.reserve]  # those the sweep explores
    assert cases and all(c.kwargs.get("replacement", c.args[2] if len(c.args) > 2 else False) for c in cases)
    for case in cases:
        e = explore_case(case, backend.tensor_ops())
        assert e.status == "ok"
        rows, categories = e.shard.inputs[0]
        assert rows.label and not categories.label


def test_a_limit_that_is_not_deterministic_fails_closed():
    """bernoulli run outside its limit, p in (0, 1): two identical calls differ."""
    p = torch.full((6, 4), 0.5, dtype=F64)
    raw = torch_case(aten.bernoulli.default, (p,), {}, aten.bernoulli.default)
    e = explore_case(replace(raw, fn=aten.bernoulli.default), TorchOps())
    assert e.status == "failed" and "nondeterministic" in e.reason


def test_dropout_in_its_limit_shards_output_and_mask_alike():
    x = torch.randn(6, 4, dtype=F64)
    e = explore_case(torch_case(aten.native_dropout.default, (x, 0.3, True), {}, aten.native_dropout.default), TorchOps())
    assert e.status == "ok"
    assert {tuple(str(o) for o in outs) for outs in e.combine.as_dict().values()} == {
        ("gather(dim=0)", "gather(dim=0)"), ("gather(dim=1)", "gather(dim=1)")}


def test_rrelu_in_training_is_checked_with_lower_equal_upper():
    x = torch.randn(6, 4, dtype=F64)
    e = explore_case(torch_case(aten.rrelu.default, (x, 0.1, 0.3, True), {}, aten.rrelu.default), TorchOps())
    assert e.status == "ok" and any("lower = upper" in n for n in e.notes)
    assert sorted(str(c) for c in _combines(e)) == ["gather(dim=0)", "gather(dim=1)"]


def test_attention_in_its_limit_cuts_batch_heads_and_query_rows():
    """SDPA is checked at dropout_p = 0, with gathers only: batch and heads cut query, key
    and value alike, query rows cut the query alone; key rows, which softmax reads whole,
    are never cut. The flash kernel's inputs must be cut alike in batch and heads: cut
    apart, it divides by zero (SIGFPE), so such shards are refused before it runs."""
    q, k, v = (torch.randn(2, 3, n, 4, dtype=F64) for n in (5, 6, 6))
    func = aten.scaled_dot_product_attention.default
    e = explore_case(torch_case(func, (q, k, v), {"dropout_p": 0.5}, func), TorchOps())
    assert e.status == "ok" and any("dropout_p = 0" in n for n in e.notes)
    assert all(isinstance(c, Gather) for c in _combines(e))
    qs, ks, vs = e.shard.inputs
    assert qs[0].label and qs[0].label == ks[0].label == vs[0].label and qs[1].label == ks[1].label == vs[1].label
    assert qs[2].label and not ks[2].label and not vs[2].label
    # at dropout_p = 0 it draws nothing: a deterministic op, linear in value
    e = explore_case(torch_case(func, (q, k, v), {}, func), TorchOps())
    assert any(random_ops.NO_DRAWS_NOTE.format("dropout_p = 0") == n for n in e.notes)
    assert [len(p) for p in e.partial.inputs] == [0, 0, 1] and "reduce(sum)" in str(e.combine)
    assert not random_ops.draws_nothing(func, (q, k, v), {"dropout_p": 0.5})
    flash = aten._scaled_dot_product_flash_attention_for_cpu.default
    case = torch_case(flash, (q, k, v), {}, flash)
    with pytest.raises(ValueError):
        case.fn(q[:1], k[:, :1], v)


def test_a_random_factory_is_replicated_under_a_shared_seed(backend):
    record = explore_op(backend, "aten.randn.default")
    assert record.status == "derived"
    assert all(random_ops.FACTORY_NOTE in e.notes for e in record.entries)


def test_random_ops_with_no_checkable_form_stay_nondeterministic(backend):
    with pytest.raises(Skip) as info:
        backend.cases("aten.poisson.default")  # no limit where its draws stop being random
    assert info.value.status == "nondeterministic"
    assert not random_ops.checkable(aten.randint_like.Tensor)  # its bound is a tensor value
    assert not random_ops.checkable(aten.resize_.default)  # uninitialized memory, not random


def test_the_sharded_dim_of_a_fill_is_any_dim():
    """randn_like of a 3-D tensor: every dim gathers."""
    x = torch.randn(4, 6, 8, dtype=F64)
    e = explore_case(torch_case(aten.randn_like.default, (x,), {}, aten.randn_like.default), TorchOps())
    placed = {p.dim for s in e.strategies() for p in s.inputs if isinstance(p, ShardIn)}
    assert placed == {0, 1, 2}


def test_a_recurrent_layer_without_dropout_is_explored_and_cut_along_its_batch():
    """lstm is tagged random for its dropout between layers; at dropout = 0 it draws
    nothing and is explored as a deterministic op: input, h0 and c0 cut along the batch
    (dim 1), the weights whole, every output gathered along it. The time dim, walked in
    order, is never cut."""
    func = aten.lstm.input
    torch.manual_seed(0)
    x, h0, c0 = torch.randn(4, 3, 2, dtype=F64), torch.randn(1, 3, 5, dtype=F64), torch.randn(1, 3, 5, dtype=F64)
    params = [torch.randn(20, 2, dtype=F64), torch.randn(20, 5, dtype=F64), torch.randn(20, dtype=F64), torch.randn(20, dtype=F64)]
    call = (x, [h0, c0], params, True, 1, 0.0, True, False, False)
    assert random_ops.draws_nothing(func, call, {}) and not random_ops.draws_nothing(func, (*call[:5], 0.5, *call[6:]), {})
    e = explore_case(torch_case(func, call, {}, func), TorchOps())
    assert e.status == "ok" and random_ops.NO_DRAWS_NOTE.format("dropout = 0") in e.notes
    xs, hs, cs, *weights = e.shard.inputs  # tensor leaves, in order
    assert not any(d.label for w in weights for d in w) and not xs[0].label and xs[1].label and xs[1].label == hs[1].label == cs[1].label
    assert {str(c) for c in _combines(e)} == {"gather(dim=1)"}


@pytest.mark.parametrize("op", [aten.feature_dropout.default, aten.feature_alpha_dropout_.default])
def test_feature_dropout_cuts_batch_and_channels_only(op):
    """Its mask is one draw per (batch, channel), broadcast over the other dims: cut along
    one of those, two ranks would draw one channel's mask each. In the deterministic limit
    every dim gathers; only the shared-draw guard keeps the spatial cuts out."""
    x = torch.randn(4, 6, 5, 3, dtype=F64)
    case = torch_case(op, (x, 0.5, True), {}, op)
    assert case.shared_dims == (2, 3)
    e = explore_case(case, TorchOps())
    assert e.status == "ok" and e.partial.is_empty()
    assert [bool(p.label) for p in e.shard.inputs[0]] == [True, True, False, False]
    assert {str(c) for c in _combines(e)} == {"gather(dim=0)", "gather(dim=1)"}
    assert any("one draw per (batch, channel)" in n for n in e.notes)
    unguarded = explore_case(replace(case, shared_dims=()), TorchOps())
    assert [bool(p.label) for p in unguarded.shard.inputs[0]] == [True] * 4


def test_elementwise_dropout_shares_no_draw():
    x = torch.randn(4, 6, 5, 3, dtype=F64)
    case = torch_case(aten.dropout.default, (x, 0.5, True), {}, aten.dropout.default)
    assert case.shared_dims == ()
    assert [bool(p.label) for p in explore_case(case, TorchOps()).shard.inputs[0]] == [True] * 4


def test_binomial_is_checked_with_prob_rounded_and_gathers_only():
    count = torch.full((6, 4), 5.0, dtype=F64)
    prob = torch.rand(6, 4, dtype=F64, generator=torch.Generator().manual_seed(0))
    e = explore_case(torch_case(aten.binomial.default, (count, prob), {}, aten.binomial.default), TorchOps())
    assert e.status == "ok" and any("prob rounded to 0 or 1" in n for n in e.notes)
    assert e.partial.is_empty()  # a sum of draws is not a draw
    assert sorted(str(c) for c in _combines(e)) == ["gather(dim=0)", "gather(dim=1)"]


def test_rrelu_with_noise_functional_cuts_its_output_and_noise_alike():
    x, noise = torch.randn(6, 4, dtype=F64), torch.zeros(6, 4, dtype=F64)
    op = aten.rrelu_with_noise_functional.default
    e = explore_case(torch_case(op, (x, noise, 0.1, 0.3, True), {}, op), TorchOps())
    assert e.status == "ok" and any("lower = upper" in n for n in e.notes)
    assert {tuple(str(o) for o in outs) for outs in e.combine.as_dict().values()} == {
        ("gather(dim=0)", "gather(dim=0)"), ("gather(dim=1)", "gather(dim=1)")}


def test_normal_functional_and_its_out_are_fills():
    assert random_ops.is_fill(aten.normal_functional.default) and random_ops.is_fill(aten.normal.out)
    assert not random_ops.is_fill(aten.normal.Tensor_float)  # its mean is a tensor's values
    e = explore_case(torch_case(aten.normal_functional.default, (torch.randn(6, 4, dtype=F64), 0.0, 1.0), {},
                                aten.normal_functional.default), TorchOps())
    assert e.status == "ok" and random_ops.FILL_NOTE in e.notes
    assert all(isinstance(c, Gather) for c in _combines(e) if str(c) != "identity")


def test_a_tagged_op_that_draws_nothing_is_explored_as_deterministic():
    """_fused_sdp_choice carries the nondeterministic_seeded tag but only names a kernel."""
    assert torch.Tag.nondeterministic_seeded in aten._fused_sdp_choice.default.tags
    assert catalog.nondeterministic_reason(aten._fused_sdp_choice.default) is None
    assert catalog.nondeterministic_reason(aten.poisson.default) is not None


def test_an_uncheckable_random_op_says_why_no_rule_is_verified(backend):
    with pytest.raises(Skip) as info:
        backend.cases("aten._standard_gamma.default")
    assert info.value.reason.endswith(random_ops.UNCHECKABLE)
