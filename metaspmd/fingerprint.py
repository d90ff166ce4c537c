"""A fingerprint of the Python code behind a user's op, for the rule cache's key.

A framework's own ops are keyed by the framework's version. A user's op changes with the
user's code, under the same name: rules explored for one version of it must not be read
back for another (an op whose rows were independent, rewritten so that its columns are,
would keep its row cuts and compute wrong values). The fingerprint hashes what the op
runs: each function's bytecode, constants and names, its defaults and closure, and the
functions and values it reads from its module by name (containers by what they hold),
recursively; so an edit to the op, to a helper it calls or to a table it reads is a new
key. An op that reads an object's state by name (a tensor, a config object) has no
fingerprint: its type does not say what the op computes, so the op is cached in memory
only. What is read through an object's attributes or from another process is not seen.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

_SIMPLE = (bool, int, float, complex, str, bytes, type(None))
_MAX_DEPTH = 8  # functions reached through closures and globals; past it, by name only


@dataclass
class _Walk:
    """The functions hashed so far, and the packages whose code is the framework's
    (``code_fingerprint``'s ``frameworks``)."""

    frameworks: tuple[str, ...]
    ids: set[int] = field(default_factory=set)


def code_fingerprint(fns: Iterable[Callable[..., Any]], frameworks: Iterable[str] = ()) -> str | None:
    """A digest of the code ``fns`` run, or None where one cannot be read (a builtin, a
    C++ kernel, a callable object): such an op has no key that changes with its code.
    ``frameworks``: top-level packages whose functions are the framework's (``torch``),
    keyed by its version already: counted by name, and by the functions their closures
    hold (a kernel the framework wraps), not by what else they read."""
    digest = hashlib.sha256()
    walk = _Walk(tuple(frameworks))
    for fn in fns:
        if not _add_callable(digest, fn, walk, 0):
            return None
    return digest.hexdigest()[:24]


def _add_callable(digest: Any, fn: Any, walk: _Walk, depth: int) -> bool:
    if isinstance(fn, functools.partial):
        readable = _add_value(digest, fn.args, walk, depth) & _add_value(digest, fn.keywords, walk, depth)
        return _add_callable(digest, fn.func, walk, depth) and readable
    if isinstance(fn, (staticmethod, classmethod)):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return False
    digest.update(f"<{fn.__module__}.{fn.__qualname__}>".encode())
    if id(fn) in walk.ids or depth > _MAX_DEPTH:
        return True
    walk.ids.add(id(fn))
    if str(fn.__module__).partition(".")[0] in walk.frameworks:
        return all(_add_callable(digest, c, walk, depth + 1) for c in _cells(fn)
                   if isinstance(c, (types.FunctionType, functools.partial)))
    names = _add_code(digest, fn.__code__)
    readable = _add_value(digest, fn.__defaults__, walk, depth)
    readable &= _add_value(digest, fn.__kwdefaults__ or {}, walk, depth)
    for value in _cells(fn):
        readable &= _add_value(digest, value, walk, depth)
    for name in sorted(names):  # what the code reads from its module by name
        if name in fn.__globals__:
            digest.update(name.encode())
            readable &= _add_value(digest, fn.__globals__[name], walk, depth)
    return readable


def _cells(fn: types.FunctionType) -> list[Any]:
    """What ``fn``'s closure holds, a cell not yet filled as None."""
    out = []
    for cell in fn.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:
            out.append(None)
    return out


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


def _add_value(digest: Any, value: Any, walk: _Walk, depth: int) -> bool:
    """A default, closure or global value: plain values by repr, containers by what they
    hold, functions by their code, modules, classes and named constants (a dtype, an enum
    member) by name. False for anything else (a tensor, a config object): its state may
    decide what the op computes, which its type alone does not say, so the op has no key."""
    if isinstance(value, _SIMPLE):
        digest.update(repr(value).encode())
        return True
    if isinstance(value, (types.FunctionType, functools.partial)):
        return _add_callable(digest, value, walk, depth + 1)
    if isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType)):
        digest.update(f"<{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value.__name__)}>".encode())
        return True
    if isinstance(value, enum.Enum) or type(value).__name__ in _NAMED_CONSTANTS:
        digest.update(f"<{type(value).__qualname__} {value!r}>".encode())
        return True
    if depth > _MAX_DEPTH:
        return False
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        digest.update(f"<dict {len(items)}>".encode())
        return all(_add_value(digest, k, walk, depth + 1) and _add_value(digest, v, walk, depth + 1) for k, v in items)
    if isinstance(value, (tuple, list, set, frozenset)):
        # a set's order follows the salted string hashes
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        digest.update(f"<{type(value).__name__} {len(items)}>".encode())
        return all(_add_value(digest, v, walk, depth + 1) for v in items)
    return False


# Types of the frameworks' named constants, read by name (torch.float32, torch.channels_last,
# numpy's dtypes); the core imports no framework to check them by class.
_NAMED_CONSTANTS = frozenset({"dtype", "device", "layout", "memory_format", "qscheme", "finfo", "iinfo"})


__all__ = ["code_fingerprint"]
