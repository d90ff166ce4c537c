"""Sparse-layout outputs (to_sparse, sparse_coo_tensor, ...): compared and combined through
their dense values, verified like any other rule, and refused by every target, since a
distributed tensor of sparse shards cannot be redistributed or gathered."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metaspmd import spec  # noqa: E402
from metaspmd.backends.torch.backend import make_runner, torch_case  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.combine import holds  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.planner.strategies import axis_strategies  # noqa: E402
from metaspmd.target import DTENSOR_PLAN, DTENSOR_REGISTER, JAX_PLAN, makes_sparse, project  # noqa: E402

ops = TorchOps()
aten = torch.ops.aten


def _matrix(seed: int = 0) -> torch.Tensor:
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x * (x > 0)  # zeros, so the sparse forms leave entries out


def test_close_compares_values_and_structure():
    x = _matrix()
    coo = x.to_sparse()
    # the same values held as duplicate entries (uncoalesced) are the same tensor
    i = torch.cat([coo.indices(), coo.indices()], 1)
    halves = torch.sparse_coo_tensor(i, torch.cat([coo.values() / 2, coo.values() / 2]), x.shape)
    assert not halves.is_coalesced()
    assert ops.close(halves, coo)
    changed = x.clone()
    changed[0, 0] += 1
    assert not ops.close(changed.to_sparse(), coo)
    assert not ops.close(x.to_sparse_csr(), coo)  # another layout
    assert not ops.close(x.to_sparse(1), coo)  # another sparse_dim
    assert not ops.close(x, coo) and not ops.close(coo, x)  # dense against sparse
    assert ops.close(x.to_sparse_bsr((2, 2)), x.to_sparse_bsr((2, 2)))
    assert not ops.close(x.to_sparse_bsr((2, 2)), x.to_sparse_bsr((1, 1)))  # another block size


@pytest.mark.parametrize("layout", ["coo", "coo1", "csr", "csc"])
def test_arithmetic_keeps_the_layout(layout):
    x, y = _matrix(1), _matrix(2)
    make = {"coo": lambda t: t.to_sparse(), "coo1": lambda t: t.to_sparse(1), "csr": lambda t: t.to_sparse_csr(),
            "csc": lambda t: t.to_sparse_csc()}[layout]
    a, b = make(x), make(y)
    for got, want in [(ops.concat([ops.narrow(a, 0, 0, 2), ops.narrow(a, 0, 2, 4)], 0), x),
                      (ops.concat([a, b], 1), torch.cat([x, y], 1)), (ops.add(a, b), x + y),
                      (ops.maximum(a, b), torch.maximum(x, y)), (ops.scale(a, 0.5), x * 0.5)]:
        assert got.layout == a.layout and torch.equal(got.to_dense(), want)
        assert ops.close(got, make(want))
    assert (ops.to_numpy(a) == x.numpy()).all()


def test_invalid_sparse_tensors_are_never_compared():
    # an unchecked constructor given a cut of its indices: crow_indices must start at 0
    bad = aten._sparse_csr_tensor_unsafe(torch.tensor([1, 2, 3]), torch.tensor([0, 1]), torch.randn(2), [2, 2])
    assert "invalid sparse_csr tensor" in ops.opaque(bad)
    assert not ops.close(bad, bad)
    with pytest.raises(ValueError, match="invalid sparse_csr tensor"):
        ops.to_numpy(bad)
    assert ops.opaque(torch.eye(2).to_sparse()) == ""


def _explore(func, *args, **kwargs):
    return explore_case(torch_case(func, args, kwargs, make_runner(func)), ops)


@pytest.mark.parametrize("func", [aten.to_sparse.default, aten._to_sparse_csr.default])
def test_to_sparse_gets_verified_cuts(func):
    entry = _explore(func, _matrix())
    assert entry.status == "ok", entry.reason
    strategies = list(entry.all_strategies())
    cuts = {s.inputs[0].dim: s.outputs[0] for s in strategies if isinstance(s.inputs[0], spec.ShardIn)}
    # a row cut gathers rows, a column cut columns: nothing else holds
    assert [str(o) for o in cuts.values()] == ["gather(dim=0)", "gather(dim=1)"], cuts
    assert any(isinstance(s.inputs[0], spec.PartialInput) for s in strategies)  # linear in self


def test_a_wrong_gather_of_sparse_shards_is_refuted():
    x = _matrix()
    rows = [x[:3].to_sparse(), x[3:].to_sparse()]
    assert holds(ops, spec.Gather(0), rows, x.to_sparse())
    assert not holds(ops, spec.Gather(1), [x[:, :2].to_sparse(), x[:, 2:].to_sparse()][::-1], x.to_sparse())
    assert not holds(ops, spec.Reduce("sum"), rows, x.to_sparse())


def test_sparse_coo_tensor_sums_cut_entries():
    indices = torch.tensor([[0, 1, 1, 3, 4, 2], [2, 0, 3, 1, 4, 2]])
    entry = _explore(aten.sparse_coo_tensor.indices_size, indices, torch.randn(6, dtype=torch.float64), [5, 5])
    assert entry.status == "ok", entry.reason
    # each shard of the entries (indices' columns with values' rows) makes a sparse tensor
    # that holds part of the sum
    nnz = [s for s in entry.all_strategies() if isinstance(s.inputs[1], spec.ShardIn)]
    assert nnz and all(s.inputs[0] == spec.ShardIn(1) for s in nnz)
    assert all(str(s.outputs[0]) == "reduce(sum)" for s in nnz)


def _cut(dim: int = 0) -> spec.Strategy:
    return spec.Strategy("S1", (spec.ShardIn(dim),), (spec.OutputCombine((spec.Gather(dim),)),))


def test_targets_refuse_sparse_outputs():
    for target in (DTENSOR_REGISTER, DTENSOR_PLAN, JAX_PLAN):
        refused = project(_cut(), target, "aten.to_sparse.default")
        assert not refused and "gives a sparse tensor" in refused.reason and target.name in refused.reason
        assert project(_cut(), target, "aten.abs.default")  # the same cut of a dense op runs
    # the planner keeps all-Replicate only
    planned = axis_strategies([_cut()], 1, 1, DTENSOR_PLAN, "aten._to_sparse_csr.default")
    assert len(planned) == 1 and len(axis_strategies([_cut()], 1, 1, DTENSOR_PLAN, "aten.abs.default")) == 2


def _entries(x):
    return torch.tensor([[0, 1]]), x[:2]


@pytest.mark.parametrize("func,args,makes", [
    (aten.to_sparse.default, lambda x: (x,), True), (aten._to_sparse.sparse_dim, lambda x: (x, 1), True),
    (aten.to_sparse_bsr.default, lambda x: (x, [2, 2]), True), (aten._to_sparse_csc.default, lambda x: (x,), True),
    (aten.sparse_coo_tensor.indices, _entries, True),
    (aten._gather_sparse_backward.default, lambda x: (x, 0, torch.zeros(2, 4, dtype=torch.long), x[:2]), True),
    (aten._sparse_mm.default, lambda x: (x, x.T), False), (aten.to_dense.default, lambda x: (x,), False),
])
def test_makes_sparse_names_the_ops_that_do(func, args, makes):
    out = func(*args(_matrix()))
    assert (out.layout != torch.strided) == makes
    assert makes_sparse(f"aten.{func._schema.name.split('::')[1]}.{func._overloadname}") == makes


def test_dtensor_is_handed_no_sparse_strategy():
    from metaspmd.backends.torch.dtensor_rules import dtensor_placements
    from metaspmd.backends.torch.table import lookup

    x = _matrix()
    assert lookup(aten.to_sparse.default, (x,), {})  # the table has the verified cuts
    assert dtensor_placements(aten.to_sparse.default, (x,), {}) == []
    assert dtensor_placements(aten.abs.default, (x,), {})  # a dense op's cuts install


def test_dtensor_cannot_hold_sparse_shards(fake_world_of):
    """Why the targets refuse: DTensor cannot even wrap a sparse local tensor (from_local
    views it, which sparse layouts lack). Should torch learn to, the refusal can be revisited."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    fake_world_of(2)
    x = _matrix()
    sparse = (x.to_sparse(), x.to_sparse_csr())  # made outside the mode, which holds no CSR tensor either
    with LocalTensorMode(2):
        mesh = DeviceMesh("cpu", [0, 1])
        assert DTensor.from_local(x, mesh, [Shard(0)], run_check=False).shape == (12, 4)  # dense shards do
        for local in sparse:
            with pytest.raises((NotImplementedError, RuntimeError)):
                DTensor.from_local(local, mesh, [Replicate()], run_check=False)


@pytest.mark.parametrize("name", ["aten.sparse_csr_tensor.crow_col_value_size", "aten._sparse_bsc_tensor_unsafe.default",
                                  "aten.sparse_csc_tensor.ccol_row_value"])
def test_compressed_constructors_are_linear_in_their_values(name):
    from metaspmd.backends.torch import catalog, hand_samples

    func = catalog.resolve(name)
    guess = hand_samples.guess_for(func)
    args, kwargs = hand_samples.inputs(func, guess, 0)
    assert ops.opaque(func(*args, **kwargs)) == ""  # a valid tensor of its layout
    entry = explore_case(torch_case(func, args, kwargs, func, lambda seed: hand_samples.inputs(func, guess, seed)), ops)
    assert entry.status == "ok", entry.reason
    assert str(entry.partial).endswith("[S1(sum)]]") and str(entry.combine) == "{S1: reduce(sum)}"
    assert makes_sparse(name)


def test_register_says_why_a_sparse_op_is_skipped():
    from metaspmd.backends.torch.dtensor_rules import register, unregister

    report = register(["aten.to_sparse.default", "aten._to_sparse_csr.default"])
    try:
        assert not report.installed
        assert all("sparse tensor" in report.skipped[n] for n in ("aten.to_sparse.default", "aten._to_sparse_csr.default"))
    finally:
        unregister(report)
