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


def test_spawned_children_start_with_the_environment_and_the_parent_keeps_its_own():
    before = {k: os.environ.get(k) for k in reproducible.ENV}
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with reproducible.for_children():
        child = ctx.Process(target=_report, args=(queue,))
        child.start()
    child.join(60)
    randomized, env, in_effect = queue.get(timeout=5)
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
