"""The search stage (``Explorer``: every group explored and verified on the baseline's
trials) and the public entry points: ``explore_case`` runs the stages in turn (context,
baseline, search, entry), ``explore_op`` every case of an op, ``holds_at_other_sizes``
one rule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import pytree
from ..case import Backend, NoSample, OpCase, Skip
from ..rules import OpRecord, RuleEntry, Verification, make_record
from ..signature import signature
from ..spec import (
    Combine, Gather, Group, IndependentSpec, InputPlacement, OutputCombine, Replicate, tables_from_strategies,
)
from ..tensor_ops import TensorOps
from .baseline import Baseline, Verdict, draw_baseline
from .common import (
    EXPLORE_SPLIT, TRIAL_SPLITS, UNINFORMATIVE, Context, ExploreConfig, Memo, Trial, cuts_a_dim, error_text,
    even_gather, example_of, fit_partial, group_of, halo_gathers_only, no_strategy, refusal_key,
)
from .groups import Groups
from .independence import IndependentParts
from .shards import Shards
from .sizes import OtherSizes
from .trials import Trials
from .verify import Verified, Verifier
from .widening import Widening

Strategy = tuple[tuple[InputPlacement, ...], tuple[OutputCombine, ...]]


@dataclass(frozen=True)
class Search:
    """One pass over the groups (within independent parts, or across all inputs): the
    strategies that held, the shard counts tried, whether a split was uneven, the status."""

    strategies: tuple[Strategy, ...]
    counts: frozenset[int]
    uneven: bool
    status: str


@dataclass(frozen=True)
class Found:
    """What the search stage found for the call: the strategies the entry lists, how they
    were verified (trials besides the example, shard counts, unevenness), its status, the
    independent parts' labels, and notes on dims lengthened to verify kept strategies."""

    strategies: tuple[Strategy, ...]
    trials: int
    counts: frozenset[int]
    uneven: bool
    status: str
    independent: IndependentSpec | None = None
    notes: tuple[str, ...] = ()


# Inputs of more elements than this (a model's real sizes, met live; the sweep's examples
# hold a few thousand) are explored without the memo's tensors (``Memo.holds_values``).
MEMO_ELEMENTS = 1 << 20


def _elements(ops: TensorOps, leaves: Sequence[Any]) -> int:
    return sum(math.prod(ops.shape(x)) for x in leaves)


class Explorer(Trials, Groups, Shards, Verifier, OtherSizes, Widening, IndependentParts):
    """The search stage of one example call, on the baseline's trials. Each base class is
    one part of the work, on the state set here: the ``Context`` fields (``Trials``),
    ``trials`` (swapped only inside ``Widening._on_trials``), ``memo`` (draws and answers
    kept across groups) and ``widened`` (notes on strategies verified on lengthened dims,
    by placements)."""

    def __init__(self, context: Context, trials: Sequence[Trial]):
        super().__init__(context)
        self.trials = list(trials)
        self.special_trials = [t for t in self.trials if t.special]  # the baseline's _special_trials(), if drawn
        self.memo = Memo(holds_values=_elements(self.ops, self.trials[0].leaves) <= MEMO_ELEMENTS)
        self.widened: dict[tuple, list[str]] = {}

    def search(self, ranks: tuple[int, ...]) -> Found:
        """Every group explored and verified, within independent parts where the inputs
        split into them, and the strategies found beside inputs no output reads."""
        case = self.case
        parts = self._independent_parts() if case.candidates is None else None
        whole = self._search(ranks, None)
        found, counts, uneven, status = list(whole.strategies), whole.counts, whole.uneven, whole.status
        independent = None
        if parts is not None:
            split = self._search(ranks, parts.inputs)
            # the strategies that place a shared input come from the search across parts
            coupling = [s for s in whole.strategies if any(not isinstance(s[0][i], Replicate) for i in parts.shared)]
            spec = self._independent_spec(ranks, list(split.strategies) + coupling, list(whole.strategies), parts)
            if spec is not None:  # else coupled after all, or nothing to gain: the search across parts stands
                found, status = list(split.strategies) + coupling, split.status
                # the coupling strategies' trials too
                counts, uneven = split.counts | whole.counts, split.uneven or whole.uneven
                independent = spec
        if not found:
            return Found((), 0, counts, uneven, status)
        if independent is None and self.config.partial and case.candidates is None:
            found = found + self._beside_unread(found)  # independent parts give these as joints
        kept = {placements for placements, _ in found}
        notes = tuple(dict.fromkeys(n for p, ns in self.widened.items() if p in kept for n in ns))
        return Found(tuple(found), len(self.trials) - 1 + len(self.memo.reserve), counts, uneven, status,
                     independent, notes)

    def _search(self, ranks: tuple[int, ...], parts: Sequence[frozenset[int]] | None) -> Search:
        """Explore and verify every group, within each of ``parts`` (inputs of independent
        parts) if given: a case's own candidates where it has them, else the groups the
        inputs' dims make; then Partial inputs with nothing cut."""
        accept = Accepted(self._verify, len(ranks), self.case.sized_by, self.case.uncut_dims)
        if self.case.candidates is not None:
            self._verify_candidates(accept)
            status = "derived" if self.case.candidates_derived else "ok"
        else:
            self._explore_groups(accept, parts)
            status = "ok"
        case = self.case
        if self.config.partial and (not case.randomness.random or case.randomness.value_free):
            # Partial inputs with nothing sharded: linear ops (views included, whose derived
            # candidates only move shards) pass Partial through; fills ignore them.
            for p in self._partial_sets(set(), parts):
                g = Group((), p)
                accept(g, self._valid_combines(g, self.trials[0], EXPLORE_SPLIT))
        return accept.search(status)

    def _verify_candidates(self, accept: Accepted) -> None:
        """The case's candidates (derived from shape arithmetic, or a neighbour's rules),
        each explored on its own combines and verified."""
        for placements, outs in self.case.candidates:
            group = group_of(placements)
            # beside a cut, a Partial input keeps only reduces and identity, unless no
            # output reads it (a joint of independent parts)
            unread = group.dims and group.partial and set(group.partial) <= set(self._unread_inputs())
            accept(group, self._explore(group, [list(o.options) if unread else fit_partial(group, o.options)
                                                for o in outs]))

    def _explore_groups(self, accept: Accepted, parts: Sequence[frozenset[int]] | None) -> None:
        """Each group of cut dims, and where it fails, the same cut with more beside it:
        Partial inputs, offset positions, local params, halos, proportional cuts."""
        case, found = self.case, accept.found
        shapes = [self.ops.shape(x) for x in self.trials[0].leaves]
        for group in self._part_groups(shapes, parts):
            combines = self._explore(group)
            if accept(group, combines):
                # every shard padding as the whole op would and the gather dropping the
                # copies (an output halo, which planners skip): where each shard padding
                # only its own outer end holds too, that local rule takes the dim's label
                if self.config.local and halo_gathers_only(found[-1][1]) and self._localizes(group):
                    halo, local = found.pop(), Group(group.dims, local=True)
                    if not accept(local, self._explore(local)):
                        found.append(halo)
                continue
            # a cut the case refused on the example by its shapes alone (ShapeRefused): Partial
            # inputs and offsets beside it keep those shapes, and are refused alike, untried
            taken = refusal_key(group.dims, self.trials[0], EXPLORE_SPLIT) not in self.memo.refused
            if taken and self.config.partial and not case.randomness.random and any(
                accept(g, self._explore(g)) for g in self._partial_groups(group, parts)
            ):
                continue
            if taken and self.config.offset and case.index.bounds_checked and not case.randomness.random and any(
                accept(g, self._explore(g)) for g in self._offset_groups(group)
            ):
                continue
            # an op that clamps positions (a CLIP gather) reads a shard's edge for those
            # outside it, one that refuses them (torch's embedding) raises: clamped first
            # as the op would, then offset, its dropping form reads zero there
            if self.config.offset and case.index.dropping is not None and not case.randomness.random and any(
                accept(g, self._explore(g)) for g in self._offset_groups(group, drop=True)
            ):
                continue
            # a slice, split or pad of the cut dim: each shard takes its own part of the range
            if self.config.local and self._localizes(group) and accept(
                    Group(group.dims, local=True), self._explore(Group(group.dims, local=True))):
                continue
            # where the sample showed nothing about the plain cut (its data the same along
            # the dim), the plain cut comes first on lengthened trials, then the halos
            if self.config.halo and self._search_halos(group, accept, accept.n_inputs,
                                                       plain=combines is UNINFORMATIVE):
                continue
            # not beside index inputs: their positions address the dims a follower cuts
            # (max_pool2d_with_indices_backward's indices into self, which a kernel trusts)
            if (self.config.follow and not case.randomness.random and not self.fixed
                    and not any(h for _, _, h in group.dims)):
                follow = self._follow_groups(group, parts)
                if any(accept(g, self._explore(g)) for g in follow) or self._follow_lengthened(
                        follow, accept, accept.n_inputs):
                    continue
            # a plain cut of a dim the op splits into several (jax's reshape of [8, 256] to
            # [8, 4, 64] along the 256) holds where the shard count divides both: a gather
            # on even cuts only, where the signature pins every size (see _verify_even)
            if self.config.even and not case.randomness.random and not self._resizable_dims():
                evens = [[Gather(d, even=True) for d in range(len(self.ops.shape(o)))] for o in self.trials[0].outputs]
                if all(evens):
                    accept(group, self._explore(group, evens))


class Accepted:
    """The strategies one search pass accepts, in order (``found``: (placements, combines)),
    with the shard counts and unevenness of their verification. Called with a group and
    the combines its exploration kept: verifies them, and records the strategy if they hold."""

    def __init__(self, verify: Callable[[Group, list], Verified | None], n_inputs: int,
                 untouchable: frozenset[int] = frozenset(), uncut: frozenset[tuple[int, int]] = frozenset()):
        self.verify, self.n_inputs, self.untouchable, self.uncut = verify, n_inputs, untouchable, uncut
        self.found: list[Strategy] = []
        self.counts: set[int] = set()
        self.uneven = False

    def __call__(self, group: Group, combines) -> bool:
        if combines is None or combines is UNINFORMATIVE:
            return False
        touched = ({i for i, _, _ in group.dims} | set(group.partial) | {f[0] for f in group.follow}
                   | {i for i, _ in group.offset})
        if touched & self.untouchable:  # inputs whose values size an output (OpCase.value_sized)
            return False
        if ({(i, d) for i, d, _ in group.dims} | {(f[0], f[1]) for f in group.follow}) & self.uncut:
            return False  # positions two shards could both write (OpCase.uncut_dims)
        placements = group.placements(self.n_inputs)
        if any(placements == p for p, _ in self.found):
            # held already (a neighbour's Partial rule, met again where Partial inputs are
            # tried with nothing cut): a rule file places the inputs one way once
            return True
        verified = self.verify(group, combines)
        if verified is None:
            return False
        self.found.append((placements, verified.combines))
        self.counts.update(verified.counts)
        self.uneven |= verified.uneven
        return True

    def search(self, status: str) -> Search:
        return Search(tuple(self.found), frozenset(self.counts), self.uneven, status)


def explore_case(case: OpCase, ops: TensorOps, seed: int = 0, config: ExploreConfig = ExploreConfig()) -> RuleEntry:
    """Explore and verify one example call. Op errors become a 'failed' entry, never an exception.
    numpy's floating-point warnings are off throughout: the search draws, splits and compares
    values out of an op's range on purpose (infinities, NaN), and a warning from its own
    arithmetic would reach the caller naming no op."""
    try:
        with np.errstate(all="ignore"):
            context = Context.of(case, ops, config, seed)
            base = draw_baseline(context)
            found = None if isinstance(base, Verdict) else Explorer(context, base.trials).search(_ranks(ops, case))
            return entry_of(context, base, found)
    except Exception as e:  # a bug in a sample or a wrapper must not stop a sweep
        return failed_entry(case, ops, "explorer: " + error_text(e))


def entry_of(context: Context, base: Baseline | Verdict, found: Found | None) -> RuleEntry:
    """The entry stage: the call's entry from the baseline's verdict, or from what the
    search found on the baseline's trials."""
    case, ops = context.case, context.ops
    sig = signature(ops, case.arg_names, case.args, case.kwargs, case.sizes.exact_sizes)
    ranks = _ranks(ops, case)
    example = example_of(ops, case)

    def entry(status: str, reason: str, results, tables=None, verified=None, notes=(), independent=None) -> RuleEntry:
        if tables is None:
            tables = no_strategy(ranks)
        return RuleEntry(sig, status, tables.shard, tables.partial, tables.combine, example, verified, reason,
                         tuple(case.notes) + tuple(notes), results, independent, tables.offset, tables.more)

    if isinstance(base, Verdict):
        return entry(base.status, base.reason, base.results)
    if found is None or not found.strategies:
        return entry("replicate-only", case.value_sized or "no strategy holds", base.results)
    tables = tables_from_strategies(ranks, list(found.strategies))
    verification = Verification(found.trials, tuple(sorted(found.counts)), found.uneven)
    return entry(found.status, "", base.results, tables, verification, base.notes + found.notes, found.independent)


def _ranks(ops: TensorOps, case: OpCase) -> tuple[int, ...]:
    return tuple(len(ops.shape(x)) for x in pytree.leaves((case.args, case.kwargs), ops.is_tensor))


def holds_at_other_sizes(case: OpCase, ops: TensorOps, placements: Sequence[InputPlacement],
                         combines: Sequence[Combine], seed: int = 0) -> bool:
    """Does a rule also hold with every unpinned dim lengthened, as the explorer requires of
    the rules it keeps? (A rule that holds at the example's sizes only: a slice_scatter
    whose slice covers all of self, a convolution cutting a kernel that spans its input.)
    True where nothing can be lengthened or the op refuses it, as the explorer has it, and
    for a rule that replicates every input. Cut rules with a halo or a proportional cut
    are the explorer's own (``_amounts_on_other_sizes``) and raise ValueError."""
    group = group_of(placements)
    if group.follow or any(h for _, _, h in group.dims):
        raise ValueError("a rule with a halo or a proportional cut is checked at other sizes by the explorer alone")
    if not group.dims and not group.partial:
        return True
    context = Context.of(case, ops, ExploreConfig(), seed)
    runner = Trials(context)
    first = runner._trial(tuple(case.args), dict(case.kwargs))
    ex = Explorer(context, [first] + [runner._fresh_trial(k, first) for k in range(1, len(TRIAL_SPLITS) + 1)])
    outs = [OutputCombine.of([c]) for c in combines]
    held = ex._cuts_on_other_sizes(group, outs) if group.dims else ex._partials_on_other_sizes(group, outs)
    return held is not None


# The trials and cuts a stand-in's rules are checked on at the call's own sizes: its own
# values cut in two and in three (unequal where the sizes allow), fresh data skewed and in four.
AT_CALL_SPLITS = ((0, TRIAL_SPLITS[0]), (0, TRIAL_SPLITS[1]), (1, TRIAL_SPLITS[2]), (1, TRIAL_SPLITS[3]))


def holds_at_call(case: OpCase, ops: TensorOps, strategies: Sequence[Strategy], seed: int = 0) -> bool:
    """Do ``strategies`` ((input placements, output combines) pairs), verified on a stand-in
    of the call at smaller sizes, also hold at the call itself (``case``)? A refutation only,
    on AT_CALL_SPLITS: every output combine each strategy claims must rebuild the output on
    every one of them that tells shards apart (an even gather on the even ones)."""
    context = Context.of(case, ops, ExploreConfig(), seed)
    runner = Trials(context)
    first = runner._trial(tuple(case.args), dict(case.kwargs))
    trials = [first, runner._fresh_trial(1, first)]
    if any(len(outputs) != len(t.outputs) for _, outputs in strategies for t in trials):
        return False  # rules of another call (a split of the stand-in's rows into fewer pieces)
    explorer = Explorer(context, trials)
    for placements, outputs in strategies:
        group = group_of(placements)
        claimed = [list(o.options) for o in outputs]
        evenly = any(even_gather(c) for opts in claimed for c in opts)
        for k, split in AT_CALL_SPLITS:
            if group.dims:
                split = explorer._fitting(group, trials[k], split)
            if evenly and not explorer._is_even(group, split, trials[k]):
                continue
            held = explorer._valid_combines(group, trials[k], split, claimed)
            if held is None or held is not UNINFORMATIVE and any(set(h) != set(c) for h, c in zip(held, claimed)):
                return False
    return True


def failed_entry(case: OpCase, ops: TensorOps, reason: str) -> RuleEntry:
    """The entry of an example call that could not be explored: no strategy, and why."""
    sig = signature(ops, case.arg_names, case.args, case.kwargs, case.sizes.exact_sizes)
    none = no_strategy(_ranks(ops, case))
    return RuleEntry(sig, "failed", none.shard, none.partial, none.combine, example_of(ops, case), None, reason)


def explore_op(backend: Backend, op: str, config: ExploreConfig = ExploreConfig()) -> OpRecord:
    """All example calls of one op, as the record its registry file holds."""
    try:
        cases = list(backend.cases(op))
    except Skip as s:
        return OpRecord(op, backend.name, s.status, (), s.reason)
    except NoSample as e:
        return OpRecord(op, backend.name, "no-sample", (), str(e) or "no sample input")
    except Exception as e:
        return OpRecord(op, backend.name, "failed", (), "cases: " + error_text(e))
    if not cases:
        return OpRecord(op, backend.name, "no-sample", (), "no sample input")
    ops = backend.tensor_ops()
    entries: dict[str, RuleEntry] = {}
    for case in cases:
        if not case.randomness.deterministic:
            return OpRecord(op, backend.name, "nondeterministic", (), "the op is marked nondeterministic")
        if case.reserve and any(e.status in ("ok", "derived") for e in entries.values()):
            continue
        e = explore_case(case, ops, config=config)
        if case.reserve and entries and not cuts_a_dim(e):
            continue  # a spare sample is kept for a rule that cuts a dim, not for nothing or an empty output
        entries.setdefault(e.signature, e)
    record = make_record(op, backend.name, entries.values())
    if all(e.reason.startswith("nondeterministic") for e in record.entries):
        return OpRecord(op, backend.name, "nondeterministic", (), record.entries[0].reason)
    return record
