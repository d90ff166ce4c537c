"""One environment for the processes that draw samples and verify rules, so that a sweep
gives the same files on any machine.

Five things a process fixes only when it starts, and that change the sweep's results:

- ``PYTHONHASHSEED``: Python salts ``str`` hashes per process, and sample generators
  iterate over sets of strings (OpInfo's meshgrid samples loop over ``{'xy', 'ij'}``).
  Their samples then come in another order in each process: the sample index would keep
  other calls from one build to the next, and a worker replaying sample k would get
  another call than the one captured.
- ``ATEN_CPU_CAPABILITY``: torch picks its vectorized kernels by the CPU's widest SIMD
  set. The AVX-512 and AVX2 kernels round differently in the last bits and overflow at
  different inputs (float ``sinh`` of integers), so a verification passed on one machine
  and failed on another. AVX2 is the widest set that every x86-64 machine we sweep on has.
- ``MKL_CBWR``: MKL picks its GEMM code path by CPU too; on AVX-512 ``a @ p + a @ -p`` was
  not exactly zero where ``p`` and ``-p`` had different memory layouts, and a Partial
  ``mat2`` of ``mm`` was refuted there only. Conditional numerical reproducibility at the
  AVX2 level gives one answer on every machine that has it. (The jax backend caps XLA's
  CPU code at AVX2 too, in a process that starts with these values.)
- ``ONEDNN_MAX_CPU_ISA``: oneDNN (torch's convolutions, and the samples captured through
  them) picks its kernels by CPU too, up to AMX, and they round differently:
  ``convolution_backward`` kept other Partial rules on an AMX machine than on an AVX2 one.
  Capped at AVX2, as above. (Where torch itself picks oneDNN or its own kernel by CPU,
  ``_scaled_mm``'s float8 product on AMX only, a backend that sweeps in such a process
  runs its own kernels: the torch one turns oneDNN off in its workers, and NNPACK, which
  blocks its sums by the CPU's cache sizes.)
- ``FBGEMM_ENABLE_INSTRUCTIONS``: fbgemm generates its embedding-bag and quantized GEMM
  kernels for the CPU's widest set, which no setting above reaches; no rule was seen to
  change with it (their sums run in one order either way), and it is capped at AVX2 all
  the same.

And one that a process reads when it imports a framework: ``JAX_PLATFORMS`` is ``cpu``,
so a machine with an accelerator sweeps JAX on the same CPU kernels as one without.

Variables a user may have set for their own work, which change which samples a framework
gives or what it computes, are left out of these processes (``UNSET``): the OpInfo test
harness's (``PYTORCH_OPINFO_SAMPLE_INPUT_INDEX`` keeps one sample per OpInfo, so a worker
replaying sample k finds none), JAX's configuration (``JAX_NUMPY_RANK_PROMOTION=raise``
fails the model programs that broadcast by rank, which the program index then leaves out;
``JAX_DEFAULT_PRNG_IMPL`` changes the key type), ``XLA_FLAGS`` (the backend sets its own)
and ``MKL_ENABLE_INSTRUCTIONS``, which overrides ``MKL_CBWR``'s code path. The sweep and
cross-check commands set their own environment so too (``for_command``), as they list ops
and build the indexes before any worker starts.

Sweep and cross-check workers start with these values, and a process that did not start
with them builds the sample index in one that does. A user's process (live exploration at
run time) keeps its own settings: its rules are verified on the machine that uses them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from typing import Iterator

ENV = {
    "PYTHONHASHSEED": "0",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
    "JAX_PLATFORMS": "cpu",
}
# names, and name prefixes ending in "_", of the variables left out (see above)
UNSET = ("PYTORCH_OPINFO_", "PYTORCH_TEST_", "JAX_", "XLA_FLAGS", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE")


def unset_names(environ: dict[str, str] | os._Environ = os.environ) -> list[str]:
    """The variables of ``environ`` that ``UNSET`` leaves out, those ``ENV`` sets excepted."""
    return sorted(k for k in environ if k not in ENV
                  and any(k.startswith(u) if u.endswith("_") else k == u for u in UNSET))


# read once, as the frameworks read them: a backend sets XLA_FLAGS of its own later
_UNSET_AT_START = {k: os.environ[k] for k in unset_names()}


def started_under(prefix: str) -> str:
    """'' where this process started without ``UNSET``'s variables named ``prefix``...;
    else a digest of them, for the name of a cache built here (JAX's program index), which
    then stays apart from the one a sweep reads."""
    given = sorted((k, v) for k, v in _UNSET_AT_START.items() if k.startswith(prefix))
    return hashlib.sha256(repr(given).encode()).hexdigest()[:10] if given else ""


def in_effect() -> bool:
    """Did this process start with these values, and without ``UNSET``'s? (The hash seed
    is read off the interpreter's start-up flags; the others off the environment, which
    frameworks read once, when they load.)"""
    others = {k: v for k, v in ENV.items() if k != "PYTHONHASHSEED"}
    return (sys.flags.hash_randomization == 0 and all(os.environ.get(k) == v for k, v in others.items())
            and not _UNSET_AT_START)


@contextlib.contextmanager
def for_children() -> Iterator[None]:
    """Processes started inside get these values, without ``UNSET``'s; this process's
    environment is restored."""
    saved = {k: os.environ.get(k) for k in [*ENV, *unset_names()]}
    for k in unset_names():
        del os.environ[k]
    os.environ.update(ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def child_env() -> dict[str, str]:
    """This process's environment with these values, without ``UNSET``'s, for a subprocess."""
    dropped = set(unset_names())
    return {**{k: v for k, v in os.environ.items() if k not in dropped}, **ENV}


def overridden(environ: dict[str, str] | os._Environ = os.environ) -> list[str]:
    """The variables of ``environ`` that ``ENV`` sets to another value than they have
    (``ATEN_CPU_CAPABILITY=default``; an empty value is none), as ``NAME=value`` of ``ENV``."""
    return [f"{k}={v}" for k, v in sorted(ENV.items()) if environ.get(k, "") not in ("", v)]


def for_command() -> list[str]:
    """This process's environment as its workers' will be, but for the hash seed, which
    only a process's start sets: for a command that lists ops and builds indexes itself,
    before it imports a framework. Returns the names of the variables it removed."""
    names = unset_names()
    for k in names:
        del os.environ[k]
    os.environ.update(ENV)
    return names


__all__ = [
    "ENV", "UNSET", "child_env", "for_command", "for_children", "in_effect", "overridden", "started_under", "unset_names",
]
