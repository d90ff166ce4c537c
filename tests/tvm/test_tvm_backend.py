"""The built-in catalog, the rules the explorer finds on it, and user kernel modules."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from metaspmd.backends.tvm import get_backend  # noqa: E402
from metaspmd.explorer import explore_case, explore_op  # noqa: E402
from metaspmd.registry_io import load_record  # noqa: E402
from metaspmd.spec import CombineSpec, PartialInput, PartialSpec, ShardSpec, strategies  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
USER_KERNELS = ROOT / "examples" / "tvm_user_kernels.py"


@pytest.fixture(scope="module")
def backend():
    return get_backend()


def sharded_strategies(entry):
    """Strategies without Partial inputs, label-free: (input placements, combines)."""
    return {(s.inputs, s.outputs) for s in entry.strategies()
            if not any(isinstance(p, PartialInput) for p in s.inputs)}


def paper(shard: str, combine: str):
    n = len(ShardSpec.parse(shard).inputs)
    return {(s.inputs, s.outputs) for s in strategies(ShardSpec.parse(shard), PartialSpec(((),) * n), CombineSpec.parse(combine))}


def only_entry(backend, op, **params):
    [case] = [c for c in backend.cases(op) if dict(c.kwargs) == params]
    return explore_case(case, backend.tensor_ops())


def test_catalog_has_the_required_kernels(backend):
    ops = backend.list_ops()
    assert ops == sorted(ops) and len(ops) >= 30 and all(op.startswith("tvm.") for op in ops)
    required = """matmul dense batch_matmul conv1d conv2d max_pool1d avg_pool1d max_pool2d avg_pool2d softmax
        layer_norm exp tanh add multiply sum max mean concat transpose pad cumsum take""".split()
    assert not {f"tvm.{name}" for name in required} - set(ops)
    paddings = sorted(c.kwargs["padding"] for c in backend.cases("tvm.conv1d"))
    assert paddings == [0, 1]


def test_every_catalog_kernel_builds_and_matches_numpy_where_obvious(backend):
    for op in backend.list_ops():
        for case in backend.cases(op):
            out = case.call(case.args, case.kwargs)
            assert isinstance(out, tvm.runtime.Tensor), op
    [case] = backend.cases("tvm.matmul")
    a, b = (x.numpy() for x in case.args)
    np.testing.assert_allclose(case.call(case.args, {}).numpy(), a @ b, rtol=1e-12)
    [case] = backend.cases("tvm.softmax")
    x = case.args[0].numpy()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(case.call(case.args, {}).numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-12)


def test_fresh_inputs_keep_shapes_and_index_ranges(backend):
    [case] = backend.cases("tvm.take")
    args, kwargs = case.fresh(5)
    assert [x.shape for x in args] == [x.shape for x in case.args]
    idx = args[1].numpy()
    assert idx.dtype == np.int64 and idx.min() >= 0 and idx.max() < args[0].shape[0]
    assert not np.array_equal(args[0].numpy(), case.args[0].numpy())


def test_vector_add_appendix_a1(backend):
    entry = only_entry(backend, "tvm.vector_add")
    assert entry.status == "ok"
    assert sharded_strategies(entry) == paper("[[S1], [S1]]", "{S1: gather(dim=0)}")
    assert str(entry.shard) == "[[S1], [S1]]" and str(entry.combine).startswith("{S1: gather(dim=0)")


def test_conv1d_without_padding_shards_the_width_with_a_halo(backend):
    entry = only_entry(backend, "tvm.conv1d", padding=0)
    assert entry.signature == "data:f[*,*,*] weight:f[*,*,3] padding=0"  # exact=["kw"]: the halo's kernel
    width = [s for s in entry.strategies() if "halo" in str(s.inputs[0])]
    assert [(str(s.inputs[0]), str(s.inputs[1]), str(s.outputs[0])) for s in width] == [
        ("S(2, halo=1)", "R", "gather(dim=2)")
    ]


def test_matmul_gives_the_rule_of_aten_mm(backend):
    entry = only_entry(backend, "tvm.matmul")
    expected = paper("[[S1, S2], [S2, S3]]", "{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}")
    assert sharded_strategies(entry) == expected
    torch = pytest.importorskip("torch")
    from metaspmd.backends.torch.tensor_ops import TorchOps
    from metaspmd.case import OpCase

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in [(8, 6), (6, 4)])
    aten = explore_case(OpCase("aten.mm.default", torch.ops.aten.mm.default, (a, b), arg_names=("self", "mat2")), TorchOps())
    assert [str(entry.shard), str(entry.partial), str(entry.combine)] == [str(aten.shard), str(aten.partial), str(aten.combine)]


def test_user_module_kernels_are_listed_next_to_the_catalog(backend):
    user = get_backend(kernels=str(USER_KERNELS))
    assert set(user.list_ops()) == set(backend.list_ops()) | {"tvm.scale_rows"}
    assert get_backend(kernels=str(USER_KERNELS), builtins=False).list_ops() == ["tvm.scale_rows"]
    assert "tvm.scale_rows" not in backend.list_ops()
    record = explore_op(user, "tvm.scale_rows")
    assert record.status == "ok"
    assert sharded_strategies(record.entries[0]) == paper("[[S1, S2], [S1]]", "{S1: gather(dim=0), S2: gather(dim=1)}")


def test_a_kernels_module_without_kernels_is_named(tmp_path):
    empty = tmp_path / "no_kernels.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ValueError, match=r"no_kernels.py: defines no TVM kernel"):
        get_backend(kernels=str(empty))


@pytest.mark.slow  # the sweep command in a subprocess that builds TVM kernels: 7 s
def test_sweep_with_kernels_writes_the_user_kernel_to_its_own_file(tmp_path):
    cmd = [sys.executable, str(ROOT / "tools" / "sweep.py"), "--backend", "tvm", "--kernels", str(USER_KERNELS),
           "--ops", "tvm.scale_rows", "--out", str(tmp_path), "--jobs", "1", "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in (tmp_path / "tvm").iterdir())
    assert files == ["tvm.scale_rows.yaml"]
    record = load_record(tmp_path / "tvm" / "tvm.scale_rows.yaml")
    assert (record.op, record.backend, record.status) == ("tvm.scale_rows", "tvm", "ok")
