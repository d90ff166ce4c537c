"""Rules for every node of a captured graph: the static table first, then live exploration.

A table miss runs ShardCombine on the node's real example values (recorded at capture),
and caches the entry by (op, signature; a split's number of pieces too), in memory and on
disk, so each unseen op is explored once per machine. Where the table lists the op at a
neighbouring signature (the same tensor arguments, other non-tensor ones:
``normalized_shape=[64]`` against the sweep's ``[8]``), those rules are verified at the
call first; where every one holds, that entry stands (a tenth of the time for a layer
norm's backward), else the call is explored from scratch.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .cache import RuleCache
from .case import OpCase
from .explorer import ExploreConfig, explore_case, failed_entry, holds_at_call
from .ir import MetaIR, MetaOp
from .isolation import ChildFailed, ForkServer, Isolation
from .rules import Example, RuleEntry, TensorArg
from .spec import Strategy
from .tensor_ops import TensorOps


@dataclass
class ResolveStats:
    """Where each node's rules came from: ``table + cache + live`` is the number of op
    nodes. ``derived`` counts the cache and live entries whose rules were derived from
    shape arithmetic (view-like ops) rather than explored, ``neighbour`` those whose rules
    are a neighbouring signature's table rules verified at the call; both are part of
    those two."""

    table: int = 0
    cache: int = 0
    live: int = 0
    derived: int = 0
    neighbour: int = 0
    live_seconds: list[float] = field(default_factory=list)
    unexplorable: dict[str, str] = field(default_factory=dict)  # node -> why it has no rule (failed, timed out)
    replicate_only: dict[str, str] = field(default_factory=dict)  # node -> why no cut holds (explored, verified)

    def __str__(self) -> str:
        # derived and neighbour entries come from the cache or live exploration, either one
        rest = [f"{self.derived} derived from shape arithmetic"] if self.derived else []
        rest += [f"{self.neighbour} a neighbouring signature's rules, verified"] if self.neighbour else []
        return (f"{self.table} nodes from the table, {self.cache} from the cache, {self.live} explored live"
                + (f" (of the {self.cache + self.live} not from the table: {', '.join(rest)})" if rest else "")
                + (f", {len(self.replicate_only)} replicated (no cut holds)" if self.replicate_only else "")
                + (f", {len(self.unexplorable)} replicated (no rule)" if self.unexplorable else ""))


@dataclass(frozen=True)
class NodeCall:
    """What the resolver needs of one node: its signature, table rules, and a case to explore."""

    signature: str
    table_rules: tuple[Strategy, ...] | None
    case: Callable[[], OpCase]
    # the table's strategies for neighbouring signatures of a missed call, as candidates
    # (input placements, output combines)
    neighbours: Callable[[], tuple] | None = None
    # makes what ``case`` reads ready (a capture's real values, recorded on first use): run
    # in this process before any exploration, so a forked child finds it done
    prepare: Callable[[], object] | None = None
    # ``case`` built with each run of the op it makes (to choose its inputs) done by the
    # runner given, after the op crashed or hung a child: a forked child's runner, or one
    # that refuses (the op is not run again); None where building ``case`` runs no op
    probed_case: Callable[[Callable[[Callable[[], Any]], Any]], OpCase] | None = None
    # '' for a framework's own op; for a user's op, a fingerprint of its code, part of its
    # cache key (None: code that cannot be read, cached in memory only; see RuleCache.get)
    implementation: str | None = ""
    # the number of outputs of a call whose count its signature does not say (a split into
    # pieces of a size): an entry for another count is not its rules (None: any)
    pieces: int | None = None
    # a user's op, whose kernel may branch on any size (keep the first 32 rows): the call's
    # tensor shapes, in example order. Rules verified at other sizes (a table's, a cached
    # entry's) are then candidates verified at these, not its rules. None: a framework's
    # op, whose rules hold at every size their signature leaves open.
    sizes: tuple[tuple[int, ...], ...] | None = None
    # the call's own tensor shapes and dtypes, where its rules are verified at them and need
    # not hold at the signature's other sizes or dtypes: a user's op (its kernel may branch on
    # either), torch's op reading a position (tril's diagonal: explored on a smaller stand-in,
    # checked at the call). Part of its cache key; None: the signature keys its rules.
    at: str | None = None

    @property
    def key(self) -> tuple:
        """What tells this call's rules from another's of its op: two calls of one signature
        split into different numbers of pieces have rules of their own, as do calls whose
        rules are verified at their own sizes (``at``)."""
        return self.signature, self.pieces, self.sizes, self.at

    def takes(self, entry: RuleEntry) -> bool:
        """Are ``entry``'s rules this call's, by its number of outputs (and a user's op's
        sizes: verified at the call's own)?"""
        return gives_pieces(entry.strategies(), self.pieces) and (
            self.sizes is None or example_shapes(entry.example) == self.sizes)


def example_shapes(example: Example | None) -> tuple[tuple[int, ...], ...]:
    """The shapes of an example's tensors, in argument order."""
    def shapes(v: Any) -> list[tuple[int, ...]]:
        if isinstance(v, TensorArg):
            return [tuple(v.shape)]
        return [s for x in v for s in shapes(x)] if isinstance(v, tuple) else []

    return tuple(s for _, v in (example.args if example is not None else ()) for s in shapes(v))


def gives_pieces(strategies: Iterable[Strategy], pieces: int | None) -> bool:
    """Does every one of ``strategies`` combine ``pieces`` outputs (None: any number)?"""
    return pieces is None or all(len(s.outputs) == pieces for s in strategies)


# the note of an entry whose rules are a neighbouring signature's (or, for a user's op, the
# table's at other sizes), verified at the call
NEIGHBOUR_NOTE = "the table's rules of another signature or other sizes, verified at this call"


def explore_call(call: NodeCall, ops: TensorOps) -> RuleEntry:
    """A missed call's verified rules: its neighbours' where every one holds here (the
    same structure), else explored from scratch. A view-like op's case brings candidates
    of its own, derived from its sizes: those stand. A case that stands in for the call at
    smaller sizes keeps its rules where each also holds at the call's own; where one does
    not, the stand-in was another op there, and the call is explored at its own sizes."""
    case = call.case()
    entry = _explored(call, case, ops)
    real = case.stand_in_for
    if real is not None and not holds_at_call(real, ops, [(s.inputs, s.outputs) for s in entry.strategies()]):
        return _explored(call, real, ops)
    return entry


def _explored(call: NodeCall, case: OpCase, ops: TensorOps) -> RuleEntry:
    candidates = call.neighbours() if call.neighbours is not None and case.candidates is None else ()
    if candidates:
        seeded = dataclasses.replace(case, candidates=candidates, candidates_derived=False,
                                     notes=case.notes + (NEIGHBOUR_NOTE,))
        entry = explore_case(seeded, ops)
        if {p for p, _ in candidates} <= {s.inputs for s in entry.all_strategies()}:
            return entry
    return explore_case(case, ops)


def resolve(
    ir: MetaIR,
    call_of: Callable[[MetaOp], NodeCall],
    ops: TensorOps,
    backend: str,
    cache: RuleCache,
    isolation: Isolation | None = None,
    threads: int = 1,
) -> tuple[dict[str, tuple[Strategy, ...]], ResolveStats]:
    """node name -> verified strategies (empty: replicate only), and where they came from.

    With ``isolation``, live exploration runs in a forked child: an op that crashes or
    hangs it leaves its node replicated, with the reason, instead of taking the caller
    down. Without it, up to ``threads`` calls are explored at once, for a framework whose
    ops are thread-safe and compile outside the GIL (JAX): each exploration is seeded on
    its own, so the entries are the same as one at a time."""
    stats = ResolveStats()
    calls = {node.name: call_of(node) for node in ir.op_list}
    entries: dict[str, RuleEntry] = {}
    unseen: dict[tuple, NodeCall] = {}  # (op, call.key) -> its first node's call
    for node in ir.op_list:
        call = calls[node.name]
        if call.table_rules is None:
            hit = cache.get(backend, node.op, call.signature, call.implementation, call.pieces, call.at)
            if hit is not None and call.takes(hit):
                entries[node.name] = hit
            else:
                unseen.setdefault((node.op, call.key), call)
    for call in unseen.values():
        if call.prepare is not None:
            call.prepare()
    explored = _explore(unseen, ops, isolation, stats, threads)
    counted: set[tuple] = set()
    out: dict[str, tuple[Strategy, ...]] = {}
    for node in ir.op_list:
        call = calls[node.name]
        if call.table_rules is not None:
            out[node.name] = call.table_rules
            stats.table += 1
            continue
        key = (node.op, call.key)
        if node.name in entries:
            entry = entries[node.name]
            stats.cache += 1
        elif key not in counted:  # the first node of its kind: explored live for it
            entry = explored[key]
            counted.add(key)
            stats.live += 1
            cache.remember(backend, node.op, entry, call.implementation, call.pieces, call.at)
            _warn_if_failed(node.op, entry, node.name)
        else:
            entry = explored[key]
            stats.cache += 1
        if entry.status == "derived":
            stats.derived += 1
        if NEIGHBOUR_NOTE in entry.notes:
            stats.neighbour += 1
        out[node.name] = tuple(entry.all_strategies())
        if not out[node.name] and entry.status != "derived":  # derived with no strategy: a factory, replicated by rule
            # replicate-only is a verified answer (tril of a square mask); failed is none
            held = stats.replicate_only if entry.status == "replicate-only" else stats.unexplorable
            held[node.name] = entry.reason or entry.status
    return out, stats


def resolve_call(op: str, call: NodeCall, ops: TensorOps, backend: str, cache: RuleCache,
                 isolation: Isolation | None = None) -> RuleEntry:
    """The verified rules of one call outside a graph (an op registered on its own): from
    the cache, or explored live as ``resolve`` explores a node's, and then cached."""
    entry = cache.get(backend, op, call.signature, call.implementation, call.pieces, call.at)
    if entry is None or not call.takes(entry):
        key = (op, call.key)
        if call.prepare is not None:
            call.prepare()
        entry = _explore({key: call}, ops, isolation, ResolveStats())[key]
        cache.remember(backend, op, entry, call.implementation, call.pieces, call.at)
        _warn_if_failed(op, entry)
    return entry


class LiveExplorationWarning(UserWarning):
    """An op the table lacks could not be explored (it crashed, hung or raised on its
    example call): it runs replicated."""


def _warn_if_failed(op: str, entry: RuleEntry, node: str = "") -> None:
    if entry.status == "failed":
        at = f" (node {node})" if node else ""
        warnings.warn(f"{op}{at}: live exploration failed, so it runs replicated: {entry.reason}",
                      LiveExplorationWarning, stacklevel=3)


def _explore(unseen: dict[tuple, NodeCall], ops: TensorOps, isolation: Isolation | None,
             stats: ResolveStats, threads: int = 1) -> dict[tuple, RuleEntry]:
    if isolation is None and threads > 1 and len(unseen) > 1:
        with ThreadPoolExecutor(min(threads, len(unseen)), thread_name_prefix="metaspmd-explore") as pool:
            try:
                futures = {key: pool.submit(_timed, lambda call=call: explore_call(call, ops), stats)
                           for key, call in unseen.items()}
                return {key: future.result() for key, future in futures.items()}
            except BaseException:  # Ctrl-C or a failed exploration: start nothing more
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    if isolation is None or not unseen:
        return {key: _timed(lambda: explore_call(call, ops), stats) for key, call in unseen.items()}
    tasks = {key: (lambda call=call: explore_call(call, ops)) for key, call in unseen.items()}
    found = {}
    with ForkServer(tasks, isolation) as server:
        for key, call in unseen.items():
            try:
                found[key] = _timed(lambda: server.run(key), stats)
            except ChildFailed as failure:
                found[key] = _timed(lambda: _explore_again(call, ops, isolation, failure), stats)
    return found


def _timed(explore: Callable[[], RuleEntry], stats: ResolveStats) -> RuleEntry:
    start = time.perf_counter()
    entry = explore()
    stats.live_seconds.append(time.perf_counter() - start)
    return entry


def _explore_again(call: NodeCall, ops: TensorOps, isolation: Isolation, failure: ChildFailed) -> RuleEntry:
    """After an exploration crashed its child: explored again with each op call in a child
    of its own, so that the calls that crash reject their candidates only (as an op error
    would) and the rules that hold are still found. A hang is not retried: every call that
    hangs would cost the time limit again: the first call that hangs leaves the op
    replicated (the calls after it are not made, and the verifier reads a run that fails
    as the op refusing those inputs, which may skip a check). Either way the op never runs
    in this process, which it could take down or hang with it."""
    def case(probe: Callable[[Callable[[], Any]], Any]) -> OpCase:
        return call.probed_case(probe) if call.probed_case is not None else call.case()

    if not failure.crashed:
        return failed_entry(case(_not_run), ops, f"live exploration {failure}".splitlines()[0])
    calls = _UntilOneHangs(isolation)
    explored = case(calls.run)
    entry = explore_case(explored, ops, config=ExploreConfig(isolate_calls=calls.run))
    if calls.hung:
        return failed_entry(explored, ops, f"live exploration: {calls.hung} (its calls run one by one, "
                                           "after one crashed the child)")
    return entry


class _UntilOneHangs:
    """Runs each of an op's calls in a child of its own (``Isolation.run``) until one
    hangs past the time limit (``hung`` says so); the calls after it fail unrun."""

    def __init__(self, isolation: Isolation):
        self.isolation, self.hung = isolation, ""

    def run(self, fn: Callable[[], Any]) -> Any:
        if self.hung:
            raise ChildFailed(f"not run: a call {self.hung}")
        try:
            return self.isolation.run(fn)
        except ChildFailed as e:
            if e.timed_out:
                self.hung = str(e)
            raise


def _not_run(op_call: Callable[[], Any]) -> Any:
    raise ChildFailed("not run again after it hung a child")
