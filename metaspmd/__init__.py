"""metaspmd: operator SPMD sharding rules discovered by ShardCombine, and a planner that uses them.

The core (this package) imports no framework; ``parallelize`` loads the backend that
matches the mesh it is given (``metaspmd.runtime``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def parallelize(fn_or_module: Any, mesh: Any, example_inputs: tuple, **options: Any) -> Any:
    """Capture ``fn_or_module``, find every op's sharding rules (generated table, then
    live ShardCombine, cached), plan the sharding on ``mesh`` with the ILP, and return a
    callable that runs the plan: on DTensor for a torch ``DeviceMesh``, under ``jax.jit``
    with shardings for a ``jax.sharding.Mesh``, or on the runtime registered for the mesh's
    type (``metaspmd.runtime.register_runtime``). ``.plan`` holds the plan (``.plan.table()``
    prints it per node) and ``.stats`` where each node's rules came from."""
    from .runtime import parallelize as run

    return run(fn_or_module, mesh, example_inputs, **options)


__all__ = ["parallelize", "__version__"]
