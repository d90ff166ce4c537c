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
