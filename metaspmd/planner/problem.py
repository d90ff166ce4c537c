"""Build the planning problem of a MetaIR on a mesh: nodes are graph inputs (choose a
placement) and ops (choose a node strategy); edges are tensor flows, costed by resharding
from the producer's output placement to the placement the consumer's strategy needs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from .. import spec
from ..ir import MetaIR, MetaOp, MetaVar
from ..placement import Partial, Placements, REPLICATE, Shard, is_valid, placements_str, why_invalid
from ..target import DTENSOR_PLAN, Target, lined_up
from .choice import Buffer, ChoiceEdge, ChoiceNode, ChoiceProblem, Factor, Liveness, Tie, TieMember
from .cost import CostModel, cut_moves
from .flops import dtype_bytes, is_conv, is_matmul
from .mesh import Mesh
from .strategies import (
    AxisStrategy, NodeStrategy, axis_strategies, compose, tensor_placements,
)


class PlannerError(ValueError):
    pass


@dataclass(frozen=True)
class Flow:
    """Tensor ``var`` flows from output ``out_index`` of node ``producer`` into tensor
    input ``slot`` of node ``consumer``."""

    var: MetaVar
    producer: int
    out_index: int
    consumer: int
    slot: int


@dataclass(frozen=True)
class Delivery:
    """Tensor ``var`` (output ``out_index`` of node ``producer``) must end in a given
    placement: the placement of the tie anchor (output ``anchor[1]`` of node ``anchor[0]``),
    or, with no anchor, the cheapest of ``allowed`` (a graph output)."""

    var: MetaVar
    producer: int
    out_index: int
    anchor: tuple[int, int] | None = None
    allowed: tuple[Placements, ...] = ()
    overlap: float = 0.0  # seconds of compute a tied gradient's reduction runs beside (_overlap)


@dataclass(frozen=True, eq=False)
class ShardingProblem:
    """A MetaIR's planning problem; ``choice`` is its solver-facing form (same node order)."""

    ir: MetaIR
    mesh: Mesh
    cost_model: CostModel
    names: tuple[str, ...]  # graph input var names and op names
    ops: tuple[MetaOp | None, ...]  # None for graph inputs
    outputs: tuple[tuple[MetaVar, ...], ...]  # per node, its outputs (a graph input: itself)
    strategies: tuple[tuple[NodeStrategy, ...], ...]
    compute: tuple[np.ndarray, ...]  # per node, per strategy: seconds of local compute
    flows: tuple[Flow, ...]
    deliveries: tuple[Delivery, ...]
    choice: ChoiceProblem
    repeats: tuple[float, ...] = ()  # per node, how often it runs per call (empty: once each)
    tie_share: float = 1.0  # a tied gradient's share of its bucket's fixed cost (tie_share)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise PlannerError(f"no node named {name!r}") from None

    def choice_of(self, name: str, label: str) -> int:
        i = self.index(name)
        for c, s in enumerate(self.strategies[i]):
            if s.label == label:
                return c
        raise PlannerError(f"node {name!r} has no strategy {label!r}: {[s.label for s in self.strategies[i]]}")

    def assignment(self, labels: Mapping[str, str], default: str | None = None) -> list[int]:
        """A full assignment from strategy labels by node name (hand-written plans).
        Nodes left out take ``default`` (e.g. the all-Replicate label) when given."""
        out = []
        for i, name in enumerate(self.names):
            label = labels.get(name, default)
            if label is None:
                raise PlannerError(f"no strategy given for node {name!r}")
            out.append(self.choice_of(name, label))
        return out


def _fills(op: MetaOp, ins: Sequence[MetaVar], target: Target) -> list[AxisStrategy]:
    """A fill from scalars the compiler computes in place (``Target.fill_ops``): its one
    output cut along each dim, the scalars Replicate."""
    outs = [v for v in op.outputs if v.is_tensor]
    if op.op not in target.fill_ops or any(len(v.shape) for v in ins) or len(outs) != 1 or len(op.outputs) != 1:
        return []
    return [AxisStrategy(f"fill{d}", (REPLICATE,) * len(ins), (Shard(d),)) for d in range(len(outs[0].shape))]


def _node_rules(op: MetaOp, rules: Sequence[spec.Strategy], ins: Sequence[MetaVar],
                target: Target = DTENSOR_PLAN) -> list:
    """Rule strategies fitted to the op's outputs: rules may list every output or only the
    tensor ones (non-tensor outputs are then Replicate); then the fills the compiler makes."""
    tensor_pos = [i for i, v in enumerate(op.outputs) if v.is_tensor]
    n_all, n_in = len(op.outputs), len(ins)
    rules = lined_up(rules, [v.shape for v in ins])
    fitted = axis_strategies(rules, n_in, n_all, target, op.op) + _fills(op, ins, target)
    if len(tensor_pos) != n_all:
        for r in axis_strategies(rules, n_in, len(tensor_pos), target, op.op):
            outs = [REPLICATE] * n_all
            for p, pos in zip(r.outputs, tensor_pos):
                outs[pos] = p
            fitted.append(dataclasses.replace(r, outputs=tuple(outs)))  # keeps even and exchange
    seen, unique = set(), []
    for r in fitted:
        if (r.inputs, r.outputs) not in seen:
            seen.add((r.inputs, r.outputs))
            unique.append(r)
    return unique


def _edge_factors(
    cm: CostModel, var: MetaVar, src: Sequence[Placements], dst: Sequence[Placements]
) -> tuple[Factor, ...]:
    """Reshard cost for every (producer choice, consumer choice), one factor per mesh axis.

    The cost on axis ``a`` depends only on the two placements on ``a``, on which later
    axes shard the source and which dims earlier axes cut on the destination (CostModel's
    axis-by-axis order), and on which earlier axes cut the source's dim of ``a`` (whether
    ``a`` regathers), so each factor's table is small.
    """
    shape = cm.mesh.shape
    factors = []
    for a in range(len(shape)):
        # Whether axis a regathers (cost.regathers) needs, of the earlier axes, only which
        # hold the source's cut of the same dim and which dims the destination cuts: keys
        # no finer than that, since every class is a pair variable per class of the other end
        def row_key(p: Placements) -> tuple:
            same = tuple(p[e] == p[a] for e in range(a)) if isinstance(p[a], Shard) else ()
            return (p[a], tuple(isinstance(p[b], Shard) for b in range(a + 1, len(shape))), same)

        def col_key(q: Placements) -> tuple:
            return (q[a], tuple(q[e] if isinstance(q[e], Shard) else None for e in range(a)))

        rk = {k: i for i, k in enumerate(dict.fromkeys(row_key(p) for p in src))}
        ck = {k: i for i, k in enumerate(dict.fromkeys(col_key(q) for q in dst))}
        table = np.zeros((len(rk), len(ck)))
        for (sa, later, same), i in rk.items():
            for (da, earlier), j in ck.items():
                again = cut_moves(sa, same, earlier)  # same is empty where sa cuts nothing
                if sa == da and not again:
                    continue
                others = 1
                for b, size in enumerate(shape):
                    if (b > a and later[b - a - 1]) or (b < a and earlier[b] is not None):
                        others *= size
                table[i, j] = cm.axis_cost(var.shape, var.dtype, a, sa, da, others, again)
        rows = np.array([rk[row_key(p)] for p in src], dtype=np.int64)
        cols = np.array([ck[col_key(q)] for q in dst], dtype=np.int64)
        factors.append(Factor(rows, cols, table))
    return tuple(factors)


def is_alias(op: MetaOp) -> bool:
    """Whether the op's output aliases its input: a view (torch marks these in the op's
    schema, ``OpOverload.is_view``: t, transpose, view, expand, detach, ...). Run locally
    on a shard, a view is a metadata change, so it costs no compute under any strategy;
    charging it the memory traffic of a copy would favour plans that shard its input."""
    return getattr(op.fn, "is_view", False) is True


def _op_choices(cm: CostModel, op: MetaOp, ins: Sequence[MetaVar], given: Sequence[spec.Strategy], strict: bool,
                target: Target = DTENSOR_PLAN):
    """An op's node strategies with their compute time and output memory, and whether it
    may follow its producer (shape-preserving and not a contraction)."""
    in_shapes = [v.shape for v in ins]
    out_shapes = [v.shape if v.is_tensor else None for v in op.outputs]
    rules = _node_rules(op, given, ins, target)
    ss = tuple(compose(rules, cm.mesh, in_shapes, out_shapes, strict))
    itemsize = dtype_bytes(next((v.dtype for v in (*op.outputs, *ins) if v.is_tensor), "float32"))
    t_outs = [(k, v) for k, v in enumerate(op.outputs) if v.is_tensor]
    if is_alias(op) or getattr(op.fn, "is_free", False) is True:  # a view (or a loop's in-place write): no cost
        cost = np.zeros(len(ss))
    else:
        cost = np.array([
            cm.compute(
                op.op,
                [cm.local_shape(sh, p) for sh, p in zip(in_shapes, s.inputs)],
                [cm.local_shape(v.shape, s.outputs[k]) for k, v in t_outs],
                itemsize,
                op.kwargs,
            )
            for s in ss
        ])
    mem = np.array([sum(cm.memory(v.shape, v.dtype, s.outputs[k]) for k, v in t_outs) for s in ss])
    # a slice of a cut dim: the compiler evens the pieces out, each device sending at most its
    # output shard to a neighbour, once per axis that cuts it (the node's own communication,
    # charged with its compute)
    cost = cost + np.array([sum(cm.neighbour_exchange(axis, m) for axis in s.exchanges) for s, m in zip(ss, mem)])
    shape_preserving = bool(ins) and all(v.shape in set(in_shapes) for _, v in t_outs)
    return ss, cost, mem, shape_preserving and not (is_matmul(op.op) or is_conv(op.op))


def _order(ir: MetaIR) -> list[tuple[str, object]]:
    """Ops in order; each graph input right after its first consumer (a beam search then
    sees what the input is for before placing it)."""
    pending = {v.name: v for v in ir.input_list if v.is_tensor}
    order: list[tuple[str, object]] = []
    for op in ir.op_list:
        order.append(("op", op))
        for v in op.input_vars:
            if v.name in pending:
                order.append(("input", pending.pop(v.name)))
    order.extend(("input", v) for v in pending.values())
    return order


def constraint_problem(p: Placements, shape: tuple[int, ...], mesh_shape: tuple[int, ...], is_input: bool,
                       strict: bool = True) -> str:
    """Why a constraint cannot place a tensor, in words ("" where it can): it must place the
    tensor validly, and a graph input arrives whole or cut, never as Partial summands."""
    if is_input and any(isinstance(x, Partial) for x in p):
        return "a parameter, buffer or input arrives whole or cut, never as Partial summands"
    return why_invalid(p, shape, mesh_shape, strict)


def _checked_constraints(ir: MetaIR, constraints: Mapping[str, Placements], mesh: Mesh,
                         strict: bool) -> dict[str, Placements]:
    """The constraints, each naming a tensor of the graph and placing it validly on the mesh."""
    tensors = {v.name: v for v in ir.input_list if v.is_tensor}
    tensors.update((v.name, v) for op in ir.op_list for v in op.outputs if v.is_tensor)
    out = {}
    for name, p in constraints.items():
        v = tensors.get(name)
        if v is None:
            raise PlannerError(f"constraint on {name!r}: the graph has no tensor of that name")
        p = tuple(p)
        why = constraint_problem(p, v.shape, mesh.shape, v.name in {u.name for u in ir.input_list}, strict)
        if why:
            raise PlannerError(f"constraint on {name!r}: [{placements_str(p)}] cannot place shape {v.shape} "
                               f"on mesh {mesh.shape}: {why}")
        out[name] = p
    return out


def build_problem(
    ir: MetaIR,
    strategies_by_node: Mapping[str, Iterable[spec.Strategy]],
    mesh: Mesh,
    cost_model: CostModel | None = None,
    memory_budget: float | None = None,
    ties: Sequence[Sequence[str]] = (),
    same_placement: Sequence[Sequence[str]] = (),
    output_placements: Mapping[str, Placements] | None = None,
    strict: bool = True,
    target: Target = DTENSOR_PLAN,
    constraints: Mapping[str, Placements] | None = None,
    repeats: Mapping[str, float] | None = None,
) -> ShardingProblem:
    """``strategies_by_node``: 1-D rule strategies per op node name (missing: replicate
    only). ``memory_budget``: bytes per device.

    ``ties``: groups of var names whose first member is the anchor (a parameter); every
    other member (its gradient) is delivered in the anchor's placement, paying for the
    resharding (DP's gradient all-reduce, FSDP's reduce-scatter).
    ``same_placement``: groups of vars whose producers must emit one placement (a
    parameter and its optimizer states), a hard constraint.
    ``output_placements``: required placements of graph outputs; other graph outputs end
    in their cheapest non-Partial placement (a Partial value is not materialised).
    ``target``: what the runtime runs of a rule strategy (``metaspmd.target``; JAX's
    partitioner finishes arg-reductions, index offsets, local params and halos too).
    ``constraints``: placements a user already decided, by var name (a graph input or an
    op's output): the plan gives those vars exactly these placements.
    ``repeats``: how often an op runs per call, by op name, where not once (a loop body's
    ops, once per iteration): its compute and the resharding into it are charged so often.
    """
    cm = cost_model or CostModel(mesh)
    if cm.mesh != mesh:
        raise PlannerError(f"the cost model was built for another mesh: {cm.mesh.described()}, not the plan's "
                           f"{mesh.described()}")
    names: list[str] = []
    ops: list[MetaOp | None] = []
    outputs: list[tuple[MetaVar, ...]] = []
    strats: list[tuple[NodeStrategy, ...]] = []
    nodes: list[ChoiceNode] = []
    where: dict[str, tuple[int, int]] = {}  # var name -> (node, output index)
    pending_flows: list[tuple[MetaVar, int, int]] = []  # (var, consumer, slot)
    op_cache: dict = {}
    edge_cache: dict = {}

    def edge(u: int, v: int, var: MetaVar, src: Sequence[Placements], dst: Sequence[Placements], label,
             model: CostModel = cm) -> ChoiceEdge:
        key = (var.shape, var.dtype, tuple(src), tuple(dst), id(model))
        if key not in edge_cache:
            factors = _edge_factors(model, var, src, dst)
            edge_cache[key] = (sum(f.dense() for f in factors), factors)
        m, factors = edge_cache[key]
        return ChoiceEdge(u, v, m, label, factors)

    fixed = _checked_constraints(ir, constraints or {}, mesh, strict)
    for kind, item in _order(ir):
        i = len(names)
        if kind == "input":
            v: MetaVar = item  # type: ignore[assignment]
            places = [fixed[v.name]] if v.name in fixed else tensor_placements(v.shape, mesh, strict)
            ss = tuple(NodeStrategy(placements_str(p), (), (p,)) for p in places)
            mem = np.array([cm.memory(v.shape, v.dtype, p) for p in places])
            names.append(v.name)
            ops.append(None)
            outputs.append((v,))
            strats.append(ss)
            where[v.name] = (i, 0)
            nodes.append(ChoiceNode(v.name, tuple(s.label for s in ss), np.zeros(len(ss)), mem,
                                    ("input", v.shape, v.dtype, fixed.get(v.name))))
            continue
        op: MetaOp = item  # type: ignore[assignment]
        ins = [v for v in op.input_vars if v.is_tensor]
        given = tuple(strategies_by_node.get(op.name, ()))
        key = (op.op, tuple((v.shape, v.dtype) for v in ins),
               tuple((v.shape, v.dtype, v.is_tensor) for v in op.outputs), given, repr(op.kwargs))
        if key not in op_cache:  # repeated layers share their strategies and costs
            op_cache[key] = _op_choices(cm, op, ins, given, strict, target) + (len(op_cache),)
        ss, cost, mem, follower, signature = op_cache[key]
        pins = [(k, fixed[v.name]) for k, v in enumerate(op.outputs) if v.name in fixed]
        if pins:  # a constrained output: only the strategies that give it
            keep = [c for c, s in enumerate(ss) if all(s.outputs[k] == p for k, p in pins)]
            if not keep:
                k, p = pins[0]
                raise PlannerError(f"no strategy of {op.name} ({op.op}) gives {op.outputs[k].name} the "
                                   f"constrained placements [{placements_str(p)}]")
            ss, cost, mem = tuple(ss[c] for c in keep), cost[keep], mem[keep]
            signature = (signature, tuple(keep))  # no longer interchangeable with its unconstrained twins
        times = float((repeats or {}).get(op.name, 1.0))
        if times != 1.0:
            cost, signature = cost * times, (signature, times)
        names.append(op.name)
        ops.append(op)
        outputs.append(tuple(op.outputs))
        strats.append(ss)
        nodes.append(ChoiceNode(op.name, tuple(s.label for s in ss), cost, mem, ("op", signature), follower))
        for k, v in enumerate(op.outputs):
            where[v.name] = (i, k)
        for slot, v in enumerate(ins):
            pending_flows.append((v, i, slot))

    flows: list[Flow] = []
    edges: list[ChoiceEdge] = []
    for v, consumer, slot in pending_flows:
        producer, k = where[v.name]
        flows.append(Flow(v, producer, k, consumer, slot))
        src = [s.outputs[k] for s in strats[producer]]
        dst = [s.inputs[slot] for s in strats[consumer]]
        e = edge(producer, consumer, v, src, dst, (k, slot))
        times = float((repeats or {}).get(names[consumer], 1.0))
        if times != 1.0:  # resharded every time the consumer runs
            e = ChoiceEdge(e.u, e.v, e.cost * times, e.label,
                           tuple(Factor(f.rows, f.cols, f.table * times) for f in e.factors))
        edges.append(e)

    nodes_before_delivery = list(nodes)
    tied: set[str] = set()
    deliveries: list[Delivery] = []
    # A step's gradients are reduced in buckets (cost.py): each tied gradient pays its
    # bytes and, where it is reduced, an equal share of one reduction's fixed cost.
    share = tie_share(ties)
    hidden = _overlap(ties, where, nodes_before_delivery)
    for group in ties:
        anchor = _locate(where, group[0], "ties")
        for var in group[1:]:
            n, k = _locate(where, var, "ties")
            tied.add(var)
            deliveries.append(Delivery(outputs[n][k], n, k, anchor=anchor, overlap=hidden[var]))
            src = [st.outputs[k] for st in strats[n]]
            dst = [st.outputs[anchor[1]] for st in strats[anchor[0]]]
            e = edge(n, anchor[0], outputs[n][k], src, dst, ("tie", k, anchor[1]), cm.fused(share))
            if hidden[var] > 0:  # what the overlap leaves is no longer a sum over mesh axes: no factors
                e = ChoiceEdge(e.u, e.v, np.maximum(e.cost - hidden[var], 0.0), e.label)
            edges.append(e)

    pinned = dict(output_placements or {})
    unknown = set(pinned) - {v.name for v in ir.output_list}
    if unknown:
        raise PlannerError(f"output_placements names vars that are not graph outputs: {sorted(unknown)}")
    for v in dict.fromkeys(ir.output_list):
        if not v.is_tensor or v.name in tied:
            continue
        n, k = where[v.name]
        allowed = _output_targets(v, pinned.get(v.name), mesh, strict)
        deliveries.append(Delivery(v, n, k, allowed=allowed))
        src = [st.outputs[k] for st in strats[n]]
        finish = sum(f.dense() for f in _edge_factors(cm, v, src, allowed)).min(axis=1)
        nodes[n] = ChoiceNode(nodes[n].name, nodes[n].labels, nodes[n].cost + finish, nodes[n].memory,
                              nodes[n].signature, nodes[n].follower)

    hard = []
    for group in same_placement:
        members = []
        for var in group:
            n, k = _locate(where, var, "same_placement")
            members.append(TieMember(n, tuple(st.outputs[k] for st in strats[n])))
        if len(members) > 1:
            hard.append(Tie(tuple(members)))

    live = _liveness(ir, cm, where, strats, ties, same_placement)
    choice = ChoiceProblem(tuple(nodes), tuple(edges), tuple(hard), memory_budget, liveness=live)
    compute = tuple(n.cost for n in nodes_before_delivery)
    return ShardingProblem(ir, mesh, cm, tuple(names), tuple(ops), tuple(outputs), tuple(strats), compute,
                           tuple(flows), tuple(deliveries), choice,
                           tuple(float((repeats or {}).get(n, 1.0)) for n in names) if repeats else (), share)


def _overlap(ties: Sequence[Sequence[str]], where: Mapping[str, tuple[int, int]],
             nodes: Sequence[ChoiceNode]) -> dict[str, float]:
    """Seconds of compute each tied gradient's reduction runs beside, as DDP and FSDP overlap
    a bucket's reduction with the backward compute that follows: the ops after the
    gradient's producer, up to and including the next gradient's producer (captured order),
    each at its least compute (a plan that keeps every device busy), shared among the
    gradients one op produces. Plan-independent, so a reduction's exposed time,
    max(0, its cost - this), stays a cost of its own edge."""
    grads = [var for group in ties for var in group[1:]]
    made: dict[int, int] = {}  # producer node -> gradients it makes
    for var in grads:
        n = _locate(where, var, "ties")[0]
        made[n] = made.get(n, 0) + 1
    producers = sorted(made)
    slot: dict[int, float] = {}
    for i, n in enumerate(producers):
        end = producers[i + 1] + 1 if i + 1 < len(producers) else len(nodes)
        slot[n] = sum(float(nodes[j].cost.min()) for j in range(n + 1, end)) / made[n]
    return {var: slot[_locate(where, var, "ties")[0]] for var in grads}


def tie_share(ties: Sequence[Sequence[str]]) -> float:
    """Each tied gradient's share of its bucket's fixed cost: one over the tied gradients."""
    return 1.0 / max(1, sum(len(group) - 1 for group in ties))


def _liveness(ir: MetaIR, cm: CostModel, where: Mapping[str, tuple[int, int]],
              strats: Sequence[Sequence[NodeStrategy]], ties: Sequence[Sequence[str]],
              same_placement: Sequence[Sequence[str]]) -> Liveness:
    """When each value is held, as a training step holds it. Step t runs op t of the
    captured order (backward included); step len(ops) is the state after the last op.

    Graph inputs are held throughout (the caller owns them; parameters and the states in
    ``same_placement`` groups are kind 'parameter'). An op output is held from its op to
    its last consumer, a graph output to the end. A view (``is_alias``) allocates nothing
    and keeps the value it views alive as long as it is read. A tied gradient is held in
    its producer's placement until its last consumer, and in its parameter's placement
    (after the all-reduce or reduce-scatter) from the next step to the end. Resharding
    buffers, live only while one op runs, are not counted.
    """
    ops = ir.op_list
    end = len(ops)
    root: dict[str, str] = {}  # var -> the var whose storage it is
    for op in ops:
        ins = [v for v in op.input_vars if v.is_tensor]
        for v in op.outputs:
            if v.is_tensor:
                root[v.name] = root.get(ins[0].name, ins[0].name) if is_alias(op) and ins else v.name
    tied = {var: group[0] for group in ties for var in group[1:]}
    persistent = {group[0] for group in ties} | {var for group in same_placement for var in group}
    last: dict[str, int] = {}
    for t, op in enumerate(ops):
        for v in op.input_vars:
            if v.is_tensor:
                last[root.get(v.name, v.name)] = t
    for v in ir.output_list:
        if v.is_tensor and v.name not in tied:
            last[root.get(v.name, v.name)] = end
    sizes: dict = {}

    def size(n: int, k: int, v: MetaVar) -> np.ndarray:
        key = (id(strats[n]), k, v.shape, v.dtype)
        if key not in sizes:  # repeated layers share their strategy tuples
            sizes[key] = (strats[n], np.array([cm.memory(v.shape, v.dtype, st.outputs[k]) for st in strats[n]]))
        return sizes[key][1]

    buffers = []
    for v in ir.input_list:
        if v.is_tensor:
            n, k = where[v.name]
            buffers.append(Buffer(n, size(n, k, v), 0, end, "parameter" if v.name in persistent else "input"))
    for t, op in enumerate(ops):
        for v in op.outputs:
            if not v.is_tensor or root[v.name] != v.name:
                continue
            n, k = where[v.name]
            kind = "gradient" if v.name in tied else "activation"
            buffers.append(Buffer(n, size(n, k, v), t, max(t, last.get(v.name, t)), kind))
            if v.name in tied and t < end:
                a, ak = where[tied[v.name]]
                buffers.append(Buffer(a, size(a, ak, v), t + 1, end, "gradient"))
    return Liveness(tuple(buffers), end + 1)


def _output_targets(v: MetaVar, pinned: Placements | None, mesh: Mesh, strict: bool) -> tuple[Placements, ...]:
    """Where a graph output may end: its pinned placement, else any non-Partial one."""
    if pinned is None:
        return tuple(tensor_placements(v.shape, mesh, strict))
    p = tuple(pinned)
    if any(isinstance(x, Partial) for x in p) or not is_valid(p, v.shape, mesh.shape, strict):
        raise PlannerError(f"output {v.name}: [{placements_str(p)}] is not a valid non-Partial placement "
                           f"of shape {v.shape} on {mesh}")
    return (p,)


def _locate(where: Mapping[str, tuple[int, int]], var: str, what: str) -> tuple[int, int]:
    if var not in where:
        raise PlannerError(f"{what} names {var!r}, which is not a tensor of the graph")
    return where[var]


__all__ = ["Delivery", "Flow", "PlannerError", "ShardingProblem", "build_problem"]
