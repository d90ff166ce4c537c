"""Rules for captured torch nodes: table lookup on recorded values, live cases on a miss."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial, Shard
from torch.distributed.tensor._ops._math_ops import _NormPartial

from metaspmd.case import OpCase
from metaspmd.ir import MetaOp
from metaspmd.resolve import NodeCall
from metaspmd.spec import Gather, Identity, OutputCombine, PartialInput, Reduce, ShardIn, Strategy
from metaspmd.spec import Replicate as ReplicateIn

from . import dtensor_rules
from .backend import torch_case
from .capture import Captured
from .samples import call_signature, with_varied_masks


def _input(p) -> object:
    if isinstance(p, Shard):
        return ShardIn(p.dim)
    if isinstance(p, Partial):
        return PartialInput(p.reduce_op)
    return ReplicateIn()


def _output(p) -> OutputCombine:
    if isinstance(p, Shard):
        return OutputCombine((Gather(p.dim),))
    if isinstance(p, _NormPartial):  # a Partial whose reduce_op reads 'sum'
        if p.norm_type != 2:
            raise ValueError(f"no combine for {p}")
        return OutputCombine((Reduce("norm2"),))
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


def _shrunk(tree, small=(6, 8, 10, 12, 14, 16, 18, 20, 22, 24)):
    """The call on small random float tensors of the same signature, so live exploration
    costs milliseconds, not seconds. Each distinct size maps to its own small size, keeping
    size 1 and equal sizes equal (mm's contraction dims must still match). Calls with
    integer or bool tensors (indices, masks) keep their real values: shrinking them
    could make them invalid. Not shrunk when there are too many distinct sizes."""
    leaves = [x for x in torch.utils._pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]
    if any(not x.is_floating_point() for x in leaves):
        return tree
    sizes = sorted({s for x in leaves for s in x.shape if s > small[0]})
    if len(sizes) > len(small):
        return tree
    new = dict(zip(sizes, small))

    def shrink(x):
        if isinstance(x, torch.Tensor):
            return torch.randn([new.get(s, s) for s in x.shape], dtype=x.dtype)
        return x

    return torch.utils._pytree.tree_map(shrink, tree)


def call_case(fn: torch._ops.OpOverload, args: tuple, kwargs: dict) -> OpCase:
    """The case live exploration verifies for one call: on small float64 tensors of the
    call's signature where the op takes them, else on the call's own values."""
    a, k = tuple(args), dict(kwargs)
    for candidate in (_float64(_shrunk((a, k))), _float64((a, k))):
        try:
            fn(*candidate[0], **candidate[1])
        except Exception:  # shapes baked into the arguments, or no float64 kernel
            continue
        a, k = candidate
        break
    # a mask of one value takes one branch only: rules verified there need not hold for
    # the other (masked_fill's Partial self where the mask is False everywhere)
    a, k = with_varied_masks(fn, a, k)
    return torch_case(fn, a, k, fn)


def call_of(fn: torch._ops.OpOverload, args: tuple, kwargs: dict) -> NodeCall:
    """One call's signature, the table's rules for it (None: the table lacks them), the
    case live exploration would verify, and the table's rules at neighbouring signatures."""
    sig = call_signature(fn, tuple(args), dict(kwargs))
    found = dtensor_rules.lookup(fn, tuple(args), dict(kwargs))

    def neighbours() -> tuple:
        return tuple((s.inputs, s.outputs) for s in to_strategies(dtensor_rules.neighbour_rules(fn, sig)))

    return NodeCall(sig, to_strategies(found) if found is not None else None, lambda: call_case(fn, args, kwargs),
                    neighbours if found is None else None)


def node_call(captured: Captured, node: MetaOp) -> NodeCall:
    args, kwargs = captured.values[node.name]
    return call_of(node.fn, args, kwargs)
