"""One primitive run eagerly, compiled for a short compile rather than a fast run.

Exploring a call runs its primitive on tens of shard shapes, and each new shape is a new
XLA executable; the arrays are small, so compiling is nearly all of the time. jax's own
eager path (``dispatch.apply_primitive``) compiles each at full optimisation. On the CPU
this one compiles with ``FAST_COMPILE_OPTIONS`` (no LLVM optimisation, no fusion
emitters), which halves a compile (benchmarks/HISTORY.md, 2026-12-01 (day)), also in a
user's process, whose jax started without them as flags. Values stay within rounding of
jax's own: over the sweep's calls, 1,324 of 1,371 agree bit for bit and the rest within 2
ulps, NaN and infinity alike, well inside the explorer's tolerance, and the sweep writes
the same registry. A rule compares the op's whole output with its shards', both compiled
alike.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import jax
from jax._src import config as jax_config
from jax._src import core

from . import FAST_COMPILE_OPTIONS


def bind(prim: core.Primitive, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """``prim.bind(*operands, **params)`` on concrete operands, compiled lightly once per
    primitive, params and operand types. Params that cannot key a cache (a jaxpr holding
    arrays) take jax's own eager path; under a caller's trace (``jit``, ``shard_map``,
    ``grad``) the op binds into it, and the caller compiles it as part of its program."""
    if not core.trace_state_clean():  # an operand-free op (iota) is traced too
        return prim.bind(*operands, **params)
    try:
        run = _compiled(prim, tuple(sorted(params.items())), jax.default_backend())
    except TypeError:  # unhashable params
        return prim.bind(*operands, **params)
    return run(*operands)


@functools.lru_cache(maxsize=4096)  # as jax's own cache of eager primitives
def _compiled(prim: core.Primitive, params: tuple[tuple[str, Any], ...], platform: str) -> Callable[..., Any]:
    bound = dict(params)

    def run(*operands: Any) -> Any:
        with jax_config.eager_constant_folding(False):  # as apply_primitive: the op itself runs
            return prim.bind(*operands, **bound)

    run.__name__ = run.__qualname__ = prim.name
    # XLA's CPU options; other platforms compile as jax does
    return jax.jit(run, compiler_options=FAST_COMPILE_OPTIONS if platform == "cpu" else None)


__all__ = ["bind"]
