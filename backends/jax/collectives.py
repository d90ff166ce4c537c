"""Combines run as collectives inside ``shard_map``: how a mesh axis of devices rebuilds
one output from the local ones, without gathering anything it need not.

    gather(dim)                 the output stays sharded (out_specs carry the axis)
    gather(dim, reverse=true)   one collective permute: device k sends to device n-1-k
    scan(dim, op)               each device all-gathers the edge slices and folds those of
                                the devices before it into its own output (a carry)
    reduce(sum|max|min|avg)     psum / pmax / pmin / pmean
    reduce(xor)                 all-gather, then fold (XLA has no xor all-reduce)
    argreduce(op, input)        all-gather each device's (value, global position) pair and
                                take the first winner (the input's local values are read)
    identity                    nothing

The cross-check runs every strategy whose combines are listed here for real on several
CPU devices; halo, block and overlap gathers, norm2 and prod reduces have no plan here. Import
this module only after the device count is set (it imports jax).
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp

from metaspmd.spec import ArgReduce, Combine, Gather, Identity, Reduce, Scan

AXIS = "x"


def _pxor(y, axis_name):
    """Bitwise xor across the axis: XLA has no xor all-reduce, so all-gather and fold."""
    gathered = lax.all_gather(y, axis_name)
    out = gathered[0]
    for k in range(1, gathered.shape[0]):
        out = jnp.bitwise_xor(out, gathered[k])
    return out


_COLLECTIVES = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin, "avg": lax.pmean, "xor": _pxor}


def output_dim(c: Combine) -> int | None:
    """The output dim that stays cut along the mesh axis, or None for a whole output."""
    return c.dim if isinstance(c, (Gather, Scan)) else None


def unsupported(c: Combine, dtype: Any) -> str | None:
    """Why ``c`` has no collective plan here on outputs of ``dtype``, or None."""
    if isinstance(c, Gather) and (c.halo or c.halo_end or c.block > 1 or c.overlap):
        return "halo, block or overlap output"
    if isinstance(c, Reduce) and (c.op not in _COLLECTIVES or (dtype == bool and c.op != "xor")
                                  or (c.op in ("max", "min") and jnp.issubdtype(dtype, jnp.complexfloating))):
        return f"reduce({c.op}) on {dtype} has no collective"  # XLA's CPU all-reduce orders no complex
    if isinstance(c, Scan) and c.op == "logsumexp" and not jnp.issubdtype(dtype, jnp.floating):
        return f"scan(logsumexp) on {dtype}"
    return None


def _identity_element(op: str, dtype) -> Any:
    if op == "sum":
        return jnp.zeros((), dtype)
    if op == "prod":
        return jnp.ones((), dtype)
    if dtype == bool:
        return jnp.array(op == "min")
    if jnp.issubdtype(dtype, jnp.integer):
        info = np.iinfo(dtype)
        return jnp.array(info.min if op == "max" else info.max, dtype)
    return jnp.array(-np.inf if op in ("max", "logsumexp") else np.inf, dtype)


_FOLD = {"sum": jnp.add, "prod": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum, "logsumexp": jnp.logaddexp}
_REDUCE = {"sum": jnp.sum, "prod": jnp.prod, "max": jnp.max, "min": jnp.min, "logsumexp": logsumexp}


def _scan_carry(y, c: Scan, n: int):
    """Fold the edge slices of the devices before this one (after it, for a reverse scan)
    into y. The carry of an associative op is the fold of their local edges."""
    size = y.shape[c.dim]
    edge = lax.slice_in_dim(y, 0, 1, axis=c.dim) if c.reverse else lax.slice_in_dim(y, size - 1, size, axis=c.dim)
    edges = lax.all_gather(edge, AXIS)  # (n, *edge.shape)
    me = lax.axis_index(AXIS)
    k = jnp.arange(n).reshape((n,) + (1,) * edge.ndim)
    before = k > me if c.reverse else k < me
    carry = _REDUCE[c.op](jnp.where(before, edges, _identity_element(c.op, y.dtype)), axis=0)
    return _FOLD[c.op](y, carry)


def arg_reduce(c: ArgReduce, positions, values, dim: int, axis: str = AXIS):
    """The global position of the max (min) along ``values``' cut ``dim``: every device
    shares the value at its local position and that position plus its shard's start; the
    first device holding the winner gives it (jnp.argmax takes the first, NaN first of all)."""
    index = positions if positions.ndim == values.ndim else jnp.expand_dims(positions, dim)
    value = jnp.take_along_axis(values, index, axis=dim).reshape(positions.shape)
    start = (lax.axis_index(axis) * values.shape[dim]).astype(positions.dtype)
    all_values = lax.all_gather(value, axis)
    all_positions = lax.all_gather(positions + start, axis)
    winner = (jnp.argmax if c.op == "max" else jnp.argmin)(all_values, axis=0)
    return jnp.take_along_axis(all_positions, winner[None], axis=0)[0]


def finisher(c: Combine, n: int) -> Callable[[Any], Any]:
    """What a device does to its local output of combine ``c`` on a mesh axis of ``n``."""
    if isinstance(c, Reduce):
        collective = _COLLECTIVES[c.op]
        return lambda y: collective(y, AXIS)
    if isinstance(c, Gather) and c.reverse:
        return lambda y: lax.ppermute(y, AXIS, perm=[(k, n - 1 - k) for k in range(n)])
    if isinstance(c, Scan):
        return lambda y: _scan_carry(y, c, n)
    if isinstance(c, (Gather, Identity)):
        return lambda y: y
    raise ValueError(f"no collective plan for {c}")


__all__ = ["AXIS", "finisher", "output_dim", "unsupported"]
