"""One plan for every process of a torch mesh: the first process plans, the others receive.

Each rank could plan for itself, but a time-limited ILP solve stops wherever the clock
finds it, and ranks that keep different answers issue different collectives and wait on
each other forever (4 gloo ranks on a loaded machine did). So the rank at the mesh's
origin solves, and the plan (or the error that stopped it) travels to every rank along
the mesh's own dimension groups (metaspmd.shared_plan).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from metaspmd import planner
from metaspmd.shared_plan import outcome_plan, solve_outcome


def planning_processes(mesh: DeviceMesh) -> bool:
    """Whether ``mesh``'s ranks are processes of their own that must agree on a plan: not a
    single process, nor the "fake" process group one process simulates every rank in."""
    return (dist.is_available() and dist.is_initialized() and mesh.size() > 1
            and dist.get_backend() != "fake" and mesh.get_coordinate() is not None)


def one_plan(mesh: DeviceMesh, solve: Callable[[], planner.Plan]) -> planner.Plan:
    """``solve()`` on the rank at coordinate (0, ..., 0) of ``mesh``; its plan on every rank
    of the mesh. Only the mesh's ranks take part (a mesh may be part of a larger world)."""
    if not planning_processes(mesh):
        return solve()
    here = mesh.get_coordinate()
    box = [solve_outcome(solve) if not any(here) else None]
    # Dimension by dimension from the origin: after dim d, every rank whose coordinates past
    # d are all 0 holds the plan, so each source along d+1 already has it.
    for d in range(mesh.ndim):
        index = list(here)
        index[d] = 0
        src = int(mesh.mesh[tuple(index)])
        dist.broadcast_object_list(box, src=src, group=mesh.get_group(d))
    return outcome_plan(box[0])


__all__ = ["one_plan", "planning_processes"]
