"""The live-exploration cache: rules found at runtime for (op, signature) pairs.

In memory for the process, and persisted under the user's cache directory
(``$XDG_CACHE_HOME/metaspmd``, default ``~/.cache/metaspmd``) as one small registry file
per key. Writes go through a temp file and an atomic rename, so concurrent writers (two
processes exploring the same op) never leave a torn file: the last complete one wins,
and both hold the same verified rule.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .registry_io import RegistryError, dump_record, load_record, record_path, write_text_atomic
from .rules import OpRecord, RuleEntry, make_record


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "metaspmd"


class RuleCache:
    def __init__(self, root: str | os.PathLike | None = None, persist: bool = True):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.persist = persist
        self._memory: dict[tuple[str, str, str], RuleEntry] = {}

    def _path(self, backend: str, op: str, signature: str) -> Path:
        digest = hashlib.sha256(signature.encode()).hexdigest()[:24]
        folder = record_path(self.root, backend, op).with_suffix("")
        return folder / f"{digest}.yaml"

    def get(self, backend: str, op: str, signature: str) -> RuleEntry | None:
        key = (backend, op, signature)
        if key in self._memory:
            return self._memory[key]
        if not self.persist:
            return None
        path = self._path(backend, op, signature)
        try:
            record = load_record(path)
        except (OSError, RegistryError):
            return None  # absent, or written by an incompatible version: explore again
        entry = record.entry(signature)
        if entry is not None:
            self._memory[key] = entry
        return entry

    def put(self, backend: str, op: str, entry: RuleEntry) -> None:
        self._memory[(backend, op, entry.signature)] = entry
        if self.persist:
            record: OpRecord = make_record(op, backend, [entry])
            write_text_atomic(self._path(backend, op, entry.signature), dump_record(record))

    def remember(self, backend: str, op: str, entry: RuleEntry) -> None:
        """Keep a freshly explored entry, unless it failed: a failure may be the
        environment's (a crash, a time limit), so the next run explores again."""
        if entry.status != "failed":
            self.put(backend, op, entry)
