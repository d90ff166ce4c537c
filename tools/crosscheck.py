"""Cross-check a backend's rules against its framework's own sharding rules.

    python tools/crosscheck.py --backend jax --ops 'jax.dot_general,jax.add'
    python tools/crosscheck.py --backend torch

Dispatches to ``metaspmd.backends.<backend>.crosscheck.main(argv)`` with the remaining
arguments; rules are read from the repository's registry unless ``--registry`` says
otherwise. The backend module must not be imported before it runs: the jax check asks
XLA for several CPU devices, which only works before jax starts.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

REGISTRY = Path(__file__).resolve().parent.parent / "registry"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False,
                                epilog="--backend NAME --help lists the backend's own options.")
    p.add_argument("--backend", required=True, help="torch or jax (module metaspmd.backends.<name>.crosscheck)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if not any(a == "--backend" or a.startswith("--backend=") for a in argv) and {"-h", "--help"} & set(argv):
        p.print_help()
        return 0
    args, rest = p.parse_known_args(argv)
    try:
        module = importlib.import_module(f"metaspmd.backends.{args.backend}.crosscheck")
    except ModuleNotFoundError as e:
        print(f"crosscheck: no cross-check for backend {args.backend!r} ({e})", file=sys.stderr)
        return 2
    if not any(a == "--registry" or a.startswith("--registry=") for a in rest) and "-h" not in rest and "--help" not in rest:
        rest += ["--registry", str(REGISTRY)]
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
