"""Rules for captured JAX nodes: the generated table first, an OpCase for live exploration.

A node's signature is computed exactly as the JAX backend computes its sweep cases (the
backend's operand names and plain params, literals counted as scalar tensors), so rules
swept offline are found again here. Literal operands are constants of the program, not
values the planner places: ``without_literals`` keeps the strategies that replicate them
and drops their slots.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core

from metaspmd import spec
from metaspmd.case import OpCase
from metaspmd.fingerprint import code_fingerprint
from metaspmd.ir import MetaOp
from metaspmd.resolve import NodeCall
from metaspmd.signature import signature
from metaspmd.spec import Replicate, Strategy
from metaspmd.table import RuleTable, generated
from metaspmd.tensor_ops import FLOAT, INT, OTHER, ULP_STEPS, compared_as_bits

from .backend import clamped_positions, dropping_form, localizer, padding_of
from .capture import BOUNDARY, CARRY, SCAN_SLICE, SCAN_STACK, Captured, op_arguments
from .indices import fresh_indices
from .inputs import IDENTITY_OPERANDS, condition
from .params import exact_sizes, first_shape
from .tensor_ops import JaxOps, float_bits, kind_of

_OPS = JaxOps()

# Calls with bodies the capture does not plan through: their bodies are traced at fixed
# shapes, so they cannot run on shards. Each stays one opaque node, replicated unless the
# table has a rule for it. (scan, while and cond are planned through their bodies, a
# custom_linear_solve through its solve jaxpr, by capture; listed here for any it cannot read.)
OPAQUE = frozenset({"while", "cond", "scan", "custom_linear_solve", "eval_jaxpr", "composite", "platform_index"})


def _cut(dim: int, out: int | None = None) -> tuple[spec.ShardIn, spec.OutputCombine]:
    return spec.ShardIn(dim), spec.OutputCombine((spec.Gather(dim if out is None else out),))


def boundary_rules(kind: str, ndims: Sequence[int]) -> tuple[spec.Strategy, ...]:
    """A region boundary's rules, from shape arithmetic (``ndims``: its inputs' ranks). A
    carry or a merge keeps its placement (every branch of a cond delivers the one its output
    takes); a scanned-over operand cut along dim d is each iteration's slice cut along d - 1,
    a stacked result the other way; the leading (iteration) dim is never cut. No Partial:
    a loop's carry and its stacked slices are stored arrays."""
    n = ndims[0]
    if kind == SCAN_SLICE:
        cuts = [(d, d - 1) for d in range(1, n)]
    elif kind == SCAN_STACK:
        cuts = [(d, d + 1) for d in range(n)]
    else:
        cuts = [(d, d) for d in range(n)]
    out = []
    for k, (d, o) in enumerate(cuts, start=1):
        cut_in, combine = _cut(d, o)
        # a slice's second output is the stacked value itself (see capture.Region)
        outs = (combine, _cut(d)[1]) if kind == SCAN_SLICE else (combine,)
        out.append(spec.Strategy(f"S{k}", (cut_in,) * len(ndims), outs))
    return tuple(out)


def _identity_rules(ndim: int) -> tuple[spec.Strategy, ...]:
    """An optimization barrier of one operand: the identity, Partial sums included."""
    sums = spec.Strategy(f"S{ndim + 1}", (spec.PartialInput("sum"),),
                         (spec.OutputCombine((spec.Reduce("sum"),)),))
    return boundary_rules(CARRY, [ndim]) + (sums,)


# Primitives that give their operand's values unchanged and only steer where values live
# (binding one needs the mesh it names): explored as the identity they are on values.
VALUE_IDENTITIES = frozenset({"sharding_constraint"})


def _identity(x, **_params):
    return x


class Opaque(Exception):
    """Raised by an opaque node's exploration call: the explorer records it as failed."""


def table() -> RuleTable:
    """The generated JAX table."""
    return generated("jax")


def without_literals(strategies: Sequence[Strategy], literal_positions: Sequence[int]) -> tuple[Strategy, ...]:
    """Strategies over the operands that are graph values: literal slots removed, and
    strategies that would split or sum a literal dropped."""
    if not literal_positions:
        return tuple(strategies)
    drop = set(literal_positions)
    out = []
    for s in strategies:
        if any(not isinstance(p, Replicate) for i, p in enumerate(s.inputs) if i in drop):
            continue
        out.append(Strategy(s.label, tuple(p for i, p in enumerate(s.inputs) if i not in drop), s.outputs))
    return tuple(out)


def _widened(operands: Sequence[Any]) -> list[Any]:
    """Float operands in float64 (tight ground truth), when jax has x64 enabled."""
    if not jax.config.jax_enable_x64:
        return list(operands)
    return [x.astype(jnp.float64) if kind_of(x.dtype) == FLOAT and x.dtype != jnp.float64 else x for x in operands]


def _repeats(a: np.ndarray) -> bool:
    """Some dim holds the same slice at every index (a zero bias, a broadcast constant,
    the gradient of a sum): shards along it would be identical."""
    return any(a.shape[d] > 1 and bool(np.all(a == a.take([0], axis=d))) for d in range(a.ndim))


def _varied(prim: str, operands: Sequence[Any], seed: int) -> list[Any]:
    """The real operands, except those that repeat along a dim: the explorer rightly
    refuses to judge a split from identical shards, so they take the values the backend
    would draw for them (random data; structured operands such as indices stay)."""
    repeating = [kind_of(x.dtype) != OTHER and _repeats(np.asarray(x)) for x in operands]
    if not any(repeating):
        return list(operands)
    drawn = condition(prim, list(operands), list(operands), seed)
    return [d if r else x for x, d, r in zip(operands, drawn, repeating)]


def _fresh_operands(prim: str, params: dict, operands: Sequence[Any], seed: int) -> list[Any]:
    """New trial operands the way the JAX backend draws them for its sweep: random data,
    structured operands (indices) kept or redrawn in range, ties for equality tests."""
    new = condition(prim, list(operands), list(operands), seed)
    for k, value in fresh_indices(prim, params, new, seed).items():
        new[k] = jnp.asarray(value)
    return new


def _as_traced(operands: Sequence[Any], traced: tuple | None) -> list[Any]:
    """The real operands, a literal of the jaxpr (the number 1, a numpy scalar) as the array
    the trace has (int32[]): the entry explored then carries the node's signature, its cache
    key, and places that operand as the array it is (kept as a number, the node was explored
    again at every call, and its rules had one tensor fewer)."""
    if traced is None:
        return list(operands)
    return [jnp.asarray(x, dtype=t.dtype) if isinstance(x, (bool, int, float, complex, np.generic)) else x
            for x, t in zip(operands, traced)]


def node_signature(node: MetaOp, operands: Sequence[Any]) -> tuple[tuple[str, ...], tuple, str]:
    prim = node.op.removeprefix("jax.")
    names, args = op_arguments(prim, operands)
    return names, args, signature(_OPS, names, args, node.kwargs, exact_sizes(prim, node.kwargs, first_shape(args)))


def _derived(node: MetaOp, prim: str, found: tuple[spec.Strategy, ...], ndims: Sequence[int]) -> NodeCall:
    def refuse() -> OpCase:
        raise AssertionError(f"{node.name}: rules from shape arithmetic, nothing to explore")

    return NodeCall(f"{prim}:{','.join(map(str, ndims))}", found, refuse)


class _TracedOps(JaxOps):
    """JaxOps that take a traced operand (a ShapedArray) for the array it stands for: a
    signature reads shapes and dtypes only."""

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, (jax.Array, core.ShapedArray))


_TRACED_OPS = _TracedOps()


def node_call(captured: Captured, node: MetaOp, rules: RuleTable | None = None) -> NodeCall:
    """The node's signature and table rules from its traced operands; its real operands,
    which the capture records on first use, for live exploration only."""
    traced = captured.abstract(node.name)
    prim = captured.eqn(node.name).prim.name
    ndims = [len(getattr(x, "shape", ())) for x in (traced if traced is not None else captured.values[node.name])]
    if captured.eqn(node.name).prim in BOUNDARY.values():
        return _derived(node, prim, boundary_rules(prim, ndims), ndims)
    if prim == "optimization_barrier" and len(ndims) == 1:
        return _derived(node, prim, _identity_rules(ndims[0]), ndims)
    if traced is not None:
        names, args = op_arguments(prim, traced)
        sig = signature(_TRACED_OPS, names, args, node.kwargs, exact_sizes(prim, node.kwargs, first_shape(args)))
    else:
        names, args, sig = node_signature(node, captured.values[node.name])
    found = (rules if rules is not None else table()).strategies(node.op, sig)

    def case() -> OpCase:
        operands = _as_traced(captured.values[node.name], traced)
        if prim in OPAQUE:
            def refuse(*_a, **_k):
                raise Opaque(f"{prim} is control flow: its bodies have fixed shapes, so it stays replicated")

            args = op_arguments(prim, operands)[1]
            return OpCase(node.op, refuse, args, dict(node.kwargs), names,
                          exact_sizes=exact_sizes(prim, node.kwargs, first_shape(args)))
        params = captured.eqn(node.name).params
        fn = _identity if prim in VALUE_IDENTITIES else compared_as_bits(node.fn, _OPS.is_tensor, float_bits) if prim in ULP_STEPS else node.fn
        example = _widened(_varied(prim, operands, 0))
        try:  # some kernels have no float64 form, or params pin float32: explore as is
            fn(*op_arguments(prim, example)[1])
            widen = _widened
        except Exception:
            example, widen = _varied(prim, operands, 0), list

        def fresh(seed: int):
            return op_arguments(prim, widen(_fresh_operands(prim, params, operands, seed + 1)))[1], dict(node.kwargs)

        a = op_arguments(prim, example)[1]
        # Integer operands are indices or counts the program built to be valid; keys are keys;
        # a reduction's init values are the identity of its computation.
        fixed = frozenset(
            n for n, v in zip(names, a)
            if any(kind_of(x.dtype) in (INT, OTHER) for x in (v if isinstance(v, list) else [v]))
        ) | IDENTITY_OPERANDS.get(prim, frozenset())
        # as the sweep's cases: XLA never reads past an operand, so positions may be offset
        return OpCase(node.op, fn, a, dict(node.kwargs), names, fresh=fresh, fixed=fixed,
                      bounds_checked=True, dropping=dropping_form(node.fn), in_range=clamped_positions(node.fn),
                      localize=localizer(node.fn), padding=padding_of(node.fn), exact_sizes=exact_sizes(prim, node.kwargs, first_shape(a)))

    return NodeCall(sig, found, case, prepare=getattr(captured.values, "record", None),
                    implementation=_callback_code(captured.eqn(node.name).params))


def _callback_code(params: dict[str, Any]) -> str | None:
    """'' for a primitive that is JAX's own; for a host callback (``pure_callback`` and its
    kin), a fingerprint of the user's Python function it runs, which is the op: two programs
    whose callbacks differ only in that function share a signature, and must not share the
    cache entry (None: code that cannot be read, cached in memory only)."""
    callback = params.get("callback")
    if callback is None:
        return ""
    return code_fingerprint([getattr(callback, "callback_func", callback)], frameworks=("jax", "jaxlib"))


__all__ = ["OPAQUE", "Opaque", "boundary_rules", "node_call", "node_signature", "table", "without_literals"]
