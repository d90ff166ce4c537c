"""OpCase: one op call with concrete inputs, the unit the explorer and verifier work on,
and the Backend protocol that sweeps use to list ops and build their cases."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, Sequence

from .spec import InputPlacement, OutputCombine
from .tensor_ops import TensorOps

Args = tuple[tuple, dict]


@dataclass(frozen=True)
class IndexFlags:
    """How the op treats its integer inputs: which keep their values, and what it does
    with positions out of range.

    ``fixed``: arguments that keep their example values when the verifier refills tensors
    blindly (indices, offsets). ``values``: integer arguments that are fill or init values,
    not positions (so the halo search may lengthen a dim beside them).
    ``bounds_checked``: positions out of range are dropped, filled or refused by the op, never
    read out of bounds (XLA's gather and scatter; unlike kernels that trust their indices and
    crash or read past a buffer), so the explorer may offset integer inputs by a shard's
    start. ``dropping``: the op in a form that drops positions out of range (a gather reads
    zero there), for an op that clamps them instead (jax's CLIP and PROMISE_IN_BOUNDS
    gathers); ``in_range``: the tensor leaves with the positions clamped as the op clamps
    them. An offset marked drop (OffsetIn.drop) starts from those, and its shards run the
    dropping form.
    """

    fixed: frozenset[str] = frozenset()
    values: frozenset[str] = frozenset()
    bounds_checked: bool = False
    dropping: Callable[..., Any] | None = None
    in_range: Callable[[list], list] | None = None


@dataclass(frozen=True)
class LocalParams:
    """The op's params that name positions along a dim, for rules that re-base them.

    ``localize(cuts)``: the op with the params that name positions along a cut dim re-based
    to a shard (DimLabel.local); ``cuts`` maps a tensor leaf to (dim, start, stop, size): the
    shard's part of that leaf's dim of ``size``, which reaches past its ends where the op pads
    (the ranges of a proportional cut with local params); None where the op has no such
    params there. ``padding(leaf, dim)``: (low, high), how far the op reads past that dim's
    ends (a window op's padding), or None.
    """

    localize: Callable[[Mapping[int, tuple[int, int, int, int]]], Callable[..., Any] | None] | None = None
    padding: Callable[[int, int], tuple[int, int] | None] | None = None


@dataclass(frozen=True)
class Randomness:
    """Whether the op's outputs repeat, and how a random op draws them.

    ``deterministic``: two identical calls give the same outputs (else it is not explored).
    ``random``: the op draws every output element once at random (``fn`` runs it where its
    values can be compared, e.g. in a deterministic limit): only gathers rebuild its outputs
    in distribution, and Partial inputs are not tried. ``value_free``: a random op whose
    values depend on no input's values (a fill, ``randn_like``): a Partial input is then no
    different from a replicated one, and leaves the output replicated (ranks draw a
    replicated output alike; in-place fills are not value-free, since self keeps its
    placement). ``shared_dims``: output dims along which one draw is shared (feature
    dropout draws one mask element per batch and channel, broadcast over the rest): a
    gather along one would draw it again on every rank, so none is accepted.
    """

    deterministic: bool = True
    random: bool = False
    value_free: bool = False
    shared_dims: tuple[int, ...] = ()


@dataclass(frozen=True)
class SpecialValues:
    """Inputs with values random floats never hold.

    ``special(args, kwargs, k, seed)`` returns those inputs refilled with special values
    (zeros, NaN, the call's own scalars, ...; pattern by trial ``k``): the verifier asks
    for them when plain fresh inputs leave an output constant (``isnan``, ``eq.Scalar``),
    and always where ``always``: the op treats values apart that random floats never hold.
    ``unique_consecutive`` merges equal neighbours, so a cut passes as a gather until
    neighbours across a shard boundary are equal; ``nanmean`` skips NaN, so the mean of its
    shards' means passes until their NaN counts differ.

    ``value_args``: the call's finite value arguments (a fill value, a clamp bound, a
    threshold). Random data of unit scale seldom crosses a value of 3, nor meets 0 exactly,
    and a rule true on one side of it only passed (an index cut of ``index_fill(x, 0, i,
    3.0)`` as ``reduce(max)``, a Partial ``clamp(x, min=-100)`` as a sum,
    ``hardshrink_backward``'s Partial self at ``lambd=0``): data past them and at them joins
    the trials (``Trials._scaled_trials``).
    """

    special: Callable[[tuple, dict, int, int], Args] | None = None
    always: bool = False
    value_args: tuple[float, ...] = ()


@dataclass(frozen=True)
class Sizes:
    """Which sizes the op's rules depend on, and which it takes other than the example's.

    ``widen``: the op takes any length along a dim, filled with fresh random data (no sorted
    inputs, no lengths tied to a param), so the halo search may lengthen a dim too short for
    three shards, though not beside an integer input (it may index that dim) unless
    ``IndexFlags.values`` names it. ``exact_sizes``: argument name -> the slice of its dims
    whose sizes the op's rules depend on, not only on which are 1 (a reshape maps dims by all
    of its input's; a convolution's halo is its kernel's extent): its signature spells those
    sizes out (signature.signature), so its entries, and the block counts and halos read off
    those sizes, hold for those sizes only. ``trusts_shapes``: the kernel sizes one input by
    another without checking (backward kernels), so a call with equal lengths made unequal
    is outside its contract: the explorer's lengthened trials keep them equal.
    ``value_sized``: why an output's size follows the values of the tensor leaves
    ``sized_by``, not their shapes (``bincount``'s length is its largest value plus one): a
    shard would size it from its own values, which trials holding the largest value in every
    shard cannot refute, so no rule cuts those leaves or splits them into parts ('' for none).
    ``uncut_dims``: (tensor leaf, dim) pairs no rule cuts: positions the op may be given twice
    across a cut (``max_unpool``'s indices from overlapping windows), which two shards would
    then both write, while the trials' positions are distinct.
    ``stand_in_for``: the case of the call this one stands in for at smaller sizes (live
    exploration's shrunk call), where the rules found here are checked too: at the call's
    own sizes, a position it names (``tril``'s ``diagonal=8``) may make it another op
    (``metaspmd.resolve.explore_call``).
    """

    widen: bool = False
    exact_sizes: Mapping[str, slice] = field(default_factory=dict)
    trusts_shapes: bool = False
    value_sized: str = ""
    sized_by: frozenset[int] = frozenset()
    uncut_dims: frozenset[tuple[int, int]] = frozenset()
    stand_in_for: Any = None  # OpCase | None


# The flat keywords OpCase takes and reads back, by the sub-record that holds each, and its
# name there: backends build cases from flat keywords, and ``dataclasses.replace`` passes
# them through.
_FLAT = {
    **{name: ("index", name) for name in ("fixed", "values", "bounds_checked", "dropping", "in_range")},
    **{name: ("local", name) for name in ("localize", "padding")},
    **{name: ("randomness", name) for name in ("deterministic", "random", "value_free", "shared_dims")},
    "special": ("specials", "special"), "special_always": ("specials", "always"), "value_args": ("specials", "value_args"),
    **{name: ("sizes", name) for name in ("widen", "exact_sizes", "trusts_shapes", "value_sized", "sized_by",
                                                "uncut_dims", "stand_in_for")},
}


def _flat(group: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, group), name),
                    doc=f"``{group}.{name}`` (the flat keyword of the same name).")


@dataclass(frozen=True, init=False)
class OpCase:
    """An op and one example call.

    ``fn(*args, **kwargs)`` runs the op. Tensor leaves anywhere in ``args``/``kwargs``
    (lists and tuples of tensors included) are the op's tensor inputs, in flattening order.

    ``fresh(seed)`` regenerates inputs of the same signature from the sample's own
    generator, so constrained inputs (indices, positive-definite matrices, probabilities)
    stay valid; without it, the verifier refills tensors blindly with signed random values,
    except the arguments named in ``index.fixed``, which keep their example values.

    ``candidates``: strategies to verify instead of exploring, each (input placements,
    output combines): rules derived from shape arithmetic for view-like ops (status
    ``derived``), or, where ``candidates_derived`` is False, a rule table's rules for a
    neighbouring signature (status ``ok``: verified here like any explored rule).

    ``reserve``: explored only where no earlier case of the op found a strategy (a
    backend's spare samples, after those it explores first). ``notes`` go into the entry
    as they are.

    The rest is grouped: ``index`` (IndexFlags), ``local`` (LocalParams), ``randomness``
    (Randomness), ``specials`` (SpecialValues) and ``sizes`` (Sizes). Each of their fields
    is also a keyword of the constructor and a read-only attribute under its flat name
    (``fixed``, ``localize``, ``random``, ``special_always``, ``exact_sizes``, ...); a flat
    keyword overrides that field of the sub-record passed beside it.
    """

    op: str
    fn: Callable[..., Any]
    args: tuple
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    arg_names: tuple[str, ...] = ()
    fresh: Callable[[int], Args] | None = None
    candidates: tuple[tuple[tuple[InputPlacement, ...], tuple[OutputCombine, ...]], ...] | None = None
    candidates_derived: bool = True
    reserve: bool = False
    notes: tuple[str, ...] = ()
    index: IndexFlags = IndexFlags()
    local: LocalParams = LocalParams()
    randomness: Randomness = Randomness()
    specials: SpecialValues = SpecialValues()
    sizes: Sizes = Sizes()

    def __init__(self, op: str, fn: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any] | None = None,
                 arg_names: tuple[str, ...] = (), fresh: Callable[[int], Args] | None = None, *,
                 candidates=None, candidates_derived: bool = True, reserve: bool = False, notes: tuple[str, ...] = (),
                 index: IndexFlags = IndexFlags(), local: LocalParams = LocalParams(),
                 randomness: Randomness = Randomness(), specials: SpecialValues = SpecialValues(),
                 sizes: Sizes = Sizes(), **flat: Any):
        unknown = sorted(set(flat) - set(_FLAT))
        if unknown:
            raise TypeError(f"OpCase got unexpected keyword arguments {unknown}")
        groups = {"index": index, "local": local, "randomness": randomness, "specials": specials, "sizes": sizes}
        for name, value in flat.items():
            group, field_name = _FLAT[name]
            groups[group] = replace(groups[group], **{field_name: value})
        values = dict(op=op, fn=fn, args=args, kwargs={} if kwargs is None else kwargs, arg_names=arg_names,
                      fresh=fresh, candidates=candidates, candidates_derived=candidates_derived, reserve=reserve,
                      notes=notes, **groups)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    fixed = _flat("index", "fixed")
    values = _flat("index", "values")
    bounds_checked = _flat("index", "bounds_checked")
    dropping = _flat("index", "dropping")
    in_range = _flat("index", "in_range")
    localize = _flat("local", "localize")
    padding = _flat("local", "padding")
    deterministic = _flat("randomness", "deterministic")
    random = _flat("randomness", "random")
    value_free = _flat("randomness", "value_free")
    shared_dims = _flat("randomness", "shared_dims")
    special = _flat("specials", "special")
    special_always = _flat("specials", "always")
    value_args = _flat("specials", "value_args")
    widen = _flat("sizes", "widen")
    exact_sizes = _flat("sizes", "exact_sizes")
    trusts_shapes = _flat("sizes", "trusts_shapes")
    value_sized = _flat("sizes", "value_sized")
    sized_by = _flat("sizes", "sized_by")
    uncut_dims = _flat("sizes", "uncut_dims")
    stand_in_for = _flat("sizes", "stand_in_for")

    def positions_in_range(self, leaves: list) -> list:
        """The tensor leaves as an offset marked drop starts from them."""
        in_range = self.index.in_range
        return in_range(list(leaves)) if in_range is not None else list(leaves)

    def call(self, args: tuple, kwargs: Mapping[str, Any], drop: bool = False,
             local: Mapping[int, tuple[int, int, int, int]] | None = None) -> Any:
        """The op on ``args``; ``drop``: its dropping form; ``local``: its params re-based
        to the shard that ``args`` are (the cuts of ``localize``)."""
        dropping, localize = self.index.dropping, self.local.localize
        if drop and (dropping is None or local):
            raise ValueError(f"{self.op} has no dropping form" + (" with local params" if local else ""))
        fn = dropping if drop else self.fn
        if local:
            fn = localize(local) if localize is not None else None
            if fn is None:
                raise ValueError(f"{self.op} has no params to re-base along {dict(local)}")
        return fn(*args, **kwargs)


class ShapeRefused(ValueError):
    """A case's ``fn`` refuses a call on its arguments' shapes alone, before running the op
    (a kernel that trusts matching shapes, given shards that break them): every call with
    the same shapes is refused alike, whatever the values (Partial parts, offsets)."""


class OutOfMemory(BaseException):
    """The op could not allocate what a run needs: the machine's limit (or its load), not
    the rule's. A BaseException, so that no ``except Exception`` of the explorer reads it as
    a strategy that fails, which would drop rules unsaid; a sweep keeps the op's previous
    file, as it does for an op out of time."""


# What a framework's allocator says when it fails (torch's CPU allocator and CUDA, XLA, and
# C++'s std::bad_alloc as TVM's runtime passes it on)
_OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "RESOURCE_EXHAUSTED", "std::bad_alloc")


def out_of_memory(exc: BaseException) -> bool:
    """Is ``exc`` an allocation that failed, rather than the op refusing its arguments?"""
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and any(s in str(exc) for s in _OUT_OF_MEMORY))


class NoSample(Exception):
    """The backend has no sample input for this op."""


class Skip(Exception):
    """The op is deliberately not explored; ``status`` says why (e.g. 'nondeterministic')."""

    def __init__(self, status: str, reason: str):
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class Backend(Protocol):
    """What a sweep needs from a framework backend."""

    name: str

    def tensor_ops(self) -> TensorOps: ...

    def list_ops(self) -> list[str]:
        """Every op name this backend catalogs, sorted."""

    def cases(self, op: str) -> Sequence[OpCase]:
        """Example calls of ``op``, one per distinct signature. Raises NoSample or Skip."""
