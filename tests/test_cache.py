"""The live-exploration cache: memory, XDG persistence, concurrent writers."""

import dataclasses
import multiprocessing as mp

from metaspmd.cache import RuleCache, default_cache_dir
from metaspmd.rules import Example, RuleEntry, TensorArg
from metaspmd.spec import CombineSpec, PartialSpec, ShardSpec


def entry(sig="self:f[*]"):
    return RuleEntry(sig, "ok", ShardSpec.parse("[[S1]]"), PartialSpec(((),)), CombineSpec.parse("{S1: gather(dim=0)}"),
                     Example((("self", TensorArg((8,), "float32")),)))


def test_xdg_location(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "metaspmd"


def test_remembered_entries_persist_and_failures_do_not(tmp_path):
    cache = RuleCache(tmp_path)
    assert cache.get("torch", "aten.relu.default", "self:f[*]") is None
    cache.remember("torch", "aten.relu.default", entry())
    assert cache.get("torch", "aten.relu.default", "self:f[*]") == entry()
    fresh = RuleCache(tmp_path)  # a new process sees the persisted entry
    assert fresh.get("torch", "aten.relu.default", "self:f[*]") == entry()
    assert fresh.get("torch", "aten.relu.default", "self:f[*,*]") is None
    failed = dataclasses.replace(entry("self:f[*,*,*]"), status="failed", reason="crashed: SIGFPE")
    cache.remember("torch", "aten.relu.default", failed)
    assert cache.get("torch", "aten.relu.default", "self:f[*,*,*]") is None


def _writer(root, n):
    cache = RuleCache(root)
    for _ in range(n):
        cache.put("torch", "aten.relu.default", entry())


def test_concurrent_writers_leave_a_whole_file(tmp_path):
    procs = [mp.get_context("spawn").Process(target=_writer, args=(str(tmp_path), 30)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    assert RuleCache(tmp_path).get("torch", "aten.relu.default", "self:f[*]") == entry()
    assert not list(tmp_path.rglob("*.tmp"))
