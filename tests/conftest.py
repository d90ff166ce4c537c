import os
import random
import subprocess
import sys
import time

import pytest


@pytest.fixture(autouse=True)
def _seeded():
    """Tests draw example data from the global generators: make every run the same."""
    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(0)
    except ImportError:
        pass


@pytest.fixture(autouse=True)
def _environment_kept():
    """A command run in process (``tests/test_bad_input.py`` runs ``sweep`` and
    ``crosscheck`` so) sets its workers' environment in its own (``reproducible.for_command``),
    as a command should. Taken back after each test: left, ``ONEDNN_MAX_CPU_ISA=AVX2``
    reached the first oneDNN call of a later test in the same worker: on a machine with AMX,
    torch sends int8 and float8 matmuls to oneDNN, which has no primitive for them there."""
    saved = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # pytest's own, per phase
    yield
    for k in [k for k in os.environ if k not in saved and k != "PYTEST_CURRENT_TEST"]:
        del os.environ[k]
    os.environ.update(saved)


@pytest.fixture(scope="session")
def fake_world_of():
    """``fake_world_of(n)``: a fake process group of at least n ranks. One started smaller
    (the cross-check's real-DTensor replay starts one of 2) is replaced, so test modules
    that plan on different meshes run in any order."""
    def start(size: int) -> None:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() < size:
            dist.destroy_process_group()
        if not dist.is_initialized():
            dist.init_process_group("fake", rank=0, world_size=size)

    return start


@pytest.fixture(scope="session")
def plain_and_registered(fake_world_of):
    """``plain_and_registered(run, rules, world=4)``: ``run(mesh)`` on plain DTensor, then
    under register() (its rule cache in the folder ``rules``), on a mesh of ``world``
    simulated ranks (fake process group and LocalTensorMode), as ``{"plain": ...,
    "register()": ...}``, with that register()'s report (undone before the return)."""
    def both(run, rules, world: int = 4) -> tuple[dict, object]:
        import warnings

        from torch.distributed._local_tensor import LocalTensorMode
        from torch.distributed.device_mesh import DeviceMesh

        from metaspmd.backends.torch import dtensor_rules
        from metaspmd.cache import RuleCache

        warnings.filterwarnings("ignore")
        fake_world_of(world)
        found = {}
        with LocalTensorMode(frozenset(range(world))):
            mesh = DeviceMesh("cpu", list(range(world)))
            found["plain"] = run(mesh)
            report = dtensor_rules.register(cache=RuleCache(rules))
            try:
                found["register()"] = run(mesh)
            finally:
                dtensor_rules.unregister(report)
        return found, report

    return both


# The frame of a script run on two gloo ranks: a body between them sees ``torch``, ``dist``,
# ``F``, ``DeviceMesh``, ``Replicate``, ``Shard``, ``distribute_tensor``, ``mesh`` (of both
# ranks) and ``report`` (a register()'s, or None: plain DTensor), and fills the dict ``got``.
_GLOO_HEAD = """
import gc, json, os, sys, warnings
import torch, torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from metaspmd.backends.torch import dtensor_rules
warnings.filterwarnings("ignore")
rank, store, registered = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
mesh = DeviceMesh("cpu", [0, 1])
report = dtensor_rules.register() if registered else None
got = {}
"""
_GLOO_TAIL = """
print(json.dumps(got))
if report is not None:
    dtensor_rules.unregister(report)
gc.collect()  # DTensors freed after the process group abort the process (torch 2.13, gloo)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # gloo's threads can abort the interpreter's teardown ("terminate called without an active exception")
"""


@pytest.fixture
def gloo_ranks(tmp_path):
    """``gloo_ranks(script, n, *args)``: Python source ``script`` run as ``n`` processes
    (argv: rank, a file store for gloo, ``args``); each one's last line of output read as
    JSON, in rank order."""
    import json

    def run(script: str, n: int, *args: str) -> list:
        ranks = [subprocess.Popen([sys.executable, "-c", script, str(r), str(tmp_path / "store"), *args],
                                  text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(n)]
        found = []
        for p in ranks:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
            found.append(json.loads(out.strip().splitlines()[-1]))
        return found

    return run


@pytest.fixture
def on_two_gloo_ranks(gloo_ranks):
    """``on_two_gloo_ranks(body, registered)``: the dict ``got`` that ``body`` (Python source,
    run in ``_GLOO_HEAD``'s frame: plain DTensor, or under register()) fills, on each of two
    gloo ranks."""
    import textwrap

    def run(body: str, registered: bool) -> list:
        return gloo_ranks(_GLOO_HEAD + textwrap.dedent(body) + _GLOO_TAIL, 2, str(int(registered)))

    return run


def _stops_growing(path, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        before = path.stat().st_size
        time.sleep(0.5)
        if path.stat().st_size == before:
            return True
    return False


@pytest.fixture
def stops_growing():
    """``stops_growing(path, within=5.0)``: does a file its writer appends to every 0.1 s
    stop growing (the writer gone) within ``within`` seconds?"""
    return _stops_growing


@pytest.fixture
def outlives_killed_parent(tmp_path):
    """``outlives_killed_parent(script)``: run ``script``, Python whose process starts a child
    that appends to the file named by its first argument every 0.1 s; once the child writes,
    kill the script's process with SIGKILL, which leaves it no chance to stop the child.
    Does the child write on?"""
    def run(script: str) -> bool:
        path, beats = tmp_path / "parent.py", tmp_path / "beats"
        path.write_text(script)
        proc = subprocess.Popen([sys.executable, str(path), str(beats)])
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not beats.exists():
                time.sleep(0.1)
            assert beats.exists(), "the child never started"
            assert not _stops_growing(beats, within=1.0), "the child stopped on its own"
        finally:
            proc.kill()
            proc.wait()
        return not _stops_growing(beats)

    return run
