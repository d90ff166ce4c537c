"""One order of string hashes for the processes that draw and replay samples.

Python salts ``str`` hashes per process unless ``PYTHONHASHSEED`` is set when it starts,
and sample generators iterate over sets of strings (OpInfo's meshgrid samples loop over
``{'xy', 'ij'}``). Their samples then come in another order in each process: the sample
index would keep other calls from one build to the next, and a worker replaying sample k
would get another call than the one captured. Sweep and cross-check workers therefore
start with a fixed seed, and a process that did not start with it builds the index in
one that does.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

ENV = "PYTHONHASHSEED"
SEED = "0"


def is_fixed() -> bool:
    """Did this process start with the fixed seed? (Only the start-up value counts.)"""
    return sys.flags.hash_randomization == 0


@contextlib.contextmanager
def for_children() -> Iterator[None]:
    """Processes spawned inside start with the fixed seed; this one's setting is restored."""
    saved = os.environ.get(ENV)
    os.environ[ENV] = SEED
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved


def child_env() -> dict[str, str]:
    """This process's environment with the fixed seed, for a subprocess."""
    return {**os.environ, ENV: SEED}


__all__ = ["child_env", "for_children", "is_fixed"]
