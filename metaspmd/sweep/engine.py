"""The sweep: explore the selected ops in a worker pool and keep the registry in step
(write each record atomically, or in check mode compare it with the file)."""

from __future__ import annotations

import difflib
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..rules import OpRecord
from .config import SweepConfig, SweepError, nearest_ops, select_ops, unwritable
from .workers import STARTUP_TIMEOUT, Outcome, WorkerPool

# The status of an op that ran out of its time limit on both tries. It gets no record: how
# fast a machine is must not change the registry, so its file (if any) is left as it was.
TIMED_OUT = "timed-out"

@dataclass(frozen=True)
class OpResult:
    """One op in a sweep report. ``change`` is set in check mode: 'added', 'changed' or
    'unchanged' against the registry file; ``diff`` is a changed file's unified diff, so a
    check that fails once (in CI, say) shows what would change without a rerun, and
    ``after`` the order to replay it in, should it depend on what its worker ran before."""

    op: str
    status: str
    reason: str
    seconds: float
    change: str = ""
    diff: str = ""
    after: tuple[str, ...] = ()  # the ops its worker explored just before it
    retried: str = ""  # why a first try failed (a crash, a time limit), where it had a second
    kept: bool = False  # status TIMED_OUT: the op's previous file was there, and is left as it was


@dataclass(frozen=True)
class SweepReport:
    backend: str
    results: tuple[OpResult, ...]
    resumed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # check mode: registry files of ops no longer listed
    left: tuple[str, ...] = ()  # a write: files of ops the backend no longer lists, left as they are
    wall_s: float = 0.0
    check: bool = False
    not_swept: tuple[str, ...] = ()  # an interrupted sweep's ops that got no result

    def counts(self) -> Counter:
        return Counter(r.status for r in self.results)

    def timed_out(self) -> list[OpResult]:
        return [r for r in self.results if r.status == TIMED_OUT]

    def changes(self) -> list[tuple[str, str]]:
        """(kind, op or file name) for every difference a check found, sorted."""
        found = [(r.change, r.op) for r in self.results if r.change in ("added", "changed")]
        found += [("removed", name) for name in self.removed]
        return sorted(found, key=lambda c: (c[1], c[0]))

    @property
    def ops_per_s(self) -> float:
        return len(self.results) / self.wall_s if self.wall_s > 0 else 0.0


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C or a signal (``args``: as the KeyboardInterrupt's). ``report``
    holds the ops done before it, whose files are whole, and those not swept, so the caller
    can still print the summary and timings: an interrupted run loses nothing it finished."""

    def __init__(self, report: SweepReport, *args):
        super().__init__(*args)
        self.report = report


class _Unwritten(Exception):
    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class SweepWriteFailed(SweepError):
    """A rule file could not be written (a full disk): the sweep stopped there. ``report``
    holds the ops done before it, whose files are whole, and those not swept."""

    def __init__(self, report: SweepReport, error: OSError):
        super().__init__(str(error))
        self.report, self.error = report, error


def _loads_cleanly(path: Path, op: str, backend: str) -> bool:
    from .. import registry_io

    if not path.is_file():
        return False
    try:
        record = registry_io.load_record(path)
    except Exception as e:  # noqa: BLE001 - any unreadable file is redone
        # a sweep writes whole files only: this one was edited or damaged since, and is replaced
        print(f"warning: {e}\n  --resume explores {op} again and replaces {path}", file=sys.stderr)
        return False
    if (record.op, record.backend) != (op, backend):
        print(f"warning: {path} holds {record.backend} op {record.op}, not {backend} op {op}: --resume explores "
              f"{op} again and replaces it", file=sys.stderr)
        return False
    return True


def run_sweep(config: SweepConfig) -> SweepReport:
    """Run one sweep as configured; raises SweepError when it cannot run at all."""
    from .. import registry_io

    started = time.perf_counter()
    results: dict[str, OpResult] = {}
    _check_root(registry_io, config)
    _check_writable(config, config.out_root)  # before any work, not at the first op's file
    backend, todo, resumed = config.backend, [], ()
    stopped: KeyboardInterrupt | None = None
    unwritten: OSError | None = None
    try:
        with WorkerPool(config) as pool:
            backend = _start(pool, config.backend)
            every = pool.list_ops()
            ops = select_ops(every, config.patterns)
            # check mode: the files of no op of the backend, whatever --ops selects (CI checks a
            # subset, and codegen would put a stray file's rules into a table)
            strays = _stale_files(registry_io, config.out_root, backend, every)
            # each pattern must name something (an op, or a stray file's op in check mode): a
            # typo beside a good name would otherwise check less and pass
            stray_ops = [name.rsplit(".", 1)[0] for name in strays] if config.check else []
            unmatched = [p for p in config.patterns if p and not select_ops(every, [p]) and not select_ops(stray_ops, [p])]
            if unmatched or (not ops and not select_ops(stray_ops, config.patterns)):
                near = nearest_ops(every, unmatched or config.patterns)
                raise SweepError(f"no op of backend {backend!r} matches {', '.join(unmatched or config.patterns) or '*'}"
                                 + (f" (did you mean {' or '.join(near)}?)" if near else ""))
            if config.check and not (config.out_root / backend).is_dir():  # a mistyped --out: every op "added"
                raise SweepError(f"--out {config.out_root}: no {backend}/ folder of rule files to check")
            _check_file_names(registry_io, config.out_root, backend, ops)
            _check_writable(config, registry_io.record_path(config.out_root, backend, every[0]).parent)
            resumed = tuple(op for op in ops if config.resume
                            and _loads_cleanly(registry_io.record_path(config.out_root, backend, op), op, backend))
            todo = [op for op in ops if op not in set(resumed)]

            from tqdm import tqdm

            bar = tqdm(total=len(todo), unit="op", file=sys.stderr, disable=not config.progress,
                       desc=f"sweep {backend}", dynamic_ncols=True)
            failed = timed_out = 0

            def on_outcome(outcome: Outcome) -> None:
                nonlocal failed, timed_out
                record = outcome.record
                change, diff = "", ""
                if outcome.timed_out:
                    path = registry_io.record_path(config.out_root, backend, outcome.op)
                    results[outcome.op] = OpResult(outcome.op, TIMED_OUT, record.reason, outcome.seconds,
                                                   after=outcome.after, retried=outcome.retried, kept=path.is_file())
                    timed_out += 1
                    bar.set_postfix(failed=failed, timed_out=timed_out, refresh=False)
                    bar.update(1)
                    return
                if config.check:
                    change, diff = _compare(registry_io, config.out_root, record)
                else:
                    try:
                        registry_io.write_record(config.out_root, record)
                    except OSError as e:  # told apart from the pool's own OSErrors (a worker's pipe)
                        raise _Unwritten(e) from e
                results[outcome.op] = OpResult(outcome.op, record.status, record.reason, outcome.seconds, change, diff,
                                              outcome.after, outcome.retried)
                if record.status == "failed":
                    failed += 1
                    bar.set_postfix(failed=failed, timed_out=timed_out, refresh=False)
                bar.update(1)

            try:
                pool.run(todo, on_outcome)
            except KeyboardInterrupt as e:
                stopped = e
            except _Unwritten as e:  # a rule file that could not be written (a full disk): the rest waits
                unwritten = e.error
            finally:
                bar.close()

    except KeyboardInterrupt as e:  # while the backend loads or lists its ops: none done yet
        stopped = e
    if stopped is not None or unwritten is not None:  # raised here, once the pool has stopped its workers
        report = SweepReport(
            backend=backend, results=tuple(results[op] for op in sorted(results)), resumed=resumed,
            wall_s=time.perf_counter() - started, check=config.check,
            not_swept=tuple(op for op in todo if op not in results))
        if stopped is not None:
            raise SweepInterrupted(report, *stopped.args) from None
        raise SweepWriteFailed(report, unwritten) from unwritten
    removed: tuple[str, ...] = ()
    if config.check:  # with --ops, of the files the globs match, and every file of no op
        removed = tuple(sorted(set(strays) | set(_stale_files(registry_io, config.out_root, backend, ops,
                                                              config.patterns))))
    return SweepReport(
        backend=backend,
        results=tuple(results[op] for op in sorted(results)),
        resumed=resumed,
        removed=removed,
        # a write leaves them (a sweep of some modules is no reason to delete another's), and says so:
        # the --check after it reports them removed
        left=() if config.check else tuple(sorted(strays)),
        wall_s=time.perf_counter() - started,
        check=config.check,
    )


# A backend's one-time set-up runs in its first worker, whose output is hidden: a torch
# sweep's first run builds the OpInfo sample index there for a minute or more. A start
# that finds the index (importing torch and reading it: seconds) passes unsaid.
SLOW_START_S = 15.0


def _start(pool: WorkerPool, name: str) -> str:
    """``pool.start()``, saying once on stderr why nothing happens when it is slow."""
    kernels = pool.config.kernels
    timer = threading.Timer(SLOW_START_S, lambda: print(
        f"sweep: backend {name!r} is still setting up in its worker (loading the framework and its sample "
        "index; the first sweep on a machine builds that index, torch's OpInfo samples or JAX's traced "
        f"programs: a minute or more{f'; and importing --kernels {kernels}' if kernels else ''}; at most "
        f"{STARTUP_TIMEOUT:g} s)",
        file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        return pool.start()
    finally:
        timer.cancel()


def _check_root(registry_io, config: SweepConfig) -> None:
    """An existing root must be a registry root: a backend folder (registry/torch) would get a
    second backend folder inside it, and --check would call every op added."""
    problem = registry_io.path_problem(config.out_root, folder=True)  # a symlink loop, a file
    if problem:
        raise SweepError(f"--out {problem}")
    if config.out_root.exists():
        try:
            registry_io.check_registry_root(config.out_root)
        except registry_io.RegistryError as e:
            raise SweepError(f"--out {e}") from None
    elif config.check:  # a misspelt --out would read as a registry with every file to add
        raise SweepError(f"--out {config.out_root}: no such registry folder to check")


def _check_writable(config: SweepConfig, folder: Path) -> None:
    """A sweep that writes (not --check) fails at once when its registry folder is not writable."""
    problem = not config.check and unwritable(folder, folder=True)
    if problem:
        raise SweepError(f"cannot write rule files: {problem}")


def _check_file_names(registry_io, root: Path, backend: str, ops: list[str]) -> None:
    """Fail before any work when an op name cannot be a registry file name, or its file cannot
    be read and replaced: a folder there would fail the rename only after the op's work (and
    --check would call it added), a FIFO would block the read."""
    bad = []
    for op in ops:
        try:
            registry_io.record_path(root, backend, op)
        except ValueError:
            bad.append(op)
    if bad:
        raise SweepError(f"{len(bad)} op name(s) not usable as registry file names (at most "
                         f"{registry_io.MOST_NAME_CHARS} letters, digits, '_', '.' or '-', the first no '.' or '-'): "
                         f"{', '.join(bad[:5])}")
    problems = [p for p in (registry_io.path_problem(registry_io.record_path(root, backend, op), folder=False)
                            for op in ops) if p]
    if problems:
        raise SweepError(f"{len(problems)} rule file path(s) not usable: {'; '.join(problems[:5])}")


def _compare(registry_io, root: Path, record: OpRecord) -> tuple[str, str]:
    """('added' | 'changed' | 'unchanged', the unified diff of a changed file)."""
    path = registry_io.record_path(root, record.backend, record.op)
    if not path.is_file():
        return "added", ""
    new = registry_io.dump_record(record)
    if registry_io.same_text(path, new):
        return "unchanged", ""
    old = path.read_text(encoding="utf-8", errors="replace")  # a file that is not UTF-8 changes: shown as U+FFFD
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), str(path), "sweep", lineterm="", n=1)
    return "changed", "\n".join(lines)


def _stale_files(registry_io, root: Path, backend: str, ops: list[str], patterns: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The rule files of none of ``ops`` (of those whose names ``patterns`` match, if any)."""
    if not ops:
        return ()
    expected = {registry_io.record_path(root, backend, op).name for op in ops}
    folder = registry_io.record_path(root, backend, ops[0]).parent
    if not folder.is_dir():
        return ()
    # .yml and .YAML too: codegen refuses a registry holding one, so --check calls it stale
    return tuple(sorted(p.name for p in folder.iterdir() if p.suffix.lower() in (".yaml", ".yml")
                        and p.name not in expected and select_ops([p.stem], patterns)))
