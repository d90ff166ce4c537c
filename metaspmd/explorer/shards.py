"""One group on one trial: the op run on every shard, and the combines that rebuild
each global output from the local ones."""

from __future__ import annotations

from typing import Any

from ..case import ShapeRefused
from ..check import Cut, cut_inputs, shard_inputs
from ..combine import CutInput, Split, candidate_combines, holds, partial_parts, shard_with_halo
from ..spec import ArgReduce, Gather, GatherPositions, Group, Identity, Reduce
from ..tensor_ops import INT
from .common import (
    AVG_UNTRIED, MAX_EVEN_SHARDS, PARTIAL_SPREADS, UNINFORMATIVE, Trial, even_gather, fit_partial, flat_along,
    one_values, order_dependent, refusal_key,
)


class Shards:
    """Runs a group's shards and reads off the combines that hold (a part of ``Explorer``)."""

    def _locals(self, group: Group, trial: Trial, split: Split) -> list[list[Any]] | None:
        """Local outputs per shard, or None when the group cannot run this way; once per
        (group, trial, split) (``Memo.locals``): the search across independent parts, the
        halo and Partial refuters and a refused cut's second look ask for the same runs,
        which a deterministic op answers alike (nothing writes them)."""
        if not self.memo.holds_values:
            return self._run_locals(group, trial, split)
        key = (group, id(trial), split)
        hit = self.memo.locals.get(key)
        if hit is None:
            hit = self.memo.locals[key] = (trial, self._run_locals(group, trial, split))
        return hit[1]

    def _run_locals(self, group: Group, trial: Trial, split: Split) -> list[list[Any]] | None:
        ops = self.ops
        placements = self._placements(group, len(trial.leaves))
        cut = self._cut(trial.leaves, placements, split)
        # an empty input has no data to differ, only a shape to cut: beside a full one
        # (addmm's mat2 [0, 6] cut with self) its equal shards are no reason to doubt
        full = [i for i, _, _ in group.dims if 0 not in ops.shape(trial.leaves[i])]
        for i, shards in cut.shards.items():  # judged in order, up to where the cutting stopped
            if (not trial.special and (i in full or not full)
                    and self._alike(shards)):
                return UNINFORMATIVE  # identical shards prove nothing (the special trials'
                # all-zero input is meant to be uniform; the other trials need distinct shards)
        if cut.why:
            return None
        if group.dims and not trial.special and full and all(
                self._flat_along(trial.leaves[i], d) for i, d, _ in group.dims if i in full):
            # every cut input the same along its cut dim: shards differ in length at most
            # (an uneven split, a halo), and a gather passes for any reordering there
            return UNINFORMATIVE

        # Partial inputs and offsets keep every shard's shapes: where the same cut was refused
        # by shape, they are refused alike (batch norm's channel cut beside each Partial set)
        same_shapes = refusal_key(group.dims, trial, split) if not (group.follow or group.drop or group.local) else None
        if same_shapes in self.memo.refused:
            return None

        def parts(i: int, x: Any, op: str) -> list[Any]:
            # special values meet parts of x's own sign (inf times parts of both signs is NaN:
            # IEEE arithmetic, which no linear rule survives, rather than the op's doing)
            spread = PARTIAL_SPREADS[trial.index % len(PARTIAL_SPREADS)] * (trial.scale if op == "sum" else 1.0)
            seed = self.seed * 1000 + 100 * trial.index + 17 * i + split.n
            return self.memo.keep(("parts", id(x), op, split.n, seed, spread, trial.special), x,
                                  lambda: partial_parts(ops, x, op, split.n, seed, spread, trial.special))

        # positions clamped first where the shards drop those out of range (every position
        # input: dynamic_update_slice takes one per dim, and only the cut dim's is offset)
        whole = self.case.positions_in_range(trial.leaves) if group.drop else trial.leaves
        sharded = shard_inputs(ops, trial.leaves, placements, cut, parts, self.case.padding, whole)
        if isinstance(sharded, str):
            return None
        if not trial.special and any(all(ops.close(sharded.pieces[i][0], t) for t in sharded.pieces[i][1:])
                                     for i, *_ in group.follow):
            return UNINFORMATIVE

        def run(leaves: list[Any], local) -> list[Any]:
            tensors, others = self._call(leaves, trial, group.drop, local)
            if len(tensors) != len(trial.outputs) or others != trial.others:
                raise ValueError("the shard's call gives other outputs")  # stops at the first such shard
            return tensors

        try:
            return sharded.run(run)
        except ShapeRefused:
            if same_shapes is not None:
                self.memo.refused.add(same_shapes)
            return None
        except Exception:
            return None

    # The memo's pure functions of the tensors the search holds (``Memo.keep``): a group
    # asks them of the same inputs as the groups before it (batch norm's input cut along
    # dim 1 beside each of the Partial sets of its other inputs).

    def _placements(self, group: Group, n_inputs: int) -> tuple:
        """``group.placements(n_inputs)``, made once per group (``Memo.placements``)."""
        key = (group, n_inputs)
        placements = self.memo.placements.get(key)
        if placements is None:
            placements = self.memo.placements[key] = group.placements(n_inputs)
        return placements

    def _cut(self, leaves: list[Any], placements, split: Split) -> Cut:
        """``cut_inputs`` of ``leaves``, each input's shards kept for the next cut of it."""
        def shard(i: int, x: Any, dim: int, bounds: list[tuple[int, int]], halo: int) -> list[Any]:
            return self.memo.keep(("shards", id(x), dim, tuple(bounds), halo), x,
                                  lambda: shard_with_halo(self.ops, x, dim, bounds, halo))

        return cut_inputs(self.ops, leaves, placements, split.n, split.bounds, shard)

    def _alike(self, shards: list[Any]) -> bool:
        """Are the shards of an input all equal (``close``)? ``shards`` as ``_cut`` keeps them."""
        return self.memo.keep(("alike", id(shards)), shards,
                              lambda: all(self.ops.close(shards[0], s) for s in shards[1:]))

    def _flat_along(self, x: Any, d: int) -> bool:
        return self.memo.keep(("flat", id(x), d), x, lambda: flat_along(self.ops, x, d))

    def _is_even(self, group: Group, split: Split, trial: Trial | None = None) -> bool:
        """Does ``split`` cut the group's dims into equal shards (on ``trial``'s inputs,
        which may be lengthened; default the example's)?"""
        leaves = (trial or self.trials[0]).leaves
        return all(split.is_even(self.ops.shape(leaves[i])[d]) for i, d, _ in group.dims)

    def _valid_combines(self, group: Group, trial: Trial, split: Split, candidates=None,
                        locs: list[list[Any]] | None = None) -> list[list] | None:
        if candidates is not None and len(candidates) != len(trial.outputs):
            return UNINFORMATIVE  # a lengthened call with other outputs (unbind along a longer dim)
        locs = self._locals(group, trial, split) if locs is None else locs
        if locs is None or locs is UNINFORMATIVE:
            return locs
        if trial.nonfinite and not trial.special:
            return UNINFORMATIVE  # one NaN/inf value throughout (out-of-domain blind data): every reduce holds
        if trial.one_value is not None and all(one_values(self.ops, loc) == trial.one_value for loc in locs):
            # blind data that leaves every output, global and on every shard, one value
            # throughout (eq of unequal random data: all False) holds for any cut: it proves nothing
            return UNINFORMATIVE
        even = self._is_even(group, split, trial)
        # output halos: twice the input halo (convolution), or 2 with none (padding ops pad
        # every shard: constant_pad_nd's (1, 2) is dropped as halo=(1, 2))
        max_halo = max(2, 2 * max((h for _, _, h in group.dims), default=0))
        # argreduce reads the cut inputs' values, positions their starts: exploring integer
        # outputs, or verifying one
        if candidates is None:
            reads = any(self.ops.dtype_kind(o) == INT for o in trial.outputs)
        else:
            reads = any(isinstance(c, (ArgReduce, GatherPositions)) for opts in candidates for c in opts)
        cut = self._cut_inputs(group, trial, split) if reads else None
        # with every size pinned a block count of any length is too (a view of [5, 5, 5] as
        # [25, 5] cut along dim 1 interleaves 5 blocks)
        all_pinned = candidates is None and not self._resizable_dims()
        out, failing = [], []
        for j, glob in enumerate(trial.outputs):
            shards = [loc[j] for loc in locs]
            if candidates is not None:  # verifying: what exploring kept (joints of parts included)
                cands = candidates[j]
            else:
                max_block = max((self.config.max_block, *self.ops.shape(glob))) if all_pinned else self.config.max_block
                cands = fit_partial(group, candidate_combines(self.ops, shards, glob, even, max_halo, max_block, cut))
                if any(h for _, _, h in group.dims):  # outputs an input halo computes on both
                    cands = [c for c in cands if not (isinstance(c, Gather) and c.overlap)]  # sides are dropped
            if self.case.random:  # each element drawn once, on one rank
                replicated = self.case.value_free and not group.dims  # only Partial inputs, which a fill ignores
                cands = [c for c in cands if (isinstance(c, Gather) and not c.reverse and not c.overlap
                                              and c.dim not in self.case.shared_dims)
                         or (replicated and c == Identity())]
            def keeps(c) -> bool:  # an even gather only where this split cuts its dim evenly too
                return ((even or c != Reduce("avg"))
                        and (not even_gather(c) or (even and c.dim < len(self.ops.shape(glob))
                                                    and self.ops.shape(glob)[c.dim] % split.n == 0))
                        and holds(self.ops, c, shards, glob, cut))

            if candidates is None:
                # exploring: an order-dependent combine (a scan, a reversed gather) that holds
                # beside the plain gather of its dim is dropped in the end (``_verify``), so
                # it is not tried there; most cut dims have ten of them
                held = {c for c in cands if not order_dependent(c) and keeps(c)}
                plain = {c.dim for c in held if isinstance(c, Gather) and c.plain}
                valid = [c for c in cands if c in held or (order_dependent(c) and c.dim not in plain and keeps(c))]
            else:
                valid = [c for c in cands if keeps(c)]
            if not even:  # avg is only meaningful on equal shards: keep it untested here
                valid += [c for c in cands if c == Reduce("avg")]
            if not valid:
                # on unequal shards avg was never a candidate (it is one where identity is, Partial
                # inputs aside): the caller may cut evenly
                untried = not even and candidates is None and not group.partial and Identity() in cands
                if untried and not failing:
                    return AVG_UNTRIED
                if candidates is not None:
                    return None
                failing.append(j)  # exploring: every output that fails, for _unmendable
            out.append(valid)
        if failing:
            self.memo.failed[(group, id(trial), split)] = frozenset(failing)
            return None
        return out

    def _cut_inputs(self, group: Group, trial: Trial, split: Split) -> dict[int, CutInput]:
        """The group's inputs cut without a halo, whose values an argreduce reads."""
        placements = self._placements(group, len(trial.leaves))
        return self._cut(trial.leaves, placements, split).values(placements)

    def _even_split(self, group: Group) -> Split | None:
        """Equal shards for the group's dim (its smallest divisor), within MAX_EVEN_SHARDS."""
        i, d, _ = group.dims[0]
        size = self.ops.shape(self.trials[0].leaves[i])[d]
        n = next((k for k in range(2, min(size, MAX_EVEN_SHARDS) + 1) if size % k == 0), None)
        return Split(n) if n else None

    def _fitting(self, group: Group, trial: Trial, split: Split) -> Split:
        """``split``, or two shards (skewed where they fit) where the group's shortest cut dim
        on ``trial`` is too short for it (a joint of parts cuts dims of several lengths)."""
        size = min(self.ops.shape(trial.leaves[i])[d] for i, d, _ in group.dims)
        if split.bounds(size) is None:
            return Split(2, skew=True) if Split(2, skew=True).bounds(size) else Split(2)
        return split
