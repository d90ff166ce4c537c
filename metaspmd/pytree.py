"""A minimal pytree over tuples, lists and dicts, with the tensor test supplied by the caller.

The core cannot use torch's or jax's pytree utilities (it imports no framework), and op
arguments only nest through these three containers.

The walks are module functions, not closures: a recursive closure refers to itself through
its cell, so every call left a reference cycle that only the garbage collector frees, and
the explorer walks arguments for every shard it runs (full collections, each a scan of
every object torch and the sample index hold, came several times as often).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence


def leaves(tree: Any, is_leaf: Callable[[Any], bool]) -> list[Any]:
    out: list[Any] = []
    _collect(tree, is_leaf, out)
    return out


def _collect(x: Any, is_leaf: Callable[[Any], bool], out: list[Any]) -> None:
    if is_leaf(x):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _collect(y, is_leaf, out)
    elif isinstance(x, dict):
        for k in x:
            _collect(x[k], is_leaf, out)


def replace(tree: Any, is_leaf: Callable[[Any], bool], new_leaves: list[Any]) -> Any:
    """``tree`` with its leaves replaced, in order, by ``new_leaves``."""
    it = iter(new_leaves)
    out = _rebuild(tree, is_leaf, it)
    rest = list(it)
    if rest:
        raise ValueError(f"{len(rest)} leaves left over")
    return out


def _rebuild(x: Any, is_leaf: Callable[[Any], bool], it: Iterator[Any]) -> Any:
    if is_leaf(x):
        return next(it)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*[_rebuild(y, is_leaf, it) for y in x])
    if isinstance(x, (list, tuple)):
        return type(x)([_rebuild(y, is_leaf, it) for y in x])
    if isinstance(x, dict):
        return {k: _rebuild(v, is_leaf, it) for k, v in x.items()}
    return x


_LEAF, _SAME, _TREE = 0, 1, 2  # a template's slot: the k-th new leaf, the value itself, a subtree


def template(tree: Any, is_leaf: Callable[[Any], bool]) -> Callable[[Sequence[Any]], Any]:
    """``replace(tree, is_leaf, ·)`` with ``tree`` walked once, for a tree filled with new
    leaves again and again (an op's arguments, per shard): the function takes exactly as
    many leaves as ``tree`` has and builds the same containers around them."""
    count = [0]
    kind, value = _slot(tree, is_leaf, count)
    n = count[0]

    def fill(new: Sequence[Any]) -> Any:
        if len(new) != n:
            raise ValueError(f"{len(new)} leaves for a tree of {n}")
        return new[value] if kind == _LEAF else value if kind == _SAME else value(new)

    return fill


def _slot(x: Any, is_leaf: Callable[[Any], bool], count: list[int]) -> tuple[int, Any]:
    if is_leaf(x):
        count[0] += 1
        return _LEAF, count[0] - 1
    if isinstance(x, (list, tuple, dict)):
        return _TREE, _node(x, is_leaf, count)
    return _SAME, x


def _node(x: Any, is_leaf: Callable[[Any], bool], count: list[int]) -> Callable[[Sequence[Any]], Any]:
    if isinstance(x, dict):
        keyed = [(k, *_slot(v, is_leaf, count)) for k, v in x.items()]
        return lambda new: {k: new[v] if s == _LEAF else v if s == _SAME else v(new) for k, s, v in keyed}
    slots = [_slot(y, is_leaf, count) for y in x]
    # the values kept in place, then the leaves and subtrees put in: fewer steps per fill
    # than a test per slot
    kept = [v if s == _SAME else None for s, v in slots]
    leaves = [(k, v) for k, (s, v) in enumerate(slots) if s == _LEAF]
    trees = [(k, v) for k, (s, v) in enumerate(slots) if s == _TREE]
    kind = type(x)
    star = isinstance(x, tuple) and hasattr(x, "_fields")  # a namedtuple takes its fields as arguments

    def fill(new: Sequence[Any]) -> Any:
        out = kept.copy()
        for k, v in leaves:
            out[k] = new[v]
        for k, v in trees:
            out[k] = v(new)
        return kind(*out) if star else kind(out)

    return fill
