"""Fresh, valid index operands for gather, scatter and dynamic slicing, and select_n's picks.

Index operands cannot take arbitrary random values, and programs often pass constant
ones; kept as they are, every trial would use the same indices and a rule that only holds
for them (say, indices that happen to stay inside each shard) would pass. Fresh trials
therefore draw new in-range indices from the params: for each index component, any start
in ``[0, dim size - window size]``; distinct index tuples where the params promise unique
indices, in order where they promise sorted ones.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

Rng = np.random.Generator


def random_indices(rng: Rng, batch_shape: tuple[int, ...], limits: Sequence[int], unique: bool,
                   ordered: bool, dtype) -> np.ndarray:
    """An array of shape batch_shape + (len(limits),): index tuples with component k in
    [0, limits[k])."""
    count = int(np.prod(batch_shape)) if batch_shape else 1
    limits = [max(1, int(n)) for n in limits]
    if unique:
        total = int(np.prod(limits))
        if total < count:
            raise ValueError("not enough distinct indices for a unique-indices promise")
        # Draw flat positions without replacement and unravel them into index tuples.
        flat = rng.choice(total, count, replace=False) if total <= 1 << 20 else _distinct(rng, total, count)
        rows = np.stack(np.unravel_index(flat, limits), axis=-1) if limits else np.zeros((count, 0))
    else:
        rows = np.stack([rng.integers(0, n, count) for n in limits], axis=-1) if limits else np.zeros((count, 0))
    if ordered:
        rows = rows[np.lexsort(rows.T[::-1])] if len(limits) else rows
    return rows.reshape(tuple(batch_shape) + (len(limits),)).astype(dtype)


def _distinct(rng: Rng, total: int, count: int) -> np.ndarray:
    seen: dict[int, None] = {}
    while len(seen) < count:
        seen.update(dict.fromkeys(int(v) for v in rng.integers(0, total, count)))
    return np.array(list(seen)[:count])


def _gather(rng: Rng, params: dict, shapes, dtypes) -> dict[int, np.ndarray]:
    dn, sizes = params["dimension_numbers"], params["slice_sizes"]
    operand, indices = shapes[0], shapes[1]
    limits = [operand[d] - sizes[d] + 1 for d in dn.start_index_map]
    # Repeated rows are legal, but two equal index rows make equal shards, which prove
    # nothing: draw distinct rows while there are enough of them.
    distinct = int(np.prod([max(1, n) for n in limits])) >= int(np.prod(indices[:-1]))
    new = random_indices(rng, tuple(indices[:-1]), limits, params.get("unique_indices", False) or distinct,
                         params.get("indices_are_sorted", False), dtypes[1])
    return {1: new}


def _scatter(rng: Rng, params: dict, shapes, dtypes) -> dict[int, np.ndarray]:
    dn = params["dimension_numbers"]
    operand, indices, updates = shapes
    skipped = set(dn.inserted_window_dims) | set(dn.operand_batching_dims)
    window_dims = [d for d in range(len(operand)) if d not in skipped]
    window = {d: updates[u] for d, u in zip(window_dims, dn.update_window_dims)}
    limits = [operand[d] - window.get(d, 1) + 1 for d in dn.scatter_dims_to_operand_dims]
    new = random_indices(rng, tuple(indices[:-1]), limits, params.get("unique_indices", False),
                         params.get("indices_are_sorted", False), dtypes[1])
    return {1: new}


def _dynamic_slice(rng: Rng, params: dict, shapes, dtypes) -> dict[int, np.ndarray]:
    operand, sizes = shapes[0], params["slice_sizes"]
    return {1 + k: np.asarray(rng.integers(0, operand[k] - sizes[k] + 1), dtype=dtypes[1 + k]) for k in range(len(operand))}


def _dynamic_update_slice(rng: Rng, params: dict, shapes, dtypes) -> dict[int, np.ndarray]:
    operand, update = shapes[0], shapes[1]
    return {2 + k: np.asarray(rng.integers(0, operand[k] - update[k] + 1), dtype=dtypes[2 + k]) for k in range(len(operand))}


def _select_n_picks(seed: int, shape: tuple[int, ...], cases: int, dtype) -> np.ndarray:
    """``select_n``'s ``which``: a case per element, drawn at random but for the first
    element, which cycles with the seed, so that a scalar ``which`` (``jnp.where`` on a flag)
    or one the program made constant picks every case over consecutive trials. Kept as
    captured, a flag False on every trial passed ``(R, R, P(sum)) -> identity``."""
    picks = np.asarray(np.random.default_rng(seed).integers(0, cases, shape))
    picks.flat[:1] = seed % cases
    return np.asarray(picks, dtype=dtype)


_SAMPLERS: dict[str, Callable[..., dict[int, np.ndarray]]] = {
    "gather": _gather,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    **{name: _scatter for name in ("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max")},
}


def has_index_operands(prim: str) -> bool:
    return prim in _SAMPLERS


def fresh_indices(prim: str, params: dict, operands: Sequence[Any], seed: int) -> dict[int, np.ndarray]:
    """New values for the index operands of ``prim`` (position -> array); {} for others."""
    if prim == "select_n":
        return {0: _select_n_picks(seed, tuple(np.shape(operands[0])), len(operands) - 1, np.dtype(operands[0].dtype))}
    sampler = _SAMPLERS.get(prim)
    if sampler is None:
        return {}
    shapes = [tuple(int(s) for s in np.shape(x)) for x in operands]
    dtypes = [np.dtype(x.dtype) for x in operands]
    return sampler(np.random.default_rng(seed), params, shapes, dtypes)
