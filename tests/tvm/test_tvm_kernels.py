"""Registering, validating, compiling and calling TE kernels."""

import re

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import te, topi  # noqa: E402

from metaspmd.backends.tvm import KernelError, KernelRegistry, TvmBackend, build_kernel, kernel  # noqa: E402
from metaspmd.backends.tvm.tensor_ops import to_tvm  # noqa: E402
from metaspmd.explorer import explore_op  # noqa: E402


def backend_of(reg: KernelRegistry) -> TvmBackend:
    return TvmBackend([__name__], reg)


def conv1d_registry(exact=()) -> KernelRegistry:
    reg = KernelRegistry()

    @kernel("conv", example={"w": 10, "k": 3}, exact=exact, registry=reg)
    def conv():
        w, k = te.var("w"), te.var("k")
        x = te.placeholder((w,), "float64", name="x")
        f = te.placeholder((k,), "float64", name="f")
        r = te.reduce_axis((0, k), name="r")
        return [x, f], te.compute((w - k + 1,), lambda i: te.sum(x[i + r] * f[r], axis=r), name="y")

    return reg


def test_compiled_once_runs_on_any_size_with_output_sized_from_inputs():
    reg = conv1d_registry()
    spec = reg.get("tvm.conv")
    k = build_kernel(spec)
    assert build_kernel(spec) is k  # compiled once per process
    for w, kw in [(10, 3), (4, 2), (7, 7)]:
        x, f = np.random.randn(w), np.random.randn(kw)
        out = k(to_tvm(x), to_tvm(f))
        assert out.shape == (w - kw + 1,)
        np.testing.assert_allclose(out.numpy(), np.correlate(x, f, mode="valid"), rtol=1e-12)


def test_exact_vars_key_the_rules_by_the_dims_they_size():
    """The halo is the filter's length k: named exact, it is written into the key and the
    halo stays; left out, the halo read off it is dropped."""
    from metaspmd.explorer import explore_case

    pinned = TvmBackend([__name__], conv1d_registry(exact=["k"]))
    [case] = pinned.cases("tvm.conv")
    assert case.exact_sizes == {"f": slice(0, 1)}
    entry = explore_case(case, pinned.tensor_ops())
    assert entry.signature == "x:f[*] f:f[3]"
    assert any(getattr(p, "halo", 0) for s in entry.strategies() for p in s.inputs)
    free = TvmBackend([__name__], conv1d_registry())
    entry = explore_case(free.cases("tvm.conv")[0], free.tensor_ops())
    assert entry.signature == "x:f[*] f:f[*]"
    assert not any(getattr(p, "halo", 0) for s in entry.strategies() for p in s.inputs)
    with pytest.raises(KernelError, match="exact names \\['m'\\]"):
        kernel(example={"n": 8}, exact=["m"], registry=KernelRegistry())(lambda: None)


def test_call_checks_shapes_dtypes_and_arity_naming_the_kernel():
    k = build_kernel(conv1d_registry().get("tvm.conv"))
    with pytest.raises(ValueError, match="tvm.conv.*negative"):
        k(to_tvm(np.zeros(1)), to_tvm(np.zeros(3)))
    with pytest.raises(TypeError, match="tvm.conv.*float64"):
        k(to_tvm(np.zeros(5, dtype=np.float32)), to_tvm(np.zeros(3)))
    with pytest.raises(TypeError, match="tvm.conv takes 2 inputs"):
        k(to_tvm(np.zeros(5)))

    reg = KernelRegistry()

    @kernel("add2", example={"n": 4}, registry=reg)
    def add2():
        n = te.var("n")
        a, b = te.placeholder((n,), "float64", name="a"), te.placeholder((n,), "float64", name="b")
        return [a, b], topi.add(a, b)

    with pytest.raises(ValueError, match="tvm.add2: input 'b' dim 0 is 3, but n is 4"):
        build_kernel(reg.get("tvm.add2"))(to_tvm(np.zeros(4)), to_tvm(np.zeros(3)))


def _bad_kernels() -> KernelRegistry:
    reg = KernelRegistry()
    f64 = "float64"

    @kernel("unused_input", example={"n": 4}, registry=reg)
    def unused_input():
        n = te.var("n")
        a, b = te.placeholder((n,), f64, name="a"), te.placeholder((n,), f64, name="b")
        return [a, b], te.compute((n,), lambda i: a[i] * 2.0, name="out")

    @kernel("missing_input", example={"n": 4}, registry=reg)
    def missing_input():
        n = te.var("n")
        a, b = te.placeholder((n,), f64, name="a"), te.placeholder((n,), f64, name="b")
        return [a], te.compute((n,), lambda i: a[i] + b[i], name="out")

    @kernel("fixed_dim", example={"n": 4}, registry=reg)
    def fixed_dim():
        n = te.var("n")
        a = te.placeholder((n, 3), f64, name="a")
        return [a], te.compute((n, 3), lambda i, j: a[i, j] + 1.0, name="out")

    @kernel("no_example_size", example={"n": 4}, registry=reg)
    def no_example_size():
        n, m = te.var("n"), te.var("m")
        a = te.placeholder((n, m), f64, name="a")
        return [a], topi.exp(a)

    @kernel("typo_in_example", example={"n": 4, "nn": 3}, registry=reg)
    def typo_in_example():
        n = te.var("n")
        a = te.placeholder((n,), f64, name="a")
        return [a], topi.exp(a)

    @kernel("build_error", example={"n": 4}, registry=reg)
    def build_error():
        n = te.var("n")
        a = te.placeholder((n,), f64, name="a")
        r = te.reduce_axis((0, n), name="r")
        return [a], te.compute((n,), lambda i: te.sum(a[r], axis=r) * 2.0, name="out")  # nested reduction

    @kernel("not_a_pair", example={"n": 4}, registry=reg)
    def not_a_pair():
        n = te.var("n")
        a = te.placeholder((n,), f64, name="a")
        return topi.exp(a)

    @kernel("bad_variant", example={"n": 4}, variants=[{"axis": 0}], registry=reg)
    def bad_variant():
        n = te.var("n")
        a = te.placeholder((n,), f64, name="a")
        return [a], topi.exp(a)

    @kernel("free_output_dim", example={"n": 4}, registry=reg)
    def free_output_dim():
        n, q = te.var("n"), te.var("q")
        a = te.placeholder((n,), f64, name="a")
        return [a], te.compute((q,), lambda i: a[0] * 2.0, name="out")

    @kernel("expression_dim", example={"n": 4}, registry=reg)
    def expression_dim():
        n = te.var("n")
        a = te.placeholder((n * 2,), f64, name="a")
        return [a], topi.exp(a)

    @kernel("scan", example={"m": 4, "n": 3}, registry=reg)
    def scan():  # a running sum over rows: the state placeholder is te.scan's own, not an input
        m, n = te.var("m"), te.var("n")
        x = te.placeholder((m, n), f64, name="x")
        state = te.placeholder((m, n), f64, name="state")
        init = te.compute((1, n), lambda _, i: x[0, i], name="init")
        update = te.compute((m, n), lambda t, i: state[t - 1, i] + x[t, i], name="update")
        return [x], te.scan(init, update, state, inputs=[x], name="running")

    @kernel("good", example={"n": 4}, registry=reg)
    def good():
        n = te.var("n")
        a = te.placeholder((n,), f64, name="a")
        return [a], topi.exp(a)

    return reg


@pytest.mark.parametrize(
    "op, message",
    [
        ("tvm.unused_input", r"wrong arity: input\(s\) \['b'\] are not read"),
        ("tvm.missing_input", r"wrong arity: the compute reads placeholder\(s\) \['b'\]"),
        ("tvm.fixed_dim", r"input 'a' dim 1 has fixed size 3.*symbolic te.var"),
        ("tvm.no_example_size", r"no size for symbolic var\(s\) \['m'\]"),
        ("tvm.typo_in_example", r"unknown symbolic var\(s\) \['nn'\]"),
        ("tvm.build_error", r"the builder raised .*Reductions are only allowed at the top level"),
        ("tvm.not_a_pair", r"must return \(inputs, output\)"),
        ("tvm.free_output_dim", r"output 'out' dim q does not follow from the input shapes"),
        ("tvm.expression_dim", r"input 'a' dim 0 is the expression n \* 2"),
        ("tvm.bad_variant", r"does not take the variant arguments \{'axis': 0\}"),
        ("tvm.scan", r"'running' is a ScanOp, which te.create_prim_func cannot lower"),
    ],
)
def test_invalid_kernels_raise_a_clear_error_naming_the_kernel(op, message):
    with pytest.raises(KernelError, match=f"^kernel {op}: .*{message}"):
        backend_of(_bad_kernels()).cases(op)


def test_a_compile_failure_is_a_kernel_error(monkeypatch):
    reg = _bad_kernels()

    def broken(*args, **kwargs):
        raise RuntimeError("codegen exploded")

    monkeypatch.setattr(tvm, "compile", broken)
    with pytest.raises(KernelError, match="^kernel tvm.good: build failed: RuntimeError: codegen exploded"):
        backend_of(reg).cases("tvm.good")


def test_sweep_records_invalid_kernels_as_failed_and_goes_on():
    be = backend_of(_bad_kernels())
    records = {op: explore_op(be, op) for op in ("tvm.fixed_dim", "tvm.unused_input", "tvm.good")}
    assert records["tvm.fixed_dim"].status == "failed"
    assert "tvm.fixed_dim" in records["tvm.fixed_dim"].reason and "fixed size 3" in records["tvm.fixed_dim"].reason
    assert records["tvm.unused_input"].status == "failed" and "wrong arity" in records["tvm.unused_input"].reason
    assert records["tvm.good"].status == "ok"


def test_registration_rejects_a_name_taken_by_another_module():
    reg = KernelRegistry()

    def builder():
        raise AssertionError("not built")

    kernel("dup", example={}, registry=reg)(builder)
    kernel("dup", example={}, registry=reg)(builder)  # same module again: a reload, replaces

    def other_builder():
        raise AssertionError("not built")

    # another builder of the same name in one module: one of them would go unswept, unsaid
    with pytest.raises(KernelError, match=r"kernel tvm.dup: registered twice in module '.*', by .*\.builder and by .*other_builder"):
        kernel("dup", example={}, registry=reg)(other_builder)
    builder.__module__ = "someone.else"
    with pytest.raises(KernelError, match="kernel tvm.dup: already registered by module"):
        kernel("dup", example={}, registry=reg)(builder)


def _doubled(v):
    return v * 2.0


def test_function_variants_are_written_by_name_and_unnamed_values_are_refused():
    """A variant picking a function is written by its module and name, the same in every
    run (its str holds an address); a lambda, a local function or a dict would make the
    rule file change from run to run or fail to key a rule, and is refused naming it."""
    from metaspmd.explorer import explore_case

    reg = KernelRegistry()

    @kernel("act", example={"n": 6}, variants=[{"f": te.exp}, {"f": _doubled}], registry=reg)
    def act(f):
        n = te.var("n")
        x = te.placeholder((n,), "float64", name="x")
        return [x], te.compute((n,), lambda i: f(x[i]), name="out")

    be = backend_of(reg)
    entries = [explore_case(c, be.tensor_ops()) for c in be.cases("tvm.act")]
    assert [e.signature for e in entries] == ["x:f[*] f=tvm.tirx.op.exp", f"x:f[*] f={__name__}._doubled"]
    assert dict(entries[1].example.args)["f"] == f"{__name__}._doubled"

    def local(v):
        return v

    for value, problem in ((lambda v: v, "lambda or local function"), (local, "lambda or local function"),
                           ({"a": 1}, "a dict is no variant value"), ([1, {2}], "a set is no variant value")):
        with pytest.raises(KernelError, match=f"^kernel tvm.bad: variant argument 'f' = .*{problem}"):
            kernel("bad", example={"n": 4}, variants=[{"f": value}], registry=KernelRegistry())(act)


def test_a_kernel_that_fails_to_allocate_is_out_of_memory_not_failed(monkeypatch):
    """TVM passes C++'s std::bad_alloc on as an InternalError, which was read as the kernel's
    own failure: the sweep replaced its rules with a failed file and exited 0. It is the
    machine's limit, so the sweep keeps the kernel's file (OutOfMemory), as for a run."""
    from metaspmd.case import OutOfMemory, out_of_memory

    assert out_of_memory(tvm.error.InternalError("Traceback...\nInternalError: std::bad_alloc"))
    reg = KernelRegistry()

    @kernel("hungry", example={"n": 4}, registry=reg)
    def hungry():
        raise MemoryError()

    with pytest.raises(OutOfMemory, match="^tvm.hungry: building the kernel failed to allocate memory: MemoryError"):
        backend_of(reg).cases("tvm.hungry")

    def no_room(*args, **kwargs):
        raise tvm.error.InternalError("std::bad_alloc")

    monkeypatch.setattr(tvm, "compile", no_room)
    with pytest.raises(OutOfMemory, match="^tvm.good: compiling the kernel failed to allocate memory"):
        backend_of(_bad_kernels()).cases("tvm.good")


def test_a_kernel_reading_past_its_input_gets_no_rule_from_what_lies_there():
    """``x[i + 1]`` up to n reads one element past x: whatever the heap held there (often
    zero) made a Partial(sum) rule pass on some sweeps and not on others. Each input is
    followed by values drawn from its own bytes, which a shard's read and the whole
    input's do not share: no rule holds, on every exploration alike."""
    reg = KernelRegistry()

    @kernel("shift_past_end", example={"n": 6}, registry=reg)
    def shift_past_end():
        n = te.var("n")
        x = te.placeholder((n,), "float64", name="x")
        return [x], te.compute((n,), lambda i: x[i + 1], name="out")

    @kernel("shift_within", example={"n": 6}, registry=reg)
    def shift_within():  # the same shift, clamped: a halo rule, as before
        n = te.var("n")
        x = te.placeholder((n,), "float64", name="x")
        return [x], te.compute((n,), lambda i: x[te.min(i + 1, n - 1)], name="out")

    be = backend_of(reg)
    records = [explore_op(be, "tvm.shift_past_end") for _ in range(3)]
    assert [r.status for r in records] == ["replicate-only"] * 3 and records[0] == records[1] == records[2]
    x = to_tvm(np.arange(4.0))
    [k] = be.kernels("tvm.shift_past_end")
    assert k(x).numpy()[:3].tolist() == [1.0, 2.0, 3.0] and k(x).numpy()[3] == k(x).numpy()[3]  # the same read again
    assert explore_op(be, "tvm.shift_within").status == "ok"


def test_a_kernel_file_registers_what_its_import_registers_wherever_the_builders_live(tmp_path, monkeypatch):
    """Kernels were the module's whose builder they are: a file registering functools.partial
    builders, or builders from a helper beside it, "defined no TVM kernel"; and the helper
    did not import (the file's folder was not on the path, as it is for a script). A
    relative import says why it cannot work in a file given by path."""
    import sys

    from metaspmd.backends.tvm import get_backend

    monkeypatch.setattr(sys, "path", list(sys.path))  # the import puts tmp_path there
    (tmp_path / "scaling_helpers.py").write_text(
        "from tvm import te\n\n"
        "def scaled(factor):\n"
        "    n = te.var('n')\n"
        "    x = te.placeholder((n,), 'float64', name='x')\n"
        "    return [x], te.compute((n,), lambda i: x[i] * factor, name='out')\n")
    (tmp_path / "scaling_kernels.py").write_text(
        "import functools\n"
        "from metaspmd.backends.tvm import kernel\n"
        "from scaling_helpers import scaled\n\n"
        "kernel('doubled_by_partial', example={'n': 6})(functools.partial(scaled, 2.0))\n"
        "kernel('tripled_by_partial', example={'n': 6})(functools.partial(scaled, 3.0))\n")
    be = get_backend(kernels=str(tmp_path / "scaling_kernels.py"), builtins=False)
    assert be.list_ops() == ["tvm.doubled_by_partial", "tvm.tripled_by_partial"]
    assert explore_op(be, "tvm.doubled_by_partial").status == "ok"
    (tmp_path / "relative_kernels.py").write_text("from .scaling_helpers import scaled\n")
    with pytest.raises(ImportError, match="has no package for its relative imports"):
        get_backend(kernels=str(tmp_path / "relative_kernels.py"), builtins=False)


def test_an_empty_or_overlong_kernel_name_is_refused_naming_it(tmp_path):
    """kernel("") fell back to the function's name, unsaid; a 300-character name reached the
    sweep's file writes as a raw "File name too long"."""
    from metaspmd.registry_io import RegistryError, record_path

    with pytest.raises(KernelError, match="^kernel tvm.act: the kernel name '' is empty"):
        kernel("", example={"n": 4}, registry=KernelRegistry())(_named("act"))
    with pytest.raises(RegistryError, match="is not usable as a file name"):
        record_path(tmp_path, "tvm", "tvm." + "k" * 300)


def _named(name):
    def builder():
        raise AssertionError("not built")
    builder.__name__ = name
    return builder


def test_variants_equal_in_value_but_not_in_type_build_kernels_of_their_own():
    """{"scale": 2} and {"scale": 2.0} are equal and hash alike: the build cache gave the
    second the first's kernel, an integer scale where the builder made a float one."""
    reg = KernelRegistry()

    @kernel("scaled", example={"n": 4}, variants=[{"scale": 3}, {"scale": 2.5}, {"scale": 3.0}], registry=reg)
    def scaled(scale):
        n = te.var("n")
        x = te.placeholder((n,), "float64", name="x")
        # an int scale truncates each value first, a float one scales it as it is
        body = (lambda i: te.floor(x[i]) * scale) if isinstance(scale, int) else (lambda i: x[i] * scale)
        return [x], te.compute((n,), body, name="out")

    spec = reg.get("tvm.scaled")
    x = np.array([1.5, -0.5, 2.25, 3.0])
    three, _, three_point_oh = (build_kernel(spec, params)(to_tvm(x)).numpy() for params in spec.variants)
    np.testing.assert_allclose(three, np.floor(x) * 3)
    np.testing.assert_allclose(three_point_oh, x * 3.0)


@pytest.mark.parametrize("size", [6.9, True, "6", 0, None])
def test_an_example_size_that_is_no_positive_int_is_refused(size):
    """int() made 6.9 a 6, True a 1 and "6" a 6 without a word."""
    with pytest.raises(KernelError, match=rf"^kernel tvm.bad: example 'n': {re.escape(repr(size))}: .*positive int"):
        kernel("bad", example={"n": size}, registry=KernelRegistry())(lambda: None)


@pytest.mark.parametrize("example, message", [
    (6, r"example must map each symbolic var to its size, got int 6"),  # was a TypeError from the exact check
    ({1: 6}, r"example key 1: each key is a symbolic var's name"),  # blamed the size
])
def test_an_example_that_is_no_mapping_of_names_is_refused_naming_what(example, message):
    with pytest.raises(KernelError, match=rf"^kernel tvm.bad: {message}"):
        kernel("bad", example=example, exact=["n"], registry=KernelRegistry())(lambda: None)
