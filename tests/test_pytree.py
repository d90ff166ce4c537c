"""The core pytree: ``template`` rebuilds what ``replace`` does, walking the tree once."""

from collections import namedtuple

import pytest

from metaspmd import pytree

Pair = namedtuple("Pair", "a b")


def _is_leaf(x) -> bool:
    return isinstance(x, float)


TREE = ((1.0, [2, 3.0], Pair(4.0, "x"), ()), {"k": 5.0, "l": [6, (7.0,)], "m": None})


def test_template_builds_what_replace_does():
    new = [10.0, 20.0, 30.0, 40.0, 50.0]
    fill = pytree.template(TREE, _is_leaf)
    got = fill(new)
    assert got == pytree.replace(TREE, _is_leaf, new) == (
        (10.0, [2, 20.0], Pair(30.0, "x"), ()), {"k": 40.0, "l": [6, (50.0,)], "m": None})
    assert type(got[0][2]) is Pair and type(got[0][1]) is list
    # fresh containers each time: a call may not see another's list
    again = fill(new)
    assert again[0][1] is not got[0][1] and again[1] is not got[1]
    assert fill([1.0] * 5)[1]["l"] == [6, (1.0,)]
    assert pytree.template(2.0, _is_leaf)([3.0]) == 3.0 and pytree.template("s", _is_leaf)([]) == "s"


def test_template_and_replace_refuse_a_wrong_leaf_count():
    with pytest.raises(ValueError, match="4 leaves for a tree of 5"):
        pytree.template(TREE, _is_leaf)([1.0] * 4)
    with pytest.raises(ValueError, match="6 leaves for a tree of 5"):
        pytree.template(TREE, _is_leaf)([1.0] * 6)
    with pytest.raises(ValueError, match="1 leaves left over"):
        pytree.replace(TREE, _is_leaf, [1.0] * 6)


def test_walks_leave_no_garbage_for_the_collector():
    # a recursive closure per walk was a reference cycle per call: the explorer walks
    # arguments for every shard, and full collections came several times as often
    import gc

    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for _ in range(100):
            pytree.leaves(TREE, _is_leaf)
            pytree.replace(TREE, _is_leaf, [1.0] * 5)
            pytree.template(TREE, _is_leaf)([1.0] * 5)
        assert len(gc.get_objects()) - before < 10
    finally:
        gc.enable()
