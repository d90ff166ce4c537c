"""Tensor placements on a device mesh, one per mesh axis (what targets run and plans hold).

The torch and jax apply layers translate these: ``Shard(d)`` splits tensor dim ``d`` over
the axis, ``Replicate`` keeps a full copy on every device of the axis, ``Partial(op)``
holds per-device summands that ``op`` reduces to the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .spec import Replicate  # the rule model's: one Replicate, in rules and on meshes


@dataclass(frozen=True)
class Shard:
    dim: int

    def __post_init__(self) -> None:
        if self.dim < 0:
            raise ValueError(f"Shard dim must be >= 0, got {self.dim}")

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Partial:
    op: str = "sum"

    def __str__(self) -> str:
        return f"P({self.op})"


# Partial ops of positions pending an arg-reduction (argreduce outputs, JAX only): every
# device holds its local winner's position; the value decides which one is kept.
ARG_PARTIAL_OPS = ("argmax", "argmin")

Placement = Union[Replicate, Shard, Partial]
# One placement per mesh axis, like DTensor's placements tuple.
Placements = tuple[Placement, ...]

REPLICATE = Replicate()


def replicated(ndim: int) -> Placements:
    return (REPLICATE,) * ndim


def placements_str(p: Placements) -> str:
    return ",".join(str(x) for x in p)


def shard_factor(p: Placements, mesh_shape: tuple[int, ...], dim: int) -> int:
    """How many ways tensor dim ``dim`` is split under ``p``."""
    k = 1
    for axis, x in enumerate(p):
        if isinstance(x, Shard) and x.dim == dim:
            k *= mesh_shape[axis]
    return k


def is_valid(p: Placements, shape: tuple[int, ...], mesh_shape: tuple[int, ...], strict: bool = True) -> bool:
    """Shard dims exist and split evenly (``strict``) or at least once per device;
    Partial axes of one tensor agree on the reduce op (mixed reductions do not commute)."""
    if len(p) != len(mesh_shape):
        return False
    ops = {x.op for x in p if isinstance(x, Partial)}
    if len(ops) > 1:
        return False
    for x in p:
        if isinstance(x, Shard) and x.dim >= len(shape):
            return False
    for d, size in enumerate(shape):
        k = shard_factor(p, mesh_shape, d)
        if k > 1 and (size % k if strict else size < k):
            return False
    return True


def why_invalid(p: Placements, shape: tuple[int, ...], mesh_shape: tuple[int, ...], strict: bool = True) -> str:
    """Why ``is_valid`` refuses ``p`` for a tensor of ``shape``, in words; "" where it does not."""
    if is_valid(p, shape, mesh_shape, strict):
        return ""
    if len(p) != len(mesh_shape):
        return f"{len(p)} placements for a mesh of {len(mesh_shape)} axes"
    if len({x.op for x in p if isinstance(x, Partial)}) > 1:
        return "Partial placements with different reduce ops, which do not commute"
    for x in p:
        if isinstance(x, Shard) and x.dim >= len(shape):
            return f"{x} names dim {x.dim}, but the tensor has {len(shape)} dims"
    for d, size in enumerate(shape):
        k = shard_factor(p, mesh_shape, d)
        if k > 1 and (size % k if strict else size < k):
            return (f"dim {d} of size {size} does not split evenly in {k}" if strict
                    else f"dim {d} of size {size} is shorter than its {k} shards")
    return "not a placement of this tensor"  # unreachable while the checks mirror is_valid's


def local_shape(p: Placements, shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The largest per-device shard shape (uneven splits round up)."""
    return tuple(-(-size // shard_factor(p, mesh_shape, d)) for d, size in enumerate(shape))


__all__ = [
    "Partial", "Placement", "Placements", "REPLICATE", "Replicate", "Shard", "is_valid", "local_shape",
    "placements_str", "replicated", "shard_factor", "why_invalid",
]
