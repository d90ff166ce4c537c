"""`metaspmd sweep`: the same command (metaspmd/cli.py); `--help` lists its options."""
import sys
from metaspmd.cli import sweep
from metaspmd.cli import REGISTRY  # noqa: F401 - the default --out, named here for readers and tests
if __name__ == "__main__":  # guard needed: spawned workers re-import the main module
    sys.exit(sweep())
