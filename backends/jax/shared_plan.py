"""One plan for every process of a multi-process JAX mesh (``jax.distributed.initialize``):
the first of the mesh's processes plans and the others receive its plan, as on torch ranks
(a time-limited solve can end differently in each process, and processes compiling
different programs for one mesh wait on each other's collectives)."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from metaspmd import planner
from metaspmd.shared_plan import other_graph_error, outcome_plan, solve_outcome


def one_plan(mesh: Mesh, solve: Callable[[], planner.Plan], key: str = "") -> planner.Plan:
    """``solve()`` in the lowest process holding a device of ``mesh``, its plan in all. A
    mesh over several processes is collective already (each jit over it is), so every
    process calls this together."""
    processes = sorted({d.process_index for d in mesh.devices.flat})
    if jax.process_count() == 1 or len(processes) == 1:
        return solve()
    source = jax.process_index() == processes[0]
    # the graph each process captured (shared_plan.graph_key, 64 hex digits): where they
    # differ, every process raises before any solve
    own = np.frombuffer(key.encode().ljust(64)[:64], np.uint8)
    planned = np.asarray(multihost_utils.broadcast_one_to_all(own, is_source=source), np.uint8)
    differs = bool(np.any(planned != own))
    if np.any(multihost_utils.process_allgather(np.int32(differs))):
        raise other_graph_error(differs, f"process {processes[0]}")
    data = np.frombuffer(pickle.dumps(solve_outcome(solve)), np.uint8) if source else np.zeros(0, np.uint8)
    # a broadcast needs the same shape everywhere: the length first, then the bytes
    size = int(multihost_utils.broadcast_one_to_all(np.int32(data.size), is_source=source))
    buffer = np.zeros(size, np.uint8)
    if source:
        buffer[:] = data
    received = multihost_utils.broadcast_one_to_all(buffer, is_source=source)
    return outcome_plan(pickle.loads(np.asarray(received, np.uint8).tobytes()))


__all__ = ["one_plan"]
