"""Capture a JAX function as MetaIR: its jaxpr, flattened to primitive equations.

``jax.make_jaxpr`` traces the function (with ``params``: ``jax.value_and_grad`` of a
scalar loss, so forward and backward are one graph). Call-like equations (jit,
custom_jvp_call, custom_vjp_call, closed_call, remat, and a custom_linear_solve's solve
jaxpr, all its impl and lowering run) are inlined so every node is one
primitive, named ``jax.<primitive>`` as in the JAX backend and its rule table; a remat
differentiated with ``prevent_cse`` keeps its optimization barrier, one per operand, so
XLA still recomputes instead of reusing the forward's values. Dead equations are dropped.
A node's signature (and so its table rules) comes from the traced shapes alone; the real
operands that live exploration of a table miss needs are recorded on first use only, by
evaluating the flat equations one by one on the example inputs (``RecordedValues``): a
warm rule cache plans without running any of the model, scans and loops included.

Control flow (scan, while, cond) is planned through its bodies: the equation stays one
``FlatEqn`` holding a ``Region``, whose bodies are captured once each (not once per
iteration) and whose MetaIR is the bodies' nodes between boundary nodes, which the planner
places like ops and the runtime never binds: a loop carry enters and leaves through a
``carry`` node (the two kept in one placement, so every iteration sees the carry where the
first did), a scanned-over operand through ``scan_slice`` (the stacked value cut along a
dim is each iteration's slice cut along that dim less one: the leading dim stays whole), a
scanned-out result through ``scan_stack``, and a ``cond``'s outputs through one
``cond_merge`` each, whose branches must all deliver that one placement. A body reads the
loop's other operands (its consts) directly. ``repeats`` says how often each node runs per
call: a scan's ``length``; a while loop's trip count where its bounds are static (a
``fori_loop``: a counter from a constant, stepped by a constant, compared with a constant),
else the estimate it is given (``while_trips``, default ``WHILE_TRIPS``, capped by such a
counter ``and``ed into the cond), which ``Captured.loops`` states.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import reprlib
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core
from jax._src.lax.lax import optimization_barrier_p

from metaspmd.ir import MetaIR, MetaOp, MetaVar, RecordedValues

from .backend import PrimitiveCall
from .catalog import PREFIX
from .params import group_operands, signature_params
from .programs import INLINED

Atom = Any  # a var name (str) or a core.Literal

# Control flow planned through its bodies, and the boundary nodes of its regions.
REGIONS = frozenset({"scan", "while", "cond"})
CARRY, SCAN_SLICE, SCAN_STACK, COND_MERGE = "carry", "scan_slice", "scan_stack", "cond_merge"
BOUNDARY = {k: core.Primitive(k) for k in (CARRY, SCAN_SLICE, SCAN_STACK, COND_MERGE)}

# A while loop's trips per call where its bounds are not static: a stated estimate (what a
# plan charges its body), which ``while_trips`` replaces.
WHILE_TRIPS = 10


class ControlFlowError(ValueError):
    """Control flow whose plan could not keep one placement per carry."""


class CarryTypeError(ControlFlowError, TypeError):
    """A loop carry whose shape or dtype changes between iterations: a TypeError, as jax's
    own error for it is."""


class _Boundary:
    """The callable of a boundary node, never run by the runtime. It costs no compute:
    carries, slices and merges are views of what they pass on; a stack holds memory of
    its own (every iteration's slice) but the loop writes each slice in place."""

    is_free = True

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.is_view = kind != SCAN_STACK

    def __call__(self, *args: Any) -> Any:
        if self.kind == SCAN_SLICE:
            return args[0][0], args[0]
        if self.kind == SCAN_STACK:
            return args[0][None]
        return args[0]


@dataclass(frozen=True)
class FlatEqn:
    """One primitive call of the flattened program. ``inputs`` are var names or literals."""

    name: str
    prim: core.Primitive = field(compare=False)
    params: dict = field(compare=False, hash=False)
    inputs: tuple[Atom, ...]
    outputs: tuple[str, ...]
    effectful: bool = False
    region: "Region | None" = field(default=None, compare=False)

    @property
    def literal_positions(self) -> tuple[int, ...]:
        """Operands that are constants of the program, not values flowing in the graph."""
        return tuple(i for i, a in enumerate(self.inputs) if isinstance(a, core.Literal))

    def bind(self, operands: Sequence[Any]) -> list[Any]:
        out = self.prim.bind(*operands, **self.prim.get_bind_params(self.params))
        return list(out) if self.prim.multiple_results else [out]


@dataclass(frozen=True)
class Region:
    """A control-flow equation planned through its bodies (``kind``: scan, while, cond).

    ``enter``: boundary nodes before the bodies (a loop's carries, then a scan's slices);
    ``bodies``: each body's equations and its results (``outputs``); ``leave``: boundary
    nodes after them (a loop's carries, then a scan's stacks; a cond's merges), whose
    outputs are the equation's. ``carries``: (carry in, carry out) names, one placement each."""

    kind: str
    enter: tuple[FlatEqn, ...]
    bodies: tuple[tuple[FlatEqn, ...], ...]
    outputs: tuple[tuple[Atom, ...], ...]
    leave: tuple[FlatEqn, ...]

    @property
    def carries(self) -> tuple[tuple[str, str], ...]:
        if self.kind == "cond":
            return ()
        cin = [e for e in self.enter if e.prim is BOUNDARY[CARRY]]
        cout = [e for e in self.leave if e.prim is BOUNDARY[CARRY]]
        return tuple((a.outputs[0], b.outputs[0]) for a, b in zip(cin, cout))


def walk(eqns: Sequence[FlatEqn]):
    """Every equation the MetaIR has a node for, in its order: a region's boundary nodes and
    its bodies' equations in place of the region."""
    for e in eqns:
        if e.region is None:
            yield e
            continue
        yield from e.region.enter
        for body in e.region.bodies:
            yield from walk(body)
        yield from e.region.leave


@dataclass(frozen=True)
class Captured:
    """The flat program, its MetaIR, and how it maps to the caller's arguments and results."""

    ir: MetaIR
    eqns: tuple[FlatEqn, ...]
    input_names: tuple[str, ...]  # flat caller inputs: parameter leaves, then input leaves
    consts: tuple[tuple[str, Any], ...]  # constants the trace captured: extra graph inputs
    outputs: tuple[Atom, ...]  # flat results: function outputs, then gradients
    in_tree: Any = field(compare=False)  # treedef of (params, *inputs) or inputs
    out_tree: Any = field(compare=False)
    param_names: tuple[str, ...]  # the leading input_names that are parameters
    n_outputs: int  # leading flat results that are the function's own outputs
    values: Mapping = field(compare=False, hash=False)  # node name -> its real operands (flat), on first use
    trips: dict = field(default_factory=dict, compare=False, hash=False)  # loop equation -> body runs per call
    trip_sources: dict = field(default_factory=dict, compare=False, hash=False)  # loop equation -> where its trips come from
    avals: dict = field(default_factory=dict, compare=False, hash=False)  # var name -> its traced aval

    def abstract(self, name: str) -> tuple | None:
        """Node ``name``'s operands as traced (ShapedArrays: shapes and dtypes, no values),
        or None where one is no array (a token): its signature then needs the real ones."""
        out = tuple(_aval(a, self.avals) for a in self.eqn(name).inputs)
        return out if all(isinstance(a, core.ShapedArray) for a in out) else None

    @property
    def loops(self) -> list[str]:
        """One line per loop: its body's trips per call and where that count comes from."""
        return [f"{name}: {self.trips[name]:g} trips per call ({self.trip_sources[name]})" for name in self.trips]

    @cached_property
    def _by_name(self) -> dict[str, FlatEqn]:
        by = {e.name: e for e in walk(self.eqns)}
        by.update((e.name, e) for e in self.regions)
        return by

    @cached_property
    def regions(self) -> tuple[FlatEqn, ...]:
        """Every control-flow equation planned through, nested ones too."""
        out: list[FlatEqn] = []

        def visit(eqns: Sequence[FlatEqn]) -> None:
            for e in eqns:
                if e.region is not None:
                    out.append(e)
                    for body in e.region.bodies:
                        visit(body)

        visit(self.eqns)
        return tuple(out)

    @cached_property
    def repeats(self) -> dict[str, float]:
        """Node name -> how often it runs per call, where that is not once: a loop body's
        nodes (and the carries and stacks it leaves through) once per iteration."""
        out: dict[str, float] = {}

        def visit(eqns: Sequence[FlatEqn], times: float) -> None:
            for e in eqns:
                if e.region is None:
                    if times != 1:
                        out[e.name] = times
                    continue
                inner = times * self.trips.get(e.name, 1)
                for b in e.region.enter:
                    if times != 1:
                        out[b.name] = times
                for body in e.region.bodies:
                    visit(body, inner)
                for b in e.region.leave:
                    if (inner if e.region.kind != "cond" else times) != 1:
                        out[b.name] = inner if e.region.kind != "cond" else times

        visit(self.eqns, 1.0)
        return out

    @property
    def same_placement(self) -> list[tuple[str, str]]:
        """A loop carry's placement entering and leaving the body: one placement; a scanned-
        over value's placement and the one its slices are taken from: one placement."""
        pairs = [pair for e in self.regions for pair in e.region.carries]
        pairs += [(b.inputs[0], b.outputs[1]) for b in self._scan_slices]
        return pairs

    @cached_property
    def whole_dims(self) -> dict[str, frozenset[int]]:
        """Scanned-over value -> the dims of it no plan cuts: a loop reads its slices from
        the value where it lies (``same_placement``) and never cuts the dim it iterates over
        (the leading one), nor, where a slice is scanned over again by an inner scan, the
        inner scan's (one further in)."""
        sliced: dict[str, list[str]] = {}
        for b in self._scan_slices:
            sliced.setdefault(b.inputs[0], []).append(b.outputs[0])

        def whole(value: str) -> frozenset[int]:
            inner = (whole(s) for s in sliced[value] if s in sliced)
            return frozenset({0}).union(*(frozenset(d + 1 for d in dims) for dims in inner))

        return {value: whole(value) for value in sliced}

    @property
    def _scan_slices(self) -> list[FlatEqn]:
        return [b for e in self.regions for b in e.region.enter if b.prim is BOUNDARY[SCAN_SLICE]]

    def eqn(self, name: str) -> FlatEqn:
        return self._by_name[name]

    @property
    def graph_inputs(self) -> tuple[str, ...]:
        return self.input_names + tuple(n for n, _ in self.consts)


def read_atom(env: dict, a: Atom) -> Any:
    if isinstance(a, core.Literal):
        return jnp.asarray(a.val, dtype=a.aval.dtype)
    return env[a]


class _Flattener:
    """Inlines call-like equations into one list of primitive equations; control flow
    becomes a ``Region`` of its own flattened bodies."""

    def __init__(self) -> None:
        self.eqns: list[FlatEqn] = []
        self.consts: list[tuple[str, Any]] = []
        self.avals: dict[str, Any] = {}
        self._ids = itertools.count()

    def constant(self, value: Any) -> str:
        name = f"const{len(self.consts)}"
        self.consts.append((name, value))
        self.avals[name] = core.typeof(value)
        return name

    def run(self, jaxpr: core.Jaxpr, consts: Sequence[Atom], inputs: Sequence[Atom]) -> list[Atom]:
        env: dict = {}

        def read(v) -> Atom:
            return v if isinstance(v, core.Literal) else env[v]

        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, inputs))
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            body = eqn.params.get(INLINED.get(eqn.primitive.name, ""))
            if isinstance(body, (core.Jaxpr, core.ClosedJaxpr)):
                inner, inner_consts = (body.jaxpr, body.consts) if isinstance(body, core.ClosedJaxpr) else (body, ())
                outs = self.run(inner, [self.constant(c) for c in inner_consts], self._barriers(eqn, ins))
            elif eqn.primitive.name in REGIONS:
                outs = self.region(eqn, ins)
            elif (solve := _linear_solve(eqn, ins)) is not None:
                outs = self.run(solve[0].jaxpr, [self.constant(c) for c in solve[0].consts], solve[1])
            else:
                outs = self.emit(eqn, ins)
            for v, a in zip(eqn.outvars, outs):
                if not isinstance(v, core.DropVar):
                    env[v] = a
        return [read(v) for v in jaxpr.outvars]

    def _barriers(self, eqn: core.JaxprEqn, ins: list[Atom]) -> list[Atom]:
        """A differentiated remat's ``prevent_cse`` operands, each through an optimization
        barrier as its lowering puts them: without it XLA would reuse the forward's values
        for the recomputation, and hold them, as the plan's memory does not."""
        p = eqn.params
        if eqn.primitive.name not in ("checkpoint", "remat2") or not p.get("differentiated"):
            return ins
        cse = p.get("prevent_cse", False)
        cse = (cse,) * len(ins) if isinstance(cse, bool) else tuple(cse)
        out = []
        for a, prevent, v in zip(ins, cse, eqn.invars):
            if prevent and isinstance(a, str) and isinstance(v.aval, core.ShapedArray):
                name = f"optimization_barrier_{next(self._ids)}"
                self.avals[name] = v.aval
                self.eqns.append(FlatEqn(name, optimization_barrier_p, {}, (a,), (name,)))
                a = name
            out.append(a)
        return out

    def emit(self, eqn: core.JaxprEqn, ins: list[Atom]) -> list[str]:
        name = f"{eqn.primitive.name}_{next(self._ids)}"
        n = len(eqn.outvars)
        outs = [name] if n == 1 else [f"{name}.{i}" for i in range(n)]
        for o, v in zip(outs, eqn.outvars):
            self.avals[o] = v.aval
        self.eqns.append(FlatEqn(name, eqn.primitive, dict(eqn.params), tuple(ins), tuple(outs), bool(eqn.effects)))
        return outs

    def boundary(self, kind: str, ins: Sequence[Atom], aval: Any) -> FlatEqn:
        name = f"{kind}_{next(self._ids)}"
        self.avals[name] = aval
        ins = tuple(self._named(a) for a in ins)
        if kind != SCAN_SLICE:
            return FlatEqn(name, BOUNDARY[kind], {}, ins, (name,))
        # A slice also gives back the whole stacked value, tied to its producer's placement
        # (``Captured.same_placement``): the loop reads the stacked value where it lives,
        # and any resharding happens to one slice per iteration, never to the whole stack.
        self.avals[name + ".stacked"] = self.avals[ins[0]]
        return FlatEqn(name, BOUNDARY[kind], {}, ins, (name, name + ".stacked"))

    def _named(self, a: Atom) -> str:
        """A literal as a constant of the program: boundary nodes take graph values only."""
        return self.constant(jnp.asarray(a.val, dtype=a.aval.dtype)) if isinstance(a, core.Literal) else a

    def body(self, closed: core.ClosedJaxpr, inputs: Sequence[Atom]) -> tuple[tuple[FlatEqn, ...], tuple[Atom, ...]]:
        """One body flattened on its own: its live equations and its results."""
        outer, self.eqns = self.eqns, []
        try:
            outs = self.run(closed.jaxpr, [self.constant(c) for c in closed.consts], inputs)
            outs = [self._named(a) for a in outs]
            return tuple(_live(self.eqns, outs)), tuple(outs)
        finally:
            self.eqns = outer

    def region(self, eqn: core.JaxprEqn, ins: list[Atom]) -> list[str]:
        p, kind = eqn.params, eqn.primitive.name
        out_avals = [v.aval for v in eqn.outvars]
        if kind == "scan":
            nc, nk = p["num_consts"], p["num_carry"]
            body_in = p["jaxpr"].jaxpr.invars
            cin = [self.boundary(CARRY, [a], v.aval) for a, v in zip(ins[nc:nc + nk], body_in[nc:nc + nk])]
            slices = [self.boundary(SCAN_SLICE, [a], v.aval) for a, v in zip(ins[nc + nk:], body_in[nc + nk:])]
            enter = cin + slices
            eqns, outs = self.body(p["jaxpr"], [*ins[:nc], *(e.outputs[0] for e in enter)])
            leave = [self.boundary(CARRY if k < nk else SCAN_STACK, [o], out_avals[k]) for k, o in enumerate(outs)]
            bodies, results = (eqns,), (outs,)
        elif kind == "while":
            cc, bc = p["cond_nconsts"], p["body_nconsts"]
            body_in = p["body_jaxpr"].jaxpr.invars
            enter = [self.boundary(CARRY, [a], v.aval) for a, v in zip(ins[cc + bc:], body_in[bc:])]
            eqns, outs = self.body(p["body_jaxpr"], [*ins[cc:cc + bc], *(e.outputs[0] for e in enter)])
            leave = [self.boundary(CARRY, [o], aval) for o, aval in zip(outs, out_avals)]
            bodies, results = (eqns,), (outs,)
        else:  # cond: every branch reads the operands as they are
            enter = []
            branches = [self.body(b, ins[1:]) for b in p["branches"]]
            bodies, results = tuple(b for b, _ in branches), tuple(o for _, o in branches)
            leave = [self.boundary(COND_MERGE, [o[k] for o in results], aval) for k, aval in enumerate(out_avals)]
        for cin_, cout in Region(kind, tuple(enter), (), (), tuple(leave)).carries:
            a, b = self.avals[cin_], self.avals[cout]
            if (a.shape, a.dtype) != (b.shape, b.dtype):  # JAX refuses these itself; a guard for what it lets by
                raise ControlFlowError(f"{kind}: a carry enters the body as {a.str_short()} and leaves as "
                                       f"{b.str_short()}; a plan keeps one placement per carry, so its shape stays")
        name = f"{kind}_{next(self._ids)}"
        outs_named = tuple(e.outputs[0] for e in leave)
        region = Region(kind, tuple(enter), bodies, results, tuple(leave))
        self.eqns.append(FlatEqn(name, eqn.primitive, dict(p), tuple(ins), outs_named, bool(eqn.effects), region))
        return list(outs_named)


def _linear_solve(eqn: core.JaxprEqn, ins: list[Atom]) -> tuple[core.ClosedJaxpr, list[Atom]] | None:
    """A ``custom_linear_solve``'s solve jaxpr and its operands (the solve's consts, then the
    right-hand side), which is all the primitive runs: its impl and its lowering evaluate
    that jaxpr (the matvec and transpose jaxprs serve its derivative rules, applied when the
    program was traced). None where the equation is not laid out so."""
    if eqn.primitive.name != "custom_linear_solve":
        return None
    lengths, solve = eqn.params.get("const_lengths"), getattr(eqn.params.get("jaxprs"), "solve", None)
    if not isinstance(solve, core.ClosedJaxpr) or len(lengths or ()) != 4:
        return None
    start = lengths[0] + lengths[1]
    operands = [*ins[start:start + lengths[2]], *ins[sum(lengths):]]
    if len(operands) != len(solve.jaxpr.invars) or len(solve.jaxpr.outvars) != len(eqn.outvars):
        return None
    return solve, operands


def _live(eqns: list[FlatEqn], outputs: Sequence[Atom]) -> list[FlatEqn]:
    """Equations that an output (or a side effect) needs, in order."""
    needed = {a for a in outputs if isinstance(a, str)}
    kept = []
    for e in reversed(eqns):
        if e.effectful or needed.intersection(e.outputs):
            kept.append(e)
            needed.update(a for a in e.inputs if isinstance(a, str))
    return kept[::-1]


def refuse_non_arrays(inputs: tuple, params: Any = None) -> None:
    """Refuse, naming the input or parameter, a leaf jax would not take as an array: a torch
    tensor (its dtype fails deep in jax), a string (jax.jit's advice on static_argnums,
    which parallelize has not), a ShapeDtypeStruct (no values to run on)."""
    leaves = [(_leaf_name(f"in{path[0].idx}", path[1:]), x)
              for path, x in jax.tree_util.tree_flatten_with_path(tuple(inputs))[0]]
    leaves += [(_leaf_name("params", path), x) for path, x in jax.tree_util.tree_flatten_with_path(params)[0]]
    for name, x in leaves:
        if type(x).__module__.split(".")[0] == "torch":
            raise TypeError(f"{name} is a {type(x).__module__}.{type(x).__qualname__}: a jax Mesh plans and runs "
                            "functions of jax arrays (jnp.asarray(x.numpy())); plan torch code on a torch DeviceMesh")
        if isinstance(x, (str, bytes)):
            raise TypeError(f"{name} is a {type(x).__qualname__} ({x!r:.40}), and parallelize traces every input as an "
                            "array: bind it beforehand, functools.partial(fn, mode=...), and pass the arrays alone")
        if isinstance(x, jax.ShapeDtypeStruct):
            raise TypeError(f"{name} is a jax.ShapeDtypeStruct (a shape without values), but parallelize runs the "
                            "function on its example values (to explore rules and check the plan): pass arrays, "
                            f"jnp.zeros({x.shape}, {x.dtype})")


def leaf_names(args: tuple, with_params: bool) -> list[str]:
    """The names plans and constraints give the leaves of a call's ``args`` (``params``
    first where ``with_params``): ``params.<path>``, ``in<k>.<path>``."""
    names = []
    for path, _ in jax.tree_util.tree_flatten_with_path(args)[0]:
        if with_params and path[0].idx == 0:
            names.append(_leaf_name("params", path[1:]))
        else:
            names.append(_leaf_name(f"in{path[0].idx - (1 if with_params else 0)}", path[1:]))
    return names


def _leaf_name(prefix: str, path) -> str:
    """``prefix.a.0.b``: the path's keys joined by dots, or in jax's bracketed form,
    ``prefix['a.b']``, where a key holds a dot itself, so that a flattened checkpoint key
    (``{"a.b": w}``) and the nested path it spells (``{"a": {"b": w}}``) get two names."""
    if any("." in str(getattr(key, "key", "")) for key in path):
        return prefix + jax.tree_util.keystr(path)
    rest = jax.tree_util.keystr(path, simple=True, separator=".")
    return f"{prefix}.{rest}" if rest else prefix


def _joint(fn: Callable, loss_fn: Callable | None) -> Callable:
    def joint(params, *inputs):
        def loss(p):
            out = fn(p, *inputs)
            if loss_fn is None:
                _check_differentiable(fn, out)
            value = loss_fn(out) if loss_fn is not None else sum(jnp.sum(x) for x in jax.tree.leaves(out))
            aval = _value_type(value)
            float_scalar = aval is not None and aval.shape == () and jnp.issubdtype(aval.dtype, jnp.floating)
            if loss_fn is not None and not float_scalar:  # what jax.grad needs
                what = aval.str_short() if aval is not None else f"a {type(value).__name__}"
                raise TypeError(f"loss_fn returned {what}, not a float scalar: return one computed from "
                                f"{_name(fn)}'s float outputs, or pass backward=False to plan the forward only")
            leaves = jax.tree.leaves(p)
            if leaves and type(value) is not type(leaves[0]):  # not of jax.grad's trace: no path from params
                loss = "loss_fn's loss" if loss_fn is not None else f"the sum of {_name(fn)}'s outputs"
                raise ValueError(f"{loss} does not depend on params (a constant, stop_gradient, or params the "
                                 "function never reads), so every gradient is zero: return a loss computed from "
                                 "the outputs, or pass backward=False to plan the forward only")
            return value, out

        (_, out), grads = jax.value_and_grad(loss, has_aux=True)(params)
        return out, grads

    return joint


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _value_type(x: Any) -> Any:
    """``x``'s abstract value (shape and dtype), None for what is no array or scalar."""
    try:
        aval = jax.typeof(x)
    except TypeError:
        return None
    return aval if isinstance(aval, core.ShapedArray) else None


def _check_differentiable(fn: Callable, out: Any) -> None:
    """Refuse, naming the function and what it returned, an output that the default loss
    (the sum of its outputs) has no gradient of; jax.grad would only say that it "requires
    real-valued outputs"."""
    leaves = jax.tree.leaves(out)
    if not leaves:
        what = "None" if out is None else f"a {type(out).__name__} with no arrays"
        raise TypeError(f"{_name(fn)} returns {what}, so the default loss (the sum of its outputs) has nothing to "
                        "differentiate: return the outputs to differentiate, or pass backward=False to plan the "
                        "forward only")
    avals = [_value_type(x) for x in leaves]
    if all(a is not None and not jnp.issubdtype(a.dtype, jnp.inexact) for a in avals):
        types = ", ".join(a.str_short() for a in avals)
        arrays = "an integer array" if len(avals) == 1 else "only integer arrays"
        raise TypeError(f"{_name(fn)} returns {arrays} ({types}), which {'carries' if len(avals) == 1 else 'carry'} "
                        "no gradient, so the default loss (the sum of its outputs) has none to compute: pass "
                        "backward=False to plan the forward only")


def _check_params_differentiable(params: Any) -> None:
    """Refuse, naming the leaf, a parameter jax.grad cannot differentiate (an integer or
    bool array, a key, what is no array); jax.grad would name only its dtype. No array at
    all (``params={}``) leaves no gradient to compute, as a torch module without parameters."""
    if not jax.tree.leaves(params):
        raise ValueError(f"params ({jax.tree.structure(params)}) holds no arrays, so there are no gradients to "
                         "compute: pass the parameters, or backward=False to plan the forward only")
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        aval = _value_type(leaf)
        if aval is None or not jnp.issubdtype(aval.dtype, jnp.inexact):
            what = f"a {type(leaf).__name__}" if aval is None else aval.str_short()
            raise TypeError(f"{_leaf_name('params', path)} is {what}, not a float array, so jax.grad cannot "
                            "differentiate it: pass it as an input (example_inputs) or close over it "
                            "(functools.partial), or pass backward=False to plan the forward only")


# What an argument used as a Python value (a size, a count, a flag) raises when traced.
_CONCRETE = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
             jax.errors.TracerIntegerConversionError)


# jax's, metaspmd's and the backends' sources: every frame of theirs a trace passes through
_OWN_DIRS = tuple(os.path.dirname(os.path.abspath(f)) + os.sep
                  for f in (jax.__file__, os.path.dirname(__file__), sys.modules[MetaIR.__module__].__file__))


def _user_line(err: BaseException) -> str:
    """Where the user's code read a traced value: the innermost line outside jax and
    metaspmd, as ``, at file:line in function: source``; '' where none is on the stack."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if not frame.filename.startswith(_OWN_DIRS):
            return f", at {frame.filename}:{frame.lineno} in {frame.name}" + (f": {frame.line}" if frame.line else "")
    return ""


def _trace(fn: Callable, traced: Callable, args: tuple) -> tuple:
    """``jax.make_jaxpr`` of ``traced`` with its shapes; an error that a static argument
    explains re-raised with what to do (parallelize traces every argument as an array)."""
    def needs_concrete(err: Exception) -> TypeError:
        return TypeError(f"{_name(fn)} needs a concrete value where it got a traced one{_user_line(err)}. "
                         "parallelize traces every example input and parameter as an array: fix an argument used "
                         "as a Python value (a size, a count, a flag) beforehand, functools.partial(fn, n=4); "
                         "where an array computed from them decides (an if or a loop on its values), keep the "
                         f"choice in arrays: jnp.where, lax.cond, lax.while_loop\n{err}")

    try:
        return jax.make_jaxpr(traced, return_shape=True)(*args)
    except _CONCRETE as err:
        raise needs_concrete(err) from err
    except IndexError as err:
        if "must be static integers" not in str(err):  # a traced number as a slice bound
            raise
        raise needs_concrete(err) from err
    except ValueError as err:
        if "Reverse-mode differentiation does not work for lax.while_loop" in str(err):
            raise ValueError(f"{_name(fn)} has a while_loop, which jax.grad cannot differentiate: pass "
                             "backward=False to plan the forward only, or loop with lax.scan (or fori_loop "
                             f"with static bounds)\n{err}") from err
        if "Non-hashable static arguments" not in str(err):
            raise
        raise TypeError(f"{_name(fn)} is jitted with static arguments (static_argnums or static_argnames), but "
                        "parallelize traces every example input as an array: fix the static ones beforehand, "
                        f"functools.partial(fn, n=4), and pass the others as example_inputs\n{err}") from err
    except TypeError as err:
        if "must be 1D sequences of concrete values" in str(err):  # a traced number as a shape
            raise needs_concrete(err) from err
        names = {_name(fn), getattr(fn, "__qualname__", "")}  # Python names a nested function by its qualname
        if any(str(err).startswith(f"{n}()") for n in names if n) and "positional argument" in str(err):
            raise TypeError(f"{err}: parallelize calls {_name(fn)}(*example_inputs), or {_name(fn)}(params, "
                            "*example_inputs) when the parameters are passed as params=") from err
        if "carry input and carry output must have equal types" not in str(err):
            raise
        raise CarryTypeError(
            "a loop carry changes type (shape or dtype) between iterations, and a plan gives each carry one "
            "placement for every iteration: give it its final dtype before the loop, and a growing buffer its "
            f"final size, filled in place (lax.dynamic_update_slice)\n{err}") from err


def capture(
    fn: Callable,
    example_inputs: tuple,
    *,
    params: Any = None,
    backward: bool = True,
    loss_fn: Callable | None = None,
    while_trips: float | Mapping[str, float] | None = None,
) -> Captured:
    """Trace ``fn``. With ``params``, ``fn(params, *inputs)`` is traced forward and backward:
    the results are ``(out, grads)``, the gradients of ``loss_fn(out)`` (default: the sum
    of every output) with respect to ``params`` (``backward=False``: forward only).
    ``while_trips``: the trips per call charged a while loop whose bounds are not static
    (one number for all, or by the loop's equation name as ``Captured.loops`` names it);
    default ``WHILE_TRIPS``."""
    if any(c.__name__ == "Module" and c.__module__.startswith("torch.nn") for c in type(fn).__mro__):
        raise TypeError(f"{type(fn).__qualname__} is a torch.nn.Module: plan it on a torch DeviceMesh "
                        "(torch.distributed.device_mesh), not on a jax Mesh")
    if not callable(fn):
        raise TypeError(f"parallelize takes a function of the example inputs (and of params=, if given), got "
                        f"{fn!r}")
    check_capture_options(params, backward, loss_fn, while_trips)
    example_inputs = tuple(example_inputs)
    refuse_non_arrays(example_inputs, params)
    if params is not None and backward:
        _check_params_differentiable(params)
    if params is not None:
        traced, args = (_joint(fn, loss_fn) if backward else fn), (params, *example_inputs)
    else:
        traced, args = fn, example_inputs
    closed, out_shapes = _trace(fn, traced, args)
    in_tree = jax.tree.structure(args)
    names = leaf_names(args, params is not None)
    param_names = names[:len(jax.tree.leaves(params))] if params is not None else []  # args' leaves, params first
    flat = _Flattener()
    for name, v in zip(names, closed.jaxpr.invars):
        flat.avals[name] = v.aval
    consts = [flat.constant(c) for c in closed.consts]
    outputs = flat.run(closed.jaxpr, consts, names)
    eqns = _live(flat.eqns, outputs)
    out_tree = jax.tree.structure(out_shapes)
    n_outputs = len(jax.tree.leaves(out_shapes[0])) if params is not None and backward else out_tree.num_leaves
    flat_values = [jnp.asarray(x) for x in jax.tree.leaves(args)] + [v for _, v in flat.consts]
    values = RecordedValues(partial(record_values, eqns, tuple(names) + tuple(n for n, _ in flat.consts), flat_values))
    trips, sources = loop_trips(eqns, dict(flat.consts), while_trips)
    ir = to_metair(eqns, names, flat.consts, outputs, flat.avals)
    return Captured(ir, tuple(eqns), tuple(names), tuple(flat.consts), tuple(outputs), in_tree, out_tree,
                    tuple(param_names), n_outputs, values, trips, sources, dict(flat.avals))


def record_values(eqns: Sequence[FlatEqn], input_names: Sequence[str], inputs: Sequence[Any]) -> dict:
    """Evaluate the program eagerly, equation by equation; node name -> its operands. A
    region's bodies are evaluated once more on their first iteration's operands (each cond
    branch on the operands), for their nodes' values."""
    values: dict = {}
    _record(eqns, dict(zip(input_names, inputs)), values)
    return values


def _record(eqns: Sequence[FlatEqn], env: dict, values: dict) -> None:
    for e in eqns:
        operands = tuple(read_atom(env, a) for a in e.inputs)
        values[e.name] = operands
        if e.region is not None:
            _record_region(e, operands, env, values)
        env.update(zip(e.outputs, e.bind(operands)))


def _record_region(e: FlatEqn, operands: tuple, env: dict, values: dict) -> None:
    r, p = e.region, e.params
    if r.kind == "scan":
        nc, first = p["num_consts"], -1 if p["reverse"] else 0
        entering = [x if b.prim is BOUNDARY[CARRY] else x[first] for b, x in zip(r.enter, operands[nc:])]
    elif r.kind == "while":
        entering = list(operands[p["cond_nconsts"] + p["body_nconsts"]:])
    else:
        entering = []
    for b, x, given in zip(r.enter, entering, operands[len(operands) - len(r.enter):]):
        values[b.name] = (given,)
        env[b.outputs[0]] = x
    results = []
    for body, outs in zip(r.bodies, r.outputs):
        inner = dict(env)
        _record(body, inner, values)
        results.append([read_atom(inner, a) for a in outs])
    for k, b in enumerate(r.leave):
        values[b.name] = tuple(res[k] for res in results) if r.kind == "cond" else (results[0][k],)


def loop_trips(eqns: Sequence[FlatEqn], consts: Mapping[str, Any],
               given: float | Mapping[str, float] | None = None) -> tuple[dict, dict]:
    """Loop equation -> its body's trips per call, and -> where that count comes from: a
    scan's length; a while loop's static bounds (``static_trips``), else the estimate
    ``given`` (one number, or by loop name), else ``WHILE_TRIPS`` or the loop's
    ``trips_bound`` where that is less."""
    check_while_trips(given)
    trips: dict = {}
    sources: dict = {}
    estimated: list[str] = []
    bounds: dict = {}  # an estimated loop -> at most how often it runs, where a term of its cond says

    def visit(body: Sequence[FlatEqn]) -> None:
        for e in body:
            if e.region is None:
                continue
            if e.region.kind == "scan":
                trips[e.name], sources[e.name] = e.params["length"], "the scan's length"
            elif e.region.kind == "while":
                n = static_trips(e, consts)
                if n is not None:
                    trips[e.name], sources[e.name] = n, "static bounds"
                else:
                    estimated.append(e.name)
                    bounds[e.name] = trips_bound(e, consts)
            for inner in e.region.bodies:
                visit(inner)

    visit(eqns)
    if isinstance(given, Mapping):
        unknown = sorted(set(given) - set(estimated))
        if unknown:
            raise KeyError(f"while_trips names {', '.join(map(repr, unknown))}: no while loop without static bounds "
                           f"has that name (those are: {', '.join(map(repr, estimated)) or 'none'})")
    for name in estimated:
        n = given.get(name) if isinstance(given, Mapping) else given
        if n is None:
            at_most = bounds.get(name)
            if at_most is not None and at_most < WHILE_TRIPS:
                trips[name] = at_most
                sources[name] = f"an estimate: its static bound, at most {at_most}; parallelize(while_trips=...) sets it"
            else:
                trips[name] = WHILE_TRIPS
                sources[name] = ("an estimate: no static bounds" if at_most is None else
                                 f"an estimate: no static count, at most {at_most}") + "; parallelize(while_trips=...) sets it"
            continue
        trips[name], sources[name] = n, "given: while_trips"
    return trips, sources


def check_capture_options(params: Any, backward: Any, loss_fn: Any, while_trips: Any) -> None:
    """The options ``capture`` reads, refused by name before anything is traced."""
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError("loss_fn must be callable (a function of the function's output, returning a scalar array), "
                        f"got {loss_fn!r}")
    if loss_fn is not None and (params is None or backward is False):
        raise ValueError("loss_fn is the loss whose gradients the backward computes, which needs params= and "
                         "backward=True; without them the forward alone is planned: drop loss_fn, or pass both")
    check_while_trips(while_trips)


def check_while_trips(given: Any) -> None:
    """``while_trips`` before the trace: None, one finite number >= 0, or such numbers by
    loop name (which names are loops is known once traced)."""
    if given is None:
        return
    by_name = given.items() if isinstance(given, Mapping) else [(None, given)]
    for name, n in by_name:
        where = "while_trips" if name is None else f"while_trips[{name!r}]"
        if name is not None and not isinstance(name, str):
            raise TypeError(f"while_trips names loops by str (as explain() lists them), got the key {name!r}")
        if isinstance(n, bool) or not isinstance(n, numbers.Real):
            raise TypeError(f"{where} must be a number of trips per call (or a dict of them by loop name), got {n!r}")
        try:
            finite = math.isfinite(n)
        except OverflowError:  # an int beyond any float
            finite = False
        if not finite or n < 0:
            raise ValueError(f"{where} must be a finite number >= 0, got {reprlib.repr(n)}")


# comparison -> the same test with its operands swapped
_SWAPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "ne": "ne"}


def static_trips(e: FlatEqn, consts: Mapping[str, Any]) -> int | None:
    """A while loop's trips where its bounds are static, as a ``fori_loop``'s are: the cond
    compares an integer carry (the counter) with a constant, or with a carry the body passes
    on unchanged that enters as a constant; the body adds a constant to the counter, which
    enters as a constant. None for any other loop (and for one that would never end)."""
    p = e.params
    return _comparison_trips(e, consts, _producer(p["cond_jaxpr"].jaxpr, p["cond_jaxpr"].jaxpr.outvars[0]))


def trips_bound(e: FlatEqn, consts: Mapping[str, Any]) -> int | None:
    """At most how often a while loop runs where its cond is a conjunction (``and``) one of
    whose terms is a counter's comparison as ``static_trips`` reads one: that term alone
    would stop it then (an iterative solver's ``maxiter``). None where there is none."""
    cond = e.params["cond_jaxpr"].jaxpr
    terms, counts = [cond.outvars[0]], []
    while terms:
        q = _producer(cond, terms.pop())
        if q is None:
            continue
        if q.primitive.name == "and" or (q.primitive.name == "convert_element_type" and q.invars[0].aval.dtype == bool):
            terms.extend(v for v in q.invars if not isinstance(v, core.Literal))
        else:
            counts.append(_comparison_trips(e, consts, q))
    counts = [n for n in counts if n is not None]
    return min(counts) if counts else None


def _comparison_trips(e: FlatEqn, consts: Mapping[str, Any], test: core.JaxprEqn | None) -> int | None:
    """The trips of loop ``e`` were its cond the comparison ``test`` alone (see static_trips)."""
    p = e.params
    cc, bc = p["cond_nconsts"], p["body_nconsts"]
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    carries = e.inputs[cc + bc:]

    def known(atom: Atom) -> int | None:  # an operand of the while equation, if a constant integer
        if isinstance(atom, core.Literal):
            return _int(atom.val)
        return _int(consts[atom]) if isinstance(atom, str) and atom in consts else None

    def side(jaxpr: core.ClosedJaxpr, nconsts: int, outer: Sequence[Atom], v) -> tuple[str, int | None]:
        """("carry", index) for a carry of the loop, else ("const", its value or None)."""
        if isinstance(v, core.Literal):
            return "const", _int(v.val)
        if v in jaxpr.jaxpr.constvars:
            return "const", _int(jaxpr.consts[jaxpr.jaxpr.constvars.index(v)])
        if v in jaxpr.jaxpr.invars:
            k = jaxpr.jaxpr.invars.index(v)
            return ("const", known(outer[k])) if k < nconsts else ("carry", k - nconsts)
        return "const", None

    if test is None or test.primitive.name not in _SWAPPED:
        return None
    cmp = test.primitive.name
    (lk, lv), (rk, rv) = (side(cond, cc, e.inputs[:cc], v) for v in test.invars)
    passed = [j for j, v in enumerate(body.jaxpr.outvars) if v is body.jaxpr.invars[bc + j]]  # unchanged carries
    if rk == "carry" and (lk == "const" or lv in passed):  # the counter on the right: swap
        (lk, lv), (rk, rv), cmp = (rk, rv), (lk, lv), _SWAPPED[cmp]
    if lk != "carry" or lv in passed:
        return None
    bound = known(carries[rv]) if rk == "carry" and rv in passed else (rv if rk == "const" else None)
    start, step = known(carries[lv]), _step(body, bc, e.inputs[cc:cc + bc], lv, known, side)
    if None in (bound, start, step) or not jax.dtypes.issubdtype(cond.jaxpr.invars[cc + lv].aval.dtype, jnp.integer):
        return None
    return _count(start, bound, step, cmp)


def _producer(jaxpr: core.Jaxpr, v) -> core.JaxprEqn | None:
    return next((q for q in jaxpr.eqns if any(o is v for o in q.outvars)), None)


def _step(body: core.ClosedJaxpr, bc: int, outer: Sequence[Atom], k: int, known, side) -> int | None:
    """What the body adds to carry ``k`` each trip, if a constant (``add k c``, ``sub k c``)."""
    q = _producer(body.jaxpr, body.jaxpr.outvars[k])
    if q is None or q.primitive.name not in ("add", "sub"):
        return None
    counter = body.jaxpr.invars[bc + k]
    a, b = q.invars
    if q.primitive.name == "add" and b is counter:
        a, b = b, a
    if a is not counter or b is counter:
        return None
    kind, c = side(body, bc, outer, b)
    if kind != "const" or c is None:
        return None
    return c if q.primitive.name == "add" else -c


def _count(a: int, b: int, s: int, cmp: str) -> int | None:
    """Trips of ``i = a; while cmp(i, b): i += s``; None where it never ends."""
    holds = {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "ne": a != b}[cmp]
    if not holds:
        return 0
    if cmp in ("lt", "le") and s > 0:
        return (b - a + s - 1) // s if cmp == "lt" else (b - a) // s + 1
    if cmp in ("gt", "ge") and s < 0:
        return (a - b - s - 1) // -s if cmp == "gt" else (a - b) // -s + 1
    if cmp == "ne" and s != 0 and (b - a) % s == 0 and (b - a) // s > 0:
        return (b - a) // s
    return None


def _int(value: Any) -> int | None:
    """A constant's value, if one integer (a scalar of an integer dtype)."""
    if getattr(value, "shape", ()) != ():
        return None
    a = np.asarray(value)
    return int(a) if a.shape == () and np.issubdtype(a.dtype, np.integer) else None

def _var(name: str, aval: Any) -> MetaVar:
    if isinstance(aval, core.ShapedArray):
        return MetaVar(name, tuple(int(s) for s in aval.shape), str(aval.dtype))
    return MetaVar(name, (), type(aval).__name__, is_tensor=False)


def op_arguments(prim: str, operands: Sequence[Any]) -> tuple[tuple[str, ...], tuple]:
    """The JAX backend's grouping of operands into named arguments (its signatures use it)."""
    try:
        return group_operands(prim, list(operands))
    except ValueError:  # a layout the backend does not know: plain positional operands
        return tuple(f"x{i}" for i in range(len(operands))), tuple(operands)


def to_metair(eqns: Sequence[FlatEqn], input_names: Sequence[str], consts: Sequence[tuple[str, Any]],
              outputs: Sequence[Atom], avals: dict) -> MetaIR:
    vars_ = {name: _var(name, aval) for name, aval in avals.items()}
    inputs = [vars_[n] for n in input_names] + [vars_[n] for n, _ in consts]

    def as_meta(a: Atom) -> Any:
        return a.val if isinstance(a, core.Literal) else vars_[a]

    ops = []
    for e in walk(eqns):
        _, args = op_arguments(e.prim.name, [as_meta(a) for a in e.inputs])
        shapes = tuple(tuple(int(s) for s in getattr(_aval(a, avals), "shape", ())) for a in e.inputs)
        kind = next((k for k, prim in BOUNDARY.items() if prim is e.prim), None)
        fn = _Boundary(kind) if kind is not None else PrimitiveCall(e.prim, e.params, shapes)
        ops.append(MetaOp(e.name, PREFIX + e.prim.name, args, signature_params(e.prim.name, e.params, shapes),
                          tuple(vars_[o] for o in e.outputs), fn))
    out_vars = [vars_[a] for a in outputs if isinstance(a, str)]
    return MetaIR(tuple(inputs), tuple(ops), tuple(out_vars))


def _aval(a: Atom, avals: dict) -> Any:
    return a.aval if isinstance(a, core.Literal) else avals[a]


__all__ = ["BOUNDARY", "CARRY", "COND_MERGE", "CarryTypeError", "Captured", "ControlFlowError", "FlatEqn", "REGIONS",
           "Region", "SCAN_SLICE", "RecordedValues", "SCAN_STACK", "WHILE_TRIPS", "capture", "check_capture_options",
           "check_while_trips", "loop_trips", "op_arguments", "read_atom", "record_values", "static_trips", "to_metair",
           "trips_bound", "walk"]
