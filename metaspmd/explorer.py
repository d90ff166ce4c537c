"""The ShardCombine explorer (MetaDist Algorithm 1, improved) and its verifier.

For one example call of an op:

1. Enumerate groups: one dim per input (or none), all of the same size, so the inputs can
   be cut at the same boundaries (mm: {A.1, B.0}); input halos for single-input groups
   (convolution); Partial(sum) inputs, alone (linear ops) or added to a group that failed
   (addmm's bias while the contraction dim is sharded); a dim of another input cut in
   proportion to a group that failed (a window op's operand beside its per-window input).
2. Explore each group on the example with 2 shards: run the op on every shard, and keep
   every combine (gather with halo/block, reduce, identity, scan, argreduce) that rebuilds
   each output.
3. Verify the survivors on fresh inputs: 2, 3 and 4 shards and a skewed uneven split,
   each with new data from the sample's own generator. Only combines that hold on every trial
   stay; reduce(avg) is checked on equal shards only, and order picks (max, min, argmax,
   argmin) on data with repeated values too.

Soundness guards: an op whose global output differs between two identical calls is
nondeterministic; an output that does not change across fresh inputs cannot tell combines
apart, so the entry gets no strategy; shards of an input must really differ.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import pytree
from .case import Backend, NoSample, OpCase, Skip
from .combine import (
    CutInput, Split, candidate_combines, follower_ranges, follower_shards, holds, offset_positions, partial_parts,
    shard_with_halo,
)
from .rules import Example, OpRecord, RuleEntry, TensorArg, Verification, make_record
from .signature import arg_items, pinned_dims, signature
from .spec import (
    N, ArgReduce, Combine, CombineSpec, Gather, Group, Identity, IndependentSpec, IndexOffset, InputPlacement,
    OutputCombine, PartialInput, PartialSpec, Reduce, Replicate, Scan, ShardIn, ShardSpec, Tables, joint,
    tables_from_strategies,
)
from .tensor_ops import BOOL, COMPLEX, FLOAT, INT, TensorOps

EXPLORE_SPLIT = Split(2)
# Fresh-data trials. 4 shards catch rules that hold only while every shard still sees
# most of the data (index-driven ops such as embedding_renorm pass at 2 shards by luck).
TRIAL_SPLITS = (Split(2), Split(3), Split(2, skew=True), Split(4))
# Special-value trials asked of OpCase.special when random inputs leave an output constant:
# every one verifies combines on every split, and an output is called shape-determined
# only after it stayed constant under every pattern (all zero and all NaN among them).
SPECIAL_TRIALS = 7
# The splits of special-value trials beside Partial(sum) inputs (see _verify).
SPECIAL_SPLITS = (Split(2), Split(2, skew=True))
# Trials on blind random inputs added when an output is constant or empty on the data of
# the sample's own generator.
BLIND_TRIALS = 2
# Fresh trials drawn while a verification has seen only one trial whose shards differ
# (t of two bools, equal on most draws), until a second one does; their seeds start here.
RESERVE_TRIALS = 8
FIRST_RESERVE_TRIAL = 100
# What a trial whose shards are all equal tells about a group: nothing.
UNINFORMATIVE = "uninformative"
# What exploring on unequal shards returns when only reduce(avg), untried there, could
# rebuild an output; and the most equal shards tried instead (a dim of prime size p > 8 has none).
AVG_UNTRIED = "avg untried"
MAX_EVEN_SHARDS = 8
# Standard deviations of the random summands of a Partial(sum) input, by trial. Summands
# far larger than the data cross thresholds the data never reaches (threshold_backward's
# 5.3, bucketize's 2), where a predicate of a sum stops being the sum of the predicates.
PARTIAL_SPREADS = (1.0, 8.0)
# The longest last dim of an integer input taken for an index vector (one position per
# operand dim it indexes), whose elements are offset one at a time.
MAX_INDEX_VECTOR = 4
# Proportional cuts tried for a dim beside a failed group: window strides up to MAX_SCALE,
# windows reaching up to MAX_EXTEND past their stride.
MAX_SCALE = 4
MAX_EXTEND = 3


@dataclass(frozen=True)
class ExploreConfig:
    max_groups: int = 256  # per distinct dim size
    max_input_halo: int = 2
    max_block: int = 4
    halo: bool = True
    partial: bool = True
    offset: bool = True  # integer inputs offset by each shard's start (gather/scatter indices)
    follow: bool = True  # a dim of another input cut in proportion to a failed group
    local: bool = True  # the op's params re-based to each shard (slice bounds, split sizes, padding)
    max_partial_inputs: int = 4  # all subsets up to this many float inputs, else singletons + all
    # Runs each op call (Isolation.run): a call that crashes its process then fails
    # as an op error would, rejecting its candidate only.
    isolate_calls: Callable[[Callable[[], Any]], Any] | None = None


@dataclass
class _Trial:
    """One set of inputs and the op's global outputs on them."""

    args: tuple
    kwargs: dict
    leaves: list[Any]
    outputs: list[Any]  # tensor leaves of the output
    others: list[Any]  # non-tensor leaves of the output (must match on every shard)
    index: int = 0  # 0: the example; k: the k-th fresh trial (seeds its Partial summands)
    special: bool = False  # special-value inputs (all zero, NaN, ...): equal shards allowed
    nonfinite: bool = False  # every output one NaN/inf value throughout (out-of-domain data): proves nothing
    # blind data only: per output, the one value it holds throughout (eq of unequal random data: all False)
    one_value: tuple | None = None


def _flat(ops: TensorOps, x: Any, d: int) -> bool:
    """x is the same along dim d: each element equals the next one along it."""
    size = ops.shape(x)[d]
    return size >= 2 and ops.close(ops.narrow(x, d, 0, size - 1), ops.narrow(x, d, 1, size - 1))


def _one_values(ops: TensorOps, outputs: Sequence[Any]) -> tuple | None:
    """Per output, the one value it holds throughout; None when there are no outputs, or one
    is empty, holds several values (or NaN), or cannot be read as numpy (sparse)."""
    values = []
    for x in outputs:
        try:
            a = ops.to_numpy(x)
        except Exception:
            return None
        if a.size == 0 or not (a == a.flat[0]).all():
            return None
        values.append(a.flat[0].item())
    return tuple(values) or None


def _bitwise_equal(ops: TensorOps, a: Any, b: Any) -> bool:
    """The same shape and values, NaN where the other has NaN; False where numpy cannot read them."""
    try:
        x, y = ops.to_numpy(a), ops.to_numpy(b)
    except Exception:
        return False
    return x.shape == y.shape and bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))


def _error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}".strip()
    text = re.sub(r"(?:[A-Za-z]:)?(?:/[\w.+-]+){2,}/?", "<path>", text)  # no machine paths in the registry
    return text[:200]


class _Explorer:
    def __init__(self, case: OpCase, ops: TensorOps, config: ExploreConfig, seed: int):
        self.case, self.ops, self.config, self.seed = case, ops, config, seed
        self.leaf_names = self._leaf_names()
        # Integer and bool arguments stay fixed (indices, offsets) so that blind refills keep
        # them in range, unless they are all the op has (bitwise_and_ on bools): then they
        # are the data, and fixing them all would leave nothing to vary.
        self.fixed = case.fixed if set(self.leaf_names) - case.fixed else frozenset()
        self._refuters: list[_Trial] | None = None  # special-value trials, drawn when first needed
        self._reserve: list[_Trial] = []  # more fresh trials, drawn when first needed
        # resized trials and the amounts taken, by (ids of the trials, amounts asked); the
        # trials are held, so ids stay theirs
        self._resized: dict[tuple, tuple[list[_Trial], list[_Trial] | None, dict]] = {}
        self._reproduced: dict[int, bool] = {}  # by id of a resized trial (held in _resized)
        self.shared: set[int] = set()  # inputs every independent part reads (_independent_parts)

    # ------------------------------------------------------------------ running

    def _leaf_names(self) -> list[str]:
        names = []
        for name, value in arg_items(self.case.arg_names, self.case.args, self.case.kwargs):
            names += [name] * len(pytree.leaves(value, self.ops.is_tensor))
        return names

    def _flatten_out(self, out: Any) -> tuple[list[Any], list[Any]]:
        tensors = pytree.leaves(out, self.ops.is_tensor)
        others = pytree.leaves(out, lambda x: not self.ops.is_tensor(x) and not isinstance(x, (list, tuple, dict)))
        return tensors, others

    def _call(self, leaves: Sequence[Any], trial: _Trial, drop: bool = False,
              local: dict[int, tuple[int, int, int, int]] | None = None) -> tuple[list[Any], list[Any]]:
        args, kwargs = pytree.replace((trial.args, dict(trial.kwargs)), self.ops.is_tensor, list(leaves))
        if self.config.isolate_calls is not None:
            return self.config.isolate_calls(lambda: self._flatten_out(self.case.call(args, kwargs, drop, local)))
        return self._flatten_out(self.case.call(args, kwargs, drop, local))

    def _trial(self, args: tuple, kwargs: dict, index: int = 0, special: bool = False, blind: bool = False) -> _Trial:
        leaves = pytree.leaves((args, kwargs), self.ops.is_tensor)
        trial = _Trial(args, kwargs, leaves, [], [], index, special)
        trial.outputs, trial.others = self._call(leaves, trial)
        trial.nonfinite = bool(trial.outputs) and all(self.ops.one_nonfinite_value(o) for o in trial.outputs)
        trial.one_value = _one_values(self.ops, trial.outputs) if blind else None
        return trial

    def _fresh_trial(self, k: int) -> _Trial:
        """Trial ``k`` on fresh inputs. A sample generator that ignores its seed (OpInfo's
        bool samples) repeats the example, which tests nothing new: blind data stands in
        where the op takes it."""
        trial = self._trial(*self._fresh_inputs(k), index=k)
        first = self.trials[0]
        if all(self.ops.close(x, y) for x, y in zip(trial.leaves, first.leaves)):
            try:
                return self._trial(*self._fresh_inputs(k, blind=True), index=k, blind=True)
            except Exception:
                pass  # the op rejects unconstrained inputs: its generator's data stands
        return trial

    def _reserve_trials(self) -> Iterator[_Trial]:
        """Up to ``RESERVE_TRIALS`` more fresh trials, drawn when first needed and kept for
        the other groups; fewer where the op rejects fresh inputs."""
        for n in range(RESERVE_TRIALS):
            if n == len(self._reserve):
                try:
                    self._reserve.append(self._fresh_trial(FIRST_RESERVE_TRIAL + n))
                except Exception:
                    return
            yield self._reserve[n]

    def _fresh_inputs(self, k: int, blind: bool = False) -> tuple[tuple, dict]:
        seed = self.seed * 1000 + k
        example = pytree.leaves((self.case.args, self.case.kwargs), self.ops.is_tensor)
        if self.case.fresh is not None and not blind:
            try:
                args, kwargs = self.case.fresh(seed)
                leaves = pytree.leaves((args, kwargs), self.ops.is_tensor)
                if [self.ops.shape(x) for x in leaves] == [self.ops.shape(x) for x in example]:
                    return tuple(args), dict(kwargs)
            except Exception:
                pass  # fall back to refilling the example
        new = [
            x if name in self.fixed or self.ops.dtype_kind(x) == "o" else self.ops.random_like(x, seed * 131 + i)
            for i, (x, name) in enumerate(zip(example, self.leaf_names))
        ]
        args, kwargs = pytree.replace((self.case.args, dict(self.case.kwargs)), self.ops.is_tensor, new)
        return args, kwargs

    # ------------------------------------------------------------------ groups

    def _groups(self, shapes: list[tuple[int, ...]]) -> list[Group]:
        sizes = sorted({s for shape in shapes for s in shape if s >= 2})
        groups: list[Group] = []
        for size in sizes:
            options = [[None] + [d for d, s in enumerate(shape) if s == size] for shape in shapes]
            n_combos = 1
            for o in options:
                n_combos *= len(o)
            if n_combos - 1 <= self.config.max_groups:
                combos = itertools.product(*options)
            else:  # too many inputs: singletons, and the inputs of each rank at one dim each
                singles = [tuple(d if j == i else None for j in range(len(shapes))) for i, o in enumerate(options) for d in o[1:]]
                combos = singles + self._aligned_by_rank(shapes, options)
            for combo in combos:
                dims = tuple((i, d, 0) for i, d in enumerate(combo) if d is not None)
                if dims:
                    groups.append(Group(dims))
        unique = list(dict.fromkeys(groups))
        unique.sort(key=lambda g: (-len(g.dims), g.dims))
        return unique

    def _aligned_by_rank(self, shapes: list[tuple[int, ...]], options: list[list[int | None]]) -> list[tuple]:
        """Combos where the inputs of one rank share one dim (those with the size there), each
        rank its own: batch norm's [N, C, L] tensors at dim 1 beside its [C] statistics at 0.
        Every input at the same dim where that product is past ``max_groups``."""
        ranks = sorted({len(shape) for shape in shapes})
        per_rank = [[None] + list(range(r)) for r in ranks]
        if math.prod(map(len, per_rank)) - 1 > self.config.max_groups:
            return [tuple(d if d in o else None for o in options) for d in range(max(map(len, shapes)))]
        combos = []
        for picks in itertools.product(*per_rank):
            dim_of = dict(zip(ranks, picks))
            combo = tuple(dim_of[len(shape)] if dim_of[len(shape)] in o else None for shape, o in zip(shapes, options))
            if any(d is not None for d in combo):
                combos.append(combo)
        return combos

    def _part_groups(self, shapes: list[tuple[int, ...]], parts: list[set[int]] | None) -> list[Group]:
        """Groups within one independent part at a time (all inputs when there are none):
        groups across parts are joints of these."""
        groups = []
        for part in parts or [range(len(shapes))]:
            inputs = sorted(part)
            for g in self._groups([shapes[i] for i in inputs]):
                groups.append(Group(tuple((inputs[k], d, h) for k, d, h in g.dims)))
        return groups

    def _partial_sets(self, exclude: set[int], parts: list[set[int]] | None,
                      near: set[int] = frozenset()) -> list[tuple[int, ...]]:
        """Sets of inputs to make Partial, outside ``exclude``; with independent parts,
        within the part of the ``near`` inputs (or each part in turn)."""
        if parts:
            everything = set(range(len(self.trials[0].leaves)))
            return [ps for p in parts if not near or near & p for ps in self._partial_sets_in(exclude | (everything - p))]
        return self._partial_sets_in(exclude)

    def _partial_groups(self, group: Group, parts: list[set[int]] | None) -> Iterator[Group]:
        """``group`` with Partial(sum) inputs beside it, then, where none held, Partial(prod)
        float inputs (a scatter-mul whose operand every shard would multiply)."""
        sharded = {i for i, _, _ in group.dims}
        sets = self._partial_sets(sharded, parts, sharded)
        yield from (Group(group.dims, p) for p in sets)
        floats = [p for p in sets if all(self.ops.dtype_kind(self.trials[0].leaves[i]) in (FLOAT, COMPLEX) for i in p)]
        yield from (Group(group.dims, p, partial_op="prod") for p in floats)

    def _partial_sets_in(self, exclude: set[int]) -> list[tuple[int, ...]]:
        # Integer inputs are summable data too where every output is an integer: integer
        # arithmetic is exact modulo wrap-around, which sums respect, so a sum of local
        # outputs equals the global one exactly or not at all. Not where an output is a
        # float: parts whose integer sum wraps around (hash-like arithmetic that overflows
        # on purpose) do not sum as floats to the float of their sum, though the trials'
        # parts never wrap; and an int reinterpreted as a float (a bitcast) is linear on
        # small non-negative values.
        first = self.trials[0]
        kinds = (FLOAT, COMPLEX) + ((INT,) if all(self.ops.dtype_kind(o) == INT for o in first.outputs) else ())
        summable = [
            i for i, x in enumerate(first.leaves)
            if i not in exclude and self.ops.dtype_kind(x) in kinds and self.leaf_names[i] not in self.fixed
        ]
        if not summable:
            return []
        if len(summable) <= self.config.max_partial_inputs:
            return [c for r in range(1, len(summable) + 1) for c in itertools.combinations(summable, r)]
        return [(i,) for i in summable] + [tuple(summable)]

    # ------------------------------------------------------------------ one group

    def _locals(self, group: Group, trial: _Trial, split: Split) -> list[list[Any]] | None:
        """Local outputs per shard, or None when the group cannot run this way."""
        ops = self.ops
        n = split.n
        per_input: dict[int, list[Any]] = {}
        cuts: list[dict[int, tuple[int, int, int, int]]] = [{} for _ in range(n)]  # a local group's shards
        if group.dims:
            # an empty input has no data to differ, only a shape to cut: beside a full one
            # (addmm's mat2 [0, 6] cut with self) its equal shards are no reason to doubt
            full = [i for i, _, _ in group.dims if 0 not in ops.shape(trial.leaves[i])]
            for i, d, halo in group.dims:
                bounds = split.bounds(ops.shape(trial.leaves[i])[d])  # joint groups mix dim sizes
                if bounds is None:
                    return None
                shards = shard_with_halo(ops, trial.leaves[i], d, bounds, halo)
                if (not trial.special and (i in full or not full)
                        and all(ops.close(shards[0], s) for s in shards[1:])):
                    return UNINFORMATIVE  # identical shards prove nothing (the special trials'
                    # all-zero input is meant to be uniform; the other trials need distinct shards)
                per_input[i] = shards
                if group.local:
                    for k, (start, length) in enumerate(bounds):
                        cuts[k][i] = (d, start, start + length, ops.shape(trial.leaves[i])[d])
            if not trial.special and full and all(
                    _flat(ops, trial.leaves[i], d) for i, d, _ in group.dims if i in full):
                # every cut input the same along its cut dim: shards differ in length at most
                # (an uneven split, a halo), and a gather passes for any reordering there
                return UNINFORMATIVE
        if group.follow:
            i0, d0, _ = group.dims[0]
            placements, reference = group.placements(len(trial.leaves)), split.bounds(ops.shape(trial.leaves[i0])[d0])
            followers = follower_shards(ops, trial.leaves, placements, reference, self.case.padding)
            if followers is None:
                return None
            for i, spans in follower_ranges(ops, trial.leaves, placements, reference, self.case.padding).items():
                if placements[i].local:  # the op pads only the part of a shard's range past the dim
                    for k, (start, stop) in enumerate(spans):
                        cuts[k][i] = (placements[i].dim, start, stop, ops.shape(trial.leaves[i])[placements[i].dim])
            if not trial.special and any(all(ops.close(s[0], t) for t in s[1:]) for s in followers.values()):
                return UNINFORMATIVE
            per_input.update(followers)
        # positions clamped first where the shards drop those out of range (every position
        # input: dynamic_update_slice takes one per dim, and only the cut dim's is offset)
        whole = self.case.positions_in_range(trial.leaves) if group.drop else trial.leaves
        if group.offset:  # the cut dims share one size, so one start per shard
            cut, d, _ = group.dims[0]
            starts = [start for start, _ in split.bounds(ops.shape(trial.leaves[cut])[d])]
            for i, component in group.offset:
                per_input[i] = offset_positions(ops, whole[i], starts, component)
        for i in group.partial:
            # special values meet parts of x's own sign (inf times parts of both signs is NaN:
            # IEEE arithmetic, which no linear rule survives, rather than the op's doing)
            spread = PARTIAL_SPREADS[trial.index % len(PARTIAL_SPREADS)]
            per_input[i] = partial_parts(ops, trial.leaves[i], group.partial_op, n,
                                         self.seed * 1000 + 100 * trial.index + 17 * i + n, spread, trial.special)
        result = []
        for k in range(n):
            leaves = [per_input[i][k] if i in per_input else x for i, x in enumerate(whole)]
            try:
                tensors, others = self._call(leaves, trial, group.drop, cuts[k])
            except Exception:
                return None
            if len(tensors) != len(trial.outputs) or others != trial.others:
                return None
            result.append(tensors)
        return result

    def _is_even(self, group: Group, split: Split, trial: _Trial | None = None) -> bool:
        """Does ``split`` cut the group's dims into equal shards (on ``trial``'s inputs,
        which may be lengthened; default the example's)?"""
        leaves = (trial or self.trials[0]).leaves
        return all(split.is_even(self.ops.shape(leaves[i])[d]) for i, d, _ in group.dims)

    def _valid_combines(self, group: Group, trial: _Trial, split: Split, candidates=None,
                        locs: list[list[Any]] | None = None) -> list[list] | None:
        locs = self._locals(group, trial, split) if locs is None else locs
        if locs is None or locs is UNINFORMATIVE:
            return locs
        if trial.nonfinite and not trial.special:
            return UNINFORMATIVE  # one NaN/inf value throughout (out-of-domain blind data): every reduce holds
        if trial.one_value is not None and all(_one_values(self.ops, loc) == trial.one_value for loc in locs):
            # blind data that leaves every output, global and on every shard, one value
            # throughout (eq of unequal random data: all False) holds for any cut: it proves nothing
            return UNINFORMATIVE
        even = self._is_even(group, split, trial)
        # output halos: twice the input halo (convolution), or 2 with none (padding ops pad
        # every shard: constant_pad_nd's (1, 2) is dropped as halo=(1, 2))
        max_halo = max(2, 2 * max((h for _, _, h in group.dims), default=0))
        # argreduce reads the cut inputs' values: exploring integer outputs, or verifying one
        if candidates is None:
            reads = any(self.ops.dtype_kind(o) == INT for o in trial.outputs)
        else:
            reads = any(isinstance(c, ArgReduce) for opts in candidates for c in opts)
        cut = self._cut_inputs(group, trial, split) if reads else None
        # with every size pinned a block count of any length is too (a view of [5, 5, 5] as
        # [25, 5] cut along dim 1 interleaves 5 blocks)
        all_pinned = candidates is None and not self._resizable_dims()
        out = []
        for j, glob in enumerate(trial.outputs):
            shards = [loc[j] for loc in locs]
            if candidates is not None:  # verifying: what exploring kept (joints of parts included)
                cands = candidates[j]
            else:
                max_block = max((self.config.max_block, *self.ops.shape(glob))) if all_pinned else self.config.max_block
                cands = _fit_partial(group, candidate_combines(self.ops, shards, glob, even, max_halo, max_block, cut))
                if any(h for _, _, h in group.dims):  # outputs an input halo computes on both
                    cands = [c for c in cands if not (isinstance(c, Gather) and c.overlap)]  # sides are dropped
            if self.case.random:  # each element drawn once, on one rank
                replicated = self.case.value_free and not group.dims  # only Partial inputs, which a fill ignores
                cands = [c for c in cands if (isinstance(c, Gather) and not c.reverse and not c.overlap)
                         or (replicated and c == Identity())]
            valid = [c for c in cands if (even or c != Reduce("avg")) and holds(self.ops, c, shards, glob, cut)]
            if not even:  # avg is only meaningful on equal shards: keep it untested here
                valid += [c for c in cands if c == Reduce("avg")]
            if not valid:
                # on unequal shards avg was never a candidate (it is one where identity is, Partial
                # inputs aside): the caller may cut evenly
                untried = not even and candidates is None and not group.partial and Identity() in cands
                return AVG_UNTRIED if untried else None
            out.append(valid)
        return out

    def _cut_inputs(self, group: Group, trial: _Trial, split: Split) -> dict[int, CutInput]:
        """The group's inputs cut without a halo, whose values an argreduce reads."""
        out = {}
        for i, d, halo in group.dims:
            bounds = split.bounds(self.ops.shape(trial.leaves[i])[d])
            if not halo and bounds:
                out[i] = CutInput(shard_with_halo(self.ops, trial.leaves[i], d, bounds, 0), d, [s for s, _ in bounds])
        return out

    def _even_split(self, group: Group) -> Split | None:
        """Equal shards for the group's dim (its smallest divisor), within MAX_EVEN_SHARDS."""
        i, d, _ = group.dims[0]
        size = self.ops.shape(self.trials[0].leaves[i])[d]
        n = next((k for k in range(2, min(size, MAX_EVEN_SHARDS) + 1) if size % k == 0), None)
        return Split(n) if n else None

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
        for trial in ordered:
            found = self._valid_combines(group, trial, EXPLORE_SPLIT, candidates)
            if found is AVG_UNTRIED:
                split = self._even_split(group)
                found = self._valid_combines(group, trial, split) if split else None
            if found is not UNINFORMATIVE:
                return None if found is AVG_UNTRIED else found
        return UNINFORMATIVE

    def _verify(self, group: Group, found: list[list]) -> tuple[tuple[OutputCombine, ...], set[int], bool] | None:
        """Re-check ``found`` on the fresh trials; the surviving combines, shard counts, unevenness."""
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
        if group.dims and any(Reduce("avg") in opts for opts in alive):
            alive, avg_checks = self._check_avg_evenly(group, alive, avg_checks, counts)
        if group.dims and any(_by_order(c) for opts in alive for c in opts):
            alive = self._refute_on_ties(group, alive)
        if self._two_long(group) and any(_of_values(c) for opts in alive for c in opts):  # only 2 shards fit
            proven = self._reduces_on_three_shards(group, alive)
            alive = [[c for c in opts if not _of_values(c) or c in p] for opts, p in zip(alive, proven)]
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
                        and not _ordered(c)]
            # a reversed gather or a scan that holds beside the plain gather of its dim is an
            # artifact of data that does not vary along it (zeros, a broadcast row)
            plain_dims = {c.dim for c in opts if isinstance(c, Gather) and c.plain}
            opts = [c for c in opts if not (_ordered(c) and c.dim in plain_dims)]
            # overlapping zeros (a zero padding) add up as well as they drop: the halo stays
            dropped = {c.dim for c in opts if isinstance(c, Gather) and not c.overlap}
            opts = [c for c in opts if not (isinstance(c, Gather) and c.overlap and c.dim in dropped)]
            if Identity() in opts:  # max/min of identical shards are implied by identity
                opts = [c for c in opts if c not in (Reduce("max"), Reduce("min"))]
            if any(isinstance(c, (Identity, Reduce)) for c in opts):  # positions that need no values:
                opts = [c for c in opts if not isinstance(c, ArgReduce)]  # a plain collective says it
            if Reduce("sum") in opts:  # the 2-norm equals the sum only where no two shards
                opts = [c for c in opts if c != Reduce("norm2")]  # overlap: the data never told them apart
            if {Reduce("sum"), Reduce("max"), Identity()} & set(opts):  # xor too (where no two shards
                opts = [c for c in opts if c != Reduce("xor")]  # overlap, or zeros): the common one stays
            if not opts:
                return None
            result.append(OutputCombine.of(opts))
        if any(h for _, _, h in group.dims) or any(_sized(c) for o in result for c in o.options):
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
        return tuple(result), counts, uneven

    def _fitting(self, group: Group, trial: _Trial, split: Split) -> Split:
        """``split``, or two shards (skewed where they fit) where the group's shortest cut dim
        on ``trial`` is too short for it (a joint of parts cuts dims of several lengths)."""
        size = min(self.ops.shape(trial.leaves[i])[d] for i, d, _ in group.dims)
        if split.bounds(size) is None:
            return Split(2, skew=True) if Split(2, skew=True).bounds(size) else Split(2)
        return split

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
        (``OpCase.trusts_shapes``: backward kernels), dims of one length by one amount, so
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
        if self.case.trusts_shapes:
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

    def _held_on(self, group: Group, outs: list[OutputCombine], trials: list[_Trial],
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

    def _reproduces(self, trial: _Trial) -> bool:
        """Does the op give ``trial``'s outputs again on copies of its inputs? (Within the
        usual tolerance: a kernel's threads may sum in another order; garbage differs more.)"""
        if id(trial) not in self._reproduced:
            try:
                outputs, _ = self._call([self.ops.clone(x) for x in trial.leaves], trial)
                same = len(outputs) == len(trial.outputs) and all(
                    self.ops.close(a, b) for a, b in zip(outputs, trial.outputs))
            except Exception:
                same = False
            self._reproduced[id(trial)] = same
        return self._reproduced[id(trial)]

    def _amounts_on_other_sizes(self, group: Group, outs: list[OutputCombine]) -> list[OutputCombine] | None:
        """Block counts and halos are read off sizes, which the signature leaves out unless
        the case pins them (``OpCase.exact_sizes``): flatten's dims in front of the cut; cat's
        inputs, which must be of equal length; a convolution kernel's extent. A block, halo or
        overlap gather, and every combine of a group with an input halo, stays only where it
        also rebuilds the outputs with every unpinned input dim of 2 or more lengthened by
        fresh data (``_resized_trials``), and is dropped where the op refuses such inputs.
        None where an output keeps no combine."""
        dims = self._resizable_dims()
        if not dims:
            return outs  # every size is pinned: so is every amount read off them
        bound = (lambda c: True) if any(h for _, _, h in group.dims) else _sized
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

    def _resizable_dims(self) -> list[tuple[int, int]]:
        """(leaf, dim) of every input dim of 2 or more whose size the signature leaves out."""
        out = []
        for i, x in enumerate(self.trials[0].leaves):
            shape = self.ops.shape(x)
            pinned = pinned_dims(self.case.exact_sizes.get(self.leaf_names[i]), len(shape))
            out += [(i, d) for d, size in enumerate(shape) if size >= 2 and d not in pinned]
        return out

    def _resized_trials(self, dims: list[tuple[int, int]]) -> list[_Trial] | None:
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

    def _resized_by(self, amounts: dict[tuple[int, int], int]) -> list[_Trial] | None:
        """The trials lengthened by ``amounts``, or where the op refuses that, by the amounts
        it takes (``_tied_amounts``); None where it takes none."""
        return self._resized_and_taken(amounts)[0]

    def _resized_and_taken(self, amounts: dict[tuple[int, int], int]) -> tuple[list[_Trial] | None, dict]:
        """``_resized_by(amounts)`` and the amounts its trials were lengthened by."""
        key = (tuple(id(t) for t in self.trials), tuple(sorted(amounts.items())))
        if key not in self._resized:
            taken, trials = amounts, self._rebuilt_trials(self._lengthened_by(amounts))
            if trials is None:
                taken = self._tied_amounts(amounts)
                trials = self._rebuilt_trials(self._lengthened_by(taken))
            self._resized[key] = (self.trials, trials, taken)
        return self._resized[key][1:]

    def _may_index(self, i: int) -> bool:
        """Could integer input ``i`` index a dim (a kernel trusts its indices)? One the case
        fixes, or one beside a tensor of another kind: integer inputs alone are data
        (addmm of integers), and so are fill or init values (``OpCase.values``)."""
        leaves, name = self.trials[0].leaves, self.leaf_names[i]
        if self.ops.dtype_kind(leaves[i]) != INT or name in self.case.values:
            return False
        return name in self.case.fixed or any(self.ops.dtype_kind(x) != INT for x in leaves)

    def _tied_amounts(self, own: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:
        """``own`` with the dims the op refuses to lengthen alone lengthened by 1 together,
        or, where it refuses that, in the pairs it takes (each probed on the example)."""
        def takes(amounts: dict[tuple[int, int], int]) -> bool:
            return self._rebuilt_trials(self._lengthened_by(amounts), self.trials[0]) is not None

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

    def _lengthened_by(self, amounts: dict[tuple[int, int], int]) -> Callable[[_Trial, int, Any], Any]:
        """A ``_rebuilt_trials`` leaf function: leaf i's dim d lengthened by amounts[i, d].
        A fixed input (a mask) or one that could index a dim is lengthened by copies of its
        own elements, and one whose rows are sorted on every trial (searchsorted's sequence)
        stays sorted: random data there would call the op outside its contract, where no
        rule needs to hold."""
        sorted_rows = {i for i in {i for i, _ in amounts} if self._rows_sorted(i)}

        def longer(trial: _Trial, i: int, x: Any) -> Any:
            for d, size in enumerate(self.ops.shape(x)):
                if (i, d) in amounts:
                    x = self._lengthen(x, d, size + amounts[i, d], trial.index * 31 + i * 7 + d,
                                       copies=self.leaf_names[i] in self.fixed or self._may_index(i))
            if i in sorted_rows:
                x = self.ops.from_numpy(np.sort(np.asarray(self.ops.to_numpy(x)), axis=-1), x)
            return x

        return longer

    def _distinct_along(self, i: int, d: int) -> bool:
        """Are input ``i``'s values distinct along dim ``d`` (no repeat in any of its lines
        along it) on every random trial?"""
        def distinct(x: Any) -> bool:
            a = np.sort(np.moveaxis(np.asarray(self.ops.to_numpy(x)), d, -1), axis=-1)
            return bool(np.all(a[..., 1:] != a[..., :-1]))

        return all(distinct(t.leaves[i]) for t in self.trials if not t.special)

    def _rows_sorted(self, i: int) -> bool:
        """Is input ``i`` ascending along its last dim (of 3 or more) on every random trial?"""
        def ascending(x: Any) -> bool:
            shape = self.ops.shape(x)
            if len(shape) == 0 or shape[-1] < 3 or self.ops.dtype_kind(x) not in (FLOAT, INT):
                return False
            a = np.asarray(self.ops.to_numpy(x))
            return bool(np.all(np.diff(a, axis=-1) >= 0))

        return all(ascending(t.leaves[i]) for t in self.trials if not t.special)

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
        held = sorted({str(c) for p in proven for c in p if _of_values(c)})
        if held:
            self.widened[group.placements(len(first.leaves))] = [
                f"{' and '.join(held)} along {self.leaf_names[i]} dim {d}: verified on three shards too, with that dim "
                f"lengthened from 2 to {_halo_room(0)} by {'copies' if self.leaf_names[i] in self.fixed else 'random data'}"
                for i, d, _ in group.dims]
        return [p | s for p, s in zip(proven, sums)] if copied else proven

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
            args, kwargs = pytree.replace((base.args, dict(base.kwargs)), ops.is_tensor, leaves)
            try:
                tied = self._trial(tuple(args), dict(kwargs), index=base.index)
            except Exception:
                continue
            size = ops.shape(tied.leaves[group.dims[0][0]])[group.dims[0][1]]
            ok = self._valid_combines(group, tied, split if split.bounds(size) else Split(2), alive)
            if ok is UNINFORMATIVE:
                continue
            kept = ok if ok is not None else [[] for _ in alive]
            alive = [[c for c in opts if not _by_order(c) or c in k] for opts, k in zip(alive, kept)]
        return alive

    def _whole_on_special_values(self, group: Group, alive: list[list]) -> list[list]:
        """``alive`` less the identity combines a special-value trial refutes. A Partial input
        that leaves an output whole on random data can still matter on values random data
        never hits: heaviside's values are read only where self is 0."""
        if self._refuters is None:
            self._refuters = (self._special_trials() or []) if self.case.special is not None else []
        for trial, split in zip(self._refuters, itertools.cycle(TRIAL_SPLITS)):
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
            args, kwargs = pytree.replace((base.args, dict(base.kwargs)), self.ops.is_tensor, leaves)
            try:
                zero = self._trial(tuple(args), dict(kwargs), index=base.index)
            except Exception:
                continue  # the op refuses zeros: no verdict
            locs = self._locals(group, zero, Split(2))
            if locs is None or locs is UNINFORMATIVE:
                continue
            alive = [[c for c in opts if holds(self.ops, c, [loc[j] for loc in locs], zero.outputs[j])]
                     for j, opts in enumerate(alive)]
        return alive

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

    # ------------------------------------------------------------------ entry

    def run(self) -> RuleEntry:
        case, ops = self.case, self.ops
        sig = signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes)
        example = _example(ops, case)
        ranks = tuple(len(ops.shape(x)) for x in pytree.leaves((case.args, case.kwargs), ops.is_tensor))

        results: tuple[TensorArg, ...] = ()

        def entry(status: str, reason: str = "", tables=None, verified=None, notes=(), independent=None) -> RuleEntry:
            if tables is None:
                tables = _no_strategy(ranks)
            return RuleEntry(sig, status, tables.shard, tables.partial, tables.combine, example, verified, reason,
                             tuple(case.notes) + tuple(notes), results, independent, tables.offset, tables.more)

        try:
            first = self._trial(tuple(case.args), dict(case.kwargs))
            again = self._trial(tuple(case.args), dict(case.kwargs))
        except Exception as e:
            return entry("failed", _error_text(e))
        if len(first.outputs) != len(again.outputs) or not all(ops.close(a, b) for a, b in zip(again.outputs, first.outputs)):
            return entry("failed", "nondeterministic: two identical calls differ")
        results = tuple(_example_value(ops, x) for x in first.outputs)
        if not first.outputs:
            return entry("replicate-only", "no tensor output")
        if not ranks:
            return entry("derived", NO_TENSOR_INPUT)
        self.trials = [first]
        try:
            for k in range(1, len(TRIAL_SPLITS) + 1):
                self.trials.append(self._fresh_trial(k))
        except Exception as e:
            return entry("failed", "fresh inputs: " + _error_text(e))
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
            return entry("replicate-only", f"output {constant[0]} does not vary with the inputs: combines cannot be verified")
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
                group = _group_of(placements)
                accept(group, self._explore(group, [_fit_partial(group, o.options) for o in outs]))
            status = "derived"
        else:
            shapes = [ops.shape(x) for x in first.leaves]
            for group in self._part_groups(shapes, parts):
                combines = self._explore(group)
                if accept(group, combines):
                    # every shard padding as the whole op would and the gather dropping the
                    # copies (an output halo, which planners skip): where each shard padding
                    # only its own outer end holds too, that local rule takes the dim's label
                    if self.config.local and _halo_gathers_only(found[-1][1]) and self._localizes(group):
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

    # ------------------------------------------------------------------ independent parts

    def _independent_parts(self) -> tuple[list[set[int]], list[set[int]]] | None:
        """Inputs and outputs split into parts whose outputs change with their own inputs
        only (one per element of a ``_foreach`` list), found by replacing one input at a time
        with its data from each other trial: (inputs, outputs) per part; None when the op does not
        split that way or an input's effect cannot be seen (an input whose data is the same on
        every trial). Fixed index inputs, which keep their values, join every output.

        Inputs whose values change no output (``type_as``'s other) form a part of their own,
        with no outputs: its labels must leave every output whole, which only running the
        op on their shards can show (``view_as`` reads other's shape, and fails there).
        Inputs that every output reads are in no part (``self.shared``; see below)."""
        first = self.trials[0]
        n_in, n_out = len(first.leaves), len(first.outputs)
        if n_in < 2 or n_out < 1 or self.case.random or len(self.trials) < 3:
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
        self.shared = shared
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
        return [p[0] for p in parts], [p[1] for p in parts]

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
        if (self.case.random or self.case.special is None or len(self.trials) < 3 or not first.outputs
                or len(first.leaves) < 2):
            return []
        summable = sorted({i for ps in self._partial_sets_in(set()) for i in ps})
        pool = self.trials[1:]
        candidates = [i for i in summable if not self._reads(i, first, pool)]  # one call each, most inputs stop here
        # the entry's own special-value trials where it has them (the same seeds), else drawn now
        special = ([t for t in self.trials if t.special] or self._special_trials()) if candidates else None
        if not special:
            return []
        candidates = [i for i in candidates if not any(self._reads(i, base, pool) for base in special)]
        dims = self._resizable_dims() if candidates else []
        resized = (self._resized_trials(dims) or []) if dims else []
        return [i for i in candidates if not any(self._reads(i, base, resized) for base in resized)]

    def _reads(self, i: int, base: _Trial, pool: Sequence[_Trial]) -> bool:
        """Does some output of ``base`` change, by a bit, when input ``i`` takes the data of
        a trial in ``pool`` (or is it the same in all of them, which shows nothing)?"""
        others = [t for t in pool if not self.ops.close(t.leaves[i], base.leaves[i])]
        if not others:
            return True
        for trial in others:
            outs = self._replaced(base, i, trial.leaves[i])
            if outs is None or not all(_bitwise_equal(self.ops, a, b) for a, b in zip(outs, base.outputs)):
                return True
        return False

    def _replaced(self, base: _Trial, i: int, x: Any) -> list[Any] | None:
        """``base``'s tensor outputs with input ``i`` replaced by ``x``; None where the call
        fails or its outputs change in number or in their non-tensor values."""
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
                verified = self._verify(_group_of(new), [list(o.options) for o in outs])
                if verified is not None and all(o.first in v.options for o, v in zip(outs, verified[0])):
                    out.append((new, verified[0]))
                    have.add(new)
        return out

    def _independent_spec(self, ranks: tuple[int, ...], found: list, whole: list,
                          parts: tuple[list[set[int]], list[set[int]]]) -> IndependentSpec | None:
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
            if touched & self.shared:
                continue  # a label that couples the parts: it takes no joint
            k = next((k for k, p in enumerate(parts[0]) if touched <= p), None)
            if k is None:
                return None
            others = set(range(len(s.outputs))) - parts[1][k]
            if any(Identity() not in s.outputs[j].options for j in others):
                return None
            part_of[s.label] = k
        labels = [[lab for lab in part_of if part_of[lab] == k] for k in range(len(parts[0]))]
        labels = [part for part in labels if part]
        if len(labels) < 2:
            return None
        independent = IndependentSpec(tuple(tuple(part) for part in labels))
        entry = dataclasses.replace(entry, independent=independent)
        for s in entry.joint_strategies():
            verified = self._verify(_group_of(s.inputs), [list(o.options) for o in s.outputs])
            if verified is None:
                return None
            # reduce(avg) is checked on its own label's equal shards; a joint mixes dim sizes
            lost = {c for o, kept in zip(s.outputs, verified[0]) for c in o.options if c not in kept.options}
            if lost - {Reduce("avg")}:
                return None
        singles = {s.inputs: s for s in entry.strategies()}
        for placements, outs in whole:
            if any(not isinstance(placements[i], Replicate) for i in self.shared):
                continue  # among the singles: the caller adds what couples the parts
            # each part's share of the placements must be one of its labels (checked part by
            # part: the joints offered are capped at JOINT_LIMIT, the whole search is not)
            shares = [tuple(p if i in part else Replicate() for i, p in enumerate(placements)) for part in parts[0]]
            chosen = [singles.get(share) for share in shares if any(not isinstance(p, Replicate) for p in share)]
            mine = None if not chosen or None in chosen else chosen[0] if len(chosen) == 1 else joint(chosen)
            if mine is None or any(o.first not in m.options for o, m in zip(outs, mine.outputs)):
                return None
        return independent

    def _constant_outputs(self) -> list[int]:
        """Non-empty outputs that are the same on every trial."""
        first = self.trials[0]
        return [
            j for j in range(len(first.outputs))
            if 0 not in self.ops.shape(first.outputs[j])
            and all(self.ops.close(t.outputs[j], first.outputs[j]) for t in self.trials[1:])
        ]

    def _one_valued_blind(self) -> bool:
        """Some blind trial leaves every output one value throughout, or NaN throughout
        (``ndtri`` of random integers: its domain [0, 1] holds two of them)."""
        return any(t.one_value is not None or (t.nonfinite and not t.special) for t in self.trials)

    def _whole_tensor_predicates(self) -> bool:
        """Some output is a single bool (a predicate of whole inputs)."""
        return any(self.ops.shape(o) == () and self.ops.dtype_kind(o) == BOOL for o in self.trials[0].outputs)

    def _constant_inputs(self) -> bool:
        """Some float input with elements, not fixed, is the same on every trial."""
        first = self.trials[0]
        return any(
            self.ops.dtype_kind(x) in (FLOAT, COMPLEX) and 0 not in self.ops.shape(x) and name not in self.fixed
            and all(self.ops.close(t.leaves[i], x) for t in self.trials[1:])
            for i, (x, name) in enumerate(zip(first.leaves, self.leaf_names))
        )

    def _one_signed_inputs(self) -> bool:
        """Some real float input, not fixed, is positive throughout on every random trial
        (or negative throughout)."""
        ops, first = self.ops, self.trials[0]

        def one_signed(x: Any) -> bool:
            try:
                a = ops.to_numpy(x)
            except Exception:
                return False
            return bool((a > 0).all() or (a < 0).all())

        return any(
            ops.dtype_kind(x) == FLOAT and 0 not in ops.shape(x) and name not in self.fixed
            and all(one_signed(t.leaves[i]) for t in self.trials if not t.special)
            for i, (x, name) in enumerate(zip(first.leaves, self.leaf_names))
        )

    def _flat_along_a_dim(self) -> bool:
        """Some float input, not fixed, is the same along one of its dims on every trial (an
        expanded sample): its equal shards there prove nothing, so no cut of it is proposed."""
        ops, first = self.ops, self.trials[0]
        return any(
            ops.dtype_kind(x) in (FLOAT, COMPLEX) and 0 not in ops.shape(x) and name not in self.fixed
            and any(all(_flat(ops, t.leaves[i], d) for t in self.trials) for d in range(len(ops.shape(x))))
            for i, (x, name) in enumerate(zip(first.leaves, self.leaf_names))
        )

    def _integer_data(self) -> bool:
        """Some integer or bool input is data (not an index kept fixed)."""
        return any(self.ops.dtype_kind(x) in (INT, BOOL) and name not in self.fixed
                   for x, name in zip(self.trials[0].leaves, self.leaf_names))

    def _empty_outputs(self) -> bool:
        """Some output has no elements on every trial."""
        return any(all(0 in self.ops.shape(t.outputs[j]) for t in self.trials) for j in range(len(self.trials[0].outputs)))

    def _blind_trials(self) -> list[_Trial]:
        """Trials on blind random inputs for a case with a sample generator, where the op
        takes them: an output constant on the generator's data (the minimum of integers
        drawn from [-9, 9]) makes that data suspect, and every shard's minimum can equal the
        global one by luck. An op that rejects unconstrained inputs keeps its sample's."""
        trials: list[_Trial] = []
        if self.case.fresh is None:
            return trials
        for k in range(len(TRIAL_SPLITS) + 1, len(TRIAL_SPLITS) + 1 + BLIND_TRIALS):
            try:
                trials.append(self._trial(*self._fresh_inputs(k, blind=True), index=k, blind=True))
            except Exception:
                break
        return trials

    def _special_trials(self) -> list[_Trial] | None:
        """``SPECIAL_TRIALS`` trials with special-value inputs, or None when the op rejects
        them (an index input that became invalid)."""
        trials = []
        try:
            for k in range(1, SPECIAL_TRIALS + 1):
                fresh = self._fresh_inputs(k)
                args, kwargs = self.case.special(*fresh, k, self.seed * 1000 + 500 + k)
                args, kwargs = self._keep_fixed(fresh, (tuple(args), dict(kwargs)))
                trials.append(self._trial(tuple(args), dict(kwargs), index=k, special=True))
        except Exception:
            return None
        return trials

    def _resampled_index_trials(self) -> list[_Trial]:
        """The random trials with each fixed input that holds the same values on all of them
        redrawn from its own values, with repeats: an output constant only because that
        input never varied (an index_fill whose index covers every column) then varies. A
        trial the op refuses is left out."""
        first = self.trials[0]
        frozen = {i for i, name in enumerate(self.leaf_names) if name in self.fixed
                  and all(_bitwise_equal(self.ops, t.leaves[i], first.leaves[i]) for t in self.trials[1:])}

        def redrawn(trial: _Trial, i: int, x: Any) -> Any:
            if i not in frozen:
                return x
            values = np.asarray(self.ops.to_numpy(x))
            rng = np.random.default_rng(self.seed * 7919 + 31 * trial.index + i)
            return self.ops.from_numpy(rng.choice(values.ravel(), values.shape), x)

        return [t for base in self.trials if frozen for t in self._rebuilt_trials(redrawn, base) or ()]

    def _keep_fixed(self, fresh: tuple[tuple, dict], special: tuple[tuple, dict]) -> tuple[tuple, dict]:
        """``special`` with the ``fixed`` arguments (indices, offsets) put back from ``fresh``:
        special values would take them out of range."""
        if not self.fixed:
            return special
        kept = pytree.leaves(fresh, self.ops.is_tensor)
        leaves = [k if name in self.fixed else s
                  for k, s, name in zip(kept, pytree.leaves(special, self.ops.is_tensor), self.leaf_names)]
        args, kwargs = pytree.replace((special[0], special[1]), self.ops.is_tensor, leaves)
        return tuple(args), dict(kwargs)

    def _two_long(self, group: Group) -> bool:
        """Is every cut dim two elements long, one per shard?"""
        sizes = [self.ops.shape(self.trials[0].leaves[i])[d] for i, d, _ in group.dims]
        return bool(sizes) and all(size == 2 for size in sizes)

    def _halo_sees_all(self, group: Group, trial: _Trial, split: Split) -> bool:
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
                                     self.case.padding) or {}
            for i, d, _, extend, _ in group.follow:
                size = self.ops.shape(trial.leaves[i])[d]
                if extend and any(min(stop, size) - max(start, 0) >= size for start, stop in ranges.get(i, ())):
                    return True
        return False

    def _search_halos(self, group: Group, accept, n_inputs: int, plain: bool = False) -> bool:
        """``group`` with an input halo of 1, 2, ... on every cut dim (with ``plain``, of 0
        first, where lengthening gives new trials), until one is accepted; tried on
        lengthened dims where the sample's are too short (noted in the entry)."""
        for h in range(0 if plain else 1, self.config.max_input_halo + 1):
            g = Group(tuple((i, d, h) for i, d, _ in group.dims))
            trials = self._lengthened_trials(g)
            if h == 0 and trials is self.trials:
                continue  # the sample's own trials, on which the plain cut showed nothing
            if trials is not None and self._accepted_on(g, trials, accept):
                if trials is not self.trials:
                    self.widened[g.placements(n_inputs)] = self._widened_notes(g)
                return True
        return False

    def _follow_groups(self, group: Group, parts: list[set[int]] | None) -> list[Group]:
        """``group`` with the same dim of another input of its rank (and independent part)
        cut in proportion, where that dim's length is the group's times a stride up to
        MAX_SCALE, plus up to MAX_EXTEND: a window op's operand beside its per-window input
        (the same dim, as windows run along it). Index inputs keep their positions, so they
        never follow."""
        ops, first = self.ops, self.trials[0]
        i0, d0, _ = group.dims[0]
        rank, m = len(ops.shape(first.leaves[i0])), ops.shape(first.leaves[i0])[d0]
        inside = {i for i, _, _ in group.dims}
        part = next((p for p in parts or () if i0 in p), None)
        out = []
        for i, x in enumerate(first.leaves):
            if (i in inside or (part is not None and i not in part) or self.leaf_names[i] in self.fixed
                    or len(ops.shape(x)) != rank):
                continue
            size = ops.shape(x)[d0]
            out += [Group(group.dims, follow=((i, d0, scale, size - scale * m, False),)) for scale in range(1, MAX_SCALE + 1)
                    if 0 <= size - scale * m <= MAX_EXTEND and (scale, size - scale * m) != (1, 0)]
            # in proportion to the dim as the op pads it, the outer shards padding it alone
            padded = size + sum(self.case.padding(i, d0) or (0, 0)) if self.config.local and self.case.padding else size
            out += [Group(group.dims, follow=((i, d0, scale, padded - scale * m, True),)) for scale in range(1, MAX_SCALE + 1)
                    if padded > size and 0 <= padded - scale * m <= MAX_EXTEND]
        return out

    @contextlib.contextmanager
    def _on_trials(self, trials: list[_Trial]):
        saved, self.trials = self.trials, trials
        try:
            yield
        finally:
            self.trials = saved

    def _accepted_on(self, group: Group, trials: list[_Trial], accept) -> bool:
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

    def _lengthened_follow_trials(self, group: Group) -> list[_Trial] | None:
        """The trials with the group's plain dim lengthened to FOLLOW_ROOM and each follower
        by as much times its scale; None where the op does not take it."""
        ops, first = self.ops, self.trials[0]
        i0, d0, _ = group.dims[0]
        grow = FOLLOW_ROOM - ops.shape(first.leaves[i0])[d0]
        if grow <= 0 or not self.case.widen or any(0 in ops.shape(o) for o in first.outputs):
            return None
        cut = {i0: (d0, grow)} | {i: (d, scale * grow) for i, d, scale, _, _ in group.follow}
        if any(i not in cut and ops.dtype_kind(x) == INT and self.leaf_names[i] not in self.case.values
               for i, x in enumerate(first.leaves)):
            return None  # integer inputs beside the group: indices into the dims

        def longer(trial: _Trial, i: int, x: Any) -> Any:
            if i not in cut:
                return x
            d, by = cut[i]
            return self._lengthen(x, d, ops.shape(x)[d] + by, trial.index * 31 + i)

        return self._rebuilt_trials(longer)

    def _rebuilt_trials(self, leaf: Callable[[_Trial, int, Any], Any], only: _Trial | None = None) -> list[_Trial] | None:
        """The trials (special ones left out; ``only``: that one) with each tensor leaf ``x``
        at ``i`` replaced by ``leaf(trial, i, x)`` and the op run again; None where it
        refuses one: the op ties a length to something else (another input, a param)."""
        out = []
        for trial in [only] if only is not None else self.trials:
            if trial.special:
                continue
            leaves = [leaf(trial, i, x) for i, x in enumerate(trial.leaves)]
            args, kwargs = pytree.replace((trial.args, dict(trial.kwargs)), self.ops.is_tensor, leaves)
            try:
                out.append(self._trial(tuple(args), dict(kwargs), index=trial.index))
            except Exception:
                return None
        return out

    def _lengthen(self, x: Any, d: int, length: int, seed: int, copies: bool = False) -> Any:
        """``x`` with dim ``d`` lengthened to ``length`` by fresh random data (``copies``: by
        copies of its own elements along ``d``)."""
        size = self.ops.shape(x)[d]
        room = self.ops.narrow(self.ops.concat([x] * -(-length // size), d), d, 0, length - size)
        return self.ops.concat([x, room if copies else self.ops.random_like(room, self.seed * 7919 + seed)], d)

    def _widened_notes(self, group: Group) -> list[str]:
        first, halo = self.trials[0], group.dims[0][2]
        what = f"halo={halo} on" if halo else "plain cut of"
        return [f"{what} {self.leaf_names[i]} dim {d}: verified with that dim lengthened from "
                f"{self.ops.shape(first.leaves[i])[d]} to {_halo_room(halo)} by random data"
                for i, d, _ in group.dims if self.ops.shape(first.leaves[i])[d] < _halo_room(halo)]

    def _localizes(self, group: Group) -> bool:
        """Has the op params to re-base along each of the group's cut dims (not padding: a
        padded dim is read past its ends, which a proportional cut's ranges say)?"""
        case, first = self.case, self.trials[0]
        if case.localize is None or case.random or not group.dims or group.partial or group.offset:
            return False
        if case.padding is not None and any(case.padding(i, d) for i, d, _ in group.dims):
            return False
        whole = {i: (d, 0, self.ops.shape(first.leaves[i])[d], self.ops.shape(first.leaves[i])[d]) for i, d, _ in group.dims}
        return all(h == 0 for _, _, h in group.dims) and case.localize(whole) is not None

    def _offset_groups(self, group: Group, drop: bool = False) -> list[Group]:
        """``group`` with one integer input beside it offset by each shard's start (gather
        and scatter positions along the cut dim): all its elements, or one element of its
        last dim where that is short enough to be an index vector; ``drop``: the shards run
        the op's dropping form."""
        ops, first = self.ops, self.trials[0]
        inside = {i for i, _, _ in group.dims}
        out = []
        for i, x in enumerate(first.leaves):
            if i in inside or ops.dtype_kind(x) != INT or 0 in ops.shape(x):
                continue
            shape = ops.shape(x)
            vector = shape[-1] if shape and 2 <= shape[-1] <= MAX_INDEX_VECTOR else 0
            out += [Group(group.dims, offset=((i, c),), drop=drop) for c in (None, *range(vector))]
        return out

    def _lengthened_trials(self, group: Group, extra_evidence: bool = False) -> list[_Trial] | None:
        """The trials to try a group on where its cut dims need room for three shards whose
        halos do not reach both ends (a middle shard that sees the whole input proves
        nothing): the sample's own where they have it, else, where the op takes it
        (``OpCase.widen``), the same trials with those dims lengthened by fresh random data;
        None where neither works. ``extra_evidence``: the lengthened trials only add to the
        sample's own (order picks on a dim of two), so any op that runs on them may have them."""
        ops, first = self.ops, self.trials[0]
        halo = group.dims[0][2]
        wide = _halo_room(halo)
        if all(ops.shape(first.leaves[i])[d] >= wide for i, d, _ in group.dims):
            return self.trials
        inside = {i for i, _, _ in group.dims}
        if not (self.case.widen or extra_evidence) or any(
            (i in inside and self.leaf_names[i] in self.fixed and not extra_evidence)
            or (i not in inside and self._may_index(i))
            for i in range(len(first.leaves))
        ):
            return None  # no widening, or integer inputs beside the group: indices into the dim
        if any(0 in ops.shape(o) for o in first.outputs):
            return None  # an empty output holds under any combine: widening would show nothing

        def wider(trial: _Trial, i: int, x: Any) -> Any:
            # indices cut with the data (nll_loss's target) are lengthened by copies of
            # their own values, which stay in range: such trials only add evidence
            for j, d, _ in group.dims:
                if j == i and ops.shape(x)[d] < wide:
                    x = self._lengthen(x, d, wide, 31 * trial.index + i, copies=self.leaf_names[i] in self.fixed)
            return x

        return self._rebuilt_trials(wider)


# Ops with no tensor input (factories: full, arange, scalar_tensor): nothing to shard; the
# determinism check above guarantees every rank computes the same, replicated output.
NO_TENSOR_INPUT = "no tensor input: nothing to shard; every rank computes the same output (replicate)"


FOLLOW_ROOM = 6  # a short plain dim beside a follower is lengthened to this: three shards of 2


def _halo_room(halo: int) -> int:
    """The shortest dim whose three equal shards each keep one element no halo reaches."""
    return 3 * (halo + 1)


def _cuts_a_dim(entry: RuleEntry) -> bool:
    """Has the entry a strategy that shards an input dim, and outputs with elements?"""
    return (entry.status in ("ok", "derived") and bool(entry.shard.labels())
            and not any(0 in r.shape for r in entry.results))


def _by_order(c) -> bool:
    """Does combine ``c`` pick values or positions by order (max, min, argmax, argmin)?"""
    return c in (Reduce("max"), Reduce("min")) or isinstance(c, ArgReduce)


def _of_values(c) -> bool:
    """Does combine ``c`` reduce the shards' values (sum, avg, max, argmax, ...)?"""
    return isinstance(c, (Reduce, ArgReduce))


def _ordered(c) -> bool:
    """A combine that depends on the order of the shards beyond a plain gather."""
    return isinstance(c, Scan) or (isinstance(c, Gather) and c.reverse)


def _no_strategy(ranks) -> Tables:
    return Tables(ShardSpec(tuple((N,) * r for r in ranks)), PartialSpec(tuple(() for _ in ranks)), CombineSpec(()))


def _fit_partial(group: Group, combines) -> list:
    """The combines worth trying for an output of ``group``: op(x1 + x2) can only be
    op(x1) + op(x2) (linear) or op(x) (independent of that input); anything else that
    passes with a Partial input is luck on the data."""
    if group.partial:
        return [c for c in combines if c in (Reduce(group.partial_op), Identity())]
    return list(combines)


def _group_of(placements: Sequence[InputPlacement]) -> Group:
    dims = tuple((i, p.dim, p.halo) for i, p in enumerate(placements) if isinstance(p, ShardIn) and not p.follows)
    local = any(isinstance(p, ShardIn) and p.local and not p.follows for p in placements)
    follow = tuple((i, p.dim, p.scale, p.extend, p.local) for i, p in enumerate(placements)
                   if isinstance(p, ShardIn) and p.follows)
    partial = tuple(i for i, p in enumerate(placements) if isinstance(p, PartialInput))
    ops = {p.op for p in placements if isinstance(p, PartialInput)}
    if len(ops) > 1:
        raise ValueError(f"one Partial op per strategy, not {sorted(ops)}")
    return Group(dims, partial, follow=follow, partial_op=ops.pop() if ops else "sum", local=local)


def _sized(c) -> bool:
    """A gather whose amount (block count, halo, overlap) is read off sizes."""
    return isinstance(c, Gather) and (c.block > 1 or c.halo or c.halo_end or c.overlap)


def _halo_gathers_only(outs: Sequence[OutputCombine]) -> bool:
    return all(isinstance(c, Gather) and (c.halo or c.halo_end) for o in outs for c in o.options)


def _example_value(ops: TensorOps, x: Any) -> Any:
    if ops.is_tensor(x):
        return TensorArg(tuple(ops.shape(x)), ops.dtype_name(x))
    if isinstance(x, (list, tuple)):
        return tuple(_example_value(ops, y) for y in x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


def _example(ops: TensorOps, case: OpCase) -> Example:
    return Example(tuple((name, _example_value(ops, v)) for name, v in arg_items(case.arg_names, case.args, case.kwargs)))


def explore_case(case: OpCase, ops: TensorOps, seed: int = 0, config: ExploreConfig = ExploreConfig()) -> RuleEntry:
    """Explore and verify one example call. Op errors become a 'failed' entry, never an exception."""
    try:
        return _Explorer(case, ops, config, seed).run()
    except Exception as e:  # a bug in a sample or a wrapper must not stop a sweep
        return failed_entry(case, ops, "explorer: " + _error_text(e))


def holds_at_other_sizes(case: OpCase, ops: TensorOps, placements: Sequence[InputPlacement],
                         combines: Sequence[Combine], seed: int = 0) -> bool:
    """Does a rule also hold with every unpinned dim lengthened, as the explorer requires of
    the rules it keeps? (A rule that holds at the example's sizes only: a slice_scatter
    whose slice covers all of self, a convolution cutting a kernel that spans its input.)
    True where nothing can be lengthened or the op refuses it, as the explorer has it, and
    for a rule that replicates every input. Cut rules with a halo or a proportional cut
    are the explorer's own (``_amounts_on_other_sizes``) and raise ValueError."""
    group = _group_of(placements)
    if group.follow or any(h for _, _, h in group.dims):
        raise ValueError("a rule with a halo or a proportional cut is checked at other sizes by the explorer alone")
    if not group.dims and not group.partial:
        return True
    ex = _Explorer(case, ops, ExploreConfig(), seed)
    ex.trials = [ex._trial(tuple(case.args), dict(case.kwargs))]
    ex.trials += [ex._fresh_trial(k) for k in range(1, len(TRIAL_SPLITS) + 1)]
    outs = [OutputCombine.of([c]) for c in combines]
    held = ex._cuts_on_other_sizes(group, outs) if group.dims else ex._partials_on_other_sizes(group, outs)
    return held is not None


def failed_entry(case: OpCase, ops: TensorOps, reason: str) -> RuleEntry:
    """The entry of an example call that could not be explored: no strategy, and why."""
    sig = signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes)
    ranks = [len(ops.shape(x)) for x in pytree.leaves((case.args, case.kwargs), ops.is_tensor)]
    none = _no_strategy(ranks)
    return RuleEntry(sig, "failed", none.shard, none.partial, none.combine, _example(ops, case), None, reason)


def explore_op(backend: Backend, op: str, config: ExploreConfig = ExploreConfig()) -> OpRecord:
    """All example calls of one op, as the record its registry file holds."""
    try:
        cases = list(backend.cases(op))
    except Skip as s:
        return OpRecord(op, backend.name, s.status, (), s.reason)
    except NoSample as e:
        return OpRecord(op, backend.name, "no-sample", (), str(e) or "no sample input")
    except Exception as e:
        return OpRecord(op, backend.name, "failed", (), "cases: " + _error_text(e))
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
        if case.reserve and entries and not _cuts_a_dim(e):
            continue  # a spare sample is kept for a rule that cuts a dim, not for nothing or an empty output
        entries.setdefault(e.signature, e)
    record = make_record(op, backend.name, entries.values())
    if all(e.reason.startswith("nondeterministic") for e in record.entries):
        return OpRecord(op, backend.name, "nondeterministic", (), record.entries[0].reason)
    return record


__all__ = ["ExploreConfig", "explore_case", "explore_op", "holds_at_other_sizes"]
