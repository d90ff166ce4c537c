#!/usr/bin/env python
"""Plan and run a model on DTensor across processes (gloo on CPU), and check every rank's
outputs, gradients and buffers against one device.

    torchrun --standalone --nproc-per-node 4 examples/torchrun_parallelize.py --model convnet --budget 500000

Every rank captures the model and finds its rules; rank 0 alone plans and sends the plan
to the others (a time-limited solve can end differently on each rank, and ranks running
different plans wait on each other's collectives forever). Each rank checks it runs
rank 0's plan. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.models import MLP, ConvNet, FusedAttention, GPTBlock  # noqa: E402
from metaspmd.backends.torch.parallelize import parallelize  # noqa: E402
from metaspmd.cache import RuleCache  # noqa: E402
from metaspmd.cli import path_arg, positive_number, seconds  # noqa: E402

MODELS = {
    "mlp": (lambda: MLP(64, 256), (8, 64)),
    "gpt": (GPTBlock, (4, 16, 32)),
    "convnet": (lambda: ConvNet().train(), (8, 3, 16, 16)),
    "attention": (FusedAttention, (4, 16, 32)),
    # dropout in training: ranks drawing a cut mask draw it whole, as one device does
    "dropout": (lambda: torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                            torch.nn.Linear(256, 64)).train(), (8, 64)),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="convnet")
    parser.add_argument("--budget", type=positive_number, default=None, help="memory budget per device, bytes")
    parser.add_argument("--cache", type=path_arg, default=None, help="rule cache directory (default: the user cache)")
    parser.add_argument("--time-limit", type=seconds, default=10.0, help="the ILP's time limit, seconds")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    try:
        return check(args)
    finally:
        # DTensors freed after the process group, as the interpreter exits, abort the process
        # (torch 2.13 with gloo: 12 of 120 ranks of a plain DTensor program): freed first, cycles too
        gc.collect()
        dist.destroy_process_group()


def check(args: argparse.Namespace) -> int:
    """Parallelize the model on every rank, run rank 0's plan, and compare with one device."""
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    make, shape = MODELS[args.model]
    torch.manual_seed(0)
    model = make()
    reference = copy.deepcopy(model)
    x = torch.randn(shape)
    start = time.perf_counter()
    p = parallelize(model, mesh, (x,), memory_budget=args.budget, time_limit=args.time_limit,
                    cache=RuleCache(args.cache) if args.cache else None)
    planned = time.perf_counter() - start
    # the same plan from the same solve: equal down to the solver's own seconds
    plans = [None] * dist.get_world_size()
    dist.all_gather_object(plans, p.plan)
    if any(other != plans[0] for other in plans):
        raise SystemExit(f"rank {rank}: the ranks did not get one plan from one solve")
    torch.manual_seed(1)  # the same draws (dropout's) on one device as across the ranks
    out, grads = p(x)
    torch.manual_seed(1)
    expected = reference(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, torch.autograd.grad(expected.sum(), list(reference.parameters()))):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for (name, got), (_, want) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(got, want, msg=name)
    if rank == 0:
        print(f"{args.model} on {dist.get_world_size()} ranks matches one device (one plan, "
              f"parallelize {planned:.1f} s): {p.stats}")
        print(p.plan.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
