"""Explore + verify of one call, per op, beside a minimal discovery loop in EasyDist's style.

    python benchmarks/explore_bench.py                  # the 37 calls, table and totals
    python benchmarks/explore_bench.py --ops conv,bn    # calls whose name contains a word
    python benchmarks/explore_bench.py --profile native_batch_norm --top 30
    python benchmarks/explore_bench.py --stages         # runs per call by explorer stage

Each side's op runs per call (``runs``, counted in one more, untimed pass) split its time
into how often it runs the op and what each run costs it (the footer's ms per run):
verification's fresh trials, other splits and lengthened sizes are the runs discovery
alone does not make. ``op-only`` replays metaspmd's runs of the op back to back, with no
explorer around them: what a verifier with no overhead of its own would take for the same
runs, so ``metaspmd ms`` minus it is the explorer's own time.

Each call is a torch ATen call on small realistic shapes, explored and verified as the
runtime's live exploration does it (``rules_at_runtime.call_case``, then
``explorer.explore_case``), on one thread. Beside it: the discovery loop of EasyDist's
``MetaOp.sharding_discovery`` (alibaba/easydist, easydist/metashard), RE-IMPLEMENTED here
in a few lines, since the package is not installable here (PyPI's ``easydist`` is an
unrelated placeholder): for each next shard-dim id, try every way of cutting at most one
dim per tensor input in two, run the op on the shards, and accept the first cut whose
outputs one combine rebuilds (identity, sum/max/min, concatenation along a dim) by a single
``allclose`` on the example; no fresh data, no other split, no verification. It keeps
none of EasyDist's own bookkeeping (annotation deep copies, platform wrappers, a copy of
every input for every shard): EasyDist's own loop, run from its ``metashard`` sources with
their defaults (``extend_space`` off), took 1.5x this loop's time over these calls (0.5x to
2.6x per call), so the yardstick is somewhat stricter than EasyDist itself.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # backends/ beside metaspmd/

from metaspmd.cli import pipe_safe, positive_int, refuse_unused

aten = torch.ops.aten


def _r(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape) * 31 + len(shape))
    return torch.randn(shape, generator=g, dtype=dtype)


def _i(high, *shape, seed=0):
    g = torch.Generator().manual_seed(seed + high)
    return torch.randint(0, high, shape, generator=g)


def calls() -> list[tuple[str, Any, tuple, dict]]:
    """(name, overload, args, kwargs): the op cases of EasyDist's tests, on small shapes."""
    x = _r(8, 16)
    img = _r(4, 6, 8, 8)
    seq = _r(4, 6, 16)
    return [
        ("mm", aten.mm.default, (_r(8, 16), _r(16, 12)), {}),
        ("bmm", aten.bmm.default, (_r(4, 8, 16), _r(4, 16, 12)), {}),
        ("addmm", aten.addmm.default, (_r(12), _r(8, 16), _r(16, 12)), {}),
        ("add", aten.add.Tensor, (x, _r(8, 16, seed=1)), {}),
        ("add (broadcast)", aten.add.Tensor, (x, _r(16, seed=1)), {}),
        ("mul", aten.mul.Tensor, (x, _r(8, 16, seed=2)), {}),
        ("relu", aten.relu.default, (x,), {}),
        ("gelu", aten.gelu.default, (x,), {}),
        ("tanh", aten.tanh.default, (x,), {}),
        ("sum", aten.sum.default, (x,), {}),
        ("sum (dim)", aten.sum.dim_IntList, (seq, [1]), {}),
        ("mean (dim)", aten.mean.dim, (seq, [2], True), {}),
        ("amax", aten.amax.default, (seq, [1]), {}),
        ("amin", aten.amin.default, (seq, [2]), {}),
        ("softmax", aten._softmax.default, (seq, -1, False), {}),
        ("log_softmax", aten._log_softmax.default, (seq, 1, False), {}),
        ("layer_norm", aten.native_layer_norm.default, (seq, [16], _r(16), _r(16, seed=1), 1e-5), {}),
        ("cat", aten.cat.default, ([x, _r(4, 16, seed=3)],), {}),
        ("cat (dim 1)", aten.cat.default, ([x, _r(8, 4, seed=3)], 1), {}),
        ("conv1d", aten.convolution.default,
         (seq, _r(8, 6, 3), _r(8), [1], [1], [1], False, [0], 1), {}),
        ("conv2d", aten.convolution.default,
         (img, _r(8, 6, 3, 3), _r(8), [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}),
        ("transpose", aten.transpose.int, (seq, 1, 2), {}),
        ("permute", aten.permute.default, (seq, [2, 0, 1]), {}),
        ("view", aten.view.default, (seq, [24, 16]), {}),
        ("cumsum", aten.cumsum.default, (x, 1), {}),
        ("sort", aten.sort.default, (x, 1), {}),
        ("topk", aten.topk.default, (x, 3, 1), {}),
        ("embedding", aten.embedding.default, (_r(20, 8), _i(20, 4, 6)), {}),
        ("index_select", aten.index_select.default, (x, 0, _i(8, 5)), {}),
        ("where", aten.where.self, (x > 0, x, _r(8, 16, seed=4)), {}),
        ("max_pool2d", aten.max_pool2d_with_indices.default, (img, [2, 2], [2, 2]), {}),
        ("avg_pool2d", aten.avg_pool2d.default, (img, [2, 2], [2, 2]), {}),
        ("native_batch_norm", aten.native_batch_norm.default,
         (img, _r(6), _r(6, seed=1), torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64),
          True, 0.1, 1e-5), {}),
        ("unique", aten._unique2.default, (_i(6, 16).double(), True, True, True), {}),
        ("nll_loss", aten.nll_loss_forward.default, (torch.log_softmax(_r(8, 10), 1), _i(10, 8), None, 1, -100), {}),
        ("scatter_add", aten.scatter_add.default, (_r(8, 16), 1, _i(16, 8, 4), _r(8, 4, seed=5)), {}),
        ("gather", aten.gather.default, (x, 1, _i(16, 8, 4)), {}),
    ]


# ----------------------------------------------------------------- the reference loop

def _chunks(x: torch.Tensor, dim: int, n: int = 2) -> list[torch.Tensor]:
    return [c.clone() for c in torch.chunk(x, n, dim)]


def _combine(shards: list, glob) -> bool:
    """EasyDist's try_combination for one output: identity, reduce, gather (plain)."""
    if not isinstance(glob, torch.Tensor):
        return all(s == glob for s in shards)
    if any(not isinstance(s, torch.Tensor) or s.dim() != glob.dim() for s in shards):
        return False
    if all(s.shape == glob.shape for s in shards):
        if all(torch.equal(shards[0], s) for s in shards) and torch.allclose(shards[0], glob, equal_nan=True):
            return True
        if glob.dtype != torch.bool:
            for f in (torch.add, torch.maximum, torch.minimum):
                if torch.allclose(functools.reduce(f, shards), glob, equal_nan=True):
                    return True
    if glob.dim() == 0:
        return False
    d = next((k for k in range(glob.dim()) if shards[0].shape[k] != glob.shape[k]), None)
    if d is None:
        return False
    if any([s.shape[k] for k in range(glob.dim()) if k != d] != [glob.shape[k] for k in range(glob.dim()) if k != d]
           for s in shards):
        return False
    cat = torch.cat(shards, d)
    return cat.shape == glob.shape and torch.allclose(cat, glob, equal_nan=True)


def easydist_style(fn: Callable, args: tuple, kwargs: dict) -> int:
    """Strategies found by the re-implemented discovery loop (see the module docstring)."""
    flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    tensors = [k for k, v in enumerate(flat) if isinstance(v, torch.Tensor)]
    glob = fn(*args, **kwargs)
    gouts = glob if isinstance(glob, (tuple, list)) else [glob]
    used: set[tuple[tuple[int, int], ...]] = set()
    found = 0
    while True:  # one shard-dim id per pass, as sharding_discovery does
        hit = None

        def assign(pos: int, chosen: list[tuple[int, int]]):
            nonlocal hit
            if hit is not None:
                return
            if pos == len(tensors):
                key = tuple(chosen)
                if not chosen or key in used:
                    return
                sizes = {flat[k].shape[d] for k, d in chosen}
                if len(sizes) != 1 or sizes.pop() < 2:
                    return
                try:
                    outs = []
                    for s in range(2):
                        local = list(flat)
                        for k, d in chosen:
                            local[k] = _chunks(flat[k], d)[s]
                        a, kw = torch.utils._pytree.tree_unflatten(local, spec)
                        o = fn(*a, **kw)
                        outs.append(o if isinstance(o, (tuple, list)) else [o])
                except Exception:
                    return
                if all(len(o) == len(gouts) for o in outs) and all(
                        _combine([o[j] for o in outs], gouts[j]) for j in range(len(gouts))):
                    hit = key
                return
            k = tensors[pos]
            for d in range(flat[k].dim()):
                assign(pos + 1, chosen + [(k, d)])
            assign(pos + 1, chosen)

        assign(0, [])
        if hit is None:
            return found
        used.add(hit)
        found += 1


# ----------------------------------------------------------------- metaspmd

def metaspmd_case(fn, args: tuple, kwargs: dict):
    from backends.torch.rules_at_runtime import call_case

    return call_case(fn, args, kwargs)


def explore(case):
    from backends.torch.tensor_ops import TorchOps
    from metaspmd.explorer import explore_case

    return explore_case(case, TorchOps())


class RunCount:
    """Counts the op's runs through the callables it wraps (one count for all of them)."""

    def __init__(self):
        self.n = 0

    def wrap(self, fn: Callable | None) -> Callable | None:
        if fn is None:
            return None

        def counted(*args, **kwargs):
            self.count()
            return fn(*args, **kwargs)

        return counted

    def count(self) -> None:
        self.n += 1


def counted_case(case, wrap: Callable[[Callable | None], Callable | None]):
    """``case`` with its own callable, dropping form and re-based local forms each passed
    through ``wrap`` (a counter's)."""
    import dataclasses

    localize = case.localize
    return dataclasses.replace(case, fn=wrap(case.fn), dropping=wrap(case.dropping),
                               localize=None if localize is None else (lambda local: wrap(localize(local))))


class RunRecord:
    """Keeps every run of the op (callable, args, kwargs) through the callables it wraps, so
    they can be replayed back to back: the op's own share of an exploration."""

    def __init__(self):
        self.calls: list[tuple[Callable, tuple, dict]] = []

    def wrap(self, fn: Callable | None) -> Callable | None:
        if fn is None:
            return None

        def recorded(*args, **kwargs):
            self.calls.append((fn, args, kwargs))
            return fn(*args, **kwargs)

        return recorded


def replay(calls: list[tuple[Callable, tuple, dict]]) -> None:
    for fn, args, kwargs in calls:
        try:
            fn(*args, **kwargs)
        except Exception:  # a run the explorer expects to fail costs its time all the same
            pass


def op_only_ms(case, repeat: int) -> float:
    """CPU ms of metaspmd's runs of the op alone on one exploration of ``case``, replayed
    back to back on the inputs the explorer gave them: the time of a verifier with no
    overhead of its own that makes the same runs (a floor under metaspmd's ms)."""
    record = RunRecord()
    explore(counted_case(case, record.wrap))
    return best_of(lambda: replay(record.calls), repeat)[0]


def op_runs(case) -> tuple[int, int]:
    """(metaspmd's, the reference loop's) runs of the op on one exploration of ``case``."""
    ours, ref = RunCount(), RunCount()
    explore(counted_case(case, ours.wrap))
    easydist_style(ref.wrap(case.fn), case.args, case.kwargs)
    return ours.n, ref.n


# The explorer's stages, by the methods that run the op for them: a run counts toward the
# innermost of these on its call stack. Discovery is what EasyDist's loop does too (the
# example cut in two); the rest is verification.
STAGES = {
    "baseline": ("draw_baseline",),
    "discovery": ("_explore", "_search"),
    "fresh trials": ("_verify", "_verify_even"),
    "other sizes": ("_cuts_on_other_sizes", "_partials_on_other_sizes", "_amounts_on_other_sizes", "_cuts_far_away"),
    "value checks": ("_check_avg_evenly", "_refute_on_ties", "_reduces_on_three_shards", "_whole_on_special_values",
                     "_where_parts_cancel"),
    "independence": ("_independent_parts", "_independent_spec", "_beside_unread"),
}
_STAGE_OF = {method: stage for stage, methods in STAGES.items() for method in methods}


class StageCount(RunCount):
    """Counts the op's runs per explorer stage (``STAGES``), through the callables it wraps."""

    def __init__(self):
        super().__init__()
        self.runs = dict.fromkeys(STAGES, 0)

    def count(self) -> None:
        super().count()
        frame = sys._getframe(2)  # the caller of the wrapped callable
        while frame is not None and frame.f_code.co_name not in _STAGE_OF:
            frame = frame.f_back
        if frame is not None:  # a run outside explore_case (none today) counts nowhere
            self.runs[_STAGE_OF[frame.f_code.co_name]] += 1


def stage_runs(case) -> dict[str, int]:
    """metaspmd's runs of the op on one exploration of ``case``, per stage."""
    count = StageCount()
    explore(counted_case(case, count.wrap))
    return count.runs


def print_stages(selected) -> int:
    """Runs of the op per call and stage, and each stage's share of all of them."""
    print("metaspmd's runs of the op per call, by the explorer stage that made them (discovery: the example")
    print("cut in two, as EasyDist's loop does; the others verify what it found)")
    width = max(len(s) for s in STAGES) + 1
    print(f"{'call':<20}" + "".join(f"{s:>{width}}" for s in STAGES) + f"{'all':>7}")
    totals = dict.fromkeys(STAGES, 0)
    for name, fn, args, kwargs in selected:
        runs = stage_runs(metaspmd_case(fn, args, kwargs))
        for s, n in runs.items():
            totals[s] += n
        print(f"{name:<20}" + "".join(f"{runs[s]:>{width}}" for s in STAGES) + f"{sum(runs.values()):>7}", flush=True)
    every = sum(totals.values())
    print(f"{'total':<20}" + "".join(f"{totals[s]:>{width}}" for s in STAGES) + f"{every:>7}")
    print(f"{'share':<20}" + "".join(f"{100 * totals[s] / max(every, 1):>{width - 1}.1f}%" for s in STAGES))
    return 0


def strategies(entry) -> int:
    return len(entry.all_strategies())


def best_of(f: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The least CPU time of ``repeat`` runs, in ms (CPU time: others' load on a shared
    machine stretches wall time far more), and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.process_time()
        out = f()
        best = min(best, time.process_time() - t)
    return best * 1000, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--ops", help="comma-separated words: only calls whose name contains one")
    p.add_argument("--repeat", type=positive_int, default=3, help="runs per call, least CPU time taken (default 3)")
    p.add_argument("--profile", default="", help="cProfile the metaspmd side of calls matching this word")
    p.add_argument("--sort", default="cumtime", choices=sorted(pstats.Stats.sort_arg_dict_default),
                   metavar="KEY", help="profile sort key, one of pstats': %(choices)s (default cumtime)")
    p.add_argument("--top", type=positive_int, default=40, help="profile lines printed")
    p.add_argument("--stages", action="store_true",
                   help="instead of times: metaspmd's runs of the op per call, by explorer stage")
    a = p.parse_args(argv)
    unused = {} if a.profile else {"--top": "needs --profile", "--sort": "needs --profile"}
    if a.stages:
        unused |= {"--profile": "does not combine with --stages", "--repeat": "does not apply to --stages (it counts runs)"}
    refuse_unused(p, a, unused)
    torch.set_num_threads(1)
    words = [w for w in (a.ops or "").split(",") if w.strip()]
    if a.ops is not None and not words:  # an unset shell variable: an error, not every call
        p.error(f"--ops {a.ops!r} names no call")
    selected = [c for c in calls() if not words or any(w in c[0] for w in words)]
    unmatched = [w for w in words if not any(w in c[0] for c in calls())]
    if unmatched:  # a typo beside a good word would time fewer calls without a word
        p.error(f"--ops {a.ops!r}: no call's name contains {', '.join(map(repr, unmatched))}; the calls: "
                + ", ".join(c[0] for c in calls()))
    if a.profile and not any(a.profile in c[0] for c in selected):
        p.error(f"--profile {a.profile!r}: no selected call's name contains it")
    if a.stages:
        return print_stages(selected)
    if a.profile:
        chosen = [c for c in selected if a.profile in c[0]]
        cases = [metaspmd_case(fn, args, kwargs) for _, fn, args, kwargs in chosen]
        explore(cases[0])  # warm-up: imports, first-call dispatch
        prof = cProfile.Profile()
        prof.enable()
        for case in cases:
            explore(case)
        prof.disable()
        pstats.Stats(prof).sort_stats(a.sort).print_stats(a.top)
        return 0
    # warm-up: imports and torch's first-call costs out of the first row
    w = calls()[0]
    warm = metaspmd_case(w[1], w[2], w[3])
    explore(warm)
    easydist_style(warm.fn, warm.args, warm.kwargs)
    print("metaspmd: explore_case on rules_at_runtime.call_case (verified); reference: EasyDist's discovery")
    print("loop RE-IMPLEMENTED in this file, without EasyDist's own overheads (2 shards, one allclose, no")
    print(f"verification); 1 thread; CPU ms, least of {a.repeat}")
    print(f"{'call':<20} {'metaspmd ms':>11} {'strats':>6} {'runs':>5} {'status':<15} {'ref ms':>8} {'strats':>6} "
          f"{'runs':>5} {'ratio':>6} {'op-only':>8} {'ratio':>6}")
    rows = []
    for name, fn, args, kwargs in selected:
        case = metaspmd_case(fn, args, kwargs)
        ms, entry = best_of(lambda: explore(case), a.repeat)
        # on the case's own inputs and guarded callable (kernels that trust matching shapes
        # crash the process on some cuts: batch norm's running stats)
        rms, found = best_of(lambda: easydist_style(case.fn, case.args, case.kwargs), a.repeat)
        runs, rruns = op_runs(case)
        floor = op_only_ms(case, a.repeat)
        rows.append((name, ms, strategies(entry), entry.status, rms, found, runs, rruns, floor))
        print(f"{name:<20} {ms:>11.1f} {strategies(entry):>6} {runs:>5} {entry.status:<15} {rms:>8.2f} {found:>6} "
              f"{rruns:>5} {ms / rms:>6.1f} {floor:>8.2f} {floor / rms:>6.1f}", flush=True)
    total, rtotal = sum(r[1] for r in rows), sum(r[4] for r in rows)
    runs, rruns = sum(r[6] for r in rows), sum(r[7] for r in rows)
    floor = sum(r[8] for r in rows)
    print(f"{'total':<20} {total:>11.1f} {sum(r[2] for r in rows):>6} {runs:>5} {'':<15} {rtotal:>8.2f} "
          f"{sum(r[5] for r in rows):>6} {rruns:>5} {total / rtotal:>6.1f} {floor:>8.2f} {floor / rtotal:>6.1f}")
    print(f"{'median':<20} {statistics.median(r[1] for r in rows):>11.1f} {'':>6} "
          f"{statistics.median(r[6] for r in rows):>5.0f} {'':<15} {statistics.median(r[4] for r in rows):>8.2f} "
          f"{'':>6} {statistics.median(r[7] for r in rows):>5.0f}")
    print(f"ms per run: metaspmd {total / runs:.3f}, reference {rtotal / rruns:.3f}; runs per call, metaspmd over "
          f"reference: median {statistics.median(r[6] / r[7] for r in rows):.1f}")
    over = sum(r[8] > 3 * r[4] for r in rows)
    print(f"op-only: metaspmd's runs of the op replayed back to back, no explorer around them; over 3x the "
          f"reference's whole call: {over} of {len(rows)} calls (median {statistics.median(r[8] / r[4] for r in rows):.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(pipe_safe(main)())  # `| head` ends it quietly
