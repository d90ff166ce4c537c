"""Failure reasons as records keep them: one clean line, the same on every machine."""

from __future__ import annotations

import re
import signal

from ..registry_io import escape_unwritable
from ..rules import OpRecord

_PATH_RE = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.+@~-]+){2,}")
_ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]{6,}")
MAX_REASON = 300


def clean_reason(text: str, limit: int = MAX_REASON) -> str:
    """First line, without machine paths or memory addresses, so records stay
    byte-identical across machines and runs, and control characters escaped (an op's
    message in colour); at most ``limit`` characters."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    line = escape_unwritable(lines[0].strip()) if lines else ""
    line = _PATH_RE.sub(lambda m: re.split(r"[\\/]", m.group(0))[-1], line)
    line = _ADDRESS_RE.sub("0x…", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def describe_exception(exc: BaseException) -> str:
    message = clean_reason(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def describe_fatal(exc: BaseException) -> str:
    """An error that stops the sweep (a backend that cannot load), for the user to act on:
    whole, paths included. clean_reason is for the reasons records keep."""
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"crashed: {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"crashed: signal {-exitcode}"
    if exitcode == 0:  # os._exit(0) in the op: no error, yet no result either
        return "crashed: the process exited (code 0) during the op"
    return f"crashed: exit code {exitcode}"


def failed_record(backend: str, op: str, reason: str) -> OpRecord:
    return OpRecord(op=op, backend=backend, status="failed", entries=(), reason=reason)
