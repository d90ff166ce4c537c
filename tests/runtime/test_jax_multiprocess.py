"""parallelize() on JAX across processes of one machine (jax.distributed.initialize on
localhost, CPU devices in each process): the first process plans, every process runs
that plan, and each checks outputs and gradients against one device."""

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# Each process calls one_plan on a mesh over both processes' devices, then with a solve
# that fails: the second raises the first's error instead of waiting for a plan.
PROCESS = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, numpy as np
    from jax.sharding import Mesh
    pid, port = int(sys.argv[1]), sys.argv[2]
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=pid)
    from metaspmd.planner import Infeasible
    from metaspmd.backends.jax.shared_plan import one_plan
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    solved = []
    def solve():
        solved.append(pid)
        return {"from": pid}
    def fail():
        raise Infeasible("no plan fits 1 byte")
    got = one_plan(mesh, solve)
    local = one_plan(Mesh(np.array(jax.local_devices()), ("tp",)), lambda: {"local": pid})
    try:
        one_plan(mesh, fail)
        raised = None
    except Infeasible as e:
        raised = str(e)
    try:  # process 1 captured another graph: both raise, and neither solves
        one_plan(mesh, solve, "other" if pid == 1 else "same")
        other = None
    except PlannerError as e:
        other = str(e)
    print(json.dumps({"got": got, "local": local, "solved": solved, "raised": raised, "other": other}))
    jax.distributed.shutdown()
""").replace("from metaspmd.planner import Infeasible", "from metaspmd.planner import Infeasible, PlannerError")


def test_the_first_process_plans_and_every_process_gets_its_plan_or_its_error():
    port = str(free_port())
    processes = [subprocess.Popen([sys.executable, "-c", PROCESS, str(i), port], cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    results = []
    for p in processes:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["got"] for r in results] == [{"from": 0}] * 2
    assert [r["solved"] for r in results] == [[0], []]
    assert [r["local"] for r in results] == [{"local": 0}, {"local": 1}]  # a mesh of one process: its own plan
    assert [r["raised"] for r in results] == ["no plan fits 1 byte"] * 2
    assert results[0]["other"].startswith("another process captured another graph than the one that plans for all "
                                          "(process 0)")
    assert results[1]["other"].startswith("this process captured another graph than")


# Two processes capture, explore (cold cache) and compile a GPT block: minutes on two cores.
@pytest.mark.slow
def test_a_budgeted_gpt_block_on_two_processes_runs_one_plan_and_matches_one_device(tmp_path):
    command = [sys.executable, str(ROOT / "examples" / "jax_multiprocess_parallelize.py"), "--processes", "2",
               "--devices", "2", "--budget", "400000", "--time-limit", "3", "--cache", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpt on 2 processes, 4 devices matches one device (one plan" in done.stdout
    assert "S(" in done.stdout  # the budget cut something


@pytest.mark.parametrize("option, message", [
    (["--processes", "0"], "--processes: expected an integer >= 1, got 0"),  # no process: a wait for none
    (["--processes", "1000"], "--processes: expected at most 64 processes"),
    (["--devices", "0"], "--devices: expected an integer >= 1, got 0"),
    (["--budget", "nan"], "--budget: expected a number: finite and > 0, got 'nan'"),
    (["--time-limit", "-1"], "--time-limit: expected a number of seconds: finite and > 0"),
    (["--cache", ""], "--cache: expected a path, got ''"),
])
def test_the_examples_refuse_bad_options_before_any_process_starts(option, message, capsys):
    """They started processes that each failed alone (or waited for peers that never came)."""
    from examples import jax_multiprocess_parallelize, torchrun_parallelize

    mains = [jax_multiprocess_parallelize.main]
    if option[0] in ("--budget", "--time-limit", "--cache"):
        mains.append(torchrun_parallelize.main)  # checked before the process group starts
    for main in mains:
        with pytest.raises(SystemExit) as e:
            main(option)
        assert e.value.code == 2 and message in capsys.readouterr().err
