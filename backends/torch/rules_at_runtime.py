"""Rules for captured torch nodes: table lookup on recorded values, live cases on a miss."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from metaspmd.case import OpCase
from metaspmd.ir import MetaOp
from metaspmd.resolve import NodeCall
from metaspmd.signature import signature
from metaspmd.spec import Gather, Identity, OutputCombine, PartialInput, Reduce, ShardIn, Strategy
from metaspmd.spec import Replicate as ReplicateIn

from . import dtensor_rules
from .capture import Captured
from .tensor_ops import TorchOps

_OPS = TorchOps()


def _input(p) -> object:
    if isinstance(p, Shard):
        return ShardIn(p.dim)
    if isinstance(p, Partial):
        return PartialInput(p.reduce_op)
    return ReplicateIn()


def _output(p) -> OutputCombine:
    if isinstance(p, Shard):
        return OutputCombine((Gather(p.dim),))
    if isinstance(p, Partial):
        return OutputCombine((Reduce(p.reduce_op),))
    return OutputCombine((Identity(),))


def to_strategies(rules) -> tuple[Strategy, ...]:
    """Table placements back into the rule model the planner reads."""
    return tuple(
        Strategy(f"S{i + 1}", tuple(map(_input, ins)), tuple(map(_output, outs))) for i, (ins, outs) in enumerate(rules)
    )


def _float64(tree):
    def cast(x):
        return x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float16, torch.bfloat16) else x

    return torch.utils._pytree.tree_map(cast, tree)


def node_call(captured: Captured, node: MetaOp) -> NodeCall:
    args, kwargs = captured.values[node.name]
    names = dtensor_rules.positional_names(node.fn)
    sig = signature(_OPS, names, tuple(args), dict(kwargs))
    found = dtensor_rules.lookup(node.fn, tuple(args), dict(kwargs))

    def case() -> OpCase:
        a64, k64 = _float64((tuple(args), dict(kwargs)))
        try:
            node.fn(*a64, **k64)
            a, k = a64, k64
        except Exception:  # the op has no float64 kernel: explore in the model's dtype
            a, k = tuple(args), dict(kwargs)
        fixed = frozenset(
            n for n, v in zip(names, a) if isinstance(v, torch.Tensor) and not (v.is_floating_point() or v.is_complex())
        )
        return OpCase(node.op, node.fn, tuple(a), k, names, fixed=fixed)

    return NodeCall(sig, to_strategies(found) if found is not None else None, case)
