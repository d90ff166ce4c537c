"""Bad input to torch's parallelize and its sample index: an error that names what is
wrong instead of one from deep inside make_fx, autograd or torch.load."""

from __future__ import annotations

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


@pytest.mark.parametrize("model,inputs,kw,error,message", [
    (TwoOutputs(), "tuple", {}, TypeError, r"TwoOutputs returns a tuple, not a tensor, .* pass loss_fn="),
    (TwoOutputs(), "tuple", {"loss_fn": lambda out: 3}, TypeError, "loss_fn returned a int, not a tensor"),
    (NoParameters(), "tuple", {}, ValueError, "NoParameters has no parameters, .* pass backward=False"),
    (torch.nn.Linear(4, 4), "bare", {}, TypeError, r"example_inputs must be a tuple .* got a Tensor"),
])
def test_capture_names_what_is_wrong(model, inputs, kw, error, message):
    x = torch.randn(2, 4)
    with pytest.raises(error, match=message):
        capture(model, (x,) if inputs == "tuple" else x, **kw)


def test_capture_works_where_the_checks_allow():
    x = torch.randn(2, 4)
    assert capture(TwoOutputs(), (x,), loss_fn=lambda out: out[0].sum()).n_outputs == 1
    assert capture(NoParameters(), (x,), backward=False).n_user_inputs == 1


def test_local_tensors_are_named_not_recursed_into(fake_world_of):
    from torch.distributed._local_tensor import LocalTensorMode

    fake_world_of(4)
    with LocalTensorMode(frozenset(range(4))):
        x = torch.randn(2, 4)
    with pytest.raises(TypeError, match=r"example input 0 is a LocalTensor \(made inside LocalTensorMode\)"):
        capture(torch.nn.Linear(4, 4), (x,))


def test_parallelize_reports_a_tuple_output_before_planning(fake_world_of):
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.parallelize import parallelize

    fake_world_of(4)
    mesh = DeviceMesh("cpu", list(range(4)), _init_backend=False, _rank=0)
    with pytest.raises(TypeError, match="TwoOutputs returns a tuple"):
        parallelize(TwoOutputs(), mesh, (torch.randn(2, 4),))
    with pytest.raises(ValueError, match="memory_budget must be a finite number > 0, got nan"):
        parallelize(torch.nn.Linear(4, 4), mesh, (torch.randn(2, 4),), memory_budget=float("nan"))


def test_a_corrupt_index_is_rebuilt_and_named(tmp_path, monkeypatch, capsys):
    small = {"aten.mm.default": ()}
    built = []

    def build(path, max_signatures, log):  # stands in for the minute-long build in a child process
        built.append(path)
        samples.write_index(path, small)

    monkeypatch.setattr(samples, "_build_in_child", build)
    monkeypatch.setattr(samples.reproducible, "in_effect", lambda: False)
    path = samples.cache_path(tmp_path)
    path.write_bytes(b"PK\x03\x04 not a torch file")
    assert samples.load_index(tmp_path) == small
    err = capsys.readouterr().err
    assert f"the sample index {path} is unreadable" in err and "rebuilding it" in err
    assert err.count("building the OpInfo sample index") == 1 and built == [path]
    assert samples.load_index(tmp_path) == small  # read from the rebuilt file: no second build, no message
    assert built == [path] and capsys.readouterr().err == ""


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
