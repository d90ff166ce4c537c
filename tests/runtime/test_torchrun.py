"""parallelize() across real processes: torchrun starts 4 gloo ranks on the CPU, each
plans the batch-normalized ConvNet under a budget that cuts it, runs the plan on DTensor
and checks outputs, gradients and running statistics against one device."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def test_convnet_on_four_gloo_ranks_matches_one_device(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
               str(ROOT / "examples" / "torchrun_parallelize.py"), "--model", "convnet", "--budget", "800000",
               "--cache", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "convnet on 4 ranks matches one device" in done.stdout
    assert "S(" in done.stdout  # the budget cut something
