#!/usr/bin/env python
"""`metaspmd diff`: the same command (metaspmd/cli.py); `--help` lists its options."""
import sys
from pathlib import Path

# this checkout's metaspmd first: from a clone, not the one installed editable (cli maps
# its backends/, codegen/ and generated/ too)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from metaspmd.cli import diff
if __name__ == "__main__":  # guard needed: spawned workers re-import the main module
    sys.exit(diff())
