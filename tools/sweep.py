"""`metaspmd sweep`: the same command (metaspmd/cli.py); `--help` lists its options."""
import sys
from metaspmd.cli import sweep
if __name__ == "__main__":  # guard needed: spawned workers re-import the main module
    sys.exit(sweep())
