"""The explorer of one example call (``Explorer.run``: trials, search, entry) and the
public entry points: ``explore_case``, ``explore_op``, ``holds_at_other_sizes``."""

from __future__ import annotations

from typing import Sequence

from .. import pytree
from ..case import Backend, NoSample, OpCase, Skip
from ..rules import OpRecord, RuleEntry, TensorArg, Verification, make_record
from ..signature import signature
from ..spec import Combine, Group, InputPlacement, OutputCombine, Replicate, tables_from_strategies
from ..tensor_ops import TensorOps
from .common import (
    EXPLORE_SPLIT, NO_TENSOR_INPUT, TRIAL_SPLITS, UNINFORMATIVE, ExploreConfig, Trial, cuts_a_dim, error_text,
    example_of, example_value, fit_partial, group_of, halo_gathers_only, no_strategy,
)
from .groups import Groups
from .independence import IndependentParts
from .shards import Shards
from .sizes import OtherSizes
from .trials import Trials
from .verify import Verifier
from .widening import Widening


class Explorer(Trials, Groups, Shards, Verifier, OtherSizes, Widening, IndependentParts):
    """Explores and verifies one example call. Each base class is one part of the work, on
    the state set here and in ``run``: ``trials`` (the example first, then the fresh,
    blind and special-value ones), ``leaf_names``, ``fixed`` and ``widened``."""

    def __init__(self, case: OpCase, ops: TensorOps, config: ExploreConfig, seed: int):
        self.case, self.ops, self.config, self.seed = case, ops, config, seed
        self.leaf_names = self._leaf_names()
        # Integer and bool arguments stay fixed (indices, offsets) so that blind refills keep
        # them in range, unless they are all the op has (bitwise_and_ on bools): then they
        # are the data, and fixing them all would leave nothing to vary.
        self.fixed = case.fixed if set(self.leaf_names) - case.fixed else frozenset()
        self._refuters: list[Trial] | None = None  # special-value trials, drawn when first needed
        self._reserve: list[Trial] = []  # more fresh trials, drawn when first needed
        # resized trials and the amounts taken, by (ids of the trials, amounts asked); the
        # trials are held, so ids stay theirs
        self._resized: dict[tuple, tuple[list[Trial], list[Trial] | None, dict]] = {}
        self._reproduced: dict[int, bool] = {}  # by id of a resized trial (held in _resized)
        self.shared: set[int] = set()  # inputs every independent part reads (_independent_parts)
        self._unread: list[int] | None = None  # inputs no output reads (_unread_inputs), found once

    def run(self) -> RuleEntry:
        case, ops = self.case, self.ops
        sig = signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes)
        example = example_of(ops, case)
        ranks = tuple(len(ops.shape(x)) for x in pytree.leaves((case.args, case.kwargs), ops.is_tensor))

        results: tuple[TensorArg, ...] = ()

        def entry(status: str, reason: str = "", tables=None, verified=None, notes=(), independent=None) -> RuleEntry:
            if tables is None:
                tables = no_strategy(ranks)
            return RuleEntry(sig, status, tables.shard, tables.partial, tables.combine, example, verified, reason,
                             tuple(case.notes) + tuple(notes), results, independent, tables.offset, tables.more)

        try:
            first = self._trial(tuple(case.args), dict(case.kwargs))
            again = self._trial(tuple(case.args), dict(case.kwargs))
        except Exception as e:
            return entry("failed", error_text(e))
        # an output close() cannot compare (a sparse tensor) makes no op nondeterministic
        opaque = next(((j, what) for j, x in enumerate(first.outputs) if (what := ops.opaque(x))), None)
        if opaque is None and (len(first.outputs) != len(again.outputs)
                               or not all(ops.close(a, b) for a, b in zip(again.outputs, first.outputs))):
            return entry("failed", "nondeterministic: two identical calls differ")
        results = tuple(example_value(ops, x) for x in first.outputs)
        if opaque is not None:
            return entry("replicate-only", f"output {opaque[0]} is {opaque[1]}, which no combine compares")
        if not first.outputs:
            return entry("replicate-only", "no tensor output")
        if not ranks:
            return entry("derived", NO_TENSOR_INPUT)
        self.trials = [first]
        try:
            for k in range(1, len(TRIAL_SPLITS) + 1):
                self.trials.append(self._fresh_trial(k))
        except Exception as e:
            return entry("failed", "fresh inputs: " + error_text(e))
        notes_extra: list[str] = []
        self.widened: dict[tuple, list[str]] = {}  # placements verified on lengthened dims: notes
        constant = self._constant_outputs()
        blind = bool(constant or self._empty_outputs() or self._integer_data() or self._constant_inputs()
                     or self._flat_along_a_dim())
        if blind:
            # The sample's data leaves an output constant or empty (nonzero of all zeros), or
            # is integers from a narrow range, whose ties let argmin's local indices pass for
            # the global one, or repeats an input on every trial (scatter_add's zero self,
            # under which a replicated self passes for a Partial one), or is the same along a
            # dim (an expanded sample, whose shards there are equal): blind data joins in
            # where the op takes it.
            self.trials = self.trials + self._blind_trials()
            constant = self._constant_outputs()
        # A whole-tensor predicate (equal, allclose) also gets them where it varies: the
        # sample's data is alike on every shard (allclose's other is self plus the same
        # small noise everywhere), and identity is refuted only where shards disagree. So
        # does an op that blind data leaves one value throughout (ne of random integers and
        # 1: all True), where the sample may be no better (all zero): special values plant the 1.
        wanted = constant or self._whole_tensor_predicates() or case.special_always or self._one_valued_blind()
        special = self._special_trials() if wanted and case.special is not None else None
        if special is not None:
            # Verified on the random trials and the special-value ones alike: an output
            # that is constant on random data (aminmax's min of many integers) still refutes
            # combines there once its shards differ.
            self.trials = self.trials + special
            # Constant under random and every special-value pattern alike (all zero, all
            # NaN, lone nonzero, ...): the output depends on shapes and non-tensor arguments
            # only (full_like, fill), so every combine that rebuilds it from local outputs
            # holds for any data.
            still = self._constant_outputs()
            if still:  # or constant because an index never varied (index_fill's covers every column)
                self.trials = self.trials + self._resampled_index_trials()
                still = self._constant_outputs()
            if still:
                which = ", ".join(map(str, still))
                notes_extra.append(f"output {which} constant under random and special-value inputs: shape-determined")
            constant = []
        if constant:
            j = constant[0]  # NaN throughout: the op fails on these inputs rather than ignoring them
            why = "is NaN or infinite on every trial" if ops.one_nonfinite_value(first.outputs[j]) else "does not vary with the inputs"
            return entry("replicate-only", f"output {j} {why}: combines cannot be verified")
        if not blind and self._one_signed_inputs():
            # Positive sample data (max_unpool2d's pooled values) lets a max of zero-padded
            # local outputs pass for the scatter: signed blind data refutes it. Added after
            # the special values are settled: they verify, and call in nothing.
            self.trials = self.trials + self._blind_trials()

        parts = self._independent_parts() if case.candidates is None else None
        found, counts, uneven, status = whole = self._search(ranks, None)
        independent = None
        if parts is not None:
            split = self._search(ranks, parts[0])
            # the strategies that place a shared input come from the search across parts
            coupling = [s for s in whole[0] if any(not isinstance(s[0][i], Replicate) for i in self.shared)]
            spec = self._independent_spec(ranks, split[0] + coupling, whole[0], parts)
            if spec is not None:  # else coupled after all, or nothing to gain: the search across parts stands
                found, status = split[0] + coupling, split[3]
                counts, uneven = split[1] | whole[1], split[2] or whole[2]  # the coupling strategies' trials too
                independent = spec
        if not found:
            return entry("replicate-only", "no strategy holds")
        if independent is None and self.config.partial and case.candidates is None:
            found = found + self._beside_unread(found)  # independent parts give these as joints
        tables = tables_from_strategies(ranks, found)
        verification = Verification(len(self.trials) - 1 + len(self._reserve), tuple(sorted(counts)), uneven)
        kept = {placements for placements, _ in found}
        notes_extra += list(dict.fromkeys(n for p, ns in self.widened.items() if p in kept for n in ns))
        return entry(status, "", tables, verification, tuple(notes_extra), independent)

    def _search(self, ranks: tuple[int, ...], parts: list[set[int]] | None) -> tuple[list, set[int], bool, str]:
        """Explore and verify every group, within each of ``parts`` (inputs of independent
        parts) if given: (found strategies, shard counts, uneven, status)."""
        case, ops, first = self.case, self.ops, self.trials[0]
        found, counts, uneven = [], set(), False

        def accept(group: Group, combines) -> bool:
            nonlocal uneven
            if combines is None or combines is UNINFORMATIVE:
                return False
            verified = self._verify(group, combines)
            if verified is None:
                return False
            outs, used, unev = verified
            found.append((group.placements(len(ranks)), outs))
            counts.update(used)
            uneven |= unev
            return True

        if case.candidates is not None:
            for placements, outs in case.candidates:
                group = group_of(placements)
                # beside a cut, a Partial input keeps only reduces and identity, unless no
                # output reads it (a joint of independent parts)
                unread = group.dims and group.partial and set(group.partial) <= set(self._unread_inputs())
                accept(group, self._explore(group, [list(o.options) if unread else fit_partial(group, o.options)
                                                    for o in outs]))
            status = "derived" if case.candidates_derived else "ok"
        else:
            shapes = [ops.shape(x) for x in first.leaves]
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
                if self.config.partial and not case.random and any(
                    accept(g, self._explore(g)) for g in self._partial_groups(group, parts)
                ):
                    continue
                if self.config.offset and case.bounds_checked and not case.random and any(
                    accept(g, self._explore(g)) for g in self._offset_groups(group)
                ):
                    continue
                # an op that clamps positions (a CLIP gather) reads a shard's edge for those
                # outside it, one that refuses them (torch's embedding) raises: clamped first
                # as the op would, then offset, its dropping form reads zero there
                if self.config.offset and case.dropping is not None and not case.random and any(
                    accept(g, self._explore(g)) for g in self._offset_groups(group, drop=True)
                ):
                    continue
                # a slice, split or pad of the cut dim: each shard takes its own part of the range
                if self.config.local and self._localizes(group) and accept(
                        Group(group.dims, local=True), self._explore(Group(group.dims, local=True))):
                    continue
                # where the sample showed nothing about the plain cut (its data the same along
                # the dim), the plain cut comes first on lengthened trials, then the halos
                if self.config.halo and self._search_halos(group, accept, len(ranks), plain=combines is UNINFORMATIVE):
                    continue
                # not beside index inputs: their positions address the dims a follower cuts
                # (max_pool2d_with_indices_backward's indices into self, which a kernel trusts)
                if self.config.follow and not case.random and not self.fixed and not any(h for _, _, h in group.dims):
                    follow = self._follow_groups(group, parts)
                    any(accept(g, self._explore(g)) for g in follow) or self._follow_lengthened(follow, accept, len(ranks))
            status = "ok"
        if self.config.partial and (not case.random or case.value_free):
            # Partial inputs with nothing sharded: linear ops (views included, whose derived
            # candidates only move shards) pass Partial through; fills ignore them.
            for p in self._partial_sets(set(), parts):
                g = Group((), p)
                accept(g, self._valid_combines(g, first, EXPLORE_SPLIT))
        return found, counts, uneven, status


def explore_case(case: OpCase, ops: TensorOps, seed: int = 0, config: ExploreConfig = ExploreConfig()) -> RuleEntry:
    """Explore and verify one example call. Op errors become a 'failed' entry, never an exception."""
    try:
        return Explorer(case, ops, config, seed).run()
    except Exception as e:  # a bug in a sample or a wrapper must not stop a sweep
        return failed_entry(case, ops, "explorer: " + error_text(e))


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
    ex = Explorer(case, ops, ExploreConfig(), seed)
    ex.trials = [ex._trial(tuple(case.args), dict(case.kwargs))]
    ex.trials += [ex._fresh_trial(k) for k in range(1, len(TRIAL_SPLITS) + 1)]
    outs = [OutputCombine.of([c]) for c in combines]
    held = ex._cuts_on_other_sizes(group, outs) if group.dims else ex._partials_on_other_sizes(group, outs)
    return held is not None


def failed_entry(case: OpCase, ops: TensorOps, reason: str) -> RuleEntry:
    """The entry of an example call that could not be explored: no strategy, and why."""
    sig = signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes)
    ranks = [len(ops.shape(x)) for x in pytree.leaves((case.args, case.kwargs), ops.is_tensor)]
    none = no_strategy(ranks)
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
        if not case.deterministic:
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
