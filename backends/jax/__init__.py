"""The jax backend: every jax primitive as an op, explored through ``prim.bind`` on CPU.

``get_backend()`` turns on float64 (tight ground truth for float rules) before any array
is made. Exploring compiles one small executable per primitive, params and shard shape,
so compile time dominates a sweep: it compiles with XLA's cheaper CPU pipeline
(``FAST_COMPILE_OPTIONS``), and ``compile_cache=DIR`` turns on jax's persistent
compilation cache so a second sweep reuses the executables of the first. Both are set as
flags, which only take effect before jax starts its CPU client, as in a sweep worker. A
process started with ``metaspmd.reproducible.ENV`` (a sweep worker) also caps XLA's CPU
code at AVX2, as torch's kernels are there: the registry must not depend on the machine's
SIMD width.
"""

from __future__ import annotations

import importlib.metadata
import os

from metaspmd import reproducible
from metaspmd.cache import register_framework_version

# XLA's CPU options for the small programs exploration compiles (one primitive on each shard
# shape): without LLVM's optimisation and XLA's fusion emitters a compile takes half the
# time, and values stay within rounding (benchmarks/HISTORY.md, 2026-12-01 (day)). A process
# metaspmd starts (a sweep worker, the tests) sets them as flags before jax starts; in a
# user's process each explored primitive's compile is given them (eager.py).
FAST_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
                        "xla_cpu_use_fusion_emitters": False}
FAST_COMPILE_FLAGS = tuple(f"--{name}={str(value).lower()}" for name, value in FAST_COMPILE_OPTIONS.items())
REPRODUCIBLE_FLAGS = ("--xla_cpu_max_isa=AVX2",)


# Live-explored rules are cached per framework build; XLA (jaxlib) runs the ops, and jax
# accepts more than one jaxlib. Read from package metadata: importing jax here would start
# it before get_backend sets XLA_FLAGS.
register_framework_version(
    "jax", lambda: f"{importlib.metadata.version('jax')}-jaxlib-{importlib.metadata.version('jaxlib')}")


def enable_x64() -> None:
    import jax

    jax.config.update("jax_enable_x64", True)


def _add_xla_flags(flags) -> None:
    current = os.environ.get("XLA_FLAGS", "")
    missing = [f for f in flags if f.split("=")[0] not in current]
    if missing:
        os.environ["XLA_FLAGS"] = " ".join([current, *missing]).strip()


def get_backend(compile_cache: str | None = None, max_cases: str | int | None = None):
    _add_xla_flags(FAST_COMPILE_FLAGS)
    if reproducible.in_effect():
        _add_xla_flags(REPRODUCIBLE_FLAGS)
    import jax

    enable_x64()
    if compile_cache:
        jax.config.update("jax_compilation_cache_dir", str(compile_cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from .backend import MAX_CASES, JaxBackend

    return JaxBackend(max_cases=int(max_cases) if max_cases else MAX_CASES)
