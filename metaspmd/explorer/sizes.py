"""Rules at other sizes: a rule stands for every size its signature leaves open, so its
combines must also hold on trials with the unpinned dims lengthened (Partial rules, cut
rules, and block counts and halos read off sizes)."""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np

from ..signature import pinned_dims
from ..spec import Group, OutputCombine
from ..tensor_ops import FLOAT, INT
from .common import TRIAL_SPLITS, UNINFORMATIVE, Trial, sized_gather


# How much a cut dim is lengthened to check its rule far from the example's length, at most
# (``_cuts_far_away``): its own length up to this, plus one; more would cost a model's real
# sizes, met live, their memory and time.
FAR_ROOM = 16


class OtherSizes:
    """Checks rules on lengthened trials (a part of ``Explorer``)."""

    def _partials_on_other_sizes(self, group: Group, outs: list[OutputCombine]) -> list[OutputCombine] | None:
        """A Partial rule stands for every size its signature leaves open, but an op can be
        linear at the example's sizes only: a slice_scatter whose slice covers all of self
        ignores self there, an adaptive max pool to the input's own size is the identity.
        The combines must also hold on the trials with every unpinned dim lengthened
        (``_resized_trials``). Those judged are the ones whose outputs line up with the
        example's (split's output count follows a length) and that the op reproduces: a
        kernel that trusts shapes it does not check (a convolution backward, a pdist
        backward) reads past a lengthened input, and its garbage refutes nothing.
        None where an output keeps no combine."""
        dims = self._resizable_dims()
        return self._held_on(group, outs, (self._resized_trials(dims) or []) if dims else [])

    def _cuts_on_other_sizes(self, group: Group, outs: list[OutputCombine]) -> list[OutputCombine] | None:
        """A cut rule, too, stands for every size its signature leaves open, but can hold
        at the example's sizes only: a convolution cutting its input and kernel along a
        spatial dim sums its shards where the kernel spans the input (an unpinned input
        extent equal to the pinned kernel's), masked_scatter's cut rows line up where the
        source has self's width. The combines must also hold on the trials with every
        unpinned dim lengthened, the group's cut dims by one common amount (they are cut at
        the same bounds); where the op sizes one input by another unchecked
        (``Sizes.trusts_shapes``: backward kernels), dims of one length by one amount, so
        the call stays one the op is defined for. An index cut with the data (gather's,
        along a dim it does not gather) is lengthened with it by copies of its own
        positions, unless they are distinct along the cut (unpooling's: copies would write
        one place twice); its other dims keep their lengths. A trial the op refuses to run
        on the shards decides nothing here. None where an output keeps no combine."""
        first = self.trials[0]
        cut = {(i, d) for i, d, _ in group.dims}
        if any(self._may_index(i) and self._distinct_along(i, d) for i, d in cut):
            return outs  # copies would repeat positions the op takes once each (unpooling's)
        # an integer input that could index a dim keeps its length, except along the cut,
        # which it shares with the data: lengthened there by copies of its own positions
        dims = [(i, d) for i, d in self._resizable_dims() if not self._may_index(i) or (i, d) in cut]
        if not dims:
            return outs
        amounts = self._own_amounts(dims)
        if self.case.sizes.trusts_shapes:
            by_length: dict[int, int] = {}
            for i, d in dims:
                by_length.setdefault(self.ops.shape(first.leaves[i])[d], amounts[i, d])
            amounts = {(i, d): by_length[self.ops.shape(first.leaves[i])[d]] for i, d in dims}
        # from the amounts the op takes (every group of the op starts there, so most share
        # their trials), the cut dims tied to one amount
        trials, amounts = self._resized_and_taken(amounts)
        if trials is None:
            return outs
        tied = [(i, d) for i, d, _ in group.dims if (i, d) in amounts]
        amounts = amounts | {k: amounts[tied[0]] for k in tied[1:]}
        # two informative trials: every cut group pays for this, and a rule true at the
        # example's sizes only fails on the first trial that leaves them, unless that one
        # stays in the op's contract by chance (an appended element above a sorted sequence)
        return self._held_on(group, outs, self._resized_by(amounts) or [], skip_refused=True, enough=2)

    def _cuts_far_away(self, group: Group, outs: list[OutputCombine]) -> list[OutputCombine] | None:
        """A cut rule once more, with the cut dims alone lengthened past twice their length
        (by their length, up to ``FAR_ROOM``, plus one): a kernel that reads a length as a
        constant (rows below 12 kept, a read clamped at row 9) keeps a gather true at the
        example's 6 rows and at the 7 of ``_cuts_on_other_sizes``, not at 13; a QR's taus,
        min(rows, columns) long, gather along the rows only while rows are fewer. Its evidence
        is added to the other checks', never put in for theirs: where the op refuses such a
        call or its shards, or a cut input could index (its positions would need copies),
        nothing is judged. None where an output keeps no combine."""
        cut = [(i, d) for i, d, _ in group.dims]
        if not set(cut) <= set(self._resizable_dims()) or any(self._may_index(i) for i, _ in cut):
            return outs
        size = self.ops.shape(self.trials[0].leaves[cut[0][0]])[cut[0][1]]
        amounts = dict.fromkeys(cut, min(size, FAR_ROOM) + 1)
        trials, taken = self._resized_and_taken(amounts)
        if trials is None or taken != amounts:  # the op ties a cut dim to another: no far call of its own
            return outs
        return self._held_on(group, outs, trials, skip_refused=True, enough=2)

    def _amounts_on_other_sizes(self, group: Group, outs: list[OutputCombine]) -> list[OutputCombine] | None:
        """Block counts and halos are read off sizes, which the signature leaves out unless
        the case pins them (``Sizes.exact_sizes``): flatten's dims in front of the cut; cat's
        inputs, which must be of equal length; a convolution kernel's extent. A block, halo or
        overlap gather, and every combine of a group with an input halo, stays only where it
        also rebuilds the outputs with every unpinned input dim of 2 or more lengthened by
        fresh data (``_resized_trials``), and is dropped where the op refuses such inputs.
        None where an output keeps no combine."""
        dims = self._resizable_dims()
        if not dims:
            return outs  # every size is pinned: so is every amount read off them
        bound = (lambda c: True) if any(h for _, _, h in group.dims) else sized_gather
        alive, informative = [list(o.options) for o in outs], 0
        for trial, split in zip(self._resized_trials(dims) or (), itertools.cycle(TRIAL_SPLITS)):
            ok = self._valid_combines(group, trial, split, alive)
            if ok is UNINFORMATIVE:
                continue
            if ok is None:
                informative = 0
                break
            alive = [[c for c in opts if c in kept] for opts, kept in zip(alive, ok)]
            informative += not self._halo_sees_all(group, trial, split)
        kept = []
        for o, held in zip(outs, alive):
            opts = [c for c in o.options if not bound(c) or (informative >= 2 and c in held)]
            if not opts:
                return None
            kept.append(OutputCombine.of(opts))
        return kept

    def _empty_throughout(self) -> list[int]:
        """The outputs with no elements on every trial (``empty`` below)."""
        return [j for j in range(len(self.trials[0].outputs))
                if all(0 in self.ops.shape(t.outputs[j]) for t in self.trials)]

    def _empty_outputs_on_other_sizes(self, group: Group, outs: list[OutputCombine],
                                      empty: list[int]) -> list[OutputCombine] | None:
        """An output empty on every trial passes every combine, so a rule stands for it only
        where it stays empty at the other sizes of its signature, or holds there:
        ``linalg_lstsq``'s residuals are empty while the matrix has fewer rows than columns,
        and a gather of a cut right-hand side once it has more. The unpinned dims are
        lengthened so that the order of their lengths turns around (distinct lengths stay
        distinct, equal ones equal: 2 and 3 become 5 and 4); the trials where such an output
        then has elements judge the combines (``_held_on``), and none stands where it then
        has another rank. Where the op refuses them, or the output stays empty, the
        emptiness is taken to be the signature's."""
        dims = {(i, d): self.ops.shape(self.trials[0].leaves[i])[d]
                for i, d in self._resizable_dims() if not self._may_index(i)}
        lengths = sorted(set(dims.values()))
        if not lengths:
            return outs
        turned = {size: lengths[-1] + len(lengths) - k for k, size in enumerate(lengths)}
        amounts = {key: turned[size] - size for key, size in dims.items()}
        filled = [t for t in self._resized_by(amounts) or ()
                  if len(t.outputs) == len(outs) and any(0 not in self.ops.shape(t.outputs[j]) for j in empty)]
        ranks = [len(self.ops.shape(o)) for o in self.trials[0].outputs]
        if any([len(self.ops.shape(o)) for o in t.outputs] != ranks for t in filled):
            return None  # the output takes another rank there ([0] then [batch, k]): nothing was verified of it
        return self._held_on(group, outs, filled, skip_refused=True) if filled else outs

    def _held_on(self, group: Group, outs: list[OutputCombine], trials: list[Trial],
                 skip_refused: bool = False, enough: int | None = None) -> list[OutputCombine] | None:
        """``outs`` with the combines that fail on one of ``trials`` dropped. The trials
        judged are those whose outputs line up with the example's (split's output count
        follows a length) and that the op reproduces (``_reproduces``); ``skip_refused``:
        a trial the op refuses to run on the shards is passed over rather than fatal;
        ``enough``: judging stops after that many informative trials.
        None where an output keeps no combine."""
        alive = [list(o.options) for o in outs]
        ranks = [len(self.ops.shape(o)) for o in self.trials[0].outputs]
        informative = 0
        for trial, split in zip(trials, itertools.cycle(TRIAL_SPLITS)):
            if enough is not None and informative >= enough:
                break
            if [len(self.ops.shape(o)) for o in trial.outputs] != ranks or not self._reproduces(trial):
                continue
            if group.dims:
                split = self._fitting(group, trial, split)
            locs = self._locals(group, trial, split)
            if locs is None:  # the op refuses its shards (not run again by _valid_combines)
                if skip_refused:
                    continue
                return None
            ok = self._valid_combines(group, trial, split, alive, locs)
            if ok is None:
                return None
            if ok is not UNINFORMATIVE:
                alive = [[c for c in opts if c in kept] for opts, kept in zip(alive, ok)]
                informative += 1
        kept = [OutputCombine.of([c for c in o.options if c in held]) for o, held in zip(outs, alive)]
        return None if any(not k.options for k in kept) else kept

    def _reproduces(self, trial: Trial) -> bool:
        """Does the op give ``trial``'s outputs again on copies of its inputs? (Within the
        usual tolerance: a kernel's threads may sum in another order; garbage differs more.)"""
        if id(trial) not in self.memo.reproduced:
            try:
                outputs, _ = self._call([self.ops.clone(x) for x in trial.leaves], trial)
                same = len(outputs) == len(trial.outputs) and all(
                    self.ops.close(a, b) for a, b in zip(outputs, trial.outputs))
            except Exception:
                same = False
            self.memo.reproduced[id(trial)] = same
        return self.memo.reproduced[id(trial)]

    def _resizable_dims(self) -> list[tuple[int, int]]:
        """(leaf, dim) of every input dim of 2 or more whose size the signature leaves out."""
        out = []
        for i, x in enumerate(self.trials[0].leaves):
            shape = self.ops.shape(x)
            pinned = pinned_dims(self.case.sizes.exact_sizes.get(self.leaf_names[i]), len(shape))
            out += [(i, d) for d, size in enumerate(shape) if size >= 2 and d not in pinned]
        return out

    def _resized_trials(self, dims: list[tuple[int, int]]) -> list[Trial] | None:
        """The trials with each of ``dims`` lengthened by fresh data, leaf i's dim d by
        1 + d + i * (largest rank). Where the op refuses that, a dim it refuses to lengthen
        alone is tied to another length (cat's other dims, a convolution's channels, a
        pooling gradient's rows to its input's): the tied dims are lengthened by one common
        amount, which keeps equal lengths equal and a window's span; where the op refuses
        that too (a dim tied to a pinned one, or to a dim of 1), pairs of them it takes, the
        rest staying. An integer input that could index a dim (``_may_index``) keeps its
        length: its positions stay in range of the longer data, where fresh ones would not
        (a kernel trusts its indices). None where the op takes none of it, or nothing else
        is left to lengthen."""
        dims = [(i, d) for i, d in dims if not self._may_index(i)]
        return self._resized_by(self._own_amounts(dims)) if dims else None

    def _own_amounts(self, dims: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
        """Each of ``dims`` (leaf i, dim d) lengthened by its own amount, 1 + d + i * (largest rank)."""
        stride = max((len(self.ops.shape(x)) for x in self.trials[0].leaves), default=0)
        return {(i, d): 1 + d + i * stride for i, d in dims}

    def _resized_by(self, amounts: dict[tuple[int, int], int]) -> list[Trial] | None:
        """The trials lengthened by ``amounts``, or where the op refuses that, by the amounts
        it takes (``_tied_amounts``); None where it takes none."""
        return self._resized_and_taken(amounts)[0]

    def _resized_and_taken(self, amounts: dict[tuple[int, int], int]) -> tuple[list[Trial] | None, dict]:
        """``_resized_by(amounts)`` and the amounts its trials were lengthened by."""
        key = (tuple(id(t) for t in self.trials), tuple(sorted(amounts.items())))
        if key not in self.memo.resized:
            taken, trials = amounts, self._lengthened(amounts, self.trials)
            if trials is None:
                taken = self._tied_amounts(amounts)
                trials = self._lengthened(taken, self.trials)
            self.memo.resized[key] = (self.trials, trials, taken)
        return self.memo.resized[key][1:]

    def _tied_amounts(self, own: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:
        """``own`` with the dims the op refuses to lengthen alone lengthened by 1 together,
        or, where it refuses that, in the pairs it takes (each probed on the example)."""
        def takes(amounts: dict[tuple[int, int], int]) -> bool:
            return self._lengthened(amounts, [self.trials[0]]) is not None

        tied = [k for k in own if not takes({k: own[k]})]
        amounts = {k: by for k, by in own.items() if k not in tied}
        if takes(amounts | {k: 1 for k in tied}):
            return amounts | {k: 1 for k in tied}
        for n, k in enumerate(tied):
            if k in amounts:
                continue
            for pair in ([k], *([k, u] for u in tied[n + 1:] if u not in amounts)):
                if takes(amounts | {m: 1 for m in pair}):
                    amounts |= {m: 1 for m in pair}
                    break
        return amounts

    def _lengthened(self, amounts: dict[tuple[int, int], int], trials: list[Trial]) -> list[Trial] | None:
        """``_rebuilt_trials(self._lengthened_by(amounts), trials)``, each trial lengthened by
        ``amounts`` once (``Memo.lengthened``): the probes of ``_tied_amounts`` and the
        resized trials of other groups ask for the same ones. The op refuses the first
        trial it refused before, without running the ones after it, as it would."""
        among, by = tuple(id(t) for t in self.trials), tuple(sorted(amounts.items()))
        leaf, out = None, []
        for trial in trials:
            if trial.special:
                continue
            key = (among, id(trial), by)
            hit = self.memo.lengthened.get(key)
            if hit is None:
                leaf = leaf or self._lengthened_by(amounts)
                made = self._rebuilt_trials(leaf, [trial])
                hit = self.memo.lengthened[key] = (self.trials, trial, made[0] if made else None)
            longer = hit[2]
            if longer is None:
                return None
            out.append(longer)
        return out

    def _lengthened_by(self, amounts: dict[tuple[int, int], int]) -> Callable[[Trial, int, Any], Any]:
        """A ``_rebuilt_trials`` leaf function: leaf i's dim d lengthened by amounts[i, d].
        A fixed input (a mask) or one that could index a dim is lengthened by copies of its
        own elements, and one whose rows are sorted on every trial (searchsorted's sequence)
        stays sorted: random data there would call the op outside its contract, where no
        rule needs to hold."""
        sorted_rows = {i for i in {i for i, _ in amounts} if self._rows_sorted(i)}

        def longer(trial: Trial, i: int, x: Any) -> Any:
            for d, size in enumerate(self.ops.shape(x)):
                if (i, d) in amounts:
                    x = self._lengthen(x, d, size + amounts[i, d], trial.index * 31 + i * 7 + d,
                                       copies=self.leaf_names[i] in self.fixed or self._may_index(i))
            if i in sorted_rows:
                x = self.ops.from_numpy(np.sort(np.asarray(self.ops.to_numpy(x)), axis=-1), x)
            return x

        return longer

    def _may_index(self, i: int) -> bool:
        """Could integer input ``i`` index a dim (a kernel trusts its indices)? One the case
        fixes, or one beside a tensor of another kind: integer inputs alone are data
        (addmm of integers), and so are fill or init values (``IndexFlags.values``)."""
        leaves, name = self.trials[0].leaves, self.leaf_names[i]
        if self.ops.dtype_kind(leaves[i]) != INT or name in self.case.index.values:
            return False
        return name in self.case.index.fixed or any(self.ops.dtype_kind(x) != INT for x in leaves)

    def _distinct_along(self, i: int, d: int) -> bool:
        """Are input ``i``'s values distinct along dim ``d`` (no repeat in any of its lines
        along it) on every random trial?"""
        def distinct(x: Any) -> bool:
            a = np.sort(np.moveaxis(np.asarray(self.ops.to_numpy(x)), d, -1), axis=-1)
            return bool(np.all(a[..., 1:] != a[..., :-1]))

        return all(distinct(t.leaves[i]) for t in self.trials if not t.special)

    def _rows_sorted(self, i: int) -> bool:
        """Is input ``i`` ascending along its last dim (of 3 or more) on every random trial?
        Once per trials (``Memo.keep``): every lengthening asks it."""
        return self.memo.keep(("sorted", id(self.trials), i), self.trials, lambda: self._all_ascending(i))

    def _all_ascending(self, i: int) -> bool:
        def ascending(x: Any) -> bool:
            shape = self.ops.shape(x)
            if len(shape) == 0 or shape[-1] < 3 or self.ops.dtype_kind(x) not in (FLOAT, INT):
                return False
            a = np.asarray(self.ops.to_numpy(x))
            return bool(np.all(np.diff(a, axis=-1) >= 0))

        return all(ascending(t.leaves[i]) for t in self.trials if not t.special)
