#!/usr/bin/env python
"""Plan and run a GPT block under jax.jit across processes on one machine
(``jax.distributed.initialize``, CPU devices in each process), and check every process's
outputs and gradients against one device.

    python examples/jax_multiprocess_parallelize.py --processes 2 --devices 2 --budget 400000

starts the processes itself (each is this script with ``--process-id``). Every process
captures the block and finds its rules; the first alone plans and the others receive its
plan. Each process checks that it runs that plan. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from metaspmd.cli import at_most, path_arg, positive_int, positive_number, seconds


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Start one process per ``--processes`` on a free local port; their exit status."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    children = [subprocess.Popen([sys.executable, __file__, *argv, "--process-id", str(i), "--port", str(port)])
                for i in range(args.processes)]
    codes = [c.wait() for c in children]
    return max(codes, key=abs)


def run(args: argparse.Namespace) -> int:
    # before jax starts: this process's CPU devices
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh

    jax.distributed.initialize(coordinator_address=f"localhost:{args.port}", num_processes=args.processes,
                               process_id=args.process_id)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from examples.jax_models import gpt_block, gpt_params
    from metaspmd.backends.jax.parallelize import parallelize
    from metaspmd.cache import RuleCache

    mesh = Mesh(np.array(jax.devices()), ("tp",))  # every process's devices
    params = gpt_params()
    x = jax.random.normal(jax.random.key(1), (4, 16, 32), jax.numpy.float32)
    start = time.perf_counter()
    par = parallelize(gpt_block, mesh, (x,), params=params, memory_budget=args.budget, time_limit=args.time_limit,
                      cache=RuleCache(args.cache) if args.cache else None)
    planned = time.perf_counter() - start
    # the same plan from the same solve: equal down to the solver's own seconds
    digest = np.frombuffer(hashlib.sha256(repr(par.plan).encode()).digest(), np.uint8)
    multihost_utils.assert_equal(digest, "the processes did not get one plan from one solve")
    out, grads = par(x)
    out, grads = multihost_utils.process_allgather((out, grads), tiled=True)  # global values, on the host
    np.testing.assert_allclose(out, gpt_block(params, x), rtol=1e-4, atol=1e-5)
    want = jax.grad(lambda p: gpt_block(p, x).sum())(params)
    for name in params:
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)
    if jax.process_index() == 0:
        print(f"gpt on {jax.process_count()} processes, {jax.device_count()} devices matches one device "
              f"(one plan, parallelize {planned:.1f} s): {par.stats}")
        print(par.plan.table())
    jax.distributed.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # checked here, before any process starts: each would otherwise fail alone, or hang waiting
    # for peers that never come (--processes 0)
    parser.add_argument("--processes", type=at_most(positive_int, 64, "64 processes"), default=2)
    parser.add_argument("--devices", type=at_most(positive_int, 64, "64 devices"), default=2,
                        help="CPU devices per process")
    parser.add_argument("--budget", type=positive_number, default=None, help="memory budget per device, bytes")
    parser.add_argument("--time-limit", type=seconds, default=10.0, help="the ILP's time limit, seconds")
    parser.add_argument("--cache", type=path_arg, default=None, help="rule cache directory (default: the user cache)")
    parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return launch(args, argv) if args.process_id is None else run(args)


if __name__ == "__main__":
    sys.exit(main())
