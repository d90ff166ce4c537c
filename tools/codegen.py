#!/usr/bin/env python
"""Write the static rule tables in generated/ from the registry (jinja2 templates).

    python tools/codegen.py                 # every backend with a table: torch, jax
    python tools/codegen.py --check         # exit 1 if generated/ is stale (CI)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metaspmd.codegen.generator import TARGETS, generate
from metaspmd.registry_io import RegistryError

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=sorted(TARGETS) + ["all"], default="all")
    parser.add_argument("--registry", type=Path, default=ROOT / "registry", help="registry root (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "generated", help="output folder (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated file is stale")
    args = parser.parse_args(argv)
    backends = sorted(TARGETS) if args.backend == "all" else [args.backend]
    stale = []
    for backend in backends:
        try:
            text = generate(args.registry, backend)
        except RegistryError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        path = args.out / TARGETS[backend]
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            print(f"{path.name}: up to date")
            continue
        if args.check:
            stale.append(path.name)
            print(f"{path.name}: STALE (run tools/codegen.py)")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"{path.name}: written ({len(text.splitlines())} lines)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
