"""Sweep throughput: run a sweep into a temporary registry and report wall time, ops/s
and the per-op exploration time distribution.

    python benchmarks/sweep_bench.py --backend torch --ops 'aten.a*' --jobs 2
    python benchmarks/sweep_bench.py --backend torch --ops 'aten.a*' --loaded   # quiet vs loaded

--loaded sweeps the ops twice, once on a quiet machine and once with busy processes on
every core (--hogs), and says whether the two registries are byte-identical: the time
limit counts CPU time, so a loaded machine must not change a sweep's result. For a built-in
backend it also compares both with the committed registry (registry/<backend>/).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's metaspmd, not the one installed

from metaspmd.cli import ops_given, pipe_safe, positive_int, refuse_unused, seconds, whole_number
from metaspmd.sweep import DEFAULT_TIMEOUT, SweepConfig, SweepError, run_sweep, split_patterns


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def registry_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.yaml"))}


COMMITTED = Path(__file__).resolve().parents[1] / "registry"


def differing(got: dict[str, bytes], want: dict[str, bytes]) -> list[str]:
    return sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))


def loaded(config: SweepConfig, hogs: int) -> int:
    """Sweep twice, quiet then with ``hogs`` busy processes, and compare the registries."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        for name, n in (("quiet", 0), ("loaded", hogs)):
            out = Path(tmp) / name
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
            try:
                time.sleep(0.5 if n else 0)  # let the load settle
                load = os.getloadavg()[0]
                report = run_sweep(dataclasses.replace(config, out_root=out))
                load = max(load, os.getloadavg()[0])
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
            runs.append((name, n, load, report, registry_files(out)))
    width = 8
    print(f"{'run':<{width}} {'hogs':>4} {'load':>5} {'ops':>5} {'wall s':>8} {'timed out':>9}  statuses")
    for name, n, load, report, _ in runs:
        statuses = ", ".join(f"{s} {c}" for s, c in sorted(report.counts().items()))
        print(f"{name:<{width}} {n:>4} {load:>5.1f} {len(report.results):>5} {report.wall_s:>8.1f} "
              f"{len(report.timed_out()):>9}  {statuses}")
    (_, _, _, _, quiet), (_, _, _, _, busy) = runs
    differ = differing(quiet, busy)
    print(f"registries byte-identical: {'yes' if not differ else 'no'} ({len(quiet)} files quiet, {len(busy)} loaded)")
    for name in differ[:20]:
        print(f"  differs: {name}")
    if not config.backend_options:  # the committed files of the ops swept
        swept = quiet.keys() | busy.keys()
        committed = {k: v for k, v in registry_files(COMMITTED).items() if k in swept}
        for name, files in (("quiet", quiet), ("loaded", busy)):
            stale = differing(files, committed)
            print(f"{name} run equals the committed registry: {'yes' if not stale else 'no'} "
                  f"({len(files) - len(stale)} of {len(files)} files)")
            for path in stale[:20]:
                print(f"  differs: {path}")
    return 0 if not differ else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="torch", help="torch, jax or tvm (default torch)")
    p.add_argument("--ops", action="append", default=[], metavar="GLOB", help="comma-separated or repeated globs")
    p.add_argument("--jobs", "-j", type=positive_int, default=os.cpu_count() or 1,
                   help="worker processes (default: one per core)")
    p.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"CPU seconds per op, as the sweep's --timeout (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--kernels", metavar="MODULE",
                   help="sweep a module of your own ops instead, as the sweep's --kernels")
    p.add_argument("--slowest", type=whole_number, default=5, help="list this many slowest ops")
    p.add_argument("--loaded", action="store_true",
                   help="sweep twice, quiet and with every core busy, and compare the registries")
    p.add_argument("--hogs", type=positive_int, default=4 * (os.cpu_count() or 1), metavar="N",
                   help="busy processes for --loaded's second run (default: 4 per core)")
    args = p.parse_args(argv)
    refuse_unused(p, args, {} if args.loaded else {"--hogs": "needs --loaded"})
    ops_given(p, args.ops, split_patterns(args.ops))  # --ops '' is an error, not every op
    if args.kernels is not None and not args.kernels.strip():
        p.error(f"--kernels {args.kernels!r} names no module")  # not the built-in ops
    if args.kernels is not None and args.backend == "jax":
        p.error("--kernels takes torch custom ops or TVM TE kernels; the jax backend sweeps jax's own primitives only")
    try:
        return run(args)
    except KeyboardInterrupt:  # the pool has stopped its workers; the registries were temporary
        print("sweep_bench: interrupted", file=sys.stderr)
        return 130


def run(args) -> int:
    options = (("kernels", args.kernels),) if args.kernels else ()
    if args.loaded:
        try:
            return loaded(SweepConfig(backend=args.backend, out_root=Path("."), patterns=split_patterns(args.ops),
                                      jobs=args.jobs, timeout=args.timeout, backend_options=options), args.hogs)
        except SweepError as e:
            print(f"sweep_bench: error: {e}", file=sys.stderr)
            return 2
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
    sys.exit(pipe_safe(main)())  # `| head` ends it quietly
