"""A fingerprint of the Python code behind a user's op, for the rule cache's key.

A framework's own ops are keyed by the framework's version. A user's op changes with the
user's code, under the same name: rules explored for one version of it must not be read
back for another (an op whose rows were independent, rewritten so that its columns are,
would keep its row cuts and compute wrong values). The fingerprint hashes what the op
runs: each function's bytecode, constants and names, its defaults and closure, and the
functions and plain values it reads from its module by name, recursively; so an edit
to the op or to a helper it calls is a new key. Only code reachable that way counts:
what is read through an object's attributes or from another process is not seen.
"""

from __future__ import annotations

import functools
import hashlib
import types
from typing import Any, Callable, Iterable

_SIMPLE = (bool, int, float, complex, str, bytes, type(None))
_MAX_DEPTH = 8  # functions reached through closures and globals; past it, by name only


def code_fingerprint(fns: Iterable[Callable[..., Any]]) -> str | None:
    """A digest of the code ``fns`` run, or None where one cannot be read (a builtin, a
    C++ kernel, a callable object): such an op has no key that changes with its code."""
    digest = hashlib.sha256()
    seen: set[int] = set()
    for fn in fns:
        if not _add_callable(digest, fn, seen, 0):
            return None
    return digest.hexdigest()[:24]


def _add_callable(digest: Any, fn: Any, seen: set[int], depth: int) -> bool:
    if isinstance(fn, functools.partial):
        _add_value(digest, fn.args, seen, depth)
        _add_value(digest, tuple(sorted(fn.keywords.items())), seen, depth)
        return _add_callable(digest, fn.func, seen, depth)
    if isinstance(fn, (staticmethod, classmethod)):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return False
    digest.update(f"<{fn.__module__}.{fn.__qualname__}>".encode())
    if id(fn) in seen or depth > _MAX_DEPTH:
        return True
    seen.add(id(fn))
    names = _add_code(digest, fn.__code__)
    _add_value(digest, fn.__defaults__, seen, depth)
    _add_value(digest, tuple(sorted((fn.__kwdefaults__ or {}).items())), seen, depth)
    for cell in fn.__closure__ or ():
        try:
            _add_value(digest, cell.cell_contents, seen, depth)
        except ValueError:  # a cell not yet filled
            digest.update(b"<empty cell>")
    for name in sorted(names):  # what the code reads from its module by name
        if name in fn.__globals__:
            digest.update(name.encode())
            _add_value(digest, fn.__globals__[name], seen, depth)
    return True


def _add_code(digest: Any, code: types.CodeType) -> set[str]:
    """Hash ``code`` and its nested code objects; the global names they read."""
    digest.update(code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _add_code(digest, const)
        elif isinstance(const, frozenset):  # `x in {"a", "b"}`: its order follows the salted string hashes
            digest.update(repr(sorted(const, key=repr)).encode())
        else:
            digest.update(repr(const).encode())
    return names


def _add_value(digest: Any, value: Any, seen: set[int], depth: int) -> None:
    """A default, closure or global value: plain values by repr, functions by their code,
    anything else (a module, a tensor, an object) by its type alone."""
    if isinstance(value, _SIMPLE):
        digest.update(repr(value).encode())
    elif isinstance(value, (tuple, list, frozenset)) and all(isinstance(v, _SIMPLE) for v in value):
        digest.update(repr(sorted(value, key=repr) if isinstance(value, frozenset) else value).encode())
    elif isinstance(value, tuple):
        for v in value:
            _add_value(digest, v, seen, depth)
    elif isinstance(value, (types.FunctionType, functools.partial)):
        _add_callable(digest, value, seen, depth + 1)
    else:
        digest.update(f"<{type(value).__module__}.{type(value).__qualname__}>".encode())


__all__ = ["code_fingerprint"]
