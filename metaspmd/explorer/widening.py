"""Room for three shards: where the sample's dims are too short for a halo or a
proportional cut to be told apart on three shards, the trials with those dims lengthened."""

from __future__ import annotations

import contextlib
from typing import Any

from ..combine import Split, follower_ranges
from ..spec import Group
from ..tensor_ops import INT
from .common import FOLLOW_ROOM, Trial, halo_room


class Widening:
    """Searches halos and proportional cuts on lengthened trials (a part of ``Explorer``)."""

    def _lengthened_trials(self, group: Group, extra_evidence: bool = False) -> list[Trial] | None:
        """The trials to try a group on where its cut dims need room for three shards whose
        halos do not reach both ends (a middle shard that sees the whole input proves
        nothing): the sample's own where they have it, else, where the op takes it
        (``Sizes.widen``), the same trials with those dims lengthened by fresh random data;
        None where neither works. ``extra_evidence``: the lengthened trials only add to the
        sample's own (order picks on a dim of two), so any op that runs on them may have them."""
        ops, first = self.ops, self.trials[0]
        halo = group.dims[0][2]
        wide = halo_room(halo)
        if all(ops.shape(first.leaves[i])[d] >= wide for i, d, _ in group.dims):
            return self.trials
        inside = {i for i, _, _ in group.dims}
        if not (self.case.sizes.widen or extra_evidence) or any(
            (i in inside and self.leaf_names[i] in self.fixed and not extra_evidence)
            or (i not in inside and self._may_index(i))
            for i in range(len(first.leaves))
        ):
            return None  # no widening, or integer inputs beside the group: indices into the dim
        if any(0 in ops.shape(o) for o in first.outputs):
            return None  # an empty output holds under any combine: widening would show nothing

        def wider(trial: Trial, i: int, x: Any) -> Any:
            # indices cut with the data (nll_loss's target) are lengthened by copies of
            # their own values, which stay in range: such trials only add evidence
            for j, d, _ in group.dims:
                if j == i and ops.shape(x)[d] < wide:
                    x = self._lengthen(x, d, wide, 31 * trial.index + i, copies=self.leaf_names[i] in self.fixed)
            return x

        return self._rebuilt_trials(wider, self.trials)

    def _two_long(self, group: Group) -> bool:
        """Is every cut dim two elements long, one per shard?"""
        sizes = [self.ops.shape(self.trials[0].leaves[i])[d] for i, d, _ in group.dims]
        return bool(sizes) and all(size == 2 for size in sizes)

    def _halo_sees_all(self, group: Group, trial: Trial, split: Split) -> bool:
        """Does a shard's halo (or extended cut) reach both ends of its dim? That shard holds
        the whole input (argmax of the flattened input then passes as reduce(max) of the
        local ones)."""
        for i, d, halo in group.dims:
            size = self.ops.shape(trial.leaves[i])[d]
            if halo and any(start - halo <= 0 and start + length + halo >= size for start, length in split.bounds(size) or ()):
                return True
        if group.follow:
            i0, d0, _ = group.dims[0]
            reference = split.bounds(self.ops.shape(trial.leaves[i0])[d0]) or []
            ranges = follower_ranges(self.ops, trial.leaves, group.placements(len(trial.leaves)), reference,
                                     self.case.local.padding) or {}
            for i, d, _, extend, _ in group.follow:
                size = self.ops.shape(trial.leaves[i])[d]
                if extend and any(min(stop, size) - max(start, 0) >= size for start, stop in ranges.get(i, ())):
                    return True
        return False

    def _search_halos(self, group: Group, accept, n_inputs: int, plain: bool = False) -> bool:
        """``group`` with an input halo of 1, 2, ... on every cut dim (with ``plain``, of 0
        first, where lengthening gives new trials), until one is accepted; tried on
        lengthened dims where the sample's are too short (noted in the entry)."""
        def with_halo(h: int) -> Group:
            return Group(tuple((i, d, h) for i, d, _ in group.dims))

        for h in range(0 if plain else 1, self.config.max_input_halo + 1):
            g, room = with_halo(h), h  # room: the halo whose room the trials are lengthened to
            trials = self._lengthened_trials(g)
            if h == 0 and trials is self.trials:
                # the sample's own trials showed nothing of the plain cut: it goes first on
                # the trials halo 1 lengthens, whose new data may show it (an eq of x with
                # its broadcast max, flat along the cut dim until lengthened by fresh data)
                room = 1
                trials = self._lengthened_trials(with_halo(room))
                if trials is self.trials:
                    continue
            if trials is not None and self._accepted_on(g, trials, accept):
                if trials is not self.trials:
                    self.widened[g.placements(n_inputs)] = self._widened_notes(g, room)
                return True
        return False

    @contextlib.contextmanager
    def _on_trials(self, trials: list[Trial]):
        """The search on ``trials`` instead of the sample's, for the ``with`` block only."""
        saved, self.trials = self.trials, trials
        try:
            yield
        finally:
            self.trials = saved

    def _accepted_on(self, group: Group, trials: list[Trial], accept) -> bool:
        """``accept`` of ``group`` explored and verified on ``trials`` instead of the sample's."""
        with self._on_trials(trials):
            return accept(group, self._explore(group))

    def _follow_lengthened(self, groups: list[Group], accept, n_inputs: int) -> bool:
        """Proportional groups on trials whose cut dims are lengthened in proportion, where the
        sample's are too short for three shards that do not each read the whole follower
        (an operand of 2 beside a source of 3): the first one accepted, noted in the entry."""
        for g in groups:
            trials = self._lengthened_follow_trials(g)
            if trials is not None and self._accepted_on(g, trials, accept):
                i0, d0, _ = g.dims[0]
                size = self.ops.shape(self.trials[0].leaves[i0])[d0]
                self.widened[g.placements(n_inputs)] = [
                    f"{self.leaf_names[i]} dim {d} cut in proportion: verified with {self.leaf_names[i0]} dim {d0} "
                    f"lengthened from {size} to {FOLLOW_ROOM} by random data, and {self.leaf_names[i]} dim {d} with it"
                    for i, d, *_ in g.follow]
                return True
        return False

    def _lengthened_follow_trials(self, group: Group) -> list[Trial] | None:
        """The trials with the group's plain dim lengthened to FOLLOW_ROOM and each follower
        by as much times its scale; None where the op does not take it."""
        ops, first = self.ops, self.trials[0]
        i0, d0, _ = group.dims[0]
        grow = FOLLOW_ROOM - ops.shape(first.leaves[i0])[d0]
        if grow <= 0 or not self.case.sizes.widen or any(0 in ops.shape(o) for o in first.outputs):
            return None
        cut = {i0: (d0, grow)} | {i: (d, scale * grow) for i, d, scale, _, _ in group.follow}
        if any(i not in cut and ops.dtype_kind(x) == INT and self.leaf_names[i] not in self.case.index.values
               for i, x in enumerate(first.leaves)):
            return None  # integer inputs beside the group: indices into the dims

        def longer(trial: Trial, i: int, x: Any) -> Any:
            if i not in cut:
                return x
            d, by = cut[i]
            return self._lengthen(x, d, ops.shape(x)[d] + by, trial.index * 31 + i)

        return self._rebuilt_trials(longer, self.trials)

    def _widened_notes(self, group: Group, room: int | None = None) -> list[str]:
        """Notes on the group's dims lengthened to the room of halo ``room`` (default its own)."""
        first, halo = self.trials[0], group.dims[0][2]
        wide = halo_room(halo if room is None else room)
        what = f"halo={halo} on" if halo else "plain cut of"
        return [f"{what} {self.leaf_names[i]} dim {d}: verified with that dim lengthened from "
                f"{self.ops.shape(first.leaves[i])[d]} to {wide} by random data"
                for i, d, _ in group.dims if self.ops.shape(first.leaves[i])[d] < wide]
