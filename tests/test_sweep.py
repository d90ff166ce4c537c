"""The sweep engine and command, on a numpy fake backend whose ops succeed, raise, hang,
segfault, abort and exit (tests/fake_backend)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metaspmd.registry_io import load_record, record_path
from metaspmd.sweep import (
    SweepConfig, SweepError, clean_reason, describe_exit, format_summary, nearest_ops, run_sweep, select_ops,
    split_patterns,
)
from metaspmd.sweep.workers import WORKER_THREADS

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TOOL = REPO / "tools" / "sweep.py"
BACKEND = "fake_backend"
# Every op but fake.hang (slow), fake.threads (it reports its worker's thread limit) and fake.once.
FAST_OPS = ("fake.a*", "fake.e*", "fake.matmul", "fake.nosample", "fake.r*", "fake.s*")

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fake_backend_importable(monkeypatch):
    # Spawned workers start with the parent's sys.path, so they find the backend too.
    monkeypatch.syspath_prepend(str(TESTS))


def sweep(out: Path, **kw) -> "SweepReport":  # noqa: F821
    kw.setdefault("jobs", 2)
    kw.setdefault("timeout", 20.0)
    return run_sweep(SweepConfig(backend=BACKEND, out_root=out, explorer="fake_backend:explore_op", **kw))


@pytest.fixture(scope="session")
def swept(tmp_path_factory) -> Path:
    """FAST_OPS swept once (two workers) for the tests that start from such a registry; they
    copy it before changing it."""
    out = tmp_path_factory.mktemp("swept")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(TESTS))
        sweep(out, patterns=FAST_OPS)
    return out


def copy_of(registry: Path, to: Path) -> Path:
    shutil.copytree(registry, to, dirs_exist_ok=True)
    return to


def files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "fake").iterdir())}


def summary_rows(report) -> dict[str, str]:
    """The summary table as {label: value}: labels hold no double space."""
    return {k: v.strip() for k, _, v in (line.partition("  ") for line in format_summary(report).splitlines())}


def cli(*args: str, timeout: float = 50) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(TOOL), "--backend", BACKEND, "--no-progress", *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- helpers


def test_select_ops_globs():
    ops = ["aten.mm.default", "aten.add.Tensor", "aten.add.out", "aten.bmm.default"]
    assert select_ops(ops, split_patterns(["aten.add.*,aten.mm*"])) == ["aten.add.Tensor", "aten.add.out", "aten.mm.default"]
    assert select_ops(ops, split_patterns(["*mm*", "aten.add.out"])) == ["aten.add.out", "aten.bmm.default", "aten.mm.default"]
    assert select_ops(ops, ()) == sorted(ops)
    assert select_ops(ops, ["nothing*"]) == []
    assert nearest_ops(ops, ["aten.add.Tensr", "aten.mm*"]) == ["aten.add.Tensor"]  # a glob that matches: no hint


def test_failure_reasons_carry_no_paths_or_addresses():
    text = "bad object at 0x7f3a2b1c9d40 in /opt/somewhere/lib/kernels.py, line 3\nTraceback..."
    assert clean_reason(text) == "bad object at 0x… in kernels.py, line 3"
    assert describe_exit(-signal.SIGSEGV) == "crashed: SIGSEGV"
    assert describe_exit(-signal.SIGKILL) == "crashed: SIGKILL"
    assert describe_exit(3) == "crashed: exit code 3"
    assert describe_exit(0) == "crashed: the process exited (code 0) during the op"  # "exit code 0" read as success


def test_workers_run_ops_on_one_thread_whatever_the_environment(tmp_path, monkeypatch):
    # a kernel's sums differ in the last bits with its thread count: one thread, always
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    report = sweep(tmp_path, jobs=1, patterns=("fake.threads",))
    assert WORKER_THREADS == 1 and report.results[0].reason == "cases: ValueError: OMP_NUM_THREADS=1"


def test_engine_imports_no_framework():
    code = "import sys, metaspmd.sweep; print(sorted({'torch', 'jax', 'tvm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_default_out_root_is_the_repository_registry():
    spec = importlib.util.spec_from_file_location("sweep_tool", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.REGISTRY == REPO / "registry"


# --------------------------------------------------------------------------- the sweep


def test_every_outcome_is_recorded_and_the_sweep_survives(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # One worker: after the timeout and each crash, a fresh worker must take the next ops.
    # fake.hang sleeps: it burns no CPU time, so the wall-clock guard stops it.
    report = sweep(tmp_path, jobs=1, timeout=1.5, wall_timeout=2.0)
    by_op = {r.op: r for r in report.results}
    assert len(by_op) == 15 and report.backend == "fake"
    expected = {
        "fake.add": ("ok", ""),
        "fake.once": ("ok", ""),
        "fake.matmul": ("ok", ""),
        "fake.sum": ("ok", ""),
        "fake.nosample": ("no-sample", "no sample input"),
        "fake.skipped": ("skipped", "in-place variant"),
        "fake.random": ("nondeterministic", "the op is marked nondeterministic"),
        "fake.raise": ("failed", "cases: ValueError: no kernel for this dtype"),
        "fake.escape": ("failed", "RuntimeError: explorer bug at 0x… in explorer.py"),
        "fake.exit": ("failed", "SystemExit: 3"),
        "fake.interrupt": ("failed", "KeyboardInterrupt"),  # the op's own raise: was "crashed: exit code 1"
        "fake.threads": ("failed", "cases: ValueError: OMP_NUM_THREADS=1"),
        "fake.segv": ("failed", "crashed: SIGSEGV"),
        "fake.abort": ("failed", "crashed: SIGABRT"),
    }
    for op, (status, reason) in expected.items():
        record = load_record(record_path(tmp_path, "fake", op))
        assert (record.status, record.reason) == (status, reason), op
        assert (by_op[op].status, by_op[op].reason) == (status, reason), op
    assert load_record(record_path(tmp_path, "fake", "fake.matmul")).entries[0].combine.as_dict()
    # out of time on both tries: no record, and no file where there was none
    hang = "timeout: no result after 2s of wall time (hung: 0.0s of CPU time)"
    assert (by_op["fake.hang"].status, by_op["fake.hang"].reason, by_op["fake.hang"].kept) == ("timed-out", hang, False)
    assert not record_path(tmp_path, "fake", "fake.hang").exists()
    assert 1.9 < by_op["fake.hang"].seconds < 10
    # each crash and timeout had a second try, in a fresh worker, which failed alike
    assert {op: r.retried for op, r in by_op.items() if r.retried} == {
        "fake.hang": hang, "fake.segv": "crashed: SIGSEGV", "fake.abort": "crashed: SIGABRT"}
    rows = summary_rows(report)
    assert rows["with rules (ok)"] == "4"
    assert rows["failed"] == ("7  (crashes 2; fake.abort, fake.escape, fake.exit, fake.interrupt, fake.raise, fake.segv, "
                              "fake.threads)")
    assert rows["timed out, no previous file"] == "1  (fake.hang)"
    assert rows["retried"] == "3  (passed on the second try 0: -)"
    assert not list((tmp_path / "fake").glob(".*")), "temp files left behind"


def test_a_killed_worker_leaks_no_semaphore(tmp_path):
    # fake.hang opens a progress bar, then hangs until the time limit kills its worker.
    run = cli("--out", str(tmp_path), "--ops", "fake.hang,fake.add", "--timeout", "1", "--wall-timeout", "1",
              "--jobs", "1")
    assert run.returncode == 3, run.stderr
    assert "leaked semaphore" not in run.stderr, run.stderr


def test_an_op_that_crashes_once_passes_on_its_second_try(tmp_path, monkeypatch):
    # a worker killed once (for memory, say) must not leave a failed record in the registry
    monkeypatch.setenv("FAKE_ONCE_MARK", str(tmp_path / "crashed"))
    report = sweep(tmp_path / "out", jobs=2, patterns=("fake.add", "fake.once", "fake.sum"))
    once = next(r for r in report.results if r.op == "fake.once")
    assert (once.status, once.retried) == ("ok", "crashed: SIGSEGV") and (tmp_path / "crashed").exists()
    assert load_record(record_path(tmp_path / "out", "fake", "fake.once")).status == "ok"
    assert summary_rows(report)["retried"] == "1  (passed on the second try 1: fake.once)"


def test_backend_preparation_is_outside_the_op_time_limit(tmp_path):
    report = sweep(tmp_path, jobs=2, timeout=1.0, patterns=("fake.add", "fake.sum"),
                   backend_options=(("prepare_seconds", "1.5"),))
    assert [(r.op, r.status) for r in report.results] == [("fake.add", "ok"), ("fake.sum", "ok")]


def test_files_are_byte_identical_across_jobs_and_runs(tmp_path, swept):
    one, two, again = tmp_path / "one", swept, tmp_path / "again"
    sweep(one, jobs=1, patterns=FAST_OPS)
    sweep(again, jobs=2, patterns=FAST_OPS)
    assert len(files(one)) == 11
    assert files(one) == files(two) == files(again)


def test_a_sweep_leaves_unchanged_files_as_they_were_and_keeps_a_changed_files_mode(tmp_path, swept):
    """Every file was rewritten: its time stamp moved and its mode became 0666 less the
    umask (a 0444 file writable, a 0664 one 0644), whatever it was."""
    shutil.copytree(swept, tmp_path / "reg")
    folder = tmp_path / "reg" / "fake"
    add, matmul = folder / "fake.add.yaml", folder / "fake.matmul.yaml"
    add.write_text(add.read_text().replace("gather(dim=0)", "gather(dim=1)"))
    add.chmod(0o664)
    matmul.chmod(0o444)
    os.utime(matmul, ns=(10**18, 10**18))
    before = files(tmp_path / "reg")
    sweep(tmp_path / "reg", jobs=1, patterns=("fake.add", "fake.matmul"))
    assert files(tmp_path / "reg")["fake.add.yaml"] == files(swept)["fake.add.yaml"] != before["fake.add.yaml"]
    assert (add.stat().st_mode & 0o777, matmul.stat().st_mode & 0o777) == (0o664, 0o444)
    assert matmul.stat().st_mtime_ns == 10**18


@pytest.mark.slow  # the CLI in four subprocess sweeps; CI's own --check runs the same path on the registry
def test_check_reports_changes_and_writes_nothing(tmp_path):
    assert cli("--out", str(tmp_path), "--ops", ",".join(FAST_OPS)).returncode == 0
    before = files(tmp_path)

    ok = cli("--out", str(tmp_path), "--ops", ",".join(FAST_OPS), "--check")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "registry is up to date" in ok.stdout

    add = tmp_path / "fake" / "fake.add.yaml"
    add.write_text(add.read_text().replace("gather(dim=0)", "gather(dim=1)"))
    (tmp_path / "fake" / "fake.sum.yaml").unlink()
    (tmp_path / "fake" / "fake.retired.yaml").write_bytes(before["fake.raise.yaml"])
    (tmp_path / "fake" / "fake.zzz.yaml").write_bytes(before["fake.raise.yaml"])
    (tmp_path / "fake" / "fake.threads.yaml").write_bytes(before["fake.raise.yaml"])  # an op left out of the subset
    (tmp_path / "fake" / "fake.add.yml").write_bytes(before["fake.raise.yaml"])  # misnamed: codegen refuses it
    edited = files(tmp_path)
    bad = cli("--out", str(tmp_path), "--ops", ",".join(FAST_OPS), "--check")
    assert bad.returncode == 1
    assert "changed  fake.add  (now ok)" in bad.stdout and "added    fake.sum" in bad.stdout
    # The changed file's diff is printed under its name: the edit, and what the sweep gives.
    assert "    -  combine: {S1: gather(dim=1), S2" in bad.stdout, bad.stdout
    assert "    +  combine: {S1: gather(dim=0), S2" in bad.stdout, bad.stdout
    # an --ops subset reports every file of no op of the backend (fake.zzz too: codegen would
    # table its rules), and no file of an op it left out (fake.threads)
    assert "removed  fake.retired.yaml" in bad.stdout and "removed  fake.zzz.yaml" in bad.stdout, bad.stdout
    assert "fake.threads" not in bad.stdout and "removed  fake.add.yml" in bad.stdout, bad.stdout
    assert files(tmp_path) == edited
    # a subset whose globs match no op, but a stray file: that file is named (exit 1)
    stray = cli("--out", str(tmp_path), "--ops", "fake.zz*", "--check")
    assert stray.returncode == 1 and "removed  fake.zzz.yaml" in stray.stdout, stray.stdout + stray.stderr
    # a write leaves such files, and names them: the check after it reported them, unsaid before
    write = cli("--out", str(tmp_path), "--ops", "fake.add")
    assert write.returncode == 0 and "files of no op, left  3  (fake.add.yml, fake.retired.yaml, fake.zzz.yaml; " \
        "delete them: --check reports them removed)" in write.stdout, write.stdout
    add.write_bytes(edited["fake.add.yaml"])  # the write fixed it: the edit again, for the checks below

    # Without --ops every listed op is compared, and files of unlisted ops show up.
    full = sweep(tmp_path, check=True, timeout=1.0, wall_timeout=1.0)
    assert ("removed", "fake.retired.yaml") in full.changes() and ("removed", "fake.zzz.yaml") in full.changes()
    assert ("changed", "fake.threads") in full.changes()
    # an op out of time is not compared: a slow machine must not make the registry look stale
    assert [r.op for r in full.timed_out()] == ["fake.hang"] and "fake.hang" not in dict(full.changes()).values()
    assert files(tmp_path) == edited


def test_changes_name_the_worker_history_to_replay():
    from metaspmd.sweep import OpResult, SweepReport, format_changes

    report = SweepReport("fake", (
        OpResult("fake.add", "failed", "crashed: SIGSEGV", 0.1, "changed", "-a\n+b", after=("fake.abort", "fake.abs")),
        OpResult("fake.sum", "ok", "", 0.1, "added", after=("fake.add",)),
    ), check=True)
    assert format_changes(report).splitlines() == [
        "changed  fake.add  (now failed: crashed: SIGSEGV)",
        "    explored after fake.abort, fake.abs in its worker (replay: --jobs 1 --ops fake.abort,fake.abs,fake.add)",
        "    -a",
        "    +b",
        "added    fake.sum",
    ]


def test_resume_skips_ops_whose_file_loads(tmp_path, swept, capsys):
    copy_of(swept, tmp_path)
    (tmp_path / "fake" / "fake.sum.yaml").unlink()
    (tmp_path / "fake" / "fake.add.yaml").write_text("schema: 1\nop: fake.add\nstatus: [\n")  # hand-damaged
    (tmp_path / "fake" / "fake.matmul.yaml").write_text((tmp_path / "fake" / "fake.random.yaml").read_text())
    report = sweep(tmp_path, patterns=FAST_OPS, resume=True)
    assert [r.op for r in report.results] == ["fake.add", "fake.matmul", "fake.sum"]
    assert len(report.resumed) == 8 and "fake.add" not in report.resumed
    assert load_record(record_path(tmp_path, "fake", "fake.add")).status == "ok"
    assert load_record(record_path(tmp_path, "fake", "fake.matmul")).op == "fake.matmul"
    # a sweep writes whole files only: what does not load was edited or damaged, and is replaced, said
    err = capsys.readouterr().err
    assert "fake.add.yaml:4: " in err and f"--resume explores fake.add again and replaces {tmp_path}" in err
    assert "fake.matmul.yaml holds fake op fake.random, not fake op fake.matmul: --resume explores" in err


def test_usage_errors_exit_2(tmp_path):
    unknown = subprocess.run([sys.executable, str(TOOL), "--backend", "no_such_backend", "--out", str(tmp_path)],
                             capture_output=True, text=True, timeout=30)
    assert unknown.returncode == 2 and "unknown backend 'no_such_backend'" in unknown.stderr
    nomatch = cli("--out", str(tmp_path), "--ops", "aten.*")
    assert nomatch.returncode == 2 and "no op of backend 'fake' matches aten.*" in nomatch.stderr
    assert "did you mean" not in nomatch.stderr  # nothing near
    typo = cli("--out", str(tmp_path), "--ops", "fake.matmull")
    assert typo.returncode == 2 and "matches fake.matmull (did you mean fake.matmul?)" in typo.stderr
    # a typo beside a good name, in a sweep or a check, is refused too: it would check less and pass
    for check in ((), ("--check",)):
        beside = cli("--out", str(tmp_path), *check, "--ops", "fake.add,fake.matmull", "--ops", "fake.s*")
        assert beside.returncode == 2, beside.stderr
        assert "no op of backend 'fake' matches fake.matmull (did you mean fake.matmul?)" in beside.stderr
    assert not (tmp_path / "fake").exists()
    with pytest.raises(SweepError, match="cannot load backend 'fake_backend': RuntimeError: cannot start: broken"):
        sweep(tmp_path, backend_options=(("fail", "broken"),))


def test_interrupt_leaves_only_complete_files_and_reports_what_it_finished(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    timings = tmp_path / "timings.json"
    proc = subprocess.Popen(
        [sys.executable, str(TOOL), "--backend", BACKEND, "--no-progress", "--out", str(tmp_path), "--timeout", "30",
         "--timings", str(timings)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    folder = tmp_path / "fake"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(list(folder.glob("*.yaml"))) < 14:  # all but fake.hang
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    names = sorted(p.name for p in folder.iterdir())
    assert "fake.hang.yaml" not in names and len(names) == 14
    for name in names:
        load_record(folder / name)
    # the ops it finished are summed up and timed as a whole sweep's are; the rest are counted
    done = json.loads(timings.read_text())
    assert sorted(done["ops"]) == sorted(name[:-len(".yaml")] for name in names), done
    assert "fake.hang" in done["not_swept"] and not set(done["not_swept"]) & set(done["ops"]), done
    assert re.search(rf"^ops +{len(names)}$", out, re.M) and "with rules (ok)" in out, out
    assert re.search(rf"not swept \(interrupted\) +{len(done['not_swept'])}  \(--resume sweeps them", out), out


def test_sigterm_stops_the_sweep_and_its_hung_worker(tmp_path, stops_growing):
    beats = tmp_path / "beats"
    env = dict(os.environ, PYTHONPATH=str(TESTS), FAKE_HANG_BEATS=str(beats))
    proc = subprocess.Popen(
        [sys.executable, str(TOOL), "--backend", BACKEND, "--no-progress", "--out", str(tmp_path), "--timeout", "30"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    folder = tmp_path / "fake"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (len(list(folder.glob("*.yaml"))) < 14 or not beats.exists()):
        time.sleep(0.1)
    assert beats.exists(), "fake.hang never ran"
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "interrupted" in err
    assert stops_growing(beats), "the worker in fake.hang outlived the sweep"
    names = sorted(p.name for p in folder.iterdir())
    assert "fake.hang.yaml" not in names and len(names) == 14
    for name in names:
        load_record(folder / name)


_ORPHAN = """
import multiprocessing, sys, time
from metaspmd.sweep.workers import exit_with_parent

def child(beats):
    exit_with_parent(interval=0.1)
    for _ in range(600):
        with open(beats, "a") as f:
            f.write(".")
        time.sleep(0.1)

if __name__ == "__main__":
    multiprocessing.get_context("spawn").Process(target=child, args=(sys.argv[1],)).start()
    time.sleep(600)
"""


def test_a_worker_exits_when_its_parent_is_killed(outlives_killed_parent):
    assert not outlives_killed_parent(_ORPHAN), "the worker outlived its killed parent"


_HOLDS_THE_GIL = """
import multiprocessing, os, re, sys, time
from metaspmd.sweep.workers import die_with_parent, exit_with_parent

def child(pid_file):
    exit_with_parent(interval=0.1)
    die_with_parent()
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    re.match(r"(a+)+$", "a" * 64 + "b")  # backtracks for ages without releasing the GIL

if __name__ == "__main__":
    multiprocessing.get_context("spawn").Process(target=child, args=(sys.argv[1],)).start()
    time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_whose_op_holds_the_gil_dies_with_its_parent(tmp_path):
    """exit_with_parent's thread never ran while the op held the GIL: the worker ran on,
    orphaned, at full CPU."""
    script, pid_file = tmp_path / "parent.py", tmp_path / "pid"
    script.write_text(_HOLDS_THE_GIL)
    proc = subprocess.Popen([sys.executable, str(script), str(pid_file)])
    pid = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not pid_file.exists():
            time.sleep(0.1)
        pid = int(pid_file.read_text())
        time.sleep(0.5)
        assert _running(pid), "the worker ended on its own"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.1)
        assert not _running(pid), "the worker outlived its killed parent"
    finally:
        proc.kill()
        if pid is not None and _running(pid):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- time limits
# The limit counts CPU time, so a run's result never depends on how fast or loaded the
# machine is; an op out of time twice keeps its previous file.

SLOW = (("slow", "1"),)  # the fake backend's time-limit and kill ops: fake.spin, .busy, .nap, .killed, .orphan


def test_a_timed_out_op_keeps_its_file(tmp_path, swept):
    copy_of(swept, tmp_path)
    previous = (tmp_path / "fake" / "fake.add.yaml").read_bytes().replace(b"fake.add", b"fake.hang")
    (tmp_path / "fake" / "fake.hang.yaml").write_bytes(previous)
    before = files(tmp_path)
    report = sweep(tmp_path, patterns=("fake.hang", "fake.sum"), timeout=1.0, wall_timeout=0.5)
    assert files(tmp_path) == before
    hang = next(r for r in report.results if r.op == "fake.hang")
    assert (hang.status, hang.kept, hang.retried.startswith("timeout")) == ("timed-out", True, True)
    assert summary_rows(report)["timed out, kept previous file"] == "1  (fake.hang)"

    # the command exits 3, under --check too, which finds no difference and calls nothing stale
    for check in ((), ("--check",)):
        run = cli("--out", str(tmp_path), "--ops", "fake.hang,fake.sum", "--wall-timeout", "0.5", *check)
        assert run.returncode == 3, run.stdout + run.stderr
        assert "timed out, kept previous file  1  (fake.hang)" in run.stdout
        assert "ran out of time (or out of memory, or were killed by SIGKILL) on both tries; their files were " \
               "left as they were" in run.stderr
        assert "would change" not in run.stdout and "up to date" not in run.stdout
    assert "check: no difference; 1 op(s) timed out and were not compared" in run.stdout
    assert files(tmp_path) == before


def test_an_op_killed_by_sigkill_keeps_its_file(tmp_path, swept):
    """The out-of-memory killer's signal says the machine ran short, not what the op is: its
    file was rewritten as failed ("crashed: SIGKILL") and the sweep exited 0."""
    copy_of(swept, tmp_path)
    previous = (tmp_path / "fake" / "fake.add.yaml").read_bytes().replace(b"fake.add", b"fake.killed")
    (tmp_path / "fake" / "fake.killed.yaml").write_bytes(previous)
    before = files(tmp_path)
    report = sweep(tmp_path, patterns=("fake.killed", "fake.segv"), backend_options=SLOW)
    by_op = {r.op: r for r in report.results}
    killed = by_op["fake.killed"]
    assert (killed.status, killed.kept) == ("timed-out", True)
    assert killed.reason == killed.retried == "killed by SIGKILL (out of memory, or another process)"
    assert files(tmp_path) == before  # fake.segv's own crash is the op's: recorded as it was
    rows = summary_rows(report)
    assert rows["killed (SIGKILL), kept previous file"] == "1  (fake.killed)"
    assert rows["failed"] == "1  (crashes 1; fake.segv)"


def test_an_op_whose_runs_fail_to_allocate_keeps_its_file(tmp_path, swept):
    """The explorer read each failed run as a strategy that does not hold: the file lost two
    of its rules, and the sweep exited 0 with nothing failed."""
    copy_of(swept, tmp_path)
    previous = (tmp_path / "fake" / "fake.add.yaml").read_bytes().replace(b"fake.add", b"fake.oom")
    (tmp_path / "fake" / "fake.oom.yaml").write_bytes(previous)
    before = files(tmp_path)
    report = sweep(tmp_path, patterns=("fake.oom",), backend_options=SLOW)
    oom = report.results[0]
    assert (oom.op, oom.status, oom.kept) == ("fake.oom", "timed-out", True)
    assert oom.reason.startswith("out of memory: fake.oom: a run of the op failed to allocate memory: ")
    assert oom.retried.startswith("out of memory: ")
    assert files(tmp_path) == before
    assert summary_rows(report)["out of memory, kept previous file"] == "1  (fake.oom)"


def test_processes_an_op_starts_end_with_its_worker(tmp_path, monkeypatch, stops_growing):
    """A subprocess the op left running outlived the worker the time limit killed, busy
    after the sweep had ended."""
    beats = tmp_path / "beats"
    monkeypatch.setenv("FAKE_ORPHAN_BEATS", str(beats))
    report = sweep(tmp_path / "out", patterns=("fake.orphan",), timeout=1.0, wall_timeout=1.0, backend_options=SLOW)
    assert [(r.op, r.status) for r in report.results] == [("fake.orphan", "timed-out")]
    assert beats.exists(), "fake.orphan's process never ran"
    assert stops_growing(beats), "the process fake.orphan started outlived the sweep"


def test_sighup_stops_the_sweep_as_sigterm_does(tmp_path):
    """A closed terminal: the sweep exited 129 with its workers left to notice alone."""
    proc = subprocess.Popen(
        [sys.executable, str(TOOL), "--backend", BACKEND, "--no-progress", "--out", str(tmp_path), "--timeout", "30",
         "--ops", "fake.hang"], env=dict(os.environ, PYTHONPATH=str(TESTS)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert "interrupted; files written so far are complete" in err and "Traceback" not in err


def test_the_limit_counts_cpu_time_not_wall_time(tmp_path, monkeypatch):
    # fake.nap waits 2.5 s burning no CPU, as an op starved on a loaded machine does: under a
    # 1 s limit it passes; fake.spin burns CPU for ever, and the CPU limit, not the guard, stops it
    monkeypatch.setenv("FAKE_NAP_S", "2.5")
    report = sweep(tmp_path, patterns=("fake.nap", "fake.spin"), timeout=1.0, wall_timeout=20.0, backend_options=SLOW)
    by_op = {r.op: r for r in report.results}
    assert (by_op["fake.nap"].status, by_op["fake.nap"].retried) == ("ok", "") and by_op["fake.nap"].seconds > 2.5
    assert (by_op["fake.spin"].status, by_op["fake.spin"].reason) == ("timed-out", "timeout after 1s")
    assert by_op["fake.spin"].seconds < 10
    assert load_record(record_path(tmp_path, "fake", "fake.nap")).status == "ok"
    assert not record_path(tmp_path, "fake", "fake.spin").exists()


@pytest.mark.slow  # two sweeps of ops that burn CPU up to and past their limits: 12 s
def test_the_limit_is_counted_per_example_calls(tmp_path, monkeypatch):
    # fake.many has 45 example calls, fake.busy one; each burns 1.2 s of CPU under a 1 s limit
    # per 20 calls: fake.many is given 3 s and passes (its 45 explorations take some too),
    # fake.busy times out on both tries
    from metaspmd.sweep.config import CASES_PER_TIMEOUT, limit_units

    assert (limit_units(0), limit_units(1), limit_units(CASES_PER_TIMEOUT), limit_units(45)) == (1, 1, 1, 3)
    monkeypatch.setenv("FAKE_MANY_S", "1.2")
    monkeypatch.setenv("FAKE_BUSY_S", "1.2")
    report = sweep(tmp_path, patterns=("fake.many", "fake.busy"), timeout=1.0, wall_timeout=30.0,
                   backend_options=SLOW)
    by_op = {r.op: r for r in report.results}
    assert (by_op["fake.many"].status, by_op["fake.many"].retried) == ("ok", ""), by_op["fake.many"]
    assert load_record(record_path(tmp_path, "fake", "fake.many")).status == "ok"
    assert (by_op["fake.busy"].status, by_op["fake.busy"].reason) == ("timed-out", "timeout after 1s")
    # past its own, larger limit, an op's reason says how it was counted
    monkeypatch.setenv("FAKE_MANY_S", "60")
    report = sweep(tmp_path / "again", patterns=("fake.many",), timeout=0.5, wall_timeout=30.0, backend_options=SLOW)
    many = report.results[0]
    assert (many.status, many.reason) == ("timed-out", "timeout after 1.5s for 45 example calls (the limit per 20)")


def test_a_cpu_bound_op_on_a_loaded_machine_is_not_timed_out(tmp_path, monkeypatch):
    # fake.busy burns 1 s of CPU under a 1.5 s limit while busy processes, two per core, hold
    # the cores: it takes longer than the limit in wall time, and passes
    monkeypatch.setenv("FAKE_BUSY_S", "1.0")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        report = sweep(tmp_path, jobs=1, patterns=("fake.busy",), timeout=1.5, wall_timeout=30.0, backend_options=SLOW)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    busy = report.results[0]
    assert (busy.status, busy.retried) == ("ok", ""), busy
    assert busy.seconds > 1.5, f"not loaded: {busy.seconds:.2f}s"  # else the test shows nothing


def test_an_op_runs_in_the_process_state_its_worker_had_before_it(tmp_path, monkeypatch):
    """The working folder, the environment and Python's and numpy's random states an op
    changes are given back: a later op in the same worker would see them."""
    import random

    import numpy as np

    from metaspmd.sweep.workers import _state_kept

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("METASPMD_KEPT", "1")
    cwd, environ = os.getcwd(), dict(os.environ)
    py_state, np_state = random.getstate(), np.random.get_state()
    with _state_kept(object()):  # no backend settings of its own
        os.chdir("/")
        os.environ["METASPMD_ADDED"] = "1"
        del os.environ["METASPMD_KEPT"]
        random.seed(1)
        np.random.seed(1)
    assert (os.getcwd(), dict(os.environ)) == (cwd, environ)
    assert random.getstate() == py_state
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(np.random.get_state(), np_state))


def test_text_no_rule_file_may_hold_is_escaped_in_a_reason_and_fails_its_op_elsewhere(tmp_path, monkeypatch):
    """An error message in colour, or a record with a bell in it, stopped the whole sweep
    once the writer refused control characters: the first is written escaped, the second
    is its op's failure, and the sweep goes on."""
    monkeypatch.setenv("FAKE_COLOUR", "1")
    monkeypatch.setenv("FAKE_UNWRITABLE", "fake.add")
    report = sweep(tmp_path, patterns=("fake.escape", "fake.add", "fake.matmul"))
    by_op = {r.op: r for r in report.results}
    escape = load_record(record_path(tmp_path, "fake", "fake.escape"))
    assert escape.reason == "RuntimeError: \\x1b[31mexplorer bug\\x1b[0m at 0x… in explorer.py", escape.reason
    add = load_record(record_path(tmp_path, "fake", "fake.add"))
    assert add.status == "failed" and "control character U+0007" in add.reason and "\\x07" in add.reason, add.reason
    assert by_op["fake.matmul"].status == "ok"
