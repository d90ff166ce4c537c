"""Groups: which inputs to cut together, along which dims, with which Partial inputs
beside them, positions offset per shard or dims cut in proportion."""

from __future__ import annotations

import itertools
import math
from typing import Iterator

from ..spec import Group
from ..tensor_ops import COMPLEX, FLOAT, INT
from .common import MAX_EXTEND, MAX_INDEX_VECTOR, MAX_SCALE


class Groups:
    """Enumerates the groups to explore (a part of ``Explorer``)."""

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
        sets = [p for p in self._partial_sets(sharded, parts, sharded) if not self._unmendable(group, p)]
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
        # small non-negative values. Unless no output reads the input's values at all
        # (``expand_as``'s other): then no sum of its parts can show.
        first = self.trials[0]
        summable = [i for i in self._summable_inputs(ints=True) if i not in exclude]
        ints = [i for i in summable if self.ops.dtype_kind(first.leaves[i]) == INT]
        if ints and not all(self.ops.dtype_kind(o) == INT for o in first.outputs):
            unread = set(self._unread_inputs())
            summable = [i for i in summable if i not in ints or i in unread]
        if not summable:
            return []
        if len(summable) <= self.config.max_partial_inputs:
            return [c for r in range(1, len(summable) + 1) for c in itertools.combinations(summable, r)]
        return [(i,) for i in summable] + [tuple(summable)]

    def _summable_inputs(self, ints: bool) -> list[int]:
        """The inputs a Partial(sum) may hold: float and complex data, and integers where
        ``ints``; not the fixed ones (indices, offsets)."""
        kinds = (FLOAT, COMPLEX) + ((INT,) if ints else ())
        return [i for i, x in enumerate(self.trials[0].leaves)
                if self.ops.dtype_kind(x) in kinds and self.leaf_names[i] not in self.fixed]

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
            pad = self.case.local.padding
            padded = size + sum(pad(i, d0) or (0, 0)) if self.config.local and pad else size
            out += [Group(group.dims, follow=((i, d0, scale, padded - scale * m, True),)) for scale in range(1, MAX_SCALE + 1)
                    if padded > size and 0 <= padded - scale * m <= MAX_EXTEND]
        return out

    def _localizes(self, group: Group) -> bool:
        """Has the op params to re-base along each of the group's cut dims (not padding: a
        padded dim is read past its ends, which a proportional cut's ranges say)?"""
        case, first = self.case, self.trials[0]
        if case.local.localize is None or case.randomness.random or not group.dims or group.partial or group.offset:
            return False
        if case.local.padding is not None and any(case.local.padding(i, d) for i, d, _ in group.dims):
            return False
        whole = {i: (d, 0, self.ops.shape(first.leaves[i])[d], self.ops.shape(first.leaves[i])[d]) for i, d, _ in group.dims}
        return all(h == 0 for _, _, h in group.dims) and case.local.localize(whole) is not None
