"""Plan a JAX function's sharding and run it under jax.jit on a device mesh.

The captured program is replayed equation by equation inside one jitted function: graph
inputs enter with the plan's ``in_shardings``, every op output is pinned to its planned
placement with ``with_sharding_constraint``, and an operand the plan moves before an op
is pinned to the placement that op's strategy wants. Partial placements have no JAX
spelling, so those values are left for the partitioner (Shardy) to place; it inserts the
reduction where a later constraint asks for a Replicate or Shard value. The compiler
still owns correctness: constraints only steer where values live.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax._src import core
from jax.sharding import AxisType, Mesh, NamedSharding

from metaspmd import planner, runtime
from metaspmd.cache import RuleCache
from metaspmd.placement import placements_str
from metaspmd.resolve import ResolveStats
from metaspmd.runtime import named_constraints, refuse_named_inputs
from metaspmd.spec import Reduce, ShardIn, Strategy
from metaspmd.table import RuleTable
from metaspmd.target import JAX_PLAN

from .capture import Captured, capture, check_capture_options, leaf_names, read_atom, refuse_non_arrays
from .catalog import PREFIX
from .rules_at_runtime import node_call, without_literals
from .shared_plan import one_plan
from .shardings import constraint_placements, named_sharding, partition_spec, placements_of
from .tensor_ops import JaxOps

# Calls explored live at once: most of an exploration is XLA compiles, which release the
# GIL (the GPT block's cold parallelize: 14.3 s on one thread, 10.5 s on two cores). One
# per core, at most 8: each holds its own compiles in memory.
EXPLORE_THREADS = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def one_axis_at_a_time(src: planner.Placements, dst: planner.Placements) -> list[planner.Placements]:
    """The placements from ``src`` to ``dst`` changing one mesh axis at a time: gathers to
    Replicate first (the last axis first, so a dim cut over several axes is released from
    its minor axis), then moves between dims, then slices. XLA's partitioner does each such
    step as one collective, where a change of several axes at once (a dim cut over dp and tp
    moved to another dim on dp) can leave it no way but to replicate the tensor: an
    "involuntary full rematerialization". Where a Partial is involved, ``[dst]``: the
    partitioner places those values itself."""
    if any(isinstance(p, planner.Partial) for p in (*src, *dst)):
        return [tuple(dst)]
    axes = range(len(dst))
    order = ([a for a in reversed(axes) if src[a] != dst[a] and isinstance(dst[a], planner.Replicate)]
             + [a for a in axes if src[a] != dst[a] and isinstance(src[a], planner.Shard) and isinstance(dst[a], planner.Shard)]
             + [a for a in axes if src[a] != dst[a] and isinstance(src[a], planner.Replicate)])
    path, now = [], list(src)
    for a in order:
        now[a] = dst[a]
        path.append(tuple(now))
    return path or [tuple(dst)]


def auto_mesh(mesh: Mesh) -> Mesh:
    """The mesh parallelize runs on: ``mesh`` itself, or where it has Explicit axes (as
    ``jax.make_mesh`` makes them) its twin with Auto ones, same devices and names: values
    are placed with ``with_sharding_constraint``, which refers to Auto axes only."""
    bad = [n for n in mesh.axis_names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"mesh axis names must be strings, got {bad[0]!r} (axis names {tuple(mesh.axis_names)!r}): "
                        "name them, Mesh(devices, ('dp', 'tp'))")
    types = tuple(mesh.axis_types)
    manual = tuple(n for n, t in zip(mesh.axis_names, types) if t == AxisType.Manual)
    if manual:
        raise ValueError(f"mesh axes {manual} are Manual (a shard_map's inside); parallelize plans over Auto or "
                         f"Explicit axes: jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * n)")
    if all(t == AxisType.Auto for t in types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(types))


def planner_mesh(mesh: Mesh) -> planner.Mesh:
    return planner.Mesh.of(tuple(mesh.devices.shape), tuple(str(n) for n in mesh.axis_names))


def _constrainable(x: Any) -> bool:
    return isinstance(x, jax.Array) and x.ndim > 0 and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended)


def _tree_difference(args: tuple, captured: Any, with_params: bool) -> str:
    """Where ``args`` (params first where the plan has them, then the inputs) differ from
    the captured tree: the leaves one has and the other lacks, by name (``params.w2``);
    the two structures where the leaves agree (a list given for a tuple)."""
    given = leaf_names(args, with_params)
    wanted = leaf_names(jax.tree.unflatten(captured, [0] * captured.num_leaves), with_params)
    missing, extra = [n for n in wanted if n not in given], [n for n in given if n not in wanted]
    said = [f"{what} {', '.join(names[:5])}{' and more' if len(names) > 5 else ''}"
            for what, names in (("missing", missing), ("not in the captured call", extra)) if names]
    return "; ".join(said) or f"{jax.tree.structure(args)} vs {captured}"


@dataclass(eq=False)  # hashed by identity: jax.jit(par) hashes the callable it is given
class Parallelized:
    """A captured function with its plan; call it like the function (minus ``params``)."""

    captured: Captured
    plan: planner.Plan
    stats: ResolveStats
    mesh: Mesh  # the Auto mesh it runs on
    params: Any = None
    caller_mesh: Mesh | None = None  # the caller's mesh where it has Explicit axes: outputs are delivered on it

    def _sharding(self, placements: planner.Placements, ndim: int) -> NamedSharding | None:
        return named_sharding(self.mesh, placements, ndim)

    @cached_property
    def in_shardings(self) -> tuple[NamedSharding, ...]:
        ir = self.captured.ir
        return tuple(self._sharding(self.plan.placement(v.name), len(v.shape)) for v in ir.input_list)

    @cached_property
    def _final(self) -> dict[str, planner.Placements]:
        """Where each graph output is delivered: a gradient in its parameter's placement."""
        return {r.var: r.dst for r in self.plan.reshards if r.consumer.startswith("(")}

    def _constrain(self, x: Any, placements: planner.Placements) -> Any:
        if not _constrainable(x):
            return x
        sharding = self._sharding(placements, x.ndim)
        return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)

    def _move(self, x: Any, src: planner.Placements, dst: planner.Placements) -> Any:
        """``x``, placed ``src``, pinned to ``dst`` one mesh axis at a time."""
        for step in one_axis_at_a_time(src, dst):
            x = self._constrain(x, step)
        return x

    @cached_property
    def _tensors(self) -> frozenset[str]:
        ir = self.captured.ir
        return frozenset(v.name for v in (*ir.input_list, *(o for op in ir for o in op.outputs)) if v.is_tensor)

    def _run(self, *flat: Any) -> list[Any]:
        c = self.captured
        env = dict(zip(c.graph_inputs, flat))
        self._replay(c.eqns, env)
        results = []
        for a in c.outputs:
            x = read_atom(env, a)
            if isinstance(a, str) and a in self._final:
                x = self._move(x, self.plan.placement(a), self._final[a])
            results.append(x)
        return results

    def _replay(self, eqns, env: dict) -> None:
        plan = self.plan
        for e in eqns:
            if e.region is not None:
                env.update(zip(e.outputs, self._region(e, env)))
                continue
            strategy = plan.strategy(e.name)
            wanted = iter(strategy.inputs)  # one per tensor operand, in operand order
            operands = []
            for a in e.inputs:
                x = read_atom(env, a)
                if isinstance(a, str) and a in self._tensors:
                    dst = next(wanted)
                    if dst != plan.placement(a):  # the plan reshards this edge
                        x = self._move(x, plan.placement(a), dst)
                operands.append(x)
            outs = e.bind(operands)
            for name, x, p in zip(e.outputs, outs, strategy.outputs):
                env[name] = self._constrain(x, p)

    def _body(self, region, k: int, env: dict, bound: dict, leave=None) -> list[Any]:
        """Body ``k`` replayed under its plan, in a copy of ``env`` (the loop's consts are
        read from there) with ``bound`` entering; its results pinned where ``leave`` (the
        boundary nodes they go through) takes them."""
        inner = dict(env)
        inner.update(bound)
        self._replay(region.bodies[k], inner)
        leave = region.leave if leave is None else leave
        return [self._constrain(read_atom(inner, a), self.plan.strategy(b.name).inputs[k if region.kind == "cond" else 0])
                for a, b in zip(region.outputs[k], leave)]

    def _region(self, e, env: dict) -> list[Any]:
        """Run control flow with its bodies replayed under the plan: ``with_sharding_constraint``
        inside the bodies keeps XLA to the planned placements in every iteration."""
        r, p, plan = e.region, e.params, self.plan
        ins = [read_atom(env, a) for a in e.inputs]

        def entering(b, x):  # into a boundary node as its strategy takes it
            return self._constrain(x, plan.strategy(b.name).inputs[0])

        def out(b, x):
            return self._constrain(x, plan.placement(b.outputs[0]))

        if r.kind == "scan":
            nc, nk = p["num_consts"], p["num_carry"]
            cin, slices = r.enter[:nk], r.enter[nk:]
            init = [out(b, x) for b, x in zip(cin, ins[nc:nc + nk])]
            xs = [entering(b, x) for b, x in zip(slices, ins[nc + nk:])]

            def step(carry, x):
                bound = {b.outputs[0]: v for b, v in zip(cin, carry)}
                bound.update((b.outputs[0], out(b, v)) for b, v in zip(slices, x))
                res = self._body(r, 0, env, bound)
                return res[:nk], res[nk:]

            carry, ys = jax.lax.scan(step, init, xs, length=p["length"], reverse=p["reverse"], unroll=p["unroll"])
            return [out(b, v) for b, v in zip(r.leave, [*carry, *ys])]
        if r.kind == "while":
            cc, bc = p["cond_nconsts"], p["body_nconsts"]
            cond = p["cond_jaxpr"]

            def more(carry):
                return core.eval_jaxpr(cond.jaxpr, cond.consts, *ins[:cc], *carry)[0]

            def body(carry):
                return self._body(r, 0, env, {b.outputs[0]: v for b, v in zip(r.enter, carry)})

            return list(jax.lax.while_loop(more, body, [out(b, x) for b, x in zip(r.enter, ins[cc + bc:])]))
        branches = [lambda k=k: self._body(r, k, env, {}) for k in range(len(r.bodies))]
        return [out(b, v) for b, v in zip(r.leave, jax.lax.switch(ins[0], branches))]

    @cached_property
    def jitted(self) -> Callable[..., list[Any]]:
        return jax.jit(self._run, in_shardings=self.in_shardings)

    def _flat_inputs(self, inputs: tuple, params: Any) -> list[Any]:
        refuse_non_arrays(inputs, params)
        if params is not None and self.params is None:
            raise TypeError("params= given, but the plan was made without params: the function's inputs are all "
                            "its arguments; parallelize again with params= to plan a forward and backward")
        args = (self.params if params is None else params, *inputs) if self.params is not None else inputs
        leaves, tree = jax.tree.flatten(args)
        if tree != self.captured.in_tree:
            raise ValueError("inputs do not match the captured structure: "
                             + _tree_difference(args, self.captured.in_tree, self.params is not None))
        # The plan (and the program) hold for the captured shapes and dtypes only: jit would
        # trace the replay again for others, which fails deep in it or runs a plan made for
        # other arithmetic (bf16 through a float32 plan).
        for x, v in zip(leaves, self.captured.ir.input_list):
            if v.is_tensor and tuple(jnp.shape(x)) != v.shape:
                raise ValueError(f"{v.name}: shape {tuple(jnp.shape(x))}, but the plan is for {v.shape}")
            if v.is_tensor and str(jnp.result_type(x)) != v.dtype:
                raise TypeError(f"{v.name}: dtype {jnp.result_type(x)}, but the plan is for {v.dtype}: "
                                "parallelize again for this dtype, or cast the input")
        flat = leaves + [v for _, v in self.captured.consts]
        return [jax.device_put(x, s) for x, s in zip(flat, self.in_shardings)]

    def __call__(self, *inputs: Any, params: Any = None, **named: Any) -> Any:
        """Run the plan: the function's outputs, or ``(out, grads)`` for a forward+backward
        capture. ``params`` replaces the stored parameters (same structure and shapes)."""
        refuse_named_inputs(named)
        outs = self.jitted(*self._flat_inputs(inputs, params))
        return jax.tree.unflatten(self.captured.out_tree, [self._delivered(x) for x in outs])

    def _delivered(self, x: Any) -> Any:
        """``x`` on the caller's Explicit mesh (the same buffers, retyped), where it would not
        mix with the caller's arrays on its Auto twin."""
        s = getattr(x, "sharding", None)
        if self.caller_mesh is None or not isinstance(s, NamedSharding) or s.mesh != self.mesh:
            return x
        return jax.device_put(x, NamedSharding(self.caller_mesh, s.spec))

    def lower(self, *inputs: Any, params: Any = None):
        """The jitted program lowered for these inputs (``.compile().as_text()`` shows its HLO)."""
        return self.jitted.lower(*self._flat_inputs(inputs, params))

    def explain(self) -> str:
        loops = "".join(f"\n  {line}" for line in self.captured.loops)
        return f"{self.plan.table()}\n\nrules: {self.stats}" + (f"\nloops:{loops}" if loops else "")


def _sums_wrongly_on_meshes_of_axes(e) -> bool:
    """Does XLA (jax 0.10.2, Shardy and GSPMD alike) sum this op's Partial output over
    every device of a mesh of several axes, rather than over the axis that cut it? A
    convolution with ``batch_group_count`` > 1 (a grouped convolution's weight gradient)
    cut along its batch or spatial dims on one axis of a 2x2 mesh comes back 2x, on a 2x4
    4x; cut on every axis, or along its channels, it is exact, as is a 1-D mesh."""
    return e.prim.name == "conv_general_dilated" and e.params.get("batch_group_count", 1) > 1


def _summed_output(s: Strategy) -> bool:
    return any(isinstance(c, Reduce) for o in s.outputs for c in o.options)


def _dims_xla_aborts_cutting(e) -> frozenset[int]:
    """The dims of a ``pad`` whose cut XLA's SPMD partitioner aborts the process on (jax
    0.10.2, ``spmd_partitioner.cc`` "Check failed: get_first_valid_element_offset_on_dilated_shard"):
    a negative low padding that is not a multiple of the interior padding + 1, so that the
    first element kept falls in an interior gap (``(-1, 2, 1)``; ``(-2, -1, 1)`` and
    ``(-1, 2, 0)`` partition fine). The rule holds; the program never runs."""
    if e.prim.name != "pad":
        return frozenset()
    return frozenset(d for d, (low, _, interior) in enumerate(e.params["padding_config"])
                     if low < 0 and interior > 0 and low % (interior + 1))


def _cuts(s: Strategy, dims: frozenset[int]) -> bool:
    return isinstance(s.inputs[0], ShardIn) and s.inputs[0].dim in dims


@dataclass
class JaxRuntime:
    """The runtime backend for a ``jax.sharding.Mesh``: capture as a jaxpr (forward and
    backward with ``params``), run under ``jax.jit`` with the planned shardings."""

    mesh: Mesh
    params: Any = None
    backward: bool = True
    loss_fn: Callable | None = None
    table: Any = None  # the RULES of a table in the generated module's form, instead of the generated one
    while_trips: Any = None  # trips per call charged a while loop without static bounds (capture.WHILE_TRIPS)
    caller_mesh: Mesh = field(init=False)  # ``mesh`` as given; ``mesh`` becomes its Auto twin (auto_mesh)

    name = "jax"
    target = JAX_PLAN
    ops = JaxOps()
    isolation = None  # forking a process that runs XLA's threads is not safe: explore in process
    threads = EXPLORE_THREADS
    quiet = staticmethod(runtime.quiet)

    def __post_init__(self) -> None:
        # refused here, before the capture: runtime.parallelize makes the runtime first
        devices = list(self.mesh.devices.flat)
        twice = next((d for d in devices if devices.count(d) > 1), None)
        if twice is not None:  # one device cannot hold two shards of an array
            raise ValueError(f"device {twice} appears {devices.count(twice)} times in the mesh: each position of a "
                             "jax Mesh needs a device of its own")
        self.caller_mesh, self.mesh = self.mesh, auto_mesh(self.mesh)
        check_table(self.table)
        check_capture_options(self.params, self.backward, self.loss_fn, self.while_trips)

    def planner_mesh(self, mesh: Mesh) -> planner.Mesh:
        return planner_mesh(mesh)

    def capture(self, fn: Callable, example_inputs: tuple) -> Captured:
        return capture(fn, example_inputs, params=self.params, backward=self.backward, loss_fn=self.loss_fn,
                       while_trips=self.while_trips)

    def node_call(self, captured: Captured, node):
        return node_call(captured, node, self._rules)

    @cached_property
    def _rules(self) -> RuleTable | None:
        return RuleTable(self.table) if self.table is not None else None

    def strategies(self, captured: Captured, found):
        kept = {name: without_literals(s, captured.eqn(name).literal_positions) for name, s in found.items()}
        for name, strategies in kept.items():
            aborting = _dims_xla_aborts_cutting(captured.eqn(name))
            if aborting:
                kept[name] = tuple(s for s in strategies if not _cuts(s, aborting))
        if sum(size > 1 for size in self.mesh.shape.values()) > 1:
            for name, strategies in kept.items():
                if _sums_wrongly_on_meshes_of_axes(captured.eqn(name)):
                    kept[name] = tuple(s for s in strategies if not _summed_output(s))
        return kept

    def plan_options(self, captured: Captured) -> dict:
        """Loop bodies: each node charged once per iteration, each carry in one placement."""
        return {"repeats": captured.repeats, "same_placement": captured.same_placement}

    def ties(self, captured: Captured):
        if self.params is None or not self.backward:
            return []
        grads = captured.outputs[captured.n_outputs:]
        return [(p, g) for p, g in zip(captured.param_names, grads) if isinstance(g, str) and g != p]

    def constraints(self, captured: Captured, given) -> dict:
        """Keys: an input leaf's name (``"params.w1"``, ``"in0"``) or a graph var; values:
        PartitionSpec, NamedSharding or placements. The function's own
        ``with_sharding_constraint`` calls pin their outputs too."""
        pinned, annotated = {}, {}
        for e in captured.eqns:
            sharding = e.params.get("sharding") if e.prim.name == "sharding_constraint" else None
            if isinstance(sharding, NamedSharding) and tuple(sharding.mesh.axis_names) == tuple(self.mesh.axis_names):
                pinned[e.outputs[0]] = placements_of(self.mesh, sharding)
                annotated[e.outputs[0]] = f"with_sharding_constraint on {e.inputs[0]}"
        names = {n: n for n in captured.input_names}
        checked = {key: constraint_placements(self.mesh, key, value, getattr(captured.avals.get(key), "ndim", None))
                   for key, value in given.items()}
        pinned.update(named_constraints(names, captured.ir, checked, tuple, tuple(self.mesh.shape.values())))
        for var, p in pinned.items():
            _refuse_cutting_a_scanned_dim(captured, self.mesh, var, p, annotated.get(var, f"constraint on {var!r}"))
        return pinned

    def one_plan(self, solve, key: str = ""):
        # under jax.distributed, the first process plans for every process (see shared_plan)
        return one_plan(self.mesh, solve, key)

    def run(self, fn, captured: Captured, plan: planner.Plan, stats: ResolveStats, mesh: Mesh) -> Parallelized:
        return Parallelized(captured, plan, stats, self.mesh, self.params,
                            caller_mesh=None if self.caller_mesh is self.mesh else self.caller_mesh)


def _refuse_cutting_a_scanned_dim(captured: Captured, mesh: Mesh, var: str, p: planner.Placements, what: str) -> None:
    """ValueError, before planning, for a value a scan reads in place that is pinned cut
    along a dim the scan iterates over (or Partial): no plan gives it, and the ILP would
    only say that no assignment meets its ties."""
    whole = captured.whole_dims.get(var)
    if whole is None:
        return
    cut = sorted({x.dim for x in p if isinstance(x, planner.Shard)} & whole)
    partial = any(isinstance(x, planner.Partial) for x in p)
    if cut or partial:
        shape = captured.avals[var].shape
        given = partition_spec(p, mesh.axis_names, len(shape)) or f"[{placements_str(p)}]"
        held = f"cuts dim {cut[0]} of shape {shape}, the dim" if cut else "holds Partial sums of a value"
        axis = next(a for a, x in zip(mesh.axis_names, p) if not isinstance(x, planner.Replicate))
        whole_only = len(shape) <= max(whole) + 1  # a stack of per-layer scalars: no other dim to cut
        other = "" if whole_only else f"cut another dim (as P({', '.join(['None'] * (max(whole) + 1))}, {axis!r})) or "
        raise ValueError(f"{what}: {given} {held} a lax.scan iterates over: a scan reads its slices from the "
                         f"stacked value where it lies, so dims {sorted(whole)} stay whole on every device; "
                         f"{other}leave the value to the planner")


def check_table(table: Any) -> None:
    """Refuse, before any work, a ``table`` that is no mapping op -> signature -> entry
    (RuleTable would fail on its first lookup, saying only that a str has no ``get``)."""
    if table is None or (isinstance(table, Mapping) and all(isinstance(v, Mapping) for v in table.values())):
        other = next((op for op in table or () if not str(op).startswith(PREFIX)), None)
        if other is not None:  # every node would miss it, and explore live
            raise ValueError(f"table holds {other!r}, which is no JAX primitive (they are named {PREFIX}<primitive>): "
                             "pass a JAX rule table, as metaspmd.generated.jax_rules.RULES")
        return
    raise TypeError(f"table must be the RULES of a rule table, a dict op -> signature -> entry (as "
                    f"metaspmd.generated.jax_rules.RULES), got {table!r:.80}")


def check_early(mesh: Any, constraints: Any) -> None:
    """What needs no trace, refused before the capture: the mesh (see auto_mesh) and the
    constraints' values (their keys name traced values: checked once traced)."""
    if not isinstance(mesh, Mesh):
        return  # runtime.runtime_for names what it is
    mesh = auto_mesh(mesh)
    for key, value in constraints.items() if isinstance(constraints, Mapping) else ():
        constraint_placements(mesh, key, value)


RUNTIME = JaxRuntime


def parallelize(
    fn: Callable,
    mesh: Mesh,
    example_inputs: tuple,
    *,
    params: Any = None,
    backward: bool = True,
    loss_fn: Callable | None = None,
    memory_budget: float | None = None,
    time_limit: float | None = None,
    solver: str = "ilp",
    cache: RuleCache | None = None,
    cost_model: planner.CostModel | None = None,
    table: Any = None,
    constraints: dict | None = None,
    while_trips: float | dict | None = None,
    links: dict | None = None,
) -> Parallelized:
    """Capture ``fn``, find every node's rules (table, cache, live ShardCombine), plan on
    ``mesh``, and return a callable that runs the plan under jit.

    With ``params``, ``fn(params, *inputs)`` runs forward and backward: the call returns
    ``(out, grads)`` of ``loss_fn(out)`` (default: the sum of the outputs), and each
    gradient is planned in its parameter's placement. ``table``: the ``RULES`` of a rule
    table in the generated module's form, used instead of metaspmd.generated.jax_rules.
    ``constraints``: shardings already decided (PartitionSpec or NamedSharding) by input leaf
    name (``"params.w1"``, ``"in0"``); the function's own ``with_sharding_constraint`` calls
    are kept too. A mesh with Explicit axes (``jax.make_mesh``'s default) runs on its Auto
    twin (see auto_mesh), and the outputs come back on it. ``while_trips``: how often a ``while`` loop without static bounds runs per
    call, which its body's cost is charged (one number, or by the loop's name as
    ``explain()`` lists it; default ``capture.WHILE_TRIPS``, stated there); a scan's length
    and a ``fori_loop``'s constant bounds are counted exactly. ``links``: each named mesh
    axis's ``(seconds per message, bytes per second)`` (``metaspmd.parallelize``'s).
    """
    check_early(mesh, constraints)
    return runtime.parallelize(fn, mesh, example_inputs, params=params, backward=backward, loss_fn=loss_fn,
                               memory_budget=memory_budget, time_limit=time_limit, solver=solver, cache=cache,
                               cost_model=cost_model, table=table, constraints=constraints, while_trips=while_trips,
                               links=links)


__all__ = ["JaxRuntime", "Parallelized", "RUNTIME", "auto_mesh", "parallelize", "planner_mesh"]
