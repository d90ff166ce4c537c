"""Graph reductions that shrink a ChoiceProblem before solving, and map solutions back.

- ``eliminate_fixed`` (exact): a node with one choice becomes constants; its edges turn
  into unary costs of its neighbours.
- ``merge_followers`` (heuristic, as in Alpa): a shape-preserving op whose only producer
  is one node takes, for each choice of that producer, its cheapest response; it then
  disappears into the producer.
- ``tie_identical`` (heuristic): nodes with the same structure ``depth`` hops around them
  (Weisfeiler-Lehman colours over signatures, costs and edges) share one choice, so the
  layers of a deep model are planned once. Nodes near the graph's ends keep their own.
- ``eliminate_chains`` (exact): variable elimination of nodes with at most two
  neighbours (transposes, parameters, elementwise links): the neighbours get the best
  cost through the node for each pair of their choices. Skipped for nodes in hard ties
  and, under a memory budget, for nodes whose memory depends on their choice.

Each step returns the smaller problem and, for every node of its input, an ``Origin``
saying how to recover that node's choice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .choice import ChoiceEdge, ChoiceNode, ChoiceProblem, Factor, Liveness, Tie, TieMember
from .ilp import link_size

# Costs this close count as equal when a follower or an eliminated node picks its choice.
_COST_RTOL = 1e-12


@dataclass(frozen=True, eq=False)
class Origin:
    """How one node's choice is recovered: ``ref >= 0``: the choice of reduced node
    ``ref``; otherwise ``table[choices of refs]`` (a 0-d table for a fixed choice), where
    ``refs`` are nodes of the same input problem still present when this one was
    eliminated. Resolving by decreasing ``rank`` (elimination order) decides refs first."""

    ref: int = -1
    refs: tuple[int, ...] = ()
    table: np.ndarray | None = None
    rank: int = 0

    @classmethod
    def node(cls, ref: int) -> "Origin":
        return cls(ref=ref)

    @classmethod
    def decided(cls, refs: tuple[int, ...], table, rank: int) -> "Origin":
        return cls(refs=refs, table=np.asarray(table, dtype=np.int64), rank=rank)


Step = tuple[ChoiceProblem, tuple[Origin, ...]]


class _Owners:
    """Which node of the reduced problem holds each input node's buffers: ``rep[i]`` =
    (node, table), node i's choice being ``table[node's choice]`` (None: the same one);
    node -1 with a 0-d table once i is decided."""

    def __init__(self, n: int):
        self.rep: list[tuple[int, np.ndarray | None]] = [(i, None) for i in range(n)]
        self.members: dict[int, list[int]] = {i: [i] for i in range(n)}

    def move(self, v: int, u: int, table) -> None:
        """Node v's choice is now ``table[u's choice]`` (u = -1: the 0-d ``table``)."""
        table = np.asarray(table, dtype=np.int64)
        for i in self.members.pop(v, []):
            _, t = self.rep[i]
            self.rep[i] = (u, table if t is None else np.asarray(t)[table])
            if u >= 0:
                self.members.setdefault(u, []).append(i)

    def liveness(self, p: ChoiceProblem, index) -> Liveness:
        return p.liveness.remap([(-1, t) if u < 0 else (index[u], t) for u, t in self.rep])  # type: ignore[union-attr]


def _varies(p: ChoiceProblem) -> list[bool]:
    """Whether a node's choice changes the bytes any of its buffers takes."""
    out = [False] * len(p.nodes)
    for b in p.liveness.buffers:  # type: ignore[union-attr]
        if b.node >= 0 and np.ptp(b.size) > 0:
            out[b.node] = True
    return out


def _tied_nodes(p: ChoiceProblem) -> set[int]:
    return {m.node for t in p.ties for m in t.members}


def _merge_parallel(edges: Sequence[tuple[int, int, np.ndarray, object, tuple[Factor, ...]]]) -> tuple[ChoiceEdge, ...]:
    """Sum edges between the same ordered pair of nodes (factors concatenate while every
    part has them)."""
    acc: dict[tuple[int, int], list] = {}
    for u, v, m, label, factors in edges:
        if (u, v) in acc:
            entry = acc[(u, v)]
            entry[0] = entry[0] + m
            entry[1].append(label)
            entry[2] = entry[2] + factors if entry[2] and factors else ()
        else:
            acc[(u, v)] = [m, [label], tuple(factors)]
    return tuple(
        ChoiceEdge(u, v, m, labels[0] if len(labels) == 1 else tuple(sorted(map(repr, labels))), factors)
        for (u, v), (m, labels, factors) in acc.items()
    )


def _remap_ties(ties: Sequence[Tie], index: Sequence[int]) -> tuple[Tie, ...]:
    out: list[Tie] = []
    seen: set = set()
    for t in ties:
        members = tuple(dict.fromkeys(TieMember(index[m.node], m.keys) for m in t.members))
        if len(members) < 2:
            continue  # one node with one key vector: always satisfied
        key = frozenset(members)
        if key not in seen:
            seen.add(key)
            out.append(Tie(members))
    return tuple(out)


def eliminate_fixed(p: ChoiceProblem) -> Step:
    tied = _tied_nodes(p)
    fixed = [n.size == 1 and i not in tied for i, n in enumerate(p.nodes)]
    keep = [i for i, f in enumerate(fixed) if not f]
    index = {i: k for k, i in enumerate(keep)}
    cost = {i: p.nodes[i].cost.astype(float).copy() for i in keep}
    offset = p.offset
    for i, f in enumerate(fixed):
        if f:
            offset += float(p.nodes[i].cost[0])
    edges = []
    for e in p.edges:
        if fixed[e.u] and fixed[e.v]:
            offset += float(e.cost[0, 0])
        elif fixed[e.u]:
            cost[e.v] += e.cost[0, :]
        elif fixed[e.v]:
            cost[e.u] += e.cost[:, 0]
        else:
            edges.append((index[e.u], index[e.v], e.cost, e.label, e.factors))
    nodes = tuple(
        ChoiceNode(p.nodes[i].name, p.nodes[i].labels, cost[i], p.nodes[i].memory, p.nodes[i].signature,
                   p.nodes[i].follower)
        for i in keep
    )
    origins = tuple(Origin.decided((), 0, 0) if f else Origin.node(index[i]) for i, f in enumerate(fixed))
    ties = _remap_ties(p.ties, [index.get(i, -1) for i in range(len(p.nodes))])
    how = [(-1, np.asarray(0)) if f else (index[i], None) for i, f in enumerate(fixed)]
    live = p.liveness.remap(how)  # type: ignore[union-attr]
    reduced = ChoiceProblem(nodes, _merge_parallel(edges), ties, p.memory_budget, offset, p.memory_offset, live)
    return reduced, origins


def _best_response(own: np.ndarray, memory: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """For each leader choice (row of ``pair``), the follower choice of least cost, then
    least memory, then lowest index."""
    total = own[None, :] + pair
    best = total.min(axis=1, keepdims=True)
    near = total <= best + _COST_RTOL * np.abs(best)
    mem = np.where(near, memory[None, :], np.inf)
    return mem.argmin(axis=1)


def merge_followers(p: ChoiceProblem) -> Step:
    n = len(p.nodes)
    tied = _tied_nodes(p)
    cost = [nd.cost.astype(float).copy() for nd in p.nodes]
    memory = [nd.memory.astype(float).copy() for nd in p.nodes]
    signature = [nd.signature for nd in p.nodes]
    edges: dict[int, list] = {}  # id -> [u, v, matrix, label, factors]
    incident: list[set[int]] = [set() for _ in range(n)]
    for k, e in enumerate(p.edges):
        edges[k] = [e.u, e.v, e.cost, e.label, e.factors]
        incident[e.u].add(k)
        incident[e.v].add(k)
    next_id = len(p.edges)
    alive = [True] * n
    origins: list[Origin | None] = [None] * n
    owners = _Owners(n)

    for v in range(n):
        if not p.nodes[v].follower or v in tied:
            continue
        producers = {edges[k][0] for k in incident[v] if edges[k][1] == v and edges[k][0] != v}
        if len(producers) != 1:
            continue
        (u,) = producers
        pair = np.zeros((p.nodes[u].size, p.nodes[v].size))
        for k in list(incident[v]):
            a, b, m, _, _ = edges[k]
            if {a, b} == {u, v}:
                pair += m if a == u else m.T
        f = _best_response(cost[v], memory[v], pair)
        rows = np.arange(p.nodes[u].size)
        cost[u] = cost[u] + cost[v][f] + pair[rows, f]
        memory[u] = memory[u] + memory[v][f]
        signature[u] = (signature[u], signature[v])
        for k in list(incident[v]):
            a, b, m, label, factors = edges.pop(k)
            incident[a].discard(k)
            incident[b].discard(k)
            if {a, b} == {u, v}:
                continue
            # v's other edges now hang off u, indexed through the response table.
            if a == v:
                a, m = u, m[f, :]
                factors = tuple(Factor(x.rows[f], x.cols, x.table) for x in factors)
            else:
                b, m = u, m[:, f]
                factors = tuple(Factor(x.rows, x.cols[f], x.table) for x in factors)
            if a == b:
                cost[u] = cost[u] + np.diagonal(m)
                continue
            edges[next_id] = [a, b, m, label, factors]
            incident[a].add(next_id)
            incident[b].add(next_id)
            next_id += 1
        alive[v] = False
        origins[v] = Origin.decided((u,), f, v)
        owners.move(v, u, f)

    keep = [i for i in range(n) if alive[i]]
    index = {i: k for k, i in enumerate(keep)}
    for i in keep:
        origins[i] = Origin.node(index[i])
    nodes = tuple(
        ChoiceNode(p.nodes[i].name, p.nodes[i].labels, cost[i], memory[i], signature[i], p.nodes[i].follower)
        for i in keep
    )
    new_edges = [(index[a], index[b], m, label, factors) for a, b, m, label, factors in edges.values()]
    ties = _remap_ties(p.ties, [index.get(i, -1) for i in range(n)])
    reduced = ChoiceProblem(nodes, _merge_parallel(new_edges), ties, p.memory_budget, p.offset, p.memory_offset,
                            owners.liveness(p, index))
    return reduced, tuple(origins)  # type: ignore[arg-type]


def _canon(keys: list) -> list[int]:
    ids: dict = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def colours(p: ChoiceProblem, depth: int) -> list[int]:
    """Weisfeiler-Lehman colours: equal colours mean equal costs and equal surroundings
    up to ``depth`` hops."""
    col = _canon([(nd.signature, nd.cost.tobytes(), nd.memory.tobytes()) for nd in p.nodes])
    edge_keys = [(repr(e.label), e.cost.shape, e.cost.tobytes()) for e in p.edges]
    edge_ids = _canon(edge_keys)
    for _ in range(depth):
        ins: list[list] = [[] for _ in p.nodes]
        outs: list[list] = [[] for _ in p.nodes]
        for e, k in zip(p.edges, edge_ids):
            ins[e.v].append((k, col[e.u]))
            outs[e.u].append((k, col[e.v]))
        new = _canon([(col[i], tuple(sorted(ins[i])), tuple(sorted(outs[i]))) for i in range(len(p.nodes))])
        if len(set(new)) == len(set(col)):
            break
        col = new
    return col


def tie_identical(p: ChoiceProblem, depth: int = 2) -> Step:
    col = colours(p, depth)
    classes: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(col):
        classes[c].append(i)
    groups = sorted(classes.values(), key=lambda g: g[0])
    cls = [0] * len(p.nodes)
    for k, g in enumerate(groups):
        for i in g:
            cls[i] = k
    cost = [sum((p.nodes[i].cost for i in g), np.zeros(p.nodes[g[0]].size)) for g in groups]
    memory = [sum((p.nodes[i].memory for i in g), np.zeros(p.nodes[g[0]].size)) for g in groups]
    edges = []
    for e in p.edges:
        a, b = cls[e.u], cls[e.v]
        if a == b:
            cost[a] = cost[a] + np.diagonal(e.cost)  # both ends make the same choice
        else:
            edges.append((a, b, e.cost, e.label, e.factors))
    nodes = tuple(
        ChoiceNode(p.nodes[g[0]].name, p.nodes[g[0]].labels, cost[k], memory[k], p.nodes[g[0]].signature,
                   p.nodes[g[0]].follower)
        for k, g in enumerate(groups)
    )
    origins = tuple(Origin.node(cls[i]) for i in range(len(p.nodes)))
    live = p.liveness.remap([(cls[i], None) for i in range(len(p.nodes))])  # type: ignore[union-attr]
    reduced = ChoiceProblem(nodes, _merge_parallel(edges), _remap_ties(p.ties, cls), p.memory_budget, p.offset,
                            p.memory_offset, live)
    return reduced, origins


Link = tuple[np.ndarray, tuple[Factor, ...]]  # a cost matrix oriented [c_this, c_other], with its factors


def _add(a: Link | None, b: Link) -> Link:
    if a is None:
        return b
    return a[0] + b[0], (a[1] + b[1] if a[1] and b[1] else ())


def _flip(link: Link) -> Link:
    return link[0].T, tuple(f.transpose() for f in link[1])


def eliminate_chains(p: ChoiceProblem) -> Step:
    """Exact variable elimination; a two-neighbour node goes only when the edge it leaves
    behind is no bigger in the ILP than what it removes."""
    n = len(p.nodes)
    tied = _tied_nodes(p)
    cost = [nd.cost.astype(float).copy() for nd in p.nodes]
    memory = [nd.memory.astype(float).copy() for nd in p.nodes]
    adj: list[dict[int, Link]] = [{} for _ in range(n)]  # adj[v][u]: cost[c_v, c_u]
    for e in p.edges:
        if e.u == e.v:
            cost[e.u] += np.diagonal(e.cost)
            continue
        adj[e.u][e.v] = _add(adj[e.u].get(e.v), (e.cost, e.factors))
        adj[e.v][e.u] = _flip(adj[e.u][e.v])
    budget = p.memory_budget is not None
    varies = _varies(p)
    owners = _Owners(n)
    offset = p.offset
    alive = [True] * n
    origins: list[Origin | None] = [None] * n
    rank = 0

    def pick(total: np.ndarray, mem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Minimum over axis 0 and its argument, ties to less memory."""
        best = total.min(axis=0)
        near = total <= best + _COST_RTOL * np.abs(best)
        shape = (-1,) + (1,) * (total.ndim - 1)
        return best, np.where(near, mem.reshape(shape), np.inf).argmin(axis=0)

    queue = list(range(n))
    while queue:
        v = queue.pop()
        if not alive[v] or v in tied or len(adj[v]) > 2 or (budget and varies[v]):
            continue
        nbrs = sorted(adj[v])
        links = [adj[v][u] for u in nbrs]
        if len(nbrs) == 2:
            u, w = nbrs
            best, arg = pick(cost[v][:, None, None] + links[0][0][:, :, None] + links[1][0][:, None, :], memory[v])
            old = adj[u].get(w)
            merged = _add(old, (best, ()))
            before = p.nodes[v].size + link_size(*links[0]) + link_size(*links[1]) + (link_size(*old) if old else 0)
            if link_size(*merged) > before:
                continue
            adj[u][w] = merged
            adj[w][u] = _flip(merged)
            # v's choice depends on two others, so its buffers become constants: exact under a
            # budget (only nodes whose buffers never vary get here), the least otherwise
            owners.move(v, -1, int(memory[v].argmin()))
        elif len(nbrs) == 1:
            (u,) = nbrs
            best, arg = pick(cost[v][:, None] + links[0][0], memory[v])
            cost[u] += best
            memory[u] += memory[v][arg]
            owners.move(v, u, arg)
        else:
            best, arg = pick(cost[v], memory[v])
            offset += float(best)
            owners.move(v, -1, arg)
        for u in nbrs:
            del adj[u][v]
        adj[v].clear()
        alive[v] = False
        origins[v] = Origin.decided(tuple(nbrs), arg, rank)
        rank += 1
        queue.extend(nbrs)

    keep = [i for i in range(n) if alive[i]]
    index = {i: k for k, i in enumerate(keep)}
    for i in keep:
        origins[i] = Origin.node(index[i])
    nodes = tuple(
        ChoiceNode(p.nodes[i].name, p.nodes[i].labels, cost[i], memory[i], p.nodes[i].signature, p.nodes[i].follower)
        for i in keep
    )
    edges = tuple(
        ChoiceEdge(index[u], index[w], m, "chain", factors) for u in keep for w, (m, factors) in adj[u].items() if u < w
    )
    ties = _remap_ties(p.ties, [index.get(i, -1) for i in range(n)])
    reduced = ChoiceProblem(nodes, edges, ties, p.memory_budget, offset, p.memory_offset, owners.liveness(p, index))
    return reduced, tuple(origins)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Reductions:
    """Which reductions to apply; ``tie_depth`` is the WL depth. Followers are off by
    default: exact chain elimination covers most of them without the loss."""

    fixed: bool = True
    follow: bool = False
    tie: bool = True
    chains: bool = True
    tie_depth: int = 2

    @classmethod
    def none(cls) -> "Reductions":
        return cls(False, False, False, False)

    @classmethod
    def exact(cls) -> "Reductions":
        return cls(True, False, False, True)


@dataclass(frozen=True, eq=False)
class Reduced:
    original: ChoiceProblem
    problem: ChoiceProblem
    steps: tuple[tuple[Origin, ...], ...]  # one origin table per step, first step first

    def expand(self, assignment: Sequence[int]) -> list[int]:
        """A choice for every node of the original problem from a reduced solution."""
        a = list(assignment)
        for origins in reversed(self.steps):
            a = _resolve(origins, a)
        return a

    def restrict(self, assignment: Sequence[int]) -> list[int]:
        """A reduced assignment from one of the original problem (a warm start): each kept
        node takes its original's choice, a node of several merged ones the first's. The
        nodes reductions decided are decided again by ``expand``, so ``expand(restrict(a))``
        may differ from ``a`` there."""
        a = list(assignment)
        for origins in self.steps:
            out: list[int | None] = [None] * (max((o.ref for o in origins), default=-1) + 1)
            for i, o in enumerate(origins):
                if o.ref >= 0 and out[o.ref] is None:
                    out[o.ref] = a[i]
            a = [0 if c is None else c for c in out]
        return a


def _resolve(origins: Sequence[Origin], reduced: Sequence[int]) -> list[int]:
    out: list[int] = [-1] * len(origins)
    for i, o in enumerate(origins):
        if o.ref >= 0:
            out[i] = reduced[o.ref]
    for i in sorted((i for i, o in enumerate(origins) if o.ref < 0), key=lambda i: -origins[i].rank):
        o = origins[i]
        out[i] = int(o.table[tuple(out[r] for r in o.refs)])  # type: ignore[index]
    return out


def reduce_problem(p: ChoiceProblem, reductions: Reductions = Reductions()) -> Reduced:
    steps: list[tuple[Origin, ...]] = []
    cur = p
    plan = [
        (reductions.fixed, eliminate_fixed),
        (reductions.follow, merge_followers),
        (reductions.tie, lambda q: tie_identical(q, reductions.tie_depth)),
        (reductions.chains, eliminate_chains),
    ]
    for enabled, step in plan:
        if enabled:
            cur, origins = step(cur)
            steps.append(origins)
    return Reduced(p, cur, tuple(steps))


__all__ = [
    "Origin", "Reduced", "Reductions", "colours", "eliminate_chains", "eliminate_fixed", "merge_followers",
    "reduce_problem", "tie_identical",
]
