"""The ``Program`` record: a function and its argument maker.

A leaf module (it imports nothing of the backend), so the modules that define programs
(``samples``, ``model_programs``) and the module that lists and traces them
(``programs``, which imports those two) do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Program:
    """A function and its argument maker: ``fun(*make_args(seed))`` runs it."""

    name: str  # 'harness/<group>/<name>' or 'sample/<primitive>/<k>'
    fun: Callable[..., Any] = field(compare=False)
    make_args: Callable[[int], Sequence[Any]] = field(compare=False)


__all__ = ["Program"]
