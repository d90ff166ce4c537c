"""The abstract planning problem: pick one choice per node to minimise unary plus pairwise
costs, under a memory budget and tie constraints. Solvers (ILP, beam) and graph reductions
work on this form only; problem.py builds it from a MetaIR.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
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
class Buffer:
    """A value held in device memory from step ``start`` to step ``end`` (both included):
    ``size[c]`` bytes per device when node ``node`` takes choice ``c``; a constant
    ``size[0]`` when ``node`` is -1 (its owner is decided). ``kind`` groups the peak's
    breakdown ('parameter', 'gradient', 'activation', 'input')."""

    node: int
    size: np.ndarray
    start: int
    end: int
    kind: str = "activation"

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"buffer of node {self.node} ends (step {self.end}) before it starts ({self.start})")

    def at(self, a: Sequence[int]) -> float:
        return float(self.size[0 if self.node < 0 else a[self.node]])


@dataclass(frozen=True, eq=False)
class Liveness:
    """Which buffers are held at which step. Memory is the peak over steps of the sum of
    the buffers held; a step's sum is linear in the choices, so the ILP keeps one row per
    step where the held set grows (a maximum sits only there)."""

    buffers: tuple[Buffer, ...]
    steps: int

    def __post_init__(self) -> None:
        for b in self.buffers:
            if not 0 <= b.start <= b.end < self.steps:
                raise ValueError(f"buffer of node {b.node} lives outside steps 0..{self.steps - 1}")

    @cached_property
    def _flat(self) -> tuple[np.ndarray, ...]:
        """Every size in one array, each buffer's first index, owner, start and end + 1."""
        sizes = [np.asarray(b.size, dtype=float).reshape(-1) for b in self.buffers]
        base = np.cumsum([0] + [len(x) for x in sizes])[:-1].astype(np.int64)
        flat = np.concatenate(sizes) if sizes else np.zeros(0)
        node = np.array([b.node for b in self.buffers], dtype=np.int64)
        start = np.array([b.start for b in self.buffers], dtype=np.int64)
        after = np.array([b.end + 1 for b in self.buffers], dtype=np.int64)
        return flat, base, node, start, after

    def sizes(self, a: Sequence[int]) -> np.ndarray:
        """Each buffer's bytes under assignment ``a``."""
        flat, base, node, _, _ = self._flat
        if not len(node):
            return np.zeros(0)
        choice = np.where(node < 0, 0, np.asarray(a, dtype=np.int64)[np.maximum(node, 0)] if len(a) else 0)
        return flat[base + choice]

    def profile(self, a: Sequence[int]) -> np.ndarray:
        """Bytes per device held at each step."""
        _, _, _, start, after = self._flat
        s = self.sizes(a)
        diff = np.bincount(start, s, self.steps + 1) - np.bincount(after, s, self.steps + 1)
        return np.cumsum(diff[:-1])

    def floor(self) -> float:
        """A lower bound on every assignment's peak: each buffer at its least size."""
        _, _, _, start, after = self._flat
        least = np.array([float(np.min(b.size)) for b in self.buffers])
        if not len(least):
            return 0.0
        diff = np.bincount(start, least, self.steps + 1) - np.bincount(after, least, self.steps + 1)
        return float(np.max(np.cumsum(diff[:-1])))

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The steps where the held set changes (``bounds``, ascending, the first 0), and
        per buffer the segment it starts in and the one after it ends (len(bounds) when it
        lives to the last step). A peak is in a segment that some buffer starts."""
        starts = np.array([b.start for b in self.buffers], dtype=np.int64)
        after = np.array([b.end + 1 for b in self.buffers], dtype=np.int64)
        bounds = np.unique(np.concatenate([[0], starts, after[after < self.steps]]))
        return bounds, np.searchsorted(bounds, starts), np.searchsorted(bounds, after)

    def remap(self, how: Sequence[tuple[int, np.ndarray | None]]) -> "Liveness":
        """The buffers after a reduction: ``how[i]`` = (new node, table) for old node i, the
        new owner's choice giving the old one through ``table`` (None: the same choice);
        new node -1 with a 0-d table for a decided node."""
        out = []
        for b in self.buffers:
            if b.node < 0:
                out.append(b)
                continue
            node, table = how[b.node]
            size = b.size if table is None else b.size[np.asarray(table)].reshape(-1)
            out.append(Buffer(node, size, b.start, b.end, b.kind))
        return Liveness(tuple(out), self.steps)


@dataclass(frozen=True, eq=False)
class ChoiceProblem:
    """``liveness``: when memory is held (build_problem gives one); without it every node's
    ``memory`` is held at once, in one step."""

    nodes: tuple[ChoiceNode, ...]
    edges: tuple[ChoiceEdge, ...] = ()
    ties: tuple[Tie, ...] = ()
    memory_budget: float | None = None
    offset: float = 0.0  # cost of parts already decided (reductions remove them)
    memory_offset: float = 0.0  # bytes held at every step by parts already decided
    liveness: Liveness | None = None

    def __post_init__(self) -> None:
        n = len(self.nodes)
        if self.liveness is None:
            live = Liveness(tuple(Buffer(i, nd.memory, 0, 0) for i, nd in enumerate(self.nodes)), 1)
            object.__setattr__(self, "liveness", live)
        for b in self.liveness.buffers:  # type: ignore[union-attr]
            want = 1 if b.node < 0 else self.nodes[b.node].size if b.node < n else -1
            if len(b.size) != want:
                raise ValueError(f"a buffer does not match its node {b.node}")
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
        """Peak bytes per device over the steps."""
        return self.memory_offset + float(self.liveness.profile(a).max())  # type: ignore[union-attr]

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
    "Buffer", "ChoiceEdge", "ChoiceNode", "ChoiceProblem", "Factor", "Infeasible", "Liveness", "MEMORY_RTOL",
    "Solution", "Tie", "TieMember",
]
