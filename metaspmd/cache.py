"""The live-exploration cache: rules found at runtime for (op, signature) pairs.

In memory for the process, and persisted under the user's cache directory
(``$XDG_CACHE_HOME/metaspmd``, default ``~/.cache/metaspmd``) as one small registry file
per key. Writes go through a temp file and an atomic rename, so concurrent writers (two
processes exploring the same op) never leave a torn file: the last complete one wins,
and both hold the same verified rule.

Versioned as the OpInfo sample index is: the files live in a folder named after the
verifier and schema versions and the files' own format
(``rules-v<VERIFIER_VERSION>-s<SCHEMA_VERSION>-c<FORMAT>``) and, inside it, one per backend
and framework version (``torch-2.13.0_cpu``), so a rule found before a soundness fix, or
under another build of the framework, is never read back. The core
imports no framework: the framework version is the installed distribution named like the
backend (package metadata), unless the backend registers its own with
``register_framework_version`` or the caller passes ``framework_versions``.

Each file starts with a seal, a comment holding the sha256 of the rest: a rule is trusted
because the explorer verified it, so a file changed since (a hand edit that still reads as
a record but holds a wrong rule, a damaged disk) is a miss with a warning naming it, as is
one that cannot be read as a record (bad UTF-8, an alias): the op is explored again and the
file rewritten. A cache folder that cannot be used (read-only, not a folder) turns
persistence off with one warning; what was explored stays in memory for the process.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import warnings
from pathlib import Path
from typing import Callable, Mapping

from . import rules
from .registry_io import (
    RegistryError, dump_record, loads_record, path_problem, read_file, record_path, write_text_atomic,
)
from .rules import OpRecord, RuleEntry, make_record

_FRAMEWORK_VERSIONS: dict[str, Callable[[], str]] = {}
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_SEAL = "# metaspmd rule cache, sha256 of what follows: "
FORMAT = 2  # 2: sealed files; the unsealed ones of 1 are never read (they would all warn)


def _seal(text: str) -> str:
    """``text`` behind a first line naming its digest (a YAML comment: the file still reads as a record)."""
    return f"{_SEAL}{hashlib.sha256(text.encode()).hexdigest()}\n{text}"


def _sealed(data: bytes) -> bool:
    """Whether ``data`` starts with the seal of what follows it."""
    first, _, rest = data.partition(b"\n")
    return first == f"{_SEAL}{hashlib.sha256(rest).hexdigest()}".encode()


class RuleCacheWarning(UserWarning):
    """The on-disk rule cache could not be used as it is (an unreadable entry, an unwritable folder)."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "metaspmd"


def register_framework_version(backend: str, version: Callable[[], str]) -> None:
    """Let a backend name the framework build its rules depend on, where the distribution
    named like the backend does not (another package name, a compiler of its own)."""
    _FRAMEWORK_VERSIONS[backend] = version


def framework_version(backend: str) -> str:
    provider = _FRAMEWORK_VERSIONS.get(backend)
    if provider is not None:
        return provider()
    try:
        return importlib.metadata.version(backend)  # metadata only: imports nothing
    except importlib.metadata.PackageNotFoundError:
        return "unversioned"  # no package of that name (a test's fake backend)


class RuleCache:
    def __init__(self, root: str | os.PathLike | None = None, persist: bool = True, *,
                 framework_versions: Mapping[str, str] | None = None):
        """``framework_versions``: backend -> framework version, instead of ``framework_version``'s."""
        self.root = Path(root) if root is not None else default_cache_dir()
        self.persist = persist
        self._memory: dict[tuple[str, str, str], RuleEntry] = {}
        self._pinned = dict(framework_versions or {})
        self._versions: dict[str, str] = {}  # backend -> folder name, looked up once
        # Read at construction, not import, so a bump in a running test takes effect.
        self._folder = self.root / f"rules-v{rules.VERIFIER_VERSION}-s{rules.SCHEMA_VERSION}-c{FORMAT}"

    def _backend_folder(self, backend: str) -> str:
        if backend not in self._versions:
            version = self._pinned[backend] if backend in self._pinned else framework_version(backend)
            self._versions[backend] = f"{backend}-{_UNSAFE.sub('_', version)}"
        return self._versions[backend]

    def path(self, backend: str, op: str, signature: str) -> Path:
        """Where the entry of (op, signature) lives on disk."""
        digest = hashlib.sha256(signature.encode()).hexdigest()[:24]
        folder = record_path(self._folder, self._backend_folder(backend), op).with_suffix("")
        return folder / f"{digest}.yaml"

    def get(self, backend: str, op: str, signature: str) -> RuleEntry | None:
        key = (backend, op, signature)
        if key in self._memory:
            return self._memory[key]
        if not self.persist:
            return None
        path = self.path(backend, op, signature)
        try:
            data = read_file(path)
            if not _sealed(data):
                warnings.warn(f"rule cache: {path} was changed after metaspmd wrote it (its seal does not match "
                              "its content); exploring again and rewriting it", RuleCacheWarning, stacklevel=2)
                return None
            record = loads_record(data.decode("utf-8"), str(path))  # the seal is a comment: lines keep their numbers
        except FileNotFoundError:
            return None
        except RegistryError as e:  # its message names the file and line
            blocker = path_problem(path.parent, folder=True)
            if blocker:  # no entry can be there: one warning for the folder, not one per entry
                self._memory_only(NotADirectoryError(blocker))
                return None
            warnings.warn(f"rule cache: unreadable entry, exploring again and rewriting it: {e}",
                          RuleCacheWarning, stacklevel=2)
            return None
        except OSError as e:
            self._memory_only(e)
            return None
        if (record.op, record.backend) != (op, backend):
            warnings.warn(f"rule cache: {path} holds {record.backend} {record.op}, not {backend} {op}; "
                          "exploring again and rewriting it", RuleCacheWarning, stacklevel=2)
            return None
        entry = record.entry(signature)
        if entry is not None:
            self._memory[key] = entry
        return entry

    def put(self, backend: str, op: str, entry: RuleEntry) -> None:
        self._memory[(backend, op, entry.signature)] = entry  # first: a failed write loses nothing
        if self.persist:
            record: OpRecord = make_record(op, backend, [entry])
            try:
                write_text_atomic(self.path(backend, op, entry.signature), _seal(dump_record(record)))
            except OSError as e:
                self._memory_only(e)

    def remember(self, backend: str, op: str, entry: RuleEntry) -> None:
        """Keep a freshly explored entry, unless it failed: a failure may be the
        environment's (a crash, a time limit), so the next run explores again."""
        if entry.status != "failed":
            self.put(backend, op, entry)

    def _memory_only(self, error: OSError) -> None:
        """The folder cannot be used: say so once, and keep rules in memory from now on."""
        if self.persist:
            self.persist = False
            warnings.warn(f"rule cache: cannot use {self.root} ({error}); keeping explored rules in memory "
                          "for this process only", RuleCacheWarning, stacklevel=3)


__all__ = ["RuleCache", "RuleCacheWarning", "default_cache_dir", "framework_version", "register_framework_version"]
