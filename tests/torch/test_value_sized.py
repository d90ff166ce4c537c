"""What a signature leaves open must not change what a rule means. Outputs sized by values,
not shapes: bincount's length and one_hot's width follow the largest value, which a shard
reads from its own part (catalog.VALUE_SIZED); trials that put the largest value in every
shard passed cuts of it. Positions that may repeat across a cut (max_unpool's indices from
overlapping windows, catalog.REPEATED_POSITIONS). And an output dim placed by an input's
size (sparse_coo_tensor's rank, catalog.PINNED_DIMS)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import catalog, table  # noqa: E402
from metaspmd.backends.torch.backend import torch_case  # noqa: E402
from metaspmd.backends.torch.samples import call_signature  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.signature import split_signature  # noqa: E402
from metaspmd.spec import PartialInput, Replicate, ShardIn  # noqa: E402

aten = torch.ops.aten


def _explored(func, args):
    def fresh(seed):  # labels 0..4 throughout, the largest in every shard, as OpInfo's
        g = torch.Generator().manual_seed(seed)
        def drawn(a):
            if not isinstance(a, torch.Tensor):
                return a
            if a.dtype == torch.int64:
                return torch.randint(0, 5, a.shape, generator=g)
            return torch.randn(a.shape, generator=g, dtype=a.dtype)

        return tuple(map(drawn, args)), {}

    return explore_case(torch_case(func, args, {}, func, fresh), TorchOps())


def cut_dims(entry) -> set[int]:
    return {p.dim for s in entry.strategies() for p in s.inputs if isinstance(p, ShardIn)}


def test_one_hot_without_num_classes_keeps_no_cut():
    labels = torch.randint(0, 5, (20, 10))
    entry = _explored(aten.one_hot.default, (labels,))
    assert entry.status == "replicate-only" and "largest value plus one" in entry.reason
    assert cut_dims(_explored(aten.one_hot.default, (labels, 10))) == {0, 1}  # a width of its own


def test_bincount_keeps_its_weights_split_into_parts_and_no_cut_of_self():
    entry = _explored(aten.bincount.default, (torch.randint(0, 5, (13,)), torch.randn(13, dtype=torch.float64)))
    assert [s.inputs for s in entry.strategies()] == [(Replicate(), PartialInput("sum"))]


def test_no_table_rule_cuts_or_splits_what_sizes_an_output():
    """Every entry of the generated table, not one lookup: bincount's minlength=8 entry,
    the one that held a cut, is gone from the registry, so a lookup of it passes unchecked."""
    rules = table.table()
    for op, sized in [("aten.one_hot.default", lambda sig: "num_classes" not in sig),
                      ("aten.bincount.default", lambda sig: True), ("aten.bincount.out", lambda sig: True)]:
        assert rules.entries(op), op  # the op has rules, at other signatures at least
        for sig in filter(sized, rules.entries(op)):
            first = [s.inputs[0] for s in rules.strategies(op, sig)]
            assert not any(isinstance(p, (ShardIn, PartialInput)) for p in first), (op, sig)


def test_a_sparse_tensors_rank_keys_its_rules():
    """The output's rank is indices' length plus the values' dense dims: a gather of its
    dim 4 was keyed by every length of indices."""
    func = aten.sparse_coo_tensor.indices
    assert catalog.exact_sizes(func) == {"indices": slice(0, 1)}
    sig = call_signature(func, (torch.zeros(6, 6, dtype=torch.int64), torch.randn(6, 6)), {})
    assert sig.startswith("indices:i[6,*]")


def test_unpooling_positions_that_repeat_across_a_cut_keep_its_spatial_dims_whole():
    """Overlapping windows (kernel 3, stride 1) pick one position for two rows of indices:
    cut between them, both shards write it, and a sum of their outputs counts it twice."""
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pooled, where = aten.max_pool2d_with_indices.default(x, [3, 3], [1, 1])
    whole = aten.max_unpool2d.default(pooled, where, [6, 6])
    halves = sum(aten.max_unpool2d.default(p, i, [6, 6]) for p, i in zip(pooled.split(2, 2), where.split(2, 2)))
    assert not torch.allclose(halves, whole)  # the rule the registry had
    func = aten.max_unpool2d.default
    assert catalog.uncut_dims(func, (pooled, where)) == {(0, 2), (0, 3), (1, 2), (1, 3)}
    entry = explore_case(torch_case(func, (pooled, where, [6, 6]), {}, func), TorchOps())
    assert cut_dims(entry) <= {0, 1}
    for op, spatial in (("aten.max_unpool2d.default", 2), ("aten.max_unpool3d.default", 3)):
        for sig in table.table().entries(op):  # every entry: no cut of a spatial dim of self or indices
            rank = split_signature(sig)[0][2].count(",") + 1  # self's, as indices'
            for s in table.table().strategies(op, sig):
                assert not any(isinstance(p, ShardIn) and p.dim >= rank - spatial for p in s.inputs[:2]), (op, sig)
