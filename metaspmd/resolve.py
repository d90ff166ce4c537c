"""Rules for every node of a captured graph: the static table first, then live exploration.

A table miss runs ShardCombine on the node's real example values (recorded at capture),
and caches the entry by (op, signature), in memory and on disk, so each unseen op is
explored once per machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .cache import RuleCache
from .case import OpCase
from .explorer import explore_case
from .ir import MetaIR, MetaOp
from .spec import Strategy
from .tensor_ops import TensorOps


@dataclass
class ResolveStats:
    """Where each node's rules came from: ``table + cache + live`` is the number of op
    nodes. ``derived`` counts the cache and live entries whose rules were derived from
    shape arithmetic (view-like ops) rather than explored; it is part of those two."""

    table: int = 0
    cache: int = 0
    live: int = 0
    derived: int = 0
    live_seconds: list[float] = field(default_factory=list)
    unexplorable: dict[str, str] = field(default_factory=dict)  # node -> reason

    def __str__(self) -> str:
        return (f"{self.table} nodes from the table, {self.cache} from the cache, {self.live} explored live"
                + (f" ({self.derived} of those derived)" if self.derived else "")
                + (f", {len(self.unexplorable)} replicated (no rule)" if self.unexplorable else ""))


@dataclass(frozen=True)
class NodeCall:
    """What the resolver needs of one node: its signature, table rules, and a case to explore."""

    signature: str
    table_rules: tuple[Strategy, ...] | None
    case: Callable[[], OpCase]


def resolve(
    ir: MetaIR,
    call_of: Callable[[MetaOp], NodeCall],
    ops: TensorOps,
    backend: str,
    cache: RuleCache,
) -> tuple[dict[str, tuple[Strategy, ...]], ResolveStats]:
    """node name -> verified strategies (empty: replicate only), and where they came from."""
    stats = ResolveStats()
    out: dict[str, tuple[Strategy, ...]] = {}
    for node in ir.op_list:
        call = call_of(node)
        if call.table_rules is not None:
            out[node.name] = call.table_rules
            stats.table += 1
            continue

        def explore() -> object:
            start = time.perf_counter()
            entry = explore_case(call.case(), ops)
            stats.live_seconds.append(time.perf_counter() - start)
            return entry

        entry, hit = cache.get_or_explore(backend, node.op, call.signature, explore)
        if hit:
            stats.cache += 1
        else:
            stats.live += 1
        if entry.status == "derived":
            stats.derived += 1
        out[node.name] = tuple(entry.all_strategies())
        if not out[node.name] and entry.status != "derived":  # derived with no strategy: a factory, replicated by rule
            stats.unexplorable[node.name] = entry.reason or entry.status
    return out, stats
