"""Entry point: plan a MetaIR on a mesh.

Build the problem, shrink it with graph reductions, get a warm start from beam search,
solve the ILP within the time limit, and map the answer back to every node. Without mip
installed, or with ``solver='beam'``, the beam answer is the plan.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Callable, Iterable, Mapping, Sequence

from .. import spec
from ..ir import MetaIR
from ..placement import Placements
from ..target import DTENSOR_PLAN, Target
from .beam import solve_beam
from .choice import MEMORY_RTOL, Infeasible, Solution
from .cost import CostModel
from .ilp import least_memory, solve_ilp, time_limit_for
from .mesh import Mesh
from .plan import Plan, make_plan
from .problem import PlannerError, ShardingProblem, build_problem
from .reduce import Reductions, reduce_problem

SOLVER_CHOICES = ("ilp", "beam", "cbc", "highs")

# The ILP stops once its plan is within this relative gap of the bound it has proven, (cost
# - bound) / cost: a budgeted plan on a 2-D mesh is usually found within seconds, and proving
# the last few percent took the rest of the time limit (50 s for a GPT block on 2x2, whose
# plan was the same; benchmarks/HISTORY.md). The cost model's own error is larger than 3%.
GAP = 0.03

# The part of the time limit 'ilp' gives its first solver before the other goes on from its
# answer. Under a memory budget CBC goes first: it is the quicker on the GPT blocks (within
# 9 s on 2x2), HiGHS where the LP is large (a 3-axis mesh: 2.9 s against CBC's 31.7 s), and a
# third leaves CBC its own cases and HiGHS most of the limit for the others. Without one,
# HiGHS goes first: on the unbudgeted 2x2 problems of five Hugging Face models it proved
# the plan in 1.3-3.9 s, CBC in 2.8-24.4 s or not within 30 s (benchmarks/HISTORY.md).
FIRST_SHARE = 0.3

# The first solver's answer at the end of its share is kept, not handed on, where it is
# within this gap of its bound: on budgeted 2x2 problems HiGHS then spent the rest of the
# limit (up to 35 s) proving the last points, mostly keeping CBC's plan (0.7% cheaper at most;
# benchmarks/HISTORY.md). A ``gap`` of 0 (a proof asked for) keeps the second going.
LATE_GAP = 0.05


def solve(
    problem: ShardingProblem,
    solver: str = "ilp",
    time_limit: float | None = None,
    reductions: Reductions = Reductions(),
    beam_width: int = 8,
    threads: int = 1,
    started: float | None = None,
    gap: float = GAP,
    candidates: Sequence[tuple[Sequence[int], str]] = (),
) -> Plan:
    """Plan an already built problem. ``solver``: 'ilp', 'cbc', 'highs' or 'beam'. 'ilp' runs
    one solver for ``FIRST_SHARE`` of the time limit (CBC under a memory budget, HiGHS
    without) and, where it stops short of the gap (and of ``LATE_GAP``) and highspy is
    installed, the other for the rest from its incumbent: neither dominates
    (benchmarks/HISTORY.md).

    Beam search runs on the reduced problem (the ILP's warm start) and on the whole graph;
    the plan is the cheapest of those, every node's first choice (replicated, where it fits)
    and the ILP's incumbent, so it is never worse than beam search or replicating, and a plan stopped by the time limit carries the ILP's bound (its gap).
    ``time_limit``: seconds for all of it (reductions, beam search and the ILP); None sizes
    it to the ILP (``ilp.time_limit_for``); ``started``: the ``time.perf_counter()`` reading
    it counts from (default now; ``plan`` counts the problem's building too); ``gap``: the
    ILP stops once its plan is within this relative gap of its bound (status 'near-optimal';
    0 asks for a proof); ``candidates``: (full assignment, whose) plans made elsewhere
    (``flattened``), kept where cheaper, as beam search's are.
    """
    if solver not in SOLVER_CHOICES:
        raise PlannerError(f"unknown solver {solver!r} (expected one of {SOLVER_CHOICES})")
    started = time.perf_counter() if started is None else started
    cp = problem.choice
    reduced = _reduced(cp, reductions)
    small = reduced.problem
    beams: list[tuple[list[int], Solution]] = []
    try:
        warm: Solution | None = solve_beam(small, beam_width)
        beams.append((reduced.expand(warm.assignment), warm))
    except Infeasible:
        warm = None
    if reduced.steps:  # the reductions may tie layers a whole-graph beam would set apart
        try:
            whole = solve_beam(cp, beam_width)
            beams.append((list(whole.assignment), whole))
        except Infeasible:
            pass
    # every node's first choice (replicated, where no constraint pins it), whenever it holds:
    # beam search commits early to cheap-looking choices and can end far above it (a GPT
    # block 131 us against 0.22 us), and a short time limit leaves the plan to beam search
    first = [0] * len(cp.nodes)
    if cp.feasible(first):
        beams.append((first, Solution(tuple(first), cp.evaluate(first), "replicated", "heuristic", 0.0)))
    for assignment, whose in candidates:
        if cp.feasible(assignment):
            beams.append((list(assignment), Solution(tuple(assignment), cp.evaluate(assignment), whose, "heuristic", 0.0)))
            start = reduced.restrict(assignment)  # the ILP's warm start where it is the cheaper one
            if small.feasible(start) and (warm is None or small.evaluate(start) < warm.cost):
                warm = Solution(tuple(start), small.evaluate(start), whose, "heuristic", 0.0)
    beam = min(beams, key=lambda b: cp.evaluate(b[0]), default=None)
    if solver == "beam":
        if beam is None:
            raise Infeasible("beam search found no plan within the memory budget")
        return make_plan(problem, lighter_inputs(problem, beam[0]), beam[1])
    name = "highs" if solver == "highs" else "cbc"
    infeasible = None
    try:
        found = _solve_ilp(small, solver, time_limit, warm, threads, started, gap)
    except ImportError as err:  # mip (or highspy) is an optional dependency
        if beam is None:
            raise PlannerError(f"the ILP solver is not installed ({err}) and beam search found no plan") from err
        warnings.warn(f"ILP solver unavailable ({err}); using the beam-search plan", RuntimeWarning, stacklevel=2)
        return make_plan(problem, lighter_inputs(problem, beam[0]), beam[1])
    except Infeasible as err:
        infeasible = err
    if infeasible is not None:  # out of the except: the user reads one error, not a chain of retries
        if reductions.tie or reductions.follow:
            # The heuristic reductions may be what rules every plan out; retry exactly.
            exact = Reductions(fixed=reductions.fixed, follow=False, tie=False, chains=reductions.chains)
            return solve(problem, solver, time_limit, exact, beam_width, threads, started, gap)
        least = _least_memory(small, time_limit)
        if least is not None and least > small.memory_budget * (1 + MEMORY_RTOL):
            raise _no_plan_fits(small, least)
        raise infeasible
    if found is None:  # the time limit stopped the ILP before it had a solution
        if beam is None:
            # beam search found nothing either: a budget no plan fits, or one only the ILP could meet
            least = _least_memory(small, time_limit)
            if least is not None and least > small.memory_budget * (1 + MEMORY_RTOL):
                raise _no_plan_fits(small, least)
            limit = f"{time_limit:g} s" if time_limit else "its time limit, sized to the problem"
            near = f" (the least any plan needs is {least:,.0f} bytes per device)" if least is not None else ""
            raise PlannerError(f"no plan found within {limit}: pass a larger time_limit, or a larger memory "
                               f"budget{near}")
        nothing = Solution(tuple(beam[0]), cp.evaluate(beam[0]), name, "no solution", time.perf_counter() - started)
        return make_plan(problem, lighter_inputs(problem, beam[0]), nothing, picked=beam[1].solver)
    name = found.solver
    full = reduced.expand(found.assignment)
    if beam is not None and cp.evaluate(beam[0]) < cp.evaluate(full) - 1e-12 * abs(cp.evaluate(full)):
        # the incumbent of a stopped ILP is worse than beam search's plan: keep that, with the ILP's bound
        kept = Solution(tuple(beam[0]), cp.evaluate(beam[0]), name, found.status, found.seconds, found.bound)
        return make_plan(problem, lighter_inputs(problem, beam[0]), kept, picked=beam[1].solver)
    return make_plan(problem, lighter_inputs(problem, full), found, picked=name)


def _no_plan_fits(small, least: float) -> Infeasible:
    """The budget is below what any plan needs; where that is the replicated plan's own
    memory, no cut lowers it, and the likely reason is said: uneven dims stay whole."""
    why = ""
    if least >= small.memory([0] * len(small.nodes)) * (1 - MEMORY_RTOL):
        why = (", the replicated plan's: no cut lowers it. A dim is cut only into equal pieces, so it must divide "
               "by the size of the mesh axis it is cut along (dims that do not stay whole)")
    return Infeasible(f"no plan fits a memory budget of {_amount(small.memory_budget)} bytes per device: the least "
                      f"any plan needs is {least:,.0f}{why}")


def _least_memory(small, time_limit: float | None) -> float | None:
    """The least memory any plan of ``small`` needs (None: no budget, or not known in time)."""
    return least_memory(small, time_limit or 60.0) if small.memory_budget is not None else None


# A problem whose exact reductions leave at most this many choices is solved without the
# heuristic ones: tying look-alike nodes is there so that the layers of a deep model are
# planned once, and within one block it ties apart nodes a plan treats apart (Q, K and V
# projections: 161.6 against 135.1 us on the separate-QKV block of expert_plans_bench).
EXACT_COLUMNS = 1000


def _reduced(cp, reductions: Reductions):
    """``reductions`` applied, or only their exact ones where those leave a small problem."""
    if reductions.tie and len(cp.nodes) <= 4 * EXACT_COLUMNS:
        exact = reduce_problem(cp, dataclasses.replace(reductions, tie=False, follow=False))
        if sum(n.size for n in exact.problem.nodes if n.size > 1) <= EXACT_COLUMNS:
            return exact
    return reduce_problem(cp, reductions)


def _solve_ilp(small, solver: str, time_limit: float | None, warm: Solution | None, threads: int,
               started: float, gap: float = GAP) -> Solution | None:
    """The ILP's answer by the named solver, or for 'ilp' by one solver (CBC under a memory
    budget, HiGHS without) and then, unless its answer is within ``gap`` (or ``LATE_GAP``) of
    its bound, the other from its incumbent (or the warm start) in the time left: the cheaper
    answer, with the tighter of the two bounds."""
    start = warm.assignment if warm else None
    if solver != "ilp":
        return solve_ilp(small, time_limit, start, solver, threads, mip_gap=gap, started=started)
    try:
        import highspy  # noqa: F401 - only whether it is there
    except ImportError:
        return solve_ilp(small, time_limit, start, "cbc", threads, mip_gap=gap, started=started)
    one, other = ("cbc", "highs") if small.memory_budget is not None else ("highs", "cbc")
    first = solve_ilp(small, time_limit, start, one, threads, mip_gap=gap, started=started, share=FIRST_SHARE)
    if first is not None and first.status in ("optimal", "near-optimal"):
        return first
    late = max(gap, LATE_GAP) if gap > 0 else 0.0
    if first is not None and first.bound is not None and first.cost - first.bound <= late * first.cost:
        return dataclasses.replace(first, status="near-optimal")
    second = solve_ilp(small, time_limit, first.assignment if first else start, other, threads, mip_gap=gap,
                       started=started)
    answers = [a for a in (first, second) if a is not None]
    if not answers:
        return None
    best = min(answers, key=lambda a: a.cost)
    bounds = [a.bound for a in answers if a.bound is not None]
    bound = max(bounds) if bounds else None
    if any(a.status == "optimal" for a in answers):
        status = "optimal"
    elif bound is not None and best.cost - bound <= gap * best.cost:
        status = "near-optimal"
    else:
        status = best.status
    return Solution(best.assignment, best.cost, best.solver, status, time.perf_counter() - started, bound)


def lighter_inputs(problem: ShardingProblem, assignment: Sequence[int]) -> list[int]:
    """Among plans of equal cost, the one whose graph inputs take the least memory.

    The objective is time only, so where placing a graph input one way or another costs
    the same (data parallelism reads a Replicate batch through a free local slice exactly
    as cheaply as a batch given sharded), the solver's pick is arbitrary. Move each input,
    one at a time, to the smallest placement that costs nothing more and keeps the ties;
    memory only goes down, so a budget stays met.
    """
    cp = problem.choice
    a = list(assignment)
    touching: dict[int, list] = {}
    for e in cp.edges:
        touching.setdefault(e.u, []).append(e)
        touching.setdefault(e.v, []).append(e)
    tied = {m.node for t in cp.ties for m in t.members}

    def local(i: int, c: int) -> float:  # node i's unary cost and edges with choice c
        b = a[:]
        b[i] = c
        return float(cp.nodes[i].cost[c]) + sum(float(e.cost[b[e.u], b[e.v]]) for e in touching.get(i, ()))

    for i, op in enumerate(problem.ops):
        if op is not None:
            continue
        memory = cp.nodes[i].memory
        now = local(i, a[i])
        for c in sorted(range(len(memory)), key=lambda c: float(memory[c])):
            if float(memory[c]) >= float(memory[a[i]]):
                break
            if local(i, c) > now + 1e-12 * max(abs(now), 1e-9):
                continue
            b = a[:]
            b[i] = c
            if i in tied and not cp.ties_hold(b):
                continue
            a[i] = c
            break
    return a


def plan(
    ir: MetaIR,
    strategies_by_node: Mapping[str, Iterable[spec.Strategy]],
    mesh: Mesh,
    memory_budget: float | None = None,
    time_limit: float | None = None,
    solver: str = "ilp",
    ties: Sequence[Sequence[str]] = (),
    same_placement: Sequence[Sequence[str]] = (),
    output_placements: Mapping[str, Placements] | None = None,
    cost_model: CostModel | None = None,
    reductions: Reductions = Reductions(),
    beam_width: int = 8,
    strict: bool = True,
    threads: int = 1,
    target: Target = DTENSOR_PLAN,
    constraints: Mapping[str, Placements] | None = None,
    repeats: Mapping[str, float] | None = None,
    gap: float = GAP,
) -> Plan:
    """Choose a strategy for every op and a placement for every graph input of ``ir``.

    ``strategies_by_node``: the 1-D rule strategies of each op node (by node name);
    ``memory_budget``: bytes per device at the peak of a step (``choice.Liveness``);
    ``time_limit``: seconds for the whole call, building included (None: sized to the
    ILP); ``ties``: (parameter, gradient, ...) groups, the later members delivered in the
    first one's placement; ``same_placement``: groups whose placements must be equal;
    ``output_placements``: required placements of graph outputs;
    ``strict``: shards must divide evenly; ``target``: what the runtime runs of a rule
    strategy (``metaspmd.target``: ``DTENSOR_PLAN``, ``JAX_PLAN``); ``constraints``: placements
    a user already decided, by var name; ``repeats``: how often an op runs per call (a loop
    body's, once per iteration); ``gap``: the relative gap at which the ILP stops (``GAP``;
    0 asks for a proof). See build_problem.
    """
    started = time.perf_counter()  # the time limit covers the build too
    common = dict(memory_budget=memory_budget, ties=ties, same_placement=same_placement, strict=strict,
                  target=target, repeats=repeats)
    problem = build_problem(ir, strategies_by_node, mesh, cost_model, output_placements=output_placements,
                            constraints=constraints, **common)
    candidates = []
    if mesh.ndim > 1 and solver != "beam":
        limit = FLAT_SHARE * (time_limit if time_limit is not None else time_limit_for(float("inf")))
        flat = _flattened(problem, strategies_by_node, common, constraints, output_placements,
                          lambda p: solve(p, solver, limit, reductions, beam_width, threads, gap=gap))
        candidates = [(flat, "flattened")] if flat is not None else []
    return solve(problem, solver, time_limit, reductions, beam_width, threads, started, gap, candidates)


# The share of the time limit (or of the longest one the ILP is sized to) that planning the
# mesh as one axis may take, ahead of the N-D ILP.
FLAT_SHARE = 0.2


def _flattened(problem: ShardingProblem, strategies_by_node, common: dict, constraints, output_placements,
               solve_flat: Callable[[ShardingProblem], Plan]) -> list[int] | None:
    """On an N-D mesh, the plan of its devices as one axis (``solve_flat``), each choice
    taken on every axis (a dim cut along all of them, a Partial over all): a candidate the
    N-D plan is never worse than. Under a budget the N-D ILP can stop at its time limit far
    above it (a 2x4 GPT: a 79% gap, 1.7 times the cost of the same devices planned as one
    axis of 8); the 1-D problem has far fewer choices. ``common``: the problem's other
    options (budget, ties, ...). None where a constraint is not the same on every axis, or
    the 1-D plan has no N-D twin, fits no budget or is not found in time."""
    mesh, n = problem.mesh, problem.mesh.ndim

    def flat_placements(given):
        if any(len(set(p)) != 1 for p in (given or {}).values()):
            return None
        return {name: (p[0],) for name, p in (given or {}).items()}

    flat_constraints, flat_outputs = flat_placements(constraints), flat_placements(output_placements)
    if flat_constraints is None or flat_outputs is None:
        return None
    # the slowest link of any axis: a collective over all devices crosses it
    one = Mesh.of(mesh.size, ("flat",), alpha=max(a.alpha for a in mesh.axes),
                  bandwidth=min(1.0 / a.beta for a in mesh.axes))
    try:
        flat_problem = build_problem(problem.ir, strategies_by_node, one, CostModel(one, problem.cost_model.device),
                                     output_placements=flat_outputs, constraints=flat_constraints, **common)
        flat = solve_flat(flat_problem)
    except (Infeasible, PlannerError):
        return None
    if flat_problem.names != problem.names:
        return None
    assignment = []
    for i, node in enumerate(flat.nodes):
        want = node.strategy
        twin = next((c for c, s in enumerate(problem.strategies[i])
                     if s.inputs == tuple(p * n for p in want.inputs) and s.outputs == tuple(p * n for p in want.outputs)),
                    None)
        if twin is None:
            return None
        assignment.append(twin)
    return assignment


def evaluate(problem: ShardingProblem, labels: Mapping[str, str], default: str | None = None) -> Plan:
    """The plan of hand-picked strategy labels (a hand-written Megatron, DP or FSDP plan),
    costed by the same model the planner uses."""
    return make_plan(problem, problem.assignment(labels, default))


def _amount(n: float) -> str:
    """Bytes with separators, a fraction as given (1.5, not 2); below one byte as it is (1e-300, not 0)."""
    if n < 1:
        return f"{n:g}"
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.3f}".rstrip("0").rstrip(".")


__all__ = ["FIRST_SHARE", "FLAT_SHARE", "GAP", "SOLVER_CHOICES", "evaluate", "lighter_inputs", "plan", "solve"]
