"""The JAX adapter: projected placements (``metaspmd.placement``, one per mesh axis) as
``jax.sharding`` objects. ``parallelize`` and the custom-partitioning callback place
values through here; a Partial placement has no JAX spelling, so it maps to None (the
value is left to the partitioner, which reduces it where a later constraint asks)."""

from __future__ import annotations

from typing import Any

import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from metaspmd.placement import REPLICATE, Partial, Placements, Replicate, Shard


def partition_spec(placements: Placements, axis_names: tuple, ndim: int) -> PartitionSpec | None:
    """The PartitionSpec of placements (one per mesh axis); None if any is Partial."""
    dims: list[list] = [[] for _ in range(ndim)]
    for name, p in zip(axis_names, placements):
        if isinstance(p, Partial):
            return None
        if isinstance(p, Shard):
            dims[p.dim].append(name)
    return PartitionSpec(*(None if not d else d[0] if len(d) == 1 else tuple(d) for d in dims))


def named_sharding(mesh: Mesh, placements: Placements, ndim: int) -> NamedSharding | None:
    spec = partition_spec(placements, mesh.axis_names, ndim)
    return None if spec is None else NamedSharding(mesh, spec)


def cut_along(mesh: Mesh, axis: str, dim: int | None, ndim: int) -> NamedSharding:
    """``dim`` cut over the mesh axis named ``axis`` (None: replicated), the rest whole."""
    return named_sharding(mesh, tuple(Shard(dim) if a == axis and dim is not None else REPLICATE
                                      for a in mesh.axis_names), ndim)


def placements_of(mesh: Mesh, given) -> Placements:
    """A PartitionSpec, a NamedSharding or a sequence of metaspmd placements, as one
    placement per mesh axis."""
    spec = given.spec if isinstance(given, NamedSharding) else given
    if not isinstance(spec, PartitionSpec):
        return tuple(given)
    cut = {a: d for d, entry in enumerate(spec) for a in (entry if isinstance(entry, tuple) else (entry,)) if a}
    return tuple(Shard(cut[a]) if a in cut else REPLICATE for a in mesh.axis_names)


def constraint_placements(mesh: Mesh, key: Any, given: Any, ndim: int | None = None) -> Placements:
    """The constraint ``given`` on ``key`` (a value of ``ndim`` dims, where known) as one
    placement per axis of ``mesh``, refused, naming the key, where it would otherwise be
    dropped or changed without a word: a spec naming an axis the mesh lacks or one axis
    twice (JAX refuses both), a NamedSharding on another mesh, what is no sharding."""
    if isinstance(given, NamedSharding):
        _check_same_mesh(mesh, key, given)
        given = given.spec
    if isinstance(given, PartitionSpec):
        _check_spec(mesh, key, given, ndim)
        return placements_of(mesh, given)
    _check_placements(mesh, key, given)
    return tuple(given)


def _describe(mesh: Any) -> str:
    axes = ", ".join(f"{n!r}: {s}" for n, s in zip(mesh.axis_names, mesh.axis_sizes))
    ids = getattr(mesh, "device_ids", None)
    return f"Mesh({axes})" + ("" if ids is None else f" on devices {np.asarray(ids).ravel().tolist()}")


def _check_same_mesh(mesh: Mesh, key: Any, given: NamedSharding) -> None:
    """Axis types aside (an Explicit mesh runs on its Auto twin), the same names, sizes and
    devices in the same order: a spec means where values live on those devices."""
    other = given.mesh
    ids = getattr(other, "device_ids", None)
    same = (tuple(other.axis_names) == tuple(mesh.axis_names) and tuple(other.axis_sizes) == tuple(mesh.axis_sizes)
            and (ids is None or np.array_equal(ids, mesh.device_ids)))
    if not same:
        raise ValueError(f"constraint on {key!r}: a NamedSharding on another mesh, {_describe(other)}, than "
                         f"parallelize's {_describe(mesh)}: pass its PartitionSpec ({given.spec}) alone, or a "
                         "NamedSharding on parallelize's mesh")


def _check_spec(mesh: Mesh, key: Any, spec: PartitionSpec, ndim: int | None) -> None:
    names, seen = tuple(mesh.axis_names), []
    for entry in spec:
        axes = () if entry is None else entry if isinstance(entry, tuple) else (entry,)
        for a in axes:
            if not isinstance(a, str):
                raise TypeError(f"constraint on {key!r}: {spec} holds {a!r}; each entry of a PartitionSpec is a "
                                "mesh axis name, a tuple of them, or None (whole)")
            if a not in names:
                raise ValueError(f"constraint on {key!r}: {spec} names axis {a!r}, which the mesh lacks "
                                 f"(its axes: {names})")
            if a in seen:
                raise ValueError(f"constraint on {key!r}: {spec} uses axis {a!r} twice; a mesh axis cuts one "
                                 "dim at most")
            seen.append(a)
        # placements cut a dim over several axes major to minor in mesh order; another order
        # would be planned as the mesh's, not as given
        if list(axes) != sorted(axes, key=names.index):
            raise ValueError(f"constraint on {key!r}: {spec} cuts a dim over {axes}, out of the mesh's axis order "
                             f"{names}: write {tuple(sorted(axes, key=names.index))}")
    if ndim is not None and len(spec) > ndim:
        raise ValueError(f"constraint on {key!r}: {spec} has {len(spec)} entries, but the value has {ndim} dims")


def _check_placements(mesh: Mesh, key: Any, given: Any) -> None:
    kinds = (Shard, Replicate, Partial)
    if not isinstance(given, (tuple, list)) or not all(isinstance(p, kinds) for p in given):
        raise TypeError(f"constraint on {key!r}: got {given!r} (of type {type(given).__name__}); pass a PartitionSpec "
                        "(PartitionSpec('tp', None) cuts dim 0 over axis 'tp'), a NamedSharding, or one metaspmd "
                        "placement (Shard, Replicate, Partial) per mesh axis")
    if len(given) != len(mesh.axis_names):
        raise ValueError(f"constraint on {key!r}: {len(given)} placements, but the mesh has {len(mesh.axis_names)} "
                         f"axes {tuple(mesh.axis_names)}: pass one per axis")


__all__ = ["constraint_placements", "cut_along", "named_sharding", "partition_spec", "placements_of"]
