"""Replay one DTensor rule on real DTensor: fake process group + ``LocalTensorMode``, every
rank simulated in this process.

Our own replay (crosscheck_numerics) runs the op's kernel on the shards, which is what
DTensor does for ops with a rule of their own. It cannot stand in for DTensor where
DTensor does something else: composite ops (DTensor runs their decomposition), ops whose
size arguments DTensor rewrites per shard, and ``out=`` variants of views whose local
call fails. There the DTensor rule is asked of DTensor itself: the inputs are placed as
the rule says (a Partial input split into random parts that reduce back to it), the op
runs, and every output's full value is compared with the op on the unsharded inputs.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from metaspmd import pytree

from .crosscheck_dtensor import canonical_names, placement
from .crosscheck_numerics import FOREIGN_DRAWS, FreshInputs, partial_parts
from .dtensor_handlers import per_rank

# Replays per rule: fresh draws of the example's inputs, as many as the replay on shards.
REPLAY_SEEDS = tuple(range(1, FOREIGN_DRAWS + 1))

# Real DTensor raising this on a replicated call: it has no way to run the op at all.
NO_STRATEGY = NotImplementedError

# How a verdict's detail starts (the cross-check names the reason from it).
REAL = "real DTensor"
REAL_CANNOT_RUN = "real DTensor cannot run the op"
REAL_RAISES = "real DTensor raises on these placements"


def _ensure_process_group(world: int) -> bool:
    """A fake process group of at least ``world`` ranks (one is started if none is up)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world)
    return dist.get_world_size() >= world


def _place(ops, x: torch.Tensor, key: str, mesh, world: int, seed: int):
    """``x`` as a DTensor under ``key``, with a tensor of its own on every simulated rank:
    LocalTensorMode lets one plain tensor stand for a replicated local, and an in-place op
    with a per-rank argument then writes it once per rank (``x.add_(y)`` adds y four times
    on four ranks, where gloo adds it once). A Partial input holds random parts, drawn with
    the mode off: drawn under it, each part is itself one draw per rank."""
    from torch.distributed._local_tensor import LocalTensor, maybe_disable_local_tensor_mode
    from torch.distributed.tensor import DTensor, distribute_tensor

    p = placement(key)
    if not p.is_partial():
        return _own_storage(distribute_tensor(x, mesh, [p]))
    op = {"product": "prod"}.get(p.reduce_op, p.reduce_op)
    with maybe_disable_local_tensor_mode():
        parts = [part.contiguous() for part in partial_parts(ops, x, op, world, seed)]
    local = LocalTensor(dict(enumerate(parts)))
    return DTensor.from_local(local, mesh, [p], run_check=False, shape=x.shape, stride=x.stride())


def _own_storage(d):
    """``d`` with a local of its own per rank where the mode shares one plain tensor."""
    from torch.distributed.tensor import DTensor

    local = per_rank(d.to_local())
    return DTensor.from_local(local, d.device_mesh, d.placements, run_check=False, shape=d.shape,
                              stride=d.stride())


def _full(x: Any) -> Any:
    """A DTensor output's global value (every simulated rank must agree)."""
    from torch.distributed._local_tensor import LocalTensor
    from torch.distributed.tensor import DTensor

    full = x.full_tensor() if isinstance(x, DTensor) else x
    if not isinstance(full, LocalTensor):
        return full
    ranks = [full._local_tensors[r] for r in sorted(full._local_tensors)]
    for r in ranks[1:]:
        if r.shape != ranks[0].shape or not torch.allclose(r, ranks[0], equal_nan=True):
            raise AssertionError("the ranks' full values differ")
    return ranks[0]


def _call(func, case, args, kwargs, ops, want, keys: Sequence[str], out_keys: Sequence[str], world: int, seed: int):
    """The op's outputs on DTensor inputs placed by ``keys``, as (full value, placement); ``out=``
    arguments (which the example's runner allocates itself) become DTensors placed by
    ``out_keys``."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    with LocalTensorMode(frozenset(range(world))):
        mesh = DeviceMesh("cpu", list(range(world)))
        leaves = pytree.leaves((args, kwargs), ops.is_tensor)
        placed = [_place(ops, x, k, mesh, world, seed * 97 + i) for i, (x, k) in enumerate(zip(leaves, keys))]
        dargs, dkwargs = pytree.replace((tuple(args), dict(kwargs)), ops.is_tensor, placed)
        outs = [a for a in func._schema.arguments if a.is_out]
        if outs:
            if len(outs) != len(want) or any(str(a.real_type).startswith("List[") for a in outs):
                raise ValueError("out arguments do not match the outputs one to one")
            for a, w, k in zip(outs, want, out_keys):
                out = _place(ops, torch.empty_like(w), "R", mesh, world, 0)
                dkwargs[a.name] = out.redistribute(mesh, [placement(k)]) if k != "R" else out
            got = func(*dargs, **dkwargs)
        else:
            got = case.call(tuple(dargs), dict(dkwargs))  # the runner clones what the op writes
        return [(_full(x), _key(x)) for x in pytree.leaves(got, lambda x: isinstance(x, torch.Tensor))]


def _key(x: Any) -> str | None:
    """A DTensor output's placement as DTensor prints it; None for a plain tensor."""
    from torch.distributed.tensor import DTensor

    return str(x.placements[0]) if isinstance(x, DTensor) else None


def replay(func, fresh: FreshInputs, inputs: Sequence[str], outputs: Sequence[str], world: int) -> tuple[str, str]:
    """(verdict, detail) of one DTensor rule on real DTensor: 'holds', 'wrong' (a wrong
    value, or DTensor raises on these placements), or 'unchecked' (the replay itself
    could not be set up)."""
    if not _ensure_process_group(world):
        return "unchecked", f"{REAL}: the process group up has fewer than {world} ranks"
    case, ops = fresh.case, fresh.ops
    for seed in REPLAY_SEEDS:
        args, kwargs = fresh(seed)
        want = pytree.leaves(case.call(args, kwargs), ops.is_tensor)
        call = (func, case, args, kwargs, ops, want)
        try:
            got = _call(*call, inputs, outputs, world, seed)
        except Exception as e:
            return _raised(call, len(inputs), len(outputs), world, seed, e)
        if len(want) != len(got):
            return "wrong", f"{REAL}: {len(got)} outputs, the op gives {len(want)}"
        placed = [k for _, k in got]
        if None in placed or canonical_names(tuple(placed), want) != tuple(outputs):
            shown = ", ".join(k or "a plain tensor" for k in placed)
            return "unchecked", f"{REAL} places the outputs {shown}, not as its query said"
        for j, (w, (g, _)) in enumerate(zip(want, got)):
            if w.shape != g.shape or w.dtype != g.dtype or not ops.close(g, w):
                return "wrong", f"{REAL}: output {j} differs from the unsharded op's"
    return "holds", f"{REAL}: matches the unsharded op"


def _raised(call: tuple, n_in: int, n_out: int, world: int, seed: int, error: Exception) -> tuple[str, str]:
    try:
        _call(*call, ["R"] * n_in, ["R"] * n_out, world, seed)
    except NO_STRATEGY as e:
        return "wrong", f"{REAL_CANNOT_RUN}: {_text(e)}"
    except Exception as e:
        return "unchecked", f"the {REAL} replay fails even on replicated inputs: {_text(e)}"
    return "wrong", f"{REAL_RAISES}: {_text(error)}"


def _text(e: Exception) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:160]}"
