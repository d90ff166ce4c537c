"""Cross-check the torch registry against DTensor's own sharding rules.

    python tools/crosscheck.py --backend torch                       # every registry file
    python tools/crosscheck.py --backend torch --ops 'aten.mm*' --json out.json

For every example call of an op (``backend.cases(op)``, one per signature, as the sweep
explores them), DTensor's accepted rules on a 1-D mesh (crosscheck_dtensor) are compared
with the registry entry of that signature. Both sides are written in DTensor's notation:
ShardIn(d) is S(d) and PartialInput(op) is P(op) on inputs; gather(dim=d), reduce(op) and
identity are S(d), P(op) and R on outputs. A rule is an input placement tuple with a
non-replicated input, and the output placements it gives.

- agreement: DTensor accepts the inputs as they are and gives outputs our entry lists;
- misses: DTensor rules our entry lacks, each with a reason: what the explorer does not
  try, or what the numbers say (a DTensor rule that fails on its own split of our example
  is a DTensor false positive). Where our replay cannot stand in for DTensor (composite
  ops, size-rewriting ops, out= views), the rule runs on real DTensor (crosscheck_real).
  A composite op's rule that holds there but not with the op itself run on the shards
  (an input read for its global shape only) is one only DTensor's decomposition gives:
  counted apart, since no rule of the registry's kind (the op on the shards) can hold;
- extras: our rules DTensor does not give, each re-verified on fresh random data with a
  4-way split (crosscheck_numerics); the exit status is 1 when one fails;
- ops DTensor cannot run at all (no rule, no decomposition, no custom handler) that the
  registry covers.

DTensor's answers are cached per op (crosscheck_dtensor.AnswerCache): a first full run
spends most of its time asking decomposition-based rules; later runs only re-verify.
With ``--other-calls N`` there is no DTensor comparison: every rule is re-verified on up to
N more OpInfo calls of its signature, at other shapes (crosscheck_other_calls).
Exit status: 0 done, 1 a rule of ours failed re-verification or an op's check failed (none
of its rules checked), 2 usage or registry error.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from metaspmd.case import NoSample, OpCase, Skip
from metaspmd.explorer import holds_at_other_sizes
from metaspmd.cli import (
    CROSSCHECK_EXIT, crosscheck_status, interrupted, path_arg, positive_int, read_as_rules, refuse_unused, seconds,
)
from metaspmd.registry_io import RegistryError, load_registry, path_problem, write_text_atomic
from metaspmd.rules import OpRecord, RuleEntry
from metaspmd.signature import signature
from metaspmd.spec import Combine, Gather, InputPlacement
from metaspmd.sweep import SweepConfig, WorkerPool, select_ops, split_patterns, unmatched_patterns
from metaspmd.sweep.config import unwritable
from metaspmd.sweep.workers import Task
from metaspmd.tensor_ops import COMPLEX, FLOAT, INT, TensorOps

from . import catalog
from .crosscheck_dtensor import (
    DTENSOR_PARTIALS, PARTIAL_RE, QUERIED, SHARD_RE, AnswerCache, DTensorQuery, Key, QueryConfig,
    answer_for, canonical_names, default_cache_folder, dtensor_support,
)
from .dtensor import rewrites_shape_args
from .crosscheck_notation import (
    NO_EXAMPLES, RULE_STATUSES, OurRule, fmt_rule, input_key, our_rules, output_key, parse_input, parse_output,
)
from .crosscheck_numerics import INEXACT_SPLIT, FreshInputs, check_foreign_rule, reverify
from .crosscheck_other_calls import Recheck, recheck_op
from .crosscheck_real import REAL, REAL_CANNOT_RUN, REAL_RAISES
from .crosscheck_real import replay as real_dtensor_replay

REGISTRY = Path(__file__).resolve().parent.parent.parent / "registry"
EXTRA_KINDS = ("dtensor-lacks", "no-dtensor-rule", "no-placement", "not-compared")
VERDICTS = ("ok", "failed", "data-dependent", "vacuous", "unchecked")
NO_LIMIT = 30 * 24 * 3600.0  # a pool's time limit where none is asked: longer than any check


@dataclass(frozen=True)
class Config:
    dtensor: QueryConfig = QueryConfig()
    seed: int = 1  # fresh data for the numerical checks
    cache: str | None = None  # folder of DTensor answers; None: no cache
    real_dtensor: bool = True  # replay the misses our own replay cannot check on real DTensor
    # > 0: no DTensor comparison; every rule re-verified on up to this many more calls of
    # its signature, at other shapes (crosscheck_other_calls)
    other_calls: int = 0


# --------------------------------------------------------------------------- comparison


@dataclass
class Miss:
    """A rule DTensor accepts that our entry lacks, and why."""

    op: str
    signature: str
    rule: str
    reason: str
    numeric: str  # holds | wrong (DTensor false positive) | split-dependent | size-dependent | unchecked
    detail: str = ""
    # a composite op's rule that holds on real DTensor, where the op itself on the shards fails
    # or differs: only DTensor's decomposition gives it, so no rule of the op's local kind can
    decomposition_only: bool = False


@dataclass
class Extra:
    """One of our rules that DTensor does not give, re-verified numerically."""

    op: str
    signature: str
    rule: str
    kind: str  # dtensor-lacks | no-dtensor-rule (for the op) | no-placement (halo, scan, argreduce, ...) | not-compared
    dtensor: str  # what DTensor does with these inputs
    verdict: str  # ok | failed | data-dependent (only on the sample's inputs) | vacuous (empty output) | unchecked
    detail: str = ""


@dataclass
class OpResult:
    op: str
    support: str  # how DTensor handles the op (crosscheck_dtensor.dtensor_support)
    status: str = ""  # the record's status
    examples: int = 0
    compared: int = 0  # examples with both a DTensor answer and a registry entry
    dtensor_rules: int = 0
    ours: int = 0  # our rules with DTensor names
    inexpressible: int = 0  # our rules without a DTensor placement (halo, overlap, proportional, ...)
    agree: int = 0
    truncated: int = 0  # examples whose enumeration hit the cap
    clocked: int = 0  # of those, the ones the clock stopped (DTensorAnswer.clocked)
    dtensor_runs: int = 0  # examples DTensor can run at all
    queries: int = 0
    misses: list[Miss] = field(default_factory=list)
    extras: list[Extra] = field(default_factory=list)
    rechecks: list[Recheck] = field(default_factory=list)  # --other-calls
    not_applied: int = 0  # --other-calls: rules x calls where the rule's cuts do not line up (cuts_line_up)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _static_reason(inputs: Key, outputs: Key, entry: RuleEntry | None, mine: list[OurRule],
                   query: DTensorQuery) -> str:
    """Why the explorer does not find a DTensor rule, from what it tries; '' when it should."""
    if entry is None:
        return "no registry entry for this signature"
    if entry.status not in RULE_STATUSES:
        return f"our entry is {entry.status}" + (f": {entry.reason}" if entry.reason else "")
    same = [r.text() for r in mine if r.inputs == inputs]
    odd = [k for k in outputs if parse_output(k) is None]
    if odd:
        return f"DTensor gives {odd[0]}, which no combine of ours expresses" + (f"; ours: {same[0]}" if same else "")
    if same:
        return "output differs: ours " + "; ".join(same)
    for i, k in enumerate(inputs):
        m = PARTIAL_RE.match(k)
        if m and m[1] != "sum":
            return f"the explorer does not try Partial({m[1]}) inputs"
        kind = query.ops.dtype_kind(query.tensors[i]) if m else None
        if m and kind not in (FLOAT, COMPLEX, INT):
            return "the explorer tries Partial inputs on float and integer tensors only"
        if m and kind == INT and not all(r.dtype.startswith(("int", "uint")) for r in entry.results):
            return ("the explorer tries integer Partial inputs only where every output is an integer, "
                    "or where no output reads them")
    sharded = [(query.tensors[i], int(m[1])) for i, k in enumerate(inputs) if (m := SHARD_RE.match(k))]
    if any(t.numel() == 0 for t, _ in sharded):
        return "a sharded input of the example is empty: its shards cannot differ, so the explorer skips it"
    if len({t.shape[d] for t, d in sharded}) > 1:
        return "the explorer shards inputs together only along dims of one size"
    if not catalog.is_reshape(query.func) and any(isinstance(g := parse_output(k), Gather) and g.block > 1 for k in outputs):
        return "a block count the signature does not pin: kept only where it holds at other sizes too"
    if entry.status == "derived":
        return "the derived view rule does not list it"

    if any(PARTIAL_RE.match(k) for k in inputs) and any(SHARD_RE.match(k) for k in inputs):
        if any(r.inputs == tuple("R" if PARTIAL_RE.match(k) else k for k in inputs) for r in mine):
            return ("the explorer adds Partial inputs to a shard group only when the group fails alone, "
                    "or where no output reads their values")
    return ""


# Support paths where DTensor runs the op's own kernel on the local shards, with the call's
# other arguments unchanged (ops whose size arguments it rewrites are told apart first).
KERNEL_ON_SHARDS = ("single-dim", "op-strategy")
KERNEL_FAILS = "DTensor would run the kernel on these local shards, and it fails there"
SHARD_FAILS_RE = re.compile(r"^shard \d+ of \d+ fails")
REWRITES = "DTensor rewrites the op's size arguments for each shard; the explorer runs shards with the global ones"
COMPOSITE = "a composite op: DTensor runs its decomposition, not the op, on each shard"
LOCAL_FAILS = "the op itself on these shards"
NO_COMBINE = "an output placement has no combine of ours"
# DTensor decides per call, on the real sizes; our signature leaves them open
SIZED = "holds at the example's sizes only: the signature leaves them open, and the explorer checks rules at other sizes too"


def _reason(static: str, numeric: str, detail: str) -> str:
    if numeric == "wrong" and detail.startswith(KERNEL_FAILS):
        return "DTensor false positive: the local call it would make fails on a shard"
    if numeric == "wrong" and detail.startswith(REAL_CANNOT_RUN):
        return "DTensor false positive: its query accepts the call, real DTensor cannot run the op"
    if numeric == "wrong" and detail.startswith(REAL_RAISES):
        return "DTensor false positive: real DTensor raises on these placements"
    if numeric == "wrong" and detail.startswith(REAL):
        return "DTensor false positive: real DTensor gives a wrong result"
    if numeric == "wrong":
        return "DTensor false positive: its rule is wrong on this example"
    if static:
        return static
    if detail == REWRITES:
        return REWRITES
    if detail == COMPOSITE:
        return "not found by the explorer; not replayed: " + COMPOSITE
    if numeric == "split-dependent":
        return "holds only for some shard counts; the explorer needs 2, 3 and uneven shards"
    if numeric == "size-dependent":
        return SIZED
    if numeric == "holds" and detail.startswith(REAL) and LOCAL_FAILS in detail:
        return "holds on real DTensor, which runs the op's decomposition; the op itself on these shards fails or differs"
    if numeric == "holds" and detail.startswith(REAL) and detail.endswith(f"({COMPOSITE})"):
        return "holds on real DTensor, which runs the op's decomposition; the explorer, running the op itself, missed it"
    if numeric == "holds" and detail.startswith(REAL):
        return "holds on real DTensor: the explorer missed it"
    if numeric == "holds":
        return "holds numerically: the explorer missed it"
    if detail.startswith(INEXACT_SPLIT):
        return f"not found by the explorer; unchecked: {detail}"
    return "not found by the explorer; the numeric check could not run"


def _check_dtensor_rule(func, fresh: FreshInputs, inputs: Key, outputs: Key, config: Config) -> tuple[str, str]:
    if rewrites_shape_args(func) and fresh.case.candidates is None:  # derived view cases adapt sizes themselves
        return "unchecked", REWRITES
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return "unchecked", COMPOSITE
    return _replay_on_shards(fresh, inputs, outputs, config)


def _replay_on_shards(fresh: FreshInputs, inputs: Key, outputs: Key, config: Config) -> tuple[str, str]:
    """The rule checked with the op itself run on the shards, as the explorer runs it."""
    combines = tuple(parse_output(k) for k in outputs)
    if any(c is None for c in combines):
        return "unchecked", NO_COMBINE
    placements = tuple(parse_input(k) for k in inputs)
    numeric, detail = check_foreign_rule(fresh, placements, combines, config.dtensor.mesh_size, config.seed)
    if numeric == "holds" and not _holds_at_other_sizes(fresh, placements, combines):
        return "size-dependent", SIZED
    return numeric, detail


def _holds_at_other_sizes(fresh: FreshInputs, placements: Sequence[InputPlacement], combines: Sequence[Combine]) -> bool:
    try:
        return holds_at_other_sizes(fresh.case, fresh.ops, placements, combines)
    except Exception:  # the op fails on fresh inputs: nothing tells against the rule
        return True


def _local_failure(fresh: FreshInputs, inputs: Key, outputs: Key, config: Config) -> str:
    """How a composite op's rule fails with the op itself run on the shards ('' where it
    holds, or cannot be checked): DTensor runs the op's decomposition instead, on tensors
    that keep their global shapes, so an input read for its shape alone (``view_as``'s
    other, ``diff``'s append at n=0) may take any placement there and none here."""
    verdict, detail = _replay_on_shards(fresh, inputs, outputs, config)
    if verdict == "wrong" or (verdict == "unchecked" and SHARD_FAILS_RE.match(detail)):
        return detail
    return ""


def _leaves(x: Any) -> list[Any]:
    return [y for v in x for y in _leaves(v)] if isinstance(x, (list, tuple)) else [x]


def _cases(backend, op: str) -> tuple[list[OpCase], str]:
    try:
        return list(backend.cases(op)), ""
    except Skip as s:
        return [], f"{s.status}: {s.reason}"
    except NoSample as e:
        return [], f"no-sample: {e}"
    except Exception as e:
        return [], f"cases fail: {type(e).__name__}: {e}"


def crosscheck_op(backend, op: str, record: OpRecord | None, config: Config = Config(),
                  cache: AnswerCache | None = None) -> OpResult:
    """Compare DTensor's rules and the record's, example by example."""
    start = time.perf_counter()
    try:
        func = catalog.resolve(op)
    except KeyError:
        return OpResult(op, "unknown", notes=["not an ATen overload here"])
    result = OpResult(op, dtensor_support(func), status=record.status if record else "missing")
    if record is not None and record.status in NO_EXAMPLES:  # nothing ran: building cases would only fail again
        result.notes.append(f"{record.status}: {record.reason}")
        return result
    cases, why = _cases(backend, op)
    if why:
        result.notes.append(why)
    ops = backend.tensor_ops()
    cache = cache or AnswerCache(None)
    seen: set[str] = set()
    for case in cases:
        sig = signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes)
        if sig in seen:  # the registry keeps the first example of each signature
            continue
        if case.reserve and (record is None or record.entry(sig) is None):
            continue  # a spare sample the sweep did not need
        seen.add(sig)
        result.examples += 1
        _compare_case(result, func, case, sig, record.entry(sig) if record else None, ops, config, cache)
    cache.flush()
    result.seconds = time.perf_counter() - start
    return result


def _dtensor_side(result: OpResult, func, case: OpCase, sig: str, out: Any, mine: list[OurRule], ops: TensorOps,
                  config: Config, cache: AnswerCache) -> tuple[DTensorQuery | None, dict[Key, Key], bool]:
    """DTensor's accepted rules for this call, and whether DTensor runs it at all. Our rules'
    inputs are asked directly where the enumeration did not reach them (cap, keyword tensors)."""
    if result.support not in QUERIED:
        return None, {}, result.support != "none"
    if not any(isinstance(x, torch.Tensor) for x in _leaves(out)):
        result.notes.append(f"{sig}: no tensor output, no rule to compare")
        return None, {}, True
    try:
        query = DTensorQuery(func, case, ops, config.dtensor.mesh_size, out)
        answer = answer_for(query, config.dtensor, cache, result.op)
    except Exception as e:
        result.notes.append(f"{sig}: DTensor query fails: {type(e).__name__}: {str(e)[:120]}")
        return None, {}, True
    result.queries += answer.queried
    result.truncated += answer.truncated
    result.clocked += answer.clocked
    if not answer.runs:
        result.notes.append(f"{sig}: DTensor cannot run this call, not even on replicated inputs")
        return query, {}, False
    result.dtensor_runs += 1
    tensors = [x for x in _leaves(out) if isinstance(x, torch.Tensor)]
    accepted = {k: canonical_names(v, tensors) for k, v in answer.accepted.items()}
    options = [query.options(i, config.dtensor.partials) for i in range(query.n_inputs)]
    for rule in mine:
        offered = all(k in opts for k, opts in zip(rule.inputs, options))
        if rule.expressible and rule.inputs not in accepted and (answer.truncated or not offered):
            got = query.accepts_inputs(rule.inputs, rule.options)
            if got is not None:
                accepted[rule.inputs] = canonical_names(got, tensors)
    return query, accepted, True


def _compare_case(result: OpResult, func, case: OpCase, sig: str, entry: RuleEntry | None,
                  ops: TensorOps, config: Config, cache: AnswerCache) -> None:
    try:
        out = case.call(tuple(case.args), dict(case.kwargs))
    except Exception as e:
        result.notes.append(f"{sig}: the example fails: {type(e).__name__}: {str(e)[:120]}")
        return
    mine = our_rules(entry)
    expressible = [r for r in mine if r.expressible]
    result.ours += len(expressible)
    result.inexpressible += len(mine) - len(expressible)
    query, accepted, runs = _dtensor_side(result, func, case, sig, out, mine, ops, config, cache)
    result.dtensor_rules += len(accepted)
    result.compared += query is not None and runs and entry is not None
    fresh = FreshInputs(case, ops)
    for inputs, outputs in sorted(accepted.items()):
        if any(r.inputs == inputs and r.gives(outputs) for r in expressible):
            result.agree += 1
            continue
        numeric, detail = _check_dtensor_rule(func, fresh, inputs, outputs, config)
        if numeric == "unchecked" and SHARD_FAILS_RE.match(detail) and result.support in KERNEL_ON_SHARDS:
            numeric, detail = "wrong", f"{KERNEL_FAILS}: {detail}"
        if numeric == "unchecked" and config.real_dtensor and not detail.startswith(INEXACT_SPLIT):
            # our replay cannot stand in for DTensor here (DTensor's own would split inexactly too)
            why = detail
            numeric, detail = real_dtensor_replay(func, fresh, inputs, outputs, config.dtensor.mesh_size)
            detail += f" ({why})" if why == COMPOSITE else ""
        local = ""
        if numeric == "holds" and detail.endswith(f"({COMPOSITE})"):
            local = _local_failure(fresh, inputs, outputs, config)
            detail += f"; {LOCAL_FAILS}: {local}" if local else ""
        static = _static_reason(inputs, outputs, entry, expressible, query)
        reason = _reason(static, numeric, detail)
        result.misses.append(Miss(result.op, sig, fmt_rule(inputs, outputs), reason, numeric, detail, bool(local)))
    for rule in mine:
        got = accepted.get(rule.inputs) if rule.expressible else None
        if got is not None and rule.gives(got):
            continue
        if not rule.expressible:
            kind, dt = "no-placement", "DTensor has no placement for it"
        elif result.support == "none":
            kind, dt = "no-dtensor-rule", "DTensor has no rule for the op"
        elif not runs:
            kind, dt = "no-dtensor-rule", f"DTensor cannot run the call ({result.support} fails)"
        elif query is None:
            kind, dt = "not-compared", f"DTensor side not queried ({result.support})"
        else:
            kind, dt = "dtensor-lacks", "not accepted as-is" if got is None else "gives " + fmt_rule(rule.inputs, got)
        verdict, detail = reverify(fresh, rule.placements, rule.combines, config.seed)
        result.extras.append(Extra(result.op, sig, rule.text(), kind, dt, verdict, detail))


# --------------------------------------------------------------------------- running


_WORKER: dict[str, Any] = {}  # per process: the backend and the answer cache


def _init_worker(backend_options: dict, cache: str | None, quiet: bool = True) -> None:
    """This process checks ops itself (no worker pool): the backend and the answer cache."""
    from . import get_backend

    if quiet:  # framework warnings from thousands of odd calls bury the report
        warnings.simplefilter("ignore")
    backend = get_backend(**backend_options)
    # The sample index and the model programs' calls, before any op, as sweep workers make
    # them: made inside a worker's first check, they once came out short, and five ops had
    # fewer examples in one run than in the next.
    backend.prepare()
    _WORKER["backend"] = backend
    _WORKER["cache"] = AnswerCache(Path(cache) if cache else None)


def check_in_worker(backend, op: str, record: OpRecord | None, explore: bool,
                    config: Config) -> tuple[OpResult, OpRecord | None]:
    """One op in a worker of the sweep's pool (``metaspmd.sweep.workers``), which loaded and
    prepared the backend, keeps the worker's output out of the report, and kills and
    replaces a worker past the time limit or dead."""
    if not _WORKER:
        warnings.simplefilter("ignore")
        _WORKER.update(backend=backend, cache=AnswerCache(Path(config.cache) if config.cache else None))
    return _check_one(op, record, explore, config)


# How the note of an op whose check raised, ran past the time limit or killed its worker
# starts: none of its rules was checked, which the report counts and the exit status says.
CHECK_FAILS = "cross-check fails"


def check_failed(backend: str, op: str, reason: str) -> tuple[OpResult, None]:
    """The result of an op whose check raised, ran past the time limit or killed its worker."""
    return OpResult(op, "unknown", notes=[f"{CHECK_FAILS}: {reason}"]), None


def _drop_dispatch_modes(depth: int) -> None:
    """Pop dispatch modes an interrupted query left entered (DTensor's decomposition
    tracing does not unwind on an error); every later op would go through them."""
    from torch.utils._python_dispatch import _pop_mode

    while torch._C._len_torch_dispatch_stack() > depth:
        _pop_mode()


def _check_one(op: str, record: OpRecord | None, explore: bool, config: Config) -> tuple[OpResult, OpRecord | None]:
    """One op in this process: explored first when it has no record and that is asked."""
    from metaspmd.explorer import explore_op

    start = time.perf_counter()
    backend = _WORKER["backend"]
    depth = torch._C._len_torch_dispatch_stack()
    try:
        if record is None and explore:
            record = explore_op(backend, op)
        if config.other_calls:
            result = OpResult(op, "-", status=record.status if record else "missing")
            return recheck_op(backend, op, record, config.other_calls, config.seed, result), record
        return crosscheck_op(backend, op, record, config, _WORKER["cache"]), record
    except Exception as e:  # one bad op must not stop the check
        note = f"{CHECK_FAILS}: {type(e).__name__}: {str(e)[:160]}"
        return OpResult(op, "unknown", notes=[note], seconds=time.perf_counter() - start), record
    finally:
        _drop_dispatch_modes(depth)


def hand_written(by_source: dict[str, dict[str, int]]) -> Counter:
    """The counts of ``Report.by_source`` summed over DTensor's hand-written sources."""
    return sum((Counter(v) for k, v in by_source.items() if k != "decomposition"), Counter())


@dataclass
class Report:
    config: Config
    results: list[OpResult]
    explored: list[str] = field(default_factory=list)  # ops explored now (no registry file)
    seconds: float = 0.0
    not_checked: list[str] = field(default_factory=list)  # an interrupted run's ops that got no result

    def total(self, name: str) -> int:
        return sum(getattr(r, name) for r in self.results)

    def misses(self) -> list[Miss]:
        return [m for r in self.results for m in r.misses]

    def extras(self) -> list[Extra]:
        return [e for r in self.results for e in r.extras]

    def failures(self) -> list[Extra | Recheck]:
        return [e for r in self.results for e in (*r.extras, *r.rechecks) if e.verdict == "failed"]

    def unchecked_ops(self) -> list[tuple[str, str]]:
        """(op, why) of the ops whose check itself failed: none of their rules was checked."""
        return [(r.op, n) for r in self.results for n in r.notes if n.startswith(CHECK_FAILS)]

    def dtensor_cannot_run(self) -> list[OpResult]:
        """Ops DTensor cannot run at all (no rule, or a decomposition that fails on every
        example) for which we have rules that re-verify."""
        return [r for r in self.results
                if (r.support == "none" or r.support in QUERIED and r.examples and not r.dtensor_runs)
                and any(e.verdict == "ok" for e in r.extras)]

    def by_source(self) -> dict[str, dict[str, int]]:
        """DTensor's rules and our misses by where DTensor's rule comes from: its hand-written
        strategies (``single-dim``, ``op-strategy``) or a composite op's decomposition, which
        DTensor propagates placements through (``decomposition``)."""
        out: dict[str, dict[str, int]] = {}
        for r in self.results:
            if not r.dtensor_rules:
                continue
            n = out.setdefault(r.support, Counter())
            n.update(dtensor_rules=r.dtensor_rules, missed=len(r.misses),
                     dtensor_false_positives=sum(m.numeric == "wrong" for m in r.misses),
                     decomposition_only=sum(m.decomposition_only for m in r.misses))
        return {k: {name: v[name] for name in ("dtensor_rules", "missed", "dtensor_false_positives",
                                               "decomposition_only")}
                for k, v in sorted(out.items(), key=lambda kv: QUERIED.index(kv[0]))}

    def summary(self) -> dict[str, Any]:
        misses, extras = self.misses(), self.extras()
        wrong = sum(m.numeric == "wrong" for m in misses)
        decomposition_only = sum(m.decomposition_only for m in misses)
        dt = self.total("dtensor_rules")
        by_source = self.by_source()
        hand = hand_written(by_source)
        kinds, verdicts = Counter(e.kind for e in extras), Counter(e.verdict for e in extras)
        return {
            "ops": len(self.results),
            "explored_now": len(self.explored),
            "support": dict(sorted(Counter(r.support for r in self.results).items())),
            "examples": self.total("examples"),
            "examples_compared": self.total("compared"),
            "dtensor_rules": dt,
            "agree": self.total("agree"),
            "missed": len(misses),
            "dtensor_false_positives": wrong,
            "miss_rate": round(len(misses) / dt, 4) if dt else 0.0,
            "miss_rate_without_false_positives": round((len(misses) - wrong) / dt, 4) if dt else 0.0,
            "decomposition_only": decomposition_only,
            "local_miss_rate": round((len(misses) - wrong - decomposition_only) / dt, 4) if dt else 0.0,
            "by_source": by_source,
            "hand_written_miss_rate": round(hand["missed"] / hand["dtensor_rules"], 4) if hand["dtensor_rules"] else 0.0,
            "ours": self.total("ours"),
            "ours_no_placement": self.total("inexpressible"),
            "extras": len(extras),
            "extras_by_kind": {k: kinds[k] for k in EXTRA_KINDS},
            "extras_by_verdict": {k: verdicts[k] for k in VERDICTS},
            "dtensor_cannot_run_ops": len(self.dtensor_cannot_run()),
            "ops_check_failed": len(self.unchecked_ops()),
            "truncated_examples": self.total("truncated"),
            "clocked_examples": self.total("clocked"),
            "dtensor_queries": self.total("queries"),
            "check_seconds": round(sum(r.seconds for r in self.results), 1),
            "seconds": round(self.seconds, 1),
        }


def run(ops: Sequence[str], records: dict[str, OpRecord], config: Config = Config(), explore_missing: bool = False,
        jobs: int = 1, backend_options: dict | None = None, timeout: float = 0.0, progress: bool = False,
        quiet: bool = False) -> Report:
    """Cross-check ``ops`` (records by op name; the missing ones explored when asked).
    ``quiet``: silence Python warnings in this process too (worker processes always are)."""
    start = time.perf_counter()
    tasks = {op: (records.get(op), explore_missing, config) for op in ops}
    results: list[OpResult] = []
    explored: list[str] = []

    def collect(res: OpResult, rec: OpRecord | None) -> None:
        results.append(res)
        if res.op not in records and rec is not None:
            explored.append(res.op)
        if progress:
            print(f"\r{len(results)}/{len(tasks)} {res.op[:60]:<60}", end="", file=sys.stderr, flush=True)

    try:
        if jobs <= 1 and not timeout:
            _init_worker(backend_options or {}, config.cache, quiet)
            for op, task in tasks.items():
                collect(*_check_one(op, *task))
        else:  # a time limit needs a worker to kill; the sweep's pool keeps going past a dead one
            pool_config = SweepConfig("torch", Path("."), jobs=max(1, jobs), timeout=timeout or NO_LIMIT,
                                      backend_options=tuple((backend_options or {}).items()))
            task = Task(f"{__name__}:check_in_worker", f"{__name__}:check_failed")
            with WorkerPool(pool_config, task) as pool:
                pool.start()
                pool.run(list(tasks), lambda outcome: collect(*outcome.record), tasks)
    except KeyboardInterrupt:  # Ctrl-C: the report covers the ops checked so far, and counts the rest
        done = {r.op for r in results}
        not_checked = [op for op in tasks if op not in done]
    else:
        not_checked = []
    if progress:
        print(file=sys.stderr)
    results.sort(key=lambda r: r.op)
    return Report(config, results, sorted(explored), time.perf_counter() - start, not_checked)


# --------------------------------------------------------------------------- report


def _table(rows: list[tuple], header: tuple) -> list[str]:
    cells = [tuple(str(c) for c in row) for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%" if b else "-"


# how DTensor comes by a rule (crosscheck_dtensor.dtensor_support): a strategy written for the
# op by hand, or placements propagated through the op's decomposition
SOURCES = {
    "single-dim": "hand-written strategy (single-dim)",
    "op-strategy": "hand-written strategy (op strategy)",
    "rule": "hand-written rule",
    "decomposition": "propagated through the op's decomposition",
}


def _left(counts: dict[str, int]) -> int:
    """Misses DTensor is not wrong about and that the op on the shards also gives."""
    return counts["missed"] - counts["dtensor_false_positives"] - counts["decomposition_only"]


def format_report(report: Report, limit: int = 50) -> str:
    s, c = report.summary(), report.config.dtensor
    dt, kinds, verdicts = s["dtensor_rules"], s["extras_by_kind"], s["extras_by_verdict"]
    lines = [
        f"DTensor cross-check: torch {torch.__version__}, 1-D mesh of {c.mesh_size}, "
        f"Partial inputs offered: {', '.join(c.partials) or 'none'}",
        f"{s['ops']} ops ({s['explored_now']} explored now), {s['examples']} examples, {s['examples_compared']} "
        "compared; DTensor handles them by " + ", ".join(f"{k} {v}" for k, v in s["support"].items()),
        "",
    ]
    lines += _table([
        ("DTensor rules (Shard/Partial inputs, accepted as-is)", dt, ""),
        ("  agreement: ours too", s["agree"], _pct(s["agree"], dt)),
        ("  missed by us", s["missed"], _pct(s["missed"], dt)),
        ("    of which DTensor is wrong on our data", s["dtensor_false_positives"], ""),
        ("    of which only DTensor's decomposition gives (the op on the shards fails or differs)",
         s["decomposition_only"], ""),
        ("our rules in DTensor placements", s["ours"], ""),
        ("our rules DTensor does not give, re-verified", s["extras"], ""),
        ("  DTensor lacks the rule", kinds["dtensor-lacks"], ""),
        ("  DTensor has no rule for the op", kinds["no-dtensor-rule"], ""),
        ("  no DTensor placement (halo, overlap, proportional, reverse, scan, xor, argreduce, offset, local)", kinds["no-placement"], ""),
        ("  not compared (custom handler, query failed)", kinds["not-compared"], ""),
        ("  re-verified ok", verdicts["ok"], ""),
        ("  re-verification FAILED", verdicts["failed"], ""),
        ("  holds on the sample's inputs only", verdicts["data-dependent"], ""),
        ("  vacuous (empty output)", verdicts["vacuous"], ""),
        ("  unchecked", verdicts["unchecked"], ""),
        ("ops DTensor cannot run that we cover", s["dtensor_cannot_run_ops"], ""),
        ("ops whose check FAILED (raised, timed out or killed its worker): unchecked", s["ops_check_failed"], ""),
    ], ("rules", "count", "share"))
    local = _left(s)
    lines.append(f"\nmiss rate {_pct(s['missed'], dt)} ({_pct(s['missed'] - s['dtensor_false_positives'], dt)} "
                 f"without DTensor's wrong rules, {_pct(local, dt)} without those and the decomposition-only ones); "
                 f"{s['dtensor_queries']} DTensor queries, "
                 f"{s['truncated_examples']} examples capped, {s['clocked_examples']} of them by the clock "
                 f"(--max-seconds; how far those got depends on the machine's speed and load); "
                 f"{s['check_seconds']} s checking, {s['seconds']} s in all")
    lines += ["", "DTensor's rules by where they come from:"]
    lines += _table([(SOURCES[k], v["dtensor_rules"], v["missed"], _pct(v["missed"], v["dtensor_rules"]),
                      v["dtensor_false_positives"], v["decomposition_only"], _left(v),
                      _pct(_left(v), v["dtensor_rules"])) for k, v in s["by_source"].items()],
                    ("source", "rules", "missed", "share", "DTensor wrong", "decomposition-only", "left", "share"))
    hand = hand_written(s["by_source"])
    lines.append(f"miss rate on DTensor's hand-written rules {_pct(hand['missed'], hand['dtensor_rules'])}")
    misses = report.misses()
    if misses:
        lines += ["", "Misses by reason:"]
        lines += _table(Counter(m.reason for m in misses).most_common(), ("reason", "count"))
        lines += ["", f"Misses (first {limit} of {len(misses)}):" if len(misses) > limit else "Misses:"]
        lines += _table([(m.op, m.signature, m.rule, m.reason) for m in misses[:limit]],
                        ("op", "signature", "DTensor rule", "reason"))
    extras = report.extras()
    if extras:
        per_op: dict[str, Counter] = {}
        for e in extras:
            per_op.setdefault(e.op, Counter()).update([e.verdict, e.kind])
        rows = [(op, sum(n[v] for v in VERDICTS), *(n[v] for v in VERDICTS), *(n[k] for k in EXTRA_KINDS))
                for op, n in per_op.items()]
        lines += ["", "Our rules DTensor does not give, per op" + (f" (first {limit} of {len(rows)} ops):"
                                                                   if len(rows) > limit else ":")]
        lines += _table(rows[:limit], ("op", "rules", *VERDICTS, *EXTRA_KINDS))
    for verdict, title in (("failed", "FAILED re-verification:"),
                           ("data-dependent", "Rules that hold only on the sample's own inputs:")):
        bad = [e for e in extras if e.verdict == verdict]
        if bad:
            lines += ["", title]
            lines += _table([(e.op, e.signature, e.rule, e.detail) for e in bad[:limit]],
                            ("op", "signature", "rule", "detail"))
    cannot = report.dtensor_cannot_run()
    if cannot:
        lines += ["", "Ops DTensor cannot run at all that we cover:"]
        lines += _table([(r.op, r.support, len(r.extras), sum(e.verdict == "ok" for e in r.extras))
                         for r in cannot[:limit]], ("op", "DTensor", "our rules", "re-verified ok"))
    return "\n".join(lines + _unchecked_and_notes(report, limit))


def format_rechecks(report: Report, limit: int = 50) -> str:
    """The printed report of a ``--other-calls`` run."""
    rechecks = [r for res in report.results for r in res.rechecks]
    verdicts = Counter(r.verdict for r in rechecks)
    ops_checked = sum(bool(res.rechecks) for res in report.results)
    lines = [
        f"Rules re-verified on other calls of their signatures (up to {report.config.other_calls} per signature, "
        f"at other shapes than the explored call): {len(report.results)} ops, {ops_checked} with such calls, "
        f"{sum(res.examples for res in report.results)} calls",
        "",
    ]
    lines += _table([(v, verdicts[v]) for v in VERDICTS]
                    + [("not applied: cuts of unequal lengths", sum(res.not_applied for res in report.results))],
                    ("verdict", "rules x calls"))
    lines.append(f"\n{report.seconds:.1f} s in all")
    for verdict, title in (("failed", "FAILED re-verification:"),
                           ("data-dependent", "Rules that hold only on the sample's own inputs:")):
        bad = [r for r in rechecks if r.verdict == verdict]
        if bad:
            lines += ["", title + (f" (first {limit} of {len(bad)})" if len(bad) > limit else "")]
            lines += _table([(r.op, r.signature, r.shapes, r.rule, r.detail) for r in bad[:limit]],
                            ("op", "signature", "shapes", "rule", "detail"))
    return "\n".join(lines + _unchecked_and_notes(report, limit))


def _unchecked_and_notes(report: Report, limit: int) -> list[str]:
    """The ops whose check failed, every one, then the first ``limit`` other notes."""
    unchecked = report.unchecked_ops()
    lines = ["", f"Ops whose check FAILED, none of their rules checked ({len(unchecked)}):"] if unchecked else []
    lines += [f"  {op}: {why}" for op, why in unchecked]
    notes = [(r.op, n) for r in report.results for n in r.notes if not n.startswith(CHECK_FAILS)]
    if notes:
        lines += ["", f"Notes ({len(notes)}):"] + [f"  {op}: {n}" for op, n in notes[:limit]]
    if report.not_checked:
        lines += ["", f"Interrupted: {len(report.not_checked)} op(s) not checked; the counts above are of the "
                      f"{len(report.results)} checked"]
    return lines


def report_json(report: Report) -> str:
    return json.dumps({
        "config": asdict(report.config),
        "torch": torch.__version__,
        "summary": report.summary(),
        "explored_now": report.explored,
        "ops": [asdict(r) for r in report.results],
        **({"not_checked": report.not_checked} if report.not_checked else {}),
    }, indent=1, sort_keys=True)


# --------------------------------------------------------------------------- command line


# DTensor shards no dim smaller than the mesh, and the registry's example dims are small (99%
# at most 20): past a few dozen devices every rule would read "DTensor lacks it"; the real
# replay also holds one tensor per simulated rank.
MAX_MESH = 64


def mesh_size(text: str) -> int:
    """argparse type for --mesh-size: an integer from 2 to MAX_MESH."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 2 <= value <= MAX_MESH:
        raise argparse.ArgumentTypeError(f"expected an integer from 2 to {MAX_MESH}, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="crosscheck --backend torch", allow_abbrev=False,  # see cli.crosscheck
                                description="Compare the torch registry with DTensor's own sharding rules.",
                                epilog=CROSSCHECK_EXIT)
    p.add_argument("--ops", action="append", default=[], metavar="GLOB",
                   help="only ops matching these globs (comma-separated or repeated); those without a registry "
                        "file are explored on the fly. Default: every op with a registry file")
    p.add_argument("--registry", type=path_arg, default=REGISTRY, help="registry root (default: the repository's)")
    p.add_argument("--explore-missing", action="store_true",
                   help="explore ops without a registry file (with no --ops: every catalog op, slow)")
    p.add_argument("--mesh-size", type=mesh_size, default=QueryConfig.mesh_size,
                   help=f"size of the 1-D mesh DTensor plans for, 2 to {MAX_MESH} (default 2: DTensor shards no "
                        "dim smaller)")
    p.add_argument("--partials", default="sum",
                   help=f"Partial input placements offered to DTensor, from {','.join(DTENSOR_PARTIALS)} "
                        "(default: sum, the one the explorer tries)")
    p.add_argument("--max-combos", type=positive_int, default=QueryConfig.max_combos,
                   help="placement tuples asked per example where DTensor lists none (default %(default)s)")
    p.add_argument("--max-seconds", type=seconds, default=QueryConfig.max_seconds,
                   help="time spent asking DTensor per example (default %(default)s)")
    p.add_argument("--exhaustive", action="store_true", help="ask every placement tuple, for every op")
    p.add_argument("--jobs", "-j", type=positive_int, default=None,
                   help="worker processes (default: one per 20 ops, at most the CPU count)")
    p.add_argument("--timeout", type=functools.partial(seconds, allow_zero=True), default=300.0,
                   help="per-op time limit in seconds, 0: none (default 300)")
    p.add_argument("--cache-dir", type=path_arg, default=None,
                   help="where DTensor's answers are cached (default: the metaspmd cache folder)")
    p.add_argument("--no-cache", action="store_true", help="ask DTensor afresh and cache nothing")
    p.add_argument("--no-real-dtensor", action="store_true",
                   help="do not replay on real DTensor (fake process group) the missed DTensor rules our own "
                        "replay cannot check: composite ops, size-rewriting ops, out= views")
    p.add_argument("--other-calls", type=positive_int, metavar="N",
                   help="instead of comparing with DTensor, re-verify every rule on up to N more OpInfo calls of "
                        "its signature, at other tensor shapes than the explored call")
    p.add_argument("--json", type=path_arg, metavar="FILE", help="write the full results here")
    p.add_argument("--limit", type=positive_int, default=50, help="rows per table in the printed report")
    p.add_argument("--progress", action="store_true", help="show progress on stderr")
    args = p.parse_args(list(argv) if argv is not None else None)
    # an option this run would ignore is refused: it was accepted, and the report read as if it applied
    if args.other_calls:
        refuse_unused(p, args, {option: "does not apply to --other-calls, which re-verifies our rules without asking DTensor"
                                for option in ("--mesh-size", "--partials", "--max-combos", "--max-seconds", "--exhaustive",
                                               "--cache-dir", "--no-real-dtensor")})
    if args.no_cache:
        refuse_unused(p, args, {"--cache-dir": "does not combine with --no-cache"})
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: ``cli.CROSSCHECK_EXIT``."""
    args = parse_args(argv)
    problem = args.json is not None and (read_as_rules(args.json) or unwritable(args.json, folder=False))
    if problem:  # checked before the work, not after it
        print(f"crosscheck: error: --json {problem}", file=sys.stderr)
        return 2
    # a cache folder that cannot be written only costs time; one that cannot be a folder is skipped unsaid
    problem = args.cache_dir is not None and not args.no_cache and path_problem(args.cache_dir, folder=True)
    if problem:
        print(f"crosscheck: error: --cache-dir {problem}", file=sys.stderr)
        return 2
    partials = tuple(p.strip() for p in args.partials.split(",") if p.strip())
    if not partials or any(p not in DTENSOR_PARTIALS for p in partials):  # '' (an unset variable) names none
        print(f"crosscheck: error: --partials takes {', '.join(DTENSOR_PARTIALS)}, got {args.partials!r}",
              file=sys.stderr)
        return 2
    try:
        records = load_registry(args.registry, "torch") if (args.registry / "torch").is_dir() else {}
    except RegistryError as e:
        print(f"crosscheck: error: {e}", file=sys.stderr)
        return 2
    patterns = split_patterns(args.ops)
    if patterns:
        known = set(records) | set(catalog.all_overloads())
        wrong = unmatched_patterns(known, patterns)
        if wrong:  # a typo beside a good name would check less and pass
            print(f"crosscheck: error: --ops: {wrong}", file=sys.stderr)
            return 2
        ops = select_ops(known, patterns)
    else:
        ops = sorted(set(records) | (set(catalog.all_overloads()) if args.explore_missing else set()))
    if not ops:
        print("crosscheck: error: no op to check (no registry file, and no --ops match)", file=sys.stderr)
        return 2
    cache = None if args.no_cache else str(args.cache_dir or default_cache_folder())
    query = QueryConfig(args.mesh_size, partials, args.max_combos, args.max_seconds, args.exhaustive)
    config = Config(query, cache=cache, real_dtensor=not args.no_real_dtensor, other_calls=args.other_calls or 0)
    jobs = args.jobs or max(1, min(os.cpu_count() or 1, len(ops) // 20))  # a worker costs seconds to start
    report = run(ops, records, config, bool(patterns) or args.explore_missing, jobs, timeout=args.timeout,
                 progress=args.progress, quiet=True)
    print(format_rechecks(report, args.limit) if config.other_calls else format_report(report, args.limit))
    if args.json:
        write_text_atomic(args.json, report_json(report) + "\n")  # a missing folder is made (as unwritable allows)
    if report.not_checked:
        return interrupted("crosscheck", len(report.not_checked))
    return crosscheck_status(bool(report.failures()), bool(report.unchecked_ops()))


__all__ = [
    "Config", "Extra", "Miss", "OpResult", "OurRule", "Report", "crosscheck_op", "format_rechecks", "format_report",
    "input_key", "main", "our_rules", "output_key", "parse_input", "parse_output", "report_json", "run",
]
