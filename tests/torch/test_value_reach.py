"""Trials past and at the call's value arguments (OpCase.value_args).

Random data of unit scale seldom crosses a fill value of 3 or a clamp bound of -100, and a
rule true on one side of it only passed live exploration: an index cut of
``index_fill(x, 0, i, 3.0)`` rebuilt by ``reduce(max)`` (true while x stays under 3), a
Partial ``clamp(x, min=-100)`` as a sum (clamp is linear between its bounds). Trials with
every float element above the largest value argument, then below minus it, then both,
refute them. A NaN or infinite value argument calls in the special values, NaN and inf
among the data: a max of index_fill's shards filled with inf passed where self held NaN."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch.backend import torch_case, value_arguments  # noqa: E402
from metaspmd.backends.torch.rules_at_runtime import call_case  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.explorer.common import FIRST_SCALED_TRIAL, Context, ExploreConfig  # noqa: E402
from metaspmd.explorer.trials import Trials  # noqa: E402

aten = torch.ops.aten
INF = math.inf


def _strategies(op, *args) -> set[str]:
    e = explore_case(call_case(op, args, {}), TorchOps())
    assert e.status == "ok", (e.status, e.reason)
    return {str(s).split(": ", 1)[1] for s in e.all_strategies()}


@pytest.mark.parametrize("shape, dim, index", [((7,), 0, [1, 6]), ((3, 5), 1, [0, 4, 4]), ((6, 4), 0, [5, 0])])
@pytest.mark.parametrize("value, wrong", [(3.0, "reduce(max)"), (5.0, "reduce(max)"), (1e6, "reduce(max)"),
                                          (-5.0, "reduce(min)")])
def test_an_index_cut_of_a_fill_is_no_max_of_its_shards(shape, dim, index, value, wrong):
    """Each shard fills its own positions and leaves self elsewhere: a max rebuilds the
    fill only where self stays under the fill value, a min where it stays above."""
    found = _strategies(aten.index_fill.int_Scalar, torch.randn(*shape), dim, torch.tensor(index), value)
    assert not any(s.startswith("(R, S(0))") and wrong in s for s in found), found
    x = torch.full(shape, abs(value) * 2 * (1 if wrong == "reduce(max)" else -1))
    i = torch.tensor(index)
    whole = aten.index_fill.int_Scalar(x, dim, i, value)
    parts = [aten.index_fill.int_Scalar(x, dim, i[:1], value), aten.index_fill.int_Scalar(x, dim, i[1:], value)]
    combined = torch.maximum(*parts) if wrong == "reduce(max)" else torch.minimum(*parts)
    assert not torch.equal(combined, whole)  # the rule it must not keep is wrong


@pytest.mark.parametrize("op, args", [
    (aten.clamp.default, (torch.randn(3, 5), -100.0)),
    (aten.clamp.default, (torch.randn(7), None, 50.0)),
    (aten.clamp.default, (torch.randn(4, 6), -30.0, 30.0)),
    (aten.clamp_max.default, (torch.randn(7), 50.0)),
    (aten.clamp_min.default, (torch.randn(2, 7), -8.0)),
    (aten.hardtanh.default, (torch.randn(5, 3), -20.0, 20.0)),
    (aten.threshold.default, (torch.randn(6), 40.0, -3.0)),
])
def test_a_far_bound_keeps_no_partial_input(op, args):
    """clamp is linear between its bounds only: parts of a Partial input past a bound
    (partial sums of a matmul are not confined to the total's range) break a sum."""
    found = _strategies(op, *args)
    assert found and not any("P(" in s for s in found), found


@pytest.mark.parametrize("op, args, kwargs", [
    (aten.fmod.Scalar, (torch.randn(7), 1000.0), {}),
    (aten.remainder.Scalar, (torch.randn(3, 5), 500.0), {}),
    (aten.hardshrink.default, (torch.randn(7), 100.0), {}),
    (aten.softshrink.default, (torch.randn(7), 100.0), {}),
    (aten.softplus.default, (torch.randn(7), 1.0, -100.0), {}),
    (aten.round.decimals, (torch.randn(7),), {"decimals": -3}),
    (aten.round.decimals, (torch.randn(3, 5),), {"decimals": -2}),
    (aten.lt.Scalar, (torch.randn(7), -100.0), {}),
    (aten.isclose.default, (torch.randn(7), torch.randn(7), 1e-5, 100.0), {}),
])
def test_parts_spread_as_widely_as_the_scaled_data(op, args, kwargs):
    """fmod(x, 1000) of parts within a few units of x's own adds up to fmod(x) but where a
    part crosses a multiple of 1000: a Partial input's parts spread with the data's scale.
    round(x, decimals=-3) rounds to thousands, a scale its negative decimals set."""
    e = explore_case(call_case(op, args, kwargs), TorchOps())
    found = {str(s).split(": ", 1)[1] for s in e.all_strategies()}
    assert not any("P(" in s for s in found), found


@pytest.mark.parametrize("op, args", [
    (aten.index_fill.int_Scalar, (torch.randn(7), 0, torch.tensor([1, 6]), INF)),
    (aten.index_fill.int_Scalar, (torch.randn(7), 0, torch.tensor([1, 6]), -INF)),
    (aten.scatter.value, (torch.randn(3, 5), 0, torch.tensor([[0, 1, 2, 0, 1], [2, 2, 0, 1, 0]]), INF)),
])
def test_an_infinite_fill_meets_nan_and_inf_data(op, args):
    """With inf filled, a max of the shards' fills holds on finite self and not where self
    holds NaN; an avg not where it holds -inf."""
    found = _strategies(op, *args)
    assert not any(s.startswith("(R, S(0))") and ("max" in s or "min" in s or "avg" in s) for s in found), found
    x = torch.zeros(7)
    x[1] = math.nan
    i = torch.tensor([1, 6])
    parts = [aten.index_fill.int_Scalar(x, 0, i[:1], INF), aten.index_fill.int_Scalar(x, 0, i[1:], INF)]
    assert not torch.equal(torch.maximum(*parts), aten.index_fill.int_Scalar(x, 0, i, INF))


def test_value_arguments_are_the_scalar_and_float_ones():
    assert value_arguments(aten.index_fill.int_Scalar, (torch.ones(3), 0, torch.tensor([1]), 3.5), {}) == [3.5]
    assert value_arguments(aten.clamp.default, (torch.ones(3),), {"max": 7}) == [7.0]
    assert value_arguments(aten.clamp.default, (torch.ones(3), None, None), {}) == []
    assert value_arguments(aten.narrow.default, (torch.ones(9), 0, 2, 5), {}) == []  # dims and sizes are ints
    assert value_arguments(aten._foreach_add.ScalarList, ([torch.ones(2)], [2, -9.0]), {}) == [2.0, -9.0]


def test_scaled_trials_lie_past_and_at_the_values_and_keep_indices():
    args = (torch.randn(4, 5), 1, torch.tensor([0, 3]), 6.0)
    case = torch_case(aten.index_fill.int_Scalar, args, {}, aten.index_fill.int_Scalar)
    assert case.value_args == (6.0,) and not case.special_always
    runner = Trials(Context.of(case, TorchOps(), ExploreConfig(), 0))
    above, below, both = runner._scaled_trials(case.value_args)
    assert [t.index for t in (above, below, both)] == [FIRST_SCALED_TRIAL + j for j in range(3)]
    assert bool((above.args[0] >= 6.0).all()) and bool((below.args[0] <= -6.0).all())
    assert bool((both.args[0] > 6.0).any()) and bool((both.args[0] < -6.0).any())
    assert bool((both.args[0] == 6.0).any()) and bool((both.args[0] == -6.0).any())  # at the value too
    for t in (above, below, both):
        assert torch.equal(t.args[2], args[2]) and t.args[0].dtype == torch.float32 and t.scale == 12.0
    # integer data is moved too; a zero value argument plants zeros, with no side of it
    ints = torch_case(aten.index_fill.int_Scalar, (torch.randint(-9, 9, (6, 5)), 0, torch.tensor([1]), 100), {},
                      aten.index_fill.int_Scalar)
    above, below, both = Trials(Context.of(ints, TorchOps(), ExploreConfig(), 0))._scaled_trials(ints.value_args)
    assert above.args[0].dtype == torch.int64 and bool((above.args[0] >= 100).all()) and bool((below.args[0] <= -100).all())
    zero = torch_case(aten.hardshrink_backward.default, (torch.randn(6, 5), torch.randn(6, 5), 0.0), {},
                      aten.hardshrink_backward.default)
    (at,) = Trials(Context.of(zero, TorchOps(), ExploreConfig(), 0))._scaled_trials(zero.value_args)
    assert at.index == FIRST_SCALED_TRIAL + 2 and bool((at.args[1] == 0).any())


@pytest.mark.parametrize("value", [1.5, 2.0, -1.5, 0.5])
def test_a_fill_near_the_data_is_crossed_too(value):
    found = _strategies(aten.index_fill.int_Scalar, torch.randn(7), 0, torch.tensor([1, 6]), value)
    assert not any(s.startswith("(R, S(0))") for s in found), found


@pytest.mark.parametrize("value", [100, -1000])
def test_an_integer_self_is_moved_past_the_fill(value):
    found = _strategies(aten.index_fill.int_Scalar, torch.randint(-9, 9, (7,)), 0, torch.tensor([1, 6]), value)
    assert not any(s.startswith("(R, S(0))") for s in found), found


@pytest.mark.parametrize("op", [aten.hardshrink_backward.default, aten.softshrink_backward.default])
def test_a_zero_threshold_meets_zeros(op):
    """At lambd=0 the gradient passes wherever self is not exactly 0: random data never is,
    and a Partial self (a zero split into 1 and -1) passed as a sum."""
    found = _strategies(op, torch.randn(7), torch.randn(7), 0.0)
    assert not any(s.startswith("(P(sum), P(sum))") for s in found), found


def test_a_target_read_at_exactly_one_is_read():
    """cosine_embedding_loss reads its target only where it is exactly 1 or -1: random
    targets left every loss 0, and every combine (identity of a mean among them) held."""
    t = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0])
    found = _strategies(aten.cosine_embedding_loss.default, torch.randn(6, 4), torch.randn(6, 4), t)
    assert not any("identity" in s for s in found), found


def test_a_lone_scalar_refutes_identity_of_a_membership():
    """isin(2, x) is True where some shard holds a 2: special values planted 2s by chance,
    in every shard at once, and identity passed; the lone pattern plants one."""
    found = _strategies(aten.isin.Scalar_Tensor, 2, torch.randn(4, 6))
    assert found == {"(S(0)) -> (reduce(max))", "(S(1)) -> (reduce(max))"}, found
