"""The ILP planner (MetaDist section 3.4.1) on Python-MIP.

One binary per node choice, summing to one per node. An edge's cost depends on both ends;
it is linearised with continuous pair variables whose marginals equal the two nodes'
one-hot vectors (exact once the node variables are integral, with a tight LP
relaxation). The pair variables range over classes, not choices: either the distinct
rows and columns of the whole matrix (in practice one per placement) or, when smaller,
the per-mesh-axis factors of the resharding cost, each over a coarse view of the
placements. Separable blocks (a row term plus a column term) become unary costs.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import signal
import time
from typing import Iterator, Sequence

import numpy as np

from .choice import ChoiceProblem, Factor, Infeasible, Solution

TIME_SCALE = 1e6  # the objective is in microseconds, so the solver's tolerances mean something
# The largest objective coefficient the solvers are given: CBC and HiGHS read 1e20 as
# infinite, and coefficients far apart lose the small ones, so costs whose microseconds
# pass this (a loop charged 1e30 trips, a link of 1e-16 B/s) are scaled down to it.
LARGEST_COEFFICIENT = 1e9
MEMORY_UNITS = 1e4  # the budget row is scaled so the budget reads 10,000
SOLVERS = ("cbc", "highs")


Link = tuple[np.ndarray, tuple[Factor, ...]]  # a cost matrix and its factors


def _pair_costs(p: ChoiceProblem) -> tuple[list[np.ndarray], dict[tuple[int, int], Link]]:
    """Unary costs with self edges folded in, and one cost (with factors, while every
    part has them) per node pair u < v."""
    unary = [n.cost.astype(float).copy() for n in p.nodes]
    pairs: dict[tuple[int, int], Link] = {}
    for e in p.edges:
        if e.u == e.v:
            unary[e.u] += np.diagonal(e.cost)
            continue
        if e.u < e.v:
            key, m, fs = (e.u, e.v), e.cost, e.factors
        else:
            key, m, fs = (e.v, e.u), e.cost.T, tuple(f.transpose() for f in e.factors)
        if key in pairs:
            m0, f0 = pairs[key]
            pairs[key] = (m0 + m, f0 + fs if f0 and fs else ())
        else:
            pairs[key] = (m.astype(float), fs)
    return unary, pairs


def _separable(m: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    a = m[:, 0].copy()
    b = m[0, :] - m[0, 0]
    if np.allclose(m, a[:, None] + b[None, :], rtol=1e-12, atol=1e-15):
        return a, b
    return None


def _classes(m: np.ndarray, axis: int) -> np.ndarray:
    """Index of each row (axis=0) or column (axis=1) among the distinct ones."""
    _, inverse = np.unique(m, axis=axis, return_inverse=True)
    return np.asarray(inverse).reshape(-1)


def _blocks(m: np.ndarray, factors: Sequence[Factor]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The cheaper exact linking of one pair: (row class per u choice, column class per v
    choice, table) blocks, from the factors or from the whole matrix's distinct rows and
    columns. Identical factor shapes are summed first; separable blocks are left in (the
    caller moves them to unary costs)."""
    rows, cols = _classes(m, 0), _classes(m, 1)
    dense = [(rows, cols, m[np.ix_(_firsts(rows), _firsts(cols))])]
    if not factors:
        return dense
    merged: dict[tuple[bytes, bytes], list] = {}
    for f in factors:
        r = _relabel(f.rows)
        c = _relabel(f.cols)
        table = f.table[np.ix_(f.rows[_firsts(r)], f.cols[_firsts(c)])]
        key = (r.tobytes(), c.tobytes())
        if key in merged:
            merged[key][2] = merged[key][2] + table
        else:
            merged[key] = [r, c, table]
    split = [tuple(b) for b in merged.values()]
    size = sum(t.size for _, _, t in split if _separable(t) is None)
    return split if size < (0 if _separable(m) is not None else dense[0][2].size) else dense


def _relabel(keys: np.ndarray) -> np.ndarray:
    """Keys renumbered 0.. in order of first use (only keys that occur get a class)."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    return order[np.asarray(inverse).reshape(-1)]


def _firsts(classes: np.ndarray) -> list[int]:
    """For each class 0..k-1, the first index holding it."""
    k = int(classes.max()) + 1
    first = [-1] * k
    for i, c in enumerate(classes.tolist()):
        if first[c] < 0:
            first[c] = i
    return first


def link_size(m: np.ndarray, factors: Sequence[Factor] = ()) -> int:
    """Pair variables the ILP needs for one edge (0 when it reduces to unary costs)."""
    if _separable(m) is not None:
        return 0
    return sum(t.size for _, _, t in _blocks(m, factors) if _separable(t) is None)


class _Builder:
    """The MIP of one ChoiceProblem: variables, objective terms and warm-start values."""

    def __init__(self, mip, model, p: ChoiceProblem, warm: list[int] | None, time_scale: float = TIME_SCALE):
        self.mip, self.model, self.p, self.warm, self.time_scale = mip, model, p, warm, time_scale
        self.terms: list[tuple[float, object]] = []
        self.start: list[tuple[object, float]] = []
        self.x: list[list | None] = []
        for n in p.nodes:
            if n.size == 1:
                self.x.append(None)  # choice 0, no variable
                continue
            vs = [model.add_var(var_type=mip.BINARY) for _ in range(n.size)]
            model += mip.xsum(vs) == 1
            self.x.append(vs)
            if warm is not None:
                self.start.extend((var, 1.0 if c == warm[len(self.x) - 1] else 0.0) for c, var in enumerate(vs))

    def picked(self, i: int, choices: Sequence[int]):
        """Sum of node i's variables over ``choices`` (a constant for a fixed node)."""
        if self.x[i] is None:
            return 1.0 if 0 in choices else 0.0
        return self.mip.xsum(self.x[i][c] for c in choices)

    def link(self, u: int, v: int, rows: np.ndarray, cols: np.ndarray, k: np.ndarray) -> None:
        """Pair variables e[r][c] >= 0 whose row sums are u's class indicators and column
        sums v's: with one-hot u and v, exactly e[class(u)][class(v)] is 1."""
        mip, model = self.mip, self.model
        nr, nc = k.shape
        e = [[model.add_var(lb=0.0, ub=1.0) for _ in range(nc)] for _ in range(nr)]
        for r in range(nr):
            model += mip.xsum(e[r]) == self.picked(u, np.flatnonzero(rows == r).tolist())
        for c in range(nc):
            model += mip.xsum(e[r][c] for r in range(nr)) == self.picked(v, np.flatnonzero(cols == c).tolist())
        self.terms.extend((k[r, c] * self.time_scale, e[r][c]) for r in range(nr) for c in range(nc) if k[r, c] != 0)
        if self.warm is not None:
            ru, cv = rows[self.warm[u]], cols[self.warm[v]]
            self.start.extend((e[r][c], float((r, c) == (ru, cv))) for r in range(nr) for c in range(nc))

    def held(self, scale: float):
        """One continuous level per segment of steps (Liveness.segments) equal to the bytes
        held there, times ``scale``: a running sum, so each buffer appears in two rows (where
        it starts and after it ends) rather than in every step it spans. Returns the levels
        of the segments where some buffer starts, each with the constant bytes held at every
        step (memory_offset) left out, or None when no choice changes memory."""
        mip, model, p = self.mip, self.model, self.p
        live = p.liveness
        bounds, first, after = live.segments()
        k = len(bounds)
        terms: list[list] = [[] for _ in range(k + 1)]
        const = np.zeros(k + 1)
        varying = False
        for b, s0, s1 in zip(live.buffers, first.tolist(), after.tolist()):
            vs = None if b.node < 0 else self.x[b.node]
            size = np.asarray(b.size, dtype=float) * scale
            if vs is None or np.ptp(size) == 0:
                c = float(size[0])
                const[s0] += c
                const[s1] -= c
                continue
            varying = True
            for mem, var in zip(size.tolist(), vs):
                if mem != 0:
                    terms[s0].append((mem, var))
                    terms[s1].append((-mem, var))
        if not varying:
            return None
        levels = [model.add_var(lb=-mip.INF) for _ in range(k)]
        for j in range(k):
            prev = levels[j - 1] if j else 0.0
            model += levels[j] - prev - mip.xsum(c * v for c, v in terms[j]) == float(const[j])
        if self.warm is not None:
            at = live.profile(self.warm)[bounds] * scale
            self.start.extend(zip(levels, at.tolist()))
        return [levels[j] for j in sorted(set(first.tolist()))]

    def budget(self) -> None:
        p = self.p
        floor = p.memory_offset + p.liveness.floor()  # type: ignore[union-attr]
        if floor > p.memory_budget * (1 + 1e-9):  # type: ignore[operator]
            # before the row: a budget far below the sizes scales them past what the solvers take
            raise Infeasible(f"every plan holds at least {floor:.0f} bytes at some step > budget "
                             f"{p.memory_budget:.0f}")
        scale = MEMORY_UNITS / max(p.memory_budget, 1e-30)  # type: ignore[arg-type]
        cap = (p.memory_budget * (1 + 1e-9) - p.memory_offset) * scale  # type: ignore[operator]
        levels = self.held(scale)
        if levels is None:  # nothing to choose: the peak is what it is
            peak = p.memory([0] * len(p.nodes))
            if peak > p.memory_budget * (1 + 1e-9):  # type: ignore[operator]
                raise Infeasible(f"fixed tensors alone need {peak:.0f} bytes > budget {p.memory_budget:.0f}")
            return
        for level in levels:
            level.ub = cap

    def ties(self) -> None:
        for t in self.p.ties:
            keys = {k for mbr in t.members for k in mbr.keys}
            base = t.members[0]
            for mbr in t.members[1:]:
                for key in keys:
                    lhs = self.picked(base.node, [c for c, k in enumerate(base.keys) if k == key])
                    rhs = self.picked(mbr.node, [c for c, k in enumerate(mbr.keys) if k == key])
                    if isinstance(lhs, float) and isinstance(rhs, float):
                        if lhs != rhs:
                            raise Infeasible("fixed nodes break a tie")
                        continue
                    self.model += lhs - rhs == 0


# CBC takes at most 1e12 seconds and ignores a larger limit with a warning, running with
# none: a limit past it is no limit either way, so it is passed as the most CBC takes
_MOST_SECONDS = 1e12


def _solver_seconds(seconds: float) -> float:
    return min(seconds, _MOST_SECONDS)


def time_limit_for(columns: int) -> float:
    """Seconds to give the ILP of ``columns`` variables: 10 s, plus 1 s per 250 columns
    (a 10,000-node GPT reduces to about 15,000, whose root LP alone takes seconds on a
    busy machine, and CBC takes the warm start only after it), at most 50 s, so that a
    planner call stays within a minute with the solvers' own stopping and model building."""
    return min(50.0, 10.0 + columns / 250)


def solve_ilp(
    p: ChoiceProblem,
    time_limit: float | None = 10.0,
    warm_start: Sequence[int] | None = None,
    solver: str = "cbc",
    threads: int = 1,
    mip_gap: float = 1e-6,
    verbose: bool = False,
    started: float | None = None,
    share: float = 1.0,
) -> Solution | None:
    """The best assignment found within ``time_limit`` seconds (model building included;
    None: ``time_limit_for`` the model's size) counted from ``started`` (a perf_counter
    reading, default now; the solver gets at least 5 s of it, or the whole limit when
    smaller), status 'optimal' when proven, 'near-optimal' when within ``mip_gap`` of the
    solver's bound (a relative gap: (cost - bound) / cost), else 'feasible' with it; None
    when the solver found none in time (CBC installs a warm start only after the root
    LP). ``share``: the part of the limit this call may use, counted from ``started``, so
    that a second solver can go on from this one's answer in the rest. Raises Infeasible."""
    import mip  # optional dependency: the planner core imports without it

    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r} (expected one of {SOLVERS})")
    start = time.perf_counter()
    if all(n.size == 1 for n in p.nodes):  # nothing left to choose (reductions decided every node)
        only = tuple(0 for _ in p.nodes)
        if not p.feasible(only):
            raise Infeasible("the only assignment breaks the memory budget or a tie")
        cost = p.evaluate(only)
        return Solution(only, cost, solver, "optimal", time.perf_counter() - start, cost)

    unary, pairs = _pair_costs(p)
    links = []
    for (u, v), (m, factors) in pairs.items():
        sep = _separable(m)
        blocks = [] if sep is not None else _blocks(m, factors)
        if sep is not None:
            unary[u] += sep[0]
            unary[v] += sep[1]
        for rows, cols, k in blocks:
            sep = _separable(k)
            if sep is None:
                links.append((u, v, rows, cols, k))
            else:
                unary[u] += sep[0][rows]
                unary[v] += sep[1][cols]
    if time_limit is None:
        time_limit = time_limit_for(sum(n.size for n in p.nodes if n.size > 1) + sum(k.size for *_, k in links))

    model = mip.Model(sense=mip.MINIMIZE, solver_name=mip.CBC if solver == "cbc" else mip.HIGHS)
    try:
        return _solve(mip, model, p, unary, links, time_limit, warm_start, solver, threads, mip_gap, verbose,
                      started, share, start)
    finally:
        _release(model)


# the signals CBC's solve takes over for its crash handler (and keeps after it returns)
_CRASH_SIGNALS = tuple(getattr(signal, n) for n in ("SIGABRT", "SIGSEGV", "SIGFPE", "SIGBUS", "SIGILL")
                       if hasattr(signal, n))
_SIGACTION_BYTES = 512  # more than any libc's struct sigaction: it is kept whole, never read


@contextlib.contextmanager
def _crash_handlers_kept() -> Iterator[None]:
    """Put the process's handlers of crash signals back as they were after a solve. CBC
    installs its own while solving and leaves them: any later abort or fault in the
    process (an op's kernel, a test's faulthandler) was reported as "ERROR while running
    Cbc". The C-level handlers (Python's ``signal`` module sees only its own) are copied
    whole with ``sigaction``, flags and mask included; where libc has no ``sigaction``
    (Windows), nothing is kept."""
    sigaction = getattr(_libc(), "sigaction", None)
    if sigaction is None:
        yield
        return
    saved = {}
    for sig in _CRASH_SIGNALS:
        buffer = ctypes.create_string_buffer(_SIGACTION_BYTES)
        if sigaction(sig, None, buffer) == 0:
            saved[sig] = buffer
    try:
        yield
    finally:
        for sig, buffer in saved.items():
            sigaction(sig, buffer, None)


def _libc():
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):  # no C library to load by that name (Windows)
        return None


def _release(model) -> None:
    """Free the solver's C model now, at a point where no cffi call is under way. Left to
    the cyclic garbage collector (a model and its variables refer to each other), the
    solver's ``__del__`` can run inside a cffi call of a later solve, and look a function
    up in cffi's library while cffi holds its lock there: the process hangs (seen with
    HiGHS, ``Highs_destroy`` looked up during ``FFI.new``). Dropping the one reference to
    the solver frees it at once; ``Model.__del__`` then deletes a None."""
    model.solver = None


def _solve(mip, model, p: ChoiceProblem, unary, links, time_limit: float, warm_start, solver: str, threads: int,
           mip_gap: float, verbose: bool, started: float | None, share: float, start: float) -> Solution | None:
    model.verbose = int(verbose)
    model.threads = threads
    model.max_mip_gap = mip_gap
    warm = list(warm_start) if warm_start is not None and p.feasible(warm_start) else None
    largest = max([float(np.max(np.abs(u))) for u in unary] + [float(np.max(np.abs(k))) for *_, k in links], default=0.0)
    if not math.isfinite(largest):
        raise ValueError("a cost of the plan is infinite or NaN: a link's bandwidth, its seconds per message, a loop's "
                         "trips or a cost model gives a step more seconds than a float holds")
    time_scale = min(TIME_SCALE, LARGEST_COEFFICIENT / largest) if largest > 0 else TIME_SCALE
    b = _Builder(mip, model, p, warm, time_scale)
    for link in links:
        b.link(*link)
    const = p.offset
    for i, vs in enumerate(b.x):
        if vs is None:
            const += float(unary[i][0])
        else:
            b.terms.extend((c * time_scale, var) for c, var in zip(unary[i], vs) if c != 0)
    model.objective = mip.minimize(mip.xsum(c * var for c, var in b.terms))
    if p.memory_budget is not None:
        b.budget()
    b.ties()
    if warm is not None:
        model.start = b.start

    left = share * time_limit - (time.perf_counter() - (start if started is None else started))
    with _crash_handlers_kept():
        status = model.optimize(max_seconds=_solver_seconds(max(left, min(5.0, share * time_limit), 0.1)))
    if status == mip.OptimizationStatus.INFEASIBLE:
        held = "the memory budget and " if p.memory_budget is not None else ""
        raise Infeasible(f"no assignment meets {held}the ties (values that must share one placement, as a loop's "
                         f"carry entering and leaving its body) under the placements pinned")
    if model.num_solutions == 0:
        return None
    assignment = tuple(0 if vs is None else int(np.argmax([var.x for var in vs])) for vs in b.x)
    bound = model.objective_bound
    if bound is not None and not math.isfinite(bound):  # HiGHS stopped before any bound: -inf
        bound = None
    cost = p.evaluate(assignment)
    bound = None if bound is None else max(0.0, bound / time_scale + const)  # every cost is >= 0
    return Solution(assignment, cost, solver, _status(status == mip.OptimizationStatus.OPTIMAL, cost, bound),
                    time.perf_counter() - start, bound)


def _status(stopped_by_gap: bool, cost: float, bound: float | None) -> str:
    """'optimal' where the bound meets the cost (within the solvers' own 1e-6), 'near-optimal'
    where the solver stopped within a wider ``mip_gap``, else 'feasible' (the time limit)."""
    if not stopped_by_gap:
        return "feasible"
    exact = bound is not None and cost - bound <= 1e-6 * max(abs(cost), 1e-30)
    return "optimal" if exact or bound is None else "near-optimal"


def least_memory(p: ChoiceProblem, time_limit: float = 10.0) -> float | None:
    """The least memory per device of any assignment that keeps the ties, whatever it costs:
    what a memory budget must allow. None when the ties rule every assignment out, or the
    solver proves no minimum in time."""
    import mip

    model = mip.Model(sense=mip.MINIMIZE, solver_name=mip.CBC)
    try:
        return _least_memory(mip, model, p, time_limit)
    finally:
        _release(model)


def _least_memory(mip, model, p: ChoiceProblem, time_limit: float) -> float | None:
    model.verbose = 0
    b = _Builder(mip, model, p, None)
    try:
        b.ties()
    except Infeasible:
        return None
    scale = MEMORY_UNITS / max(p.memory([0] * len(p.nodes)), 1.0)
    levels = b.held(scale)
    if levels is None:
        return p.memory([0] * len(p.nodes))
    peak = model.add_var(lb=-mip.INF)
    for level in levels:
        model += level - peak <= 0
    model.objective = mip.minimize(peak)
    with _crash_handlers_kept():
        status = model.optimize(max_seconds=_solver_seconds(time_limit))
    if status != mip.OptimizationStatus.OPTIMAL:
        return None
    return p.memory_offset + model.objective_value / scale


__all__ = ["SOLVERS", "least_memory", "link_size", "solve_ilp", "time_limit_for"]
