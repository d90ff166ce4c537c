"""The full jax sweep, cold and then warm from jax's persistent compilation cache.

Exploring compiles one small XLA executable per primitive, params and shard shape, so
compile time dominates. Both runs write into temporary registries; the second run reuses
the first run's cache directory. Reports wall time, ops/s and per-op p50/p95 for each.

    python benchmarks/jax_sweep_bench.py --jobs 2
    python benchmarks/jax_sweep_bench.py --ops 'jax.dot_general,jax.add' --runs cold
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's metaspmd, not the one installed

from metaspmd.cli import ops_given, pipe_safe, positive_int, seconds
from metaspmd.sweep import SweepConfig, SweepError, run_sweep, split_patterns


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else float("nan")


def one_run(label: str, args, cache: str) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="jax-sweep-bench-") as out:
        report = run_sweep(SweepConfig(
            backend="jax", out_root=Path(out), patterns=split_patterns(args.ops), jobs=args.jobs,
            timeout=args.timeout, backend_options=(("compile_cache", cache),), progress=False,
        ))
    times = [r.seconds for r in report.results]
    explored = [r.seconds for r in report.results if r.status not in ("skipped", "nondeterministic")]
    slowest = sorted(report.results, key=lambda r: -r.seconds)[:5]
    counts = report.counts()
    return [
        (f"{label} wall time", f"{report.wall_s:.1f} s"),
        (f"{label} ops/s", f"{report.ops_per_s:.2f}"),
        (f"{label} per-op p50 (explored ops)", f"{percentile(explored, 50):.2f} s"),
        (f"{label} per-op p95 (explored ops)", f"{percentile(explored, 95):.2f} s"),
        (f"{label} per-op max", f"{max(times):.2f} s" if times else "-"),
        (f"{label} statuses", ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))),
        (f"{label} slowest", ", ".join(f"{r.op} {r.seconds:.1f}s" for r in slowest)),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", action="append", default=[], metavar="GLOB",
                   help="comma-separated or repeated globs (default: every primitive)")
    p.add_argument("--jobs", "-j", type=positive_int, default=os.cpu_count() or 1,
                   help="worker processes (default: one per core)")
    p.add_argument("--timeout", type=seconds, default=120.0, metavar="SECONDS",
                   help="CPU seconds per primitive, as the sweep's --timeout (default 120)")
    p.add_argument("--runs", choices=("cold", "both"), default="both",
                   help="cold only, or cold then warm (default both)")
    args = p.parse_args(argv)
    ops_given(p, args.ops, split_patterns(args.ops))  # --ops '' is an error, not the full sweep
    rows = [("jobs", str(args.jobs))]
    with tempfile.TemporaryDirectory(prefix="jax-compile-cache-") as cache:
        try:
            rows += one_run("cold", args, cache)
            if args.runs == "both":
                rows += one_run("warm", args, cache)
        except SweepError as e:
            print(f"jax_sweep_bench: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # the pool has stopped its workers; the registries were temporary
            print("jax_sweep_bench: interrupted", file=sys.stderr)
            return 130
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0


if __name__ == "__main__":  # guard needed: spawned workers re-import this module
    sys.exit(pipe_safe(main)())  # `| head` ends it quietly
