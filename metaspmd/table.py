"""Static rule tables in the rule model's own terms.

``tools/codegen.py`` writes each backend's verified registry entries into
``generated/<backend>_rules.py`` as ``Entry`` literals: the entry's ``shard``, ``partial``,
``offset`` and ``combine`` in paper notation, exactly as the registry file spells them,
labels kept. A lookup parses an entry once, into the same ``RuleEntry`` the registry and
the live-exploration cache give, and hands out its ``all_strategies()``: a call found in the
table and the same call explored live reach the planner as the same strategies. What a
framework can run of them is decided later, in one place (``metaspmd.target``).

The tables import no framework: the same module serves DTensor, JAX and any tool.
"""

from __future__ import annotations

import importlib
from typing import Mapping, NamedTuple

from .rules import Example, RuleEntry
from .spec import CombineSpec, IndependentSpec, Layer, OffsetSpec, PartialSpec, ShardSpec, Strategy, layer_problem
from .signature import signature_error


class Entry(NamedTuple):
    """One verified registry entry (or, in ``more``, one further layer of it) in paper
    notation. ``shardy``: JAX only, the entry as one Shardy factor rule where it fits one
    (``(rule, reduction_factors, need_replication_factors)``, see codegen)."""

    shard: str
    combine: str
    partial: str = ""
    offset: str = ""
    more: tuple = ()
    independent: str = ""
    shardy: tuple = ()


def _layer_entry(layer: Layer) -> Entry:
    return Entry(
        str(layer.shard), str(layer.combine), "" if layer.partial.is_empty() else str(layer.partial),
        "" if layer.offset is None else str(layer.offset),
    )


def entry_of(e: RuleEntry, shardy: tuple = ()) -> Entry:
    """The table form of a registry entry."""
    first = _layer_entry(e.layers()[0])
    return first._replace(more=tuple(_layer_entry(layer) for layer in e.more),
                          independent="" if e.independent is None else str(e.independent), shardy=shardy)


def _layer(t: Entry) -> Layer:
    shard = ShardSpec.parse(t.shard)
    partial = PartialSpec.parse(t.partial) if t.partial else PartialSpec(tuple(() for _ in shard.inputs))
    return Layer(shard, partial, CombineSpec.parse(t.combine), OffsetSpec.parse(t.offset) if t.offset else None)


def rule_entry(signature: str, t: Entry) -> RuleEntry:
    """The registry entry a table entry was written from, less its example and records."""
    first = _layer(t)
    return RuleEntry(
        signature, "ok", first.shard, first.partial, first.combine, Example(()),
        independent=IndependentSpec.parse(t.independent) if t.independent else None, offset=first.offset,
        more=tuple(_layer(m) for m in t.more),
    )


class RuleTable:
    """Generated tables at runtime: op -> signature -> strategies, each entry parsed on its
    first lookup. Tables added later (a user's own ops, swept offline) take precedence."""

    def __init__(self, rules: Mapping[str, Mapping[str, Entry]]):
        check_rules(rules)  # the shape only: parsing thousands of generated entries would cost a second
        self._base = rules
        self._added: dict[str, Mapping[str, Entry]] = {}
        self._parsed: dict[tuple[str, str], tuple[Strategy, ...]] = {}

    def entries(self, op: str) -> Mapping[str, Entry] | None:
        """The op's table entries by signature, or None when no table lists the op."""
        found = self._added.get(op)
        return found if found is not None else self._base.get(op)

    def ops(self) -> list[str]:
        return sorted({*self._base, *self._added})

    def strategies(self, op: str, signature: str) -> tuple[Strategy, ...] | None:
        """The verified strategies of ``op`` at ``signature``, or None (a miss)."""
        key = (op, signature)
        found = self._parsed.get(key)
        if found is None:
            entry = (self.entries(op) or {}).get(signature)
            if entry is None:
                return None
            found = self._parsed[key] = tuple(rule_entry(signature, entry).all_strategies())
        return found

    def add(self, rules: Mapping[str, Mapping[str, Entry]]) -> None:
        """Look ops up in ``rules`` first; each entry is parsed now, so a bad one is refused
        here, naming it, rather than failing every later lookup in the process."""
        check_rules(rules, parse=True)
        self._added.update(rules)
        self._parsed.clear()

    def added(self, op: str) -> bool:
        """Are ``op``'s rules an added table's (swept elsewhere, perhaps by another build of
        the framework or edited by hand), not the generated one's?"""
        return op in self._added

    def remove(self, rules: Mapping[str, Mapping[str, Entry]]) -> None:
        for op in rules:
            self._added.pop(op, None)
        self._parsed.clear()


def check_rules(rules: object, parse: bool = False) -> None:
    """Refuse what is no table, naming the op and signature: a table is a generated module's
    ``RULES``, op -> {signature: Entry}. ``parse``: each entry's notation too (what a
    lookup would do later)."""
    if not isinstance(rules, Mapping):
        raise TypeError(f"a rule table is a dict op -> {{signature: Entry}} (a generated module's RULES), "
                        f"got a {type(rules).__qualname__}")
    for op, entries in rules.items():
        if not isinstance(op, str) or not isinstance(entries, Mapping):
            raise TypeError(f"rule table entry {op!r}: expected an op name -> {{signature: Entry}}, "
                            f"got {type(op).__qualname__} -> {type(entries).__qualname__} {entries!r:.80}")
        for sig, entry in entries.items():
            _check_entry(op, sig, entry, parse)


def _check_entry(op: str, sig: object, entry: object, parse: bool) -> None:
    if not isinstance(sig, str) or not isinstance(entry, Entry):
        raise TypeError(f"rule table entry {op!r}, signature {sig!r}: expected a str signature -> "
                        f"metaspmd.table.Entry, got {type(sig).__qualname__} -> {type(entry).__qualname__} "
                        f"{entry!r:.80}")
    if parse:
        why = signature_error(sig)
        if why:  # a lookup would never match it, and neighbour_rules would raise on it
            raise ValueError(f"rule table entry {op!r}: signature {sig!r} is not one metaspmd writes: {why}")
        try:
            parsed = rule_entry(sig, entry)
        except Exception as e:  # whatever the parsers raise, named with its entry
            raise ValueError(f"rule table entry {op!r}, signature {sig!r}: {entry!r:.200} does not parse "
                             f"({type(e).__name__}: {e})") from e
        for layer in parsed.layers():  # as the registry loader refuses them
            problem = layer_problem(layer)
            if problem:
                raise ValueError(f"rule table entry {op!r}, signature {sig!r}: {problem[0]}: {problem[1]}")


_GENERATED: dict[str, RuleTable] = {}


def generated(backend: str) -> RuleTable:
    """The generated table of ``backend`` (``metaspmd.generated.<backend>_rules``), loaded
    on first use and shared by every user in the process."""
    if backend not in _GENERATED:
        _GENERATED[backend] = RuleTable(importlib.import_module(f"metaspmd.generated.{backend}_rules").RULES)
    return _GENERATED[backend]


__all__ = ["Entry", "RuleTable", "check_rules", "entry_of", "generated", "rule_entry"]
