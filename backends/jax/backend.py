"""The jax Backend: primitives as ops, their program equations as cases.

A case calls ``prim.bind(*operands, **params)`` eagerly. The explorer sees the operands as
tensor arguments (named after the jax.lax function's parameters) and the params as
keyword arguments in plain form (``signature_params``), so signatures and examples carry
the params that shape a rule: dimension numbers, axes, windows, padding. The call itself
binds the real params, rewritten for shard shapes where they embed the global shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax import lax
from jax._src import config as jax_config
from jax._src import core

from metaspmd import pytree
from metaspmd.case import NoSample, OpCase, Skip
from metaspmd.signature import signature
from metaspmd.tensor_ops import BOOL, COMPLEX, FLOAT, INT, OTHER, ULP_STEPS, compared_as_bits

from . import eager, program_index, programs
from .catalog import catalog, primitive_of
from .model_programs import is_model
from .params import (
    check_shapes, exact_sizes, first_shape, flatten_operands, for_shards, generalizes, group_operands, signature_params,
)
from .indices import fresh_indices
from .inputs import IDENTITY_OPERANDS, VALUE_OPERANDS, condition, with_identity_inits
from .local_params import localizer, padding_of
from .programs import Occurrence
from .tensor_ops import JaxOps, float_bits, kind_of

MAX_CASES = 3  # distinct signatures explored per primitive
# Signatures of the model programs explored per primitive beyond those (model_programs.py),
# except those whose params name the model's own sizes (params.generalizes: a reshape that
# merges or splits dims, an iota's shape; a broadcast's shape is written as its pattern of
# 1s): they match no other model. Enough for every model signature of the busiest
# primitives (broadcast_in_dim: 35; dot_general: 32, Flax-style projections and
# jax.nn.dot_product_attention's rank-5 contractions, grouped and not, among them, about 50
# CPU seconds: the sweep's limit is per 20 example calls, so it has 120).
MODEL_CASES = 40
# Primitives whose every new shard shape costs a slow compile (series expansions, sampling
# loops): fewer cases keep each under the sweep's per-op time limit on two cores.
FEW_CASES = {"igamma": 2, "igammac": 2, "igamma_grad_a": 2, "regularized_incomplete_beta": 2, "random_gamma": 1}
SMALL = 4096  # total operand elements above which a call is a last resort (exploration time)
TINY = 16  # total operand elements below which a call is a last resort (chance agreement)

_KIND_ORDER = {FLOAT: 0, COMPLEX: 1, INT: 2, BOOL: 3, OTHER: 4}


@dataclass(frozen=True)
class PrimitiveCall:
    """``prim.bind`` on the explorer's arguments, with params fitted to the operand shapes."""

    prim: core.Primitive = field(compare=False)
    params: dict = field(compare=False)
    shapes: tuple[tuple[int, ...], ...]  # the example's (global) operand shapes
    # (operand, dim) whose params are re-based to a shard already (OpCase.localize): the
    # params of its other dims still follow the operands (a trial lengthens them too)
    rebased: tuple[int, int] | None = None

    def __call__(self, *args: Any, **_plain_params: Any) -> Any:
        operands = flatten_operands(args)
        local = tuple(tuple(int(s) for s in np.shape(x)) for x in operands)
        check_shapes(self.prim.name, local)
        shapes = self.shapes
        if self.rebased is not None:
            leaf, d = self.rebased
            shapes = tuple(tuple(local[k][e] if (k, e) == (leaf, d) else n for e, n in enumerate(shape))
                           for k, shape in enumerate(self.shapes))
        params = for_shards(self.prim.name, self.params, shapes, local)
        # Most candidate cuts are refused: jax's traceback filtering stats every frame of
        # the explorer's deep stack per refusal, over half of a many-operand op's time.
        with jax_config.traceback_filtering("off"):
            out = eager.bind(self.prim, operands, params)
        return list(out) if self.prim.multiple_results else out


class _AvalOps:
    """Just enough of TensorOps to compute a signature from abstract values."""

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, core.ShapedArray)

    def shape(self, x: core.ShapedArray) -> tuple[int, ...]:
        return tuple(int(s) for s in x.shape)

    def dtype_kind(self, x: core.ShapedArray) -> str:
        return kind_of(x.dtype)


def abstract_signature(occ: Occurrence) -> str:
    names, args = group_operands(occ.primitive, list(occ.in_avals))
    params = signature_params(occ.primitive, occ.params, _shapes(occ))
    return signature(_AvalOps(), names, args, params, exact_sizes(occ.primitive, params, first_shape(args)))


def _preference(occ: Occurrence) -> tuple:
    """Smaller is better: calls with something to shard, float operands, not tiny (a rule
    can pass on a handful of elements by chance), few size-1 dims, not large (exploration
    time), wide dtypes; then program name."""
    avals = occ.in_avals
    shapes = [tuple(a.shape) for a in avals]
    empty = any(0 in s for s in shapes)
    # One PRNG key for a whole batch of draws: nothing shards without changing the stream.
    nothing_to_shard = not any(d >= 2 for s in shapes for d in s) or any(
        kind_of(a.dtype) == OTHER and not a.shape for a in avals)
    kind = max((_KIND_ORDER[kind_of(a.dtype)] for a in avals), default=0)
    ones = sum(1 for s in shapes for d in s if d == 1)
    numel = sum(int(np.prod(s)) for s in shapes)
    narrow = -min((np.dtype(a.dtype).itemsize for a in avals if kind_of(a.dtype) != OTHER), default=8)
    # Ties go by program name: jax builds some harness lists by iterating over sets, so the
    # harness order (and an occurrence's program index) changes from process to process.
    name = programs.programs()[occ.program].name
    return (empty, nothing_to_shard, kind, numel < TINY, numel > SMALL, ones, narrow, name, occ.path)


def _variant(occ: Occurrence) -> tuple:
    """What makes two signatures really different calls: params, ranks and dtype kinds
    (not which operand dims happen to be size 1; a size pattern in the params names them)."""
    return (repr(signature_params(occ.primitive, occ.params, _shapes(occ))),
            tuple((len(a.shape), kind_of(a.dtype)) for a in occ.in_avals))


def choose(occurrences: Sequence[Occurrence]) -> list[tuple[str, Occurrence]]:
    """Every distinct signature with its preferred call: first the best call of each
    operand shape class (ranks and kinds: batched linear algebra, broadcasting), then of
    each param variant, then the rest; each part in order of preference."""
    best: dict[str, Occurrence] = {}
    for occ in occurrences:
        try:
            sig = abstract_signature(occ)
        except ValueError:
            continue
        if sig not in best or _preference(occ) < _preference(best[sig]):
            best[sig] = occ
    ranked = sorted(best.items(), key=lambda kv: _preference(kv[1]))
    shapes, variants, passes = set(), set(), ([], [], [])
    for sig, occ in ranked:
        v = _variant(occ)
        passes[0 if v[1] not in shapes else 1 if v not in variants else 2].append((sig, occ))
        shapes.add(v[1])
        variants.add(v)
    return passes[0] + passes[1] + passes[2]


# Gather modes that clamp positions into range: CLIP by definition, PROMISE_IN_BOUNDS as
# XLA implements the promise.
CLAMPING_MODES = (lax.GatherScatterMode.CLIP, lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def _update_dropping(*args: Any) -> Any:
    """dynamic_update_slice that drops the update's elements out of range, one by one: a
    scatter of each element to its own position (XLA's dynamic_update_slice clamps the start
    instead, and a FILL_OR_DROP scatter of the whole update drops all of it)."""
    operand, update, *starts = flatten_operands(args)
    grids = jax.numpy.meshgrid(*[jax.numpy.arange(n) + s for n, s in zip(update.shape, starts)], indexing="ij")
    positions = jax.numpy.stack([g.ravel() for g in grids], axis=-1)
    every = tuple(range(operand.ndim))
    numbers = lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=every,
                                          scatter_dims_to_operand_dims=every)
    return lax.scatter(operand, positions, update.ravel(), numbers, mode=lax.GatherScatterMode.FILL_OR_DROP)


def dropping_form(call: PrimitiveCall) -> Callable[..., Any] | None:
    """An op that clamps its positions into range, in a form that drops those out of range:
    a clamping gather as FILL_OR_DROP reading zero, dynamic_update_slice as an element-wise
    scatter. What a shard runs where its offset positions fall outside it. Scatters in
    FILL_OR_DROP and PROMISE_IN_BOUNDS mode need none (XLA drops their out-of-range
    updates); a CLIP scatter has none here, so its positions are never offset by drop."""
    if call.prim.name == "dynamic_update_slice":
        return _update_dropping
    if call.prim.name != "gather" or call.params.get("mode") not in CLAMPING_MODES:
        return None
    return PrimitiveCall(call.prim, dict(call.params, mode=lax.GatherScatterMode.FILL_OR_DROP, fill_value=0), call.shapes)


def clamped_positions(call: PrimitiveCall) -> Callable[[list], list] | None:
    """For an op that clamps its positions: its tensor operands with the positions clamped
    as it clamps them (each start so that the slice or update fits the whole operand),
    which an offset marked drop starts from."""
    if dropping_form(call) is None:
        return None
    if call.prim.name == "dynamic_update_slice":
        def clamp_starts(operands: list) -> list:
            operand, update, *starts = operands
            return [operand, update, *(jax.numpy.clip(s, 0, n - u) for s, n, u in zip(starts, operand.shape, update.shape))]

        return clamp_starts
    dn = call.params["dimension_numbers"]

    def clamp(operands: list) -> list:
        operand, indices = operands[0], np.asarray(operands[1])
        # slice sizes as the call fits them to these operands (a whole dim's follows its length)
        shapes = tuple(tuple(int(n) for n in np.shape(x)) for x in operands)
        sizes = for_shards(call.prim.name, call.params, call.shapes, shapes)["slice_sizes"]
        top = np.array([operand.shape[d] - sizes[d] for d in dn.start_index_map], dtype=indices.dtype)
        return [operand, jax.numpy.asarray(np.clip(indices, 0, top)), *operands[2:]]

    return clamp


def build_case(op: str, occ: Occurrence) -> OpCase:
    """The OpCase for one program equation (runs its program up to that equation)."""
    prim = occ.primitive
    captured = programs.capture(occ, 0)
    operands = with_identity_inits(prim, occ.params, condition(prim, captured, programs.capture(occ, 1), 0))
    names, args = group_operands(prim, operands)
    call = PrimitiveCall(occ.prim, dict(occ.params), tuple(tuple(x.shape) for x in operands))
    kwargs = signature_params(prim, occ.params, call.shapes)

    def fresh(seed: int):
        new = with_identity_inits(prim, occ.params, condition(prim, programs.capture(occ, seed + 1), captured, seed + 1))
        for k, value in fresh_indices(prim, occ.params, new, seed + 1).items():
            new[k] = jax.numpy.asarray(value)
        return group_operands(prim, new)[1], dict(kwargs)

    # widen: a primitive's operands take any length (params are refitted to the shapes it
    # gets), and the explorer widens no dim that integer operands could index;
    # bounds_checked: XLA clamps, fills or drops out-of-range positions, never reads past
    return OpCase(op=op, fn=compared_as_bits(call, JaxOps().is_tensor, float_bits) if prim in ULP_STEPS else call, args=args, kwargs=kwargs,
                  arg_names=names, fresh=fresh,
                  fixed=IDENTITY_OPERANDS.get(prim, frozenset()), widen=True, values=VALUE_OPERANDS.get(prim, frozenset()),
                  bounds_checked=True, dropping=dropping_form(call), in_range=clamped_positions(call),
                  localize=localizer(call), padding=padding_of(call), exact_sizes=exact_sizes(prim, kwargs, first_shape(args)),
                  notes=_identity_notes(prim))


def _shapes(occ: Occurrence) -> tuple:
    return tuple(tuple(a.shape) for a in occ.in_avals)


def _identity_notes(prim: str) -> tuple[str, ...]:
    return tuple(f"{name}: the identity of the computation (jax.lax.reduce leaves other values undefined)"
                 for name in sorted(IDENTITY_OPERANDS.get(prim, ())))


class JaxBackend:
    """Backend protocol over jax primitives (CPU, float64 enabled)."""

    name = "jax"

    def __init__(self, max_cases: int = MAX_CASES, model_cases: int = MODEL_CASES):
        self.max_cases, self.model_cases = max_cases, model_cases
        catalog()  # reads the program index, built once per jax version and program sources

    def prepare(self) -> None:
        """Trace every program before any op's time limit starts (seconds): loading, not the
        first op, pays for it. The sweep calls this in every worker."""
        program_index.index().trace_all()

    def tensor_ops(self) -> JaxOps:
        return JaxOps()

    def list_ops(self) -> list[str]:
        return sorted(catalog())

    def cases(self, op: str) -> list[OpCase]:
        entry = catalog().get(op)
        if entry is None:
            raise NoSample(f"unknown jax op {op}")
        if entry.status == "no-sample":
            raise NoSample(entry.reason)
        if entry.status != "explore":
            raise Skip(entry.status, entry.reason)
        jax.clear_caches()  # executables of earlier ops: a sweep worker would otherwise grow by GBs
        prim = primitive_of(op)
        everything = program_index.index()[prim]
        ours = [o for o in everything if not is_model(programs.programs()[o.program])] or everything
        out, chosen, errors = self._built(op, choose(ours), min(self.max_cases, FEW_CASES.get(prim, self.max_cases)))
        if not out:
            raise NoSample("no program call runs: " + (errors[0] if errors else "none found"))
        if prim not in FEW_CASES:
            # ranked among the models' own calls: a signature a harness calls too keeps its place
            calls = [o for o in everything if is_model(programs.programs()[o.program])
                     and generalizes(prim, o.params, _shapes(o))]
            models = [(sig, o) for sig, o in choose(calls) if sig not in chosen]
            out += self._built(op, models, self.model_cases)[0]
        return out

    def cases_at_other_sizes(self, op: str, per_signature: int) -> list[OpCase]:
        """Up to ``per_signature`` more program calls of ``op`` per signature, each at other
        operand shapes than the call the sweep explored (``cases``): where the cross-check
        re-verifies the registry's rules."""
        ops = self.tensor_ops()
        taken: dict[str, list[tuple]] = {  # per explored signature, the shapes taken
            signature(ops, c.arg_names, c.args, c.kwargs, c.exact_sizes):
                [tuple(tuple(ops.shape(x)) for x in pytree.leaves((tuple(c.args), dict(c.kwargs)), ops.is_tensor))]
            for c in self.cases(op)
        }
        out = []
        for occ in program_index.index()[primitive_of(op)]:
            try:
                sig = abstract_signature(occ)
            except ValueError:
                continue
            kept = taken.get(sig)
            if kept is None or _shapes(occ) in kept or len(kept) > per_signature:
                continue
            try:
                out.append(build_case(op, occ))
            except Exception:  # a program that does not run eagerly: as in ``cases``
                continue
            kept.append(_shapes(occ))
        return out

    @staticmethod
    def _built(op: str, ranked: list[tuple[str, Occurrence]], limit: int) -> tuple[list[OpCase], set[str], list[str]]:
        """Cases for the first ``limit`` calls that run, their signatures, the errors."""
        out, chosen, errors = [], set(), []
        for sig, occ in ranked:
            if len(out) == limit:
                break
            try:
                out.append(build_case(op, occ))
                chosen.add(sig)
            except Exception as e:  # a program that does not run eagerly: try the next call
                errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return out, chosen, errors
