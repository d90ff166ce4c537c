"""Groups the explorer leaves untried because another's runs settle them: a cut the case
refused by shape, beside Partial inputs (ShapeRefused), and a Partial set beside a cut that
failed at an output none of the set reaches (``_unmendable``). Each gives the same entry
with fewer runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch.backend import torch_case  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.case import ShapeRefused  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.explorer.independence import IndependentParts  # noqa: E402

aten = torch.ops.aten
F64 = torch.float64


def _batch_norm_case():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 5, 5, generator=g, dtype=F64)
    w, b = torch.randn(6, generator=g, dtype=F64), torch.randn(6, generator=g, dtype=F64)
    mean, var = torch.zeros(6, dtype=F64), torch.ones(6, dtype=F64)
    op = aten.native_batch_norm.default
    return torch_case(op, (x, w, b, mean, var, True, 0.1, 1e-5), {}, op)


def _counted(case, refusal=None):
    """The case with its calls counted: ``calls[0]`` all, ``calls[1]`` refused by shape;
    ``refusal`` re-raises those as another exception."""
    calls, inner = [0, 0], case.fn

    def fn(*args, **kwargs):
        calls[0] += 1
        try:
            return inner(*args, **kwargs)
        except ShapeRefused as e:
            calls[1] += 1
            raise (refusal(str(e)) if refusal else e)

    return replace(case, fn=fn), calls


def test_a_cut_refused_by_shape_is_not_tried_again_beside_partial_inputs():
    """Batch norm's kernel trusts its per-channel inputs to match the input's channels: a
    channel cut of the input alone is refused on shapes, and so is every Partial set beside
    it, which keeps every shape. As a plain ValueError the refusal is paid group by group."""
    memo_case, memo_calls = _counted(_batch_norm_case())
    plain_case, plain_calls = _counted(_batch_norm_case(), refusal=ValueError)
    remembered = explore_case(memo_case, TorchOps())
    paid = explore_case(plain_case, TorchOps())
    assert repr(remembered) == repr(paid) and remembered.status == "ok"
    assert 0 < memo_calls[1] < plain_calls[1] / 3
    assert memo_calls[0] < plain_calls[0]


def test_partial_sets_beside_a_cut_refused_by_shape_are_not_even_made(monkeypatch):
    """Where the example's plain cut was refused on shapes, the search goes on to halos
    and the rest without making its Partial sets at all; the entry is the one the search
    gives when the refusal is a plain error and every set is tried."""
    from metaspmd.explorer.common import EXPLORE_SPLIT, refusal_key
    from metaspmd.explorer.groups import Groups

    asked, refused_asked = [], []
    made = Groups._partial_groups

    def recording(self, group, parts):
        asked.append(group.dims)
        if refusal_key(group.dims, self.trials[0], EXPLORE_SPLIT) in self.memo.refused:
            refused_asked.append(group.dims)
        return made(self, group, parts)

    monkeypatch.setattr(Groups, "_partial_groups", recording)
    case, calls = _counted(_batch_norm_case())
    entry = explore_case(case, TorchOps())
    plain_case, _ = _counted(_batch_norm_case(), refusal=ValueError)
    assert calls[1] > 0 and asked and not refused_asked
    assert repr(entry) == repr(explore_case(plain_case, TorchOps()))


def test_partial_sets_that_cannot_reach_a_failed_output_are_left_untried(monkeypatch):
    """Cut along its batch, batch norm's save_invstd has no combine, and reads neither the
    weight nor the bias nor the running statistics: no Partial set of those mends it."""
    pruned_case, pruned = _counted(_batch_norm_case())
    pruned_entry = explore_case(pruned_case, TorchOps())
    monkeypatch.setattr(IndependentParts, "_unmendable", lambda self, group, inputs: False)
    tried_case, tried = _counted(_batch_norm_case())
    tried_entry = explore_case(tried_case, TorchOps())
    assert repr(pruned_entry) == repr(tried_entry)
    assert pruned[0] < tried[0] - 50


def test_an_output_that_reads_the_partial_input_keeps_its_partial_group():
    """addmm's contraction cut alone fails at its one output, which reads the bias: the
    bias made Partial beside it is tried, and holds as reduce(sum)."""
    g = torch.Generator().manual_seed(1)
    bias, a, b = (torch.randn(*s, generator=g, dtype=F64) for s in ((6, 5), (6, 8), (8, 5)))
    entry = explore_case(torch_case(aten.addmm.default, (bias, a, b), {}, aten.addmm.default), TorchOps())
    contraction = entry.shard.inputs[1][1].label
    assert contraction and entry.shard.inputs[2][0].label == contraction
    assert contraction in [p.label for p in entry.partial.inputs[0]]
    assert [str(o) for o in dict(entry.combine.by_label)[contraction]] == ["reduce(sum)"]
