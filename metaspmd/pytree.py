"""A minimal pytree over tuples, lists and dicts, with the tensor test supplied by the caller.

The core cannot use torch's or jax's pytree utilities (it imports no framework), and op
arguments only nest through these three containers.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence


def leaves(tree: Any, is_leaf: Callable[[Any], bool]) -> list[Any]:
    out: list[Any] = []

    def walk(x: Any) -> None:
        if is_leaf(x):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for k in x:
                walk(x[k])

    walk(tree)
    return out


def replace(tree: Any, is_leaf: Callable[[Any], bool], new_leaves: list[Any]) -> Any:
    """``tree`` with its leaves replaced, in order, by ``new_leaves``."""
    it = iter(new_leaves)

    def walk(x: Any) -> Any:
        if is_leaf(x):
            return next(it)
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
            return type(x)(*[walk(y) for y in x])
        if isinstance(x, (list, tuple)):
            return type(x)([walk(y) for y in x])
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x

    out = walk(tree)
    rest = list(it)
    if rest:
        raise ValueError(f"{len(rest)} leaves left over")
    return out


_LEAF, _SAME, _TREE = 0, 1, 2  # a template's slot: the k-th new leaf, the value itself, a subtree


def template(tree: Any, is_leaf: Callable[[Any], bool]) -> Callable[[Sequence[Any]], Any]:
    """``replace(tree, is_leaf, ·)`` with ``tree`` walked once, for a tree filled with new
    leaves again and again (an op's arguments, per shard): the function takes exactly as
    many leaves as ``tree`` has and builds the same containers around them."""
    count = 0

    def slot(x: Any) -> tuple[int, Any]:
        nonlocal count
        if is_leaf(x):
            count += 1
            return _LEAF, count - 1
        if isinstance(x, (list, tuple, dict)):
            return _TREE, node(x)
        return _SAME, x

    def node(x: Any) -> Callable[[Sequence[Any]], Any]:
        if isinstance(x, dict):
            keyed = [(k, *slot(v)) for k, v in x.items()]
            return lambda new: {k: new[v] if s == _LEAF else v if s == _SAME else v(new) for k, s, v in keyed}
        slots = [slot(y) for y in x]
        kind = type(x)
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
            return lambda new: kind(*[new[v] if s == _LEAF else v if s == _SAME else v(new) for s, v in slots])
        return lambda new: kind([new[v] if s == _LEAF else v if s == _SAME else v(new) for s, v in slots])

    kind, value = slot(tree)
    n = count

    def fill(new: Sequence[Any]) -> Any:
        if len(new) != n:
            raise ValueError(f"{len(new)} leaves for a tree of {n}")
        return new[value] if kind == _LEAF else value if kind == _SAME else value(new)

    return fill
