"""parallelize() across real processes (gloo on the CPU): one rank plans, every rank runs
that plan, and each checks outputs, gradients and buffers against one device."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def torchrun(ranks: int, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               str(ROOT / "examples" / "torchrun_parallelize.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


# A time-limited solve (2 s) is where ranks that plan for themselves part ways; the example
# fails unless every rank holds the very plan rank 0 solved (its solve seconds included).
@pytest.mark.slow
def test_a_budgeted_gpt_on_two_gloo_ranks_runs_rank_0s_plan_and_matches_one_device(tmp_path):
    done = torchrun(2, "--model", "gpt", "--budget", "800000", "--time-limit", "2", "--cache", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpt on 2 ranks matches one device (one plan" in done.stdout
    assert "S(" in done.stdout  # something is cut


# Dropout in training, its mask cut with the activations: each rank draws the mask whole and
# keeps its shard, so the ranks seeded alike compute what one device does with that seed.
@pytest.mark.slow
def test_a_cut_dropout_on_two_gloo_ranks_draws_the_mask_one_device_draws(tmp_path):
    done = torchrun(2, "--model", "dropout", "--budget", "150000", "--cache", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "dropout on 2 ranks matches one device (one plan" in done.stdout
    (draw,) = [line for line in done.stdout.splitlines() if line.startswith("bernoulli ")]
    assert "S(" in draw  # the plan cuts the mask


# Four processes (tens of seconds): the slow job. The same plan on DTensor runs in the default
# run on a fake process group (test_parallelize_torch's batch-normalized ConvNet).
@pytest.mark.slow
def test_convnet_on_four_gloo_ranks_matches_one_device(tmp_path):
    done = torchrun(4, "--model", "convnet", "--budget", "500000", "--cache", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "convnet on 4 ranks matches one device" in done.stdout
    assert "S(" in done.stdout  # the budget cut something


# Each rank runs one_plan on a 2x2 mesh whose origin is rank 3: the plan goes out along both
# mesh dims; then a solve that fails raises on every rank instead of leaving them waiting.
RANK = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from metaspmd.planner import Infeasible
    from metaspmd.backends.torch.shared_plan import one_plan
    rank, store = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=4)
    mesh = DeviceMesh("cpu", [[3, 1], [2, 0]])
    solved = []
    def solve():
        solved.append(rank)
        return {"from": rank}
    def fail():
        raise Infeasible("no plan fits 1 byte")
    got = one_plan(mesh, solve)
    try:
        one_plan(mesh, fail)
        raised = None
    except Infeasible as e:
        raised = str(e)
    try:  # rank 1 captured another graph: every rank raises, and nobody solves
        one_plan(mesh, solve, "other" if rank == 1 else "same")
        other = None
    except PlannerError as e:
        other = str(e)
    print(json.dumps({"rank": rank, "got": got, "solved": solved, "raised": raised, "other": other}))
    dist.destroy_process_group()
""").replace("from metaspmd.planner import Infeasible", "from metaspmd.planner import Infeasible, PlannerError")


@pytest.mark.slow  # four processes that import torch: about 40 s on two shared cores
def test_one_rank_plans_and_every_rank_of_a_2x2_mesh_gets_its_plan_or_its_error(gloo_ranks):
    results = gloo_ranks(RANK, 4)
    assert [r["got"] for r in results] == [{"from": 3}] * 4
    assert [r["solved"] for r in results] == [[], [], [], [3]]
    assert [r["raised"] for r in results] == ["no plan fits 1 byte"] * 4
    here, there = "this process captured another graph than", "another process captured another graph than"
    assert [r["other"].split(" the one")[0] for r in results] == [there, here, there, there]
    assert all("(rank 3)" in r["other"] for r in results)


# Each rank passes its own values (a per-rank loader): the caller's tensors stay as they
# were (distribute_tensor broadcast rank 0's values into them); then a rank whose example
# has another shape makes every rank raise, instead of aborting in gloo at the first op.
PER_RANK = textwrap.dedent("""
    import json, sys, tempfile
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from metaspmd.backends.torch.parallelize import parallelize
    from metaspmd.cache import RuleCache
    from metaspmd.planner import PlannerError
    rank, store = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    mesh = DeviceMesh("cpu", [0, 1])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    with torch.no_grad():
        model.weight.add_(rank)
    x = torch.full((4, 8), float(rank))
    x_before, w_before = x.clone(), model.weight.detach().clone()
    p = parallelize(model, mesh, (x,), cache=RuleCache(tempfile.mkdtemp()))
    p(x)
    kept = torch.equal(x, x_before) and torch.equal(model.weight, w_before)
    try:
        parallelize(model, mesh, (torch.randn(4 + 4 * rank, 8),), cache=RuleCache(tempfile.mkdtemp()))
        other = None
    except PlannerError as e:
        other = str(e)
    print(json.dumps({"rank": rank, "kept": kept, "other": other}))
    dist.destroy_process_group()
""")


@pytest.mark.slow  # two processes that import torch and plan: about 20 s
def test_a_call_leaves_each_ranks_tensors_and_ranks_of_other_shapes_all_raise(gloo_ranks):
    results = gloo_ranks(PER_RANK, 2)
    assert [r["kept"] for r in results] == [True, True]
    assert results[0]["other"].startswith("another process captured another graph than the one that plans for all")
    assert results[1]["other"].startswith("this process captured another graph than the one that plans for all")
