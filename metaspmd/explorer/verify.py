"""Exploring a group on the example and verifying what it found on the fresh trials, with
the checks random data alone cannot make: avg on equal shards, order picks on ties,
reduces on three shards, Partial inputs on special values and on parts that cancel."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .. import pytree
from ..combine import Split, holds
from ..spec import ArgReduce, Gather, Group, Identity, OutputCombine, Reduce
from ..tensor_ops import FLOAT
from .common import (
    AVG_UNTRIED, EXPLORE_SPLIT, FIRST_RESERVE_TRIAL, PARTIAL_SPREADS, RESERVE_TRIALS, SPECIAL_SPLITS, TRIAL_SPLITS,
    UNINFORMATIVE, Trial, even_counts, even_gather, halo_room, order_dependent, picks_by_order, reduces_values,
    sized_gather,
)


@dataclass(frozen=True)
class Verified:
    """What held of a group on the trials: per output, the combines that rebuild it; the
    shard counts tried; whether an uneven split was among them."""

    combines: tuple[OutputCombine, ...]
    counts: frozenset[int]
    uneven: bool


class Verifier:
    """Explores and verifies one group (a part of ``Explorer``)."""

    def _explore(self, group: Group, candidates: list[list] | None = None) -> list[list] | None:
        """The combines (of ``candidates``, if given: a derived rule's) that rebuild every
        output on the example: cut in two, or evenly when only a reduce(avg) could (the mean
        of an odd number of rows). Where the example's shards are all equal (a bool sample
        of all False, t of [-9, -9]), the first trial whose shards differ proposes instead;
        the verification still needs two such trials. Special-value trials propose last,
        held to the same standard (no equal shards): where random data leaves an op one
        value (ne of random integers and 1), only they show it."""
        ordered = ([t for t in self.trials if not t.special]
                   + [dataclasses.replace(t, special=False) for t in self.trials if t.special])
        explore_split = EXPLORE_SPLIT
        if candidates is not None and any(even_gather(c) for opts in candidates for c in opts):
            # the coarsest even cut of the inputs: the gathers it does not cut evenly fail
            counts = self._even_counts(group, [[] for _ in candidates])
            if not counts or not all(even_gather(c) for opts in candidates for c in opts):
                return None  # no even split to try it on; or mixed with rules claimed on any split
            explore_split = Split(counts[0])
        for trial in ordered:
            found = self._valid_combines(group, trial, explore_split, candidates)
            if found is AVG_UNTRIED:
                split = self._even_split(group)
                found = self._valid_combines(group, trial, split) if split else None
            if found is not UNINFORMATIVE:
                return None if found is AVG_UNTRIED else found
        return UNINFORMATIVE

    def _verify(self, group: Group, found: list[list]) -> Verified | None:
        """Re-check ``found`` on the fresh trials: what survives, or None where an output keeps nothing."""
        if any(even_gather(c) for opts in found for c in opts):
            return self._verify_even(group, found)
        alive = [list(opts) for opts in found]
        avg_checks = 1 if self._is_even(group, EXPLORE_SPLIT) else 0
        counts, uneven, informative = set(), False, 0
        # a proportional cut is new ground, and its windows at shard boundaries are few: every
        # trial on every split (a bool window op held on one split in five)
        randoms = [t for t in self.trials[1:] if not t.special]
        pairs = (itertools.product(randoms, TRIAL_SPLITS) if group.follow
                 else zip(randoms, itertools.cycle(TRIAL_SPLITS)))
        # Special values are few and placed at random: whether a shard misses the one that
        # decides (isin's planted element, unique_dim_consecutive's tie) depends on the split,
        # so every special trial runs on every split. Beside Partial(sum) inputs on two shards
        # only: the parts r and -r of a zero (the all-zero patterns) cancel exactly through a
        # linear op, where more parts round at their own size, which a zero cannot excuse.
        splits = SPECIAL_SPLITS if group.partial and group.partial_op == "sum" else TRIAL_SPLITS
        pairs = itertools.chain(pairs, itertools.product([t for t in self.trials[1:] if t.special], splits))

        def reserve():
            # a tiny sample (two bools) leaves most trials' shards equal: where one differed,
            # draw more until a second does (where none did, the data cannot tell its shards
            # apart, a broadcast dim, and more of it would not either)
            if informative == 1:
                for trial, split in zip(self._reserve_trials(), itertools.cycle(TRIAL_SPLITS)):
                    yield trial, split
                    if informative >= 2:
                        return

        for trial, split in itertools.chain(pairs, reserve()):
            if group.dims:
                split = self._fitting(group, trial, split)
            ok = self._valid_combines(group, trial, split, alive)
            if ok is UNINFORMATIVE:  # a degenerate sample (all ones): the other trials decide
                continue
            if ok is None:
                return None
            even = self._is_even(group, split, trial)
            alive = [[c for c in opts if c in kept and (even or c != Reduce("avg"))] + ([Reduce("avg")] if not even and Reduce("avg") in kept else [])
                     for opts, kept in zip(alive, ok)]
            if self._halo_sees_all(group, trial, split):
                continue  # refutes what fails on it, but proves nothing by passing
            informative += 1
            if even:
                avg_checks += 1
            counts.add(split.n)
            uneven |= not even
        if informative < min(2, len(self.trials) - 1):  # at least two trials with distinct shards
            return None
        if any(h for _, _, h in group.dims) and max(counts, default=0) < 3:
            return None  # an input halo on two shards: a broadcast dim passes as one (see below)
        if any(extend for _, _, _, extend, _ in group.follow) and max(counts, default=0) < 3:
            return None  # an extended cut overlaps its neighbour: as a halo, three shards
        if group.dims and not any(h for _, _, h in group.dims):
            alive = self._on_narrow_shards(group, alive)
            if not all(alive):
                return None
        if group.dims and any(Reduce("avg") in opts for opts in alive):
            alive, avg_checks = self._check_avg_evenly(group, alive, avg_checks, counts)
        if group.dims and any(picks_by_order(c) for opts in alive for c in opts):
            alive = self._refute_on_ties(group, alive)
        if self._two_long(group) and any(reduces_values(c) for opts in alive for c in opts):  # only 2 shards fit
            proven = self._reduces_on_three_shards(group, alive)
            alive = [[c for c in opts if not reduces_values(c) or c in p] for opts, p in zip(alive, proven)]
        if group.partial and any(Identity() in opts for opts in alive):
            alive = self._whole_on_special_values(group, alive)
        if group.partial:
            alive = self._where_parts_cancel(group, alive)
        result = []
        for opts in alive:
            if avg_checks < 2:
                opts = [c for c in opts if c != Reduce("avg")]
            if max(counts, default=0) < 3:
                # halo gathers checked on two shards only (a dim of 2): an input broadcast
                # against a cut one computes every row on each shard, and a halo of 1 picks the
                # right one from each side; a third shard would have nothing of its own left.
                # Shard order (reversed gathers, scans) needs a middle shard as well.
                opts = [c for c in opts if not (isinstance(c, Gather) and (c.halo or c.halo_end or c.overlap))
                        and not order_dependent(c)]
            # a reversed gather or a scan that holds beside the plain gather of its dim is an
            # artifact of data that does not vary along it (zeros, a broadcast row)
            plain_dims = {c.dim for c in opts if isinstance(c, Gather) and c.plain}
            opts = [c for c in opts if not (order_dependent(c) and c.dim in plain_dims)]
            # overlapping zeros (a zero padding) add up as well as they drop: the halo stays
            dropped = {c.dim for c in opts if isinstance(c, Gather) and not c.overlap}
            opts = [c for c in opts if not (isinstance(c, Gather) and c.overlap and c.dim in dropped)]
            if Identity() in opts:  # max/min (and avg) of identical shards are implied by identity;
                # a sum, product or norm of them beside it held only on values the data happened
                # to hold (all zero; 0 and 1: embedding_bag's offset2bag of two bags), not on the op
                opts = [c for c in opts if not isinstance(c, Reduce) or c == Reduce("avg")]
            if any(isinstance(c, (Identity, Reduce)) for c in opts):  # positions that need no values:
                opts = [c for c in opts if not isinstance(c, ArgReduce)]  # a plain collective says it
            if Reduce("sum") in opts:  # the 2-norm equals the sum only where no two shards
                opts = [c for c in opts if c != Reduce("norm2")]  # overlap: the data never told them apart
            if {Reduce("sum"), Reduce("max"), Identity()} & set(opts):  # xor too (where no two shards
                opts = [c for c in opts if c != Reduce("xor")]  # overlap, or zeros): the common one stays
            if not opts:
                return None
            result.append(OutputCombine.of(opts))
        if any(h for _, _, h in group.dims) or any(sized_gather(c) for o in result for c in o.options):
            result = self._amounts_on_other_sizes(group, result)
            if result is None:
                return None
        if group.partial and not group.dims and not group.follow:
            result = self._partials_on_other_sizes(group, result)
            if result is None:
                return None
        if group.dims and not any(h for _, _, h in group.dims):
            result = self._cuts_on_other_sizes(group, result)
            if result is None:
                return None
        if group.dims:
            result = self._cuts_far_away(group, result)
            if result is None:
                return None
        empty = self._empty_throughout()
        if empty:
            result = self._empty_outputs_on_other_sizes(group, result, empty)
            if result is None:
                return None
        return Verified(tuple(result), frozenset(counts), uneven)

    def _even_counts(self, group: Group, candidates: list[list]) -> list[int]:
        """The shard counts that cut every dim of an even rule evenly: the group's input dims
        and the dims its even gathers concatenate (``even_counts``)."""
        first = self.trials[0]
        sizes = [self.ops.shape(first.leaves[i])[d] for i, d, _ in group.dims]
        sizes += [self.ops.shape(first.outputs[j])[c.dim] for j, opts in enumerate(candidates) for c in opts
                  if even_gather(c) and j < len(first.outputs) and c.dim < len(self.ops.shape(first.outputs[j]))]
        return even_counts(sizes) if group.dims else []

    def _verify_even(self, group: Group, found: list[list]) -> Verified | None:
        """Even gathers (``Gather.even``) re-checked on even splits only: every shard count
        that divides each cut dim (``_even_counts``: 2 and 4 where they do, and the finest
        cut), each on a fresh trial, then the special-value trials; two trials whose shards
        differ at least. The rule is claimed for those counts alone, so it is kept only where
        the signature pins every size (a reshape's): a rule whose evenness other sizes
        decide (a group norm of 4 groups cut by 8) would pass on counts that happen to fit.
        An uneven split is never tried: the rule claims nothing there (a reshape's shard of
        a split dim does not even run). A view's derived rule is shape arithmetic, and its
        cut and split dims are sizes its signature spells out (``unflatten``'s ``sizes``),
        so it stands wherever the call's other dims are."""
        derived = self.case.candidates is not None and self.case.candidates_derived
        # Partial only where no output reads the input (view_as's other, in a joint of parts)
        unread = not group.partial or set(group.partial) <= set(self._unread_inputs())
        if ((self._resizable_dims() and not derived) or not group.dims or not unread or group.follow or group.local
                or any(h for _, _, h in group.dims)):
            return None
        alive = [[c for c in opts if even_gather(c)] for opts in found]
        counts = self._even_counts(group, alive)
        randoms = [t for t in self.trials[1:] if not t.special]
        if not counts or not randoms or not all(alive):
            return None
        for k, n in enumerate(counts):  # each count the rule is claimed for, on its own trials
            seen, need = 0, 2 if k == 0 else 1  # several trials whose shards differ in all
            for trial in randoms[k % len(randoms):] + randoms[:k % len(randoms)]:
                ok = self._valid_combines(group, trial, Split(n), alive)
                if ok is UNINFORMATIVE:
                    continue
                if ok is None:
                    return None
                alive = [[c for c in opts if c in kept] for opts, kept in zip(alive, ok)]
                if not all(alive):
                    return None
                seen += 1
                if seen == need:
                    break
            if seen < need:
                return None
        for trial in (t for t in self.trials[1:] if t.special):  # may refute, on the coarsest cut
            ok = self._valid_combines(group, trial, Split(counts[0]), alive)
            if ok is None:
                return None
            if ok is not UNINFORMATIVE:
                alive = [[c for c in opts if c in kept] for opts, kept in zip(alive, ok)]
                if not all(alive):
                    return None
        tried = set(counts)
        return Verified(tuple(OutputCombine.of(opts) for opts in alive), frozenset(tried), False)

    def _reserve_trials(self) -> Iterator[Trial]:
        """Up to ``RESERVE_TRIALS`` more fresh trials, drawn when first needed and kept for
        the other groups; fewer where the op rejects fresh inputs."""
        reserve = self.memo.reserve
        for n in range(RESERVE_TRIALS):
            if n == len(reserve):
                try:
                    reserve.append(self._fresh_trial(FIRST_RESERVE_TRIAL + n, self.trials[0]))
                except Exception:
                    return
            yield reserve[n]

    def _check_avg_evenly(self, group: Group, alive: list[list], avg_checks: int, counts: set[int]):
        """reduce(avg) holds on equal shards only, and no trial split is even on a dim of odd
        size (mse_loss's mean over 5 rows): check the survivors again on the trials' data cut
        into equal shards, as many as the dim's smallest divisor. Two random trials prove it,
        and every special-value trial may refute it (nanmean's shards with unequal NaN
        counts). Where that cannot run, avg stays unchecked and is dropped; the other
        combines keep their verdict."""
        split = self._even_split(group)
        for trial in self.trials[1:]:
            proven = avg_checks >= 2
            if split is None or (proven and not trial.special):
                continue
            ok = self._valid_combines(group, trial, split, alive)
            if ok is UNINFORMATIVE:
                continue
            if proven:  # refutes avg alone (the other combines had their verdict)
                if ok is None and self._locals(group, trial, split) is None:
                    continue  # the op refuses these values cut so: no verdict
                held = ok or [()] * len(alive)
                alive = [[c for c in opts if c != Reduce("avg") or c in kept] for opts, kept in zip(alive, held)]
                continue
            if ok is None:
                break
            alive = [[c for c in opts if c in kept] for opts, kept in zip(alive, ok)]
            avg_checks += 1
            counts.add(split.n)
        return alive, avg_checks

    def _on_narrow_shards(self, group: Group, alive: list[list]) -> list[list]:
        """``alive`` less the combines that fail where shards are one element wide:
        ``torch.chunk`` (DTensor's split) leaves such a last shard (7 over 4: 2, 2, 2, 1), and
        an op may treat a length of one apart (an ``align_corners`` interpolation scales a lone
        column by 0/0). One fresh trial cut into a long shard and one-wide ones; a split the op
        refuses gives no verdict (it fails loudly there, not wrongly); reduce(avg) is left to
        the checks on equal shards."""
        for trial in [t for t in self.trials[1:] if not t.special][:1]:
            size = min(self.ops.shape(trial.leaves[i])[d] for i, d, _ in group.dims)
            split = Split(3, narrow=True) if size >= 4 else Split(2, narrow=True)
            if split.bounds(size) is None:
                continue
            locs = self._locals(group, trial, split)
            if locs is None or locs is UNINFORMATIVE:
                continue
            ok = self._valid_combines(group, trial, split, alive, locs)
            if ok is UNINFORMATIVE:
                continue
            kept = ok if ok is not None else [[] for _ in alive]
            alive = [[c for c in opts if c in k or c == Reduce("avg")] for opts, k in zip(alive, kept)]
        return alive

    def _with_leaves(self, base: Trial, leaves: list) -> Trial | None:
        """``base``'s call with its tensors replaced by ``leaves``, run as a trial of its
        index; None where the op refuses them (no verdict)."""
        args, kwargs = pytree.replace((base.args, dict(base.kwargs)), self.ops.is_tensor, leaves)
        try:
            return self._trial(tuple(args), dict(kwargs), index=base.index)
        except Exception:
            return None

    def _refute_on_ties(self, group: Group, alive: list[list]) -> list[list]:
        """``alive`` less the combines that pick by order (max, min, argmax, argmin) and fail
        where values repeat: random floats never do, so the mode of a row is its min and its
        position argmin's. Two fresh trials again, their float inputs rounded to integers; a
        trial the op refuses gives no verdict, one no combine of some output survives drops
        every order pick (the others keep the verdict of the trials before)."""
        ops = self.ops
        bases = [t for t in self.trials[1:] if not t.special][:2]
        for base, split in zip(bases, (Split(3), Split(2, skew=True))):
            leaves = [ops.from_numpy(np.round(ops.to_numpy(x)), x)
                      if ops.dtype_kind(x) == FLOAT and self.leaf_names[i] not in self.fixed else x
                      for i, x in enumerate(base.leaves)]
            tied = self._with_leaves(base, leaves)
            if tied is None:
                continue
            size = ops.shape(tied.leaves[group.dims[0][0]])[group.dims[0][1]]
            ok = self._valid_combines(group, tied, split if split.bounds(size) else Split(2), alive)
            if ok is UNINFORMATIVE:
                continue
            kept = ok if ok is not None else [[] for _ in alive]
            alive = [[c for c in opts if not picks_by_order(c) or c in k] for opts, k in zip(alive, kept)]
        if bases and any(picks_by_order(c) for opts in alive for c in opts):
            alive = self._refute_on_repeated_shards(group, bases[0], alive)
        if bases and any(isinstance(c, ArgReduce) for opts in alive for c in opts):
            alive = self._refute_on_nans_in_two_shards(group, bases[0], alive)
        if bases and any(isinstance(c, ArgReduce) for opts in alive for c in opts):
            alive = self._refute_on_signed_zeros(group, bases[0], alive)
        return alive

    def _refute_on_signed_zeros(self, group: Group, base: Trial, alive: list[list]) -> list[list]:
        """``alive`` less the argreduce combines that fail where the extreme of a line is a
        zero of each sign on two shards: argreduce compares as IEEE does (-0.0 == +0.0, the
        lowest shard wins), and so do argmax and max.dim, but jax's ``top_k`` orders floats
        totally, +0.0 above -0.0, and picks the later shard's. ``base`` again with every
        float cut input's magnitudes moved past 1, every element negative and each line's
        first element on each of two shards -0.0 and +0.0; then positive, +0.0 before -0.0."""
        ops = self.ops
        cut = {i: d for i, d, _ in group.dims}
        size = ops.shape(base.leaves[group.dims[0][0]])[group.dims[0][1]]
        bounds = Split(2).bounds(size)
        if bounds is None or not any(ops.dtype_kind(base.leaves[i]) == FLOAT for i in cut):
            return alive
        second = bounds[1][0]

        def zeros(x: Any, d: int, sign: float) -> Any:
            a = np.array(ops.to_numpy(x), dtype=np.float64)
            a = sign * (1 + np.abs(a))
            lines = np.moveaxis(a, d, 0)
            lines[0], lines[second] = math.copysign(0.0, sign), math.copysign(0.0, -sign)
            return ops.from_numpy(a, x)

        for sign in (-1.0, 1.0):
            leaves = [zeros(x, cut[i], sign) if i in cut and ops.dtype_kind(x) == FLOAT and ops.shape(x)[cut[i]] == size
                      else x for i, x in enumerate(base.leaves)]
            trial = self._with_leaves(base, leaves)
            if trial is None:
                continue
            ok = self._valid_combines(group, trial, Split(2), alive)
            if ok is UNINFORMATIVE:
                continue
            kept = ok if ok is not None else [[] for _ in alive]
            alive = [[c for c in opts if not isinstance(c, ArgReduce) or c in k] for opts, k in zip(alive, kept)]
        return alive

    def _refute_on_nans_in_two_shards(self, group: Group, base: Trial, alive: list[list]) -> list[list]:
        """``alive`` less the argreduce combines that fail where NaNs meet other NaNs or
        numbers across shards: argreduce keeps a line's first NaN (max.dim's kernel does),
        adaptive max pooling's kernel the last, and a NaN-skipping argmax none, and random or
        special data put NaNs in two shards of one line by chance only. ``base`` again with
        every float cut input NaN at each even position along its cut dim (split in two and
        in three), and NaN all along its first half (split in two: one shard all NaN)."""
        ops = self.ops
        cut = {i: d for i, d, _ in group.dims}
        if not any(ops.dtype_kind(base.leaves[i]) == FLOAT for i in cut):
            return alive

        def nans(x: Any, d: int, where: slice) -> Any:
            a = np.array(ops.to_numpy(x), dtype=np.float64)
            np.moveaxis(a, d, 0)[where] = np.nan
            return ops.from_numpy(a, x)

        size = ops.shape(base.leaves[group.dims[0][0]])[group.dims[0][1]]
        for where, splits in ((slice(None, None, 2), (Split(2), Split(3))), (slice(0, -(-size // 2)), (Split(2),))):
            leaves = [nans(x, cut[i], where) if i in cut and ops.dtype_kind(x) == FLOAT else x
                      for i, x in enumerate(base.leaves)]
            trial = self._with_leaves(base, leaves)
            if trial is None:
                continue
            for split in splits:
                if not split.bounds(size):
                    continue
                ok = self._valid_combines(group, trial, split, alive)
                if ok is UNINFORMATIVE:
                    continue
                kept = ok if ok is not None else [[] for _ in alive]
                alive = [[c for c in opts if not isinstance(c, ArgReduce) or c in k] for opts, k in zip(alive, kept)]
        return alive

    def _refute_on_repeated_shards(self, group: Group, base: Trial, alive: list[list]) -> list[list]:
        """``alive`` less the order picks that fail where the second of two shards repeats
        the first one's values: ties between shards, which rounding leaves to chance. A
        histogram's counts of points spread over many bins pass ``reduce(max)`` wherever
        no bin takes points of two shards (``histc`` of 5 points in 100 bins), and
        repeated shards put the points of one into the bins of the other."""
        ops = self.ops
        cut = {i: d for i, d, _ in group.dims}

        def repeated(x: Any, d: int) -> Any:  # the second shard: the first's values but its own last
            size = ops.shape(x)[d]
            half = -(-size // 2)
            rest = size - half  # equal shards would prove nothing
            if rest < 2:
                return x
            return ops.concat([ops.narrow(x, d, 0, half), ops.narrow(x, d, 0, rest - 1), ops.narrow(x, d, size - 1, 1)], d)

        leaves = [repeated(x, cut[i]) if i in cut and ops.shape(x)[cut[i]] >= 2 else x for i, x in enumerate(base.leaves)]
        tied = self._with_leaves(base, leaves)
        if tied is None:
            return alive  # the op refuses repeated values (a sorted sequence's): no verdict
        ok = self._valid_combines(group, tied, Split(2), alive)
        if ok is UNINFORMATIVE:
            return alive
        kept = ok if ok is not None else [[] for _ in alive]
        return [[c for c in opts if not picks_by_order(c) or c in k] for opts, k in zip(alive, kept)]

    def _reduces_on_three_shards(self, group: Group, alive: list[list]) -> list[set]:
        """Per output, the reduces of ``alive`` that also hold with the cut dims lengthened
        to three elements by random data and cut in three. On a dim of two each shard holds
        one element, and a reduce of those tells few functions of a pair apart: every order
        statistic is the min or the max (the lower median of a pair is its min, at argmin's
        position), and the mean of a pair is its median (quantile's reduce(avg)). The
        lengthened call has the same signature, and its evidence is added to, never put in
        for, the sample's. Only a sum stands where no such trial can speak: the op refuses
        the lengthened inputs, or indices cut with the data were lengthened by copies of
        their own values, which a kernel may not take twice (max_unpool's positions)."""
        sums = [{c for c in opts if c == Reduce("sum")} for opts in alive]
        trials = self._lengthened_trials(group, extra_evidence=True)
        if trials is None or trials is self.trials:
            return sums
        first = self.trials[0]
        copied = any(self.leaf_names[i] in self.fixed for i, _, _ in group.dims)  # every cut dim is 2 long
        proven, informative = [set(opts) for opts in alive], 0
        for trial in trials[1:]:
            ok = self._valid_combines(group, trial, Split(3), alive)
            if ok is UNINFORMATIVE:
                continue
            if ok is None:
                return sums
            proven = [p & set(k) for p, k in zip(proven, ok)]
            informative += 1
        if informative < 2:
            return sums
        held = sorted({str(c) for p in proven for c in p if reduces_values(c)})
        if held:
            self.widened[group.placements(len(first.leaves))] = [
                f"{' and '.join(held)} along {self.leaf_names[i]} dim {d}: verified on three shards too, with that dim "
                f"lengthened from 2 to {halo_room(0)} by {'copies' if self.leaf_names[i] in self.fixed else 'random data'}"
                for i, d, _ in group.dims]
        return [p | s for p, s in zip(proven, sums)] if copied else proven

    def _specials(self) -> list[Trial]:
        """The special-value trials: the baseline's where it drew them, else drawn once
        (``Memo.refuters``; the same seeds, so the same trials)."""
        if self.memo.refuters is None:
            self.memo.refuters = self.special_trials or (
                (self._special_trials() or []) if self.case.specials.special is not None else [])
        return self.memo.refuters

    def _whole_on_special_values(self, group: Group, alive: list[list]) -> list[list]:
        """``alive`` less the identity combines a special-value trial refutes. A Partial input
        that leaves an output whole on random data can still matter on values random data
        never hits: heaviside's values are read only where self is 0, hinge_embedding_loss's
        target only where it is exactly ±1 (``_constant_readers``)."""
        first = self.trials[0]
        read = set().union(*(self._constant_readers(i, first) for i in group.partial)) if group.partial else set()
        alive = [[c for c in opts if c != Identity() or j not in read] for j, opts in enumerate(alive)]
        for trial, split in zip(self._specials(), itertools.cycle(TRIAL_SPLITS)):
            locs = self._locals(group, trial, split)
            if locs is None or locs is UNINFORMATIVE:
                continue  # the op rejects these inputs split this way: no verdict
            alive = [[c for c in opts if c != Identity() or holds(self.ops, c, [loc[j] for loc in locs], trial.outputs[j])]
                     for j, opts in enumerate(alive)]
        return alive

    def _where_parts_cancel(self, group: Group, alive: list[list]) -> list[list]:
        """``alive`` less the combines that fail where the Partial inputs are zero and their
        two parts, r and -r, are not: random parts never cancel, and op(r) + op(-r) == op(0)
        is where linearity shows (unique_consecutive of distinct values is the identity until
        two of them meet; xlogy(0, y) is 0 whatever log(y) is; nextafter moves each part by
        its own ulp). Two parts cancel exactly, so a linear op's local outputs do too."""
        for base in [t for t in self.trials[1:] if not t.special][: len(PARTIAL_SPREADS)]:  # each spread once
            # a product's parts r and 1/r cancel where the input is one
            one = 1 if group.partial_op == "prod" else 0
            leaves = [self.ops.add_scalar(self.ops.zeros_like(x), one) if i in group.partial else x
                      for i, x in enumerate(base.leaves)]
            zero = self._with_leaves(base, leaves)
            if zero is None:
                continue  # the op refuses zeros: no verdict
            locs = self._locals(group, zero, Split(2))
            if locs is None or locs is UNINFORMATIVE:
                continue
            alive = [[c for c in opts if holds(self.ops, c, [loc[j] for loc in locs], zero.outputs[j])]
                     for j, opts in enumerate(alive)]
        return alive
