"""The JAX adapter: projected placements (``metaspmd.placement``, one per mesh axis) as
``jax.sharding`` objects. ``parallelize`` and the custom-partitioning callback place
values through here; a Partial placement has no JAX spelling, so it maps to None (the
value is left to the partitioner, which reduces it where a later constraint asks)."""

from __future__ import annotations

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from metaspmd.placement import REPLICATE, Partial, Placements, Shard


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


__all__ = ["cut_along", "named_sharding", "partition_spec", "placements_of"]
