"""Batched matmuls kept on their batch dims, not merged into one.

``torch.matmul`` of ``[b, H, t, dh]`` tensors (attention's ``q @ k.transpose(-2, -1)``)
traces into a view merging ``b`` and ``H`` into one dim, ``bmm`` on ``[b * H, t, dh]`` and
a view splitting the result back; its backward does the same with the merged operands
transposed. A cut through the heads (``H``, Megatron's attention) is a cut along an inner
factor of the merged dim, which no plain Shard of ``[b * H, ...]`` is, so every such bmm
forced the heads whole. Each ``view(merge) -> bmm -> view(split)`` is put back as the one
``aten.matmul`` it stands for on the unmerged operands (a merged operand transposed by
the bmm's backward becomes the unmerged one with its last two dims transposed): the same
values, and the batch dims, heads included, are dims of their own again, which the
matmul's verified rules cut. The captured graph is functional, so the rewrite is exact.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_TRANSPOSES = (aten.transpose.int,)


def _shape(n: torch.fx.Node) -> tuple[int, ...] | None:
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _merged_from(n: torch.fx.Node, lead: tuple[int, ...]) -> torch.fx.Node | None:
    """The unmerged tensor ``n`` views as ``[prod(lead), r, c]``: a ``[*lead, r, c]`` one."""
    if not (isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in _VIEWS):
        return None
    src = n.args[0]
    shape, out = _shape(src), _shape(n)
    if shape is None or out is None or len(out) != 3:
        return None
    return src if shape == (*lead, *out[1:]) else None


def _last_two_swapped(n: torch.fx.Node) -> bool:
    """A transpose of the last two dims of a 3-D tensor."""
    if not (n.op == "call_function" and n.target in _TRANSPOSES and len(n.args) == 3):
        return False
    dims = {d % 3 for d in n.args[1:3]}
    return dims == {1, 2}


def _operand(n: torch.fx.Node, lead: tuple[int, ...]) -> tuple[torch.fx.Node, bool] | None:
    """(the unmerged tensor, whether its last two dims are to be swapped) behind a bmm operand."""
    found = _merged_from(n, lead)
    if found is not None:
        return found, False
    if isinstance(n, torch.fx.Node) and _last_two_swapped(n):
        found = _merged_from(n.args[0], lead)
        if found is not None:
            return found, True
    return None


def _split_user(bmm: torch.fx.Node) -> tuple[torch.fx.Node, tuple[int, ...]] | None:
    """The bmm's one user, a view splitting its batch dim into two or more, and those dims."""
    if len(bmm.users) != 1:
        return None
    (user,) = bmm.users
    out, shape = _shape(bmm), _shape(user)
    if user.op != "call_function" or user.target not in _VIEWS or out is None or shape is None:
        return None
    lead = shape[:-2]
    if len(lead) < 2 or shape[-2:] != out[1:] or math.prod(lead) != out[0]:
        return None
    return user, lead


def _node(graph: torch.fx.Graph, target, args: tuple) -> torch.fx.Node:
    """A new node with its ``meta["val"]``: shapes worked out on the meta device, the value
    made in the first operand's fake mode (a real trace's values come from several)."""
    node = graph.call_function(target, args)
    first = args[0].meta["val"]

    def meta(a):
        if not isinstance(a, torch.fx.Node):
            return a
        v = a.meta["val"]
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")

    out = target(*(meta(a) for a in args))
    with first.fake_mode:
        node.meta["val"] = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=first.device)
    return node


def unmerge_batched_matmuls(gm: torch.fx.GraphModule) -> int:
    """Rewrite each ``view(merge) -> bmm -> view(split)`` of ``gm`` as one ``aten.matmul`` on
    the unmerged operands, in place; the number rewritten."""
    graph, done = gm.graph, 0
    for bmm in list(graph.nodes):
        if bmm.op != "call_function" or bmm.target != aten.bmm.default:
            continue
        split = _split_user(bmm)
        if split is None:
            continue
        user, lead = split
        operands = [_operand(a, lead) for a in bmm.args[:2]]
        if any(o is None for o in operands):
            continue
        (a, swap_a), (b, swap_b) = operands
        rows = _shape(a)[-1 if swap_a else -2]
        cols = _shape(b)[-2 if swap_b else -1]
        if _shape(user) != (*lead, rows, cols):
            continue
        with graph.inserting_before(user):
            args = [_node(graph, aten.transpose.int, (x, -2, -1)) if swap else x for x, swap in operands]
            user.replace_all_uses_with(_node(graph, aten.matmul.default, tuple(args)))
        done += 1
    if done:
        graph.eliminate_dead_code()
        gm.recompile()
    return done


__all__ = ["unmerge_batched_matmuls"]
