"""Which program equations call which primitive, kept on disk between processes.

Tracing every program (``programs.programs()``: jax's harnesses, the samples, the model
programs) takes seconds, and every process that lists the catalog (a sweep worker, a
cross-check, a test run) would otherwise pay it again. The file keeps, per primitive,
where its equations are: program name and equation path. Names, not positions: jax
builds some harness lists by iterating over sets, so positions change from process to
process. Params and avals are not kept (they hold jaxprs and functions); an entry's
programs are traced again, in this process, when the entry is first read (``__getitem__``),
so listing the catalog traces nothing.

The file's name carries a format number, the jax version, the float64 setting (it changes
avals and so equations), a digest of the modules that define and walk the programs and,
in a process started with jax configured by environment variables (``JAX_*``, which a
sweep leaves out), a digest of those, so any of those changing gives a new file; one that
does not parse or does not match the programs of this process is rebuilt. It is written atomically, one builder at a time, in
``$METASPMD_CACHE_DIR`` or ``$XDG_CACHE_HOME/metaspmd`` (``~/.cache/metaspmd``).
"""

from __future__ import annotations

import fcntl
import functools
import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Iterator

import jax

from metaspmd import reproducible
from metaspmd.cache import default_cache_dir

from . import model_programs, program, programs, samples
from .programs import Occurrence

FORMAT_VERSION = 2  # bump when the file's layout changes (2: or what built it: files traced under
# JAX_NUMPY_RANK_PROMOTION=raise lacked programs; such a process now names its own file)

Location = tuple[str, tuple[int, ...]]  # program name, equation path


class StaleIndex(Exception):
    """The file does not describe this process's programs."""


def _digest() -> str:
    """Of the sources that decide which programs there are and how they are walked."""
    h = hashlib.sha256()
    for mod in (programs, program, samples, model_programs):
        h.update(Path(mod.__file__).read_bytes())
    return h.hexdigest()[:16]


def cache_path(cache_dir: Path | None = None) -> Path:
    x64 = "x64" if jax.config.jax_enable_x64 else "x32"
    config = reproducible.started_under("JAX_")  # jax's configuration by environment, which sweeps leave out
    name = f"jax-{jax.__version__}-programs-v{FORMAT_VERSION}-{x64}-{_digest()}{'-' + config if config else ''}.json.gz"
    return Path(cache_dir or default_cache_dir()) / name


class ProgramIndex(Mapping):
    """Primitive name -> its equations (``Occurrence``) in program order; an entry's
    programs are traced on first read. ``where(primitive)`` reads the file's locations
    only."""

    def __init__(self, where: Mapping[str, tuple[Location, ...]], found: Mapping | None = None,
                 path: Path | None = None):
        self._where = dict(where)
        self._found: dict[str, tuple[Occurrence, ...]] = dict(found or {})
        self._eqns: dict[str, dict] = {}  # program name -> path -> equation, per traced program
        self._path = path

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, primitive) -> bool:
        return primitive in self._where

    def where(self, primitive: str) -> tuple[Location, ...]:
        return self._where.get(primitive, ())

    def __getitem__(self, primitive: str) -> tuple[Occurrence, ...]:
        if primitive not in self._found:
            if primitive not in self._where:
                raise KeyError(primitive)
            try:
                self._found[primitive] = self._trace(primitive)
            except StaleIndex:  # the file missed something its name does not capture: trace all
                where, found = build()
                if self._path is not None:
                    _try_write(self._path, where)
                self._where, self._found = where, found
                return self._found[primitive]
        return self._found[primitive]

    def trace_all(self) -> None:
        """Read every entry now."""
        for primitive in self._where:
            self[primitive]
        self._eqns.clear()  # every entry is read: the traced programs are no longer needed

    def _trace(self, primitive: str) -> tuple[Occurrence, ...]:
        position = {p.name: i for i, p in enumerate(programs.programs())}
        out = []
        for name, path in self._where[primitive]:
            if name not in position:
                raise StaleIndex(name)
            eqns = self._eqns.get(name)
            if eqns is None:
                try:
                    closed, _ = programs._trace(programs.programs()[position[name]], 0)
                except Exception as e:
                    raise StaleIndex(name) from e
                eqns = self._eqns[name] = dict(programs._walk(closed.jaxpr, ()))
            eqn = eqns.get(path)
            if eqn is None or eqn.primitive.name != primitive:
                raise StaleIndex(f"{name} {path}")
            out.append(Occurrence.of(position[name], path, eqn))
        return tuple(sorted(out, key=lambda o: (o.program, o.path)))


def build() -> tuple[dict[str, tuple[Location, ...]], dict[str, tuple[Occurrence, ...]]]:
    """Trace every program (programs that do not trace are left out): the locations per
    primitive, and the equations themselves."""
    ps = programs.programs()
    found: dict[str, list[Occurrence]] = {}
    for i, p in enumerate(ps):
        try:
            closed, _ = programs._trace(p, 0)
        except Exception:
            continue
        for path, eqn in programs._walk(closed.jaxpr, ()):
            occ = Occurrence.of(i, path, eqn)
            found.setdefault(occ.primitive, []).append(occ)
    where = {k: tuple(sorted((ps[o.program].name, o.path) for o in v)) for k, v in found.items()}
    return where, {k: tuple(v) for k, v in found.items()}


def write(path: Path, where: Mapping[str, tuple[Location, ...]]) -> None:
    """Atomic write: readers never see half a file."""
    path = Path(path)
    names = sorted(p.name for p in programs.programs())
    number = {name: k for k, name in enumerate(names)}
    # a program by its number in the sorted names: a tenth of the size of naming it each time;
    # sorted, as build's are, since the programs' order follows the building process's
    # string hashes: two builds give the same bytes
    body = {"format": FORMAT_VERSION, "jax": jax.__version__, "x64": bool(jax.config.jax_enable_x64),
            "programs": names,
            "where": {k: sorted([number[name], *p] for name, p in v) for k, v in sorted(where.items())}}
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(gzip.compress(json.dumps(body, separators=(",", ":")).encode(), mtime=0))
    os.replace(tmp, path)


def read(path: Path) -> dict[str, tuple[Location, ...]]:
    """The locations in ``path``; StaleIndex when it does not parse or does not list this
    process's programs."""
    try:
        body = json.loads(gzip.decompress(Path(path).read_bytes()))
        if (body["format"], body["jax"], body["x64"]) != (FORMAT_VERSION, jax.__version__, bool(jax.config.jax_enable_x64)):
            raise StaleIndex(f"{path}: written for another format, jax or float64 setting")
        names = body["programs"]
        if names != sorted(p.name for p in programs.programs()):
            raise StaleIndex(f"{path}: written for other programs")
        # sorted as build's are (a file written before they were lists them in another order)
        return {str(k): tuple(sorted((names[e[0]], tuple(int(d) for d in e[1:])) for e in v))
                for k, v in body["where"].items()}
    except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError, IndexError) as e:
        raise StaleIndex(f"{path}: {type(e).__name__}: {e}") from e


def _try_write(path: Path, where: Mapping[str, tuple[Location, ...]]) -> None:
    try:
        write(path, where)
    except OSError:  # no writable cache: this process keeps its own
        pass


def load(cache_dir: Path | None = None, rebuild: bool = False,
         log: Callable[[str], None] | None = None) -> ProgramIndex:
    """The index from the cache file, building and writing it first when it is missing,
    stale or corrupt (one builder at a time: concurrent workers wait and read)."""
    path = cache_path(cache_dir)
    if not rebuild:
        try:
            return ProgramIndex(read(path), path=path)
        except StaleIndex:
            pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "w")
    except OSError:  # no writable cache: build for this process only
        return ProgramIndex(*build())
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not rebuild:
            try:
                return ProgramIndex(read(path), path=path)  # another process built it meanwhile
            except StaleIndex:
                pass
        if log:
            log(f"tracing every program into {path}")
        where, found = build()
        _try_write(path, where)
    return ProgramIndex(where, found, path)


@functools.lru_cache(maxsize=1)
def index() -> ProgramIndex:
    """Primitive name -> every equation of it in any program (programs that do not trace
    are left out)."""
    return load()


def sources_of(primitive: str) -> list[str]:
    """Harness groups ('harness/<group>') and samples ('sample/<primitive>') whose jaxprs
    contain ``primitive``."""
    return sorted({name.rsplit("/", 1)[0] for name, _ in index().where(primitive)})


__all__ = ["FORMAT_VERSION", "ProgramIndex", "StaleIndex", "build", "cache_path", "default_cache_dir", "index", "load",
           "read", "sources_of", "write"]
