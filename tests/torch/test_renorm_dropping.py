"""embedding_renorm_'s dropping form: a shard of self's rows renormalizes the rows it holds,
positions outside them left out, so its row cut verifies with its indices offset (drop)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch.backend import make_runner, torch_case  # noqa: E402
from metaspmd.backends.torch.dropping import dropping_form  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402

RENORM = torch.ops.aten.embedding_renorm_.default


def test_shards_renormalize_their_own_rows():
    g = torch.Generator().manual_seed(0)
    weight, indices = 3 * torch.randn(7, 4, generator=g, dtype=torch.float64), torch.tensor([[6, 1], [3, 1]])
    whole = RENORM(weight.clone(), indices, 1.0, 2.0)
    drop = dropping_form(RENORM, RENORM)
    parts = [drop(weight[a:b].clone(), indices - a, 1.0, 2.0) for a, b in ((0, 2), (2, 5), (5, 7))]
    assert torch.equal(torch.cat(parts), whole)
    with pytest.raises(Exception):  # the kernel itself refuses positions past a shard's rows
        RENORM(weight[:2].clone(), indices, 1.0, 2.0)


@pytest.mark.parametrize("op", [RENORM, torch.ops.aten.embedding_renorm.default], ids=["in place", "functional"])
def test_row_cut_verifies_with_dropped_positions(op):
    # the functional form was replicate-only: only the in-place overload had a dropping form
    g = torch.Generator().manual_seed(1)
    weight, indices = 3 * torch.randn(6, 5, generator=g, dtype=torch.float64), torch.tensor([[0, 4], [5, 2]])
    entry = explore_case(torch_case(op, (weight, indices, 1.0, 2.0), {}, make_runner(op)), TorchOps())
    assert entry.status == "ok", entry.reason
    assert str(entry.shard) == "[[S1, N], [N, N]]" and str(entry.offset) == "[[], [S1(drop)]]", (entry.shard, entry.offset)
    assert str(entry.combine) == "{S1: gather(dim=0)}"
