"""Planner time vs graph size on GPT graphs (forward + backward): ILP (CBC, and HiGHS when
highspy is installed) against the beam-search baseline.

    python benchmarks/planner_bench.py --layers 1 4 12 24 --mesh 2x4
    python benchmarks/planner_bench.py --layers 12 --mesh 8 --budget 0.7
    python benchmarks/planner_bench.py --captured --layers 1 4 12 24 --hidden 256 --seq 128
    python benchmarks/planner_bench.py --end-to-end --layers 12 24 --hidden 256 --heads 8 --batch 4 --seq 128

By default the graphs are synthetic (metaspmd.planner.synthetic: one node per matmul,
norm, softmax, ...). With ``--captured`` they are the ATen graphs torch captures from
examples.models.GPT (make_fx, forward + backward: views, transposes and casts included),
with rules from the generated table, then live exploration cached across sizes; the
'rules s' column is that resolution.

With ``--end-to-end`` each size is ``metaspmd.parallelize`` of the torch GPT on a fake
process group under LocalTensorMode, with a rule cache warmed by a 1-layer GPT of the same
widths first: the seconds (wall and CPU) of the whole call and of its capture, rule
resolution and planning; the planner's own columns are not printed.

Times are wall seconds of the whole planner call (problem build, reductions, beam search
on the reduced and the whole graph, ILP); 'build' is the problem build alone,
'nodes'/'reduced' the problem size before and after graph reductions. The beam baseline
runs on the whole graph. Costs are the cost model's estimate of one training step, in
milliseconds; 'gap' is the ILP's distance from its bound, 'won' whose plan the planner kept
(the ILP's or beam search's, never worse than either), 'MiB' the plan's liveness peak.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's metaspmd, not the one installed

from metaspmd.cli import at_most, positive_int, positive_number, refuse_unused, seconds
from metaspmd.planner import Infeasible, Mesh, PlannerError, build_problem, solve
from metaspmd.planner.reduce import Reductions, reduce_problem
from metaspmd.planner.synthetic import GPTConfig, gpt


MAX_SIMULATED_RANKS = 64  # --end-to-end runs every rank's tensors in one process


def mesh_sizes(text: str) -> tuple[int, ...]:
    """The axis sizes of a mesh shape such as 8 or 2x4 (checked by ``mesh_text``)."""
    return tuple(int(s) for s in text.lower().split("x"))


def parse_mesh(text: str) -> Mesh:
    shape = mesh_sizes(text)
    return Mesh.of(shape, tuple(("dp", "tp", "pp")[: len(shape)]) if len(shape) <= 3 else None)


class Clock:
    """Wall and process-CPU seconds of a call (CBC and HiGHS run in-process, so CPU time
    is what the planner itself used, whatever else shares the machine)."""

    def __init__(self, wall: float = 0.0, cpu: float = 0.0):
        self.wall, self.cpu = wall, cpu

    def __add__(self, other: "Clock") -> "Clock":
        return Clock(self.wall + other.wall, self.cpu + other.cpu)

    def __str__(self) -> str:
        return f"{self.wall:.2f}/{self.cpu:.2f}"


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        out = fn()
    except (Infeasible, PlannerError) as err:
        out = err
    return out, Clock(time.perf_counter() - wall, time.process_time() - cpu)


# Beam search holds width x choices partial plans per node: past a few thousand it is an
# exhaustive search that runs the machine out of memory, not a wider heuristic.
MOST_BEAM = 4096


def captured_gpt(layers: int, hidden: int, heads: int, batch: int, seq: int, cache) -> tuple:
    """The torch GPT's captured forward + backward graph, its rules, its (parameter,
    gradient) ties, and the seconds rule resolution took."""
    import torch

    from examples.models import GPT
    from metaspmd.backends.torch.capture import capture
    from metaspmd.backends.torch.rules_at_runtime import node_call
    from metaspmd.backends.torch.tensor_ops import TorchOps
    from metaspmd.resolve import resolve

    torch.manual_seed(0)
    captured = capture(GPT(layers, hidden, heads), (torch.randn(batch, seq, hidden),))
    (strategies, stats), secs = timed(
        lambda: resolve(captured.ir, lambda op: node_call(captured, op), TorchOps(), "torch", cache))
    print(f"{layers} layers: rules {stats}", file=sys.stderr, flush=True)
    return captured.ir, strategies, captured.parameter_gradient_ties(), secs


def end_to_end(layers_list: list[int], mesh_shape: str, hidden: int, heads: int, batch: int, seq: int) -> int:
    """``parallelize`` end to end per size, warm rule cache: total, capture, resolve, plan."""
    import contextlib
    import tempfile

    import torch
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from examples.models import GPT
    from metaspmd import runtime
    from metaspmd.backends.torch.parallelize import TorchRuntime, parallelize
    from metaspmd.cache import RuleCache

    shape = list(mesh_sizes(mesh_shape))
    world = math.prod(shape)
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world)
    cache = RuleCache(tempfile.mkdtemp())
    clocks: dict[str, Clock] = {}

    @contextlib.contextmanager
    def phases():
        """Each phase's clock, from the very functions parallelize calls."""
        wrapped = [(TorchRuntime, "capture", "capture"), (runtime, "resolve", "resolve"), (runtime.planner, "plan", "plan")]
        originals = [getattr(owner, name) for owner, name, _ in wrapped]
        for (owner, name, label), fn in zip(wrapped, originals):
            def clocked(*a, _fn=fn, _label=label, **k):
                out, clocks[_label] = timed(lambda: _fn(*a, **k))
                return out
            setattr(owner, name, clocked)
        try:
            yield
        finally:
            for (owner, name, _), fn in zip(wrapped, originals):
                setattr(owner, name, fn)

    def run(layers: int):
        torch.manual_seed(0)
        model, x = GPT(layers, hidden, heads), torch.randn(batch, seq, hidden)
        with LocalTensorMode(frozenset(range(world))):
            mesh = DeviceMesh("cpu", torch.arange(world).reshape(shape))
            return parallelize(model, mesh, (x,), cache=cache)

    _, warm = timed(lambda: run(1))
    print(f"parallelize(GPT) end to end on mesh {mesh_shape}, hidden {hidden}, heads {heads}, batch {batch}, seq {seq}; "
          f"rule cache warmed by 1 layer in {warm} s (wall/cpu)")
    rows = [["layers", "ops", "total s", "capture s", "resolve s", "plan s", "rules"]]
    for layers in layers_list:
        clocks.clear()
        with phases():
            p, total = timed(lambda: run(layers))
        rows.append([str(layers), str(len(p.captured.ir.op_list)), str(total)]
                    + [str(clocks.get(k, "-")) for k in ("capture", "resolve", "plan")]
                    + [f"{p.stats.table} table, {p.stats.cache} cache, {p.stats.live} live"])
        print(f"{layers} layers done", file=sys.stderr, flush=True)
    print("times: wall/cpu seconds")
    print_table(rows)
    return 0


def mesh_text(text: str) -> str:
    """argparse type: a mesh shape such as 8 or 2x4 (positive sizes)."""
    sizes = text.lower().split("x")
    if not all(s.isascii() and s.isdigit() and int(s) > 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"expected a mesh shape such as 8 or 2x4, got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=positive_int, nargs="+", default=[1, 4, 12, 24],
                   help="GPT depths to plan (default 1 4 12 24)")
    p.add_argument("--mesh", type=mesh_text, default="2x4", help="e.g. 8 or 2x4 (default 2x4)")
    p.add_argument("--hidden", type=positive_int, default=768, help="model width (default 768)")
    p.add_argument("--heads", type=positive_int, default=12, help="attention heads (default 12)")
    p.add_argument("--batch", type=positive_int, default=8, help="batch size (default 8)")
    p.add_argument("--seq", type=positive_int, default=512, help="sequence length (default 512)")
    p.add_argument("--time-limit", type=seconds, default=None,
                   help="the ILP's seconds (default: sized to the ILP, 10 to 60 s)")
    p.add_argument("--beam-width", type=at_most(positive_int, MOST_BEAM, f"{MOST_BEAM} partial plans"), default=8,
                   help=f"partial plans beam search keeps per node (1 to {MOST_BEAM}; default 8)")
    p.add_argument("--budget", type=positive_number, default=None,
                   help="memory budget as a fraction of the unconstrained ILP plan's memory")
    p.add_argument("--no-highs", action="store_true", help="skip HiGHS even when highspy is installed")
    p.add_argument("--captured", action="store_true",
                   help="plan the ATen graphs captured from the torch GPT instead of synthetic ones")
    p.add_argument("--end-to-end", action="store_true",
                   help="time metaspmd.parallelize of the torch GPT (capture, resolve, plan), warm rule cache")
    args = p.parse_args(argv)
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if args.end_to_end:  # parallelize's own planner settings: none of the synthetic table's
        refuse_unused(p, args, {o: "does not apply to --end-to-end" for o in
                                ("--captured", "--budget", "--time-limit", "--beam-width", "--no-highs")})
        world = math.prod(mesh_sizes(args.mesh))
        if world > MAX_SIMULATED_RANKS:  # each rank is simulated in this process (LocalTensorMode)
            p.error(f"--end-to-end simulates every rank in this process: a mesh of at most {MAX_SIMULATED_RANKS} "
                    f"devices, got {args.mesh} ({world})")
        return end_to_end(args.layers, args.mesh, args.hidden, args.heads, args.batch, args.seq)
    cache = None
    if args.captured:
        import tempfile

        from metaspmd.cache import RuleCache
        cache = RuleCache(tempfile.mkdtemp())  # cold for the first size, shared by the rest

    mesh = parse_mesh(args.mesh)
    solvers = ["cbc"] + (["highs"] if importlib.util.find_spec("highspy") and not args.no_highs else [])
    print(f"{'captured' if args.captured else 'synthetic'} GPT fwd+bwd on {mesh}, hidden {args.hidden}, heads {args.heads}, batch {args.batch}, seq {args.seq}, "
          f"time limit {'sized to the ILP' if args.time_limit is None else f'{args.time_limit:g} s'}, "
          f"beam width {args.beam_width}")
    header = ["layers", "ops"] + (["rules s"] if args.captured else []) + ["nodes", "reduced", "build s"]
    for s in solvers:
        header += [f"{s} s", f"{s} ms", f"{s} status", f"{s} gap", f"{s} won", f"{s} MiB"]
    header += ["beam s", "beam ms", "beam/ilp"]
    print("times: wall/cpu seconds, including the problem build; gap: the ILP's (cost - bound) / cost; "
          "won: whose plan solve kept (the ILP's incumbent or beam search's); MiB: the plan's peak per device")
    rows = [header]
    for layers in args.layers:
        if args.captured:
            ir, strategies, grads, rules_s = captured_gpt(layers, args.hidden, args.heads, args.batch, args.seq, cache)
        else:
            cfg = GPTConfig(layers=layers, batch=args.batch, seq=args.seq, hidden=args.hidden, heads=args.heads)
            ir, strategies, grads = gpt(cfg)
        problem, build_s = timed(lambda: build_problem(ir, strategies, mesh, ties=grads))
        if args.budget is not None:
            free = solve(problem, "cbc", args.time_limit)
            problem = build_problem(ir, strategies, mesh, ties=grads, memory_budget=args.budget * free.memory)
        reduced = reduce_problem(problem.choice, Reductions())
        row = [str(layers), str(len(ir.op_list))] + ([str(rules_s)] if args.captured else []) + [
            str(len(problem.choice.nodes)), str(len(reduced.problem.nodes)), str(build_s)]
        best = None
        for s in solvers:
            result, secs = timed(lambda: solve(problem, s, args.time_limit, beam_width=args.beam_width))
            if isinstance(result, Exception):
                row += [str(secs + build_s), "-", type(result).__name__, "-", "-", "-"]
                continue
            best = result.total_cost if best is None else min(best, result.total_cost)
            gap = "-" if result.gap is None else f"{result.gap:.2%}"
            won = "ilp" if result.picked == result.solver else "beam"
            row += [str(secs + build_s), f"{result.total_cost * 1e3:.3f}", result.status, gap, won,
                    f"{result.memory / 2**20:.1f}"]
        # the paper's Algorithm 2: the whole graph in topological order, no reductions
        beam, secs = timed(lambda: solve(problem, "beam", beam_width=args.beam_width, reductions=Reductions.none()))
        if isinstance(beam, Exception):
            row += [str(secs + build_s), "-", type(beam).__name__]
        else:
            ratio = f"{beam.total_cost / best:.3f}" if best else "-"
            row += [str(secs + build_s), f"{beam.total_cost * 1e3:.3f}", ratio]
        rows.append(row)
        print(f"{layers} layers done", file=sys.stderr, flush=True)
    print_table(rows)
    return 0


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


if __name__ == "__main__":
    from metaspmd.cli import pipe_safe  # `| head` ends it quietly

    sys.exit(pipe_safe(main)())
