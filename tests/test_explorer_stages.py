"""The explorer's stages on their own: the context, the baseline trials, the search and
its verification of one group, and the entry, each taking and returning explicit
records; and OpCase's grouped flags."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from metaspmd.case import IndexFlags, LocalParams, OpCase, Randomness, Sizes, SpecialValues
from metaspmd.explorer import explore_case
from metaspmd.explorer.baseline import Baseline, Verdict, draw_baseline
from metaspmd.explorer.common import TRIAL_SPLITS, Context, ExploreConfig
from metaspmd.explorer.core import Accepted, Explorer, Found, Search, entry_of
from metaspmd.explorer.verify import Verified
from metaspmd.spec import Gather, Group, Identity, OutputCombine, Reduce, ShardIn

sys.path.insert(0, str(Path(__file__).parent))  # the fake backend's numpy TensorOps
from fake_backend.numpy_ops import NumpyOps  # noqa: E402

OPS = NumpyOps()


def _arrays(seed, *shapes):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s) for s in shapes)


def _case(fn, shapes, names, **kw) -> OpCase:
    return OpCase("test", fn, _arrays(0, *shapes), {}, names, fresh=lambda seed: (_arrays(seed + 1, *shapes), {}), **kw)


def _baseline(case: OpCase) -> tuple[Context, Baseline]:
    context = Context.of(case, OPS)
    base = draw_baseline(context)
    assert isinstance(base, Baseline), base
    return context, base


# -- context ------------------------------------------------------------------------------

def test_context_names_every_tensor_leaf_and_keeps_fixed_arguments():
    case = OpCase("test", lambda xs, i: xs[0][i], ([np.ones(3), np.ones(3)], np.array([0, 1])), {}, ("xs", "i"),
                  fixed=frozenset({"i"}))
    context = Context.of(case, OPS)
    assert context.leaf_names == ("xs", "xs", "i") and context.fixed == {"i"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.seed = 1  # type: ignore[misc]


def test_context_drops_fixed_when_every_argument_is_fixed():
    # then they are the data: fixing them all would leave nothing to vary
    case = OpCase("test", np.bitwise_and, (np.array([1, 2]), np.array([3, 1])), {}, ("a", "b"),
                  fixed=frozenset({"a", "b"}))
    assert Context.of(case, OPS).fixed == frozenset()


# -- baseline -----------------------------------------------------------------------------

def test_baseline_is_the_example_then_one_fresh_trial_per_split():
    _, base = _baseline(_case(np.add, [(4, 3), (4, 3)], ("a", "b")))
    assert isinstance(base.trials, tuple) and [t.index for t in base.trials] == list(range(len(TRIAL_SPLITS) + 1))
    assert base.results[0].shape == (4, 3) and base.notes == ()
    first = base.trials[0]
    assert np.array_equal(first.outputs[0], np.add(*first.leaves))
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.outputs = []  # type: ignore[misc]


@pytest.mark.parametrize("fn, status, reason", [
    (lambda x: np.random.default_rng().standard_normal(x.shape), "failed", "nondeterministic"),
    (lambda x: np.linalg.cholesky(-np.ones((4, 4))), "failed", "LinAlgError"),
    (lambda x: np.zeros_like(x), "replicate-only", "output 0 does not vary with the inputs"),
    (lambda x: 3, "replicate-only", "no tensor output"),
])
def test_baseline_gives_a_verdict_where_no_search_can_run(fn, status, reason):
    base = draw_baseline(Context.of(_case(fn, [(4, 3)], ("x",)), OPS))
    assert isinstance(base, Verdict) and base.status == status and reason in base.reason, base


def test_an_op_of_no_tensor_input_is_derived_replicated():
    base = draw_baseline(Context.of(OpCase("test", lambda n: np.arange(float(n)), (4,), {}, ("n",)), OPS))
    assert isinstance(base, Verdict) and base.status == "derived" and base.results[0].shape == (4,)


def test_integer_data_calls_in_blind_trials():
    # integers drawn from a narrow range: blind data joins the sample's own
    ints = (np.arange(12).reshape(4, 3) % 3,)
    case = OpCase("test", np.negative, ints, {}, ("x",), fresh=lambda seed: (ints, {}))
    _, base = _baseline(case)
    assert len(base.trials) > len(TRIAL_SPLITS) + 1


# -- search and verification ----------------------------------------------------------------

def test_search_on_given_trials_finds_the_matmul_rule():
    context, base = _baseline(_case(np.matmul, [(6, 4), (4, 5)], ("a", "b")))
    found = Explorer(context, base.trials).search((2, 2))
    assert isinstance(found, Found) and found.status == "ok" and found.independent is None
    rules = {placements: outs for placements, outs in found.strategies}
    assert any(outs[0].first == Reduce("sum") for outs in rules.values())  # the contraction dim
    assert {2, 3, 4} <= found.counts and found.trials == len(base.trials) - 1


def test_verification_of_one_group_keeps_what_holds_and_refutes_the_rest():
    context, base = _baseline(_case(np.add, [(4, 3), (4, 3)], ("a", "b")))
    explorer = Explorer(context, base.trials)
    rows = Group(((0, 0, 0), (1, 0, 0)))
    verified = explorer._verify(rows, [[Gather(0), Gather(1), Reduce("sum"), Identity()]])
    assert isinstance(verified, Verified) and [o.options for o in verified.combines] == [(Gather(0),)]
    assert verified.counts == {2, 3, 4} and verified.uneven
    assert explorer._verify(Group(((0, 0, 0),)), [[Gather(0)]]) is None  # a's rows beside all of b do not broadcast


def test_verification_refutes_a_gather_on_a_flip():
    context, base = _baseline(_case(lambda x: np.flip(x, 0), [(5, 3)], ("x",)))
    assert Explorer(context, base.trials)._verify(Group(((0, 0, 0),)), [[Gather(0)]]) is None


def test_candidates_are_verified_instead_of_explored():
    rows, cols = (ShardIn(0),), (ShardIn(1),)
    candidates = ((rows, (OutputCombine.of([Gather(1)]),)), (cols, (OutputCombine.of([Gather(1)]),)))
    context, base = _baseline(_case(np.transpose, [(4, 6)], ("x",), candidates=candidates))
    explorer = Explorer(context, base.trials)
    accept = Accepted(explorer._verify, 1)
    explorer._verify_candidates(accept)
    assert [placements for placements, _ in accept.found] == [rows]  # cols would gather along dim 0
    search = explorer._search((2,), None)
    assert isinstance(search, Search) and search.status == "derived" and search.strategies[0][0] == rows


# -- entry --------------------------------------------------------------------------------

def test_entry_of_a_verdict_keeps_its_status_and_replicates_every_input():
    context = Context.of(_case(np.add, [(4, 3), (4, 3)], ("a", "b"), notes=("a note",)), OPS)
    e = entry_of(context, Verdict("failed", "why"), None)
    assert (e.status, e.reason, e.notes, e.verified) == ("failed", "why", ("a note",), None)
    assert not e.shard.labels()


def test_the_stages_in_turn_give_explore_case():
    case = _case(np.matmul, [(6, 4), (4, 5)], ("a", "b"))
    context, base = _baseline(case)
    staged = entry_of(context, base, Explorer(context, base.trials).search((2, 2)))
    assert staged == explore_case(case, OPS)
    assert str(staged.shard) == "[[S1, S2], [S2, S3]]"


def test_nothing_found_is_replicate_only():
    context, base = _baseline(_case(np.add, [(4, 3), (4, 3)], ("a", "b")))
    e = entry_of(context, base, Found((), 0, frozenset(), False, "ok"))
    assert (e.status, e.reason) == ("replicate-only", "no strategy holds")


# -- OpCase's grouped flags ---------------------------------------------------------------

def test_flat_keywords_fill_the_sub_records_and_read_back():
    pad = lambda leaf, dim: (1, 1)  # noqa: E731
    case = OpCase("test", np.add, (np.ones(2),), {}, ("x",), fixed=frozenset({"x"}), bounds_checked=True,
                  padding=pad, random=True, special_always=True, widen=True, exact_sizes={"x": slice(0, 1)})
    assert case.index == IndexFlags(fixed=frozenset({"x"}), bounds_checked=True)
    assert case.local == LocalParams(padding=pad)
    assert case.randomness == Randomness(random=True)
    assert case.specials == SpecialValues(always=True)
    assert case.sizes == Sizes(widen=True, exact_sizes={"x": slice(0, 1)})
    assert (case.fixed, case.padding, case.random, case.special_always, case.widen) == (
        frozenset({"x"}), pad, True, True, True)
    with pytest.raises(TypeError, match="no_such_flag"):
        OpCase("test", np.add, (), no_such_flag=True)


def test_replace_keeps_the_other_flags_of_a_sub_record():
    case = OpCase("test", np.add, (np.ones(2),), {}, ("x",), fixed=frozenset({"x"}), bounds_checked=True)
    plain = dataclasses.replace(case, bounds_checked=False, reserve=True)
    assert plain.index == IndexFlags(fixed=frozenset({"x"})) and plain.reserve
    grouped = dataclasses.replace(case, index=IndexFlags(), randomness=Randomness(value_free=True))
    assert not grouped.fixed and grouped.value_free and case.bounds_checked


def test_config_off_switches_reach_the_search():
    case = _case(np.matmul, [(6, 4), (4, 5)], ("a", "b"))
    context = Context.of(case, OPS, ExploreConfig(partial=False))
    base = draw_baseline(context)
    found = Explorer(context, base.trials).search((2, 2))
    assert found.strategies and not any("Partial" in type(p).__name__ for s, _ in found.strategies for p in s)


def test_the_search_s_own_arithmetic_warns_nothing():
    """Rows sorted up to infinities (the lengthening keeps sorted rows sorted, and takes
    their differences): numpy's floating-point warnings from the explorer's own arithmetic
    would reach the caller naming no op."""
    import warnings

    x = np.sort(np.random.default_rng(0).standard_normal((4, 6)), axis=-1)
    x[:, -2:] = np.inf
    case = OpCase("scale", lambda a: a * 2, (x,), {}, ("a",))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert explore_case(case, OPS).status == "ok"
