"""Combines that read more than the local outputs: argreduce takes the input's values,
positions their shards' starts."""

import sys
from pathlib import Path

import numpy as np

from metaspmd.combine import CutInput, apply_combine, holds
from metaspmd.spec import ArgReduce, GatherPositions

sys.path.insert(0, str(Path(__file__).parent))  # the fake backend's numpy TensorOps
from fake_backend.numpy_ops import NumpyOps  # noqa: E402


def test_argreduce_takes_the_first_winner_and_nan_first():
    """apply_combine of argreduce: local positions plus their shard's start, from the lowest
    shard whose value wins (argmax's first occurrence on ties), NaN above every number."""
    ops = NumpyOps()
    x = np.array([[1.0, 5.0, 2.0, 5.0, 0.0, 5.0], [3.0, 1.0, np.nan, 2.0, np.nan, 0.0]]).T  # [6, 2], dim 0 cut
    bounds = [(0, 2), (2, 2), (4, 2)]
    shards = [x[s:s + n] for s, n in bounds]
    cut = {0: CutInput(shards, 0, [s for s, _ in bounds])}
    for op, fn in (("max", np.argmax), ("min", np.argmin)):
        locals_ = [fn(s, axis=0) for s in shards]
        assert np.array_equal(apply_combine(ops, ArgReduce(op, 0), locals_, cut), fn(x, axis=0)), op
    # keepdim positions, and a position out of its shard's range fails rather than wraps
    locals_ = [np.argmax(s, axis=0, keepdims=True) for s in shards]
    assert holds(ops, ArgReduce("max", 0), locals_, np.argmax(x, axis=0, keepdims=True), cut)
    assert not holds(ops, ArgReduce("max", 0), [loc + 5 for loc in locals_], np.argmax(x, axis=0, keepdims=True), cut)
    assert not holds(ops, ArgReduce("max", 0), locals_, np.argmax(x, axis=0, keepdims=True))  # no values given


def test_overlap_add_sums_the_shared_ends():
    """gather(overlap=k): each shard's output starts k elements before the previous one
    ends; the shared elements are summed, the rest concatenated."""
    from metaspmd.spec import Gather

    ops = NumpyOps()
    full = np.convolve(np.arange(1.0, 9.0), [1.0, -2.0, 3.0])  # a transposed conv: 8 + 3 - 1 outputs
    x = np.arange(1.0, 9.0)
    locals_ = [np.convolve(x[s:s + n], [1.0, -2.0, 3.0]) for s, n in ((0, 3), (3, 4), (7, 1))]
    assert np.allclose(apply_combine(ops, Gather(0, overlap=2), locals_), full)
    assert not holds(ops, Gather(0, halo=1), locals_, full)  # dropping the overlap loses the sums
    assert not holds(ops, Gather(0, overlap=3), locals_, full)


def test_proportional_bounds_follow_the_plain_cut():
    from metaspmd.combine import proportional_bounds

    plain = [(0, 2), (2, 1), (3, 1)]  # a dim of 4 in three
    assert proportional_bounds(plain, 2, 0, 8) == [(0, 4), (4, 2), (6, 2)]  # stride 2
    assert proportional_bounds(plain, 1, 1, 5) == [(0, 3), (2, 2), (3, 2)]  # windows of 2, stride 1
    assert proportional_bounds(plain, 2, 0, 9) is None  # a length out of proportion


def test_a_local_follower_reaches_past_the_dim_where_the_op_pads():
    from metaspmd.combine import follower_ranges, follower_shards
    from metaspmd.spec import ShardIn

    ops = NumpyOps()
    source, operand = np.zeros((5,)), np.arange(4.0)  # windows of 2 on the operand padded by (1, 1)
    padding = lambda i, d: (1, 1) if i == 1 else None  # noqa: E731
    placements = (ShardIn(0), ShardIn(0, 0, 1, 1, local=True))
    reference = [(0, 2), (2, 2), (4, 1)]  # windows [0, 2), [2, 4), [4, 5)
    assert follower_ranges(ops, [source, operand], placements, reference, padding) == {1: [(-1, 2), (1, 4), (3, 5)]}
    shards = follower_shards(ops, [source, operand], placements, reference, padding)[1]
    assert [s.tolist() for s in shards] == [[0.0, 1.0], [1.0, 2.0, 3.0], [3.0]]  # clipped: the op pads the rest
    assert follower_ranges(ops, [source, operand], placements, reference) is None  # no padding, nothing to re-base


def test_partial_factors_multiply_to_the_input():
    from metaspmd.combine import partial_factors

    ops = NumpyOps()
    x = np.array([[1.5, -2.0], [0.0, 3.0]])
    for n in (2, 3, 4):
        parts = partial_factors(ops, x, n, seed=n, spread=8.0)
        assert len(parts) == n and np.allclose(np.prod(parts, axis=0), x)
        assert not any(np.allclose(p, x) for p in parts[:-1])


def test_positions_move_by_their_shards_start_before_the_gather():
    """nonzero of rows cut in three: each shard's row numbers (element 0 of every row of
    positions) plus its first row, concatenated; the other elements and an unknown start
    are left alone or refused."""
    ops = NumpyOps()
    x = np.array([[0, 1], [2, 0], [0, 0], [3, 4], [0, 5]])
    bounds = [(0, 2), (2, 2), (4, 1)]
    shards = [x[s:s + n] for s, n in bounds]
    cut = {0: CutInput(shards, 0, [s for s, _ in bounds])}
    locals_ = [np.argwhere(s) for s in shards]
    assert holds(ops, GatherPositions(0, 0), locals_, np.argwhere(x), cut)
    assert not holds(ops, GatherPositions(0, 1), locals_, np.argwhere(x), cut)
    assert not holds(ops, GatherPositions(0), locals_, np.argwhere(x), cut)  # every element moved
    assert not holds(ops, GatherPositions(0, 0), locals_, np.argwhere(x))  # no starts given
    flat = [np.flatnonzero(s[:, 1]) for s in shards]
    assert np.array_equal(apply_combine(ops, GatherPositions(0), flat, cut), np.flatnonzero(x[:, 1]))


def test_close_is_one_comparison_for_every_backend():
    """The core close(): exact for integers and bools, a tolerance per dtype name scaled to
    the largest finite value, NaN matching NaN, and a value within a factor 2 of its dtype's
    largest finite one equal to the infinity of its sign (float16 here: any backend)."""
    from metaspmd.tensor_ops import close

    assert close(np.array([1, 2]), np.array([1, 2]), "int64") and not close(np.array([1, 2]), np.array([1, 3]), "int64")
    assert not close(np.array([True]), np.array([False]), "bool")
    x = np.array([1.0, np.nan, 1e6])
    assert close(x + 1e-4, x, "float64")  # 1e-4 against the largest value, 1e6
    assert not close(x + np.array([0.0, 0.0, 1.0]), x, "float64")
    assert close(x + np.array([0.0, 0.0, 1.0]), x, "float32")  # float32's tolerance is wider
    assert not close(np.array([1.0, np.nan]), np.array([1.0, 2.0]), "float64")
    assert close(np.array([0.5, 1.0]), np.array([0.51, 1.0]), "bfloat16")  # low-precision dtypes: 2e-2
    assert not close(np.array([1.0]), np.array([1.0, 1.0]), "float64")
    half = np.float16(6e4)
    assert close(np.array([np.inf], np.float16), np.array([half]), "float16")
    assert not close(np.array([np.inf], np.float16), np.array([-half]), "float16")  # the sign counts
    assert not close(np.array([np.inf]), np.array([6e4]), "float64")  # far from float64's overflow
    assert not close(np.array([np.inf + 0j]), np.array([3e38 + 0j]), "complex64")  # complex: no such rule


def test_the_check_loop_cuts_follows_splits_and_offsets_in_one_place():
    """shard_inputs: a plain cut with a halo and local params, an input cut in proportion
    to it, a Partial input split into parts that add up, an offset moved by each start."""
    from metaspmd.check import cut_inputs, shard_inputs, surviving
    from metaspmd.combine import Split, partial_parts
    from metaspmd.spec import Gather, IndexOffset, PartialInput, Reduce, ShardIn

    ops = NumpyOps()
    x, follower, p, positions = np.arange(6.0), np.arange(12.0), np.ones(3), np.array([4, 1])
    placements = (ShardIn(0, 1, local=True), ShardIn(0, 0, 2, 0), PartialInput("sum"), IndexOffset())
    leaves = [x, follower, p, positions]
    cut = cut_inputs(ops, leaves, placements, 3, Split(3).bounds)
    assert cut.bounds == {0: [(0, 2), (2, 2), (4, 2)]} and cut.values(placements) == {}  # a halo: no values
    sharded = shard_inputs(ops, leaves, placements, cut, lambda i, v, op: partial_parts(ops, v, op, 3, seed=i))
    assert [s.tolist() for s in sharded.pieces[0]] == [[0, 1, 2], [1, 2, 3, 4], [3, 4, 5]]  # a halo of 1
    assert [s.tolist() for s in sharded.pieces[1]] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert np.allclose(sum(sharded.pieces[2]), p) and not np.allclose(sharded.pieces[2][0], p)
    assert [s.tolist() for s in sharded.pieces[3]] == [[4, 1], [2, -1], [0, -3]]
    assert [loc[0] for loc in sharded.local] == [(0, 0, 2, 6), (0, 2, 4, 6), (0, 4, 6, 6)]
    assert len(sharded.inputs) == 3 and sharded.inputs[1][2] is sharded.pieces[2][1]
    # the op on each shard, and which combines rebuild its output
    plain = (ShardIn(0), PartialInput("sum"))
    sharded = shard_inputs(ops, [x, p[:1]], plain, cut_inputs(ops, [x, p[:1]], plain, 2, Split(2).bounds),
                           lambda i, v, op: partial_parts(ops, v, op, 2, seed=i))
    locals_ = sharded.run(lambda leaves, local: [leaves[0] * 2, leaves[1] + 0])
    assert surviving(ops, [[Gather(0), Reduce("sum")], [Reduce("sum"), Gather(0)]], locals_, [x * 2, p[:1]]) == [
        [Gather(0)], [Reduce("sum")]]
    # a dim that cannot be cut says so, and so does a proportion that does not fit
    assert cut_inputs(ops, leaves, placements, 7, Split(7).bounds).why == "a dim of size 6 cannot be cut in 7"
    wrong = [x, np.arange(11.0), p, positions]
    assert "proportional" in shard_inputs(ops, wrong, placements, cut_inputs(ops, wrong, placements, 3, Split(3).bounds),
                                          lambda i, v, op: [v] * 3)


def test_a_sum_is_compared_at_its_summands_size():
    """Locals that nearly cancel round at their own size: a sum rebuilt from them is held to
    a tolerance scaled to the largest local, not to the small result (a true rule's
    verdict then turned on the kernel's summation order); a wrong sum still fails, and
    other combines keep the result's scale."""
    from metaspmd.spec import Identity, Reduce

    ops = NumpyOps()
    result = np.array([3e-8, 0.0])
    locals_ = [np.array([1.0 + 3e-8, 0.1 + 0.2]), np.array([-1.0, -0.3])]
    rounded = locals_[0] + locals_[1]  # 0.1 + 0.2 - 0.3 is 5.6e-17 in float64, past 1e-9 of 3e-8
    assert not np.array_equal(rounded, result) and not ops.close(rounded, result)  # the result's scale refutes it
    assert holds(ops, Reduce("sum"), locals_, result)
    assert holds(ops, Reduce("avg"), [2 * x for x in locals_], result)
    assert not holds(ops, Reduce("sum"), locals_, result + 1e-6)  # a wrong sum: far past 1e-9 of 1.0
    assert not holds(ops, Reduce("max"), [rounded, rounded], result)  # not a sum: the result's scale
    assert not holds(ops, Identity(), [rounded], result)
