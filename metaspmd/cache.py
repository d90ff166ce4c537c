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
under another build of the framework, is never read back. A user's op is keyed by a
fingerprint of its code as well (``implementation``: see ``get``). The core
imports no framework: the framework version is the installed distribution named like the
backend (package metadata), unless the backend registers its own with
``register_framework_version`` or the caller passes ``framework_versions``.

Each file starts with a seal, a comment holding the sha256 of its key and the rest: a rule
is trusted because the explorer verified it, so a file changed since (a hand edit that still
reads as a record but holds a wrong rule, a damaged disk) or moved under another key (another
implementation's, other sizes', another framework version's folder) is a miss with a warning
naming it, as is
one that cannot be read as a record (bad UTF-8, an alias): the op is explored again and the
file rewritten. An entry whose path cannot be used (a folder, a FIFO or a device where its
file belongs, a file where its op's folder belongs) is skipped with one warning naming it,
and its rule kept in memory; the other entries are read and written as usual. A cache
folder that cannot be used (read-only, not a folder, in a symlink loop), or a disk with no
room (full, a quota, a file size limit), turns persistence off with one warning; what was
explored stays in memory for the process. The folder is fixed when the cache is made: ``~``
expanded, a relative path made absolute (a later chdir must not move it).
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import os
import re
import stat
import warnings
from pathlib import Path
from typing import Callable, Mapping

from . import rules
from .registry_io import (
    RegistryError, dump_record, loads_record, path_problem, read_file, record_path, usable_name, write_text_atomic,
)
from .rules import OpRecord, RuleEntry, make_record

_FRAMEWORK_VERSIONS: dict[str, Callable[[], str]] = {}
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_SEAL = "# metaspmd rule cache, sha256 of what follows: "
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a quota, a file size limit
# 2: sealed files (the unsealed ones of 1 would all warn); 3: the seal covers the entry's key
# too, so a file copied or moved under another key (another implementation, other sizes)
# does not pass for that key's
FORMAT = 3


def _digest(key: str, body: bytes) -> str:
    return hashlib.sha256(key.encode() + b"\0" + body).hexdigest()


def _seal(text: str, key: str) -> str:
    """``text`` behind a first line naming the digest of it and of the key it is stored
    under (a YAML comment: the file still reads as a record)."""
    return f"{_SEAL}{_digest(key, text.encode())}\n{text}"


def _sealed(data: bytes, key: str) -> bool:
    """Whether ``data`` starts with the seal of what follows it, stored under ``key``."""
    first, _, rest = data.partition(b"\n")
    return first == f"{_SEAL}{_digest(key, rest)}".encode()


def _key(signature: str, implementation: str | None, pieces: int | None, at: str | None) -> str:
    """An entry's key as text: what names its file and is sealed into it."""
    key = signature + (f"\n{implementation}" if implementation else "")
    key += f"\npieces={pieces}" if pieces is not None else ""  # None: the key before pieces were counted
    return key + (f"\nat={at}" if at is not None else "")


def _stored_name(op: str) -> str:
    """The op's name in its files: itself, or for a name no rule file may hold (a user's
    ``ns::op`` primitive, one too long for a file name), a readable stand-in and a digest."""
    if usable_name(op) and len(op) <= 150:  # a file name holds 255 bytes, the digest's suffix besides
        return op
    return f"_{_UNSAFE.sub('_', op)[:100]}-{hashlib.sha256(op.encode()).hexdigest()[:12]}"


def _not_a_file(path: Path) -> str:
    """Why ``path`` holds something other than a file to read, which no rewrite replaces, or
    ''. Looked at before it is opened: a FIFO there would block the read, /dev/zero fill
    memory. A symlink to nothing or in a loop is not named: the rewrite replaces the link."""
    try:
        mode = os.stat(path).st_mode
    except NotADirectoryError:
        return f"{next(p for p in path.parents if p.exists())} is not a folder"
    except OSError:
        try:
            os.lstat(path)  # the entry itself a link to nothing or in a loop: replaced by the rewrite
        except FileNotFoundError:
            return ""
        except OSError as e:  # a folder on the way in a symlink loop, a name too long: no rewrite gets there
            return f"{path}: {e.strerror or e}"
        return ""
    return "" if stat.S_ISREG(mode) else f"{path} is {'a folder' if stat.S_ISDIR(mode) else 'not a regular file'}"


class RuleCacheWarning(UserWarning):
    """The on-disk rule cache could not be used as it is (an unreadable entry, an unwritable folder)."""


_FIXED_DIRS: dict[str, Path] = {}  # $METASPMD_CACHE_DIR -> the folder it named when first read


def default_cache_dir() -> Path:
    """Where metaspmd keeps what it learns on a machine (the rule cache, the backends'
    sample and program indexes): ``$METASPMD_CACHE_DIR``, else ``$XDG_CACHE_HOME/metaspmd``
    (``~/.cache/metaspmd``)."""
    env = os.environ.get("METASPMD_CACHE_DIR")
    if env:  # as a shell would read it, and fixed at its first reading: a later chdir must
        # not move the cache (each parallelize makes a RuleCache, and found a second one)
        if env not in _FIXED_DIRS:
            _FIXED_DIRS[env] = _absolute(env)
        return _FIXED_DIRS[env]
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, or relative: the XDG spec says to ignore it
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return _absolute(base) / "metaspmd"


def _absolute(folder: str | os.PathLike) -> Path:
    """``folder`` with ``~`` expanded (a value from a Docker ENV or a systemd unit reaches
    us unexpanded), made absolute."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(folder))))


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
        if root is not None and "\0" in os.fspath(root):  # every later os call would raise ValueError
            raise ValueError(f"cache folder {os.fspath(root)!r} holds a NUL byte")
        self.root = _absolute(root) if root is not None else default_cache_dir()
        self.persist = persist
        self._memory: dict[tuple, RuleEntry] = {}  # (backend, op, signature, implementation, pieces, at)
        self._pinned = dict(framework_versions or {})
        self._versions: dict[str, str] = {}  # backend -> folder name, looked up once
        self._skipped: set[Path] = set()  # entries (or ops' folders) that cannot be used, each warned of once
        # Read at construction, not import, so a bump in a running test takes effect.
        self._folder = self.root / f"rules-v{rules.VERIFIER_VERSION}-s{rules.SCHEMA_VERSION}-c{FORMAT}"

    def _backend_folder(self, backend: str) -> str:
        if backend not in self._versions:
            version = self._pinned[backend] if backend in self._pinned else framework_version(backend)
            self._versions[backend] = f"{_stored_name(backend)}-{_UNSAFE.sub('_', version)}"
        return self._versions[backend]

    def path(self, backend: str, op: str, signature: str, implementation: str = "", pieces: int | None = None,
             at: str | None = None) -> Path:
        """Where the entry of (op, signature) lives on disk: a folder per op, named after it
        (an op name no file may have, a user's ``ns::op`` primitive, by its digest), and a
        file per signature, implementation, number of pieces and call (``at``)."""
        digest = hashlib.sha256(_key(signature, implementation, pieces, at).encode()).hexdigest()[:24]
        folder = record_path(self._folder, self._backend_folder(backend), _stored_name(op)).with_suffix("")
        return folder / f"{digest}.yaml"

    def _sealed_key(self, backend: str, op: str, signature: str, implementation: str | None, pieces: int | None,
                    at: str | None) -> str:
        """What an entry's seal covers beside its text: its key and the versions its folders
        name (a file copied from another torch's folder was read as this one's)."""
        return f"{self._folder.name}/{self._backend_folder(backend)}/{_stored_name(op)}\n" + _key(
            signature, implementation, pieces, at)

    def get(self, backend: str, op: str, signature: str, implementation: str | None = "",
            pieces: int | None = None, at: str | None = None) -> RuleEntry | None:
        """The entry of (op, signature), or None. ``implementation``: '' for a framework's
        own op (the framework's version keys it), else a fingerprint of the user's code
        behind it (``fingerprint.code_fingerprint``), part of the key; None where that code
        cannot be read: its entries live in memory only, since nothing would tell a file
        written for an older version of the op from one for this. ``pieces``: the number of
        outputs of a call whose signature does not say it (``NodeCall.pieces``), part of
        the key: ``unbind`` of 4 rows and of 6 have one signature and two entries. ``at``:
        the call's own shapes and dtypes where its rules were verified at them and need not
        hold at the signature's other sizes (``NodeCall.at``), part of the key."""
        key = (backend, op, signature, implementation, pieces, at)
        if key in self._memory:
            return self._memory[key]
        if not self.persist or implementation is None:
            return None
        path = self.path(backend, op, signature, implementation, pieces, at)
        if path.parent in self._skipped:  # the op's folder cannot be used: warned of once
            return None
        blocker = _not_a_file(path)
        if blocker:
            self._unusable_entry(backend, path, blocker)
            return None
        try:
            data = read_file(path)
        except FileNotFoundError:
            return None
        except RegistryError as e:  # a dangling symlink, no permission: replaced by the rewrite
            self._rewrite(str(e))
            return None
        except OSError as e:
            self._unusable_entry(backend, path, f"{path}: cannot read: {e.strerror or e}")
            return None
        if not _sealed(data, self._sealed_key(backend, op, signature, implementation, pieces, at)):
            warnings.warn(f"rule cache: {path} was changed after metaspmd wrote it, or moved from another entry's "
                          "place (its seal does not match its content and key); exploring again and rewriting it",
                          RuleCacheWarning, stacklevel=2)
            return None
        try:
            record = loads_record(data.decode("utf-8"), str(path))  # the seal is a comment: lines keep their numbers
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1  # the seal's line counted: it is the file's first
            self._rewrite(f"{path}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})")
            return None
        except RegistryError as e:  # its message names the file and line
            self._rewrite(str(e))
            return None
        if (record.op, record.backend) != (_stored_name(op), _stored_name(backend)):
            warnings.warn(f"rule cache: {path} holds {record.backend} {record.op}, not {backend} {op}; "
                          "exploring again and rewriting it", RuleCacheWarning, stacklevel=2)
            return None
        entry = record.entry(signature)
        if entry is not None:
            self._memory[key] = entry
        return entry

    def put(self, backend: str, op: str, entry: RuleEntry, implementation: str | None = "",
            pieces: int | None = None, at: str | None = None) -> None:
        """Keep ``entry`` (``implementation``, ``pieces`` and ``at`` as ``get`` takes them)."""
        # first: a failed write loses nothing
        self._memory[(backend, op, entry.signature, implementation, pieces, at)] = entry
        if self.persist and implementation is not None:
            record: OpRecord = make_record(_stored_name(op), _stored_name(backend), [entry])
            path = self.path(backend, op, entry.signature, implementation, pieces, at)
            if path in self._skipped or path.parent in self._skipped:
                return  # warned when it was read: a folder or a device where the file belongs
            try:
                text = _seal(dump_record(record), self._sealed_key(backend, op, entry.signature, implementation, pieces, at))
            except ValueError as e:  # text no rule file may hold (a control character in a string argument)
                warnings.warn(f"rule cache: cannot store an entry of {op}: {e}; its rule is kept in memory for "
                              "this process", RuleCacheWarning, stacklevel=2)
                return
            try:
                try:
                    write_text_atomic(path, text)
                except FileNotFoundError:  # the folder removed after it was made (a cache cleared meanwhile)
                    write_text_atomic(path, text)
            except OSError as e:
                if e.errno in _NO_ROOM:  # the folder's, not the entry's: every later write would fail alike
                    self._memory_only(e)
                    return
                # mkdir's "File exists" where a folder on the way is a symlink loop: say what is there
                problem = path_problem(path.parent, folder=True) or f"{path}: cannot write: {e.strerror or e}"
                self._unusable_entry(backend, path, problem)

    def remember(self, backend: str, op: str, entry: RuleEntry, implementation: str | None = "",
                 pieces: int | None = None, at: str | None = None) -> None:
        """Keep a freshly explored entry, unless it failed: a failure may be the
        environment's (a crash, a time limit), so the next run explores again."""
        if entry.status != "failed":
            self.put(backend, op, entry, implementation, pieces, at)

    def _rewrite(self, problem: str) -> None:
        warnings.warn(f"rule cache: unreadable entry, exploring again and rewriting it: {problem}",
                      RuleCacheWarning, stacklevel=3)

    def _unusable_entry(self, backend: str, path: Path, problem: str) -> None:
        """One entry's path cannot be read or written (a folder or a FIFO where its file
        belongs, a file where its op's folder belongs): that entry is skipped with a warning,
        the others are used as usual. Where the backend's folder itself cannot be used, no
        entry can, and persistence is turned off (``_memory_only``)."""
        folder = self._folder / self._backend_folder(backend)
        blocker = path_problem(folder, folder=True)
        if not blocker:  # the folder, or where it would be made
            there = next(p for p in (folder, *folder.parents) if p.exists())
            blocker = "" if os.access(there, os.W_OK | os.X_OK) else f"{there} is not writable"
        if not blocker and not folder.is_dir():
            # a write makes the folders on its way: where it could not, no entry can be written
            # (a folder under /proc, which os.access passes for root): one warning, not one per op
            blocker = problem
        if blocker:
            self._memory_only(OSError(blocker))
            return
        # an op's folder that cannot be used blocks each of its entries: one warning for them all
        where = path.parent if path_problem(path.parent, folder=True) else path
        if where not in self._skipped:
            self._skipped.add(where)
            others = ", nor its op's other entries" if where != path else ""
            warnings.warn(f"rule cache: cannot use the entry {path} ({problem}){others}; its op is explored again "
                          "and its rule kept in memory for this process", RuleCacheWarning, stacklevel=3)

    def _memory_only(self, error: OSError) -> None:
        """The folder cannot be used: say so once, and keep rules in memory from now on."""
        if self.persist:
            self.persist = False
            warnings.warn(f"rule cache: cannot use {self.root} ({error}); keeping explored rules in memory "
                          "for this process only", RuleCacheWarning, stacklevel=3)


__all__ = ["RuleCache", "RuleCacheWarning", "default_cache_dir", "framework_version", "register_framework_version"]
