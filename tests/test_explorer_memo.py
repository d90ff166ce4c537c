"""What one exploration works out once and reuses: fresh inputs drawn once per seed, and
the search memo's values kept beside the objects whose ids key them."""

import collections
import sys
from pathlib import Path

import numpy as np

from metaspmd.case import OpCase
from metaspmd.combine import Split
from metaspmd.explorer import explore_case
from metaspmd.explorer.common import Memo

sys.path.insert(0, str(Path(__file__).parent))  # the fake backend's numpy TensorOps
from fake_backend.numpy_ops import NumpyOps  # noqa: E402

OPS = NumpyOps()


def _arrays(seed, *shapes):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s) for s in shapes)


def test_each_fresh_input_is_drawn_once_per_call():
    # special values always wanted: their trials start from the fresh inputs the baseline
    # drew, and the search's refuters from the same seeds again
    draws = collections.Counter()

    def fresh(seed):
        draws[seed] += 1
        return _arrays(seed + 1, (6, 4), (4, 3)), {}

    def special(args, kwargs, k, seed):
        return tuple(np.where(np.abs(a) < 0.5, 0.0, a) for a in args), kwargs

    case = OpCase("mm", lambda a, b: a @ b, _arrays(0, (6, 4), (4, 3)), {}, ("a", "b"), fresh=fresh,
                  special=special, special_always=True)
    entry = explore_case(case, OPS)
    assert entry.status == "ok" and entry.shard.labels()  # the row cut of a, at least
    assert draws and max(draws.values()) == 1, draws
    assert {1, 2, 3, 4} <= set(draws)  # the baseline's fresh trials


def test_memo_keeps_a_value_per_key_and_holds_what_its_ids_name():
    memo, made = Memo(), []
    x = np.ones(3)

    def make():
        made.append(1)
        return x.sum()

    assert memo.keep(("sum", id(x)), x, make) == 3.0
    assert memo.keep(("sum", id(x)), x, make) == 3.0
    assert len(made) == 1
    held, _ = memo.derived[("sum", id(x))]
    assert held is x  # so no other array can take x's id while the memo lives


def test_split_bounds_are_a_fresh_list_each_time():
    first = Split(3).bounds(7)
    assert first == [(0, 3), (3, 2), (5, 2)]
    first.append((9, 9))
    assert Split(3).bounds(7) == [(0, 3), (3, 2), (5, 2)]
    assert Split(2, skew=True).bounds(8) == [(0, 6), (6, 2)]
    assert Split(4).bounds(3) is None


class _Forgetful(dict):
    """A memo table that keeps nothing: every ask is worked out again."""

    def get(self, key, default=None):
        return default

    def __contains__(self, key):
        return False


def _forgetting(monkeypatch, *tables):
    from metaspmd.explorer.core import Explorer

    init = Explorer.__init__

    def forgetful_init(self, *a, **k):
        init(self, *a, **k)
        for t in tables:
            setattr(self.memo, t, _Forgetful())

    monkeypatch.setattr(Explorer, "__init__", forgetful_init)


def _independent_case():
    # two independent parts (the search runs across them and within each) whose dims of
    # equal length the op refuses to lengthen alone (b + c): tied amounts are probed
    def f(a, b, c):
        return a.sum(0), b + c

    return OpCase("parts", f, _arrays(3, (6, 4), (5, 4), (5, 4)), {}, ("a", "b", "c"))


def test_each_group_runs_its_shards_once_per_trial_and_split(monkeypatch):
    from metaspmd.explorer.shards import Shards

    runs, asks = collections.Counter(), collections.Counter()
    run, ask = Shards._run_locals, Shards._locals

    def counted_run(self, group, trial, split):
        runs[group, id(trial), split] += 1
        return run(self, group, trial, split)

    def counted_ask(self, group, trial, split):
        asks[group, id(trial), split] += 1
        return ask(self, group, trial, split)

    monkeypatch.setattr(Shards, "_run_locals", counted_run)
    monkeypatch.setattr(Shards, "_locals", counted_ask)
    entry = explore_case(_independent_case(), OPS)
    assert entry.status == "ok" and runs and max(runs.values()) == 1
    assert sum(asks.values()) > sum(runs.values())  # asked again, answered from the memo
    monkeypatch.undo()
    _forgetting(monkeypatch, "locals")
    assert repr(explore_case(_independent_case(), OPS)) == repr(entry)  # the same entry without it


def test_each_trial_is_lengthened_once_per_amounts(monkeypatch):
    from metaspmd.explorer.core import Explorer

    lengthened = collections.Counter()
    by, rebuilt = Explorer._lengthened_by, Explorer._rebuilt_trials

    def tagged(self, amounts):
        leaf = by(self, amounts)
        leaf.amounts = tuple(sorted(amounts.items()))
        return leaf

    def counted(self, leaf, trials):
        for t in trials:
            if hasattr(leaf, "amounts") and not t.special:
                lengthened[id(t), leaf.amounts] += 1
        return rebuilt(self, leaf, trials)

    monkeypatch.setattr(Explorer, "_lengthened_by", tagged)
    monkeypatch.setattr(Explorer, "_rebuilt_trials", counted)
    entry = explore_case(_independent_case(), OPS)
    assert entry.status == "ok" and lengthened and max(lengthened.values()) == 1
    monkeypatch.undo()
    _forgetting(monkeypatch, "lengthened")
    assert repr(explore_case(_independent_case(), OPS)) == repr(entry)


def test_a_trials_argument_template_goes_with_the_trial():
    import gc
    import weakref

    from metaspmd.explorer.common import Context
    from metaspmd.explorer.trials import Trials

    case = OpCase("mm", lambda a, b: a @ b, _arrays(0, (6, 4), (4, 3)), {}, ("a", "b"))
    runner = Trials(Context.of(case, OPS))
    a, b = _arrays(5, (6, 4), (4, 3))
    trial = runner._trial((a, b), {})
    fill = trial.template[2]
    out, _ = runner._call([a[:3], b], trial)
    assert out[0].shape == (3, 3) and np.allclose(out[0], a[:3] @ b)
    runner._call([a[3:], b], trial)
    assert trial.template[2] is fill  # made once, when the op first ran on the trial's arguments
    gone = weakref.ref(a)
    del a, b, trial, out, fill
    gc.collect()
    assert gone() is None  # nothing but the trial held its arguments


def test_a_large_example_is_explored_without_the_memos_tensors(monkeypatch):
    """Inputs past MEMO_ELEMENTS (a model's real sizes, explored live) keep no shard outputs
    and no derived tensors in the memo, and find the same entry."""
    from metaspmd.explorer import core

    entry = explore_case(_independent_case(), OPS)
    memos = []
    made = core.Memo

    def recorded(**kwargs):
        memos.append(made(**kwargs))
        return memos[-1]

    monkeypatch.setattr(core, "Memo", recorded)
    monkeypatch.setattr(core, "MEMO_ELEMENTS", 0)
    assert repr(explore_case(_independent_case(), OPS)) == repr(entry)
    assert memos and all(not m.holds_values and not m.locals and not m.derived for m in memos)
    monkeypatch.setattr(core, "MEMO_ELEMENTS", 1 << 20)
    explore_case(_independent_case(), OPS)
    assert memos[-1].holds_values and memos[-1].locals and memos[-1].derived
