"""Explore every op of a backend and write its rule files (registry/<backend>/<op>.yaml).

    python tools/sweep.py --backend torch --ops 'aten.mm*,aten.add.*' --jobs 2
    python tools/sweep.py --backend torch --check      # exit 1 when the registry is stale

Exit status: 0 done (op failures are recorded, not errors), 1 --check found differences,
2 usage error (unknown backend, no op matched), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from metaspmd.sweep import (
    DEFAULT_TIMEOUT, SweepConfig, SweepError, format_changes, format_summary, run_sweep, split_patterns, timings_json,
)

REGISTRY = Path(__file__).resolve().parent.parent / "registry"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--backend", required=True,
                   help="torch, jax, tvm (module metaspmd.backends.<name>), or a dotted module path with get_backend()")
    p.add_argument("--ops", action="append", default=[], metavar="GLOB",
                   help="only ops matching these globs (comma-separated or repeated); default: all")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPU count)")
    p.add_argument("--out", type=Path, default=REGISTRY, help="registry root (default: the repository's registry/)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; list ops whose file would change and exit 1 if any")
    p.add_argument("--resume", action="store_true", help="skip ops whose file exists and loads cleanly")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"per-op time limit; the op's worker is killed past it (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--kernels", metavar="MODULE",
                   help="a module (dotted name or .py file) of ops to sweep instead of the built-in ones: "
                        "TE kernels (tvm) or custom ops (torch)")
    p.add_argument("--timings", type=Path, metavar="FILE", help="write per-op exploration times here (json)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--worker-output", action="store_true",
                   help="let workers print to stderr (hidden by default: framework warnings bury the progress bar)")
    return p.parse_args(argv)


def _stop_on_sigterm(signum, frame):
    # a CI time limit or `timeout` stops the sweep as Ctrl-C does: the workers are killed
    # and only complete files remain
    raise KeyboardInterrupt(signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    options = (("kernels", args.kernels),) if args.kernels else ()
    try:
        config = SweepConfig(
            backend=args.backend, out_root=args.out, patterns=split_patterns(args.ops), jobs=args.jobs,
            timeout=args.timeout, check=args.check, resume=args.resume, backend_options=options,
            progress=not args.no_progress, worker_output=args.worker_output,
        )
        report = run_sweep(config)
    except SweepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("sweep: interrupted; files written so far are complete", file=sys.stderr)
        return 128 + signal.SIGTERM if e.args == (signal.SIGTERM,) else 130
    if args.timings:
        args.timings.write_text(timings_json(report, args.jobs), encoding="utf-8")
    if args.check and report.changes():
        print(format_changes(report))
    print(format_summary(report))
    if args.check:
        n = len(report.changes())
        print(f"check: {n} file(s) would change" if n else "check: registry is up to date")
        return 1 if n else 0
    return 0


if __name__ == "__main__":  # guard needed: spawned workers re-import this module
    sys.exit(main())
