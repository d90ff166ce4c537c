"""Independent parts: inputs and outputs that split into parts whose outputs change with
their own inputs only (a ``_foreach`` list), whose labels then combine freely; and
inputs no output reads, which may be Partial beside any strategy."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Sequence

from ..rules import Example, RuleEntry
from ..tensor_ops import COMPLEX, FLOAT, INT
from ..spec import (
    Group, Identity, IndependentSpec, IndexOffset, PartialInput, Reduce, Replicate, ShardIn, joint,
    tables_from_strategies,
)
from .common import EXPLORE_SPLIT, Trial, bitwise_equal, group_of


@dataclass(frozen=True)
class Parts:
    """Independent parts: per part, its inputs and the outputs they change; and the inputs
    every output reads (in no part: replicated, they leave the parts independent)."""

    inputs: tuple[frozenset[int], ...]
    outputs: tuple[frozenset[int], ...]
    shared: frozenset[int] = frozenset()


class IndependentParts:
    """Finds independent parts and unread inputs (a part of ``Explorer``)."""

    def _independent_parts(self) -> Parts | None:
        """Inputs and outputs split into parts whose outputs change with their own inputs
        only (one per element of a ``_foreach`` list), found by replacing one input at a time
        with its data from each other trial; None when the op does not
        split that way or an input's effect cannot be seen (an input whose data is the same on
        every trial). Fixed index inputs, which keep their values, join every output.

        Inputs whose values change no output (``type_as``'s other) form a part of their own,
        with no outputs: its labels must leave every output whole, which only running the
        op on their shards can show (``view_as`` reads other's shape, and fails there).
        Inputs that every output reads are in no part (``Parts.shared``; see below)."""
        first = self.trials[0]
        n_in, n_out = len(first.leaves), len(first.outputs)
        if n_in < 2 or n_out < 1 or self.case.randomness.random or len(self.trials) < 3:
            return None
        root = list(range(n_in + n_out))

        def find(x: int) -> int:
            while root[x] != x:
                x = root[x]
            return x

        changes: dict[int, set[int]] = {}  # the outputs each non-fixed input changes
        free = set()
        for i in range(n_in):
            if self.leaf_names[i] in self.fixed:  # indices keep their values: their effect is
                for j in range(n_out):  # unseen, so they join every output (a free input beside
                    root[find(i)] = find(n_in + j)  # them still shows: nll_loss's total_weight)
                continue
            changed = set()
            for trial in self.trials[1:]:  # special values too: clamp_min(x, 2) of small x is constant
                outs = self._replaced(first, i, trial.leaves[i])
                if outs is None:
                    return None
                changed |= {j for j in range(n_out) if not self.ops.close(outs[j], first.outputs[j])}
            if not changed:
                if all(self.ops.close(t.leaves[i], first.leaves[i]) for t in self.trials[1:]):
                    return None  # the same data on every trial (a fixed sample): its effect is unseen
                free.add(i)
            changes[i] = changed
        if set().union(*changes.values()) != set(range(n_out)):
            return None
        fixed_root = list(root)

        def join(skip: set[int]) -> None:
            root[:] = fixed_root
            for i, changed in changes.items():
                for j in changed if i not in skip else ():
                    root[find(i)] = find(n_in + j)

        # An input every output reads (_foreach_mul.Tensor's one scalar tensor) is shared:
        # replicated, it leaves the other inputs' parts independent, and the strategies that
        # place it couple the parts (labels of no part). Not beside unread inputs, which
        # the search across parts places beside every strategy (batch norm's running stats)
        join(set())
        shared = set()
        if n_out > 1 and not free and len({find(n_in + j) for j in range(n_out)}) == 1:
            shared = {i for i, changed in changes.items() if len(changed) == n_out}
            join(shared)
        by_root: dict[int, tuple[set[int], set[int]]] = {}
        for x in range(n_in + n_out):
            if x in free or x in shared:
                continue
            ins, outs = by_root.setdefault(find(x), (set(), set()))
            (ins if x < n_in else outs).add(x if x < n_in else x - n_in)
        if free:
            by_root[-1] = (free, set())
        if any(not ins for ins, _ in by_root.values()):
            return None  # outputs of the shared inputs alone
        parts = sorted(by_root.values(), key=lambda p: min(p[0]))
        if len(parts) < 2:
            return None
        return Parts(tuple(frozenset(p[0]) for p in parts), tuple(frozenset(p[1]) for p in parts), frozenset(shared))

    def _unread_inputs(self) -> list[int]:
        """Summable inputs whose values no output reads (``nll_loss_backward``'s
        ``total_weight`` at reduction none, ``diff``'s ``append`` at n=0): taking another
        trial's data for the input alone leaves every output bit for bit the same, on the
        example, on every special-value trial (``heaviside`` reads its ``values`` only where
        ``self`` is zero, which random data never is) and, where the op takes them, on the
        trials with unpinned dims lengthened (``fractional_max_pool2d``'s random samples
        place no window at the example's sizes, and do at others). None where the op has no
        special values."""
        first = self.trials[0]
        if (self.case.randomness.random or self.case.specials.special is None or len(self.trials) < 3
                or not first.outputs or len(first.leaves) < 2):
            return []
        if self.memo.unread is not None:
            return self.memo.unread
        self.memo.unread = []
        summable = self._summable_inputs(ints=True)
        pool = self.trials[1:]
        candidates = [i for i in summable if not self._reads(i, first, pool)]  # one call each, most inputs stop here
        special = self._specials() if candidates else None
        if not special:
            return []
        candidates = [i for i in candidates if not any(self._reads(i, base, pool) for base in special)]
        candidates = [i for i in candidates if not self._constant_readers(i, first)]
        dims = self._resizable_dims() if candidates else []
        # only those the op reproduces: a kernel reading past a lengthened input gives garbage,
        # which changes from call to call (or not) whatever the input's values
        resized = [t for t in (self._resized_trials(dims) or []) if self._reproduces(t)] if dims else []
        self.memo.unread = [i for i in candidates if not any(self._reads(i, base, resized) for base in resized)]
        return self.memo.unread

    def _reads(self, i: int, base: Trial, pool: Sequence[Trial]) -> bool:
        """Does some output of ``base`` change, by a bit, when input ``i`` takes the data of
        a trial in ``pool`` (or is it the same in all of them, which shows nothing)?"""
        others = [t for t in pool if not self.ops.close(t.leaves[i], base.leaves[i])]
        if not others:
            return True
        for trial in others:
            outs = self._replaced(base, i, trial.leaves[i])
            if outs is None or not all(bitwise_equal(self.ops, a, b) for a, b in zip(outs, base.outputs)):
                return True
        return False

    def _constant_readers(self, i: int, base: Trial) -> frozenset[int]:
        """The outputs of ``base`` that change, by a bit, when input ``i`` is all zeros, all
        ones or all minus ones (every output where such a call fails). Random and special
        data hold exact ±1 only by chance (none on most 0-d targets), and
        ``hinge_embedding_loss`` reads its target only there."""
        x = base.leaves[i]
        if self.ops.dtype_kind(x) not in (FLOAT, COMPLEX, INT):
            return frozenset()
        zeros = self.ops.zeros_like(x)

        def readers() -> frozenset[int]:
            hit: set[int] = set()
            for fill in (zeros, self.ops.add_scalar(zeros, 1), self.ops.add_scalar(zeros, -1)):
                outs = self._run_replaced(base, i, fill)
                if outs is None:
                    return frozenset(range(len(base.outputs)))
                hit |= {j for j, (a, b) in enumerate(zip(outs, base.outputs)) if not bitwise_equal(self.ops, a, b)}
            return frozenset(hit)

        return self.memo.keep(("constant readers", id(base), i), (base,), readers)

    def _unmendable(self, group: Group, inputs: Sequence[int]) -> bool:
        """Did ``group`` fail on the example at an output none of ``inputs`` reaches? The
        same cut with them Partial fails there too, untried: that output's shards are the
        same runs' to the bit, and a Partial group keeps fewer of their combines
        (``fit_partial``). Only where the example was the first trial that showed anything
        (``_explore`` stops there), with no one-valued outputs to make the Partial runs
        uninformative instead."""
        first = self.trials[0]
        if first.special or first.nonfinite or first.one_value is not None:
            return False
        failed = self.memo.failed.get((group, id(first), EXPLORE_SPLIT), ())
        return any(not any(j in self._readers(i) for i in inputs) for j in failed)

    def _readers(self, i: int) -> frozenset[int]:
        """The outputs of the example that change, by a bit, when input ``i`` alone takes a
        fresh trial's data (every output where none differs there or the call fails)."""
        hit = self.memo.readers.get(i)
        if hit is None:
            first, every = self.trials[0], frozenset(range(len(self.trials[0].outputs)))
            other = next((t for t in self.trials[1:] if not t.special
                          and not bitwise_equal(self.ops, t.leaves[i], first.leaves[i])), None)
            outs = self._replaced(first, i, other.leaves[i]) if other is not None else None
            hit = self.memo.readers[i] = every if outs is None else frozenset(
                j for j, (a, b) in enumerate(zip(outs, first.outputs)) if not bitwise_equal(self.ops, a, b))
        return hit

    def _replaced(self, base: Trial, i: int, x: Any) -> list[Any] | None:
        """``base``'s tensor outputs with input ``i`` replaced by ``x``; None where the call
        fails or its outputs change in number or in their non-tensor values. Once per
        (base, i, x) (``Memo.keep``): the independence, unread-input and reader checks ask
        for the same calls."""
        return self.memo.keep(("replaced", id(base), i, id(x)), (base, x), lambda: self._run_replaced(base, i, x))

    def _run_replaced(self, base: Trial, i: int, x: Any) -> list[Any] | None:
        leaves = list(base.leaves)
        leaves[i] = x
        try:
            outs, others = self._call(leaves, base)
        except Exception:
            return None
        return outs if len(outs) == len(base.outputs) and others == base.others else None

    def _beside_unread(self, found: list) -> list:
        """Found strategies again with unread inputs they replicate made Partial(sum), each
        verified like any other: a Partial input keeps its global shape, and its values are
        not read (DTensor lists these, ``(S(0), S(0), S(0), P(sum)) -> S(0)`` for
        ``nll_loss_backward``)."""
        unread = self._unread_inputs()
        have = {placements for placements, _ in found}
        out = []
        for placements, outs in found:
            if any(isinstance(p, IndexOffset) or (isinstance(p, PartialInput) and p.op != "sum") for p in placements):
                continue
            spare = [i for i in unread if isinstance(placements[i], Replicate)]
            subsets = ([c for r in range(1, len(spare) + 1) for c in itertools.combinations(spare, r)]
                       if len(spare) <= self.config.max_partial_inputs else [(i,) for i in spare] + [tuple(spare)])
            for subset in subsets:
                new = tuple(PartialInput() if i in subset else p for i, p in enumerate(placements))
                if new in have:
                    continue
                verified = self._verify(group_of(new), [list(o.options) for o in outs])
                if verified is not None and all(o.first in v.options for o, v in zip(outs, verified.combines)):
                    out.append((new, verified.combines))
                    have.add(new)
        return out

    def _independent_spec(self, ranks: tuple[int, ...], found: list, whole: list,
                          parts: Parts) -> IndependentSpec | None:
        """The labels of each part, once every label keeps the outputs of the other parts
        whole (identity), every joint strategy verifies on the trials, and every strategy the
        search across parts found (``whole``) is among the singles and joints; None when one
        of these fails (the parts are coupled, e.g. through shapes: ``broadcast_tensors``) or
        fewer than two parts have labels."""
        if any(isinstance(p, ShardIn) and p.follows for placements, _ in found for p in placements):
            return None  # a joint cuts each label by its own length: no plain dim to follow
        tables = tables_from_strategies(ranks, found)
        entry = RuleEntry("", "ok", tables.shard, tables.partial, tables.combine, Example(()), offset=tables.offset,
                          more=tables.more)
        part_of = {}
        for s in entry.strategies():
            touched = {i for i, p in enumerate(s.inputs) if not isinstance(p, Replicate)}
            if touched & parts.shared:
                continue  # a label that couples the parts: it takes no joint
            k = next((k for k, p in enumerate(parts.inputs) if touched <= p), None)
            if k is None:
                return None
            others = set(range(len(s.outputs))) - parts.outputs[k]
            if any(Identity() not in s.outputs[j].options for j in others):
                return None
            part_of[s.label] = k
        labels = [[lab for lab in part_of if part_of[lab] == k] for k in range(len(parts.inputs))]
        labels = [part for part in labels if part]
        if len(labels) < 2:
            return None
        independent = IndependentSpec(tuple(tuple(part) for part in labels))
        entry = dataclasses.replace(entry, independent=independent)
        for s in entry.joint_strategies():
            verified = self._verify(group_of(s.inputs), [list(o.options) for o in s.outputs])
            if verified is None:
                return None
            # reduce(avg) is checked on its own label's equal shards; a joint mixes dim sizes
            lost = {c for o, kept in zip(s.outputs, verified.combines) for c in o.options if c not in kept.options}
            if lost - {Reduce("avg")}:
                return None
        singles = {s.inputs: s for s in entry.strategies()}
        for placements, outs in whole:
            if any(not isinstance(placements[i], Replicate) for i in parts.shared):
                continue  # among the singles: the caller adds what couples the parts
            # each part's share of the placements must be one of its labels (checked part by
            # part: the joints offered are capped at JOINT_LIMIT, the whole search is not)
            shares = [tuple(p if i in part else Replicate() for i, p in enumerate(placements)) for part in parts.inputs]
            chosen = [singles.get(share) for share in shares if any(not isinstance(p, Replicate) for p in share)]
            mine = None if not chosen or None in chosen else chosen[0] if len(chosen) == 1 else joint(chosen)
            if mine is None or any(o.first not in m.options for o, m in zip(outs, mine.outputs)):
                return None
        return independent
