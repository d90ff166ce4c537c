"""Node strategies on a mesh, built from 1-D rule strategies (metaspmd.spec.Strategy).

A rule strategy says how to split one op over one mesh axis; ``metaspmd.target.project``
says what of it the runtime can run (``AxisStrategy``). On an N-D mesh a node strategy
picks one projected strategy per axis; applying them axis after axis (outer axis first)
is what DTensor's placements tuple means, so two axes may split the same tensor dim
(``[S(0), S(0)]``) or different ones. Combinations whose shards do not divide the tensor
(strict mode) or mix reduce ops on one tensor are dropped. The all-Replicate strategy is
always present, so every op can be placed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Sequence

from .. import spec
from ..placement import Placement, Placements, REPLICATE, Replicate, Shard, is_valid, placements_str
from ..target import DTENSOR_PLAN, AxisStrategy, Target, projections
from .mesh import Mesh

REPLICATE_LABEL = "R"


@dataclass(frozen=True)
class NodeStrategy:
    """A strategy of one node on the whole mesh: per tensor input and per output, one
    placement per mesh axis. ``label`` names the rule strategy of each axis ('S1,R').
    ``exchanges``: the mesh axes along which the node itself moves data between shards
    (a slice of a cut dim: a neighbour exchange of its output's shards)."""

    label: str
    inputs: tuple[Placements, ...]
    outputs: tuple[Placements, ...]
    exchanges: tuple[int, ...] = ()

    def __str__(self) -> str:
        ins = " ".join("[" + placements_str(p) + "]" for p in self.inputs)
        outs = " ".join("[" + placements_str(p) + "]" for p in self.outputs)
        return f"{self.label}: {ins} -> {outs}"


def axis_strategies(rules: Iterable[spec.Strategy], n_inputs: int, n_outputs: int,
                    target: Target = DTENSOR_PLAN, op: str = "") -> list[AxisStrategy]:
    """Runnable rule strategies of the right arity, deduplicated, after all-Replicate."""
    out = [AxisStrategy(REPLICATE_LABEL, (REPLICATE,) * n_inputs, (REPLICATE,) * n_outputs)]
    seen = {(out[0].inputs, out[0].outputs)}
    for a in projections(rules, target, op):
        key = (a.inputs, a.outputs)
        if len(a.inputs) == n_inputs and len(a.outputs) == n_outputs and key not in seen:
            seen.add(key)
            out.append(a)
    return out


def compose(
    per_axis: Sequence[AxisStrategy],
    mesh: Mesh,
    in_shapes: Sequence[tuple[int, ...]],
    out_shapes: Sequence[tuple[int, ...] | None],
    strict: bool = True,
) -> list[NodeStrategy]:
    """Every valid choice of one rule strategy per mesh axis. ``out_shapes[i] is None``
    marks a non-tensor output (always Replicate). A strategy that holds on even cuts only
    (``AxisStrategy.even``) is kept where every dim cut, inputs' and outputs', divides by
    the devices cutting it, in either mode; one whose positions the framework masks
    (``AxisStrategy.masked``) is taken on one mesh axis at most."""
    result: list[NodeStrategy] = []
    seen: set = set()
    shape = mesh.shape
    for combo in itertools.product(per_axis, repeat=mesh.ndim):
        if sum(s.masked for s in combo) > 1:
            continue
        ins = tuple(tuple(s.inputs[i] for s in combo) for i in range(len(in_shapes)))
        outs = tuple(tuple(s.outputs[i] for s in combo) for i in range(len(out_shapes)))
        even = strict or any(s.even for s in combo)
        if not all(is_valid(p, sh, shape, even) for p, sh in zip(ins, in_shapes)):
            continue
        if not all(
            all(isinstance(x, Replicate) for x in p) if sh is None else is_valid(p, sh, shape, even)
            for p, sh in zip(outs, out_shapes)
        ):
            continue
        if (ins, outs) in seen:
            continue
        seen.add((ins, outs))
        exchanges = tuple(axis for axis, s in enumerate(combo) if s.exchange)
        result.append(NodeStrategy(",".join(s.label for s in combo), ins, outs, exchanges))
    return result


def tensor_placements(shape: tuple[int, ...], mesh: Mesh, strict: bool = True) -> list[Placements]:
    """Every valid Replicate/Shard placement of a stored tensor (graph inputs are never Partial)."""
    options: list[Placement] = [REPLICATE] + [Shard(d) for d in range(len(shape))]
    return [p for p in itertools.product(options, repeat=mesh.ndim) if is_valid(p, shape, mesh.shape, strict)]


__all__ = ["AxisStrategy", "NodeStrategy", "REPLICATE_LABEL", "axis_strategies", "compose", "tensor_placements"]
