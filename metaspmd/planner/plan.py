"""A plan: the strategy of every node, the resharding on every edge, and what it costs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

from ..placement import Placements, placements_str
from .choice import Solution
from .cost import ReshardStep
from .mesh import Mesh
from .problem import PlannerError, ShardingProblem
from .strategies import NodeStrategy


@dataclass(frozen=True)
class NodePlan:
    name: str
    op: str | None  # None for a graph input
    strategy: NodeStrategy
    compute: float  # seconds per device
    memory: float  # bytes per device of the node's outputs
    outputs: tuple[str, ...] = ()  # names of the vars it defines (a graph input: itself)


@dataclass(frozen=True)
class Reshard:
    """``var`` moves from ``src`` to ``dst`` before it enters input ``slot`` of ``consumer``
    ('(output)' for a graph output, '(tie W)' for a value delivered in W's placement)."""

    var: str
    consumer: str
    slot: int
    src: Placements
    dst: Placements
    steps: tuple[ReshardStep, ...]
    cost: float

    def __str__(self) -> str:
        how = " + ".join(str(s) for s in self.steps) or "none"
        where = self.consumer if self.consumer.startswith("(") else f"{self.consumer}[{self.slot}]"
        return f"{self.var} -> {where}: [{placements_str(self.src)}] -> [{placements_str(self.dst)}] ({how})"


@dataclass(frozen=True)
class Plan:
    mesh: Mesh
    nodes: tuple[NodePlan, ...]
    reshards: tuple[Reshard, ...]  # only flows whose placement changes
    compute_cost: float
    comm_cost: float
    memory: float  # peak bytes per device over the steps (choice.Liveness)
    memory_budget: float | None
    solver: str = ""
    status: str = ""
    seconds: float = 0.0
    bound: float | None = None
    picked: str = ""  # whose plan it is when solve chose: the ILP solver's name or the beam's ('beam8')
    peak: tuple[tuple[str, float], ...] = ()  # the peak's bytes per device by kind (parameter, gradient, ...)
    peak_at: str = ""  # the op running at the peak ('(end)': after the last op)
    # (graph input var, a user's name of it: "fc1.weight", "input 0", or the position 0),
    # where a runtime's trace names its inputs otherwise (torch's arg0_1): the first str one
    # shown in the table; each taken by placement, before the trace's names (as constraints)
    labels: tuple[tuple[str, str | int], ...] = ()

    @property
    def gap(self) -> float | None:
        """How far the plan may be from the best: (cost - bound) / cost, the bound being the
        ILP's on the reduced problem."""
        if self.bound is None or self.total_cost <= 0:
            return None
        return max(0.0, (self.total_cost - self.bound) / self.total_cost)

    @property
    def total_cost(self) -> float:
        return self.compute_cost + self.comm_cost

    @cached_property
    def _by_name(self) -> dict[str, NodePlan]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def _by_var(self) -> dict[str, Placements]:
        return {var: n.strategy.outputs[k] for n in self.nodes for k, var in enumerate(n.outputs)}

    @cached_property
    def _by_label(self) -> dict[str | int, str]:
        return {label: var for var, label in self.labels}

    def node(self, name: str) -> NodePlan:
        try:
            return self._by_name[name]
        except KeyError:
            raise PlannerError(f"no node named {name!r} in the plan") from None

    def strategy(self, name: str) -> NodeStrategy:
        return self.node(name).strategy

    def placement(self, var: str | int) -> Placements:
        """Where a graph input (by a label, first, or its var) or op output lives after its
        producer runs."""
        name = self._by_label.get(var, var)
        if name in self._by_var:
            return self._by_var[name]
        if name != var:  # a label of a number the trace holds as a constant
            raise PlannerError(f"{var!r} is {name}, a number the trace holds as a constant: it has no placement")
        labels = ", ".join(repr(label) for _, label in self.labels)
        raise PlannerError(f"no var named {var!r} in the plan" + (f" (inputs are {labels}, or name a graph var)"
                                                                  if labels else ""))

    def collectives(self) -> list[str]:
        """Every non-free collective, as 'kind@axis', in plan order; then the neighbour
        exchanges nodes make themselves (a slice of a cut dim evened out), 'collective-permute@axis'."""
        steps = [str(s) for r in self.reshards for s in r.steps if s.kind not in ("slice", "zero")]
        return steps + [f"collective-permute@{self.mesh.axes[a].name}" for n in self.nodes for a in n.strategy.exchanges]

    def table(self) -> str:
        """A readable per-node table, then the resharding and the totals."""
        rows = [("node", "op", "strategy", "inputs", "outputs", "compute us", "MiB")]
        labels: dict[str, str] = {}
        for var, label in self.labels:
            if isinstance(label, str):
                labels.setdefault(var, label)
        for n in self.nodes:
            s = n.strategy
            rows.append((
                f"{n.name} ({labels[n.name]})" if n.name in labels else n.name,
                n.op or "(input)",
                s.label,
                " ".join("[" + placements_str(p) + "]" for p in s.inputs),
                " ".join("[" + placements_str(p) + "]" for p in s.outputs),
                f"{n.compute * 1e6:.2f}",
                f"{n.memory / 2**20:.2f}",
            ))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if self.reshards:
            lines.append("")
            lines.append("resharding:")
            lines.extend(f"  {r}  {r.cost * 1e6:.2f} us" for r in self.reshards)
        budget = "none" if self.memory_budget is None else f"{self.memory_budget / 2**20:.2f} MiB"
        lines.append("")
        lines.append(
            f"{self.mesh}  total {self.total_cost * 1e6:.2f} us = compute {self.compute_cost * 1e6:.2f}"
            f" + comm {self.comm_cost * 1e6:.2f}; memory {self.memory / 2**20:.2f} MiB/device (budget {budget})"
        )
        if self.peak:
            parts = " + ".join(f"{kind}s {size / 2**20:.2f}" for kind, size in self.peak)
            lines.append(f"memory peak at {self.peak_at}: {parts} MiB")
        if self.solver:
            bound = "" if self.bound is None else f", bound {self.bound * 1e6:.2f} us"
            bound += "" if self.gap is None else f", gap {self.gap:.2%}"  # none for a plan that costs nothing
            won = f"; the plan is {self.picked}'s" if self.picked and self.picked != self.solver else ""
            lines.append(f"solver {self.solver}: {self.status} in {self.seconds:.2f} s{bound}{won}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def make_plan(problem: ShardingProblem, assignment: Sequence[int], solution: Solution | None = None,
              picked: str = "") -> Plan:
    """The plan of a full assignment (one choice per problem node); ``picked``: whose it
    is, when the solver chose among several."""
    if len(assignment) != len(problem.names):
        raise PlannerError(f"assignment has {len(assignment)} choices for {len(problem.names)} nodes")
    cp = problem.choice
    cm = problem.cost_model
    nodes = tuple(
        NodePlan(name, None if op is None else op.op, problem.strategies[i][c], float(problem.compute[i][c]),
                 float(cp.nodes[i].memory[c]), tuple(v.name for v in problem.outputs[i]))
        for i, (name, op, c) in enumerate(zip(problem.names, problem.ops, assignment))
    )
    reshards = []
    for f in problem.flows:
        src = problem.strategies[f.producer][assignment[f.producer]].outputs[f.out_index]
        dst = problem.strategies[f.consumer][assignment[f.consumer]].inputs[f.slot]
        if src != dst:
            steps = cm.reshard_steps(f.var.shape, f.var.dtype, src, dst)
            times = problem.repeats[f.consumer] if problem.repeats else 1.0  # once per run of the consumer
            reshards.append(Reshard(f.var.name, problem.names[f.consumer], f.slot, src, dst, steps,
                                    times * sum(s.cost for s in steps)))
    for d in problem.deliveries:
        src = problem.strategies[d.producer][assignment[d.producer]].outputs[d.out_index]
        model = cm
        if d.anchor is not None:
            node, k = d.anchor
            dst = problem.strategies[node][assignment[node]].outputs[k]
            where = f"(tie {problem.outputs[node][k].name})"
            model = cm.fused(problem.tie_share)  # gradients are reduced in buckets
        else:
            dst = min(d.allowed, key=lambda q: cm.reshard(d.var.shape, d.var.dtype, src, q))
            where = "(output)"
        if src != dst:
            steps = model.reshard_steps(d.var.shape, d.var.dtype, src, dst)
            exposed = max(0.0, sum(s.cost for s in steps) - d.overlap)  # the rest runs beside compute
            reshards.append(Reshard(d.var.name, where, 0, src, dst, steps, exposed))
    return Plan(
        problem.mesh,
        nodes,
        tuple(reshards),
        sum(n.compute for n in nodes),
        sum(r.cost for r in reshards),
        cp.memory(assignment),
        cp.memory_budget,
        solution.solver if solution else "",
        solution.status if solution else "",
        solution.seconds if solution else 0.0,
        solution.bound if solution else None,
        picked,
        *_peak(problem, assignment),
    )


_KINDS = ("parameter", "gradient", "activation", "input")


def _peak(problem: ShardingProblem, assignment: Sequence[int]) -> tuple[tuple[tuple[str, float], ...], str]:
    """The bytes held at the peak step, by kind, and the op running then."""
    live = problem.choice.liveness
    assert live is not None
    step = int(live.profile(assignment).argmax())
    held: dict[str, float] = {}
    for b, size in zip(live.buffers, live.sizes(assignment).tolist()):
        if b.start <= step <= b.end:
            held[b.kind] = held.get(b.kind, 0.0) + size
    kinds = sorted(held, key=lambda k: (_KINDS.index(k) if k in _KINDS else len(_KINDS), k))
    ops = problem.ir.op_list
    return tuple((k, held[k]) for k in kinds), ops[step].name if step < len(ops) else "(end)"


__all__ = ["NodePlan", "Plan", "Reshard", "make_plan"]
