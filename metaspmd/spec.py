"""The rule model: shard labels, combine functions and strategies, in paper notation.

Every class is a frozen dataclass whose ``str`` is its paper-notation form and whose
``parse`` inverts it exactly (``parse(str(x)) == x``). These strings are what the YAML
registry stores, what reviewers read and what codegen validates against.

    shard:   [[S1, S2], [S2, S3]]                       (ShardSpec: per input, per dim)
    partial: [[], [], [S2(sum)]]                        (PartialSpec: per input)
    combine: {S1: gather(dim=0), S2: reduce(sum), ...}  (CombineSpec: per strategy label)
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import ClassVar, Iterator, Mapping, Sequence, Union

# norm2: the 2-norm of the local outputs, sqrt(sum of squares) (DTensor's _NormPartial(2));
# xor: bitwise exclusive or of integer or bool outputs (jax's reduce_xor).
REDUCE_OPS = ("sum", "max", "min", "prod", "avg", "norm2", "xor")
# the associative ops a prefix scan carries across shards (cumsum, cumprod, cummax, cummin,
# logcumsumexp)
SCAN_OPS = ("sum", "prod", "max", "min", "logsumexp")
# input Partial states the explorer searches for: sum, and prod beside a cut group where no
# sum holds (scatter-mul into an operand every shard would multiply)
PARTIAL_OPS = ("sum", "prod")

# numbers of at most 9 digits: a longer one is refused as a bad spec, not left to int()
_LABEL = r"S[1-9][0-9]{0,8}"
_LABEL_RE = re.compile(rf"^{_LABEL}$")
_DIM_RE = re.compile(rf"^({_LABEL})(?:\((.+)\))?$")
_DIM_ARG_RE = re.compile(r"^(halo|scale|extend)=([1-9][0-9]{0,8})$|^(local)$")
_PARTIAL_RE = re.compile(rf"^({_LABEL})\(([a-z][a-z0-9]*)\)$")
_GATHER_RE = re.compile(
    r"^gather\(dim=(0|[1-9][0-9]{0,8})"
    r"(?:, halo=(?:([1-9][0-9]{0,8})|\((0|[1-9][0-9]{0,8}), (0|[1-9][0-9]{0,8})\)))?"
    r"(?:, block=([2-9]|[1-9][0-9]{1,8}))?(?:, overlap=([1-9][0-9]{0,8}))?(, reverse=true)?(, even=true)?\)$"
)
_REDUCE_RE = re.compile(r"^reduce\(([a-z][a-z0-9]*)\)$")
_SCAN_RE = re.compile(r"^scan\(dim=(0|[1-9][0-9]{0,8}), op=([a-z][a-z0-9]*)(, reverse=true)?\)$")
_ARG_REDUCE_RE = re.compile(r"^argreduce\(([a-z]+), input=(0|[1-9][0-9]{0,8})\)$")
_POSITIONS_RE = re.compile(r"^gather\(dim=(0|[1-9][0-9]{0,8}), positions(?:=(0|[1-9][0-9]{0,8}))?\)$")
ARG_REDUCE_OPS = ("max", "min")


class SpecError(ValueError):
    """A string or structure that is not valid paper notation."""


def check_label(label: str) -> str:
    if not isinstance(label, str) or not _LABEL_RE.match(label):
        raise SpecError(f"bad strategy label {label!r} (expected S<j>, j >= 1)")
    return label


def label_number(label: str) -> int:
    return int(check_label(label)[1:])


# --------------------------------------------------------------------------- combine


@dataclass(frozen=True)
class Gather:
    """Concatenate the local outputs along ``dim``.

    ``halo``: each local output carries ``halo`` extra elements at every internal shard
    boundary (convolution with padding); they are dropped before concatenating. Where the
    two sides differ (``halo=(1, 0)``: a window of 2 reads one element past its shard;
    ``pad`` adds its low and high padding on every shard), ``halo`` is dropped from the
    start of every shard but the first and ``halo_end`` from the end of every shard but
    the last; ``halo_end`` defaults to ``halo``.
    ``block``: each local output is ``block`` equal blocks (concat of ``block`` inputs);
    the global output is block 0 of every shard, then block 1 of every shard, and so on.
    ``reverse``: the last shard's output comes first (``rev``/``flip`` of a cut dim): Shard(dim)
    after one collective permute, which Shardy calls a permutation factor.
    ``overlap``: each shard's output starts ``overlap`` elements before the previous one
    ends, and the overlapping elements are summed (a transposed convolution or a pooling
    backward whose windows cross a shard boundary): Shard(dim) after each rank adds the
    tail it sends to the next rank, one neighbour exchange.
    ``even``: a plain concatenation that holds only where every dim the strategy cuts, the
    inputs' and this output's ``dim``, divides by the shard count (a reshape that splits a
    cut dim: [8, 256] as [8, 4, 64] cut along its 256 keeps whole heads only where the
    shard count divides 4). Shard(dim) to a planner that cuts every dim evenly, nothing to
    a table consulted for any shape.
    """

    dim: int
    halo: int = 0
    block: int = 1
    halo_end: int | None = None
    reverse: bool = False
    overlap: int = 0
    even: bool = False

    def __post_init__(self) -> None:
        if self.halo_end is None:
            object.__setattr__(self, "halo_end", self.halo)
        if self.dim < 0 or self.halo < 0 or self.halo_end < 0 or self.block < 1 or self.overlap < 0:
            raise SpecError(f"bad gather(dim={self.dim}, halo=({self.halo}, {self.halo_end}), block={self.block}, "
                            f"overlap={self.overlap})")
        if self.reverse and (self.halo or self.halo_end or self.block > 1):
            raise SpecError(f"a reversed gather(dim={self.dim}) takes no halo or block")
        if self.overlap and (self.halo or self.halo_end or self.block > 1 or self.reverse):
            raise SpecError(f"an overlapping gather(dim={self.dim}) takes no halo, block or reverse")
        if self.even and (self.halo or self.halo_end or self.block > 1 or self.reverse or self.overlap):
            raise SpecError(f"an even gather(dim={self.dim}) is a plain concatenation: no halo, block, overlap or "
                            "reverse")

    @property
    def plain(self) -> bool:
        """A plain concatenation on any split: what Shard(dim) means to DTensor and jax."""
        return (self.halo == 0 and self.halo_end == 0 and self.block == 1 and not self.reverse
                and not self.overlap and not self.even)

    def __str__(self) -> str:
        if self.halo == self.halo_end:
            halo = f", halo={self.halo}" if self.halo else ""
        else:
            halo = f", halo=({self.halo}, {self.halo_end})"
        block = f", block={self.block}" if self.block > 1 else ""
        overlap = f", overlap={self.overlap}" if self.overlap else ""
        return (f"gather(dim={self.dim}{halo}{block}{overlap}" + (", reverse=true" if self.reverse else "")
                + (", even=true)" if self.even else ")"))


@dataclass(frozen=True)
class Reduce:
    """Reduce the local outputs elementwise (the output is Partial(op))."""

    op: str

    def __post_init__(self) -> None:
        if self.op not in REDUCE_OPS:
            raise SpecError(f"bad reduce op {self.op!r} (expected one of {', '.join(REDUCE_OPS)})")

    def __str__(self) -> str:
        return f"reduce({self.op})"


@dataclass(frozen=True)
class Identity:
    """Every shard already holds the global output (the output is Replicate)."""

    def __str__(self) -> str:
        return "identity"


@dataclass(frozen=True)
class Scan:
    """A prefix scan along ``dim`` (``cumsum``, ``cummax``, ``logcumsumexp`` of a cut dim):
    each shard's local scan is folded by ``op`` with the carry of the shards before it (the
    last slice of their combined output), then gathered. ``reverse`` scans from the end: the
    carry comes from the shards after it (their first slice). No framework placement says
    this; at run time it is one exchange of a slice per shard, not a gather of the dim.
    """

    dim: int
    op: str
    reverse: bool = False

    def __post_init__(self) -> None:
        if self.dim < 0 or self.op not in SCAN_OPS:
            raise SpecError(f"bad scan(dim={self.dim}, op={self.op}) (op one of {', '.join(SCAN_OPS)})")

    def __str__(self) -> str:
        return f"scan(dim={self.dim}, op={self.op}" + (", reverse=true)" if self.reverse else ")")


@dataclass(frozen=True)
class ArgReduce:
    """The position of the max (or min) of tensor input ``input`` along its cut dim
    (argmax, the indices of max.dim): each shard's local position plus the shard's start,
    taken from the shard whose value there wins; the lowest shard on ties and NaN above
    every number, as argmax takes the first. The local outputs alone cannot decide it: at
    run time the ranks all-reduce (value, position) pairs, which is how Shardy partitions
    jax's argmax. No DTensor Partial says this.
    """

    op: str
    input: int

    def __post_init__(self) -> None:
        if self.op not in ARG_REDUCE_OPS or self.input < 0:
            raise SpecError(f"bad argreduce({self.op}, input={self.input}) (op one of {', '.join(ARG_REDUCE_OPS)})")

    def __str__(self) -> str:
        return f"argreduce({self.op}, input={self.input})"


@dataclass(frozen=True)
class GatherPositions:
    """Concatenate along ``dim`` local outputs that hold positions along the cut dim
    (``nonzero``'s row numbers): each shard's positions, in element ``component`` of the
    last dim (every element where None), move by the shard's start first. The output's
    length depends on the data, so no framework placement says this.
    """

    dim: int
    component: int | None = None

    def __post_init__(self) -> None:
        if self.dim < 0 or (self.component is not None and self.component < 0):
            raise SpecError(f"bad gather(dim={self.dim}, positions={self.component})")

    def __str__(self) -> str:
        positions = "positions" if self.component is None else f"positions={self.component}"
        return f"gather(dim={self.dim}, {positions})"


Combine = Union[Gather, Reduce, Identity, Scan, ArgReduce, GatherPositions]


def parse_combine(text: str) -> Combine:
    if not isinstance(text, str):
        raise SpecError(f"combine must be a string, got {text!r}")
    s = text.strip()
    if s == "identity":
        return Identity()
    m = _GATHER_RE.match(s)
    if m:
        if m[3] is not None:
            if m[3] == m[4]:  # one spelling per combine: equal sides are written halo=H
                raise SpecError(f"bad combine {text!r} (write halo={m[3]} for equal sides)")
            return Gather(int(m[1]), int(m[3]), int(m[5] or 1), int(m[4]), reverse=bool(m[7]), overlap=int(m[6] or 0),
                          even=bool(m[8]))
        return Gather(int(m[1]), int(m[2] or 0), int(m[5] or 1), reverse=bool(m[7]), overlap=int(m[6] or 0),
                      even=bool(m[8]))
    m = _REDUCE_RE.match(s)
    if m:
        return Reduce(m[1])
    m = _SCAN_RE.match(s)
    if m:
        return Scan(int(m[1]), m[2], bool(m[3]))
    m = _ARG_REDUCE_RE.match(s)
    if m:
        return ArgReduce(m[1], int(m[2]))
    m = _POSITIONS_RE.match(s)
    if m:
        return GatherPositions(int(m[1]), None if m[2] is None else int(m[2]))
    raise SpecError(
        f"bad combine {text!r} (expected gather(dim=D[, halo=H | halo=(H, H2)][, block=B][, overlap=K][, reverse=true]"
        "[, even=true]), "
        "gather(dim=D, positions[=C]), reduce(OP), scan(dim=D, op=OP[, reverse=true]), argreduce(OP, input=I) or identity)"
    )


def combine_order(c: Combine) -> tuple:
    """A total order on combines, for deterministic output."""
    if isinstance(c, Gather):
        return (0, c.dim, c.halo, c.halo_end, c.block, c.reverse, c.overlap, c.even)
    if isinstance(c, Identity):  # Replicate output: cheaper for a planner than Partial
        return (1, 0, 0, 0, 0, 0, 0)
    if isinstance(c, Scan):  # no placement: last
        return (3, c.dim, 0, 0, 0, c.reverse, SCAN_OPS.index(c.op))
    if isinstance(c, ArgReduce):
        return (4, c.input, 0, 0, 0, 0, ARG_REDUCE_OPS.index(c.op))
    if isinstance(c, GatherPositions):  # no placement either
        return (5, c.dim, -1 if c.component is None else c.component, 0, 0, 0, 0)
    return (2, 0, 0, 0, 0, 0, REDUCE_OPS.index(c.op))


@dataclass(frozen=True)
class OutputCombine:
    """The valid combines of one output under one strategy (alternatives, any one works)."""

    options: tuple[Combine, ...]

    def __post_init__(self) -> None:
        if not self.options:
            raise SpecError("an output needs at least one combine")
        if len(set(self.options)) != len(self.options):
            raise SpecError(f"duplicate combine in {self}")

    @property
    def first(self) -> Combine:
        return self.options[0]

    def __str__(self) -> str:
        return " | ".join(str(c) for c in self.options)

    @classmethod
    def parse(cls, text: str) -> "OutputCombine":
        if not isinstance(text, str):
            raise SpecError(f"combine must be a string, got {text!r}")
        return cls(tuple(parse_combine(p) for p in text.split("|")))

    @classmethod
    def of(cls, options) -> "OutputCombine":
        return cls(tuple(sorted(set(options), key=combine_order)))


# --------------------------------------------------------------------------- shard


class _HowCut:
    """What DimLabel and ShardIn share: a dim cut by its own length, with a halo, or in
    proportion to the strategy's plain cut; ``local``: the op's params re-based to it."""

    halo: int
    scale: int
    extend: int
    local: bool

    @property
    def follows(self) -> bool:
        """Cut in proportion to the strategy's plain dims, not by its own length."""
        return self.scale != 1 or self.extend != 0

    @property
    def plain(self) -> bool:
        """Shard(dim) as DTensor and jax mean it."""
        return not self.halo and not self.follows and not self.local


@dataclass(frozen=True)
class DimLabel(_HowCut):
    """One input dim: not sharded (``N``) or sharded by strategy ``S<j>``, with an input halo.

    A halo rule is claimed for shards longer than the halo, the only ones it is verified on
    (a shard of one element with a halo of one may keep no output of its own).

    ``scale`` and ``extend``: the dim is cut where the label's plain dims are, in proportion
    (``S1(scale=2, extend=1)``: a shard [a, a + n) of those becomes [2a, 2a + 2n + 1) here).
    A window op's operand follows its per-window input so (``select_and_scatter``'s source
    and operand; a pooling backward's gradient and input): ``scale`` is the window stride,
    ``extend`` how far the last window of a shard reaches past its stride.

    ``local`` (``S1(local)``): each shard runs the op with the params that name positions
    along this dim re-based to its own part (``OpCase.localize``). On a plain cut, a slice
    keeps the part of its range the shard holds, a split the part of each piece, an unstack
    the pieces it holds (zeros for the others). The local outputs are uneven (a shard may
    hold none of a slice), so the output is Shard(dim) only after data moves between
    shards: what Shardy calls a permutation factor. On a proportional cut
    (``S1(extend=1, local)``), the proportion is to the dim as the op pads it
    (``OpCase.padding``): a shard's range may reach past the dim's ends, and the op pads
    only that part (select_and_scatter_add with padding: the outer shards pad, the inner
    ones read their neighbours' elements instead). The JAX runtime plans with a local
    plain cut whose outputs gather (Shardy evens the pieces out); DTensor cannot."""

    label: str | None = None
    halo: int = 0
    scale: int = 1
    extend: int = 0
    local: bool = False

    def __post_init__(self) -> None:
        if self.label is None:
            if self.halo or self.scale != 1 or self.extend or self.local:
                raise SpecError("an unsharded dim cannot carry a halo, scale, extend or local params")
        else:
            check_label(self.label)
            if self.halo < 0 or self.scale < 1 or self.extend < 0:
                raise SpecError(f"bad halo {self.halo}, scale {self.scale} or extend {self.extend}")
            if self.halo and self.follows:
                raise SpecError(f"{self.label}: a halo with a scale or extend")
            if self.local and self.halo:
                raise SpecError(f"{self.label}: local params with a halo")

    def __str__(self) -> str:
        if self.label is None:
            return "N"
        args = ([f"halo={self.halo}"] if self.halo else []) + ([f"scale={self.scale}"] if self.scale != 1 else []) + (
            [f"extend={self.extend}"] if self.extend else []) + (["local"] if self.local else [])
        return f"{self.label}({', '.join(args)})" if args else self.label

    @classmethod
    def parse(cls, text: str) -> "DimLabel":
        if text == "N":
            return cls()
        m = _DIM_RE.match(text) if isinstance(text, str) else None
        args: dict = {}
        for item in m[2].split(", ") if m and m[2] else ():
            a = _DIM_ARG_RE.match(item)
            if not a or (a[1] or a[3]) in args:
                m = None
                break
            args[a[1] or a[3]] = int(a[2]) if a[1] else True
        label = cls(m[1], **args) if m else None
        if label is None or str(label) != text:  # one spelling: arguments in order, none at its default
            raise SpecError(f"bad dim label {text!r} (expected N, S<j>, S<j>(halo=H) or S<j>(scale=K, extend=E, "
                            "local) with any of the three)")
        return label


N = DimLabel()


def _split_top(text: str) -> list[str]:
    """Split 'a, [b, c], d' at top-level commas."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail or parts:
        parts.append(tail)
    return parts


def _parse_nested(text: str, what: str) -> list[list[str]]:
    s = text.strip() if isinstance(text, str) else ""
    if not (s.startswith("[") and s.endswith("]")):
        raise SpecError(f"bad {what} {text!r}")
    out = []
    for item in _split_top(s[1:-1]):
        if not (item.startswith("[") and item.endswith("]")):
            raise SpecError(f"bad {what} {text!r}")
        out.append([p for p in _split_top(item[1:-1])])
    return out


@dataclass(frozen=True)
class ShardSpec:
    """Per tensor input, per dim: its label. Dims sharing a label are sharded together."""

    inputs: tuple[tuple[DimLabel, ...], ...]

    def __post_init__(self) -> None:
        for i, dims in enumerate(self.inputs):
            labels = [d.label for d in dims if d.label]
            if len(labels) != len(set(labels)):
                raise SpecError(f"input {i} uses one label on two dims: {self}")
        every = [d for dims in self.inputs for d in dims]
        for label in {d.label for d in every if d.follows}:
            if not any(d.label == label and d.plain for d in every):
                raise SpecError(f"{label} cuts dims in proportion but none plainly, which they would follow: {self}")

    def __str__(self) -> str:
        return "[" + ", ".join("[" + ", ".join(str(d) for d in dims) + "]" for dims in self.inputs) + "]"

    @classmethod
    def parse(cls, text: str) -> "ShardSpec":
        return cls(tuple(tuple(DimLabel.parse(d) for d in dims) for dims in _parse_nested(text, "shard spec")))

    def labels(self) -> set[str]:
        return {d.label for dims in self.inputs for d in dims if d.label}


@dataclass(frozen=True)
class PartialIn:
    """An input that is Partial(op) under strategy ``label``: ``S2(sum)``."""

    label: str
    op: str = "sum"

    def __post_init__(self) -> None:
        check_label(self.label)
        if self.op not in REDUCE_OPS:
            raise SpecError(f"bad partial op {self.op!r}")

    def __str__(self) -> str:
        return f"{self.label}({self.op})"

    @classmethod
    def parse(cls, text: str) -> "PartialIn":
        m = _PARTIAL_RE.match(text) if isinstance(text, str) else None
        if not m or m[2] not in PARTIAL_OPS:  # the Partial states the explorer searches, and writes
            raise SpecError(f"bad partial input {text!r} (expected S<j>(op), op one of {', '.join(PARTIAL_OPS)})")
        return cls(m[1], m[2])


class _PerInput:
    """A table of labelled items per tensor input (``[[S2(sum)], []]``); ``ITEM`` parses one."""

    inputs: tuple
    ITEM: ClassVar[type]

    def __str__(self) -> str:
        return "[" + ", ".join("[" + ", ".join(str(x) for x in xs) + "]" for xs in self.inputs) + "]"

    @classmethod
    def parse(cls, text: str):
        name = cls.__name__.replace("Spec", "").lower()
        return cls(tuple(tuple(cls.ITEM.parse(x) for x in xs) for xs in _parse_nested(text, f"{name} spec")))

    def labels(self) -> set[str]:
        return {x.label for xs in self.inputs for x in xs}

    def is_empty(self) -> bool:
        return not any(self.inputs)


@dataclass(frozen=True)
class PartialSpec(_PerInput):
    """Per tensor input: the strategies under which that input is Partial."""

    inputs: tuple[tuple[PartialIn, ...], ...]
    ITEM: ClassVar[type] = PartialIn


# what follows an offset's name: nothing, (component), (drop) or (component, drop)
_OFFSET_ARGS = r"(?:\((?:(0|[1-9][0-9]{0,8})|(drop)|(0|[1-9][0-9]{0,8}), (drop))\))?"
_OFFSET_RE = re.compile(rf"^({_LABEL}){_OFFSET_ARGS}$")
_INDEX_OFFSET_RE = re.compile(rf"^O{_OFFSET_ARGS}$")


def _offset_args(component: int | None, drop: bool) -> str:
    args = ([] if component is None else [str(component)]) + (["drop"] if drop else [])
    return f"({', '.join(args)})" if args else ""


def _offset_parsed(m: re.Match, first: int) -> tuple[int | None, bool]:
    """(component, drop) from the _OFFSET_ARGS groups of ``m``, from group ``first`` on."""
    component = m[first] if m[first] is not None else m[first + 2]
    return None if component is None else int(component), bool(m[first + 1] or m[first + 3])


@dataclass(frozen=True)
class OffsetIn:
    """An integer input of positions along the dim that strategy ``label`` cuts (gather and
    scatter indices): each shard subtracts its start from every element (``S1``) or from
    element ``component`` of the last dim, the index vector (``S1(0)``). Positions outside
    a shard then fall out of its range, and the op must drop them (scatter) or fill them
    with zeros (gather, whose outputs then sum): Shardy's and DTensor's ``_MaskPartial``
    index rewriting, verified like any rule.

    ``drop`` (``S1(drop)``, ``S1(0, drop)``): the op clamps positions into range (jax's CLIP
    gather, PROMISE_IN_BOUNDS as XLA implements it, dynamic_update_slice) or refuses them
    (torch's embedding). They are clamped first, as the op would (``OpCase.in_range``), then
    offset, and each shard runs the op's dropping form (``OpCase.dropping``), which reads
    zero at positions outside the shard or writes nothing there."""

    label: str
    component: int | None = None
    drop: bool = False

    def __post_init__(self) -> None:
        check_label(self.label)
        if self.component is not None and self.component < 0:
            raise SpecError(f"bad offset component {self.component}")

    def __str__(self) -> str:
        return self.label + _offset_args(self.component, self.drop)

    @classmethod
    def parse(cls, text: str) -> "OffsetIn":
        m = _OFFSET_RE.match(text) if isinstance(text, str) else None
        if not m:
            raise SpecError(f"bad offset input {text!r} (expected S<j>, S<j>(component), S<j>(drop) or "
                            "S<j>(component, drop))")
        return cls(m[1], *_offset_parsed(m, 2))


@dataclass(frozen=True)
class OffsetSpec(_PerInput):
    """Per tensor input: the strategies under which its positions are offset per shard."""

    inputs: tuple[tuple[OffsetIn, ...], ...]
    ITEM: ClassVar[type] = OffsetIn


@dataclass(frozen=True)
class CombineSpec:
    """Per strategy label: one OutputCombine per output."""

    by_label: tuple[tuple[str, tuple[OutputCombine, ...]], ...]

    def __post_init__(self) -> None:
        labels = [lab for lab, _ in self.by_label]
        for lab in labels:
            check_label(lab)
        if labels != sorted(labels, key=label_number) or len(set(labels)) != len(labels):
            raise SpecError(f"combine labels must be unique and sorted: {labels}")
        counts = {len(outs) for _, outs in self.by_label}
        if len(counts) > 1:
            raise SpecError(f"strategies disagree on the number of outputs: {self}")

    @classmethod
    def of(cls, mapping: Mapping[str, tuple[OutputCombine, ...]]) -> "CombineSpec":
        return cls(tuple(sorted(((k, tuple(v)) for k, v in mapping.items()), key=lambda kv: label_number(kv[0]))))

    def as_dict(self) -> dict[str, tuple[OutputCombine, ...]]:
        return dict(self.by_label)

    def __str__(self) -> str:
        def one(outs):
            return str(outs[0]) if len(outs) == 1 else "[" + ", ".join(str(o) for o in outs) + "]"

        return "{" + ", ".join(f"{lab}: {one(outs)}" for lab, outs in self.by_label) + "}"

    @classmethod
    def parse(cls, text: str) -> "CombineSpec":
        s = text.strip() if isinstance(text, str) else ""
        if not (s.startswith("{") and s.endswith("}")):
            raise SpecError(f"bad combine spec {text!r}")
        mapping = {}
        for item in _split_top(s[1:-1]):
            lab, sep, rest = item.partition(":")
            if not sep:
                raise SpecError(f"bad combine spec item {item!r}")
            rest = rest.strip()
            if rest.startswith("["):
                outs = tuple(OutputCombine.parse(p) for p in _split_top(rest[1:-1]))
            else:
                outs = (OutputCombine.parse(rest),)
            mapping[check_label(lab.strip())] = outs
        return cls.of(mapping)


# --------------------------------------------------------------------------- strategies


@dataclass(frozen=True)
class Replicate:
    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class ShardIn(_HowCut):
    """Cut along ``dim``: by its own length, with a halo, in proportion to the strategy's
    plain cut (``scale``, ``extend``), or with the op's params re-based to each shard
    (``local``); see DimLabel."""

    dim: int
    halo: int = 0
    scale: int = 1
    extend: int = 0
    local: bool = False

    def __str__(self) -> str:
        local = ", local" if self.local else ""
        if self.halo:
            return f"S({self.dim}, halo={self.halo})"
        if self.follows:
            return f"S({self.dim}, scale={self.scale}, extend={self.extend}{local})"
        return f"S({self.dim}{local})"


@dataclass(frozen=True)
class PartialInput:
    op: str = "sum"

    def __str__(self) -> str:
        return f"P({self.op})"


@dataclass(frozen=True)
class IndexOffset:
    """Whole on every shard, less the shard's start; ``drop``: the shard runs the op's
    dropping form (see OffsetIn)."""

    component: int | None = None
    drop: bool = False

    def __str__(self) -> str:
        return "O" + _offset_args(self.component, self.drop)

    @classmethod
    def parse(cls, text: str) -> "IndexOffset":
        """``O``, ``O(component)``, ``O(drop)`` or ``O(component, drop)``: what str writes."""
        m = _INDEX_OFFSET_RE.match(text) if isinstance(text, str) else None
        if not m:
            raise SpecError(f"bad index offset {text!r} (expected O, O(component), O(drop) or O(component, drop))")
        return cls(*_offset_parsed(m, 1))


InputPlacement = Union[Replicate, ShardIn, PartialInput, IndexOffset]


def drops(placements: Sequence[InputPlacement]) -> bool:
    """Do the shards run the op's dropping form (an offset marked drop)?"""
    return any(isinstance(p, IndexOffset) and p.drop for p in placements)


@dataclass(frozen=True)
class Strategy:
    """One strategy for one mesh axis: a placement per input, a combine per output."""

    label: str
    inputs: tuple[InputPlacement, ...]
    outputs: tuple[OutputCombine, ...]

    def __str__(self) -> str:
        ins = ", ".join(str(p) for p in self.inputs)
        outs = ", ".join(str(o) for o in self.outputs)
        return f"{self.label}: ({ins}) -> ({outs})"


def strategies(shard: ShardSpec, partial: PartialSpec, combine: CombineSpec,
               offset: OffsetSpec | None = None) -> Iterator[Strategy]:
    """Expand the per-dim tables into one Strategy per label."""
    for label, outs in combine.by_label:
        placements: list[InputPlacement] = []
        for i, dims in enumerate(shard.inputs):
            sharded = [ShardIn(d, lab.halo, lab.scale, lab.extend, lab.local) for d, lab in enumerate(dims) if lab.label == label]
            partials = [PartialInput(p.op) for p in (partial.inputs[i] if partial.inputs else ()) if p.label == label]
            offsets = [IndexOffset(o.component, o.drop) for o in (offset.inputs[i] if offset else ()) if o.label == label]
            placements.append(sharded[0] if sharded else partials[0] if partials else offsets[0] if offsets else Replicate())
        yield Strategy(label, tuple(placements), outs)


@dataclass(frozen=True)
class IndependentSpec:
    """Labels of the independent parts of an op: ``[[S1, S2], [S3, S4]]``.

    The outputs of a part depend on the inputs of that part only (``_foreach_add`` on a list
    of two tensors is two independent adds), so one label from each of several parts may
    share a mesh axis: their joint strategy (``joint``) holds whenever each of them does.
    An input that every part reads (``_foreach_mul.Tensor``'s one scalar tensor) is in no
    part and replicated under every part's labels; the labels that place it are in no part
    either, and take no joint.
    """

    parts: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        labels = [check_label(lab) for part in self.parts for lab in part]
        if len(labels) != len(set(labels)):
            raise SpecError(f"a label is in two independent parts: {self}")
        if len(self.parts) < 2 or not all(self.parts):
            raise SpecError(f"independent parts need two or more non-empty parts: {self}")

    def __str__(self) -> str:
        return "[" + ", ".join("[" + ", ".join(part) + "]" for part in self.parts) + "]"

    @classmethod
    def parse(cls, text: str) -> "IndependentSpec":
        return cls(tuple(tuple(check_label(x) for x in part) for part in _parse_nested(text, "independent parts")))

    def labels(self) -> set[str]:
        return {lab for part in self.parts for lab in part}


JOINT_SEPARATOR = "+"


def joint(parts: Sequence[Strategy]) -> Strategy | None:
    """One strategy of several independent labels on one mesh axis, or None when two of
    them place the same input or need the same output (they are not independent)."""
    placements: list[InputPlacement] = []
    for ps in zip(*(s.inputs for s in parts)):
        placed = [p for p in ps if not isinstance(p, Replicate)]
        if len(placed) > 1:
            return None
        placements.append(placed[0] if placed else Replicate())
    outputs: list[OutputCombine] = []
    for options in zip(*(s.outputs for s in parts)):
        # Under a label of another part an output stays whole (identity); the one label of
        # its own part says how it combines.
        owners = [o for o in options if Identity() not in o.options]
        if len(owners) > 1:
            return None
        outputs.append(owners[0] if owners else OutputCombine((Identity(),)))
    return Strategy(JOINT_SEPARATOR.join(s.label for s in parts), tuple(placements), tuple(outputs))


def joint_strategies(singles: Sequence[Strategy], independent: IndependentSpec | None, limit: int) -> list[Strategy]:
    """Joint strategies: one label (or none) from each independent part, two or more in all,
    in a fixed order, at most ``limit`` of them."""
    if independent is None:
        return []
    by_label = {s.label: s for s in singles}
    choices = [[None] + [by_label[lab] for lab in part if lab in by_label] for part in independent.parts]
    out: list[Strategy] = []
    for combo in itertools.product(*choices):
        chosen = [s for s in combo if s is not None]
        if len(chosen) < 2:
            continue
        s = joint(chosen)
        if s is not None:
            out.append(s)
            if len(out) >= limit:
                break
    return out


@dataclass(frozen=True)
class Group:
    """What the explorer tries as one strategy: sharded (input, dim, halo) and partial inputs."""

    dims: tuple[tuple[int, int, int], ...] = ()  # (input index, dim, input halo)
    partial: tuple[int, ...] = ()  # input indices split into random parts that reduce by partial_op
    partial_op: str = "sum"
    offset: tuple[tuple[int, int | None], ...] = ()  # (input index, component): IndexOffset
    drop: bool = False  # the offsets run the op's dropping form (OffsetIn.drop)
    local: bool = False  # the shards run the op with params re-based to them (DimLabel.local)
    # (input index, dim, scale, extend, local): cut where dims[0] is, in proportion (see DimLabel)
    follow: tuple[tuple[int, int, int, int, bool], ...] = ()

    def placements(self, n_inputs: int) -> tuple[InputPlacement, ...]:
        out: list[InputPlacement] = [Replicate()] * n_inputs
        for i, d, h in self.dims:
            out[i] = ShardIn(d, h, local=self.local)
        for i, d, scale, extend, local in self.follow:
            out[i] = ShardIn(d, 0, scale, extend, local)
        for i in self.partial:
            out[i] = PartialInput(self.partial_op)
        for i, component in self.offset:
            out[i] = IndexOffset(component, self.drop)
        return tuple(out)


@dataclass(frozen=True)
class Layer:
    """Strategies in per-dim tables, at most one label per dim: an entry's first tables, or
    one of its further layers (``RuleEntry.more``) for strategies that cut a dim the tables
    before already label."""

    shard: ShardSpec
    partial: PartialSpec
    combine: CombineSpec
    offset: OffsetSpec | None = None  # None when no strategy offsets an input

    def strategies(self) -> Iterator[Strategy]:
        return strategies(self.shard, self.partial, self.combine, self.offset)

    def labels(self) -> set[str]:
        return {label for label, _ in self.combine.by_label}


def layer_problem(layer: Layer) -> tuple[str, str] | None:
    """What is wrong with ``layer`` as a whole, as (the table to blame, why), or None: a
    label giving one input two placements (a cut beside its Partial or offset, a Partial
    beside its offset: ``strategies`` would keep one and drop the other without a word), a
    label placing inputs without a combine, or a combine label nothing places."""
    for i, row in enumerate(layer.shard.inputs):
        cut = {d.label for d in row}
        parts = {x.label for x in layer.partial.inputs[i]} if layer.partial.inputs else set()
        offsets = {x.label for x in layer.offset.inputs[i]} if layer.offset else set()
        for what, both, how in (("partial", parts & cut, "cuts that input"), ("offset", offsets & cut, "cuts that input"),
                                ("offset", offsets & parts, "makes that input Partial")):
            if both:
                label = min(both, key=label_number)
                return what, f"{what} input {i}: {label} {how} too, and an input takes one placement per label"
    used = layer.shard.labels() | layer.partial.labels()
    combined = set(layer.combine.as_dict())
    if used - combined:
        return "shard", f"label {min(used - combined, key=label_number)} has no combine"
    if combined - used:
        return "combine", f"unknown label {min(combined - used, key=label_number)}: no input is sharded or partial under it"
    return None


@dataclass(frozen=True)
class Tables(Layer):
    """One entry's strategies in paper notation: the first layer, and further layers for
    strategies that cut a dim the first already labels."""

    more: tuple[Layer, ...] = ()

    def strategies(self) -> Iterator[Strategy]:
        """One strategy per label, every layer's."""
        yield from Layer.strategies(self)
        for layer in self.more:
            yield from layer.strategies()


def tables_from_strategies(
    ranks: tuple[int, ...], found: list[tuple[tuple[InputPlacement, ...], tuple[OutputCombine, ...]]]
) -> Tables:
    """Pack found strategies into paper-notation tables, labels S1, S2, ... in order.

    Strategies take the first layer where none of their cut dims is labelled yet, so a dim
    cut by several strategies (``_foreach`` ops: every tensor of a list, or one alone) keeps
    them all; labels run through the first layer, then each further one, in reading order.
    """
    def reading_order(item) -> tuple:
        # Label in the order a reader scans the table: input by input, dim by dim; Partial-only last.
        placements = item[0]
        first = [(i, p.dim) for i, p in enumerate(placements) if isinstance(p, ShardIn)]
        partial_at = [i for i, p in enumerate(placements) if isinstance(p, PartialInput)]
        offset_at = [(i, -1 if p.component is None else p.component, p.drop)
                     for i, p in enumerate(placements) if isinstance(p, IndexOffset)]
        return (0, first[0], partial_at, offset_at) if first else (1, (0, 0), partial_at, offset_at)

    taken: list[set[tuple[int, int]]] = []  # per layer: the (input, dim) pairs it labels
    by_layer: list[list] = []
    for placements, outs in sorted(found, key=reading_order):
        cuts = {(i, p.dim) for i, p in enumerate(placements) if isinstance(p, ShardIn)}
        k = next((k for k, t in enumerate(taken) if not t & cuts), len(taken))
        if k == len(taken):
            taken.append(set())
            by_layer.append([])
        taken[k] |= cuts
        by_layer[k].append((placements, outs))
    layers: list[Layer] = []
    n = 0
    for items in by_layer or [[]]:
        layers.append(_layer(ranks, items, n))
        n += len(items)
    first = layers[0]
    return Tables(first.shard, first.partial, first.combine, first.offset, more=tuple(layers[1:]))


def _layer(ranks: tuple[int, ...], items: list, n: int) -> Layer:
    """One layer of strategies none of which cut a dim another cuts, labels S<n+1>, S<n+2>, ..."""
    dims: list[list[DimLabel]] = [[N] * r for r in ranks]
    partial: list[list[PartialIn]] = [[] for _ in ranks]
    offset: list[list[OffsetIn]] = [[] for _ in ranks]
    combine: dict[str, tuple[OutputCombine, ...]] = {}
    for j, (placements, outs) in enumerate(items):
        label = f"S{n + j + 1}"
        for i, p in enumerate(placements):
            if isinstance(p, ShardIn):
                dims[i][p.dim] = DimLabel(label, p.halo, p.scale, p.extend, p.local)
            elif isinstance(p, PartialInput):
                partial[i].append(PartialIn(label, p.op))
            elif isinstance(p, IndexOffset):
                offset[i].append(OffsetIn(label, p.component, p.drop))
        combine[label] = outs
    return Layer(
        ShardSpec(tuple(tuple(d) for d in dims)),
        PartialSpec(tuple(tuple(p) for p in partial)),
        CombineSpec.of(combine),
        OffsetSpec(tuple(tuple(o) for o in offset)) if any(offset) else None,
    )


__all__ = [
    "Combine", "CombineSpec", "DimLabel", "Gather", "GatherPositions", "Group", "Identity", "IndependentSpec", "IndexOffset", "InputPlacement",
    "N", "OffsetIn", "OffsetSpec", "OutputCombine", "PartialIn", "PartialInput", "PartialSpec", "REDUCE_OPS", "Reduce",
    "Layer", "Replicate", "SCAN_OPS", "Scan", "ShardIn", "ShardSpec", "SpecError", "Strategy", "Tables", "drops", "joint",
    "joint_strategies", "layer_problem",
    "parse_combine", "strategies", "tables_from_strategies",
]
