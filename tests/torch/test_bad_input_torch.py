"""Bad input to torch's parallelize and its sample index: an error that names what is
wrong instead of one from deep inside make_fx, autograd or torch.load."""

from __future__ import annotations

import functools
import os
import re

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import samples  # noqa: E402
from metaspmd.backends.torch.capture import capture  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x), x


class NoParameters(torch.nn.Module):
    def forward(self, x):
        return x * 2


class Argmax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).argmax(-1)


class Detached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).detach() * 2


@pytest.mark.parametrize("model,inputs,kw,error,message", [
    (TwoOutputs(), "tuple", {}, TypeError, r"TwoOutputs returns a tuple, not a tensor, .* pass loss_fn="),
    (TwoOutputs(), "tuple", {"loss_fn": lambda out: 3}, TypeError, "loss_fn returned a int, not a tensor"),
    (NoParameters(), "tuple", {}, ValueError, "NoParameters has no parameters, .* pass backward=False"),
    (torch.nn.Linear(4, 4), "bare", {}, TypeError, r"example_inputs must be a tuple .* got a Tensor"),
    (Argmax(), "tuple", {}, TypeError,
     r"Argmax returns an integer tensor \(torch.int64\), which carries no gradient, .* pass backward=False"),
    (Detached(), "tuple", {}, ValueError,
     r"Detached's output does not require grad \(its forward reads none of its parameters, or computes under "
     r"torch.no_grad\(\) or from detached values\), .*"),
    (Argmax(), "tuple", {"loss_fn": lambda out: out.sum()}, TypeError,
     r"loss_fn returned an integer tensor \(torch.int64\), .* from Argmax's float outputs, or pass backward=False"),
    (TwoOutputs(), "tuple", {"loss_fn": lambda out: out[1].sum()}, TypeError,
     "loss_fn returned a tensor that does not require grad"),
    (torch.nn.Linear(4, 4), "tuple", {"loss_fn": "mse"}, TypeError,
     r"loss_fn must be callable \(a function of the model's output, returning a scalar tensor\), got 'mse'"),
    (torch.nn.Linear(4, 4).requires_grad_(False), "tuple", {}, ValueError,
     r"every parameter of Linear is frozen \(requires_grad=False\), .* pass backward=False"),
    (torch.nn.Linear(4, 4), "tuple", {"loss_fn": lambda out: out * 2}, ValueError,
     r"loss_fn returned a tensor of shape \(2, 4\), not a scalar"),
    ("model.pt", "tuple", {}, TypeError, r"parallelize takes a torch.nn.Module or a function .* got 'model.pt'"),
    (torch.nn.Linear(4, 4), "tuple", {"loss_fn": lambda out: out.sum(), "backward": False}, ValueError,
     r"loss_fn is the loss the backward differentiates, but backward=False plans the forward only"),
])
def test_capture_names_what_is_wrong(model, inputs, kw, error, message):
    x = torch.randn(2, 4)
    with pytest.raises(error, match=message):
        capture(model, (x,) if inputs == "tuple" else x, **kw)


class LogitsOnlyWhenFake(torch.nn.Module):
    """Like a Hugging Face model: returns an output object, and reads a value of its input
    unless the tensors are fake (transformers' ``is_tracing``)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        if not isinstance(x, torch._subclasses.FakeTensor) and (x[:, -1] == 0).all():
            x = x + 1
        return {"logits": self.fc(x)}


def test_a_refusal_of_our_own_on_the_fake_trace_is_not_hidden_by_the_real_trace():
    """The fake trace meets the default loss's refusal of a dict output; the real trace,
    tried after a fake one fails, would stop first at the model's value read, and the user
    was told to remove a read that the fake trace never makes."""
    with pytest.raises(TypeError, match=r"LogitsOnlyWhenFake returns a dict, not a tensor, .* pass loss_fn="):
        capture(LogitsOnlyWhenFake(), (torch.randn(2, 4),))
    captured = capture(LogitsOnlyWhenFake(), (torch.randn(2, 4),), loss_fn=lambda out: out["logits"].sum())
    assert captured.trainable


class ReadsItem(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y * y.sum().item()


class MasksByIndexing(ReadsItem):
    def forward(self, x):
        y = self.fc(x)
        return y[y > 0].sum() + y.sum()


class SelectsWhere(ReadsItem):
    def forward(self, x):
        y = self.fc(x)
        rows, _ = torch.where(y > 0)  # one argument: nonzero, of as many rows as values pass
        return y[rows].sum() + y.sum()


@pytest.mark.parametrize("model,op", [(ReadsItem(), r"_local_scalar_dense \(aten._local_scalar_dense.default\), "
                                                    r"and aten.mul.Tensor use it"),
                                      (MasksByIndexing(), r"\(aten.sym_size.int\), a size made by aten.index.Tensor at "
                                                          r"index "),
                                      (SelectsWhere(), r"\(aten.sym_size.int\), a size made by aten.nonzero.default at "
                                                       r"nonzero ")])
def test_a_value_read_out_of_tensor_data_is_named(model, op):
    with pytest.raises(ValueError, match=r"the traced graph reads a Python value out of tensor data at .*" + op):
        capture(model, (torch.randn(2, 4),))


class SizedByValues(ReadsItem):
    """An op whose output's length its input's values decide, that nothing reads the length
    of: the size check above never fires, and the signature of the op's node failed deep in
    torch (``GuardOnDataDependentSymNode``)."""

    def __init__(self, made):
        super().__init__()
        self.made = made

    def forward(self, x):
        y = self.fc(x)
        return y.sum() + self.made(y.detach())  # unique has no derivative


@pytest.mark.parametrize("made,op", [
    (lambda y: torch.unique(y).sum(), "aten._unique2.default at _unique2"),
    (lambda y: torch.bincount((y.abs() * 3).long().flatten()).sum(), "aten.bincount.default at bincount"),
    (lambda y: torch.argwhere(y > 0).float().sum(), "aten.nonzero.default at nonzero"),
    (lambda y: torch.unique_consecutive(y).sum(), "aten.unique_consecutive.default at unique_consecutive"),
], ids=["unique", "bincount", "argwhere", "unique_consecutive"])
def test_an_output_sized_by_values_is_named_at_capture(made, op):
    with pytest.raises(ValueError, match=re.escape(op) + " makes a tensor whose length depends on the values"):
        capture(SizedByValues(made), (torch.randn(2, 4),))


class BranchesOnAValue(ReadsItem):
    def forward(self, x):
        y = self.fc(x)
        return y * 2 if y.sum() > 0 else y


class SlicesByATensor(ReadsItem):
    def forward(self, x, pos):
        return self.fc(x)[: pos[0]].sum(0)


@pytest.mark.parametrize("model,inputs,where", [
    (BranchesOnAValue(), (torch.randn(2, 4),),
     r"test_bad_input_torch.py:\d+ in forward: return y \* 2 if y.sum\(\) > 0"),
    (SlicesByATensor(), (torch.randn(2, 4), torch.tensor([1])), r"in forward: return self.fc\(x\)\[: pos\[0\]\]"),
    # a torch layer's own read, not the model's: a cumulative average of the batch statistics
    (torch.nn.BatchNorm1d(4, momentum=None), (torch.randn(2, 4),),
     r"at torch/nn/modules/batchnorm.py:\d+ in forward: .*float\(self.num_batches_tracked\)")])
def test_python_that_reads_a_value_while_tracing_is_named_not_make_fx_advice(model, inputs, where):
    """make_fx's error suggests its own tracing_mode='symbolic', which the user never passes;
    the line that reads the value is named."""
    with pytest.raises(ValueError, match=r"reads a tensor's value into Python while it is traced") as info:
        capture(model, inputs)
    assert "tracing_mode" not in str(info.value)
    assert re.search(where, str(info.value)), str(info.value)


def test_capture_works_where_the_checks_allow():
    x = torch.randn(2, 4)
    assert capture(TwoOutputs(), (x,), loss_fn=lambda out: out[0].sum()).n_outputs == 1
    assert capture(NoParameters(), (x,), backward=False).n_user_inputs == 1
    assert capture(Argmax(), (x,), backward=False).n_outputs == 1
    assert capture(Detached(), (x,), backward=False).n_outputs == 1


def test_capture_under_no_grad_says_gradients_are_off():
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"gradients are off where Linear was captured "
                                                            r"\(torch.no_grad\(\) or torch.inference_mode\(\)\)"):
        capture(torch.nn.Linear(4, 4), (torch.randn(2, 4),))


def test_local_tensors_are_named_not_recursed_into(fake_world_of):
    from torch.distributed._local_tensor import LocalTensorMode

    fake_world_of(4)
    with LocalTensorMode(frozenset(range(4))):
        x = torch.randn(2, 4)
    with pytest.raises(TypeError, match=r"example input 0 is a LocalTensor \(made inside LocalTensorMode\)"):
        capture(torch.nn.Linear(4, 4), (x,))


class ScalesByAnAttribute(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.fc, self.scale = torch.nn.Linear(4, 4), scale

    def forward(self, x):
        return self.fc(x) * self.scale


def test_a_local_tensor_the_model_reads_as_a_constant_is_named(fake_world_of):
    """Not a parameter, buffer or input: traced as a constant, the graph's output was the
    example's whatever the input (a wrong answer at every later call)."""
    from torch.distributed._local_tensor import LocalTensorMode

    fake_world_of(4)
    with LocalTensorMode(frozenset(range(4))):
        scale = torch.ones(4) * 2
    with pytest.raises(TypeError, match=r"attribute 'scale' is a LocalTensor \(made inside LocalTensorMode\)"):
        capture(ScalesByAnAttribute(scale), (torch.randn(2, 4),))

    def closes_over(x):
        return (x * scale).relu()

    with pytest.raises(TypeError, match=r"the variable 'scale' the function reads is a LocalTensor"):
        capture(closes_over, (torch.randn(2, 4),), backward=False)
    # a callable object hides its variables from inspect: the traced graph's constant is named
    with pytest.raises(TypeError, match=r"the model reads a LocalTensor .* neither a parameter, a buffer nor an "
                                        r"example input"):
        capture(functools.partial(lambda s, x: (x * s).relu(), scale), (torch.randn(2, 4),), backward=False)
    assert capture(ScalesByAnAttribute(torch.ones(4)), (torch.randn(2, 4),)).n_outputs == 1  # a plain one is fine


@pytest.mark.parametrize("make,message", [
    (lambda: torch.randn(2, 4).to_sparse(), r"example input 0 is a sparse_coo tensor: parallelize plans dense"),
    (lambda: torch.empty(2, 4, device="meta"), r"example input 0 is on the meta device"),
], ids=["sparse", "meta"])
def test_inputs_without_dense_values_are_named(make, message):
    with pytest.raises(TypeError, match=message):
        capture(torch.nn.Linear(4, 4), (make(),))


@pytest.mark.parametrize("x,message", [
    (torch.randn(2, 4).double(), r"Linear fails on its inputs \(float64\[2, 4\]\) and float32 parameters at "
                                 r"aten\.addmm\.default: mat1 and mat2 must have the same dtype"),
    (torch.randn(2, 5), r"Linear fails on its inputs \(float32\[2, 5\]\) and float32 parameters: mat1 and mat2 "
                        r"shapes cannot be multiplied"),
], ids=["dtype (recording)", "shape (tracing)"])
def test_an_op_that_fails_on_the_example_names_the_model_its_inputs_and_the_op(x, message):
    """Not the trace's FX page (the node, 'Use tlparse'), which names no input."""
    with pytest.raises(RuntimeError, match=message):
        captured = capture(torch.nn.Linear(4, 4), (x,))
        captured.values.record()  # recorded on first use: a dtype mismatch fake tensors let through


class RaisesItsOwn(torch.nn.Module):
    def __init__(self, error: Exception):
        super().__init__()
        self.fc, self.error = torch.nn.Linear(4, 4), error

    def forward(self, x):
        self.fc(x)
        raise self.error


class ModelsOwnError(RuntimeError):
    pass


@pytest.mark.parametrize("error", [NotImplementedError("todo"), ModelsOwnError("mine"), KeyError("k")])
def test_the_models_own_error_comes_through_as_it_is(error):
    """Only torch's plain RuntimeError (an op failing on the example) is reworded to name the
    model and its inputs: a class of the model's own is the caller's to catch."""
    with pytest.raises(type(error)) as raised:
        capture(RaisesItsOwn(error), (torch.randn(2, 4),))
    assert raised.value is error


def test_a_custom_op_that_writes_its_input_in_place_is_named():
    @torch.library.custom_op("metaspmd_test::scale_in_place", mutates_args=("a",))
    def scale_in_place(a: torch.Tensor) -> None:
        a.mul_(2)

    scale_in_place.register_fake(lambda a: None)

    def fn(x):
        y = x.clone()
        scale_in_place(y)
        return y.relu()

    with pytest.raises(ValueError, match=r"the custom op metaspmd_test::scale_in_place writes its input in place"):
        capture(fn, (torch.randn(2, 4),), backward=False)


def test_parallelize_reports_a_tuple_output_before_planning(fake_world_of):
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.parallelize import parallelize

    fake_world_of(4)
    mesh = DeviceMesh("cpu", list(range(4)), _init_backend=False, _rank=0)
    with pytest.raises(TypeError, match="TwoOutputs returns a tuple"):
        parallelize(TwoOutputs(), mesh, (torch.randn(2, 4),))
    with pytest.raises(ValueError, match="memory_budget must be a finite number > 0, got nan"):
        parallelize(torch.nn.Linear(4, 4), mesh, (torch.randn(2, 4),), memory_budget=float("nan"))


def test_a_call_under_a_local_tensor_mode_missing_mesh_ranks_is_refused(fake_world_of, tmp_path):
    """A shard on a rank the mode does not simulate has no local tensor: the call failed
    24 frames into DTensor ("LocalTensor cannot be empty")."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.parallelize import parallelize
    from metaspmd.cache import RuleCache

    fake_world_of(4)
    model, x = torch.nn.Linear(4, 4), torch.randn(4, 4)
    message = (r"the mesh has ranks \[2, 3\] that the LocalTensorMode around the call does not simulate \(the "
               r"mode simulates \[0, 1\], the mesh has \[0, 1, 2, 3\]\)")
    with LocalTensorMode(frozenset(range(4))):
        mesh = DeviceMesh("cpu", list(range(4)), _init_backend=False, _rank=0)
        p = parallelize(model, mesh, (x,), cache=RuleCache(tmp_path))
    with LocalTensorMode(frozenset(range(2))):
        with pytest.raises(ValueError, match=message):
            p(x)
        with pytest.raises(ValueError, match=message):  # planned under it: refused before the capture
            parallelize(model, mesh, (x,), cache=RuleCache(tmp_path))


def test_a_call_under_a_local_tensor_mode_of_more_ranks_than_the_mesh_is_refused(fake_world_of, tmp_path):
    """A simulated rank outside the mesh has no coordinate on it: DTensor asserted deep inside."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.parallelize import parallelize
    from metaspmd.cache import RuleCache

    fake_world_of(4)
    model, x = torch.nn.Linear(4, 4), torch.randn(4, 4)
    message = r"the mesh lacks ranks \[3\] that the LocalTensorMode around the call simulates .* LocalTensorMode\(" \
              r"frozenset\(\[0, 1, 2\]\)\)"
    with LocalTensorMode(frozenset(range(3))):
        mesh = DeviceMesh("cpu", [0, 1, 2], _init_backend=False, _rank=0)
        p = parallelize(model, mesh, (x,), cache=RuleCache(tmp_path))
    with LocalTensorMode(frozenset(range(4))):
        with pytest.raises(ValueError, match=message):
            p(x)
        with pytest.raises(ValueError, match=message):
            parallelize(model, mesh, (x,), cache=RuleCache(tmp_path))


def test_a_planned_call_the_model_itself_fails_names_the_model_and_the_op(fake_world_of, tmp_path):
    """float16 inputs to float32 weights, planned from cached rules without running the
    model: the error came at the call, as an FX page."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.parallelize import parallelize
    from metaspmd.cache import RuleCache

    fake_world_of(4)
    model, x = torch.nn.Linear(4, 4), torch.randn(4, 4)
    with LocalTensorMode(frozenset(range(4))):
        mesh = DeviceMesh("cpu", list(range(4)))
        parallelize(model, mesh, (x,), cache=RuleCache(tmp_path))  # float tensors' rules, cached
        p = parallelize(model, mesh, (x.half(),), cache=RuleCache(tmp_path))
        with pytest.raises(RuntimeError, match=r"Linear fails on its inputs \(float16\[4, 4\]\) and float32 "
                                               r"parameters at aten\.addmm\.default: mat1 and mat2 must have the "
                                               r"same dtype"):
            p(x.half())


def test_parallelize_reports_an_output_without_gradient_before_planning(fake_world_of, monkeypatch):
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd import runtime
    from metaspmd.backends.torch.parallelize import parallelize

    fake_world_of(4)
    monkeypatch.setattr(runtime, "resolve", lambda *a, **k: pytest.fail("rules were looked up"))
    mesh = DeviceMesh("cpu", list(range(4)), _init_backend=False, _rank=0)
    with pytest.raises(TypeError, match=r"Argmax returns an integer tensor \(torch.int64\)"):
        parallelize(Argmax(), mesh, (torch.randn(2, 4),))
    with pytest.raises(TypeError, match="loss_fn must be callable .* got 'mse'"):
        parallelize(torch.nn.Linear(4, 4), mesh, (torch.randn(2, 4),), loss_fn="mse")


def _small_index():
    """One call, the least a built index holds: read_index refuses an overload without calls."""
    ref = samples.SampleRef("mm", "", "float32", "forward", 0, 0)
    return {"aten.mm.default": (samples.SampleCall("aten.mm.default", "self:f[*,*] mat2:f[*,*]", (), {}, ref),)}


def _refs(index):  # SampleCall compares by identity
    return {op: [c.ref for c in calls] for op, calls in index.items()}


@pytest.fixture
def fake_build(monkeypatch):
    """Stands in for the minute-long build in a child process; lists the paths it wrote."""
    built = []

    def build(path, max_signatures, log):
        built.append(path)
        samples.write_index(path, _small_index())

    monkeypatch.setattr(samples, "_build_in_child", build)
    monkeypatch.setattr(samples.reproducible, "in_effect", lambda: False)
    return built


def test_a_corrupt_index_is_rebuilt_and_named(tmp_path, fake_build, capsys):
    small = _refs(_small_index())
    path = samples.cache_path(tmp_path)
    path.write_bytes(b"PK\x03\x04 not a torch file")
    assert _refs(samples.load_index(tmp_path)) == small
    err = capsys.readouterr().err
    assert f"the sample index {path} is unreadable" in err and "rebuilding it" in err
    assert err.count("building the OpInfo sample index") == 1 and fake_build == [path]
    assert _refs(samples.load_index(tmp_path)) == small  # read from the rebuilt file: no second build, no message
    assert fake_build == [path] and capsys.readouterr().err == ""


@pytest.mark.parametrize("raw,reason", [
    ({}, "holds an empty dict"),  # loaded fine and gave a sweep no samples
    ([], "holds a list"),
    ({"aten.mm.default": []}, "entry 'aten.mm.default' is not a non-empty list of calls"),
    ({"aten.mm.default": [{"signature": "s"}]}, "entry 'aten.mm.default' is not a non-empty list of calls"),
])
def test_a_well_formed_index_of_the_wrong_structure_is_rebuilt(tmp_path, fake_build, capsys, raw, reason):
    path = samples.cache_path(tmp_path)
    torch.save(raw, path)
    assert _refs(samples.load_index(tmp_path)) == _refs(_small_index())
    err = capsys.readouterr().err
    assert f"the sample index {path} is unreadable (ValueError: " in err and reason in err and "rebuilding it" in err
    assert fake_build == [path]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_an_index_path_that_is_a_fifo_is_rebuilt_not_read(tmp_path, fake_build, capsys):
    """torch.load on a FIFO waited for a writer: a sweep hung at start-up for 10 minutes."""
    path = samples.cache_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    assert _refs(samples.load_index(tmp_path)) == _refs(_small_index())
    assert f"the sample index {path} is unreadable (OSError: not a regular file); rebuilding it" in capsys.readouterr().err
    assert fake_build == [path] and path.is_file()


def test_an_index_path_that_is_a_directory_is_named_before_the_build(tmp_path, fake_build):
    path = samples.cache_path(tmp_path)
    path.mkdir()
    with pytest.raises(IsADirectoryError, match=re.escape(f"cannot write the sample index {path} (") + ".*remove that path"):
        samples.load_index(tmp_path)
    assert fake_build == []


def test_a_failed_write_names_the_index_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "index.pt"
    path.mkdir()  # the rename fails after the file is saved
    with pytest.raises(OSError, match=re.escape(f"cannot write the sample index {path} (") + ".*remove that path"):
        samples.write_index(path, _small_index())
    assert list(tmp_path.iterdir()) == [path] and not any(path.iterdir())


def test_runtime_bench_refuses_zero_repeats(capsys):
    import sys
    from pathlib import Path

    benchmarks = str(Path(__file__).resolve().parents[2] / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        import runtime_bench
    finally:
        sys.path.remove(benchmarks)
    with pytest.raises(SystemExit) as e:
        runtime_bench.main(["--repeat", "0"])
    assert e.value.code == 2 and "--repeat: expected an integer >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("fn,inputs,kw,error,message", [
    (torch.nn.Linear, (torch.randn(2, 4),), {}, TypeError, r"takes a module, got the class Linear: pass an instance"),
    (lambda x, m: m(x), (torch.randn(2, 4), torch.nn.Linear(4, 4)), {"backward": False}, TypeError,
     r"example input 1 is a module \(Linear\): its tensors would be baked into the plan as constants"),
    (torch.nn.Linear(4, 4), (torch.randn(2, 4),), {"loss_fn": lambda out: (out * 1j).sum()}, TypeError,
     r"loss_fn is complex \(complex64\): return a real loss"),
], ids=["module class", "module among the inputs", "complex loss"])
def test_what_a_plan_cannot_hold_is_named_at_capture(fn, inputs, kw, error, message):
    with pytest.raises(error, match=message):
        capture(fn, inputs, **kw)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")  # dynamo's import
def test_a_compiled_module_is_named_with_the_module_inside():
    """FX's own refusal spoke of "a dynamo-optimized function", not of what to pass."""
    compiled = torch.compile(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match=r"takes the module itself, got torch.compile's wrapper of a Linear: pass "
                                        r"model._orig_mod"):
        capture(compiled, (torch.randn(2, 4),))
    assert capture(compiled._orig_mod, (torch.randn(2, 4),)).trainable


def _scale_first(a, b):
    a.mul_(2)
    return a + b


def test_inputs_that_share_memory_with_one_the_model_writes_are_refused(fake_world_of, tmp_path):
    """Eager reads the write through the other input; a plan places the two apart, and
    gave 3.0 where eager gives 4.0."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.parallelize import parallelize
    from metaspmd.cache import RuleCache

    fake_world_of(4)
    x = torch.ones(4, 8)
    message = r"input 0 and input 1 share memory .* the model writes input 0 in place"
    for aliased in ((x, x), (x, x[:])):
        with pytest.raises(ValueError, match=message):
            capture(_scale_first, aliased, backward=False)
    with LocalTensorMode(frozenset(range(4))):
        p = parallelize(_scale_first, DeviceMesh("cpu", list(range(4))), (x.clone(), x.clone()),
                        cache=RuleCache(tmp_path))
        y = x.clone()
        with pytest.raises(ValueError, match=message):
            p(y, y)
        assert torch.equal(y, x)  # refused before anything ran
        out = p(y, x.clone())  # apart, as planned: eager's answer, and y written
    assert torch.equal(out, torch.full((4, 8), 3.0)) and torch.equal(y, torch.full((4, 8), 2.0))


def test_a_call_with_values_the_plan_cannot_take_names_the_input(fake_world_of, tmp_path):
    """A DTensor, sparse or meta tensor at call time: before, DTensor's own error with FX's
    node page, or the model blamed for the meta device."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from metaspmd.backends.torch.parallelize import parallelize
    from metaspmd.cache import RuleCache

    fake_world_of(4)
    x = torch.randn(4, 8)
    with LocalTensorMode(frozenset(range(4))):
        mesh = DeviceMesh("cpu", list(range(4)))
        p = parallelize(lambda a: a * 2, mesh, (x,), cache=RuleCache(tmp_path))
        for bad, message in ((distribute_tensor(x, mesh, [Shard(0)]), "input 0 is a DTensor"),
                             (x.to_sparse(), "input 0 is a sparse_coo tensor"),
                             (torch.empty(4, 8, device="meta"), "input 0 is on the meta device")):
            with pytest.raises(TypeError, match=message):
                p(bad)


def test_a_module_the_function_calls_is_watched_as_its_constants_are(fake_world_of, tmp_path):
    """Its weights are constants of the graph: changed in place they are read, replaced
    they were silently stale."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.parallelize import parallelize
    from metaspmd.cache import RuleCache

    fake_world_of(4)
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    with LocalTensorMode(frozenset(range(4))):
        p = parallelize(lambda a: lin(a), DeviceMesh("cpu", list(range(4))), (x,), cache=RuleCache(tmp_path))
        with torch.no_grad():
            lin.weight.mul_(2)
        torch.testing.assert_close(p(x), lin(x))
        lin.weight = torch.nn.Parameter(torch.zeros(8, 8))
        with pytest.raises(ValueError, match=r"parameter 'weight' of the module 'lin' the function reads was replaced"):
            p(x)


def test_a_position_holding_several_tensors_is_refused_and_its_leaves_are_keys(fake_world_of, tmp_path):
    """Key 1 placed the second tensor of input 1's pair, not input 2; input 2 had no key."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard

    from metaspmd.backends.torch.parallelize import parallelize
    from metaspmd.cache import RuleCache

    fake_world_of(4)
    a, b, z = torch.randn(4, 8), torch.randn(8, 4), torch.randn(8, 8)

    def f(s, pair, c):
        return (pair[0] @ pair[1]).sum() * s + c * 2

    def placed(constraints):
        p = parallelize(f, mesh, (2.0, (a, b), z), cache=RuleCache(tmp_path), constraints=constraints)
        return {v.name: p.plan.placement(v.name)[0] for v in p.captured.ir.input_list if v.is_tensor}

    with LocalTensorMode(frozenset(range(4))):
        mesh = DeviceMesh("cpu", list(range(4)))
        with pytest.raises(KeyError, match=r"input 1 is no single value, .* name its values instead: 'input 1\[0\]', "
                                           r"'input 1\[1\]'"):
            placed({1: (Shard(1),)})
        with pytest.raises(TypeError, match="constraint on 0: the value is no tensor"):
            placed({0: (Shard(0),)})
        by_leaf, by_position = placed({"input 1[1]": (Shard(1),)}), placed({2: (Shard(1),)})
    assert by_leaf["pair_2"].dim == 1 and by_position["c_1"].dim == 1


def test_an_op_that_changes_torchs_global_settings_leaves_the_next_op_as_it_was():
    """A custom op that called torch.set_default_dtype(torch.float64) turned the next op's
    results float64 in the same sweep worker: a file depended on the ops run before it."""
    from metaspmd.backends.torch.backend import _GLOBAL_SETTINGS, TorchBackend

    before = [get() for get, _ in _GLOBAL_SETTINGS]
    draw = torch.rand(3, generator=torch.Generator().manual_seed(0))
    rng = torch.get_rng_state()
    with TorchBackend.op_state(None):
        torch.set_default_dtype(torch.float64)
        torch.set_default_device("meta")
        torch.set_grad_enabled(False)
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_float32_matmul_precision("medium")
        torch.manual_seed(123)
        torch.rand(5)
    assert [get() for get, _ in _GLOBAL_SETTINGS] == before
    # the default device unset again, not set to cpu: that installs a mode over every later call
    from torch.overrides import _get_current_function_mode_stack
    assert not _get_current_function_mode_stack()
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.rand(3).dtype == torch.float32 and torch.equal(
        torch.rand(3, generator=torch.Generator().manual_seed(0)), draw)


def test_a_no_sample_reason_holds_no_memory_address_or_machine_path():
    """Schema-built inputs that failed with an object's repr wrote its address into the
    file: two sweeps of the same op gave other bytes."""
    from metaspmd.backends.torch.backend import _short_error

    assert _short_error("cannot handle <object object at 0x7f0b72776300>\nmore") == "cannot handle <object object at 0x…>"
    assert _short_error("no file /home/someone/work/x.py") == "no file x.py"


def test_the_index_child_runs_the_code_of_its_parents_checkout(tmp_path):
    """A clone's tools beside another checkout installed editable: the child that builds
    the index imports the clone's backends (``_BUILD`` is given the parent's root), not the
    installed checkout's."""
    import shutil
    import subprocess
    import sys

    from pathlib import Path

    import metaspmd

    clone = tmp_path / "clone"
    shutil.copytree(Path(metaspmd.__file__).parent, clone / "metaspmd", ignore=shutil.ignore_patterns("__pycache__"))
    for package in ("codegen", "generated", "backends", "backends/torch"):
        (clone / package).mkdir(parents=True, exist_ok=True)
        (clone / package / "__init__.py").write_text("")
    (clone / "backends/torch/samples.py").write_text(
        "from pathlib import Path\n"
        "def build_index(max_signatures, log):\n    return {}\n"
        "def write_index(path, index):\n    Path(path).write_text(__file__)\n")
    out = tmp_path / "index"
    done = subprocess.run([sys.executable, "-c", samples._BUILD, str(out), "1", str(clone)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == str(clone / "backends/torch/samples.py")
