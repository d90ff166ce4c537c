"""Registry records translated into the terms each framework speaks.

Only strategies a framework can run survive: no halo, no block, and only the reduce ops
its Partial placement knows. Everything here is derived from validated model objects,
never from raw YAML text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from metaspmd.rules import OpRecord
from metaspmd.spec import Gather, Identity, OutputCombine, PartialInput, Reduce, Replicate, ShardIn, Strategy

DTENSOR_PARTIAL_OPS = ("sum", "avg", "max", "min")
JAX_REDUCTION_OPS = ("sum",)
_IDENT_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class CodegenError(ValueError):
    pass


def check_op_name(op: str) -> str:
    if not isinstance(op, str) or not _IDENT_RE.match(op):
        raise CodegenError(f"op name {op!r} is not a plain identifier")
    return op


@dataclass(frozen=True)
class Placement:
    """A DTensor-style placement: kind is 'Shard', 'Partial' or 'Replicate'."""

    kind: str
    dim: int = 0
    op: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("Shard", "Partial", "Replicate"):
            raise CodegenError(f"bad placement kind {self.kind!r}")
        if not isinstance(self.dim, int) or self.dim < 0:
            raise CodegenError(f"bad placement dim {self.dim!r}")
        if self.kind == "Partial" and self.op not in DTENSOR_PARTIAL_OPS:
            raise CodegenError(f"bad partial op {self.op!r}")

    def code(self) -> str:
        """Python source for torch.distributed.tensor placements (values validated above)."""
        if self.kind == "Shard":
            return f"Shard({self.dim})"
        if self.kind == "Partial":
            return f"Partial({self.op!r})"
        return "Replicate()"


REPLICATE = Placement("Replicate")


def _input_placement(p) -> Placement | None:
    if isinstance(p, Replicate):
        return REPLICATE
    if isinstance(p, ShardIn):
        return Placement("Shard", p.dim) if p.halo == 0 else None
    if isinstance(p, PartialInput):
        return Placement("Partial", op=p.op) if p.op in DTENSOR_PARTIAL_OPS else None
    return None


def _output_placement(out: OutputCombine) -> Placement | None:
    """The first alternative a framework can express (options are cheapest first)."""
    for c in out.options:
        if isinstance(c, Gather) and c.halo == 0 and c.block == 1:
            return Placement("Shard", c.dim)
        if isinstance(c, Identity):
            return REPLICATE
        if isinstance(c, Reduce) and c.op in DTENSOR_PARTIAL_OPS:
            return Placement("Partial", op=c.op)
    return None


@dataclass(frozen=True)
class PlacementRule:
    inputs: tuple[Placement, ...]
    outputs: tuple[Placement, ...]


def placement_rule(s: Strategy) -> PlacementRule | None:
    ins = tuple(_input_placement(p) for p in s.inputs)
    outs = tuple(_output_placement(o) for o in s.outputs)
    if any(p is None for p in ins + outs):
        return None
    return PlacementRule(ins, outs)  # type: ignore[arg-type]


def placement_rules(record: OpRecord) -> dict[str, tuple[PlacementRule, ...]]:
    """signature -> runnable placement rules, for entries with verified strategies."""
    check_op_name(record.op)
    out: dict[str, tuple[PlacementRule, ...]] = {}
    for e in record.entries:
        if e.status not in ("ok", "derived"):
            continue
        rules = tuple(dict.fromkeys(r for r in map(placement_rule, e.strategies()) if r is not None))
        if rules:
            out[e.signature] = rules
    return out
