"""A user's custom op is cached under a fingerprint of its code: rewritten under the same
name, it is explored again, never run with the rules of the code it had before."""

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

# rows independent, or columns: each version cuts only where its own rule says
SCRIPT = """
import json, sys
import torch, torch.distributed as dist
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor
from metaspmd.backends.torch.dtensor_rules import register_op
from metaspmd.cache import RuleCache

AXIS = {axis}

@torch.library.custom_op("metaspmd_test::scaled", mutates_args=())
def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * x.sum(AXIS, keepdim=True)

scaled.register_fake(lambda x: torch.empty_like(x))
dist.init_process_group("fake", rank=0, world_size=2)
x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
register_op(torch.ops.metaspmd_test.scaled.default, (x,), cache=RuleCache(sys.argv[1]))
with LocalTensorMode(frozenset(range(2))):
    y = scaled(distribute_tensor(x, DeviceMesh("cpu", [0, 1]), (Shard(0),)))
    full = y.full_tensor()
print(json.dumps({{"placements": [str(p) for p in y.placements], "error": (full - scaled(x)).abs().max().item()}}))
"""


def _run(tmp_path, axis: int) -> dict:
    script = tmp_path / f"scaled_{axis}.py"
    script.write_text(SCRIPT.format(axis=axis))
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "cache")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # three processes that import torch
def test_a_custom_op_rewritten_under_its_name_is_explored_again(tmp_path):
    rows = _run(tmp_path, -1)  # rows independent: a row cut stays cut
    assert rows == {"placements": ["S(0)"], "error": 0.0}
    columns = _run(tmp_path, 0)  # now columns: the row cut cached for the first version must not be read
    assert columns["error"] < 1e-5 and columns["placements"] != ["S(0)"]
    assert len(list((tmp_path / "cache").rglob("*.yaml"))) == 2  # one entry per version of the op
    assert _run(tmp_path, -1) == rows  # the first version again: its entry, read back
    assert len(list((tmp_path / "cache").rglob("*.yaml"))) == 2
