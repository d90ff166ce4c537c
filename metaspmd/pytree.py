"""A minimal pytree over tuples, lists and dicts, with the tensor test supplied by the caller.

The core cannot use torch's or jax's pytree utilities (it imports no framework), and op
arguments only nest through these three containers.
"""

from __future__ import annotations

from typing import Any, Callable


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
            return type(x)(*(walk(y) for y in x))
        if isinstance(x, (list, tuple)):
            return type(x)(walk(y) for y in x)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x

    out = walk(tree)
    rest = list(it)
    if rest:
        raise ValueError(f"{len(rest)} leaves left over")
    return out
