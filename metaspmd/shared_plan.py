"""What the planning process hands every other process: its plan, or the error that stopped
it, so that a failed solve raises on every process instead of leaving the others waiting.
Runtime backends send it with their own collectives (``RuntimeBackend.one_plan``)."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any

from .ir import MetaIR
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


def graph_key(ir: MetaIR) -> str:
    """A digest of the graph a process captured (its inputs' and ops' shapes and dtypes):
    the processes that share one plan must all hold this graph, or each runs the plan of
    another graph and their collectives disagree."""
    values = [(v.shape, str(v.dtype)) for v in ir.input_list]
    values += [(op.op, tuple((v.shape, str(v.dtype)) for v in op.outputs)) for op in ir.op_list]
    return hashlib.sha256(repr(values).encode()).hexdigest()


def other_graph_error(differs_here: bool, planner: str) -> PlannerError:
    """What every process raises where the processes captured different graphs; ``planner``
    names the one that plans ('rank 0', 'process 0')."""
    where = ("this process captured another graph than" if differs_here
             else "another process captured another graph than")
    return PlannerError(f"{where} the one that plans for all ({planner}): their example inputs differ "
                        "in shape or dtype. Every process passes the same global inputs (each gets its shard of "
                        "them), so the processes capture one graph and run one plan")


def _portable(error: Exception) -> Exception:
    """``error``, or a PlannerError saying the same where it does not survive pickling (a
    process that cannot unpickle it would fail alone)."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return PlannerError(f"{type(error).__name__}: {error}")


__all__ = ["Outcome", "graph_key", "other_graph_error", "outcome_plan", "solve_outcome"]
