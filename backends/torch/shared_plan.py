"""One plan for every process of a torch mesh: the first process plans, the others receive.

Each rank could plan for itself, but a time-limited ILP solve stops wherever the clock
finds it, and ranks that keep different answers issue different collectives and wait on
each other forever (4 gloo ranks on a loaded machine did). So the rank at the mesh's
origin solves, and the plan (or the error that stopped it) travels to every rank along
the mesh's own dimension groups (metaspmd.shared_plan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from metaspmd import planner
from metaspmd.shared_plan import other_graph_error, outcome_plan, solve_outcome


def planning_processes(mesh: DeviceMesh) -> bool:
    """Whether ``mesh``'s ranks are processes of their own that must agree on a plan: not a
    single process, nor the "fake" process group one process simulates every rank in."""
    return (dist.is_available() and dist.is_initialized() and mesh.size() > 1
            and dist.get_backend() != "fake" and mesh.get_coordinate() is not None)


def one_plan(mesh: DeviceMesh, solve: Callable[[], planner.Plan], key: str = "") -> planner.Plan:
    """``solve()`` on the rank at coordinate (0, ..., 0) of ``mesh``; its plan on every rank
    of the mesh. Only the mesh's ranks take part (a mesh may be part of a larger world).
    ``key``: the graph each rank captured (``shared_plan.graph_key``); where the ranks'
    differ, every rank raises, before any solve, instead of running another graph's plan
    (the first collective of two shapes aborted inside gloo)."""
    if not planning_processes(mesh):
        return solve()
    origin = int(mesh.mesh[(0,) * mesh.ndim])
    planned_key = _from_origin(mesh, key)
    differs = torch.tensor([int(planned_key != key)])
    for d in range(mesh.ndim):  # along every dim in turn: the largest over the whole mesh
        dist.all_reduce(differs, op=dist.ReduceOp.MAX, group=mesh.get_group(d))
    if differs.item():
        raise other_graph_error(planned_key != key, f"rank {origin}")
    return outcome_plan(_from_origin(mesh, solve_outcome(solve) if not any(mesh.get_coordinate()) else None))


def _from_origin(mesh: DeviceMesh, value: Any) -> Any:
    """The origin rank's ``value`` on every rank of the mesh: dimension by dimension from
    the origin, so that after dim d every rank whose coordinates past d are all 0 holds it,
    and each source along d+1 already has it."""
    here = mesh.get_coordinate()
    box = [value if not any(here) else None]
    for d in range(mesh.ndim):
        index = list(here)
        index[d] = 0
        src = int(mesh.mesh[tuple(index)])
        dist.broadcast_object_list(box, src=src, group=mesh.get_group(d))
    return box[0]


__all__ = ["one_plan", "planning_processes"]
