"""The generated rule table at runtime for torch calls: lookup by a call's arguments.

A call (tensors or DTensorSpecs, and its other arguments) is looked up by its signature,
then by its normalized signature (defaults and memory formats left out). The answer is the
rule model's strategies (``metaspmd.table``), the same a live exploration of the call
gives; what DTensor or a plan runs of them is ``metaspmd.target``'s to say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec

from metaspmd.signature import signature, signature_error, split_signature, value_token
from metaspmd.spec import Strategy
from metaspmd.table import RuleTable, check_rules, generated

from .catalog import TORCH_NAMESPACES, exact_sizes, op_name, overload_named, positional_names
from .tensor_ops import dtype_kind


class SpecOps:
    """Just enough of the TensorOps protocol to compute signatures over DTensorSpecs."""

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, (DTensorSpec, torch.Tensor))

    def shape(self, x) -> tuple[int, ...]:
        return tuple(x.shape)

    def dtype_kind(self, x) -> str:
        return dtype_kind(x.tensor_meta.dtype if isinstance(x, DTensorSpec) else x.dtype)

_SPEC_OPS = SpecOps()


def table() -> RuleTable:
    """The generated table, with the tables added by ``add_table`` over it."""
    return generated("torch")


def add_table(rules: dict) -> None:
    """Look ops up in ``rules`` too: the ``RULES`` of a table generated from a registry of
    one's own custom ops (``tools/sweep.py --backend torch --kernels MODULE --out DIR``, then
    ``tools/codegen.py --backend torch --registry DIR --out GEN``). ``register`` and
    ``parallelize`` then verify those ops' rules at each call's own sizes (a user's kernel
    may branch on any size; a table of torch's ops was swept by another build, or edited)
    instead of searching; an op in both tables takes the added one's. ``rules`` not in that
    form (op -> {signature: Entry}) is refused here, naming the entry, and nothing is added:
    it would break every later lookup, or never match (a signature naming arguments its op
    does not take)."""
    check_rules(rules)  # its shape, before the names are read; add parses each entry
    for op, entries in rules.items():
        _check_argument_names(op, entries)
    table().add(rules)
    _forget_lookups()
    for hook in AFTER_ADD:
        hook(rules)


# called with each table added: dtensor_rules says which of its ops register() has not
# installed (this module imports no DTensor machinery)
AFTER_ADD: list[Callable[[dict], None]] = []


def _check_argument_names(op: str, entries: dict) -> None:
    """Refuse a signature naming an argument the op's schema lacks: no call would ever have
    it. An op this process has not loaded yet (a library imported later) is not checked."""
    fn = overload_named(op)
    if fn is None:
        return
    known = {a.name for a in fn._schema.arguments}
    for sig in entries:
        if signature_error(sig):
            continue  # refused by name when the table is added
        unknown = [name for name, _, _ in split_signature(sig) if name not in known]
        if unknown:
            raise ValueError(f"rule table entry {op!r}, signature {sig!r}: {op} takes no argument "
                             f"{unknown[0]!r} (its schema: {fn._schema})")


def verified_per_call(op: torch._ops.OpOverload) -> bool:
    """Are ``op``'s table rules verified at each call's own sizes before they stand? A
    user's op's are (its kernel may branch on any size), as are an added table's rules of
    any op: they come from a sweep this build did not check. The generated table's rules
    of torch's own ops hold at every size their signature leaves open."""
    return op.namespace not in TORCH_NAMESPACES or table().added(op_name(op))


def remove_table(rules: dict) -> None:
    """Undo ``add_table(rules)``."""
    table().remove(rules)
    _forget_lookups()


def _forget_lookups() -> None:
    """Drop what was looked up in the tables before they changed (a miss is memoized too)."""
    _INFO.clear()
    _LOOKUPS.clear()


_IGNORED = frozenset({"memory_format", "pin_memory"})  # change strides or allocation, never values


@dataclass
class _OpInfo:
    """Per-op facts the lookup needs, computed once."""

    name: str
    names: tuple[str, ...]
    entries: dict | None  # signature -> table entry
    defaults: dict  # arg name -> token of its default value
    exact_sizes: dict[str, slice]  # the dims keyed by their sizes (catalog.exact_sizes)
    _normalized: dict | None = None

    def normalized(self) -> dict:
        """The op's table signatures by normalized signature."""
        if self._normalized is None:
            self._normalized = {}
            for sig in self.entries or {}:
                self._normalized.setdefault(normalize(sig, self.defaults), sig)
        return self._normalized


_INFO: dict = {}


def op_info(op: torch._ops.OpOverload) -> _OpInfo:
    info = _INFO.get(op)
    if info is None:
        defaults = {}
        for a in op._schema.arguments:
            if a.has_default_value():
                try:
                    defaults[a.name] = value_token(_SPEC_OPS, a.default_value)
                except Exception:  # noqa: BLE001 - an exotic default: never dropped
                    pass
        name = op_name(op)
        info = _INFO[op] = _OpInfo(name, positional_names(op), table().entries(name), defaults, exact_sizes(op))
    return info


def normalize(sig: str, defaults: dict) -> str:
    """The signature without arguments that cannot change the result: a memory format, pin
    memory, or an argument given at its default value (captured graphs spell defaults out,
    samples usually leave them out). Two calls with one normalized signature are the same call."""
    kept = [n + sep + v for n, sep, v in split_signature(sig)
            if not (n in _IGNORED or (sep == "=" and defaults.get(n) == v))]
    return " ".join(kept)


def call_key(x: Any) -> Any:
    """A hashable key of a call's arguments that determines its signature: tensor and spec
    shapes and dtypes, and every other value with its type (1, 1.0 and True differ)."""
    if isinstance(x, torch.Tensor):
        return (x.shape, x.dtype)
    t = type(x)
    if t is list or t is tuple:
        return (t, tuple(call_key(y) for y in x))
    if isinstance(x, DTensorSpec):
        return (x.shape, x.tensor_meta.dtype)
    if t is dict:
        return (t, tuple((k, call_key(v)) for k, v in sorted(x.items())))
    return (t, x)


_LOOKUPS: dict = {}


def memoized(memo: dict, compute: Callable, op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """``compute(op, args, kwargs)``, kept in ``memo`` per (op, shapes, dtypes, arguments):
    a model's repeated layers make the same calls. Unhashable arguments are not kept."""
    try:
        key = (op, call_key(args), call_key(kwargs) if kwargs else None)
        return memo[key]
    except KeyError:
        pass
    except TypeError:
        return compute(op, args, kwargs)
    found = memo[key] = compute(op, args, kwargs)
    return found


def lookup(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[Strategy, ...] | None:
    """The table's strategies for this call (tensors or DTensorSpecs), or None. Looked up by
    signature, then by normalized signature; memoized."""
    return memoized(_LOOKUPS, _lookup, op, args, kwargs)


def _lookup(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[Strategy, ...] | None:
    info = op_info(op)
    if info.entries is None:
        return None
    sig = signature(_SPEC_OPS, info.names, args, kwargs, info.exact_sizes)
    if sig not in info.entries:
        sig = info.normalized().get(normalize(sig, info.defaults))
    return None if sig is None else table().strategies(info.name, sig)


def _is_flag(value: str) -> bool:
    return value in ("True", "False") or (value[:1] == "[" and all(v in ("True", "False") for v in value[1:-1].split(",")))


def _structure(items: list[tuple[str, str, str]]) -> tuple:
    """What a signature says of its tensor arguments (dtype kind and shape pattern, the
    optional ones left out) and of its flags (``keepdim``, ``output_mask``), which can
    change the outputs' number and ranks."""
    return tuple((name, value) for name, sep, value in items if sep == ":" or value == "None" or _is_flag(value))


def neighbour_rules(op: torch._ops.OpOverload, sig: str) -> tuple[Strategy, ...]:
    """The table's rules for the op at its neighbouring signature: the same tensor
    arguments and flags, other values elsewhere (a layer norm's ``normalized_shape``, a
    scalar operand); of several, the one with the most arguments equal to this one's.
    Candidates to verify at a call the table misses; () where there is none."""
    info = op_info(op)
    mine = split_signature(normalize(sig, info.defaults))
    best, most = None, -1
    for other in info.entries or {}:
        theirs = split_signature(normalize(other, info.defaults))
        if _structure(theirs) == _structure(mine) and len(set(theirs) & set(mine)) > most:
            best, most = other, len(set(theirs) & set(mine))
    return () if best is None else table().strategies(info.name, best)


__all__ = ["add_table", "call_key", "lookup", "neighbour_rules", "normalize", "op_info", "remove_table", "table"]
