"""The sweep engine: explore every op of a backend in isolated worker processes and keep
the registry in step with the results.

The engine imports no framework: workers load the backend by module name, so a framework
is imported only where ops run, and an op that hangs or crashes its worker is recorded as
'failed' with the reason while the sweep goes on.

- ``config``: SweepConfig, finding the backend and selecting ops
- ``failures``: one-line, machine-independent failure reasons
- ``workers``: the worker processes and the pool that runs them
- ``engine``: run_sweep, writing or checking registry files
- ``report``: the summary table and timings
"""

from .config import (
    DEFAULT_EXPLORER, DEFAULT_TIMEOUT, SweepConfig, SweepError, backend_module, load_backend, nearest_ops,
    select_ops, split_patterns, unmatched_patterns,
)
from .engine import OpResult, SweepInterrupted, SweepReport, SweepWriteFailed, run_sweep
from .failures import clean_reason, describe_exception, describe_exit, failed_record
from .report import format_changes, format_summary, timings_json
from .workers import Outcome, WorkerPool

__all__ = [
    "DEFAULT_EXPLORER", "DEFAULT_TIMEOUT", "OpResult", "Outcome", "SweepConfig", "SweepError",
    "SweepInterrupted", "SweepReport", "SweepWriteFailed", "WorkerPool", "backend_module", "clean_reason", "describe_exception",
    "describe_exit", "failed_record", "format_changes", "format_summary", "load_backend",
    "nearest_ops", "run_sweep", "select_ops", "split_patterns", "timings_json", "unmatched_patterns",
]
