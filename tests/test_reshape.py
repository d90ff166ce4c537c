"""The shape arithmetic of reshapes (metaspmd.reshape), which every backend shares."""

import pytest

from metaspmd.reshape import (
    reshape_block_mapping, reshape_candidates, reshape_even_mapping, reshape_groups, reshape_mapping, reshape_sizes,
)
from metaspmd.spec import Gather, ShardIn


def test_groups_pair_runs_of_equal_products_and_refuse_other_numels():
    assert reshape_groups((2, 3, 4), (6, 4)) == [([0, 1], [0]), ([2], [1])]
    assert reshape_groups((24, 5), (4, 6, 5)) == [([0], [0, 1]), ([1], [2])]
    assert reshape_groups((8, 16), (8, 16, 1)) == [([0], [0]), ([1], [1]), ([], [2])]
    with pytest.raises(ValueError, match="do not split into runs of equal products"):
        reshape_groups((2, 3), (7,))


def test_a_merge_cuts_its_leading_dim_plainly_and_the_others_in_blocks():
    assert reshape_mapping((4, 6, 5), (24, 5)) == {0: 0, 2: 1}
    assert reshape_block_mapping((4, 6, 5), (24, 5)) == {1: (0, 4)}
    assert reshape_block_mapping((2, 5, 5), (50,)) == {1: (0, 2), 2: (0, 10)}
    assert reshape_mapping((2, 1, 6), (2, 6)) == {0: 0, 2: 1}


def test_a_split_cuts_evenly_only_where_a_count_divides_both_dims():
    assert reshape_even_mapping((8, 256), (8, 4, 64)) == {1: 1}
    assert reshape_even_mapping((4, 6), (3, 8)) == {}
    assert reshape_mapping((24, 5), (4, 6, 5)) == {1: 2}
    assert reshape_sizes((8, 16, 4, 8), (8, 16, 32)) == {0: 0, 1: 1, 2: 2, 3: 2}


def test_candidates_gather_each_cut_as_its_mapping_says():
    found = {p[0].dim: c[0].options[0] for p, c in reshape_candidates((4, 6, 5), (24, 5))}
    assert found == {0: Gather(0), 2: Gather(1), 1: Gather(0, block=4)}
    split = reshape_candidates((8, 256), (8, 4, 64))
    assert split[-1][0] == (ShardIn(1),) and split[-1][1][0].options == (Gather(1, even=True),)
