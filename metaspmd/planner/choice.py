"""The abstract planning problem: pick one choice per node to minimise unary plus pairwise
costs, under a memory budget and tie constraints. Solvers (ILP, beam) and graph reductions
work on this form only; problem.py builds it from a MetaIR.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

# Relative slack when checking a memory budget, so float sums do not flip feasibility.
MEMORY_RTOL = 1e-9


@dataclass(frozen=True, eq=False)
class ChoiceNode:
    """A node with ``len(labels)`` choices, each with a unary cost and a memory use.

    ``signature`` is equal for nodes that are interchangeable (same op, shapes and choices);
    ``follower`` marks shape-preserving ops that may follow their producer's choice.
    """

    name: str
    labels: tuple[str, ...]
    cost: np.ndarray
    memory: np.ndarray
    signature: Hashable = ""
    follower: bool = False

    def __post_init__(self) -> None:
        n = len(self.labels)
        if n == 0:
            raise ValueError(f"node {self.name} has no choices")
        if self.cost.shape != (n,) or self.memory.shape != (n,):
            raise ValueError(f"node {self.name}: cost/memory must have one entry per choice")

    @property
    def size(self) -> int:
        return len(self.labels)


@dataclass(frozen=True, eq=False)
class Factor:
    """One additive term of an edge cost: ``table[rows[choice of u], cols[choice of v]]``.

    Resharding on a 2-D mesh is a sum of per-axis terms, each depending on a coarse view
    of the two placements; the ILP links such small tables instead of the full matrix.
    """

    rows: np.ndarray
    cols: np.ndarray
    table: np.ndarray

    def dense(self) -> np.ndarray:
        return self.table[np.ix_(self.rows, self.cols)]

    def transpose(self) -> "Factor":
        return Factor(self.cols, self.rows, self.table.T)


@dataclass(frozen=True, eq=False)
class ChoiceEdge:
    """Pairwise cost ``cost[choice of u, choice of v]`` (u produces, v consumes).
    ``factors``, when given, sum to ``cost`` exactly."""

    u: int
    v: int
    cost: np.ndarray
    label: Hashable = ""
    factors: tuple[Factor, ...] = ()


@dataclass(frozen=True)
class TieMember:
    node: int
    keys: tuple[Hashable, ...]  # per choice of the node, the value members must agree on


@dataclass(frozen=True)
class Tie:
    """All members must pick choices with the same key (a parameter and its gradient
    share a placement)."""

    members: tuple[TieMember, ...]


@dataclass(frozen=True, eq=False)
class ChoiceProblem:
    nodes: tuple[ChoiceNode, ...]
    edges: tuple[ChoiceEdge, ...] = ()
    ties: tuple[Tie, ...] = ()
    memory_budget: float | None = None
    offset: float = 0.0  # cost of parts already decided (reductions remove them)
    memory_offset: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.nodes)
        for e in self.edges:
            if not (0 <= e.u < n and 0 <= e.v < n):
                raise ValueError(f"edge {e.label} refers to a missing node")
            if e.cost.shape != (self.nodes[e.u].size, self.nodes[e.v].size):
                raise ValueError(f"edge {e.label}: cost shape {e.cost.shape} does not match its nodes")
        for t in self.ties:
            for m in t.members:
                if len(m.keys) != self.nodes[m.node].size:
                    raise ValueError("tie keys must have one entry per choice")

    def __len__(self) -> int:
        return len(self.nodes)

    def evaluate(self, a: Sequence[int]) -> float:
        total = self.offset + sum(float(n.cost[c]) for n, c in zip(self.nodes, a))
        return total + sum(float(e.cost[a[e.u], a[e.v]]) for e in self.edges)

    def memory(self, a: Sequence[int]) -> float:
        return self.memory_offset + sum(float(n.memory[c]) for n, c in zip(self.nodes, a))

    def ties_hold(self, a: Sequence[int]) -> bool:
        return all(len({m.keys[a[m.node]] for m in t.members}) == 1 for t in self.ties)

    def within_budget(self, a: Sequence[int]) -> bool:
        if self.memory_budget is None:
            return True
        return self.memory(a) <= self.memory_budget * (1 + MEMORY_RTOL)

    def feasible(self, a: Sequence[int]) -> bool:
        return (
            len(a) == len(self.nodes)
            and all(0 <= c < n.size for n, c in zip(self.nodes, a))
            and self.ties_hold(a)
            and self.within_budget(a)
        )


@dataclass(frozen=True)
class Solution:
    """A solver's answer: one choice per node, its cost and how it was found."""

    assignment: tuple[int, ...]
    cost: float
    solver: str
    status: str  # 'optimal', 'feasible' (time limit hit), 'heuristic'
    seconds: float
    bound: float | None = None  # proven lower bound on the cost, when the solver gives one


class Infeasible(ValueError):
    """No assignment satisfies the memory budget and the ties."""


__all__ = [
    "ChoiceEdge", "ChoiceNode", "ChoiceProblem", "Factor", "Infeasible", "MEMORY_RTOL", "Solution", "Tie", "TieMember",
]
