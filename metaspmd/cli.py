"""The ``metaspmd`` command: one entry point for the repository's command lines.

    metaspmd sweep --backend torch --ops 'aten.mm*' --jobs 2
    metaspmd codegen --check
    metaspmd diff main HEAD --fail-on-loss
    metaspmd coverage --list-misses
    metaspmd crosscheck --backend jax

Each subcommand is a function here (``sweep``, ``codegen``, ``diff``, ``coverage``,
``crosscheck``) taking its argument list and returning the exit status; ``tools/*.py`` are
wrappers that call the same functions. This module imports no framework: each command
imports what it needs when it runs (the jax cross-check must set up XLA's CPU devices
before jax starts).
"""

from __future__ import annotations

import argparse
import errno
import functools
import importlib.util
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

# The checkout's root: default registry/ and generated/ folders (the package is installed
# editable from the repository, which holds them).
ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "registry"
# The checkout's folders pyproject.toml maps into the package (package-dir).
_MAPPED = {"metaspmd.backends": "backends", "metaspmd.codegen": "codegen", "metaspmd.generated": "generated"}


class _CheckoutFinder:
    """Finds metaspmd.backends, .codegen and .generated in the checkout this metaspmd/ lies in.
    Run from a clone (tools/*.py put it first on sys.path), its metaspmd would otherwise get
    the backends of the checkout installed editable, whose finder maps those names there."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        if name not in _MAPPED:
            return None
        folder = ROOT / _MAPPED[name]
        return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def _use_checkout_folders() -> None:
    """Only in a checkout (an installed wheel holds those packages inside metaspmd/), once."""
    if all((ROOT / folder / "__init__.py").is_file() for folder in _MAPPED.values()) and not any(
            getattr(f, "__name__", "") == _CheckoutFinder.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder)


_use_checkout_folders()


def _argv(argv: Sequence[str] | None) -> list[str]:
    return sys.argv[1:] if argv is None else list(argv)


def positive_int(text: str, least: int = 1) -> int:
    """argparse type: an integer >= 1 (a worker count), or >= ``least``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {value}")
    return value


def whole_number(text: str) -> int:
    """argparse type: an integer >= 0 (a count that may be none)."""
    return positive_int(text, 0)


def positive_number(text: str, allow_zero: bool = False, what: str = "a number") -> float:
    """argparse type: a finite number > 0 (or >= 0). inf overflows timers and solvers; nan
    compares false with everything, so a nan limit never expires and a nan budget binds nothing."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(f"expected {what}: finite and {'>= 0' if allow_zero else '> 0'}, "
                                         f"got {text!r}")
    return value


def path_arg(text: str) -> Path:
    """argparse type: a path that is not empty (an unset shell variable would otherwise
    name the current folder, and a command would write its files there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r}")
    try:
        os.stat(text)
    except OSError as e:  # a missing path is for the command to judge; a name too long is no path
        if e.errno == errno.ENAMETOOLONG:
            raise argparse.ArgumentTypeError(f"{text[:40]}... ({len(text)} characters): {e.strerror}") from None
    return Path(text)


def seconds(text: str, allow_zero: bool = False) -> float:
    """argparse type: a finite number of seconds > 0 (>= 0 with ``allow_zero``)."""
    return positive_number(text, allow_zero, "a number of seconds")


def at_most(parse: Callable[[str], Any], most: float, what: str) -> Callable[[str], Any]:
    """argparse type: what ``parse`` reads, refused past ``most`` (``what`` says it, with why:
    "86400 seconds (a day)")."""
    def checked(text: str) -> Any:
        value = parse(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"expected at most {what}, got {text!r}")
        return value

    checked.__name__ = parse.__name__  # argparse names the type in its own errors
    return checked


class StdoutError(OSError):
    """Writing the command's own output failed (a full disk behind ``> file``)."""


class _Stdout:
    """``sys.stdout`` whose failed writes raise ``StdoutError``, told apart from the
    command's own file errors; a closed pipe stays a BrokenPipeError."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self._checked(self.stream.write, text)

    def flush(self) -> None:
        self._checked(self.stream.flush)

    @staticmethod
    def _checked(call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutError(e.errno, e.strerror) from e

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null: Python flushes stdout again at exit, and a
    failed flush there is a traceback nothing catches."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def pipe_safe(command: Callable[..., int]) -> Callable[..., int]:
    """A reader that stops early (``metaspmd coverage | head``) ends the command quietly,
    with the status a tool killed by SIGPIPE has, instead of a BrokenPipeError traceback;
    output that cannot be written (a full disk) ends it with one line and status 2; a
    closed stdout (``>&-``) takes the output as /dev/null would; Ctrl-C ends it with one
    line and status 130, instead of a KeyboardInterrupt traceback (every tool writes its
    files whole, so nothing is left half-written)."""
    @functools.wraps(command)
    def run(*args, **kwargs) -> int:
        name = command.__name__ if command.__name__ != "main" else os.path.basename(sys.argv[0])
        given = sys.stdout
        sys.stdout = _Stdout(given if given is not None else open(os.devnull, "w"))
        try:
            try:
                status = command(*args, **kwargs)
            except SystemExit:  # argparse's --help and usage errors: their output must not be lost unsaid
                sys.stdout.flush()
                raise
            sys.stdout.flush()  # here, not at exit, where a closed pipe is a traceback nothing catches
            return status
        except BrokenPipeError:
            _silence_stdout()
            return 128 + 13  # SIGPIPE
        except StdoutError as e:
            print(f"{name}: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
            _silence_stdout()
            return 2
        except KeyboardInterrupt:
            print(f"{name}: interrupted", file=sys.stderr)
            return 128 + 2  # SIGINT
        finally:
            if isinstance(sys.stdout, _Stdout):
                sys.stdout = given if given is not None else sys.stdout.stream

    return run


def refuse_unused(p: argparse.ArgumentParser, args: argparse.Namespace, unused: Mapping[str, str]) -> None:
    """Refuse an option this run would ignore: ``unused`` maps each such option (``"--top"``)
    to why (``"needs --profile"``). One left at its default changes nothing, so it passes."""
    for option, why in unused.items():
        dest = option.lstrip("-").replace("-", "_")
        if getattr(args, dest) != p.get_default(dest):
            p.error(f"{option} {why}")


def ops_given(p: argparse.ArgumentParser, values: list[str], patterns: tuple[str, ...]) -> None:
    """``--ops ''`` (an unset shell variable, say) is an error, not every op."""
    if values and not patterns:
        p.error(f"--ops {' '.join(map(repr, values))} names no op pattern")


def _kernels_given(p: argparse.ArgumentParser, kernels: list[str] | None) -> None:
    """``--kernels ''`` would sweep the built-in ops."""
    for k in kernels or ():
        if not k.strip():
            p.error(f"--kernels {k!r} names no module")


def read_as_rules(path: Path) -> str:
    """Why a file written at ``path`` would be read as a rule file (a name ending .yaml, as
    a rule file's: ``--timings registry/jax/jax.acos.yaml`` would replace one), or ''."""
    if path.suffix.lower() in (".yaml", ".yml"):
        return f"{path}: a .yaml name, which registries read as a rule file (name it .json)"
    return ""


def _own_registry(p: argparse.ArgumentParser, what: str, out: Path | None) -> None:
    """Ops of your own (``--kernels``, a backend module outside metaspmd.backends) go into a
    registry of your own: in the repository's they would add to it or overwrite its files
    (a kernel named ``pad``), and --check would call every built-in op removed."""
    if out is None:
        p.error(f"{what} sweeps ops of your own into a registry of your own: pass --out DIR")
    if _within(out, REGISTRY):
        p.error(f"{what} sweeps ops of your own into a registry of your own, not the repository's {REGISTRY}: "
                "pass --out DIR outside it")


def _within(path: Path, folder: Path) -> bool:
    """Is ``path`` ``folder`` or inside it, symlinks followed (a loop is refused later, by name)?"""
    inside, folder = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return inside == folder or folder in inside.parents


# --------------------------------------------------------------------------- sweep

SWEEP_DOC = """Explore every op of a backend and write its rule files (registry/<backend>/<op>.yaml).

    metaspmd sweep --backend torch --ops 'aten.mm*,aten.add.*' --jobs 2
    metaspmd sweep --backend torch --check      # exit 1 when the registry is stale

Time limits: --timeout counts each op's CPU time in its worker, so a loaded machine gives a slow
op the time it needs, and is per 20 example calls of the op (an op with 29 gets twice it); an op
that burns no CPU (asleep, blocked) is stopped by --wall-timeout, 10x --timeout by default
(scaled alike). An op out of time on both of its tries gets no record: its file, if
any, is left as it was (a machine's speed must not change the registry), and the summary lists it.
So does an op whose worker is killed by SIGKILL on both tries (the out-of-memory killer: the
machine's memory, not the op), or whose runs fail to allocate memory on both. Other crashes
and errors are the op's, recorded as failed and named in the summary. Processes an op starts
in its worker's process group end with the worker.

Exit status: 0 done (op failures are recorded, not errors), 1 --check found differences,
2 usage error (unknown backend, no op matched, --kernels without --out, --out a backend
folder, a file, a symlink loop or not writable, a folder at an op's rule file path,
--timings not writable: checked before any op runs), 3 some op timed out (or was killed by
SIGKILL, or ran out of memory) twice and kept its previous file (--check: no difference found, but those ops were
not compared), 4 a rule file could not be written (a full disk), 130 interrupted (Ctrl-C),
143 terminated (SIGTERM), 129 hung up (SIGHUP): the summary and --timings then cover the ops
finished, whose files are whole; 141 stdout closed early (| head).
"""


def _stop_on_sigterm(signum, frame):
    # a CI time limit, `timeout` or a closed terminal (SIGHUP) stops the sweep as Ctrl-C
    # does: the workers are killed and only complete files remain
    raise KeyboardInterrupt(signum)


def _interrupted(e: KeyboardInterrupt) -> int:
    """The exit status of a sweep stopped by a signal: 128 + its number (130 for Ctrl-C)."""
    print("sweep: interrupted; files written so far are complete", file=sys.stderr)
    return 128 + e.args[0] if e.args and isinstance(e.args[0], int) else 130


def _reproducible_environment(command: str) -> None:
    """The command's environment as its workers' (``reproducible.for_command``): the
    variables a user set that would change its results are left out, or set to the
    workers' values, and named."""
    from metaspmd import reproducible

    overridden = reproducible.overridden()
    if overridden:
        print(f"{command}: setting {', '.join(overridden)} for its workers (set otherwise in the environment): the "
              "results must not depend on the machine", file=sys.stderr)
    dropped = reproducible.for_command()
    if dropped:
        print(f"{command}: leaving out {', '.join(dropped)} (set in the environment): the results must not depend "
              "on them", file=sys.stderr)


@pipe_safe
def sweep(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    try:
        return _sweep(argv, prog)
    except KeyboardInterrupt as e:  # Ctrl-C while it imports and sets up, before any worker
        return _interrupted(e)


def _sweep(argv: Sequence[str] | None, prog: str | None) -> int:
    import signal

    from metaspmd.sweep import (
        DEFAULT_TIMEOUT, SweepConfig, SweepError, SweepInterrupted, SweepWriteFailed, backend_module, run_sweep,
        split_patterns,
    )
    from metaspmd.sweep.config import CASES_PER_TIMEOUT, WALL_FACTOR, unwritable

    p = argparse.ArgumentParser(prog=prog, description=SWEEP_DOC.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=SWEEP_DOC.split("\n\n", 1)[1])
    p.add_argument("--backend", required=True,
                   help="torch, jax, tvm (module metaspmd.backends.<name>), or a dotted module path with get_backend()")
    p.add_argument("--ops", action="append", default=[], metavar="GLOB",
                   help="only ops matching these globs (comma-separated or repeated); default: all")
    p.add_argument("--jobs", "-j", type=positive_int, default=os.cpu_count() or 1,
                   help="worker processes (default: CPU count)")
    p.add_argument("--out", type=path_arg, help="registry root (default: the repository's registry/; "
                                             "required with --kernels)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; list ops whose file would change, and files of no op (of those --ops "
                        "matches), and exit 1 if any")
    p.add_argument("--resume", action="store_true", help="skip ops whose file exists and loads cleanly")
    p.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"per-op limit in CPU seconds of its worker, which is killed past it, per "
                        f"{CASES_PER_TIMEOUT} example calls of the op (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--wall-timeout", type=seconds, metavar="SECONDS",
                   help=f"per-op wall-clock guard against hangs that burn no CPU (default {WALL_FACTOR:g}x --timeout)")
    p.add_argument("--kernels", metavar="MODULE", action="append",
                   help="a module (dotted name or .py file) of ops to sweep instead of the built-in ones: "
                        "TE kernels (tvm) or custom ops (torch); repeat it for several modules")
    p.add_argument("--timings", type=path_arg, metavar="FILE", help="write per-op exploration times here (json)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--worker-output", action="store_true",
                   help="let workers print to stderr (hidden by default: framework warnings bury the progress bar)")
    args = p.parse_args(_argv(argv))
    _reproducible_environment("sweep")
    patterns = split_patterns(args.ops)
    ops_given(p, args.ops, patterns)
    _kernels_given(p, args.kernels)
    try:
        module = backend_module(args.backend)
    except SweepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    if args.kernels is not None:
        _own_registry(p, "--kernels", args.out)
    elif not module.startswith("metaspmd.backends."):
        _own_registry(p, f"--backend {args.backend}", args.out)
    if args.out is not None and _within(args.out, ROOT / "generated"):
        p.error(f"--out {args.out} lies in {ROOT / 'generated'}, where codegen writes its tables: pass a registry "
                "folder outside it")
    if args.out is not None and _within(args.out, REGISTRY) and not _within(REGISTRY, args.out):
        p.error(f"--out {args.out} lies inside the repository's registry {REGISTRY}, whose readers would take its "
                f"files for misplaced rule files: pass the registry itself ({REGISTRY}) or a folder outside it")
    out = args.out if args.out is not None else REGISTRY
    # checked before any work: a sweep that cannot write its timings must not find out at the end
    problem = args.timings is not None and (read_as_rules(args.timings) or unwritable(args.timings, folder=False))
    if problem:
        print(f"sweep: error: --timings {problem}", file=sys.stderr)
        return 2

    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    signal.signal(signal.SIGHUP, _stop_on_sigterm)
    options: tuple = ()
    if args.kernels is not None:
        options = (("kernels", tuple(args.kernels)),)
        if module == "metaspmd.backends.jax":  # it would sweep every primitive into registry/jax
            print("sweep: error: --kernels takes torch custom ops or TVM TE kernels; the jax backend sweeps "
                  "jax's own primitives only", file=sys.stderr)
            return 2
        if module == "metaspmd.backends.tvm":
            # --help says "instead of the built-in ones"; the TVM backend adds them unless told not to
            options += (("builtins", False),)
    try:
        config = SweepConfig(
            backend=args.backend, out_root=out, patterns=patterns, jobs=args.jobs,
            timeout=args.timeout, wall_timeout=args.wall_timeout, check=args.check, resume=args.resume, backend_options=options,
            progress=not args.no_progress, worker_output=args.worker_output,
        )
        report = run_sweep(config)
    except SweepWriteFailed as e:  # what it finished is reported; the error last, where it is read
        _sweep_report(e.report, args, out)
        print(f"sweep: error: cannot write a rule file, so the sweep stopped ({len(e.report.not_swept)} op(s) not "
              f"swept; files written so far are complete): {e.error}", file=sys.stderr)
        return 4
    except SweepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    except SweepInterrupted as e:  # what it finished is reported as a whole sweep's would be
        _sweep_report(e.report, args, out)
        return _interrupted(e)
    except KeyboardInterrupt as e:
        return _interrupted(e)
    if not _sweep_report(report, args, out):
        return 2  # not --check's "stale"
    timed_out = report.timed_out()
    if timed_out:  # exit 3, not --check's 1: the registry is not known to be stale
        print(f"sweep: {len(timed_out)} op(s) ran out of time (or out of memory, or were killed by SIGKILL) on both "
              f"tries; their files were left as they were (rerun them with a larger --timeout, or more memory): "
              f"{', '.join(r.op for r in timed_out)}", file=sys.stderr)
    if args.check:
        n = len(report.changes())
        if n:
            print(f"check: {n} file(s) would change")
            return 1
        print(f"check: no difference; {len(timed_out)} op(s) timed out and were not compared" if timed_out
              else "check: registry is up to date")
    return 3 if timed_out else 0


def _sweep_report(report, args: argparse.Namespace, out: Path) -> bool:
    """Write --timings and print the check's changes and the summary; False (said on stderr)
    when the timings could not be written."""
    from metaspmd.registry_io import write_text_atomic
    from metaspmd.sweep import format_changes, format_summary, timings_json

    unwritten = None
    if args.timings:  # before the summary: a reader of it that stops early must not lose them
        try:
            write_text_atomic(args.timings, timings_json(report, args.jobs))
        except OSError as e:
            unwritten = e
    if args.check and report.changes():
        print(format_changes(report))
    print(f"registry: {out}")  # which one: `metaspmd` runs the installed checkout's
    print(format_summary(report))
    if unwritten is not None:
        print(f"sweep: error: cannot write --timings {args.timings}: {unwritten}", file=sys.stderr)
    return unwritten is None


# --------------------------------------------------------------------------- codegen

CODEGEN_DOC = """Write the static rule tables in generated/ from the registry (jinja2 templates).

    metaspmd codegen                 # every backend with a table: torch, jax
    metaspmd codegen --check         # exit 1 if generated/ is stale (CI)

Exit status 2 for a bad registry file (named by file:line) and for an --out that cannot
hold the tables (a file, a symlink loop, a folder at a table's path), --check too; a
missing --out is stale. A table that is not UTF-8 is stale, and rewritten.
"""


@pipe_safe
def codegen(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    from metaspmd.codegen.generator import TARGETS, generate
    from metaspmd.registry_io import (
        RegistryError, backend_names, check_registry_root, path_problem, same_text, write_text_atomic,
    )

    p = argparse.ArgumentParser(prog=prog, description=CODEGEN_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=sorted(TARGETS) + ["all"], default="all",
                   help="all (default): every backend with a table; with --registry, those it holds")
    p.add_argument("--registry", type=path_arg, help="registry root (default: the repository's registry/)")
    p.add_argument("--out", type=path_arg,
                   help="output folder (default: the repository's generated/, for the repository's registry only)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated file is stale")
    args = p.parse_args(_argv(argv))
    backends = sorted(TARGETS) if args.backend == "all" else [args.backend]
    # realpath, not resolve(): a symlink loop is named below, not a traceback here
    own = args.registry is not None and os.path.realpath(args.registry) != str(REGISTRY.resolve())
    if args.out is None:
        if own:
            # the repository's tables would become the tables of a registry of your own
            p.error(f"--registry {args.registry} is not the repository's registry: pass --out DIR for its tables")
        args.out = ROOT / "generated"
    elif own and os.path.realpath(args.out) == os.path.realpath(ROOT / "generated"):
        p.error(f"--out {args.out} is the repository's generated/ folder: a registry of your own's tables would "
                "replace the repository's; pass another folder")
    default = args.registry is None
    if default:
        args.registry = REGISTRY  # the repository's: every table, a missing backend folder an error
    for registry in dict.fromkeys((args.registry, REGISTRY)):  # tables among rule files: strays to every reader
        if _within(args.out, registry):
            p.error(f"--out {args.out} lies in the registry {registry}: pass a folder outside it for the tables")
    try:  # a file where a backend's folder belongs would be passed over, its old table left as it was
        check_registry_root(args.registry)
    except RegistryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # a misspelt backend folder (troch/) would be skipped, and --check pass without its table
    known = backend_names()
    strays = sorted(str(d) for d in (args.registry.iterdir() if args.registry.is_dir() else ())
                    if d.is_dir() and d.name not in known and next(d.glob("*.yaml"), None) is not None)
    if strays:
        print(f"error: {', '.join(strays)}: rule files in a folder named after no backend (backends: "
              f"{', '.join(sorted(known))})", file=sys.stderr)
        return 2
    if not default and args.backend == "all":  # a registry of your own ops: the tables of the backends it holds
        held = [b for b in backends if (args.registry / b).is_dir()]
        others = sorted(d.name for d in (args.registry.iterdir() if args.registry.is_dir() else ()) if d.is_dir())
        if not held and others:  # a tvm registry: codegen makes no table for it
            print(f"error: {args.registry} holds no {'/, '.join(backends)}/ folder: codegen makes the tables of "
                  f"{', '.join(backends)} (folders there: {', '.join(others)})", file=sys.stderr)
            return 2
        backends = held or backends
    # --check too: a file or a symlink loop as --out is a mistake, not a stale table (a
    # missing folder is stale); a folder at a table's path would fail its rename
    problems = [path_problem(args.out, folder=True)] + [path_problem(args.out / TARGETS[b], folder=False)
                                                         for b in backends]
    problem = next((x for x in problems if x), "")
    if problem:
        print(f"error: --out {problem}", file=sys.stderr)
        return 2
    header = f"tables of {args.registry} in {args.out}"  # which ones: `metaspmd` runs the installed checkout's
    texts = {}
    # a registry of your own as the header names it: seen from the tables' folder, so that
    # --check does not find a table stale for another spelling of the same --registry
    source = os.path.relpath(os.path.realpath(args.registry), os.path.realpath(args.out)) if own else "registry"
    for backend in backends:  # every table first: a bad registry leaves generated/ as it was
        try:
            texts[backend] = generate(args.registry, backend, source)
        except RegistryError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    # the command that rewrites them: a registry of your own's tables by its own options
    repository = not own and os.path.realpath(args.out) == os.path.realpath(ROOT / "generated")
    rerun = "metaspmd codegen" if repository else shlex.join(
        ["metaspmd", "codegen", "--registry", str(args.registry), "--out", str(args.out)]
        + ([] if args.backend == "all" else ["--backend", args.backend]))
    stale, said = [], [header]  # every table written before a line is printed: a reader gone
    for backend, text in texts.items():  # early (| head -1) stops the printing, not the writing
        path = args.out / TARGETS[backend]
        if same_text(path, text):  # a file that is not UTF-8 is stale, and rewritten
            said.append(f"{path.name}: up to date")
            continue
        if args.check:
            stale.append(path.name)
            said.append(f"{path.name}: STALE (run {rerun})")
        else:
            try:
                write_text_atomic(path, text)
            except OSError as e:
                print("\n".join(said))
                print(f"error: cannot write {path}: {e}", file=sys.stderr)
                return 2
            said.append(f"{path.name}: written ({len(text.splitlines())} lines)")
    print("\n".join(said))
    return 1 if stale else 0


# --------------------------------------------------------------------------- diff

DIFF_DOC = """Markdown summary of rule changes between two registries, for code review.

    metaspmd diff main HEAD                  # git revisions (their registry/) of the repository you are in
    metaspmd diff old_registry/ registry/    # registry folders
    metaspmd diff main HEAD --fail-on-loss   # exit 1 when a rule or op is lost

A rule counts only where codegen puts it in a table (an entry whose status is ok or
derived): an entry turned failed loses its rules, though their text stays. Two revisions
read only the files `git diff --name-only` lists; two folders only the files whose bytes
differ. Exit status 2 when a side is neither a git revision nor a registry root
(a backend folder such as registry/torch is refused: it would read as an empty registry),
or names both a folder and a revision (write ./v1 or v1^{commit}).
"""


def _repository_here() -> Path | None:
    """The git repository the current folder lies in (whose revisions a user names), or None
    outside any: then the installed checkout's."""
    import subprocess

    found = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return Path(found.stdout.strip()) if found.returncode == 0 and found.stdout.strip() else None


@pipe_safe
def diff(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    from metaspmd.registry_io import RegistryError
    from metaspmd.rule_diff import diff as diff_registries, load_sides, to_markdown

    p = argparse.ArgumentParser(prog=prog, description=DIFF_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="git revision or registry folder")
    p.add_argument("head", help="git revision or registry folder")
    p.add_argument("--fail-on-loss", action="store_true", help="exit 1 when any rule or op is lost")
    args = p.parse_args(_argv(argv))
    try:
        base, head = load_sides(args.base, args.head, _repository_here() or ROOT)
    except (RegistryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    d = diff_registries(base, head)
    sys.stdout.write(to_markdown(d, args.base, args.head))
    return 1 if args.fail_on_loss and d.has_loss else 0


# --------------------------------------------------------------------------- coverage

COVERAGE_DOC = """How much of the torch registry has verified rules: every overload, the overloads OpInfo
samples reach, the core ATen ops (torch.Tag.core) and the dense CPU ops, with each miss
and its reason.

    metaspmd coverage                    # table and the core ops without rules
    metaspmd coverage --list-misses      # also every OpInfo-reached miss
    metaspmd coverage --list-no-sample   # also every dense CPU overload without a sample
    metaspmd coverage --min-reached 95   # exit 1 below 95% of OpInfo-reached overloads

An overload counts as covered when its file's status is ok (verified rules) or derived
(shape arithmetic or no tensor input, verified the same way). Dense CPU overloads are those
with a kernel for strided CPU tensors in this torch build, outside the sparse, quantized,
nested and accelerator families (metaspmd.backends.torch.dense_cpu): the ops a sweep here
can sample.

Exit status: 0 done, 1 a --min-reached or --min-core threshold not met (named on stderr),
2 usage or registry error (a registry without torch's ATen rules among them).
"""

COVERED = ("ok", "derived")


@pipe_safe
def coverage(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    from collections import Counter

    from metaspmd.registry_io import RegistryError, load_rules

    p = argparse.ArgumentParser(prog=prog, description=COVERAGE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--registry", type=path_arg, default=REGISTRY, help="registry root (default: the repository's registry/)")
    p.add_argument("--list-misses", action="store_true", help="list every OpInfo-reached overload without rules")
    p.add_argument("--list-no-sample", action="store_true", help="list every dense CPU overload whose status is no-sample")
    p.add_argument("--min-reached", type=float, metavar="PCT", help="exit 1 when OpInfo-reached coverage is below PCT")
    p.add_argument("--min-core", type=float, metavar="PCT", help="exit 1 when core-op coverage is below PCT")
    args = p.parse_args(_argv(argv))
    for flag, value in (("--min-reached", args.min_reached), ("--min-core", args.min_core)):
        if value is not None and not (0 <= value <= 100):  # nan too: no share is below it
            p.error(f"{flag} must be a percentage from 0 to 100, got {value}")
    try:  # before importing torch: a wrong --registry fails at once
        records = load_rules(args.registry, "torch")  # as codegen: no rule files is an error, not 0%
    except RegistryError as e:
        print(f"coverage: error: {e}", file=sys.stderr)
        return 2

    from metaspmd.backends.torch import catalog, dense_cpu
    from metaspmd.backends.torch.samples import load_index

    overloads = set(catalog.all_overloads())
    if not overloads & set(records):  # custom ops alone: every share would read 0% of ATen
        print(f"coverage: error: {Path(args.registry) / 'torch'} holds no ATen overload's rule file (coverage is "
              "of ATen's overloads; a registry of your own ops has none)", file=sys.stderr)
        return 2

    def reason(record) -> str:
        reasons = Counter(e.reason for e in record.entries if e.reason)
        return reasons.most_common(1)[0][0] if reasons else record.reason

    def is_core(name: str) -> bool:
        try:
            return catalog.is_core(catalog.resolve(name))
        except Exception:  # noqa: BLE001 - an overload torch lists but cannot resolve
            return False

    reached = set(load_index()) & overloads
    core = {name for name in overloads if is_core(name)}

    def is_dense(name: str) -> bool:
        try:
            return dense_cpu.is_dense_cpu(name)
        except KeyError:  # an overload torch lists but cannot resolve
            return False

    dense = {name for name in overloads if is_dense(name)}

    def status(name: str) -> str:
        r = records.get(name)
        return r.status if r is not None else "missing"

    def row(label: str, names: set[str]) -> tuple[str, int, int, str]:
        hit = sum(status(n) in COVERED for n in names)
        return label, len(names), hit, f"{100 * hit / max(1, len(names)):.1f}%"

    rows = [row("all overloads", overloads), row("reached by OpInfo", reached), row("core ops", core),
            row("dense CPU", dense)]
    print(f"{'set':<20} {'overloads':>9} {'covered':>8} {'share':>7}")
    for label, n, hit, pct in rows:
        print(f"{label:<20} {n:>9} {hit:>8} {pct:>7}")
    print("\nstatus of OpInfo-reached misses:", dict(Counter(status(n) for n in reached if status(n) not in COVERED)))
    no_sample = {n for n in dense if status(n) == "no-sample"}
    print(f"dense CPU overloads with no sample: {len(no_sample)}")

    shown = sorted(core | (reached if args.list_misses else set()) | (no_sample if args.list_no_sample else set()))
    misses = [n for n in shown if status(n) not in COVERED]
    if misses:
        print(f"\n{'op':<48} {'status':<16} reason")
        for n in misses:
            line = f"{n:<48} {status(n):<16} {reason(records[n]) if n in records else ''}"
            print(line if len(line) <= 200 else line[:199] + "…")
    below = []
    for flag, least, (label, n, hit, pct) in (("--min-reached", args.min_reached, rows[1]),
                                              ("--min-core", args.min_core, rows[2])):
        if least is not None and 100 * hit / max(1, n) < least:
            below.append(f"{flag} {least:g}: {label} is {pct}")
    for line in below:
        print(f"coverage: below {line}", file=sys.stderr)
    return 1 if below else 0


# --------------------------------------------------------------------------- crosscheck

# A cross-check's exit status, whichever backend: CI tells a rule that fails from a check that
# could not run (a slow or loaded machine's time limit, a crash), as the sweep's 3 does.
CROSSCHECK_EXIT = ("exit status: 0 done, 1 a rule of ours failed re-verification (or a jit run), 2 usage or "
                   "registry error, 3 no rule failed but some op's check could not run (it raised, ran past its "
                   "time limit (torch's --timeout) or killed its worker), so its rules were not checked, 130 "
                   "interrupted (Ctrl-C: the report covers the ops checked before it)")


def crosscheck_status(failed: bool, unchecked: bool) -> int:
    """``CROSSCHECK_EXIT``'s status of a finished check."""
    return 1 if failed else 3 if unchecked else 0


def interrupted(command: str, left: int) -> int:
    """The status of a run stopped by Ctrl-C after reporting what it finished: ``left``
    items got no result."""
    print(f"{command}: interrupted; {left} op(s) not done, the report covers the others", file=sys.stderr)
    return 128 + 2  # SIGINT


CROSSCHECK_DOC = """Cross-check a backend's rules against its framework's own sharding rules.

    metaspmd crosscheck --backend jax --ops 'jax.dot_general,jax.add'
    metaspmd crosscheck --backend torch

Dispatches to metaspmd.backends.<backend>.crosscheck.main(argv) with the remaining
arguments; rules are read from the repository's registry unless --registry says
otherwise. The backend module must not be imported before it runs: the jax check asks
XLA for several CPU devices, which only works before jax starts.
"""


@pipe_safe
def crosscheck(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    import importlib

    p = argparse.ArgumentParser(prog=prog, description=CROSSCHECK_DOC.split("\n\n")[0], add_help=False,
                                epilog=f"--backend NAME --help lists the backend's own options. {CROSSCHECK_EXIT}.")
    p.add_argument("--backend", required=True, help="torch or jax (module metaspmd.backends.<name>.crosscheck)")
    argv = _argv(argv)
    if not any(a == "--backend" or a.startswith("--backend=") for a in argv) and {"-h", "--help"} & set(argv):
        p.print_help()
        return 0
    args, rest = p.parse_known_args(argv)
    # The backends' shared options, checked here so that no backend starts a pool of 0 workers
    # or checks every op for an empty --ops; the arguments go on unchanged.
    shared = argparse.ArgumentParser(prog=f"{prog or 'crosscheck'} --backend {args.backend}", add_help=False,
                                     allow_abbrev=False, usage="%(prog)s [OPTIONS] (--help lists them)")
    shared.add_argument("--jobs", "-j", type=positive_int)
    shared.add_argument("--timeout", type=functools.partial(seconds, allow_zero=True))
    shared.add_argument("--ops", action="append", default=[])
    shared.add_argument("--registry", type=path_arg)
    known, _ = shared.parse_known_args(rest)
    ops_given(shared, known.ops, tuple(x.strip() for v in known.ops for x in v.split(",") if x.strip()))
    if not {"-h", "--help"} & set(rest):
        _reproducible_environment("crosscheck")
    if known.registry is not None:  # a backend folder would read as a registry without rules
        from metaspmd.registry_io import RegistryError, check_registry_root

        try:
            root = check_registry_root(known.registry)
            # an empty registry explores every op live; one holding other backends' rules
            # but not this one's is a wrong path, which would explore live unsaid
            if any(d.is_dir() and next(d.glob("*.yaml"), None) is not None for d in root.iterdir()):
                check_registry_root(root, args.backend)
        except RegistryError as e:
            shared.error(str(e))
    try:
        module = importlib.import_module(f"metaspmd.backends.{args.backend}.crosscheck")
    except ModuleNotFoundError as e:
        print(f"crosscheck: no cross-check for backend {args.backend!r} ({e})", file=sys.stderr)
        return 2
    if not any(a == "--registry" or a.startswith("--registry=") for a in rest) and "-h" not in rest and "--help" not in rest:
        rest += ["--registry", str(REGISTRY)]
    return module.main(rest)


# --------------------------------------------------------------------------- dispatch

COMMANDS: dict[str, tuple[Callable[..., int], str]] = {
    "sweep": (sweep, "explore a backend's ops and write (or --check) their rule files in registry/"),
    "codegen": (codegen, "write (or --check) the static rule tables in generated/ from the registry"),
    "diff": (diff, "markdown summary of rule changes between two git revisions or registry folders"),
    "coverage": (coverage, "share of torch overloads (all, OpInfo-reached, core, dense CPU) with verified rules"),
    "crosscheck": (crosscheck, "compare our rules with DTensor's (torch) or Shardy's (jax) own rules"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: metaspmd COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {line}" for name, (_, line) in COMMANDS.items()]
    lines += ["", "metaspmd COMMAND --help shows the command's own options."]
    return "\n".join(lines)


@pipe_safe
def main(argv: Sequence[str] | None = None) -> int:
    argv = _argv(argv)
    if not argv:
        print(usage(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"metaspmd: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return COMMANDS[name][0](rest, prog=f"metaspmd {name}")


if __name__ == "__main__":  # guard needed: spawned sweep workers re-import the main module
    sys.exit(main())
