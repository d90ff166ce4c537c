"""Cross-check our jax rules against Shardy's, example by example.

For every case the backend builds, Shardy's rule is read from the lowered call (see
``shardy.function_factors``) and each factor that touches an input is mapped to our rules:

    pass-through  <->  a strategy sharding exactly those dims, gathering each output dim
    reduction     <->  the same, with reduce(...) for outputs the factor does not reach
    permutation   <->  the same, with any halo (Shardy would exchange neighbour data)
    need-replication, compound (the minor part of a merged dim)  <->  no rule expected

Found factors count as agreement; missing ones are listed with a reason (re-checked by
verifying the strategy Shardy implies). Our strategies that match no shardable factor are
extras. Every one of our strategies is re-verified on fresh inputs by a checker of its own
(more seeds and shard counts than the explorer's, every combine option), and those with no
Partial or halo input also run for real under ``jax.jit`` + ``shard_map`` on several CPU
devices, with collectives doing the combine (``collectives``: psum and friends, a
collective permute for a reversed gather, a carry of edge slices for a scan).

    python tools/crosscheck.py --backend jax --ops 'jax.dot_general,jax.add'

With ``--other-calls N`` there is no Shardy comparison: every registry rule is re-verified
on up to N more program calls of its signature, at other operand shapes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from metaspmd import pytree
from metaspmd.case import NoSample, Skip
from metaspmd.check import cut_inputs, shard_inputs, surviving
from metaspmd.cli import CROSSCHECK_EXIT, crosscheck_status, interrupted, path_arg, positive_int, refuse_unused
from metaspmd.combine import Split, partial_parts, reduce_ops_for, scan_ops_for
from metaspmd.explorer import explore_case
from metaspmd.registry_io import RegistryError, load_op_file, record_path
from metaspmd.signature import signature
from metaspmd.sweep import select_ops, split_patterns, unmatched_patterns
from metaspmd.tensor_ops import TOLERANCES
from metaspmd.target import lined_up
from metaspmd.spec import (
    ArgReduce, Gather, Identity, IndexOffset, OutputCombine, PartialInput, Reduce, Replicate, Scan, ShardIn, drops,
)

# jax is imported inside the functions: the device count must be set before jax starts.
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def _ask_for_devices(n: int) -> None:
    """Ask XLA for ``n`` CPU devices; works only before jax creates its CPU client."""
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DEVICE_FLAG}={n}".strip()


# --------------------------------------------------------------------------- results


@dataclass
class CaseResult:
    op: str
    signature: str
    source: str  # 'registry' or 'explored'
    shardy_error: str = ""
    found: list = field(default_factory=list)  # (factor, strategy label)
    made_partial: set = field(default_factory=set)  # labels found with a replicated input made Partial
    proportional: set = field(default_factory=set)  # labels found with a replicated input cut in proportion
    missed: list = field(default_factory=list)  # (factor, reason)
    replicated: list = field(default_factory=list)  # factors Shardy keeps whole
    extras: list = field(default_factory=list)  # (strategy, category)
    reverify_failed: list = field(default_factory=list)  # (strategy, reason)
    reverified: int = 0
    jit: Counter = field(default_factory=Counter)  # ok / failed / skipped
    jit_failed: list = field(default_factory=list)  # numbers differ: the rule is wrong
    jit_errors: list = field(default_factory=list)  # jax could not build the sharded program
    check_error: str = ""  # the check itself raised: none of the case's rules was checked


SHARDABLE = ("pass-through", "reduction", "permutation")
MADE_PARTIAL = "with an input Shardy keeps replicated made Partial, a local step"
PROPORTIONAL = "with an input Shardy keeps replicated cut where the factor's dims are, a local step"


# --------------------------------------------------------------------------- matching


def _shard_set(strategy) -> frozenset:
    return frozenset((i, p.dim) for i, p in enumerate(strategy.inputs) if isinstance(p, ShardIn))


def _has_partial(strategy) -> bool:
    return any(isinstance(p, PartialInput) for p in strategy.inputs)


def _rebuilds_dim(c, dim: int, permutation: bool) -> bool:
    """Does combine ``c`` rebuild output dim ``dim`` the way a Shardy factor shards it? Any
    gather with its halo; for a permutation factor (data moves between shards) also a
    reversed gather (rev: one collective permute) or a scan (cumsum: one carry per shard)."""
    if isinstance(c, Gather) and c.dim == dim and c.block == 1:
        return permutation or not (c.reverse or c.overlap)
    return permutation and isinstance(c, Scan) and c.dim == dim


def _combine_fits(factor, strategy) -> bool:
    out_dims = dict(factor.outputs)
    for j, outs in enumerate(strategy.outputs):
        if j in out_dims:
            if not any(_rebuilds_dim(c, out_dims[j], factor.kind == "permutation") for c in outs.options):
                return False
        elif factor.kind == "reduction" and not any(isinstance(c, (Reduce, ArgReduce)) for c in outs.options):
            return False
    return True


def match(factor, strategies, kept_whole: frozenset = frozenset()) -> Any | None:
    """Our strategy that realises a Shardy factor, or None. A reduction factor leaves its
    outputs pending a sum, so a strategy that also takes some other input as Partial(sum)
    realises it too: Shardy keeps that input replicated, and a replicated value becomes
    Partial locally (kept on one device, zeros on the others). That is how a scatter-add
    whose updates are cut counts its operand once (a scatter-mul's, as Partial(prod): ones
    on the other devices), and how Shardy's partitioner does it.
    Likewise a permutation factor whose dims our strategy cuts in proportion to a dim that
    Shardy keeps whole (``kept_whole``, need-replication): each device slices its part of
    that replicated input locally (select_and_scatter's source, beside its operand)."""
    want = frozenset(factor.inputs)
    fitting = [s for s in strategies if _shard_set(s) == want and _combine_fits(factor, s)]
    plain = [s for s in fitting if not _has_partial(s)]
    if plain:
        return plain[0]
    if factor.kind == "reduction":
        return next((s for s in fitting if _partial_beside(factor, s)), None)
    if factor.kind == "permutation":
        return next((s for s in strategies if _proportional_beside(factor, s, kept_whole)), None)
    return None


def _proportional_beside(factor, strategy, kept_whole: frozenset) -> bool:
    """Does the strategy cut the factor's dims in proportion to dims Shardy keeps whole?"""
    cut = {(i, p.dim): p for i, p in enumerate(strategy.inputs) if isinstance(p, ShardIn)}
    want = frozenset(factor.inputs)
    return (bool(want) and want < frozenset(cut) and all(cut[x].follows for x in want)
            and frozenset(cut) - want <= kept_whole and not _has_partial(strategy)
            and _combine_fits(factor, strategy))


def _partial_beside(factor, strategy) -> bool:
    """Are the strategy's Partial inputs outside the factor, and every output reduced by
    their op (a sum; a product beside a scatter-mul's operand)?"""
    touched = {i for i, _ in factor.inputs}
    partial = [(i, p.op) for i, p in enumerate(strategy.inputs) if isinstance(p, PartialInput)]
    return (all(i not in touched for i, _ in partial) and len({op for _, op in partial}) == 1
            and all(Reduce(partial[0][1]) in o.options for o in strategy.outputs))


def extra_category(strategy, factors) -> str:
    if _has_partial(strategy):
        return "partial-input (the op is linear in it; Shardy's factors have no such state)"
    by_inputs = {frozenset(f.inputs): f for f in factors}
    f = by_inputs.get(_shard_set(strategy))
    if f is None:
        return "shards dims that no single Shardy factor joins"
    if f.kind in SHARDABLE:
        return f"combine differs from Shardy's {f.kind} factor"
    return f"Shardy keeps these dims replicated ({f.kind})"


# --------------------------------------------------------------------------- checks


def _flat_fn(case, ops, drop: bool = False, local=None):
    """The op on its tensor leaves; ``drop``: its dropping form, which shards run under an
    offset marked drop; ``local``: with its params re-based to a shard (``OpCase.localize``)."""
    def fn(*leaves):
        args, kwargs = pytree.replace((tuple(case.args), dict(case.kwargs)), ops.is_tensor, list(leaves))
        return pytree.leaves(case.call(args, kwargs, drop, local), ops.is_tensor)

    return fn


def _implied_candidates(factor, case, ops, n_outputs: int, out_kinds: Sequence[str]):
    """The strategy a Shardy factor implies, with every combine it allows."""
    n_in = len(_leaves(case, ops))
    placements = [Replicate()] * n_in
    for i, d in factor.inputs:
        placements[i] = ShardIn(d)
    out_dims = dict(factor.outputs)
    outs = []
    for j in range(n_outputs):
        if j in out_dims:
            d = out_dims[j]
            options = (Gather(d),) + tuple(Gather(d, lo, 1, hi) for lo in (0, 1, 2) for hi in (0, 1, 2) if lo or hi)
            if factor.kind == "permutation":
                options += (Gather(d, reverse=True),) + tuple(Gather(d, overlap=k) for k in range(1, 5)) + tuple(
                    Scan(d, op, rev) for rev in (False, True) for op in scan_ops_for(out_kinds[j]))
            outs.append(OutputCombine(options))
        else:
            reduces = tuple(Reduce(r) for r in reduce_ops_for(out_kinds[j], True))
            outs.append(OutputCombine((Identity(),) + reduces))
    return tuple(placements), tuple(outs)


def _leaves(case, ops):
    return pytree.leaves((tuple(case.args), dict(case.kwargs)), ops.is_tensor)


REVERIFY_SEEDS = (101, 102, 103)


def surviving_combines(case, ops, placements, outputs) -> list[list] | str:
    """Re-verify a strategy independently of the explorer: on fresh inputs for several
    seeds, cut into 2, 3 and 4 shards and a skewed 2, the combines of each output that
    rebuild it every time (reduce(avg) on equal shards only). A string when the op itself
    fails on a shard. Trials whose shards happen to be equal still count: a combine that
    fails on them is wrong all the same."""

    fn = _flat_fn(case, ops)
    alive = [list(o.options) for o in outputs]
    avg_checked = False
    for seed in REVERIFY_SEEDS:
        args, kwargs = case.fresh(seed) if case.fresh is not None else (case.args, case.kwargs)
        leaves = pytree.leaves((tuple(args), dict(kwargs)), ops.is_tensor)
        expected = fn(*leaves)
        # positions clamped as the op clamps them where the shards drop those out of range
        whole = case.positions_in_range(leaves) if drops(placements) else leaves
        for split in (Split(2), Split(3), Split(4), Split(2, skew=True)):
            # each sharded input cut by its own size (a joint of independent parts mixes
            # sizes), except those that follow the first plain one in proportion
            cut = cut_inputs(ops, leaves, placements, split.n, split.bounds)
            if cut.why:
                continue
            if any(length <= placements[i].halo for i, b in cut.bounds.items() for _, length in b):
                continue  # a halo rule's domain: every shard holds more than its halo (as explored)

            def parts(i, x, op):
                return partial_parts(ops, x, op, split.n, seed * 10 + split.n + i)

            # params re-based to each shard where the cut is local (a slice of the cut dim, a
            # padded window op's operand): each shard's range, past the dim where the op pads
            sharded = shard_inputs(ops, leaves, placements, cut, parts, case.padding, whole)
            if isinstance(sharded, str):
                return sharded
            try:
                local = sharded.run(lambda xs, params: _flat_fn(case, ops, drops(placements), params or None)(*xs))
            except Exception as e:  # noqa: BLE001
                return f"seed {seed}, {split.n} shards: the op fails on a shard ({type(e).__name__})"
            if any(len(loc) != len(expected) for loc in local):  # unstack on its own axis: no combine
                return [[] for _ in outputs]
            even = all(split.is_even(ops.shape(leaves[i])[placements[i].dim]) for i in cut.bounds)
            avg_checked |= even
            kept = surviving(ops, alive, local, expected, sharded.cut)
            alive = [[c for c in opts if (c == Reduce("avg") and not even) or c in ok] for opts, ok in zip(alive, kept)]
    if not avg_checked:  # reduce(avg) means something on equal shards only: unproven here
        alive = [[c for c in opts if c != Reduce("avg")] for opts in alive]
    return alive


def reverify(case, ops, strategy) -> str | None:
    """None when every combine of ``strategy`` survives re-verification; else what broke."""
    alive = surviving_combines(case, ops, strategy.inputs, strategy.outputs)
    if isinstance(alive, str):
        return alive
    lost = [f"output {j}: {c}" for j, (o, kept) in enumerate(zip(strategy.outputs, alive)) for c in o.options
            if c not in kept]
    return "fails on fresh inputs: " + ", ".join(lost) if lost else None


def implied_strategy_holds(case, ops, placements, outputs) -> bool:
    alive = surviving_combines(case, ops, placements, outputs)
    return not isinstance(alive, str) and all(alive)


GAP = "explorer did not find it, but it verifies: a gap in our search"
TABLE_GAP = "verifies, but a strategy sharding these dims together with more took their labels (one label per dim)"


def _indexed_dims(case) -> set[int]:
    """Operand dims that gather/scatter index into (from the case's params)."""
    fn = case.fn
    prim, params = getattr(getattr(fn, "prim", None), "name", ""), getattr(fn, "params", {})
    dn = params.get("dimension_numbers")
    if prim == "gather":
        return set(dn.start_index_map)
    if prim.startswith("scatter"):
        return set(dn.scatter_dims_to_operand_dims)
    if prim in ("dynamic_slice", "dynamic_update_slice"):
        return set(range(len(fn.shapes[0])))
    return set()


def _miss_reason(factor, case, ops, n_outputs, out_kinds, strategies) -> str:
    placements, outs = _implied_candidates(factor, case, ops, n_outputs, out_kinds)
    if implied_strategy_holds(case, ops, placements, outs):
        if any(_shard_set(s) > frozenset(factor.inputs) for s in strategies):
            return TABLE_GAP
        return GAP
    via = ",".join(factor.ops) or "-"
    if any(i == 0 and d in _indexed_dims(case) for i, d in factor.inputs):
        return (f"an indexed operand dim whose positions the op clamps into range: an index offset alone is "
                f"wrong there, and the op has no dropping form; Shardy's partitioner masks the result ({via})")
    if factor.kind == "permutation":
        return f"needs neighbour exchange beyond a halo ({via})"
    if factor.kind == "reduction":
        return f"no elementwise reduce rebuilds it; Shardy's partitioner special-cases it ({via})"
    return f"does not verify on shards ({via})"


def _jit_plan(strategy, leaves, outs, n_devices: int):
    """(n, in_specs, out_specs, combines) for a shard_map run, or a reason it does not apply."""
    from jax.sharding import PartitionSpec as P

    from .collectives import AXIS, output_dim, unsupported

    if any(isinstance(p, PartialInput) or (isinstance(p, ShardIn) and not p.plain) for p in strategy.inputs):
        return "partial, halo, proportional or local-params input"
    sizes = [leaves[i].shape[p.dim] for i, p in enumerate(strategy.inputs) if isinstance(p, ShardIn)]
    combines = [o.first for o in strategy.outputs]
    for c, out in zip(combines, outs):
        why = unsupported(c, out.dtype)
        if why:
            return why
        if output_dim(c) is not None:
            sizes.append(out.shape[output_dim(c)])
    n = next((k for k in (8, 4, 2) if k <= n_devices and all(s % k == 0 for s in sizes)), None)
    if n is None:
        return "no device count divides the sharded dims"

    def spec(dim):
        return P() if dim is None else P(*([None] * dim + [AXIS]))

    in_specs = tuple(spec(p.dim if isinstance(p, ShardIn) else None) for p in strategy.inputs)
    return n, in_specs, tuple(spec(output_dim(c)) for c in combines), combines


def jit_check(case, ops, strategy, n_devices: int) -> tuple[str, str]:
    """Run the strategy for real: shard_map over a mesh, collectives for the combine."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from .collectives import AXIS, arg_reduce, finisher

    fn, on_shard = _flat_fn(case, ops), _flat_fn(case, ops, drops(strategy.inputs))
    leaves = _leaves(case, ops)
    expected = fn(*leaves)
    plan = _jit_plan(strategy, leaves, expected, n_devices)
    if isinstance(plan, str):
        return "skipped", plan
    n, in_specs, out_specs, combines = plan
    finish = [None if isinstance(c, ArgReduce) else finisher(c, n) for c in combines]
    offsets = [(i, p.component) for i, p in enumerate(strategy.inputs) if isinstance(p, IndexOffset)]
    cut = next(((i, p.dim) for i, p in enumerate(strategy.inputs) if isinstance(p, ShardIn)), None)

    def local(*xs):
        if offsets:  # each device moves the positions by its shard's start
            xs = list(xs)
            start = jax.lax.axis_index(AXIS) * (leaves[cut[0]].shape[cut[1]] // n)
            for i, component in offsets:
                moved = start.astype(xs[i].dtype)
                xs[i] = xs[i] - moved if component is None else xs[i].at[..., component].add(-moved)
        return tuple(arg_reduce(c, y, xs[c.input], strategy.inputs[c.input].dim) if f is None else f(y)
                     for c, f, y in zip(combines, finish, on_shard(*xs)))

    mesh = Mesh(np.array(jax.devices()[:n]), (AXIS,))
    try:
        run = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False))
        # positions clamped as the op clamps them before the shards move them (drop offsets)
        got = run(*(case.positions_in_range(leaves) if drops(strategy.inputs) else leaves))
    except Exception as e:  # noqa: BLE001 - jax refusing to build the program says nothing about the rule
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    bad = [j for j, (g, e) in enumerate(zip(got, expected)) if not ops.close(jax.numpy.asarray(g), e)]
    return ("failed", f"outputs {bad} differ on {n} devices") if bad else ("ok", f"{n} devices")


# --------------------------------------------------------------------------- one case


def _our_entry(case, ops, records: dict, op: str):
    sig = signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes)
    record = records.get(op)
    entry = record.entry(sig) if record is not None else None
    if entry is not None:
        return entry, "registry"
    return explore_case(case, ops), "explored"


def check_case(op: str, case, ops, records: dict, do_reverify: bool, n_devices: int) -> CaseResult:
    from .shardy import function_factors

    entry, source = _our_entry(case, ops, records, op)
    result = CaseResult(op, entry.signature, source)
    strategies = entry.all_strategies()
    leaves = _leaves(case, ops)
    outputs = _flat_fn(case, ops)(*leaves)
    out_kinds = [ops.dtype_kind(o) for o in outputs]
    try:
        if any(ops.dtype_kind(x) == "o" for x in list(leaves) + list(outputs)):
            raise ValueError("PRNG key arrays lower to uint32 arrays with extra dims")
        factors = function_factors(_flat_fn(case, ops), leaves)
    except Exception as e:  # noqa: BLE001 - no Shardy rule for this example
        result.shardy_error = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        factors = []
    matched = set()
    empty_outputs = {j for j, o in enumerate(outputs) if 0 in ops.shape(o)}
    kept_whole = frozenset(x for f in factors if f.kind == "need-replication" for x in f.inputs)
    for f in factors:
        if f.size < 2 or any(j in empty_outputs for j, _ in f.outputs):
            continue  # nothing to shard, or an empty output that every combine rebuilds
        if f.kind not in SHARDABLE:
            result.replicated.append(f)
            continue
        s = match(f, strategies, kept_whole)
        if s is not None:
            result.found.append((f, s.label))
            if _has_partial(s):
                result.made_partial.add(s.label)
            if any(isinstance(p, ShardIn) and p.follows for p in s.inputs):
                result.proportional.add(s.label)
            matched.add(s.label)
        else:
            result.missed.append((f, _miss_reason(f, case, ops, len(outputs), out_kinds, strategies)))
    if not result.shardy_error:
        result.extras = [(s, extra_category(s, factors)) for s in strategies if s.label not in matched]
    for s in strategies:
        if do_reverify:
            problem = reverify(case, ops, s)
            if problem:
                result.reverify_failed.append((s, problem))
            else:
                result.reverified += 1
        if n_devices >= 2:
            status, detail = jit_check(case, ops, s, n_devices)
            result.jit[status] += 1
            if status == "failed":
                result.jit_failed.append((s, detail))
            elif status == "error":
                result.jit_errors.append((s, detail))
    return result


def recheck_other_calls(backend, names: Sequence[str], records: dict, per_signature: int) -> int:
    """Every registry rule re-verified (``reverify``) on up to ``per_signature`` more calls of
    its signature at other shapes (``JaxBackend.cases_at_other_sizes``), where the runtime
    applies it (``target.lined_up``). Prints the failures and a summary; the exit status of
    ``cli.CROSSCHECK_EXIT`` (1 if a rule fails, 3 if none does but a check raised)."""
    ops = backend.tensor_ops()
    counts, failed = Counter(), []
    wrong_rule = raised = False  # a rule refuted; a check that could not run
    for op in names:
        record = records.get(op)
        if record is None:
            continue
        try:
            cases = backend.cases_at_other_sizes(op, per_signature)
        except (NoSample, Skip):
            continue
        except Exception as e:  # noqa: BLE001 - one bad op must not stop the check, nor pass unsaid
            counts["failed"] += 1
            raised = True
            failed.append(f"{op}: building its calls raised {type(e).__name__}: {str(e)[:200]}")
            print(f"FAILED {failed[-1]}", flush=True)
            continue
        for case in cases:
            entry = record.entry(signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes))
            if entry is None:
                continue  # a signature the registry has no entry for: explored live at run time
            counts["calls"] += 1
            shapes = [tuple(ops.shape(x)) for x in _leaves(case, ops)]
            strategies = entry.all_strategies()
            applied = lined_up(strategies, shapes)
            counts["not applied"] += len(strategies) - len(applied)
            for s in applied:
                if _parts_round(ops, case, s):
                    counts["unchecked"] += 1
                    continue
                try:
                    problem, wrong = reverify(case, ops, s), True
                except Exception as e:  # noqa: BLE001 - one bad call must not stop the check, nor pass unsaid
                    problem, wrong = f"the check raised {type(e).__name__}: {str(e)[:200]}", False
                counts["failed" if problem else "ok"] += 1
                if problem:
                    wrong_rule, raised = wrong_rule or wrong, raised or not wrong
                    failed.append(f"{op}  {entry.signature}  {shapes}  {s.label}: {problem}")
                    print(f"FAILED {failed[-1]}", flush=True)
    print(f"rules re-verified on other calls of their signatures (up to {per_signature} per signature): "
          f"{counts['calls']} calls, {counts['ok']} ok, {counts['failed']} failed, "
          f"{counts['not applied']} not applied (cuts of unequal lengths), "
          f"{counts['unchecked']} unchecked (Partial(sum) parts of a low-precision float round)")
    return crosscheck_status(wrong_rule, raised)


def _parts_round(ops, case, strategy) -> bool:
    """Has ``strategy`` a Partial(sum) input of a low-precision float dtype (bfloat16,
    float16)? Its parts, drawn in that dtype, do not sum back to it within the dtype's
    tolerance, so the op on them differs from the op on the input for a rule that holds:
    no verdict either way. (The signature's kind ``f`` holds every float width; the sweep
    explores the wide ones.)"""
    leaves = _leaves(case, ops)
    return any(isinstance(p, PartialInput) and p.op == "sum" and ops.dtype_kind(leaves[i]) == "f"
               and ops.dtype_name(leaves[i]) not in TOLERANCES for i, p in enumerate(strategy.inputs))


# --------------------------------------------------------------------------- report


def format_case(r: CaseResult) -> list[str]:
    lines = [f"{r.op}  {r.signature}  [{r.source}]"]
    if r.check_error:
        lines.append(f"    CHECK FAILED, nothing checked: {r.check_error}")
    if r.shardy_error:
        lines.append(f"    shardy: no rule ({r.shardy_error})")
    for f, label in r.found:
        how = MADE_PARTIAL if label in r.made_partial else PROPORTIONAL if label in r.proportional else ""
        lines.append(f"    agree  {f.describe()}  = {label}" + (f"  ({how})" if how else ""))
    for f, reason in r.missed:
        lines.append(f"    MISS   {f.describe()}: {reason}")
    for f in r.replicated:
        lines.append(f"    repl   {f.describe()}")
    for s, category in r.extras:
        lines.append(f"    extra  {s}: {category}")
    for s, reason in r.reverify_failed:
        lines.append(f"    REVERIFY FAILED  {s}: {reason}")
    for s, detail in r.jit_failed:
        lines.append(f"    JIT FAILED  {s}: {detail}")
    for s, detail in r.jit_errors:
        lines.append(f"    jit error  {s}: {detail}")
    return lines


def summarize(results: Sequence[CaseResult], skipped_ops: int) -> list[str]:
    shared = [r for r in results if not r.shardy_error]
    by_kind = Counter(f.kind for r in shared for f, _ in r.found)
    miss_kind = Counter(f.kind for r in shared for f, _ in r.missed)
    found = sum(by_kind.values())
    total = found + sum(miss_kind.values())
    core_found = by_kind["pass-through"] + by_kind["reduction"]
    core_total = core_found + miss_kind["pass-through"] + miss_kind["reduction"]
    gaps = sum(1 for r in shared for _, reason in r.missed if reason in (GAP, TABLE_GAP))
    reasons = Counter(reason.split(" (")[0].split(":")[0] for r in shared for _, reason in r.missed)
    extras = Counter(cat.split(" (")[0] for r in shared for _, cat in r.extras)
    jit = sum((r.jit for r in results), Counter())
    reverified = sum(r.reverified for r in results)
    failed = sum(len(r.reverify_failed) for r in results)

    def pct(a, b):
        return f"{100.0 * a / b:.1f}%" if b else "n/a"

    lines = [
        f"cases: {len(results)} on {len({r.op for r in results})} ops ({skipped_ops} ops not explored); "
        f"with a Shardy rule: {len(shared)}",
        f"Shardy shardable factors found: {found}/{total} ({pct(found, total)}); "
        f"pass-through + reduction: {core_found}/{core_total} ({pct(core_found, core_total)}); "
        f"permutation: {by_kind['permutation']}/{by_kind['permutation'] + miss_kind['permutation']}",
        "  found by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())),
        f"  found with an input made Partial: {sum(label in r.made_partial for r in shared for _, label in r.found)}",
        f"  found with an input cut in proportion: {sum(label in r.proportional for r in shared for _, label in r.found)}",
        "  missed by kind: " + (", ".join(f"{k} {v}" for k, v in sorted(miss_kind.items())) or "none"),
        "  missed by reason: " + ("; ".join(f"{k}: {v}" for k, v in sorted(reasons.items())) or "none"),
        f"expressible as shard-and-combine (found, or the implied strategy verifies): found {found}/{found + gaps} "
        f"({pct(found, found + gaps)})",
        "Shardy keeps replicated: " + str(sum(len(r.replicated) for r in shared)),
        "extras (ours, no Shardy factor): " + (", ".join(f"{k} {v}" for k, v in sorted(extras.items())) or "none"),
        f"our strategies re-verified: {reverified} ok, {failed} failed",
        f"jit on CPU devices: {jit['ok']} ok, {jit['failed']} failed (numbers differ), "
        f"{jit['error']} not buildable by jax, {jit['skipped']} not applicable",
    ]
    no_rule = Counter(r.shardy_error.split(":")[0] for r in results if r.shardy_error)
    if no_rule:
        lines.append("no Shardy rule: " + ", ".join(f"{k} {v}" for k, v in sorted(no_rule.items())))
    unchecked = [r for r in results if r.check_error]
    if unchecked:
        lines.append(f"cases whose check FAILED, none of their rules checked: {len(unchecked)} "
                     f"({', '.join(sorted({r.op for r in unchecked}))})")
    return lines


def _failed_check(op: str, signature: str, e: Exception) -> CaseResult:
    """A case whose check raised: one bad case must not stop the check, nor pass unsaid."""
    return CaseResult(op, signature, "", check_error=f"{type(e).__name__}: {str(e)[:200]}")


def _checked(op: str, case, ops, records: dict, do_reverify: bool, n_devices: int) -> CaseResult:
    """``check_case``, or the failed check where it raises."""
    try:
        return check_case(op, case, ops, records, do_reverify, n_devices)
    except Exception as e:  # noqa: BLE001 - counted and shown, the check goes on
        return _failed_check(op, "(a case of the op)", e)


# --------------------------------------------------------------------------- CLI


# The jit runs use 8, 4 or 2 devices (_jit_plan): more are never used, and XLA aborts the
# process when asked for far more CPU devices than it can create.
MAX_DEVICES = 8


def device_count(text: str) -> int:
    """argparse type for --devices: 0 (no jit runs) or 2..MAX_DEVICES; 1 or a negative
    count would silently run no jit at all."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not (value == 0 or 2 <= value <= MAX_DEVICES):
        raise argparse.ArgumentTypeError(f"expected 0 (no jit runs) or an integer from 2 to {MAX_DEVICES}, "
                                         f"got {text!r}")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(prog="crosscheck --backend jax", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False, epilog=CROSSCHECK_EXIT)  # cli.crosscheck reads --registry and --ops by their full names
    p.add_argument("--ops", action="append", default=[], metavar="GLOB", help="ops to check (comma-separated globs)")
    p.add_argument("--registry", type=path_arg, help="registry root to read our rules from (metaspmd crosscheck and tools/crosscheck.py "
                        "pass the repository's registry/; run as this module alone: explored live)")
    p.add_argument("--devices", type=device_count, default=8,
                   help=f"CPU devices for the jit runs, 2 to {MAX_DEVICES} (default 8; 0: no jit runs)")
    p.add_argument("--no-reverify", action="store_true", help="skip re-verifying our strategies")
    p.add_argument("--quiet", action="store_true", help="print only cases with misses or failures, and the summary")
    p.add_argument("--other-calls", type=positive_int, metavar="N",
                   help="instead of comparing with Shardy, re-verify every registry rule on up to N more program "
                        "calls of its signature, at other operand shapes than the explored call")
    args = p.parse_args(argv)
    if args.other_calls:  # accepted and ignored, the report read as if they applied
        refuse_unused(p, args, {option: "does not apply to --other-calls, which re-verifies our rules without "
                                        "Shardy" for option in ("--no-reverify", "--quiet")})
    return args


def _load_records(root: Path | None, backend_name: str, ops: Sequence[str]) -> dict:
    records = {}
    if root is None:
        return records
    for op in ops:
        path = record_path(root, backend_name, op)
        if path.exists():
            records[op] = load_op_file(path, backend_name)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: ``cli.CROSSCHECK_EXIT``."""
    args = parse_args(list(argv) if argv is not None else None)
    if args.devices >= 2:
        _ask_for_devices(args.devices)
    import jax

    from . import get_backend

    backend = get_backend()
    ops = backend.tensor_ops()
    patterns = split_patterns(args.ops)
    wrong = unmatched_patterns(backend.list_ops(), patterns)
    if wrong:  # a typo beside a good name would check less and pass
        print(f"crosscheck: error: --ops: {wrong}", file=sys.stderr)
        return 2
    names = select_ops(backend.list_ops(), patterns)
    if not names:
        print("crosscheck: no op matched", file=sys.stderr)
        return 2
    n_devices = min(args.devices, jax.device_count()) if args.devices >= 2 else 0
    if args.devices >= 2 and n_devices < 2:
        print(f"crosscheck: only {jax.device_count()} device(s): no jit runs (set XLA_FLAGS before jax starts)")
    try:
        records = _load_records(args.registry, backend.name, names)
    except RegistryError as e:  # a broken rule file is a usage error (2), not a failed check (1)
        print(f"crosscheck: error: {e}", file=sys.stderr)
        return 2
    if args.other_calls:
        return recheck_other_calls(backend, names, records, args.other_calls)
    results, skipped, done = [], 0, 0
    try:
        for op in names:
            try:
                cases = backend.cases(op)
            except (NoSample, Skip):
                skipped += 1
                done += 1
                continue
            except Exception as e:  # noqa: BLE001 - counted and shown, the check goes on
                op_results = [_failed_check(op, "(no case built)", e)]
            else:
                op_results = [_checked(op, case, ops, records, not args.no_reverify, n_devices) for case in cases]
            for r in op_results:
                results.append(r)
                if not args.quiet or r.missed or r.reverify_failed or r.jit_failed or r.jit_errors or r.check_error:
                    print("\n".join(format_case(r)), flush=True)
            done += 1
    except KeyboardInterrupt:  # Ctrl-C: the summary covers the ops checked so far (an op's cases all, or none)
        checked = set(names[:done])
        results = [r for r in results if r.op in checked]
    print()
    print("\n".join(summarize(results, skipped)))
    if done < len(names):
        print(f"interrupted: {len(names) - done} op(s) not checked; the counts above are of the {done} checked")
        return interrupted("crosscheck", len(names) - done)
    return crosscheck_status(any(r.reverify_failed or r.jit_failed for r in results),
                             any(r.check_error for r in results))


if __name__ == "__main__":
    sys.exit(main())
