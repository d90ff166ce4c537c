"""Numerical checks of one sharding rule, independent of the explorer that found it.

A trial draws fresh inputs of the example's shapes, shards them as the rule says (a dim
cut into pieces, or a Partial input split into parts that reduce back to it), runs the op
on every shard and recombines the local outputs with the rule's combines. Used both ways
by the DTensor cross-check: on our rules that DTensor lacks, and on DTensor's rules that
our registry lacks (a DTensor rule that fails on its own split of our example is a
DTensor false positive).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from metaspmd import pytree
from metaspmd.case import OpCase
from metaspmd.check import cut_inputs, shard_inputs, surviving
from metaspmd.combine import Split, partial_summands
from metaspmd.combine import partial_parts as reduced_parts
from metaspmd.explorer import SPECIAL_TRIALS
from metaspmd.explorer.common import even_counts, even_gather
from metaspmd.signature import arg_items
from metaspmd.spec import Combine, InputPlacement, PartialInput, Reduce, ShardIn, drops
from metaspmd.tensor_ops import TensorOps

from .tensor_ops import FLOAT8


def _leaf_names(case: OpCase, ops: TensorOps) -> list[str]:
    names = []
    for name, value in arg_items(case.arg_names, case.args, case.kwargs):
        names += [name] * len(pytree.leaves(value, ops.is_tensor))
    return names


def fresh_inputs(case: OpCase, ops: TensorOps, seed: int, blind: bool = False) -> tuple[tuple, dict]:
    """New inputs of the example's shapes: the sample's own generator when it has one
    (constrained inputs stay valid), else signed random values outside ``fixed`` args.
    ``blind``: random values even where the sample has a generator, which also breaks
    whatever special structure its inputs share (aliased tensors, zero weights)."""
    example = pytree.leaves((tuple(case.args), dict(case.kwargs)), ops.is_tensor)
    if case.fresh is not None and not blind:
        try:
            args, kwargs = case.fresh(seed)
            got = pytree.leaves((tuple(args), dict(kwargs)), ops.is_tensor)
            if [ops.shape(x) for x in got] == [ops.shape(x) for x in example]:
                return tuple(args), dict(kwargs)
        except Exception:
            pass  # fall back to refilling the example
    new = [
        x if name in case.fixed or ops.dtype_kind(x) == "o" else ops.random_like(x, seed * 131 + i)
        for i, (x, name) in enumerate(zip(example, _leaf_names(case, ops)))
    ]
    return pytree.replace((tuple(case.args), dict(case.kwargs)), ops.is_tensor, new)


class FreshInputs:
    """``fresh_inputs`` of one case, remembered by seed: every rule of an example is checked
    on the same few draws, and regenerating an OpInfo sample is the slow part of a check."""

    def __init__(self, case: OpCase, ops: TensorOps):
        self.case, self.ops = case, ops
        self._drawn: dict[tuple[int, bool, int], tuple[tuple, dict]] = {}

    def __call__(self, seed: int, blind: bool = False, special: int = 0) -> tuple[tuple, dict]:
        if (seed, blind, special) not in self._drawn:
            args, kwargs = fresh_inputs(self.case, self.ops, seed, blind)
            if special:  # refilled by the case's special-value pattern, fixed args (indices) kept
                new_args, new_kwargs = self.case.special(args, kwargs, special, seed)
                names = _leaf_names(self.case, self.ops)
                kept = pytree.leaves((tuple(args), dict(kwargs)), self.ops.is_tensor)
                refilled = pytree.leaves((tuple(new_args), dict(new_kwargs)), self.ops.is_tensor)
                leaves = [k if name in self.case.fixed else r for k, r, name in zip(kept, refilled, names)]
                args, kwargs = pytree.replace((tuple(args), dict(kwargs)), self.ops.is_tensor, leaves)
            self._drawn[seed, blind, special] = (tuple(args), dict(kwargs))
        return self._drawn[seed, blind, special]

    def special_patterns(self) -> range:
        """The special-value patterns every rule of this case must hold on: all of them for an
        op that treats values apart that random data never holds (nanmean's NaN,
        ``OpCase.special_always``), none for the others."""
        return range(1, SPECIAL_TRIALS + 1) if self.case.special_always and self.case.special else range(0)


def chunk_bounds(size: int, n: int) -> list[tuple[int, int]]:
    """(start, length) per shard as torch.chunk (and DTensor) cut: ceil-sized pieces first."""
    q = math.ceil(size / n)
    return [(min(k * q, size), min(size, (k + 1) * q) - min(k * q, size)) for k in range(n)]


def partial_parts(ops: TensorOps, x: torch.Tensor, op: str, n: int, seed: int, aligned: bool = False) -> list[torch.Tensor]:
    """n tensors that reduce by ``op`` to x: a Partial(op) version of x (the explorer's sum
    and prod parts, ``aligned`` as it has them on special values, and DTensor's avg, max
    and min)."""
    if op in ("sum", "prod"):
        return reduced_parts(ops, x, op, n, seed, aligned=aligned)
    if op == "avg":
        return partial_summands(ops, x * n, n, seed)
    if op in ("max", "min"):  # one random part holds x, the others lie strictly beyond it
        g = torch.Generator().manual_seed(seed)
        owner = torch.randint(0, n, x.shape, generator=g)
        sign = -1 if op == "max" else 1
        gaps = [torch.rand(x.shape, generator=g, dtype=torch.float64).mul(3).add(0.5).to(x.dtype) for _ in range(n)]
        return [torch.where(owner == k, x, x + sign * gaps[k]) for k in range(n)]
    raise ValueError(f"no Partial({op}) inputs")


@dataclass(frozen=True)
class Trial:
    n: int  # shard count
    seed: int
    chunked: bool = False  # cut dims as DTensor does (torch.chunk) rather than near-equally
    blind: bool = False  # random inputs, not the sample's generator
    special: int = 0  # the case's special-value pattern k refills the inputs (0: none)
    # Partial(sum) inputs whose parts cancel: the global value is zero, the parts are not
    # (any(x1 + x2) is not any(x1) or any(x2) where x1 = -x2; random parts never cancel)
    cancelling: bool = False


@dataclass(frozen=True)
class Failure:
    message: str
    crashed: bool = False  # the op raised on a shard, rather than giving a wrong result


def run_trial(inputs: FreshInputs, placements: Sequence[InputPlacement], combines: Sequence[Combine],
              trial: Trial) -> Failure | None:
    """None when the combines rebuild every output from the shards' outputs, else what
    went wrong. Raises when the op fails on the fresh unsharded inputs (no verdict)."""
    case, ops = inputs.case, inputs.ops
    args, kwargs = inputs(trial.seed, trial.blind, trial.special)
    leaves = pytree.leaves((args, kwargs), ops.is_tensor)
    if trial.cancelling:
        leaves = [ops.zeros_like(x) if isinstance(p, PartialInput) and p.op == "sum" else x
                  for x, p in zip(leaves, placements)]
        args, kwargs = pytree.replace((args, kwargs), ops.is_tensor, leaves)
    want = pytree.leaves(case.call(args, kwargs), ops.is_tensor)
    if len(want) != len(combines):
        raise ValueError(f"{len(want)} outputs, the rule combines {len(combines)}")
    n = trial.n
    bounds = (lambda size: chunk_bounds(size, n)) if trial.chunked else Split(n).bounds
    cut = cut_inputs(ops, leaves, placements, n, bounds)

    def parts(i: int, x: torch.Tensor, op: str) -> list[torch.Tensor]:
        return partial_parts(ops, x, op, n, trial.seed * 31 + i, aligned=bool(trial.special))

    # an offset marked drop: positions as the op would clamp them, shards run its dropping form
    drop = drops(placements)
    whole = case.positions_in_range(leaves) if drop else leaves
    sharded = shard_inputs(ops, leaves, placements, cut, parts, case.padding, whole)
    if isinstance(sharded, str):
        raise ValueError(sharded)
    locals_ = []
    for k, (local, params) in enumerate(zip(sharded.inputs, sharded.local)):
        a, kw = pytree.replace((args, kwargs), ops.is_tensor, list(local))
        try:
            got = pytree.leaves(case.call(a, kw, drop, params), ops.is_tensor)
        except Exception as e:
            return Failure(f"shard {k + 1} of {n} fails: {type(e).__name__}", crashed=True)
        if len(got) != len(want):
            return Failure(f"shard {k + 1} of {n} gives {len(got)} outputs", crashed=True)
        locals_.append(got)
    for j, (c, kept) in enumerate(zip(combines, surviving(ops, [[c] for c in combines], locals_, want, sharded.cut))):
        if not kept:
            return Failure(f"output {j}: {c} does not rebuild it from {n} shards")
    return None


def draw_seed(seed: int, trial: int) -> int:
    """The seed of a check's ``trial``-th draw. Every check of an example uses the same few
    draws, so FreshInputs regenerates the sample only that many times."""
    return seed * 1000 + trial + 1


def _sharded_sizes(case: OpCase, ops: TensorOps, placements: Sequence[InputPlacement]) -> list[int]:
    leaves = pytree.leaves((tuple(case.args), dict(case.kwargs)), ops.is_tensor)
    return [ops.shape(leaves[i])[p.dim] for i, p in enumerate(placements) if isinstance(p, ShardIn)]


def reverify(inputs: FreshInputs, placements: Sequence[InputPlacement], options: Sequence[Sequence[Combine]],
             seed: int) -> tuple[str, str]:
    """Check a rule of ours on fresh data: ('ok' | 'failed' | 'data-dependent' | 'vacuous' |
    'unchecked', detail).

    Every combine listed for an output must hold: two trials with inputs from the sample's
    generator, a 4-way split (or the largest that fits) and another count, uneven where
    the sizes allow (an even gather: the even counts its dims take, as the explorer's);
    reduce(avg) only on equal shards, where the registry claims it. Then
    one trial on blind random inputs, where the op accepts them: a rule that fails only
    there holds for the sample's special inputs alone ('data-dependent')."""
    case, ops = inputs.case, inputs.ops
    try:
        example = pytree.leaves(case.call(tuple(case.args), dict(case.kwargs)), ops.is_tensor)
    except Exception as e:
        return "unchecked", f"the op fails on the example: {type(e).__name__}"
    if example and all(0 in ops.shape(x) for x in example):
        return "vacuous", "empty output: every combine rebuilds it"
    sizes = _sharded_sizes(case, ops, placements)
    even_rule = any(even_gather(c) for opts in options for c in opts)
    if even_rule:
        # claimed on even cuts alone (of the inputs and of the dims its gathers join), as the
        # explorer verified it: an uneven shard of a reshape's split dim does not even run
        sizes += [ops.shape(example[j])[c.dim] for j, opts in enumerate(options) for c in opts
                  if even_gather(c) and j < len(example) and c.dim < len(ops.shape(example[j]))]
        counts = even_counts(sizes)
        if not counts:
            return "unchecked", "an even gather, and no shard count cuts its dims evenly"
        trials = [counts[0], counts[1 % len(counts)]]
    else:
        counts = [n for n in (4, 3, 2) if all(s >= n for s in sizes)]
        if not counts:
            return "unchecked", "no sharded dim can be cut in 2"
        trials = [counts[0], next((n for n in counts[1:] if any(s % n for s in sizes)), counts[-1])]
    checked = 0
    for t, n in enumerate(trials):
        even = all(s % n == 0 for s in sizes)
        for choice in itertools.product(*options):
            if not even and Reduce("avg") in choice:
                continue
            try:
                err = run_trial(inputs, placements, choice, Trial(n, draw_seed(seed, t)))
            except Exception as e:
                return "unchecked", f"the op fails on fresh inputs: {type(e).__name__}"
            checked += 1
            if err:
                return "failed", err.message
    if not checked:
        return "unchecked", "reduce(avg) needs equal shards"
    even = all(s % trials[0] == 0 for s in sizes)
    for choice in itertools.product(*options):
        if not even and Reduce("avg") in choice:
            continue
        try:
            err = run_trial(inputs, placements, choice, Trial(trials[0], draw_seed(seed, 2), blind=True))
        except Exception:
            break  # the op refuses unconstrained inputs: the sample's generator is all there is
        if err:
            return "data-dependent", f"holds on the sample's inputs, not on random ones: {err.message}"
    special = trials[0] if even_rule else _special_count(placements, trials[0])
    even = all(s % special == 0 for s in sizes)
    for choice in itertools.product(*options):
        if Reduce("avg") not in choice:
            err = _cancelling_failure(inputs, placements, choice, Trial(2, draw_seed(seed, 0)))
            if err:
                return "failed", err.message
        if even or Reduce("avg") not in choice:
            err = _special_failure(inputs, placements, choice, Trial(special, draw_seed(seed, 0)))
            if err:
                return "failed", err.message
    return "ok", f"{checked} checks on {' and '.join(map(str, trials))} shards"


# Draws of fresh inputs a foreign rule must hold on, on its own split. One draw can hide a
# wrong rule: DTensor's nll_loss (S(0), S(0), R) -> P(avg) with class weights holds exactly
# where every shard's targets weigh the same, which two random targets of three classes
# do one draw in three.
FOREIGN_DRAWS = 3


def check_foreign_rule(inputs: FreshInputs, placements: Sequence[InputPlacement], combines: Sequence[Combine],
                       mesh_size: int, seed: int) -> tuple[str, str]:
    """Check another framework's rule: ('holds' | 'wrong' | 'split-dependent' | 'unchecked', detail).

    'wrong': it gives wrong numbers on the framework's own split of this example
    (``mesh_size`` pieces as torch.chunk cuts) on one of ``FOREIGN_DRAWS`` draws;
    'split-dependent': it holds there but not with another shard count, which the explorer
    requires (it keeps rules that hold on 2, 3 and uneven shards). A shard that raises
    proves nothing here ('unchecked'): the framework may run it with other arguments than
    the global call's (local sizes)."""
    inexact = _inexact_partial(inputs.case, inputs.ops, placements)
    if inexact:
        return "unchecked", inexact
    sizes = _sharded_sizes(inputs.case, inputs.ops, placements)
    others = [n for n in (3, 2, 4) if n != mesh_size and all(s >= n for s in sizes)]
    own = [Trial(mesh_size, draw_seed(seed, d), chunked=True) for d in range(FOREIGN_DRAWS)]
    trials = own + [Trial(n, draw_seed(seed, 1)) for n in others[:1]]
    for t, trial in enumerate(trials):
        try:
            err = run_trial(inputs, placements, combines, trial)
        except Exception as e:
            return "unchecked", f"the op fails on fresh inputs: {type(e).__name__}"
        if err and err.crashed:
            return "unchecked", err.message
        if err:
            return ("wrong" if t < len(own) else "split-dependent"), err.message
    err = _cancelling_failure(inputs, placements, combines, Trial(2, draw_seed(seed, 0), chunked=True))
    if err:
        return "wrong", err.message
    special = Trial(_special_count(placements, mesh_size), draw_seed(seed, 0), chunked=True)
    err = _special_failure(inputs, placements, combines, special)
    if err:
        return "wrong", err.message
    return "holds", ""


INEXACT_SPLIT = "no split of a Partial(sum) input is exact"


def _inexact_partial(case: OpCase, ops: TensorOps, placements: Sequence[InputPlacement]) -> str:
    """Why no split of a Partial(sum) input here sums back to it exactly, or ''. A float8
    input's parts round to float8 (they sum back on about half the elements), so the op on
    them differs from the op on the input for a rule that holds: no verdict either way."""
    leaves = pytree.leaves((tuple(case.args), dict(case.kwargs)), ops.is_tensor)
    for i, p in enumerate(placements):
        if isinstance(p, PartialInput) and p.op == "sum" and leaves[i].dtype in FLOAT8:
            return f"{INEXACT_SPLIT}: input {i} is in {leaves[i].dtype}, whose parts round"
    return ""


def _special_count(placements: Sequence[InputPlacement], n: int) -> int:
    """The shard count for the special-value check: 2 where an input is Partial(sum), whose
    two parts of a zero (all-zero patterns) cancel exactly, as a linear op's outputs then
    do; more parts round at their own size, which a zero output cannot excuse."""
    return 2 if any(isinstance(p, PartialInput) and p.op == "sum" for p in placements) else n


def _special_failure(inputs: FreshInputs, placements: Sequence[InputPlacement], combines: Sequence[Combine],
                     trial: Trial) -> Failure | None:
    """The rule's failure on the case's special-value inputs, where it must hold on them
    (``FreshInputs.special_patterns``); None when it holds, or the op refuses them."""
    for k in inputs.special_patterns():
        try:
            err = run_trial(inputs, placements, combines, dataclasses.replace(trial, special=k))
        except Exception:
            continue  # the op refuses these values: no verdict
        if err and not err.crashed:
            return Failure(f"{err.message} on special values (pattern {k})")
    return None


def _cancelling_failure(inputs: FreshInputs, placements: Sequence[InputPlacement], combines: Sequence[Combine],
                        trial: Trial) -> Failure | None:
    """The rule's failure on ``trial`` with its Partial(sum) inputs zero and their parts not;
    None when it holds there, has no such input, or the op refuses zeros. Two parts, x and
    -x, cancel exactly, so a linear op's local results do too, with no rounding to excuse."""
    if not any(isinstance(p, PartialInput) and p.op == "sum" for p in placements):
        return None
    try:
        err = run_trial(inputs, placements, combines, dataclasses.replace(trial, cancelling=True))
    except Exception:
        return None  # the op refuses the zeroed inputs: no verdict
    if err and not err.crashed:
        return Failure(f"{err.message} when the Partial parts cancel to zero")
    return None


__all__ = [
    "FOREIGN_DRAWS", "Failure", "FreshInputs", "Trial", "check_foreign_rule", "chunk_bounds", "fresh_inputs",
    "partial_parts", "reverify", "run_trial",
]
