"""Worker processes start with one string-hash order and one choice of numeric kernels,
whatever the parent's."""

from __future__ import annotations

import multiprocessing
import os
import platform
import subprocess
import sys

import pytest

from metaspmd import reproducible

ORDER = "print(list({'xy', 'ij', 'a', 'b', 'c', 'd'}))"  # a set's order follows the salted hashes


def _report(queue) -> None:
    queue.put((sys.flags.hash_randomization, {k: os.environ.get(k) for k in reproducible.ENV}, reproducible.in_effect()))


def _in_spawned_child(report):
    """What ``report`` puts in its queue, in a child spawned under ``for_children``."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with reproducible.for_children():
        child = ctx.Process(target=report, args=(queue,))
        child.start()
    child.join(60)
    return queue.get(timeout=5)


def test_spawned_children_start_with_the_environment_and_the_parent_keeps_its_own():
    before = {k: os.environ.get(k) for k in reproducible.ENV}
    randomized, env, in_effect = _in_spawned_child(_report)
    assert randomized == 0 and env == reproducible.ENV and in_effect
    assert {k: os.environ.get(k) for k in reproducible.ENV} == before


def test_child_env_gives_one_set_order_where_salted_hashes_give_others():
    def order(env) -> str:
        return subprocess.run([sys.executable, "-c", ORDER], env=env, capture_output=True, text=True, check=True).stdout

    fixed = {order(reproducible.child_env()) for _ in range(3)}
    salted = {order({**os.environ, "PYTHONHASHSEED": str(seed)}) for seed in range(1, 9)}
    assert len(fixed) == 1 and len(salted) > 1


def test_torch_in_a_child_runs_its_avx2_kernels_whatever_the_cpu():
    """The registry is the same on AVX-512 and AVX2 machines only if workers run the AVX2
    kernels there (the AVX-512 ones refuted gathers of sinh of integers)."""
    pytest.importorskip("torch")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ATEN_CPU_CAPABILITY=avx2 names an x86 kernel set")
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run([sys.executable, "-c", code], env=reproducible.child_env(), capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "AVX2"


def test_onednn_in_a_child_runs_its_avx2_kernels_whatever_the_cpu():
    """oneDNN picks its kernels by CPU up to AMX, and they round differently:
    convolution_backward kept other Partial rules on an AMX machine than on an AVX2 one."""
    pytest.importorskip("torch")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ONEDNN_MAX_CPU_ISA=AVX2 names an x86 instruction set")
    code = "import torch; torch.nn.functional.conv2d(torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3))"
    out = subprocess.run([sys.executable, "-c", code], env={**reproducible.child_env(), "ONEDNN_VERBOSE": "all"},
                         capture_output=True, text=True, check=True).stdout
    assert [line.rsplit(",", 1)[1] for line in out.splitlines() if ",isa:" in line] == ["isa:Intel AVX2"], out


PREPARED_WORKER = """
import torch
from metaspmd.backends.torch import get_backend

get_backend(opinfos=("nn.functional.relu",), model_programs=False).prepare()
a, b = torch.ones(8, 16).to(torch.float8_e4m3fn), torch.ones(12, 16).to(torch.float8_e4m3fn).t()
print(torch.backends.mkldnn.enabled, torch._C._get_nnpack_enabled())
print(torch._scaled_mm(a, b, torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.float32).sum().item())
try:
    torch._scaled_mm(a, b, torch.tensor(1.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64),
                     out_dtype=torch.float32)
    print("float64 scales taken")
except (RuntimeError, ValueError) as e:
    print(str(e).splitlines()[0])
"""


@pytest.mark.slow  # a sweep worker in a process of its own
def test_a_torch_sweep_worker_runs_torchs_own_kernels_whatever_the_cpu():
    """Where the CPU has AMX, torch runs _scaled_mm's float8 product on oneDNN, which takes
    float64 scales, and elsewhere on its own kernel, which refuses them: the sample the
    sweep built, and so the rule file, depended on the machine. A prepared worker runs
    torch's own kernel on every machine, and no NNPACK convolution (its sums are blocked
    by the CPU's cache sizes)."""
    pytest.importorskip("torch")
    pytest.importorskip("expecttest")  # the OpInfo database needs it
    out = subprocess.run([sys.executable, "-c", PREPARED_WORKER], env=reproducible.child_env(), capture_output=True,
                         text=True, timeout=300).stdout.splitlines()
    assert out == ["False False", str(8 * 12 * 16.0), "Invalid scaling configuration."], out


def _unset_report(queue) -> None:
    queue.put(({k: v for k, v in os.environ.items() if k.startswith(("JAX_", "PYTORCH_OPINFO_", "XLA_FLAGS"))},
               reproducible.in_effect()))


USER_SETTINGS = {"PYTORCH_OPINFO_SAMPLE_INPUT_INDEX": "0", "JAX_NUMPY_RANK_PROMOTION": "raise", "XLA_FLAGS": "--x=1"}


def test_children_start_without_the_variables_a_user_set_that_change_results(monkeypatch):
    """A user's PYTORCH_OPINFO_SAMPLE_INPUT_INDEX (one sample per OpInfo) or JAX
    configuration changed the registry a sweep wrote; workers start without them, and the
    parent keeps them."""
    for k, v in USER_SETTINGS.items():
        monkeypatch.setenv(k, v)
    assert reproducible.unset_names() == sorted(USER_SETTINGS)
    assert not set(USER_SETTINGS) & set(reproducible.child_env()) and reproducible.child_env()["JAX_PLATFORMS"] == "cpu"
    assert _in_spawned_child(_unset_report) == ({"JAX_PLATFORMS": "cpu"}, True)
    assert all(os.environ[k] == v for k, v in USER_SETTINGS.items())


def test_a_process_started_under_them_is_not_reproducible_and_names_its_jax_caches_apart():
    code = ("from metaspmd import reproducible as r; import os; os.environ.pop('JAX_NUMPY_RANK_PROMOTION');"
            "print(r.in_effect(), bool(r.started_under('JAX_')))")
    env = {**reproducible.child_env(), "JAX_NUMPY_RANK_PROMOTION": "raise"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]  # read at its start, as jax reads it
    out = subprocess.run([sys.executable, "-c", code.replace("os.environ.pop('JAX_NUMPY_RANK_PROMOTION');", "")],
                         env=reproducible.child_env(), capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]


def test_for_command_leaves_them_out_of_a_commands_own_environment_and_names_them(monkeypatch):
    for k, v in USER_SETTINGS.items():
        monkeypatch.setenv(k, v)
    for k in reproducible.ENV:
        monkeypatch.setenv(k, os.environ.get(k, ""))  # restored after the test, as the others
    assert reproducible.for_command() == sorted(USER_SETTINGS)
    assert not reproducible.unset_names() and all(os.environ[k] == v for k, v in reproducible.ENV.items())


def test_values_of_their_own_for_the_variables_it_sets_are_named(monkeypatch, capsys):
    """ATEN_CPU_CAPABILITY=default was replaced by avx2 unsaid, while a dropped variable was named."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_CBWR", reproducible.ENV["MKL_CBWR"])
    assert reproducible.overridden() == ["ATEN_CPU_CAPABILITY=avx2"]
    for k in reproducible.ENV:
        monkeypatch.setenv(k, os.environ.get(k, ""))  # restored after the test
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    from metaspmd import cli

    cli._reproducible_environment("sweep")
    assert "sweep: setting ATEN_CPU_CAPABILITY=avx2 for its workers" in capsys.readouterr().err
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"


@pytest.mark.slow  # a sweep in a process of its own
def test_a_sweep_under_a_users_opinfo_setting_gives_the_committed_files():
    """With PYTORCH_OPINFO_SAMPLE_INPUT_INDEX=0 inherited, the workers replayed sample 0
    only: linalg_cholesky was verified on fresh inputs that are not positive-definite and
    came out replicate-only."""
    pytest.importorskip("torch")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTORCH_OPINFO_SAMPLE_INPUT_INDEX": "0"}
    out = subprocess.run([sys.executable, os.path.join(root, "tools", "sweep.py"), "--backend", "torch", "--ops",
                          "aten.linalg_cholesky.default", "--check", "--jobs", "1", "--no-progress"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "leaving out PYTORCH_OPINFO_SAMPLE_INPUT_INDEX" in out.stderr
