"""Bad options to the benchmarks (benchmarks/*.py) and to the jax cross-check: an argparse
error (exit 2) naming the option and value, before any framework starts or any work runs,
Ctrl-C ending a sweep benchmark quietly with 130, and a closed pipe with 141. explore_bench's
are in torch/test_explore_bench.py, the torch cross-check's in torch/test_crosscheck.py."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

pytestmark = pytest.mark.timeout(60)


def _module(name: str):
    """A benchmark by file name (benchmarks/ is no package), or a module by dotted name.
    expert_plans_bench asks XLA for 8 CPU devices on import: the environment is restored."""
    if "." in name:
        return importlib.import_module(name)
    flags = os.environ.get("XLA_FLAGS")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
        if flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = flags


@pytest.mark.parametrize("module,args,message", [
    # the jax cross-check: 0 or 2..8 devices (the jit runs use 8, 4 or 2; XLA aborts on 100000)
    ("metaspmd.backends.jax.crosscheck", ["--devices", "-3"],
     "--devices: expected 0 (no jit runs) or an integer from 2 to 8, got '-3'"),
    ("metaspmd.backends.jax.crosscheck", ["--devices", "1"], "got '1'"),
    ("metaspmd.backends.jax.crosscheck", ["--devices", "100000"], "got '100000'"),
    # the DTensor OpInfo test
    ("dtensor_opinfo_bench", ["--ops", "cummax", "--timeout", "nan"],
     "--timeout: expected a number of seconds: finite and > 0, got 'nan'"),
    ("dtensor_opinfo_bench", ["--timeout", "inf", "--in-process"], "got 'inf'"),
    ("dtensor_opinfo_bench", ["--timeout", "1e12"], "--timeout: expected at most 86400 seconds (a day), got '1e12'"),
    ("dtensor_opinfo_bench", ["--samples", "0"], "--samples: expected an integer >= 1, got 0"),
    ("dtensor_opinfo_bench", ["--samples", "-3"], "got -3"),
    ("dtensor_opinfo_bench", ["--ops", "cummax", "nosuchop", "no*such"],
     "--ops: no OpInfo entry of the test's lists matches 'nosuchop' 'no*such'"),
    ("dtensor_opinfo_bench", ["--ops", ""], "matches ''"),
    ("dtensor_opinfo_bench", ["--uneven", "--mesh", "3x3"], "--mesh: invalid choice: '3x3'"),
    # DTensor's rules at edge arguments
    ("dtensor_edge_bench", ["--family", "dim=[]"], "--family: invalid choice: 'dim=[]'"),
    # the expert plans
    ("expert_plans_bench", ["--framework", "torch", "--heads", "0"], "--heads: expected an integer >= 1, got 0"),
    ("expert_plans_bench", ["--framework", "torch", "--heads", "3"], "--hidden 256 is not a multiple of --heads 3"),
    ("expert_plans_bench", ["--framework", "torch", "--hidden", "-8"], "--hidden: expected an integer >= 1, got -8"),
    ("expert_plans_bench", ["--batch", "0"], "--batch: expected an integer >= 1, got 0"),
    ("expert_plans_bench", ["--variants", "--variant-heads", "4", "3"],
     "--variant-hidden 64 is not a multiple of --variant-heads 3"),
    ("expert_plans_bench", ["--mesh", "2x2", "--dp-link", "nan:-1"],
     "--dp-link 'nan:-1': expected a number of seconds: finite and >= 0, got 'nan'"),
    ("expert_plans_bench", ["--mesh", "2x2", "--dp-link", "1e-5:-1"],
     "--dp-link '1e-5:-1': expected bytes per second: finite and > 0, got '-1'"),
    ("expert_plans_bench", ["--mesh", "2x2", "--dp-link", "1:1e-308"],
     "--dp-link '1:1e-308': links['dp']: (1.0, 1e-308) is so slow that moving a tensor's bytes takes more seconds"),
    ("expert_plans_bench", ["--budget", "nan"], "--budget: expected a number of bytes: finite and > 0, got 'nan'"),
    ("expert_plans_bench", ["--budget-fraction", "nan"], "--budget-fraction: expected a fraction: finite and > 0"),
    ("expert_plans_bench", ["--budget-fraction", "1.5"], "expected a fraction: > 0 and <= 1, got '1.5'"),
    # the planner benchmark
    ("planner_bench", ["--mesh", "abc"], "expected a mesh shape such as 8 or 2x4, got 'abc'"),
    ("planner_bench", ["--mesh", "2x0"], "got '2x0'"),
    ("planner_bench", ["--budget", "0"], "--budget: expected a number: finite and > 0, got '0'"),
    ("planner_bench", ["--budget", "nan"], "got 'nan'"),
    ("planner_bench", ["--layers", "0"], "--layers: expected an integer >= 1, got 0"),
    ("planner_bench", ["--beam-width", "99999999999999"], "--beam-width: expected at most 4096 partial plans, got"),
    ("planner_bench", ["--beam-width", "0"], "--beam-width: expected an integer >= 1, got 0"),
    ("planner_bench", ["--time-limit", "inf"], "got 'inf'"),
    ("planner_bench", ["--hidden", "30", "--heads", "4"], "--hidden 30 is not a multiple of --heads 4"),
    ("planner_bench", ["--end-to-end", "--mesh", "99999999999"],
     "--end-to-end simulates every rank in this process: a mesh of at most 64 devices, got 99999999999"),
    ("explore_bench", ["--ops", ""], "--ops '' names no call"),
    ("explore_bench", ["--ops", " , "], "--ops ' , ' names no call"),
    ("sweep_bench", ["--backend", "jax", "--kernels", "my_kernels"], "--kernels takes torch custom ops or TVM TE"),
    ("expert_plans_bench", ["--cache", ""], "--cache: expected a path, got ''"),
    # the sweep benchmarks: '' is no pattern (not every op), counts are counts
    ("sweep_bench", ["--ops", ""], "--ops '' names no op pattern"),
    ("sweep_bench", ["--ops", ",", "--ops", " "], "--ops ',' ' ' names no op pattern"),
    ("sweep_bench", ["--kernels", ""], "--kernels '' names no module"),
    ("sweep_bench", ["--loaded", "--hogs", "-5"], "--hogs: expected an integer >= 1, got -5"),
    ("sweep_bench", ["--slowest", "-1"], "--slowest: expected an integer >= 0, got -1"),
    ("sweep_bench", ["--jobs", "0"], "expected an integer >= 1, got 0"),
    # options the run would ignore
    ("explore_bench", ["--top", "5"], "--top needs --profile"),
    ("explore_bench", ["--sort", "tottime"], "--sort needs --profile"),
    ("explore_bench", ["--stages", "--profile", "mm"], "--profile does not combine with --stages"),
    ("sweep_bench", ["--hogs", "5"], "--hogs needs --loaded"),
    ("expert_plans_bench", ["--variant-seq", "5"], "--variant-seq needs --variants"),
    ("expert_plans_bench", ["--variants", "--production"], "--variants does not apply to --production"),
    ("expert_plans_bench", ["--production", "--mesh", "2x2"], "--mesh does not apply to --production"),
    ("expert_plans_bench", ["--variants", "--hidden", "128"], "--hidden does not apply to --variants"),
    ("planner_bench", ["--end-to-end", "--captured"], "--captured does not apply to --end-to-end"),
    ("planner_bench", ["--end-to-end", "--budget", "0.5"], "--budget does not apply to --end-to-end"),
    ("jax_sweep_bench", ["--ops", ""], "--ops '' names no op pattern"),
    ("jax_sweep_bench", ["--timeout", "nan"], "--timeout: expected a number of seconds: finite and > 0, got 'nan'"),
])
def test_usage_errors(capsys, module, args, message):
    with pytest.raises(SystemExit) as e:
        _module(module).main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err


def test_expert_plans_refuse_a_cache_that_is_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    bench = _module("expert_plans_bench")
    file = tmp_path / "file"
    for path, message in ((file, f"--cache {file} is not a folder"),
                          (file / "sub", f"--cache {file / 'sub'}: {file} is not a folder")):
        with pytest.raises(SystemExit) as e:
            bench.main(["--framework", "torch", "--cache", str(path)])
        assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("module,args", [("sweep_bench", ["--ops", "aten.relu.default"]),
                                         ("jax_sweep_bench", ["--ops", "jax.add", "--runs", "cold"])])
def test_a_sweep_benchmark_ends_quietly_on_ctrl_c(monkeypatch, capsys, module, args):
    bench = _module(module)

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_sweep", interrupted)
    try:
        status = bench.main(args)
    except KeyboardInterrupt:  # escaping, it would end the test session too
        pytest.fail("Ctrl-C escaped main as a KeyboardInterrupt traceback")
    assert status == 130
    assert capsys.readouterr().err == f"{module}: interrupted\n"


@pytest.mark.parametrize("damage", ["byte", "status"])
def test_jax_crosscheck_names_a_broken_rule_file_with_exit_2(tmp_path, damage):
    # exit 1 would read as "a rule failed verification"; the torch cross-check says 2 too
    path = tmp_path / "jax" / "jax.add.yaml"
    path.parent.mkdir()
    text = (ROOT / "registry" / "jax" / "jax.add.yaml").read_bytes()
    path.write_bytes(text + b"\xff" if damage == "byte" else text.replace(b"\nstatus: ok\n", b"\nstatus: bogus\n", 1))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "crosscheck.py"), "--backend", "jax", "--ops", "jax.add",
                           "--registry", str(tmp_path), "--devices", "0"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"crosscheck: error: {path}:" in proc.stderr
    assert ("not valid UTF-8" if damage == "byte" else "unknown status 'bogus'") in proc.stderr


def test_a_benchmark_ends_quietly_on_a_closed_pipe():
    proc = subprocess.Popen([sys.executable, str(BENCHMARKS / "planner_bench.py"), "--layers", "1",
                             "--no-highs", "--beam-width", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # `| head -0`
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and b"Traceback" not in err, err


def test_a_time_limit_past_the_solvers_range_is_no_limit_without_a_warning():
    """CBC took 1e308 s as 'no limit' only after printing that it ignores it."""
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "planner_bench.py"), "--layers", "1", "--no-highs",
                           "--beam-width", "1", "--time-limit", "1e308"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "valid range" not in proc.stdout + proc.stderr and "optimal" in proc.stdout
