"""The explorer's settings, the records its stages pass on (context, trial, memo) and
small helpers, shared by its parts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .. import pytree
from ..case import OpCase
from ..combine import Split
from ..rules import Example, RuleEntry, TensorArg
from ..signature import arg_items, object_text
from ..spec import (
    N, ArgReduce, CombineSpec, Gather, GatherPositions, Group, Identity, InputPlacement, OutputCombine, PartialInput, PartialSpec,
    Reduce, Scan, ShardIn, ShardSpec, Tables,
)
from ..tensor_ops import TensorOps


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
# Trials on fresh data past and at the call's value arguments (OpCase.value_args), which
# unit-scale data seldom crosses or meets: every element above the largest magnitude among
# them, then every one below minus it (where that is SIDE_FLOOR or more), then both sides spread over REACH_SCALE times it with
# a third of the elements at one of the values or their negatives. Their seeds start at
# FIRST_SCALED_TRIAL.
SCALED_SIDES = (1, -1, 0)
SIDE_FLOOR = 1.0
FIRST_SCALED_TRIAL = 20
REACH_SCALE = 2.0
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
# Shard counts an even gather (a rule that holds where every cut dim divides by the count)
# is verified on: every divisor of the cut dims' common length, up to this many, and that
# length itself (each shard one element): the rule is claimed for each of them.
MAX_EVEN_COUNTS = 12
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
    even: bool = True  # a failed plain cut as a gather on even cuts only, where every size is pinned
    max_partial_inputs: int = 4  # all subsets up to this many float inputs, else singletons + all
    # Runs each op call (Isolation.run): a call that crashes its process then fails
    # as an op error would, rejecting its candidate only.
    isolate_calls: Callable[[Callable[[], Any]], Any] | None = None


@dataclass(frozen=True)
class Context:
    """What every stage reads, fixed for one example call: the case, its backend's ops,
    the settings, the seed, each tensor leaf's argument name, and the arguments that keep
    their values when inputs are refilled."""

    case: OpCase
    ops: TensorOps
    config: ExploreConfig
    seed: int
    leaf_names: tuple[str, ...]
    fixed: frozenset[str]
    # fresh inputs by (trial number, blind), drawn once for the call: the baseline, the
    # special-value trials built on them and the search's refuters all ask for the same
    # ones, and a sample generator re-runs its OpInfo sample for each draw (a pure
    # function of the seed; the inputs are never written)
    drawn: dict[tuple[int, bool], tuple[tuple, dict]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, case: OpCase, ops: TensorOps, config: ExploreConfig = ExploreConfig(), seed: int = 0) -> Context:
        names: list[str] = []
        for name, value in arg_items(case.arg_names, case.args, case.kwargs):
            names += [name] * len(pytree.leaves(value, ops.is_tensor))
        # Integer and bool arguments stay fixed (indices, offsets) so that blind refills keep
        # them in range, unless they are all the op has (bitwise_and_ on bools): then they
        # are the data, and fixing them all would leave nothing to vary.
        fixed = case.index.fixed if set(names) - case.index.fixed else frozenset()
        return cls(case, ops, config, seed, tuple(names), fixed)


@dataclass(frozen=True)
class Trial:
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
    # the data's scale (scaled trials: past the call's value arguments): a Partial(sum)
    # input's random parts spread as widely, or they would all fall on one side of a bound
    scale: float = 1.0
    # [args, kwargs, the function that rebuilds them around new leaves] once the op has run
    # on them (Trials._call): kept with the trial, so it goes when the trial does
    template: list = field(default_factory=list, compare=False, repr=False)


@dataclass
class Memo:
    """What the search draws or works out once and keeps for every later group: a cache,
    so mutable, and never reset while the search runs. ``holds_values``: False for a large
    example (a live call at a model's real sizes), where the shard outputs (``locals``) and
    derived tensors (``keep``) would be held for every group, trial and split, most of
    the exploration's memory: they are worked out again when asked."""

    holds_values: bool = True

    refuters: list[Trial] | None = None  # special-value trials (Verifier._specials)
    reserve: list[Trial] = field(default_factory=list)  # more fresh trials (_reserve_trials)
    # resized trials and the amounts taken, by (ids of the trials, amounts asked); the
    # trials are held, so ids stay theirs
    resized: dict[tuple, tuple[list[Trial], list[Trial] | None, dict]] = field(default_factory=dict)
    reproduced: dict[int, bool] = field(default_factory=dict)  # by id of a resized trial (held in resized)
    # each trial lengthened by some amounts, or None where the op refused it, by (ids of
    # the trials lengthening reads, id of the trial, amounts); the trials are held
    lengthened: dict[tuple, tuple[list[Trial], Trial, Trial | None]] = field(default_factory=dict)
    # the local outputs of a group's shards on a trial cut by a split (Shards._locals), by
    # (group, id of the trial, split); the trial is held
    locals: dict[tuple, tuple[Trial, Any]] = field(default_factory=dict)
    placements: dict[tuple, tuple] = field(default_factory=dict)  # by (group, input count)
    unread: list[int] | None = None  # inputs no output reads (_unread_inputs)
    # the outputs no combine rebuilt where a group failed on a trial cut by a split
    # (Shards._valid_combines), by (group, id of the trial, split); the trial is held in locals
    failed: dict[tuple, frozenset[int]] = field(default_factory=dict)
    readers: dict[int, frozenset[int]] = field(default_factory=dict)  # by input (_readers)
    # cut dims whose shards the case refused by shape (ShapeRefused) on a trial cut by a
    # split, by ``refusal_key``; the trial is held in locals
    refused: set[tuple] = field(default_factory=set)
    # what is worked out of tensors the search holds (shards of a trial's inputs, whether
    # they differ, whether a leaf is flat along a dim, a Partial input's parts), by a key
    # of their ids: pure functions of those values, asked again by group after group
    derived: dict[tuple, tuple[Any, Any]] = field(default_factory=dict)

    def keep(self, key: tuple, held: Any, make: Callable[[], Any]) -> Any:
        """``make()`` once per ``key``; ``held`` (the objects whose ids ``key`` names) is kept
        beside the value, so that no other object takes those ids while the memo lives."""
        if not self.holds_values:
            return make()
        hit = self.derived.get(key)
        if hit is None:
            hit = self.derived[key] = (held, make())
        return hit[1]


def refusal_key(dims: tuple, trial: Trial, split: Any) -> tuple:
    """The key of ``Memo.refused``: a group's cut dims on a trial cut by a split."""
    return (dims, id(trial), split)


def flat_along(ops: TensorOps, x: Any, d: int) -> bool:
    """x is the same along dim d: each element equals the next one along it."""
    size = ops.shape(x)[d]
    return size >= 2 and ops.close(ops.narrow(x, d, 0, size - 1), ops.narrow(x, d, 1, size - 1))


def one_values(ops: TensorOps, outputs: Sequence[Any]) -> tuple | None:
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


def bitwise_equal(ops: TensorOps, a: Any, b: Any) -> bool:
    """The same shape and values, NaN where the other has NaN; False where numpy cannot read them."""
    try:
        x, y = ops.to_numpy(a), ops.to_numpy(b)
    except Exception:
        return False
    return x.shape == y.shape and bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))


def error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}".strip()
    text = re.sub(r"(?:[A-Za-z]:)?(?:/[\w.+-]+){2,}/?", "<path>", text)  # no machine paths in the registry
    return text[:200]


# Ops with no tensor input (factories: full, arange, scalar_tensor): nothing to shard; the
# determinism check in Explorer.run guarantees every rank computes the same, replicated output.
NO_TENSOR_INPUT = "no tensor input: nothing to shard; every rank computes the same output (replicate)"


FOLLOW_ROOM = 6  # a short plain dim beside a follower is lengthened to this: three shards of 2


def halo_room(halo: int) -> int:
    """The shortest dim whose three equal shards each keep one element no halo reaches."""
    return 3 * (halo + 1)


def cuts_a_dim(entry: RuleEntry) -> bool:
    """Has the entry a strategy that shards an input dim, and outputs with elements?"""
    return (entry.status in ("ok", "derived") and bool(entry.shard.labels())
            and not any(0 in r.shape for r in entry.results))


def picks_by_order(c) -> bool:
    """Does combine ``c`` pick values or positions by order (max, min, argmax, argmin)?"""
    return c in (Reduce("max"), Reduce("min")) or isinstance(c, ArgReduce)


def reduces_values(c) -> bool:
    """Does combine ``c`` reduce the shards' values (sum, avg, max, argmax, ...)?"""
    return isinstance(c, (Reduce, ArgReduce))


def order_dependent(c) -> bool:
    """A combine that depends on the order of the shards beyond a plain gather."""
    return isinstance(c, (Scan, GatherPositions)) or (isinstance(c, Gather) and c.reverse)


def no_strategy(ranks) -> Tables:
    return Tables(ShardSpec(tuple((N,) * r for r in ranks)), PartialSpec(tuple(() for _ in ranks)), CombineSpec(()))


def fit_partial(group: Group, combines) -> list:
    """The combines worth trying for an output of ``group``: op(x1 + x2) can only be
    op(x1) + op(x2) (linear) or op(x) (independent of that input); anything else that
    passes with a Partial input is luck on the data."""
    if group.partial:
        return [c for c in combines if c in (Reduce(group.partial_op), Identity())]
    return list(combines)


def group_of(placements: Sequence[InputPlacement]) -> Group:
    dims = tuple((i, p.dim, p.halo) for i, p in enumerate(placements) if isinstance(p, ShardIn) and not p.follows)
    local = any(isinstance(p, ShardIn) and p.local and not p.follows for p in placements)
    follow = tuple((i, p.dim, p.scale, p.extend, p.local) for i, p in enumerate(placements)
                   if isinstance(p, ShardIn) and p.follows)
    partial = tuple(i for i, p in enumerate(placements) if isinstance(p, PartialInput))
    ops = {p.op for p in placements if isinstance(p, PartialInput)}
    if len(ops) > 1:
        raise ValueError(f"one Partial op per strategy, not {sorted(ops)}")
    return Group(dims, partial, follow=follow, partial_op=ops.pop() if ops else "sum", local=local)


def even_gather(c) -> bool:
    """A gather that holds on even cuts only (``Gather.even``)."""
    return isinstance(c, Gather) and c.even


def even_counts(sizes: Sequence[int]) -> list[int]:
    """The shard counts an even rule cutting dims of ``sizes`` is verified on (see
    MAX_EVEN_COUNTS): 2 and 4 first where they divide."""
    common = int(np.gcd.reduce(np.array(sizes, dtype=np.int64))) if sizes else 0
    divisors = [n for n in range(2, common + 1) if common % n == 0]
    first = [n for n in (2, 4) if n in divisors]
    counts = first + [n for n in divisors if n not in first][: max(0, MAX_EVEN_COUNTS - len(first))]
    return counts + ([common] if divisors and common not in counts else [])


def sized_gather(c) -> bool:
    """A gather whose amount (block count, halo, overlap) is read off sizes."""
    return isinstance(c, Gather) and (c.block > 1 or c.halo or c.halo_end or c.overlap)


def halo_gathers_only(outs: Sequence[OutputCombine]) -> bool:
    return all(isinstance(c, Gather) and (c.halo or c.halo_end) for o in outs for c in o.options)


def example_value(ops: TensorOps, x: Any) -> Any:
    if ops.is_tensor(x):
        return TensorArg(tuple(ops.shape(x)), ops.dtype_name(x))
    if isinstance(x, (list, tuple)):
        return tuple(example_value(ops, y) for y in x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return object_text(x)


def example_of(ops: TensorOps, case: OpCase) -> Example:
    return Example(tuple((name, example_value(ops, v)) for name, v in arg_items(case.arg_names, case.args, case.kwargs)))
