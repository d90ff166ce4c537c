"""Registering TE kernels: the ``@kernel`` decorator and the registry it fills.

A kernel is a builder function that creates placeholders with symbolic shapes
(``te.var``) and returns ``(inputs, output)`` (or a list of outputs)::

    @kernel(example={"n": 8})
    def vector_add():
        n = te.var("n")
        a = te.placeholder((n,), "float64", name="a")
        b = te.placeholder((n,), "float64", name="b")
        return [a, b], te.compute((n,), lambda i: a[i] + b[i], name="out")

The outputs are built from ``te.compute`` and ``te.extern`` (what ``te.create_prim_func``
lowers); a ``te.scan`` is refused by name. ``example`` gives each symbolic var its size in
the example call. ``variants`` lists
keyword arguments for the builder (one compiled kernel and one example per variant);
they are part of the call's signature, like a framework op's non-tensor arguments.
``int_ranges`` bounds the random values of integer inputs (``{"indices": (0, "n")}``,
a bound may name a var), so index inputs stay meaningful. ``exact`` names the vars whose
sizes the kernel's rules depend on, beyond which are 1 (a convolution's kernel extent sets
its halo): the call's signature spells out the input dims they size, so a halo read off
them is pinned (unpinned ones are kept only where they hold at other sizes too).

Registration only records the builder: building, validating and compiling happen when
the backend first asks for the kernel's cases, so one broken kernel cannot stop a sweep.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

PREFIX = "tvm."

Params = tuple[tuple[str, Any], ...]  # one variant's builder keyword arguments, sorted


class KernelError(ValueError):
    """An invalid kernel; the message starts with the kernel's op name."""

    def __init__(self, op: str, message: str):
        super().__init__(f"kernel {op}: {message}")
        self.op = op


@dataclass(frozen=True)
class KernelSpec:
    """A registered kernel, not yet built."""

    op: str  # 'tvm.<name>'
    builder: Callable[..., Any]
    example: tuple[tuple[str, int], ...]  # symbolic var name -> example size
    variants: tuple[Params, ...] = ((),)
    int_ranges: tuple[tuple[str, tuple[int | str, int | str]], ...] = ()
    exact: tuple[str, ...] = ()  # vars whose sizes key the rules
    module: str = ""  # the module that registered it (what --kernels selects)


def _params(op: str, variant: Mapping[str, Any]) -> Params:
    # lists become tuples: a variant is a cache key and a signature value
    for k, v in dict(variant).items():
        problem = _unwritable(v)
        if problem:
            raise KernelError(op, f"variant argument {k!r} = {v!r}: {problem}")
    return tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in dict(variant).items()))


def _unwritable(v: Any) -> str:
    """Why a variant value cannot key a rule ('' where it can): the signature writes it,
    so it must read the same in every run and tell variants apart."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return ""
    if isinstance(v, (list, tuple)):
        return next((p for p in map(_unwritable, v) if p), "")
    if inspect.isroutine(v) or inspect.isclass(v):  # written by module and name
        named = getattr(v, "__module__", None) and "<" not in getattr(v, "__qualname__", "<")
        return "" if named else "a lambda or local function has no name the rule file can keep: define it at module level"
    return (f"a {type(v).__name__} is no variant value: use numbers, strings, None, lists of them, or "
            "functions defined at module level")


def _example(op: str, example: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """The example's sizes, each a positive int as given: int() made 6.9 a 6, True a 1 and
    "6" a 6 without a word."""
    if not isinstance(example, Mapping):
        raise KernelError(op, f"example must map each symbolic var to its size, got {type(example).__name__} {example!r:.80}")
    for k, v in example.items():
        if not isinstance(k, str):
            raise KernelError(op, f"example key {k!r}: each key is a symbolic var's name (a str)")
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise KernelError(op, f"example {k!r}: {v!r}: each symbolic var's size is a positive int")
    return tuple(sorted((k, int(v)) for k, v in example.items()))


def op_name(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name


class KernelRegistry:
    """Kernels by op name. Re-registering from the same module replaces (module reloads)."""

    def __init__(self) -> None:
        self._specs: dict[str, KernelSpec] = {}

    def add(self, spec: KernelSpec) -> None:
        old = self._specs.get(spec.op)
        if old is not None and old.module != spec.module:
            raise KernelError(spec.op, f"already registered by module {old.module!r}")
        if old is not None and _qualname(old.builder) != _qualname(spec.builder):
            # a reload defines the same function again; two builders of one name would leave one unswept
            raise KernelError(spec.op, f"registered twice in module {spec.module!r}, by {_qualname(old.builder)} "
                                       f"and by {_qualname(spec.builder)}")
        self._specs[spec.op] = spec

    def specs(self) -> dict[str, KernelSpec]:
        return dict(self._specs)

    def adopt(self, before: Mapping[str, KernelSpec], module: str) -> None:
        """Kernels registered since ``before`` (a ``specs()``) are ``module``'s, the module
        whose import registered them, whatever module their builder comes from (a
        functools.partial, a helper beside it): ``--kernels`` selects by it."""
        for op, spec in self._specs.items():
            if before.get(op) is not spec:
                self._specs[op] = dataclasses.replace(spec, module=module)

    def get(self, op: str) -> KernelSpec:
        try:
            return self._specs[op]
        except KeyError:
            raise KeyError(f"no TVM kernel named {op!r}") from None

    def ops(self, modules: Iterable[str] | None = None) -> list[str]:
        """Registered op names, sorted; only those registered by ``modules`` when given."""
        wanted = None if modules is None else set(modules)
        return sorted(op for op, s in self._specs.items() if wanted is None or s.module in wanted)


def _qualname(builder: Callable[..., Any]) -> str:
    return getattr(builder, "__qualname__", None) or repr(builder)


REGISTRY = KernelRegistry()


def kernel(
    name: str | None = None,
    *,
    example: Mapping[str, int],
    variants: Iterable[Mapping[str, Any]] = ({},),
    int_ranges: Mapping[str, tuple[int | str, int | str]] | None = None,
    exact: Iterable[str] = (),
    registry: KernelRegistry | None = None,
):
    """Register the decorated builder as kernel ``tvm.<name>`` (default: the function's name)."""

    def register(builder: Callable[..., Any]) -> Callable[..., Any]:
        if name is not None and not name.strip():  # it fell back to the function's name, unsaid
            raise KernelError(op_name(getattr(builder, "__name__", "?")), f"the kernel name {name!r} is empty")
        op = op_name(name or builder.__name__)
        sizes = _example(op, example)
        unknown = sorted(set(exact) - set(example))
        if unknown:
            raise KernelError(op, f"exact names {unknown}, which are not vars of its example {sorted(example)}")
        spec = KernelSpec(
            op=op,
            builder=builder,
            example=sizes,
            variants=tuple(_params(op, v) for v in variants) or ((),),
            int_ranges=tuple(sorted((k, tuple(v)) for k, v in (int_ranges or {}).items())),
            exact=tuple(sorted(exact)),
            module=builder.__module__,
        )
        (registry or REGISTRY).add(spec)
        return builder

    return register


__all__ = ["KernelError", "KernelRegistry", "KernelSpec", "PREFIX", "REGISTRY", "kernel", "op_name"]
