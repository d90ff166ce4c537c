"""A sweep worker takes what its backend loaded (at start and on first use) out of the
garbage collector's generations, and keeps nothing dead there."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from metaspmd.sweep import SweepConfig
from metaspmd.sweep.workers import Task, WorkerPool

TESTS = Path(__file__).resolve().parent

pytestmark = pytest.mark.timeout(60)


class _Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


_LAZY: list[_Node] = []  # what an op loads on first use and keeps
_dead: list[weakref.ref] = []  # garbage the first op leaves


def gc_state(backend, op):
    """A pool task: 'load' loads something on first use and leaves a cycle of garbage;
    'look' reports (frozen objects, the lazy load among the tracked ones, the garbage alive)."""
    if op == "fake.add":
        _LAZY.append(_Node())
        _dead.append(weakref.ref(_Node()))
        return gc.get_freeze_count()
    tracked = any(o is _LAZY[0] for o in gc.get_objects())
    return gc.get_freeze_count(), tracked, _dead[0]() is not None


def test_a_worker_freezes_what_it_loaded_and_collects_the_garbage_first(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))  # the fake backend and this task, in the worker
    config = SweepConfig("fake_backend", Path("."), jobs=1, timeout=20.0)
    results = {}
    with WorkerPool(config, Task(f"{__name__}:gc_state")) as pool:
        pool.start()
        pool.run(["fake.add", "fake.sum"], lambda outcome: results.setdefault(outcome.op, outcome.record))
    frozen_at_start = results["fake.add"]
    frozen, lazy_tracked, garbage_alive = results["fake.sum"]
    assert frozen_at_start > 1000  # the backend's modules, frozen once it was ready
    assert frozen > frozen_at_start  # and what the first op loaded, after it
    assert not lazy_tracked and not garbage_alive
