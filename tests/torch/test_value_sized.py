"""Outputs sized by values, not shapes: bincount's length and one_hot's width follow the
largest value, which a shard reads from its own part (catalog.VALUE_SIZED). Trials that put
the largest value in every shard passed cuts of it; the registry kept them, and a call
whose largest value lies in one shard was wrong."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import catalog, table  # noqa: E402
from metaspmd.backends.torch.backend import torch_case  # noqa: E402
from metaspmd.backends.torch.samples import call_signature  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
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


def test_no_table_rule_cuts_what_sizes_an_output():
    labels = torch.randint(0, 5, (20, 10, 5))
    for func, args in [(aten.one_hot.default, (labels,)),
                       (aten.bincount.default, (torch.randint(0, 20, (20,)), torch.randint(0, 3, (20,)), 8))]:
        rules = table.lookup(func, args, {}) or ()
        assert not any(isinstance(s.inputs[0], ShardIn) for s in rules), func


def test_a_sparse_tensors_rank_keys_its_rules():
    """The output's rank is indices' length plus the values' dense dims: a gather of its
    dim 4 was keyed by every length of indices."""
    func = aten.sparse_coo_tensor.indices
    assert catalog.exact_sizes(func) == {"indices": slice(0, 1)}
    sig = call_signature(func, (torch.zeros(6, 6, dtype=torch.int64), torch.randn(6, 6)), {})
    assert sig.startswith("indices:i[6,*]")
