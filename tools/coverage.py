#!/usr/bin/env python
"""How much of the torch registry has verified rules: every overload, the overloads OpInfo
samples reach, and the core ATen ops (``torch.Tag.core``), with each miss and its reason.

    python tools/coverage.py                    # table and the core ops without rules
    python tools/coverage.py --list-misses      # also every OpInfo-reached miss
    python tools/coverage.py --min-reached 95   # exit 1 below 95% of OpInfo-reached overloads

An overload counts as covered when its file's status is ``ok`` (verified rules) or
``derived`` (shape arithmetic or no tensor input, verified the same way).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from metaspmd.registry_io import RegistryError, load_registry

ROOT = Path(__file__).resolve().parent.parent
COVERED = ("ok", "derived")


def _reason(record) -> str:
    reasons = Counter(e.reason for e in record.entries if e.reason)
    return reasons.most_common(1)[0][0] if reasons else record.reason


def _is_core(catalog, name: str) -> bool:
    try:
        return catalog.is_core(catalog.resolve(name))
    except Exception:  # noqa: BLE001 - an overload torch lists but cannot resolve
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", type=Path, default=ROOT / "registry", help="registry root (default: registry/)")
    parser.add_argument("--list-misses", action="store_true", help="list every OpInfo-reached overload without rules")
    parser.add_argument("--min-reached", type=float, metavar="PCT", help="exit 1 when OpInfo-reached coverage is below PCT")
    parser.add_argument("--min-core", type=float, metavar="PCT", help="exit 1 when core-op coverage is below PCT")
    args = parser.parse_args(argv)

    from metaspmd.backends.torch import catalog
    from metaspmd.backends.torch.samples import load_index

    try:
        records = load_registry(args.registry, "torch")
    except RegistryError as e:
        print(f"coverage: error: {e}", file=sys.stderr)
        return 2
    overloads = set(catalog.all_overloads())
    reached = set(load_index()) & overloads
    core = {name for name in overloads if _is_core(catalog, name)}

    def status(name: str) -> str:
        r = records.get(name)
        return r.status if r is not None else "missing"

    def row(label: str, names: set[str]) -> tuple[str, int, int, str]:
        hit = sum(status(n) in COVERED for n in names)
        return label, len(names), hit, f"{100 * hit / max(1, len(names)):.1f}%"

    rows = [row("all overloads", overloads), row("reached by OpInfo", reached), row("core ops", core)]
    print(f"{'set':<20} {'overloads':>9} {'covered':>8} {'share':>7}")
    for label, n, hit, pct in rows:
        print(f"{label:<20} {n:>9} {hit:>8} {pct:>7}")
    print("\nstatus of OpInfo-reached misses:", dict(Counter(status(n) for n in reached if status(n) not in COVERED)))

    shown = sorted(core | reached) if args.list_misses else sorted(core)
    misses = [n for n in shown if status(n) not in COVERED]
    if misses:
        print(f"\n{'op':<48} {'status':<16} reason")
        for n in misses:
            print(f"{n:<48} {status(n):<16} {_reason(records[n]) if n in records else ''}"[:200])
    failed = (args.min_reached is not None and 100 * rows[1][2] / max(1, rows[1][1]) < args.min_reached) or (
        args.min_core is not None and 100 * rows[2][2] / max(1, rows[2][1]) < args.min_core)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
