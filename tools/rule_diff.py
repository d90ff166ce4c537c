#!/usr/bin/env python
"""Markdown summary of rule changes between two registries, for code review.

    python tools/rule_diff.py main HEAD                  # git revisions (their registry/)
    python tools/rule_diff.py old_registry/ registry/    # registry folders
    python tools/rule_diff.py main HEAD --fail-on-loss   # exit 1 when a rule or op is lost
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metaspmd.registry_io import RegistryError
from metaspmd.rule_diff import diff, load_side, to_markdown

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="git revision or registry folder")
    parser.add_argument("head", help="git revision or registry folder")
    parser.add_argument("--fail-on-loss", action="store_true", help="exit 1 when any rule or op is lost")
    args = parser.parse_args(argv)
    try:
        base, head = load_side(args.base, ROOT), load_side(args.head, ROOT)
    except (RegistryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    d = diff(base, head)
    sys.stdout.write(to_markdown(d, args.base, args.head))
    return 1 if args.fail_on_loss and d.has_loss else 0


if __name__ == "__main__":
    sys.exit(main())
