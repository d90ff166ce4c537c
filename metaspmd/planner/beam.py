"""Beam search baseline (MetaDist Algorithm 2): visit nodes in order, extend every kept
partial assignment with every choice of the next node, keep the ``width`` cheapest.

An edge is paid when its second endpoint is chosen. Partial assignments that can no
longer fit the memory budget (even with the smallest choices for the rest) or break a
tie are dropped; equal costs prefer less memory.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .choice import ChoiceProblem, Infeasible, MEMORY_RTOL, Solution


def solve_beam(p: ChoiceProblem, width: int = 8, order: Sequence[int] | None = None) -> Solution:
    if width < 1:
        raise ValueError("beam width must be >= 1")
    start = time.perf_counter()
    n = len(p.nodes)
    order = list(range(n)) if order is None else list(order)
    if sorted(order) != list(range(n)):
        raise ValueError("order must list every node once")
    position = {v: k for k, v in enumerate(order)}

    unary = [nd.cost.astype(float).copy() for nd in p.nodes]
    back: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]  # (earlier node w, cost[c_w, c_v])
    for e in p.edges:
        if e.u == e.v:
            unary[e.u] += np.diagonal(e.cost)
        elif position[e.u] < position[e.v]:
            back[e.v].append((e.u, e.cost))
        else:
            back[e.u].append((e.v, e.cost.T))

    budget = np.inf if p.memory_budget is None else p.memory_budget * (1 + MEMORY_RTOL)
    min_mem = np.array([float(p.nodes[v].memory.min()) for v in order])
    rest = np.concatenate([np.cumsum(min_mem[::-1])[::-1][1:], [0.0]])  # least memory still to come

    # Tie keys as small ints per tie; -1 = not fixed yet.
    tie_of: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
    for t_idx, t in enumerate(p.ties):
        ids: dict = {}
        for m in t.members:
            tie_of[m.node].append((t_idx, np.array([ids.setdefault(k, len(ids)) for k in m.keys])))

    assign = np.zeros((1, n), dtype=np.int64)
    cost = np.array([p.offset])
    mem = np.array([p.memory_offset])
    keys = np.full((1, len(p.ties)), -1, dtype=np.int64)
    for step, v in enumerate(order):
        c = unary[v][None, :] + np.zeros((len(cost), 1))
        for w, m in back[v]:
            c = c + m[assign[:, w], :]
        c = c + cost[:, None]
        mm = mem[:, None] + p.nodes[v].memory[None, :]
        ok = mm + rest[step] <= budget
        for t_idx, kv in tie_of[v]:
            fixed = keys[:, t_idx][:, None]
            ok &= (fixed < 0) | (fixed == kv[None, :])
        if not ok.any():
            raise Infeasible(f"beam search: no partial assignment survives node {p.nodes[v].name}")
        flat_c = np.where(ok, c, np.inf).ravel()
        pick = np.lexsort((mm.ravel(), flat_c))[: min(width, int(ok.sum()))]
        rows, choice = np.divmod(pick, p.nodes[v].size)
        assign = assign[rows].copy()
        assign[:, v] = choice
        cost, mem, keys = flat_c[pick], mm.ravel()[pick], keys[rows].copy()
        for t_idx, kv in tie_of[v]:
            keys[:, t_idx] = kv[choice]
    best = tuple(int(x) for x in assign[0])
    return Solution(best, p.evaluate(best), f"beam{width}", "heuristic", time.perf_counter() - start)


__all__ = ["solve_beam"]
