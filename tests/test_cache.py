"""The live-exploration cache: memory, XDG persistence, concurrent writers, versioned
folders, unreadable entries and unusable folders."""

import dataclasses
import importlib.metadata
import multiprocessing as mp
import os
import sys
import warnings
from pathlib import Path

import pytest

from metaspmd import cache as cache_module
from metaspmd import registry_io
from metaspmd import rules
from metaspmd.cache import RuleCache, RuleCacheWarning, default_cache_dir, framework_version, register_framework_version
from metaspmd.case import OpCase
from metaspmd.registry_io import load_record
from metaspmd.resolve import NodeCall, resolve_call
from metaspmd.rules import Example, RuleEntry, TensorArg
from metaspmd.spec import CombineSpec, PartialSpec, ShardSpec

np = pytest.importorskip("numpy")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_backend.numpy_ops import NumpyOps  # noqa: E402

RELU = "aten.relu.default"


def entry(sig="self:f[*]"):
    return RuleEntry(sig, "ok", ShardSpec.parse("[[S1]]"), PartialSpec(((),)), CombineSpec.parse("{S1: gather(dim=0)}"),
                     Example((("self", TensorArg((8,), "float32")),)), results=(TensorArg((8,), "float32"),))


def test_xdg_location(monkeypatch, tmp_path):
    monkeypatch.delenv("METASPMD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "metaspmd"


def test_one_variable_moves_every_cache(monkeypatch, tmp_path):
    """METASPMD_CACHE_DIR moved the sample and program indexes, which name it in their
    errors, and not the rule cache."""
    torch_samples = pytest.importorskip("metaspmd.backends.torch.samples")
    monkeypatch.setenv("METASPMD_CACHE_DIR", str(tmp_path / "here"))
    assert default_cache_dir() == RuleCache().root == tmp_path / "here"
    assert torch_samples.cache_path().parent == tmp_path / "here"


def test_remembered_entries_persist_and_failures_do_not(tmp_path):
    cache = RuleCache(tmp_path)
    assert cache.get("torch", RELU, "self:f[*]") is None
    cache.remember("torch", RELU, entry())
    assert cache.get("torch", RELU, "self:f[*]") == entry()
    fresh = RuleCache(tmp_path)  # a new process sees the persisted entry
    assert fresh.get("torch", RELU, "self:f[*]") == entry()
    assert fresh.get("torch", RELU, "self:f[*,*]") is None
    failed = dataclasses.replace(entry("self:f[*,*,*]"), status="failed", reason="crashed: SIGFPE")
    cache.remember("torch", RELU, failed)
    assert cache.get("torch", RELU, "self:f[*,*,*]") is None


def _writer(root, n):
    cache = RuleCache(root)
    for _ in range(n):
        cache.put("torch", RELU, entry())


def test_concurrent_writers_leave_a_whole_file(tmp_path):
    procs = [mp.get_context("spawn").Process(target=_writer, args=(str(tmp_path), 30)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    assert RuleCache(tmp_path).get("torch", RELU, "self:f[*]") == entry()
    assert not list(tmp_path.rglob("*.tmp"))


def test_entries_are_keyed_by_verifier_and_framework_version(tmp_path, monkeypatch):
    """A rule found under another framework build, or before a verifier fix, is not read."""
    on_213 = RuleCache(tmp_path, framework_versions={"torch": "2.13.0+cpu"})
    on_213.put("torch", RELU, entry())
    expected = (tmp_path / f"rules-v{rules.VERIFIER_VERSION}-s{rules.SCHEMA_VERSION}-c{cache_module.FORMAT}"
                / "torch-2.13.0_cpu" / RELU)
    assert on_213.path("torch", RELU, "self:f[*]").parent == expected and load_record(on_213.path("torch", RELU, "self:f[*]"))
    assert RuleCache(tmp_path, framework_versions={"torch": "2.13.0+cpu"}).get("torch", RELU, "self:f[*]") == entry()
    assert RuleCache(tmp_path, framework_versions={"torch": "2.12.0"}).get("torch", RELU, "self:f[*]") is None
    monkeypatch.setattr(rules, "VERIFIER_VERSION", rules.VERIFIER_VERSION + 1)  # a soundness fix
    after_fix = RuleCache(tmp_path, framework_versions={"torch": "2.13.0+cpu"})
    assert after_fix.get("torch", RELU, "self:f[*]") is None
    assert after_fix.path("torch", RELU, "self:f[*]").parent != expected


def test_the_framework_version_comes_from_package_metadata_or_the_backend(tmp_path, monkeypatch):
    assert framework_version("numpy") == importlib.metadata.version("numpy")
    assert framework_version("no-such-framework") == "unversioned"
    assert f"numpy-{importlib.metadata.version('numpy')}" in RuleCache(tmp_path).path("numpy", "add", "s").parts
    monkeypatch.setattr(cache_module, "_FRAMEWORK_VERSIONS", {})  # registrations end with the test
    register_framework_version("fakefw", lambda: "1.0+local")
    assert "fakefw-1.0_local" in RuleCache(tmp_path).path("fakefw", "add", "s").parts


EXPLORED: list[str] = []


def _add(a, b):
    EXPLORED.append("add")
    return np.add(a, b)


ADD = NodeCall("self:f[*,*] other:f[*,*]", None, lambda: OpCase(
    "add", _add, tuple(np.random.default_rng(0).standard_normal((2, 6, 4))), {}, ("self", "other")))


def _resolved_again(tmp_path) -> tuple[RuleEntry, list[str]]:
    """ADD resolved once more with the cache at ``tmp_path``, which must explore it (not read
    it), and the cache's warnings on the way."""
    EXPLORED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = resolve_call("add", ADD, NumpyOps(), "numpy", RuleCache(tmp_path))
    assert EXPLORED
    return again, [str(w.message) for w in caught if w.category is RuleCacheWarning]


@pytest.mark.parametrize("edit", [
    lambda data: b"schema: 1\nop: add\n\xff\xfe not text\n",  # bad UTF-8
    lambda data: b"schema: 1\nop: add\nbackend: numpy\nstatus: ok\nentries: &e [*e]\n",  # a recursive alias
    lambda data: data[: len(data) // 2],  # torn
    lambda data: data.replace(b"gather(dim=0)", b"reduce(max)"),  # a wrong rule that still reads as a record
    lambda data: data.replace(b"status: ok", b"status: failed", 1),  # a hand-written failure
    lambda data: data.split(b"\n", 1)[1],  # the seal gone (a file another tool wrote)
], ids=["bad UTF-8", "recursive alias", "torn", "wrong rule", "hand-written failure", "no seal"])
def test_a_cached_file_changed_after_it_was_written_is_explored_again_and_rewritten(tmp_path, edit):
    first = resolve_call("add", ADD, NumpyOps(), "numpy", RuleCache(tmp_path))
    path = RuleCache(tmp_path).path("numpy", "add", ADD.signature)
    assert first.status == "ok" and load_record(path).entry(ADD.signature) == first
    edited = edit(path.read_bytes())
    assert edited != path.read_bytes()
    path.write_bytes(edited)
    again, ours = _resolved_again(tmp_path)
    assert again == first  # explored again, not read
    assert len(ours) == 1 and f"{path} was changed after metaspmd wrote it" in ours[0], ours  # naming the file
    assert load_record(path).entry(ADD.signature) == first  # rewritten
    EXPLORED.clear()
    assert resolve_call("add", ADD, NumpyOps(), "numpy", RuleCache(tmp_path)) == first and not EXPLORED


def test_a_sealed_entry_that_is_not_utf8_is_explored_again_and_rewritten(tmp_path):
    """The seal matches (a file written so, or copied whole from a damaged disk), the text
    does not decode: a warning naming the file and line, not a UnicodeDecodeError at every run."""
    first = resolve_call("add", ADD, NumpyOps(), "numpy", RuleCache(tmp_path))
    path = RuleCache(tmp_path).path("numpy", "add", ADD.signature)
    body = path.read_bytes().split(b"\n", 1)[1].replace(b"status: ok", b"status: \xff", 1)
    key = RuleCache(tmp_path)._sealed_key("numpy", "add", ADD.signature, ADD.implementation, ADD.pieces, ADD.at)
    path.write_bytes(cache_module._SEAL.encode() + cache_module._digest(key, body).encode() + b"\n" + body)
    again, ours = _resolved_again(tmp_path)
    assert again == first  # explored again, not read
    line = body[: body.index(b"\xff")].count(b"\n") + 2  # the seal is line 1
    assert len(ours) == 1 and f"{path}:{line}: not valid UTF-8 (byte 0xff" in ours[0], ours
    assert load_record(path).entry(ADD.signature) == first  # rewritten


def test_an_entry_too_large_for_a_rule_file_is_not_read_but_explored_again(tmp_path, monkeypatch):
    """It was read whole into memory before its seal was checked (300 MB in the audit)."""
    first = resolve_call("add", ADD, NumpyOps(), "numpy", RuleCache(tmp_path))
    path = RuleCache(tmp_path).path("numpy", "add", ADD.signature)
    os.truncate(path, registry_io.MOST_FILE_BYTES + 1)  # sparse: no disk used
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} was read"))
    again, ours = _resolved_again(tmp_path)
    assert again == first  # explored again, not read
    assert len(ours) == 1 and f"{path}: cannot read: 16,777,217 bytes, more than a rule file holds" in ours[0], ours
    monkeypatch.undo()
    assert load_record(path).entry(ADD.signature) == first  # rewritten


def _fifo(path):
    os.mkfifo(path)


@pytest.mark.parametrize("block", [
    lambda path: path.mkdir(parents=True),  # a folder where the entry's file belongs
    lambda path: (path.parent.parent.mkdir(parents=True), path.parent.write_text("a file, not the op's folder")),
    pytest.param(lambda path: (path.parent.mkdir(parents=True), _fifo(path)),
                 marks=pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")),  # would block the read
    lambda path: (path.parent.mkdir(parents=True), path.symlink_to("/dev/zero")),  # would fill memory
], ids=["folder", "file for the op's folder", "fifo", "device"])
def test_an_unusable_entry_is_skipped_with_one_warning_and_the_others_persist(tmp_path, block):
    cache = RuleCache(tmp_path)
    path = cache.path("torch", RELU, "self:f[*]")
    block(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.get("torch", RELU, "self:f[*]") is None
        cache.remember("torch", RELU, entry())
        assert cache.get("torch", RELU, "self:f[*]") == entry()  # kept in memory
        cache.remember("torch", "aten.gelu.default", entry())  # another op's entry is written as usual
    ours = [str(w.message) for w in caught if w.category is RuleCacheWarning]
    assert len(ours) == 1 and "cannot use the entry" in ours[0] and str(path) in ours[0], ours
    assert cache.persist
    assert RuleCache(tmp_path).get("torch", "aten.gelu.default", "self:f[*]") == entry()


def test_an_unusable_cache_folder_keeps_rules_in_memory_with_one_warning(tmp_path):
    root = tmp_path / "not-a-folder"
    root.write_text("a file where the cache folder should be")
    cache = RuleCache(root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.remember("torch", RELU, entry())  # the write fails first
        cache.remember("torch", RELU, entry("self:f[*,*]"))
        assert cache.get("torch", RELU, "self:f[*,*,*]") is None
    assert [w.category for w in caught] == [RuleCacheWarning] and str(root) in str(caught[0].message)
    assert cache.get("torch", RELU, "self:f[*]") == entry()  # nothing explored is lost
    assert cache.get("torch", RELU, "self:f[*,*]") == entry("self:f[*,*]")
    assert root.read_text() == "a file where the cache folder should be"
    with warnings.catch_warnings(record=True) as caught:  # a fresh cache that reads first, entry after entry
        warnings.simplefilter("always")
        fresh = RuleCache(root)
        assert fresh.get("torch", RELU, "self:f[*]") is None and fresh.get("torch", RELU, "self:f[*,*]") is None
        assert fresh.get("torch", "aten.gelu.default", "self:f[*]") is None
    assert [w.category for w in caught] == [RuleCacheWarning], [str(w.message) for w in caught]
    assert f"{root} is not a folder" in str(caught[0].message)


def test_a_folder_the_process_may_not_write_keeps_rules_in_memory_with_one_warning(tmp_path, monkeypatch):
    """The read-only folder below as any user sees it, root included (whom chmod does not
    stop): every write refused, the folder not writable by os.access."""
    def refused(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(cache_module, "write_text_atomic", refused)
    monkeypatch.setattr(cache_module.os, "access", lambda path, mode: False)
    cache = RuleCache(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.put("torch", RELU, entry())
        cache.put("torch", RELU, entry("self:f[*,*]"))
    assert [w.category for w in caught] == [RuleCacheWarning], [str(w.message) for w in caught]
    assert "is not writable" in str(caught[0].message) and "in memory" in str(caught[0].message)
    assert not cache.persist
    assert cache.get("torch", RELU, "self:f[*]") == entry()
    assert cache.get("torch", RELU, "self:f[*,*]") == entry("self:f[*,*]")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to a read-only folder")
def test_a_read_only_cache_folder_keeps_rules_in_memory_with_one_warning(tmp_path):
    tmp_path.chmod(0o500)
    try:
        cache = RuleCache(tmp_path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache.put("torch", RELU, entry())
            cache.put("torch", RELU, entry("self:f[*,*]"))
        assert [w.category for w in caught] == [RuleCacheWarning]
        assert cache.get("torch", RELU, "self:f[*]") == entry()
    finally:
        tmp_path.chmod(0o700)


def test_a_users_op_is_keyed_by_its_code_and_one_whose_code_cannot_be_read_stays_in_memory(tmp_path):
    cache = RuleCache(tmp_path)
    cache.remember("torch", "mylib.op.default", entry(), "abc")
    fresh = RuleCache(tmp_path)
    assert fresh.get("torch", "mylib.op.default", "self:f[*]", "abc") == entry()
    assert fresh.get("torch", "mylib.op.default", "self:f[*]", "abd") is None  # the op's code changed
    assert fresh.get("torch", "mylib.op.default", "self:f[*]") is None
    cache.remember("torch", "cpp.op.default", entry(), None)
    assert cache.get("torch", "cpp.op.default", "self:f[*]", None) == entry()  # this process keeps it
    assert RuleCache(tmp_path).get("torch", "cpp.op.default", "self:f[*]", None) is None
    assert not list(tmp_path.rglob("cpp.op.default*"))


@pytest.mark.parametrize("op", ["jax.mylib::scale", "jax.my scale", ".hidden", "x" * 300])
def test_an_op_name_no_file_may_have_is_cached_under_its_digest(tmp_path, op):
    RuleCache(tmp_path).remember("jax", op, entry())
    assert RuleCache(tmp_path).get("jax", op, "self:f[*]") == entry()
    assert RuleCache(tmp_path).get("jax", op + "x", "self:f[*]") is None
    assert all(len(p.name) < 200 for p in tmp_path.rglob("*"))


def test_a_cache_folder_removed_while_an_entry_is_written_is_made_again(tmp_path, monkeypatch):
    """Another process clearing the cache between the folder's mkdir and the temp file: the
    write is tried again, not reported as an unwritable folder for the rest of the process."""
    import shutil
    import tempfile

    real_mkstemp, removed = tempfile.mkstemp, []

    def cleared_first(*args, **kwargs):
        if not removed:
            removed.append(True)
            shutil.rmtree(tmp_path / "cache")
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", cleared_first)
    cache = RuleCache(tmp_path / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.remember("torch", RELU, entry())
    assert removed and cache.persist
    assert RuleCache(tmp_path / "cache").get("torch", RELU, "self:f[*]") == entry()


@pytest.mark.parametrize("given, where", [("~/rules", "{home}/rules"), ("rel/rules", "{cwd}/rel/rules")])
def test_a_cache_folder_given_as_a_shell_would_read_it_is_fixed_at_once(tmp_path, monkeypatch, given, where):
    """``~`` reaches the cache unexpanded from a Docker ENV or a systemd unit, and a relative
    folder was looked up again on each access: a chdir split the cache in two."""
    monkeypatch.setattr(cache_module, "_FIXED_DIRS", {})
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    expected = Path(where.format(home=tmp_path / "home", cwd=tmp_path))
    monkeypatch.setenv("METASPMD_CACHE_DIR", given)
    assert default_cache_dir() == expected
    cache = RuleCache(given)
    assert cache.root == expected
    monkeypatch.chdir(tmp_path / "home" if (tmp_path / "home").is_dir() else tmp_path.parent)
    cache.remember("torch", RELU, entry())
    assert RuleCache(expected).get("torch", RELU, "self:f[*]") == entry()
    assert not (tmp_path / "~").exists()


def test_a_relative_cache_folder_from_the_environment_stays_where_it_was_first_read(tmp_path, monkeypatch):
    """Each parallelize makes a RuleCache(), which read $METASPMD_CACHE_DIR again: after a
    chdir, a second cache beside the first, and every op explored again."""
    monkeypatch.setattr(cache_module, "_FIXED_DIRS", {})
    monkeypatch.setenv("METASPMD_CACHE_DIR", "relative/rules")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    RuleCache().remember("torch", RELU, entry())
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert RuleCache().root == tmp_path / "relative" / "rules"
    assert RuleCache().get("torch", RELU, "self:f[*]") == entry()
    assert not (tmp_path / "elsewhere" / "relative").exists()


@pytest.mark.parametrize("xdg", ["relative", "~/cache"])
def test_a_relative_xdg_cache_home_is_ignored_as_the_spec_says(tmp_path, monkeypatch, xdg):
    monkeypatch.delenv("METASPMD_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert default_cache_dir() == tmp_path / ".cache" / "metaspmd"


def test_a_cache_folder_with_a_nul_byte_is_refused_by_name():
    with pytest.raises(ValueError, match=r"cache folder .*bad\\x00name.* NUL byte"):
        RuleCache("/tmp/bad\0name")


@pytest.mark.parametrize("loop", ["root", "backend folder", "op folder"])
def test_a_folder_in_a_symlink_loop_gives_one_warning_not_one_per_entry(tmp_path, loop):
    root = tmp_path / "cache"
    cache = RuleCache(root)
    path = cache.path("torch", RELU, "self:f[*]")
    target = {"root": root, "backend folder": path.parent.parent, "op folder": path.parent}[loop]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(target)  # a link to itself
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for sig in ("self:f[*]", "self:f[*,*]", "self:f[*,*,*]"):
            assert cache.get("torch", RELU, sig) is None
            cache.remember("torch", RELU, entry(sig))
            assert cache.get("torch", RELU, sig) == entry(sig)  # kept in memory
    ours = [str(w.message) for w in caught if w.category is RuleCacheWarning]
    assert len(ours) == 1, ours
    assert "rewriting" not in ours[0] and "symbolic links" in ours[0] and "File exists" not in ours[0], ours


@pytest.mark.parametrize("error", ["ENOSPC", "EDQUOT", "EFBIG"])
def test_a_full_disk_turns_persistence_off_with_one_warning(tmp_path, monkeypatch, error):
    import errno

    def full(path, text):
        raise OSError(getattr(errno, error), os.strerror(getattr(errno, error)), str(path))

    monkeypatch.setattr(cache_module, "write_text_atomic", full)
    cache = RuleCache(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for sig in ("self:f[*]", "self:f[*,*]", "self:f[*,*,*]"):
            cache.remember("torch", RELU, entry(sig))
    ours = [str(w.message) for w in caught if w.category is RuleCacheWarning]
    assert len(ours) == 1 and "in memory" in ours[0] and os.strerror(getattr(errno, error)) in ours[0], ours
    assert not cache.persist
    assert all(cache.get("torch", RELU, sig) == entry(sig) for sig in ("self:f[*]", "self:f[*,*]", "self:f[*,*,*]"))


def test_a_runtime_backend_whose_name_no_folder_may_have_is_cached_under_a_stand_in(tmp_path):
    cache = RuleCache(tmp_path, framework_versions={"my fw/2": "1.0"})
    cache.remember("my fw/2", RELU, entry())
    assert RuleCache(tmp_path, framework_versions={"my fw/2": "1.0"}).get("my fw/2", RELU, "self:f[*]") == entry()
    assert RuleCache(tmp_path, framework_versions={"my fw/3": "1.0"}).get("my fw/3", RELU, "self:f[*]") is None


def test_an_entry_no_rule_file_may_hold_is_kept_in_memory_with_a_warning(tmp_path):
    """A string argument with a control character: the writer refuses it, which reached
    the caller of parallelize as a ValueError."""
    odd = dataclasses.replace(entry("self:f[*] sep='\\x1b'"),
                              example=Example((("self", TensorArg((8,), "float32")), ("sep", "\x1b"))))
    cache = RuleCache(tmp_path)
    with pytest.warns(RuleCacheWarning, match="cannot store an entry of aten.relu.default.*U\\+001B"):
        cache.remember("torch", RELU, odd)
    assert cache.get("torch", RELU, odd.signature) == odd
    assert not list(tmp_path.rglob("*.yaml"))


def test_a_cache_folder_that_cannot_be_made_warns_once_not_once_per_op(tmp_path, monkeypatch):
    """Under /proc, mkdir fails though os.access passes for root: one warning per op."""
    real = registry_io.write_text_atomic

    def no_folders(path, text):  # as a folder nothing can be made under
        if not path.parent.is_dir():
            raise FileNotFoundError(2, "No such file or directory", str(path.parent))
        return real(path, text)

    monkeypatch.setattr(cache_module, "write_text_atomic", no_folders)
    cache = RuleCache(tmp_path / "proc-like")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for op in (RELU, "aten.gelu.default", "aten.tanh.default"):
            cache.remember("torch", op, entry())
    ours = [str(w.message) for w in caught if issubclass(w.category, RuleCacheWarning)]
    assert len(ours) == 1 and "keeping explored rules in memory" in ours[0], ours
    assert cache.get("torch", "aten.gelu.default", "self:f[*]") == entry()  # kept in memory


def test_an_entry_copied_from_another_framework_versions_folder_is_explored_again(tmp_path):
    """The seal covered the key alone: a file copied from torch-2.12.0's folder into
    torch-2.13.0's was read as the newer torch's."""
    old = RuleCache(tmp_path, framework_versions={"torch": "2.12.0"})
    old.remember("torch", RELU, entry())
    new = RuleCache(tmp_path, framework_versions={"torch": "2.13.0"})
    target = new.path("torch", RELU, "self:f[*]")
    target.parent.mkdir(parents=True)
    target.write_bytes(old.path("torch", RELU, "self:f[*]").read_bytes())
    with pytest.warns(RuleCacheWarning, match="moved from another entry's place"):
        assert new.get("torch", RELU, "self:f[*]") is None
