"""What the planning process hands every other process: its plan, or the error that stopped
it, so that a failed solve raises on every process instead of leaving the others waiting.
Runtime backends send it with their own collectives (``RuntimeBackend.one_plan``)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from .planner import Plan, PlannerError

Outcome = tuple[str, Any]  # ("plan", Plan) or ("raised", Exception)


def solve_outcome(solve: Callable[[], Plan]) -> Outcome:
    try:
        return ("plan", solve())
    except Exception as e:  # any error: every process raises it
        return ("raised", _portable(e))


def outcome_plan(outcome: Outcome) -> Plan:
    kind, value = outcome
    if kind == "raised":
        raise value
    return value


def _portable(error: Exception) -> Exception:
    """``error``, or a PlannerError saying the same where it does not survive pickling (a
    process that cannot unpickle it would fail alone)."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return PlannerError(f"{type(error).__name__}: {error}")


__all__ = ["Outcome", "outcome_plan", "solve_outcome"]
