"""The baseline stage: the trials every rule of one example call is judged on (the
example, then fresh, blind and special-value ones as the data calls for them), or an
answer before any search (the op fails, is nondeterministic, has nothing to shard)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import pytree
from ..rules import TensorArg
from ..tensor_ops import BOOL, COMPLEX, FLOAT, INT
from .common import NO_TENSOR_INPUT, TRIAL_SPLITS, Context, Trial, bitwise_equal, error_text, example_value, flat_along
from .trials import Trials


@dataclass(frozen=True)
class Baseline:
    """The trials the rules are judged on (the example first), the example's outputs as
    the entry records them, and notes on what the trials showed."""

    trials: tuple[Trial, ...]
    results: tuple[TensorArg, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """The entry's status and reason where no search runs."""

    status: str
    reason: str
    results: tuple[TensorArg, ...] = ()


def draw_baseline(context: Context) -> Baseline | Verdict:
    """The trials to judge rules on, or the verdict that ends the call's exploration."""
    case, ops, runner = context.case, context.ops, Trials(context)
    try:
        first = runner._trial(tuple(case.args), dict(case.kwargs))
        again = runner._trial(tuple(case.args), dict(case.kwargs))
    except Exception as e:
        return Verdict("failed", error_text(e))
    # an output close() cannot compare (a sparse tensor) makes no op nondeterministic
    opaque = next(((j, what) for j, x in enumerate(first.outputs) if (what := ops.opaque(x))), None)
    if opaque is None and (len(first.outputs) != len(again.outputs)
                           or not all(ops.close(a, b) for a, b in zip(again.outputs, first.outputs))):
        return Verdict("failed", "nondeterministic: two identical calls differ")
    results = tuple(example_value(ops, x) for x in first.outputs)
    if opaque is not None:
        return Verdict("replicate-only", f"output {opaque[0]} is {opaque[1]}, which no combine compares", results)
    if not first.outputs:
        return Verdict("replicate-only", "no tensor output", results)
    if not pytree.leaves((case.args, case.kwargs), ops.is_tensor):
        return Verdict("derived", NO_TENSOR_INPUT, results)
    trials = [first]
    try:
        for k in range(1, len(TRIAL_SPLITS) + 1):
            trials.append(runner._fresh_trial(k, first))
    except Exception as e:
        return Verdict("failed", "fresh inputs: " + error_text(e), results)
    # Data past and at the call's value arguments joins last: it decides nothing about which
    # other trials the random data calls for (where it alone moves an output, as isin(2, x)'s
    # planted 2s do, the special values must still come)
    scaled = (runner._scaled_trials(case.specials.value_args)
              if case.specials.value_args and not case.randomness.random else [])
    notes: list[str] = []
    constant = constant_outputs(ops, trials)
    blind = bool(constant or empty_outputs(ops, trials) or integer_data(context, trials)
                 or constant_inputs(context, trials) or flat_along_a_dim(context, trials))
    if blind:
        # The sample's data leaves an output constant or empty (nonzero of all zeros), or
        # is integers from a narrow range, whose ties let argmin's local indices pass for
        # the global one, or repeats an input on every trial (scatter_add's zero self,
        # under which a replicated self passes for a Partial one), or is the same along a
        # dim (an expanded sample, whose shards there are equal): blind data joins in
        # where the op takes it.
        trials = trials + runner._blind_trials()
        constant = constant_outputs(ops, trials)
    # A whole-tensor predicate (equal, allclose) also gets them where it varies: the
    # sample's data is alike on every shard (allclose's other is self plus the same
    # small noise everywhere), and identity is refuted only where shards disagree. So
    # does an op that blind data leaves one value throughout (ne of random integers and
    # 1: all True), where the sample may be no better (all zero): special values plant the 1.
    # So does an output the example moves but fresh data leaves constant: the example holds
    # values the op reads that random data never does (cosine_embedding_loss reads its
    # target only where it is exactly 1 or -1, so every fresh loss was 0 and identity held).
    wanted = (constant or whole_tensor_predicates(ops, trials) or case.specials.always
              or one_valued_blind(trials) or constant_outputs(ops, trials[1:]))
    special = runner._special_trials() if wanted and case.specials.special is not None else None
    if special is not None:
        # Verified on the random trials and the special-value ones alike: an output
        # that is constant on random data (aminmax's min of many integers) still refutes
        # combines there once its shards differ.
        trials = trials + special
        # Constant under random and every special-value pattern alike (all zero, all
        # NaN, lone nonzero, ...): the output depends on shapes and non-tensor arguments
        # only (full_like, fill), so every combine that rebuilds it from local outputs
        # holds for any data.
        still = constant_outputs(ops, trials + scaled)
        if still:  # or constant because an index never varied (index_fill's covers every column)
            trials = trials + resampled_index_trials(runner, trials)
            still = constant_outputs(ops, trials + scaled)
        if still:
            which = ", ".join(map(str, still))
            notes.append(f"output {which} constant under random and special-value inputs: shape-determined")
        constant = []
    trials = trials + scaled
    if constant:
        constant = constant_outputs(ops, trials)
    if constant:
        j = constant[0]  # NaN throughout: the op fails on these inputs rather than ignoring them
        why = "is NaN or infinite on every trial" if ops.one_nonfinite_value(first.outputs[j]) else "does not vary with the inputs"
        return Verdict("replicate-only", f"output {j} {why}: combines cannot be verified", results)
    if not blind and one_signed_inputs(context, trials):
        # Positive sample data (max_unpool2d's pooled values) lets a max of zero-padded
        # local outputs pass for the scatter: signed blind data refutes it. Added after
        # the special values are settled: they verify, and call in nothing.
        trials = trials + runner._blind_trials()
    return Baseline(tuple(trials), results, tuple(notes))


def resampled_index_trials(runner: Trials, trials: Sequence[Trial]) -> list[Trial]:
    """``trials`` with each fixed input that holds the same values on all of them redrawn
    from its own values, with repeats: an output constant only because that input never
    varied (an index_fill whose index covers every column) then varies. A trial the op
    refuses is left out."""
    ops, first = runner.ops, trials[0]
    frozen = {i for i, name in enumerate(runner.leaf_names) if name in runner.fixed
              and all(bitwise_equal(ops, t.leaves[i], first.leaves[i]) for t in trials[1:])}

    def redrawn(trial: Trial, i: int, x: Any) -> Any:
        if i not in frozen:
            return x
        values = np.asarray(ops.to_numpy(x))
        rng = np.random.default_rng(runner.seed * 7919 + 31 * trial.index + i)
        return ops.from_numpy(rng.choice(values.ravel(), values.shape), x)

    return [t for base in trials if frozen for t in runner._rebuilt_trials(redrawn, [base]) or ()]


def constant_outputs(ops, trials: Sequence[Trial]) -> list[int]:
    """Non-empty outputs that are the same on every trial."""
    first = trials[0]
    return [
        j for j in range(len(first.outputs))
        if 0 not in ops.shape(first.outputs[j])
        and all(ops.close(t.outputs[j], first.outputs[j]) for t in trials[1:])
    ]


def one_valued_blind(trials: Sequence[Trial]) -> bool:
    """Some blind trial leaves every output one value throughout, or NaN throughout
    (``ndtri`` of random integers: its domain [0, 1] holds two of them)."""
    return any(t.one_value is not None or (t.nonfinite and not t.special) for t in trials)


def whole_tensor_predicates(ops, trials: Sequence[Trial]) -> bool:
    """Some output is a single bool (a predicate of whole inputs)."""
    return any(ops.shape(o) == () and ops.dtype_kind(o) == BOOL for o in trials[0].outputs)


def constant_inputs(context: Context, trials: Sequence[Trial]) -> bool:
    """Some float input with elements, not fixed, is the same on every trial."""
    ops, first = context.ops, trials[0]
    return any(
        ops.dtype_kind(x) in (FLOAT, COMPLEX) and 0 not in ops.shape(x) and name not in context.fixed
        and all(ops.close(t.leaves[i], x) for t in trials[1:])
        for i, (x, name) in enumerate(zip(first.leaves, context.leaf_names))
    )


def one_signed_inputs(context: Context, trials: Sequence[Trial]) -> bool:
    """Some real float input, not fixed, is positive throughout on every random trial
    (or negative throughout)."""
    ops, first = context.ops, trials[0]

    def one_signed(x: Any) -> bool:
        try:
            a = ops.to_numpy(x)
        except Exception:
            return False
        return bool((a > 0).all() or (a < 0).all())

    return any(
        ops.dtype_kind(x) == FLOAT and 0 not in ops.shape(x) and name not in context.fixed
        and all(one_signed(t.leaves[i]) for t in trials if not t.special)
        for i, (x, name) in enumerate(zip(first.leaves, context.leaf_names))
    )


def flat_along_a_dim(context: Context, trials: Sequence[Trial]) -> bool:
    """Some float input, not fixed, is the same along one of its dims on every trial (an
    expanded sample): its equal shards there prove nothing, so no cut of it is proposed."""
    ops, first = context.ops, trials[0]
    return any(
        ops.dtype_kind(x) in (FLOAT, COMPLEX) and 0 not in ops.shape(x) and name not in context.fixed
        and any(all(flat_along(ops, t.leaves[i], d) for t in trials) for d in range(len(ops.shape(x))))
        for i, (x, name) in enumerate(zip(first.leaves, context.leaf_names))
    )


def integer_data(context: Context, trials: Sequence[Trial]) -> bool:
    """Some integer or bool input is data (not an index kept fixed)."""
    return any(context.ops.dtype_kind(x) in (INT, BOOL) and name not in context.fixed
               for x, name in zip(trials[0].leaves, context.leaf_names))


def empty_outputs(ops, trials: Sequence[Trial]) -> bool:
    """Some output has no elements on every trial."""
    return any(all(0 in ops.shape(t.outputs[j]) for t in trials) for j in range(len(trials[0].outputs)))
