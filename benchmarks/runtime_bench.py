#!/usr/bin/env python
"""Runtime costs: rule lookup in the generated table against live exploration of an
unseen op, and parallelize() end to end on small torch models.

    python benchmarks/runtime_bench.py            # prints four tables

Live exploration inside parallelize() runs in a forked child; the lookup-against-explore
rows explore in process, so they are measured on models whose ops never crash.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.models import MLP, ConvNet, FusedAttention, GPTBlock  # noqa: E402
from metaspmd.backends.torch import dtensor_rules  # noqa: E402
from metaspmd.backends.torch.capture import capture  # noqa: E402
from metaspmd.backends.torch.rules_at_runtime import node_call  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.cache import RuleCache  # noqa: E402
from metaspmd.cli import positive_int  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def lookup_and_explore(model: torch.nn.Module, x: torch.Tensor, repeat: int) -> list[tuple[str, str]]:
    captured = capture(model, (x,))
    ops = TorchOps()
    lookups, hits, explores = [], 0, []
    seen = set()
    for node in captured.ir.op_list:
        args, kwargs = captured.values[node.name]
        start = time.perf_counter()
        for _ in range(repeat):
            found = dtensor_rules.lookup(node.fn, args, kwargs)
        lookups.append((time.perf_counter() - start) / repeat)
        hits += found is not None
        call = node_call(captured, node)
        if (node.op, call.signature) in seen:
            continue
        seen.add((node.op, call.signature))
        case = call.case()
        start = time.perf_counter()
        explore_case(case, ops)
        explores.append(time.perf_counter() - start)
    us, ms = 1e6, 1e3
    return [
        ("graph nodes", f"{len(captured.ir)}"),
        ("table hits", f"{hits} / {len(captured.ir)}"),
        ("table lookup p50 / p95 (us)", f"{percentile(lookups, .5) * us:.2f} / {percentile(lookups, .95) * us:.2f}"),
        ("live exploration, distinct ops", f"{len(explores)}"),
        ("live exploration p50 / p95 (ms)", f"{percentile(explores, .5) * ms:.1f} / {percentile(explores, .95) * ms:.1f}"),
        ("live exploration mean (ms)", f"{statistics.mean(explores) * ms:.1f}"),
    ]


def end_to_end(model: torch.nn.Module, x: torch.Tensor) -> list[tuple[str, str]]:
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.parallelize import parallelize

    mesh = DeviceMesh("cpu", list(range(4)), _init_backend=False, _rank=0)
    cache = RuleCache(tempfile.mkdtemp())
    rows = []
    for label in ("cold cache", "warm cache"):
        start = time.perf_counter()
        p = parallelize(model, mesh, (x,), cache=cache)
        rows.append((f"parallelize, {label} (s)", f"{time.perf_counter() - start:.2f}  ({p.stats})"))
        if p.stats.live_seconds:
            rows.append(("slowest live exploration (s)", f"{max(p.stats.live_seconds):.2f}"))
    return rows


def table(title: str, rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    lines = [f"{title}", f"{'metric':<{width}}  value", f"{'-' * width}  -----"]
    return "\n".join(lines + [f"{k:<{width}}  {v}" for k, v in rows])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=positive_int, default=200, help="lookups timed per node")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    for name, model, x in (("MLP 512x2048, batch 8", MLP(512, 2048), torch.randn(8, 512)),
                           ("GPT block d=64, seq 16", GPTBlock(64, 4, 256), torch.randn(2, 16, 64))):
        print(table(f"\n## {name}: forward + backward", lookup_and_explore(model, x, args.repeat) + end_to_end(model, x)))
    # Its flash-attention kernel crashes on some shards: explored once per op call in a child
    for name, model, x in (("ConvNet with BatchNorm, batch 8", ConvNet().train(), torch.randn(8, 3, 16, 16)),
                           ("FusedAttention d=32, seq 16", FusedAttention(), torch.randn(4, 16, 32))):
        print(table(f"\n## {name}: forward + backward", end_to_end(model, x)))
    return 0


if __name__ == "__main__":
    from metaspmd.cli import pipe_safe  # `| head` ends it quietly

    sys.exit(pipe_safe(main)())
