"""Fixtures: random small planning problems and an exhaustive solver to check planners against."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from metaspmd.planner.choice import (
    Buffer, ChoiceEdge, ChoiceNode, ChoiceProblem, Factor, Infeasible, Liveness, Tie, TieMember,
)


def random_liveness(rng: np.random.Generator, nodes, steps: int = 5) -> Liveness:
    """One or two buffers per node, held over random step ranges, and a decided one."""
    buffers = []
    for i, n in enumerate(nodes):
        for _ in range(int(rng.integers(1, 3))):
            a, b = sorted(rng.integers(0, steps, 2).tolist())
            buffers.append(Buffer(i, rng.integers(1, 10, n.size).astype(float), a, b))
    buffers.append(Buffer(-1, np.array([3.0]), int(rng.integers(0, steps)), steps - 1))
    return Liveness(tuple(buffers), steps)


def random_problem(rng: np.random.Generator, n_nodes: int, budget: bool = False, ties: bool = False,
                   factors: bool = False, max_size: int = 4, live: bool = False) -> ChoiceProblem:
    sizes = rng.integers(1, max_size + 1, n_nodes)
    nodes = tuple(
        ChoiceNode(f"n{i}", tuple(f"c{c}" for c in range(s)),
                   np.where(rng.random(s) < 0.3, 0.0, rng.random(s)), rng.integers(1, 10, s).astype(float))
        for i, s in enumerate(sizes)
    )
    edges = []
    for u, v in itertools.combinations(range(n_nodes), 2):
        if rng.random() < 0.6:
            if rng.random() < 0.3:
                u, v = v, u
            if factors:
                fs = []
                for _ in range(2):
                    rows = rng.integers(0, 2, sizes[u])
                    cols = rng.integers(0, 3, sizes[v])
                    fs.append(Factor(rows, cols, rng.random((2, 3)) * (rng.random((2, 3)) < 0.7)))
                edges.append(ChoiceEdge(u, v, sum(f.dense() for f in fs), (u, v), tuple(fs)))
            else:
                m = rng.random((sizes[u], sizes[v])) * (rng.random((sizes[u], sizes[v])) < 0.7)
                edges.append(ChoiceEdge(u, v, m, (u, v)))
    tie_list = []
    if ties:
        a, b = rng.choice(n_nodes, 2, replace=False)
        tie_list.append(Tie((TieMember(int(a), tuple(int(k) for k in rng.integers(0, 2, sizes[a]))),
                             TieMember(int(b), tuple(int(k) for k in rng.integers(0, 2, sizes[b]))))))
    liveness = random_liveness(rng, nodes) if live else None
    mem_budget = None
    if budget:
        if liveness is None:
            lo = sum(n.memory.min() for n in nodes)
            hi = sum(n.memory.max() for n in nodes)
        else:  # the peaks of every node's smallest and largest buffers
            least = Liveness(tuple(Buffer(-1, b.size.min(keepdims=True), b.start, b.end) for b in liveness.buffers),
                             liveness.steps)
            most = Liveness(tuple(Buffer(-1, b.size.max(keepdims=True), b.start, b.end) for b in liveness.buffers),
                            liveness.steps)
            lo, hi = least.profile(()).max(), (least.profile(()).max() + most.profile(()).max()) / 2
        mem_budget = float(lo + rng.random() * (hi - lo))
    return ChoiceProblem(nodes, tuple(edges), tuple(tie_list), mem_budget, liveness=liveness)


def brute_force(p: ChoiceProblem) -> tuple[float, tuple[int, ...]]:
    best = (np.inf, ())
    for a in itertools.product(*(range(n.size) for n in p.nodes)):
        if p.feasible(a):
            c = p.evaluate(a)
            if c < best[0]:
                best = (c, a)
    if not best[1] and p.nodes:
        raise Infeasible("brute force: nothing feasible")
    return best


@pytest.fixture
def make_problem():
    return random_problem


@pytest.fixture(name="brute_force")
def brute_force_fixture():
    return brute_force
