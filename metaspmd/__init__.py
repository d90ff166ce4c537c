"""metaspmd: operator SPMD sharding rules discovered by ShardCombine, and a planner that uses them.

The core (this package) imports no framework; ``parallelize`` loads the backend that
matches the mesh it is given.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def parallelize(fn_or_module: Any, mesh: Any, example_inputs: tuple, **options: Any) -> Any:
    """Capture ``fn_or_module``, find every op's sharding rules (generated table, then
    live ShardCombine, cached), plan the sharding on ``mesh`` with the ILP, and return a
    callable that runs the plan: on DTensor for a torch ``DeviceMesh``, under ``jax.jit``
    with shardings for a ``jax.sharding.Mesh``. ``.plan`` holds the plan (``.plan.table()``
    prints it per node) and ``.stats`` where each node's rules came from."""
    family = type(mesh).__module__.split(".")[0]
    if family == "torch":
        from .backends.torch.parallelize import parallelize as run
    elif family == "jax":
        from .backends.jax.parallelize import parallelize as run
    else:
        raise TypeError(f"parallelize needs a torch DeviceMesh or a jax.sharding.Mesh, got {type(mesh).__name__}")
    return run(fn_or_module, mesh, example_inputs, **options)


__all__ = ["parallelize", "__version__"]
