"""Capture a JAX function as MetaIR: its jaxpr, flattened to primitive equations.

``jax.make_jaxpr`` traces the function (with ``params``: ``jax.value_and_grad`` of a
scalar loss, so forward and backward are one graph). Call-like equations (jit,
custom_jvp_call, custom_vjp_call, closed_call, remat) are inlined so every node is one
primitive, named ``jax.<primitive>`` as in the JAX backend and its rule table; control
flow (while, cond, scan) stays one opaque node. Dead equations are dropped. The flat
equations are then evaluated one by one on the example inputs, recording every node's
real operands, so ops missing from the table are explored live on the model's own values.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax._src import core

from metaspmd.ir import MetaIR, MetaOp, MetaVar

from .backend import PrimitiveCall
from .catalog import PREFIX
from .params import group_operands, signature_params
from .programs import INLINED

Atom = Any  # a var name (str) or a core.Literal


@dataclass(frozen=True)
class FlatEqn:
    """One primitive call of the flattened program. ``inputs`` are var names or literals."""

    name: str
    prim: core.Primitive = field(compare=False)
    params: dict = field(compare=False, hash=False)
    inputs: tuple[Atom, ...]
    outputs: tuple[str, ...]
    effectful: bool = False

    @property
    def literal_positions(self) -> tuple[int, ...]:
        """Operands that are constants of the program, not values flowing in the graph."""
        return tuple(i for i, a in enumerate(self.inputs) if isinstance(a, core.Literal))

    def bind(self, operands: Sequence[Any]) -> list[Any]:
        out = self.prim.bind(*operands, **self.prim.get_bind_params(self.params))
        return list(out) if self.prim.multiple_results else [out]


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
    values: dict = field(compare=False, hash=False)  # node name -> its real operands (flat)

    @cached_property
    def _by_name(self) -> dict[str, FlatEqn]:
        return {e.name: e for e in self.eqns}

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
    """Inlines call-like equations into one list of primitive equations."""

    def __init__(self) -> None:
        self.eqns: list[FlatEqn] = []
        self.consts: list[tuple[str, Any]] = []
        self.avals: dict[str, Any] = {}
        self._ids = itertools.count()

    def constant(self, value: Any) -> str:
        name = f"const{len(self.consts)}"
        self.consts.append((name, value))
        self.avals[name] = core.get_aval(value)
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
                outs = self.run(inner, [self.constant(c) for c in inner_consts], ins)
            else:
                outs = self.emit(eqn, ins)
            for v, a in zip(eqn.outvars, outs):
                if not isinstance(v, core.DropVar):
                    env[v] = a
        return [read(v) for v in jaxpr.outvars]

    def emit(self, eqn: core.JaxprEqn, ins: list[Atom]) -> list[str]:
        name = f"{eqn.primitive.name}_{next(self._ids)}"
        n = len(eqn.outvars)
        outs = [name] if n == 1 else [f"{name}.{i}" for i in range(n)]
        for o, v in zip(outs, eqn.outvars):
            self.avals[o] = v.aval
        self.eqns.append(FlatEqn(name, eqn.primitive, dict(eqn.params), tuple(ins), tuple(outs), bool(eqn.effects)))
        return outs


def _live(eqns: list[FlatEqn], outputs: Sequence[Atom]) -> list[FlatEqn]:
    """Equations that an output (or a side effect) needs, in order."""
    needed = {a for a in outputs if isinstance(a, str)}
    kept = []
    for e in reversed(eqns):
        if e.effectful or needed.intersection(e.outputs):
            kept.append(e)
            needed.update(a for a in e.inputs if isinstance(a, str))
    return kept[::-1]


def _leaf_name(prefix: str, path) -> str:
    rest = jax.tree_util.keystr(path, simple=True, separator=".")
    return f"{prefix}.{rest}" if rest else prefix


def _joint(fn: Callable, loss_fn: Callable | None) -> Callable:
    def joint(params, *inputs):
        def loss(p):
            out = fn(p, *inputs)
            value = loss_fn(out) if loss_fn is not None else sum(jnp.sum(x) for x in jax.tree.leaves(out))
            return value, out

        (_, out), grads = jax.value_and_grad(loss, has_aux=True)(params)
        return out, grads

    return joint


def capture(
    fn: Callable,
    example_inputs: tuple,
    *,
    params: Any = None,
    backward: bool = True,
    loss_fn: Callable | None = None,
) -> Captured:
    """Trace ``fn``. With ``params``, ``fn(params, *inputs)`` is traced forward and backward:
    the results are ``(out, grads)``, the gradients of ``loss_fn(out)`` (default: the sum
    of every output) with respect to ``params`` (``backward=False``: forward only)."""
    example_inputs = tuple(example_inputs)
    if params is not None:
        traced, args = (_joint(fn, loss_fn) if backward else fn), (params, *example_inputs)
    else:
        traced, args = fn, example_inputs
    closed, out_shapes = jax.make_jaxpr(traced, return_shape=True)(*args)
    with_paths, in_tree = jax.tree_util.tree_flatten_with_path(args)
    names, param_names = [], []
    for path, _ in with_paths:
        if params is not None and path[0].idx == 0:
            names.append(_leaf_name("params", path[1:]))
            param_names.append(names[-1])
        else:
            k = path[0].idx - (1 if params is not None else 0)
            names.append(_leaf_name(f"in{k}", path[1:]))
    flat = _Flattener()
    for name, v in zip(names, closed.jaxpr.invars):
        flat.avals[name] = v.aval
    consts = [flat.constant(c) for c in closed.consts]
    outputs = flat.run(closed.jaxpr, consts, names)
    eqns = _live(flat.eqns, outputs)
    out_tree = jax.tree.structure(out_shapes)
    n_outputs = len(jax.tree.leaves(out_shapes[0])) if params is not None and backward else out_tree.num_leaves
    flat_values = [jnp.asarray(x) for x in jax.tree.leaves(args)] + [v for _, v in flat.consts]
    values = record_values(eqns, tuple(names) + tuple(n for n, _ in flat.consts), flat_values)
    ir = to_metair(eqns, names, flat.consts, outputs, flat.avals)
    return Captured(ir, tuple(eqns), tuple(names), tuple(flat.consts), tuple(outputs), in_tree, out_tree,
                    tuple(param_names), n_outputs, values)


def record_values(eqns: Sequence[FlatEqn], input_names: Sequence[str], inputs: Sequence[Any]) -> dict:
    """Evaluate the program eagerly, equation by equation; node name -> its operands."""
    env: dict = dict(zip(input_names, inputs))
    values: dict = {}
    for e in eqns:
        operands = tuple(read_atom(env, a) for a in e.inputs)
        values[e.name] = operands
        env.update(zip(e.outputs, e.bind(operands)))
    return values


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
    for e in eqns:
        _, args = op_arguments(e.prim.name, [as_meta(a) for a in e.inputs])
        shapes = tuple(tuple(int(s) for s in getattr(_aval(a, avals), "shape", ())) for a in e.inputs)
        ops.append(MetaOp(e.name, PREFIX + e.prim.name, args, signature_params(e.params),
                          tuple(vars_[o] for o in e.outputs), PrimitiveCall(e.prim, e.params, shapes)))
    out_vars = [vars_[a] for a in outputs if isinstance(a, str)]
    return MetaIR(tuple(inputs), tuple(ops), tuple(out_vars))


def _aval(a: Atom, avals: dict) -> Any:
    return a.aval if isinstance(a, core.Literal) else avals[a]


__all__ = ["Captured", "FlatEqn", "capture", "op_arguments", "read_atom", "record_values", "to_metair"]
