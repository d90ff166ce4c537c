"""Sweep throughput: run a sweep into a temporary registry and report wall time, ops/s
and the per-op exploration time distribution.

    python benchmarks/sweep_bench.py --backend torch --ops 'aten.a*' --jobs 2
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

from metaspmd.sweep import DEFAULT_TIMEOUT, SweepConfig, SweepError, run_sweep, split_patterns


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="torch")
    p.add_argument("--ops", action="append", default=[], metavar="GLOB", help="comma-separated or repeated globs")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS")
    p.add_argument("--kernels", metavar="MODULE")
    p.add_argument("--slowest", type=int, default=5, help="list this many slowest ops")
    args = p.parse_args(argv)
    options = (("kernels", args.kernels),) if args.kernels else ()
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as out:
        try:
            report = run_sweep(SweepConfig(
                backend=args.backend, out_root=Path(out), patterns=split_patterns(args.ops), jobs=args.jobs,
                timeout=args.timeout, backend_options=options, progress=True,
            ))
        except SweepError as e:
            print(f"sweep_bench: error: {e}", file=sys.stderr)
            return 2
    times = [r.seconds for r in report.results]
    rows = [
        ("backend", report.backend),
        ("jobs", str(args.jobs)),
        ("ops", str(len(times))),
        ("wall time", f"{report.wall_s:.2f} s"),
        ("ops/s", f"{report.ops_per_s:.2f}"),
        ("per-op p50", f"{percentile(times, 50) * 1e3:.1f} ms"),
        ("per-op p95", f"{percentile(times, 95) * 1e3:.1f} ms"),
        ("per-op max", f"{max(times) * 1e3:.1f} ms"),
        ("sum of per-op", f"{sum(times):.2f} s"),
    ]
    counts = report.counts()
    rows += [(f"status {s}", str(n)) for s, n in sorted(counts.items())]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    slowest = sorted(report.results, key=lambda r: -r.seconds)[: args.slowest]
    if slowest:
        print("slowest: " + ", ".join(f"{r.op} {r.seconds:.2f}s" for r in slowest))
    return 0


if __name__ == "__main__":  # guard needed: spawned workers re-import this module
    sys.exit(main())
