"""Beam search baseline (MetaDist Algorithm 2): visit nodes in order, extend every kept
partial assignment with every choice of the next node, keep the ``width`` cheapest.

An edge is paid when its second endpoint is chosen. Partial assignments that can no
longer fit the memory budget or break a tie are dropped: the budget is on the peak over
steps of the bytes held (choice.Liveness, as the ILP counts it), every node still to come
taking its smallest buffers. Equal costs prefer less memory.
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
    held = _Held(p)

    # Tie keys as small ints per tie; -1 = not fixed yet.
    tie_of: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
    for t_idx, t in enumerate(p.ties):
        ids: dict = {}
        for m in t.members:
            tie_of[m.node].append((t_idx, np.array([ids.setdefault(k, len(ids)) for k in m.keys])))

    assign = np.zeros((1, n), dtype=np.int64)
    cost = np.array([p.offset])
    prof, glob = held.base[None, :].copy(), np.array([p.memory_offset])
    top = prof.max(axis=1)
    keys = np.full((1, len(p.ties)), -1, dtype=np.int64)
    for step, v in enumerate(order):
        c = unary[v][None, :] + np.zeros((len(cost), 1))
        for w, m in back[v]:
            c = c + m[assign[:, w], :]
        c = c + cost[:, None]
        # the peak if every node still to come took its smallest buffers: a lower bound
        g, local = held.glob[v], held.local[v]
        if local is None:
            top_c = np.broadcast_to(top[:, None], c.shape)
        else:
            lo, hi, d = local
            top_c = np.maximum(top[:, None], (prof[:, None, lo:hi] + d[None, :, :]).max(axis=2))
        mm = glob[:, None] + g[None, :] + top_c
        ok = mm <= budget
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
        cost, keys = flat_c[pick], keys[rows].copy()
        glob, top, prof = glob[rows] + g[choice], top_c[rows, choice], prof[rows]
        if local is not None:
            prof[:, lo:hi] += d[choice]
        for t_idx, kv in tie_of[v]:
            keys[:, t_idx] = kv[choice]
    best = tuple(int(x) for x in assign[0])
    return Solution(best, p.evaluate(best), f"beam{width}", "heuristic", time.perf_counter() - start)


class _Held:
    """The problem's liveness as a beam needs it: the bytes held at each step where a peak
    may sit if every node took its smallest buffers (``base``), and per node, what each
    choice adds over that, split into a part held at every such step (``glob[v][c]``)
    and a part on a range of them (``local[v]``: lo, hi, a choices x (hi - lo) table)."""

    def __init__(self, p: ChoiceProblem):
        if p.memory_budget is None:
            # no budget: memory only breaks exact cost ties, and the bytes a plan takes at all
            # do that at a fraction of tracking every step (a beam over 10,000 nodes)
            self.base = np.zeros(1)
            self.glob = [nd.memory.astype(float) for nd in p.nodes]
            self.local = [None] * len(p.nodes)
            return
        live = p.liveness
        assert live is not None
        _, first, after = live.segments()
        peaks = np.unique(first)  # a maximum sits where something starts
        lo_all = np.searchsorted(peaks, first)
        hi_all = np.searchsorted(peaks, after)
        k = len(peaks)
        diff = np.zeros(k + 1)
        self.glob = [np.zeros(nd.size) for nd in p.nodes]
        ranges: list[list] = [[] for _ in p.nodes]
        for b, lo, hi in zip(live.buffers, lo_all.tolist(), hi_all.tolist()):
            size = np.asarray(b.size, dtype=float)
            least = float(size.min())
            diff[lo] += least
            diff[hi] -= least
            if b.node < 0 or np.ptp(size) == 0:
                continue
            if lo == 0 and hi == k:
                self.glob[b.node] = self.glob[b.node] + (size - least)
            else:
                ranges[b.node].append((lo, hi, size - least))
        self.base = np.cumsum(diff[:-1])
        self.local = []
        for v, rs in enumerate(ranges):
            if not rs:
                self.local.append(None)
                continue
            lo, hi = min(r[0] for r in rs), max(r[1] for r in rs)
            d = np.zeros((p.nodes[v].size, hi - lo))
            for a, b, extra in rs:
                d[:, a - lo:b - lo] += extra[:, None]
            self.local.append((lo, hi, d))


__all__ = ["solve_beam"]
