"""Does the planner recover the expert plans? On examples/models.py's GPT block and its JAX
twin (examples/jax_models.py), under a memory budget no plan with replicated weights fits:

- mesh of 4: the planner's modelled cost against Megatron's (Q/K/V and MLP-up
  column-parallel, out-proj and MLP-down row-parallel, the heads cut between them);
- mesh of 2x2: against DP x TP (the batch on the first axis, Megatron on the second) and
  FSDP x TP (the same, the weights also cut on the first axis: torchtitan's 2-D layout), and
  what the planner does on each axis.

The expert plan is costed by the same cost model: its parameter placements (and the input's)
are pinned with ``constraints=`` and the planner fills every activation, so the expert's
cost is that of the best plan with the expert's weights, never above a plan that also pins
its activations. Both plans are run (torch: DTensor on a fake process group under
LocalTensorMode; JAX: jax.jit on CPU devices) and their outputs and gradients compared with
one device (rtol 1e-4, atol 1e-5 times the largest magnitude in the tensor, at least 1e-5:
an element of a gradient summed over thousands of terms may cancel to near zero, where
float32 rounding of the terms, not the plan, sets the error). For JAX, XLA's "involuntary
full rematerialization" warnings of the compiled plan are counted.

``--production`` plans at sizes these cores cannot run: the synthetic GPT layers of
``metaspmd.planner.synthetic`` (the ops of a captured block, with the rules ShardCombine
finds for them) at hidden 2,048-8,192 and 16K tokens on 2x2, 2x4 and 4x2 meshes whose dp axis
crosses nodes, against DP x TP and FSDP x TP; planning only, costs from the cost model.

``--variants`` plans small transformer variants beyond the examples (other head counts,
separate Q/K/V projections, RMSNorm + SwiGLU, grouped-query attention with rotary positions,
an LM with tied embeddings) under the same kind of budget and checks each against one
device.

    python benchmarks/expert_plans_bench.py --mesh 4 --framework both
    python benchmarks/expert_plans_bench.py --mesh 2x2 --framework jax
    python benchmarks/expert_plans_bench.py --mesh 2x2 --dp-link 10e-6:25e9
    python benchmarks/expert_plans_bench.py --variants
    python benchmarks/expert_plans_bench.py --production
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# XLA fixes its CPU device count when jax starts a backend: ask for 8 before any import of jax.
_DEVICES = "--xla_force_host_platform_device_count=8"
if _DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICES}".strip()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from metaspmd import planner
from metaspmd.cache import RuleCache
from metaspmd.cli import path_arg, pipe_safe, positive_int, positive_number, refuse_unused, seconds
from metaspmd.planner import Infeasible
from metaspmd.registry_io import path_problem
from metaspmd.resolve import resolve
from metaspmd.runtime import runtime_for

RTOL, ATOL = 1e-4, 1e-5


# --------------------------------------------------------------------------- planning


class Case:
    """One model captured once, its rules resolved once, planned under several constraints."""

    def __init__(self, fn, mesh, x, cache, links=None, **options):
        self.fn, self.mesh, self.x = fn, mesh, x
        self.rt = runtime_for(mesh)(mesh, **options)
        self.planner_mesh = self.rt.planner_mesh(mesh).with_links(links)
        t = time.perf_counter()
        with self.rt.quiet():
            self.captured = self.rt.capture(fn, (x,))
            self.found, self.stats = resolve(self.captured.ir, lambda n: self.rt.node_call(self.captured, n),
                                             self.rt.ops, self.rt.name, cache, isolation=self.rt.isolation,
                                             threads=self.rt.threads)
        self.resolve_s = time.perf_counter() - t

    def plan(self, budget, constraints=None):
        rt, c = self.rt, self.captured
        return rt.one_plan(lambda: planner.plan(
            c.ir, rt.strategies(c, self.found), self.planner_mesh, memory_budget=budget,
            ties=rt.ties(c), target=rt.target, constraints=rt.constraints(c, constraints or {}),
            **rt.plan_options(c)))

    def least(self, constraints=None) -> float | None:
        """The least peak memory per device of any plan under these constraints (None: unknown)."""
        try:
            return self.plan(1.0, constraints).memory  # a plan that fits one byte: nothing to cut at all
        except Infeasible as err:
            m = re.search(r"needs is ([\d,]+)|alone need (\d+)", str(err))
            return float((m.group(1) or m.group(2)).replace(",", "")) if m else None

    def run(self, plan):
        return self.rt.run(self.fn, self.captured, plan, self.stats, self.mesh)


@dataclass
class Row:
    case: str
    budget: float = math.nan
    least_replicated: float = math.nan
    planner_us: float = math.nan
    experts: list = field(default_factory=list)  # (name, us, peak B, matches) per expert plan
    peak: float = math.nan
    matches: str = "-"
    remat: str = "-"
    noise: str = "-"
    axes: str = ""
    notes: list = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """The planner's cost over the cheapest expert's that fits the budget."""
        fits = [us for _, us, _, _ in self.experts if not math.isnan(us)]
        return self.planner_us / min(fits) if fits else math.nan


def _budget(case: Case, replicated: dict, fraction: float, given: float | None) -> tuple[float, float]:
    least_r = case.least(replicated)
    if given is not None:
        return given, least_r
    return fraction * least_r, least_r


def _close(a, b) -> tuple[bool, float]:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    atol = ATOL * max(1.0, float(np.max(np.abs(b)))) if b.size else ATOL
    err = float(np.max(np.abs(a - b) / (atol + RTOL * np.abs(b)))) if a.size else 0.0
    return a.shape == b.shape and err <= 1.0, err


def _verdict(results, names=None) -> str:
    worst = max(e for _, e in results)
    if os.environ.get("EXPERT_BENCH_DEBUG"):
        print("errors:", [(n, round(e, 2)) for n, (_, e) in zip(names or range(len(results)), results)])
    return ("yes" if all(ok for ok, _ in results) else "NO") + f" ({worst:.2f})"


# --------------------------------------------------------------------------- torch


def torch_setup(world: int):
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world)


def torch_mesh(shape):
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    names = ("tp",) if len(shape) == 1 else ("dp", "tp")
    return DeviceMesh("cpu", torch.arange(math.prod(shape)).reshape(shape), mesh_dim_names=names)


def torch_run_and_check(case: Case, plan, model, x) -> str:
    import torch
    from torch.distributed._local_tensor import LocalTensorMode

    with LocalTensorMode(frozenset(range(case.mesh.size()))):
        out, grads = case.run(plan)(x)
    ref = model(x)
    ref_grads = torch.autograd.grad(ref.sum(), list(model.parameters()))
    results = [_close(out.detach(), ref.detach())]
    results += [_close(g.detach(), r.detach()) for g, r in zip(grads, ref_grads)]
    return _verdict(results)


def torch_noise(model, x) -> float:
    """One device in float32 against one device in float64, in units of the tolerance: how
    far float32 rounding alone moves this model's outputs and gradients."""
    import copy

    import torch

    m64 = copy.deepcopy(model).double()
    x64 = x.double() if x.is_floating_point() else x
    ref, ref64 = model(x), m64(x64)
    g = torch.autograd.grad(ref.sum(), list(model.parameters()))
    g64 = torch.autograd.grad(ref64.sum(), list(m64.parameters()))
    return max(_close(a.detach(), b.detach())[1] for a, b in zip((ref, *g), (ref64, *g64)))


def expert_plans(names_2d: bool, megatron: dict, params, x, R, shard) -> tuple[dict, dict]:
    """(the replicated constraints, {expert name: its constraints}) in the framework's
    placements (``R``, ``shard(dim)``); ``x`` names the input."""
    tp = {n: shard(int(megatron[n][1])) if n in megatron else R for n in params}
    if not names_2d:
        return {n: (R,) for n in params}, {"Megatron": {x: (R,), **{n: (tp[n],) for n in params}}}
    return {n: (R, R) for n in params}, {
        "DP x TP": {x: (shard(0), R), **{n: (R, tp[n]) for n in params}},
        "FSDP x TP": {x: (shard(0), R), **{n: (shard(0), tp[n]) for n in params}},
    }


def torch_placements(names_2d: bool, megatron: dict, params):
    """(the replicated constraints, the experts') in DTensor placements."""
    from torch.distributed.tensor import Replicate, Shard

    return expert_plans(names_2d, megatron, params, 0, Replicate(), Shard)


# Megatron on examples.models.GPTBlock (nn.Linear keeps its weight as [out, in]).
TORCH_MEGATRON = {"qkv.weight": "S0", "qkv.bias": "S0", "proj.weight": "S1", "fc1.weight": "S0",
                  "fc1.bias": "S0", "fc2.weight": "S1"}
# ... and on examples.jax_models.gpt_block (weights as [in, out]).
JAX_MEGATRON = {"params.w_qkv": "S1", "params.b_qkv": "S0", "params.w_o": "S0", "params.w1": "S1",
                "params.b1": "S0", "params.w2": "S0"}


def describe_axes(plan, input_var: str, weight_vars: dict) -> str:
    """Per mesh axis: DP (batch cut, weights whole), TP (weights cut, batch whole), FSDP (both cut)."""
    out = []
    x = plan.placement(input_var)
    for i, name in enumerate(a.name for a in plan.mesh.axes):
        batch = isinstance(x[i], planner.Shard) and x[i].dim == 0
        cut = [n for n, v in weight_vars.items() if not isinstance(plan.placement(v)[i], planner.Replicate)]
        kind = ("FSDP" if cut else "DP") if batch else ("TP" if cut else "R")
        detail = f"x {x[i]}; {len(cut)}/{len(weight_vars)} weights cut"
        out.append(f"{name}: {kind} ({detail})")
    return "; ".join(out)


def torch_case(args, shape, cache) -> list[Row]:
    import torch
    from torch.distributed._local_tensor import LocalTensorMode

    from backends.torch.parallelize import _user_names
    from examples.models import GPTBlock

    torch_setup(math.prod(shape))
    torch.manual_seed(0)
    model = GPTBlock(args.hidden, args.heads, 4 * args.hidden)
    x = torch.randn(args.batch, args.seq, args.hidden)
    with LocalTensorMode(frozenset(range(math.prod(shape)))):
        case = Case(model, torch_mesh(shape), x, cache, links=args.links)
    params = [n for n, _ in model.named_parameters()]
    replicated, experts = torch_placements(len(shape) == 2, TORCH_MEGATRON, params)
    row = Row(f"torch GPT block, mesh {'x'.join(map(str, shape))}")
    _compare(row, case, replicated, experts, args,
             lambda plan: torch_run_and_check(case, plan, model, x))
    row.noise = f"{torch_noise(model, x):.2f}"
    names = _user_names(case.captured)
    weights = {n: names[n] for n in params if n.endswith("weight") and not n.startswith("ln")}
    row.axes = _axes(row, names[0], weights, case)
    return [row]


# --------------------------------------------------------------------------- jax


def jax_mesh(shape):
    import jax
    from jax.sharding import Mesh

    names = ("tp",) if len(shape) == 1 else ("dp", "tp")
    return Mesh(np.array(jax.devices()[:math.prod(shape)]).reshape(shape), names)


@contextlib.contextmanager
def stderr_to(path: str):
    """Send fd 2 (where XLA's C++ logging writes) to a file."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _jax_run(par, x):
    """Run a planned JAX program (compiling it), catching what XLA logs meanwhile."""
    import jax

    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        with stderr_to(log.name):
            out, grads = par(x)
            jax.block_until_ready((out, grads))
        text = Path(log.name).read_text()
    if text.strip():
        sys.stderr.write(text)
    return out, grads, text


def jax_run_and_check(case: Case, plan, fn, params, x) -> tuple[str, int]:
    import jax

    out, grads, text = _jax_run(case.run(plan), x)
    remat = len(re.findall(r"rematerializ", text, re.IGNORECASE))
    ref = fn(params, x)
    ref_grads = jax.grad(lambda p: fn(p, x).sum())(params)
    results = [_close(out, ref)] + [_close(grads[n], ref_grads[n]) for n in params]
    return _verdict(results, ["out", *params]), remat


def jax_noise(fn, params, x) -> float:
    """As torch_noise, for a JAX function."""
    import jax

    def value_and_grads(p, x):
        return fn(p, x), jax.grad(lambda p: fn(p, x).sum())(p)

    ref = value_and_grads(params, x)
    with jax.enable_x64(True):
        p64 = jax.tree.map(lambda a: a.astype("float64") if a.dtype == "float32" else a, params)
        ref64 = value_and_grads(p64, x.astype("float64") if x.dtype == "float32" else x)
        ref64 = jax.tree.map(np.asarray, ref64)
    return max(_close(a, b)[1] for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(ref64)))


def jax_case(args, shape, cache) -> list[Row]:
    import jax

    from examples.jax_models import gpt_block, gpt_params

    params = gpt_params(args.hidden, 4 * args.hidden)
    x = jax.random.normal(jax.random.key(1), (args.batch, args.seq, args.hidden), jax.numpy.float32)
    fn = lambda p, x: gpt_block(p, x, heads=args.heads)
    mesh = jax_mesh(shape)
    case = Case(fn, mesh, x, cache, links=args.links, params=params)
    names = [f"params.{n}" for n in params]
    replicated, experts = expert_plans(len(shape) == 2, JAX_MEGATRON, names, "in0", planner.Replicate(),
                                       planner.Shard)
    row = Row(f"jax GPT block, mesh {'x'.join(map(str, shape))}")
    remats = []

    def check(plan):
        verdict, remat = jax_run_and_check(case, plan, fn, params, x)
        remats.append(remat)
        return verdict

    _compare(row, case, replicated, experts, args, check)
    row.remat = " / ".join(map(str, remats))
    row.noise = f"{jax_noise(fn, params, x):.2f}"
    weights = {n: n for n in ("params.w_qkv", "params.w_o", "params.w1", "params.w2")}
    row.axes = _axes(row, "in0", weights, case)
    return [row]


# --------------------------------------------------------------------------- both


def _compare(row: Row, case: Case, replicated: dict, experts: dict, args, check) -> None:
    row.budget, row.least_replicated = _budget(case, replicated, args.budget_fraction, args.budget)
    try:
        best = case.plan(row.budget)
    except Infeasible as err:
        row.notes.append(f"planner: {err}")
        return
    row.planner_us, row.peak = best.total_cost * 1e6, best.memory
    row._plan = best
    row.matches = check(best)
    if args.show_plans:
        print(best.table())
    for name, constraints in experts.items():
        try:
            exp = case.plan(row.budget, constraints)
        except Infeasible as err:
            row.experts.append((name, math.nan, math.nan, "-"))
            row.notes.append(f"{name} does not fit the budget: {err}")
            continue
        row.experts.append((name, exp.total_cost * 1e6, exp.memory, check(exp)))
        if args.show_plans:
            print(f"{name}:\n{exp.table()}")


def _axes(row: Row, input_var, weights, case) -> str:
    plan = getattr(row, "_plan", None)
    return describe_axes(plan, input_var, weights) if plan is not None else "(no plan)"


def print_rows(rows: list[Row], expert_name: str) -> None:
    print(f"\nexperts = {expert_name}: their parameter (and input) placements pinned with constraints=, "
          "the planner filling the activations; all costed by the planner's cost model; ratio: planner / "
          "cheapest expert")
    head = ("case", "budget B", "replicated needs", "planner us", "expert us", "ratio", "peak B",
            "expert peak B", "matches 1 device (plan / expert)", "float32 noise", "XLA remat warnings (plan / expert)")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        experts = r.experts or [("", math.nan, math.nan, "-")]
        cells = (r.case, f"{r.budget:,.0f}", f"{r.least_replicated:,.0f}", f"{r.planner_us:.2f}",
                 " / ".join(f"{e[1]:.2f}" for e in experts), f"{r.ratio:.4f}", f"{r.peak:,.0f}",
                 " / ".join(f"{e[2]:,.0f}" for e in experts),
                 f"{r.matches} / " + " / ".join(e[3] for e in experts), r.noise, r.remat)
        print("| " + " | ".join(cells) + " |")
    print("matches 1 device: every output and gradient within rtol 1e-4, atol 1e-5 x its largest |value| of one device; in "
          "brackets the worst |a - b| / (atol + rtol |b|). float32 noise: the same measure of one device "
          "in float32 against one device in float64")
    for r in rows:
        print(f"{r.case}: planner's axes: {r.axes}")
        if "NO" in r.matches + "".join(e[3] for e in r.experts) and r.noise != "-":
            print(f"{r.case}: off by more than the tolerance; float32 rounding alone moves one device by "
                  f"{r.noise} tolerances")
        for n in r.notes:
            print(f"{r.case}: {n}")


# --------------------------------------------------------------------------- production sizes

# (hidden, heads, batch, seq, layers, mesh): the sizes of a 1-7B-parameter model's layers
PRODUCTION = ((2048, 16, 16, 2048, 1, (2, 4)), (4096, 32, 8, 2048, 1, (2, 2)), (4096, 32, 8, 2048, 1, (2, 4)),
              (4096, 32, 8, 2048, 1, (4, 2)), (4096, 32, 8, 2048, 2, (2, 4)), (8192, 64, 4, 4096, 1, (2, 4)))
# Megatron on the synthetic layer (weights as [in, out]), by parameter name after the layer's
SYNTHETIC_MEGATRON = {"wq": "S1", "wk": "S1", "wv": "S1", "wo": "S0", "w1": "S1", "w2": "S0",
                      "bq": "S0", "bk": "S0", "bv": "S0", "b1": "S0"}


def production_rows(links: dict, time_limit: float = 60.0) -> list[str]:
    """One table row per PRODUCTION size: the planner, DP x TP and FSDP x TP, unbudgeted and
    under 0.9 x the pure-DP peak, costed by the cost model."""
    from metaspmd.planner.synthetic import GPTConfig, gpt

    R, S = planner.Replicate(), planner.Shard
    rows = []
    for hidden, heads, batch, seq, layers, shape in PRODUCTION:
        ir, strategies, grads = gpt(GPTConfig(layers=layers, batch=batch, seq=seq, hidden=hidden, heads=heads))
        mesh = planner.Mesh.of(shape, ("dp", "tp")).with_links(links)
        params = [p for p, _ in grads]
        weights = {p: p for p in params if p.split(".")[1] in ("wq", "wk", "wv", "wo", "w1", "w2")}

        def run(constraints=None, budget=None):
            return planner.plan(ir, strategies, mesh, ties=grads, constraints=constraints, memory_budget=budget,
                                time_limit=time_limit)

        megatron = {p: SYNTHETIC_MEGATRON[p.split(".")[1]] for p in params if p.split(".")[1] in SYNTHETIC_MEGATRON}
        replicated, experts = expert_plans(True, megatron, params, "x", R, S)
        pure_dp = run({"x": (S(0), S(0)), **replicated})
        for budget in (None, 0.9 * pure_dp.memory):
            cells = []
            for constraints in (None, *experts.values()):
                try:
                    got = run(constraints, budget)
                    cells.append((f"{got.total_cost * 1e3:.2f}", got))
                except Infeasible:
                    cells.append(("does not fit", None))
            best = cells[0][1]
            size = f"h {hidden}, {heads} heads, {batch} x {seq} tokens, {layers} layer(s), {shape[0]}x{shape[1]}"
            rows.append(" | ".join((size, "none" if budget is None else f"{budget / 2**30:.2f} GiB",
                                    *(c[0] for c in cells),
                                    describe_axes(best, "x", weights) if best is not None else "(no plan)")))
    return rows


# --------------------------------------------------------------------------- variants


def torch_variants(dim: int, heads_list, seq: int, batch: int):
    """Small transformer variants beyond examples/models.py: (name, model, input)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from examples.models import GPTBlock

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def attend(q, k, v, b, t, d, heads):
        q, k, v = (y.view(b, t, heads, d // heads).transpose(1, 2) for y in (q, k, v))
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d // heads)).masked_fill(
            ~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        return (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)

    class SeparateQKVBlock(nn.Module):
        """The GPT block with Q, K and V as three projections (not one fused qkv)."""

        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            h = self.ln1(x)
            x = x + self.proj(attend(self.q(h), self.k(h), self.v(h), b, t, d, self.heads))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class LlamaBlock(nn.Module):
        """RMSNorm, fused QKV without biases, SwiGLU MLP."""

        def __init__(self, d, heads, hidden):
            super().__init__()
            self.heads = heads
            self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
            self.down = nn.Linear(hidden, d, bias=False)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)
            x = x + self.o(attend(q, k, v, b, t, d, self.heads))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    def rope(x, cos, sin):  # rotary position embedding, rotate-half form
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    class GQARopeBlock(nn.Module):
        """Grouped-query attention (2 K/V heads shared by the query heads) with rotary
        positions, through F.scaled_dot_product_attention; RMSNorm and SwiGLU."""

        def __init__(self, d, heads, hidden, t, kv_heads=2):
            super().__init__()
            self.heads, self.kv, self.dh = heads, kv_heads, d // heads
            self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
            self.q, self.o = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
            self.k, self.v = (nn.Linear(d, kv_heads * self.dh, bias=False) for _ in range(2))
            self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
            self.down = nn.Linear(hidden, d, bias=False)
            freqs = torch.outer(torch.arange(t).float(), 1e4 ** (-torch.arange(0, self.dh, 2).float() / self.dh))
            angles = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("cos", angles.cos())
            self.register_buffer("sin", angles.sin())

        def forward(self, x):
            b, t, d = x.shape
            h = self.n1(x)
            q = rope(self.q(h).view(b, t, self.heads, self.dh).transpose(1, 2), self.cos, self.sin)
            k = rope(self.k(h).view(b, t, self.kv, self.dh).transpose(1, 2), self.cos, self.sin)
            v = self.v(h).view(b, t, self.kv, self.dh).transpose(1, 2)
            k, v = (y.repeat_interleave(self.heads // self.kv, dim=1) for y in (k, v))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class TiedLM(nn.Module):
        """Embedding, one GPT block, LayerNorm and logits through the embedding's weight;
        mean cross-entropy against the next token."""

        def __init__(self, vocab, d, heads):
            super().__init__()
            self.emb, self.block, self.ln = nn.Embedding(vocab, d), GPTBlock(d, heads, 4 * d), nn.LayerNorm(d)

        def forward(self, ids):
            logits = self.ln(self.block(self.emb(ids))) @ self.emb.weight.t()
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    torch.manual_seed(0)
    x = torch.randn(batch, seq, dim)
    out = [(f"GPT block, {h} heads", GPTBlock(dim, h, 4 * dim), x) for h in heads_list]
    out.append(("separate Q/K/V projections", SeparateQKVBlock(dim, heads_list[0]), x))
    out.append(("RMSNorm + SwiGLU, no biases", LlamaBlock(dim, heads_list[0], 8 * dim // 3 // 8 * 8), x))
    out.append(("GQA (2 K/V heads) + rotary + SDPA, RMSNorm, SwiGLU",
                GQARopeBlock(dim, heads_list[0], 8 * dim // 3 // 8 * 8, seq), x))
    out.append(("LM, tied embedding + cross-entropy", TiedLM(4 * dim, dim, heads_list[0]),
                torch.randint(0, 4 * dim, (batch, seq))))
    return out


def run_variants(args, cache) -> list[Row]:
    rows = []
    shape = args.mesh_shape
    if args.framework in ("torch", "both"):
        from torch.distributed._local_tensor import LocalTensorMode
        from torch.distributed.tensor import Replicate

        torch_setup(math.prod(shape))
        for name, model, x in torch_variants(args.variant_hidden, args.variant_heads, args.variant_seq,
                                             args.variant_batch):
            def torch_case_of(model=model, x=x):
                with LocalTensorMode(frozenset(range(math.prod(shape)))):
                    return Case(model, torch_mesh(shape), x, cache)

            rows.append(_plan_variant(
                Row(f"torch {name}"), args, torch_case_of,
                lambda case, model=model: {n: (Replicate(),) * len(shape) for n, _ in model.named_parameters()},
                lambda case, best, model=model, x=x: (torch_run_and_check(case, best, model, x), "-"),
                lambda model=model, x=x: torch_noise(model, x)))
    if args.framework in ("jax", "both"):
        import jax

        from examples.jax_models import gpt_block, gpt_params, lm, lm_params

        mesh = jax_mesh(shape)
        d, b, t = args.variant_hidden, args.variant_batch, args.variant_seq
        x = jax.random.normal(jax.random.key(1), (b, t, d), jax.numpy.float32)
        ids = jax.random.randint(jax.random.key(2), (b, t), 0, 256)
        cases = [(f"GPT block, {h} heads", functools.partial(gpt_block, heads=h), gpt_params(d, 4 * d), x)
                 for h in args.variant_heads]
        cases.append(("GQA (2 K/V heads) + rotary, RMS norm, SwiGLU", _jax_gqa_block,
                      _jax_gqa_params(d, args.variant_heads[0], 8 * d // 3 // 8 * 8), x))
        cases.append(("LM, tied embedding + cross-entropy (examples.jax_models.lm)", lm, lm_params(256, d), ids))
        for name, fn, params, xin in cases:
            rows.append(_plan_variant(
                Row(f"jax {name}"), args, lambda fn=fn, xin=xin, params=params: Case(fn, mesh, xin, cache, params=params),
                lambda case: {n: (planner.Replicate(),) * len(shape) for n in case.captured.param_names},
                lambda case, best, fn=fn, params=params, xin=xin: _jax_variant_check(case, best, fn, params, xin),
                lambda fn=fn, params=params, xin=xin: jax_noise(fn, params, xin)))
    return rows


def _plan_variant(row: Row, args, make_case, replicated_of, check, noise) -> Row:
    """Plan one variant under the budget rule, run it against one device and print its row;
    an error goes into the row's notes."""
    try:
        case = make_case()
        row.budget, row.least_replicated = _budget(case, replicated_of(case), args.budget_fraction, None)
        best = case.plan(row.budget)
        row.planner_us, row.peak = best.total_cost * 1e6, best.memory
        row.matches, remat = check(case, best)
        row.remat = str(remat)
        row.noise = f"{noise():.2f}"
        if args.show_plans:
            print(best.table())
    except Exception as err:  # noqa: BLE001 - reported in the table
        row.notes.append(f"{type(err).__name__}: {str(err)[:300]}")
    print_variant(row)
    return row


def _jax_gqa_block(p, x, kv_heads=2):
    """The JAX twin of torch_variants' GQARopeBlock (heads read off the params' shapes)."""
    import jax
    import jax.numpy as jnp

    b, t, d = x.shape
    dh = p["k"].shape[1] // kv_heads
    heads = d // dh
    freqs = jnp.outer(jnp.arange(t), 1e4 ** (-jnp.arange(0, dh, 2) / dh))
    angles = jnp.concatenate([freqs, freqs], -1)[:, None]  # [t, 1, dh] against [b, t, heads, dh]
    cos, sin = jnp.cos(angles), jnp.sin(angles)

    def rms(x, w):
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

    def rope(x):
        return x * cos + jnp.concatenate([-x[..., dh // 2:], x[..., : dh // 2]], -1) * sin

    h = rms(x, p["n1"])
    q = rope((h @ p["q"]).reshape(b, t, heads, dh))
    k = rope((h @ p["k"]).reshape(b, t, kv_heads, dh))
    v = (h @ p["v"]).reshape(b, t, kv_heads, dh)
    k, v = (jnp.repeat(y, heads // kv_heads, axis=2) for y in (k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
    att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(b, t, d)
    x = x + att @ p["o"]
    h = rms(x, p["n2"])
    return x + (jax.nn.silu(h @ p["gate"]) * (h @ p["up"])) @ p["down"]


def _jax_gqa_params(d, heads, hidden, kv_heads=2, seed=0):
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(jax.random.key(seed), 7))
    dh = d // heads

    def w(shape):  # scaled by 1/sqrt(fan_in), as nn.Linear's init
        return jax.random.normal(next(keys), shape, jnp.float32) / math.sqrt(shape[0])

    return dict(n1=jnp.ones(d), n2=jnp.ones(d), q=w((d, d)), k=w((d, kv_heads * dh)), v=w((d, kv_heads * dh)),
                o=w((d, d)), gate=w((d, hidden)), up=w((d, hidden)), down=w((hidden, d)))


def _jax_variant_check(case, plan, fn, params, x):
    import jax

    out, grads, text = _jax_run(case.run(plan), x)
    ref = fn(params, x)
    ref_grads = jax.grad(lambda p: fn(p, x).sum())(params)
    flat = jax.tree_util.tree_leaves_with_path(ref_grads)
    got = dict(grads) if isinstance(grads, dict) else {}
    results = [_close(out, ref)]
    for path, r in flat:
        key = "params" + "".join(f".{getattr(k, 'key', getattr(k, 'idx', k))}" for k in path)
        g = got.get(key)
        if g is None:  # nested params come back as the same tree
            g = grads
            for k in path:
                g = g[getattr(k, "key", getattr(k, "idx", None))]
        results.append(_close(g, r))
    return _verdict(results), len(re.findall(r"rematerializ", text, re.IGNORECASE))


def print_variant(row: Row) -> None:
    print(f"| {row.case} | {row.budget:,.0f} | {row.least_replicated:,.0f} | {row.planner_us:.2f} | "
          f"{row.peak:,.0f} | {row.matches} | {row.noise} | {row.remat} |" + "".join(f" {n}" for n in row.notes), flush=True)


# --------------------------------------------------------------------------- main


def fraction(text: str) -> float:
    """argparse type for --budget-fraction: a number in (0, 1]; above 1 the replicated plan
    fits, which the benchmark is there to rule out (nan would bind nothing)."""
    value = positive_number(text, what="a fraction")
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction: > 0 and <= 1, got {text!r}")
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    ap.add_argument("--mesh", choices=("4", "2x2"), default="4", help="a 1-D mesh of 4 or a 2x2 mesh (dp, tp)")
    ap.add_argument("--batch", type=positive_int, default=8)
    ap.add_argument("--seq", type=positive_int, default=64)
    ap.add_argument("--hidden", type=positive_int, default=256, help="model width, a multiple of --heads")
    ap.add_argument("--heads", type=positive_int, default=4)
    ap.add_argument("--budget", type=functools.partial(positive_number, what="a number of bytes"), default=None,
                    help="bytes per device (default: a fraction of the least peak of any plan whose weights are all "
                         "replicated)")
    ap.add_argument("--budget-fraction", type=fraction, default=0.9,
                    help="the budget as this fraction (0 to 1) of the least peak with replicated weights "
                         "(default 0.9)")
    ap.add_argument("--variants", action="store_true", help="plan the transformer variants instead")
    ap.add_argument("--production", action="store_true",
                    help="plan synthetic GPT layers at production sizes on 2x2, 2x4 and 4x2 meshes, dp across nodes "
                         "(planning only; --dp-link sets that link)")
    ap.add_argument("--variant-hidden", type=positive_int, default=64, help="a multiple of each --variant-heads")
    ap.add_argument("--variant-heads", type=positive_int, nargs="+", default=[4, 2, 8])
    ap.add_argument("--variant-seq", type=positive_int, default=16)
    ap.add_argument("--variant-batch", type=positive_int, default=4)
    ap.add_argument("--cache", type=path_arg, default=None, help="rule cache folder (default: the user cache)")
    ap.add_argument("--show-plans", action="store_true", help="print each plan's table")
    ap.add_argument("--dp-link", metavar="SECONDS:BYTES_PER_S", default=None,
                    help="2x2 only: the dp axis' link, e.g. 10e-6:25e9 for data parallelism across nodes "
                         "(default: the tp axis' intra-node link, 5e-6:100e9)")
    args = ap.parse_args(argv)
    block = ("--batch", "--seq", "--hidden", "--heads", "--budget")  # the GPT block's, not the variants'
    variant = ("--variant-hidden", "--variant-heads", "--variant-seq", "--variant-batch")
    if args.production:  # synthetic layers at production sizes, planned only
        refuse_unused(ap, args, {o: "does not apply to --production (synthetic layers, planning only)" for o in
                                 ("--variants", "--framework", "--mesh", "--budget-fraction", "--cache", "--show-plans",
                                  *block, *variant)})
    elif args.variants:
        refuse_unused(ap, args, {o: "does not apply to --variants (--variant-* set their sizes)" for o in block})
    else:
        refuse_unused(ap, args, {o: "needs --variants" for o in variant})
    # the attention cuts the width into heads: checked here, not as a reshape error mid-run
    if args.hidden % args.heads:
        ap.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    uneven = [h for h in args.variant_heads if args.variant_hidden % h]
    if uneven:
        ap.error(f"--variant-hidden {args.variant_hidden} is not a multiple of --variant-heads "
                 f"{' '.join(map(str, uneven))}")
    # a file (or a folder under one) would cost one warning per cache entry
    problem = args.cache is not None and path_problem(args.cache, folder=True)
    if problem:
        ap.error(f"--cache {problem}")
    args.mesh_shape = (4,) if args.mesh == "4" else (2, 2)
    args.links = None
    if args.dp_link:
        if args.mesh != "2x2" and not args.production:
            ap.error("--dp-link needs --mesh 2x2 or --production")
        try:
            alpha, bandwidth = args.dp_link.split(":")
            alpha, bandwidth = seconds(alpha, allow_zero=True), positive_number(bandwidth, what="bytes per second")
        except ValueError:
            ap.error(f"--dp-link: expected SECONDS:BYTES_PER_S, got {args.dp_link!r}")
        except argparse.ArgumentTypeError as e:
            ap.error(f"--dp-link {args.dp_link!r}: {e}")
        args.links = {"dp": (alpha, bandwidth)}
        try:  # the planner's own check of a link, before any work
            planner.Mesh.of((2, 2), ("dp", "tp")).with_links(args.links)
        except ValueError as e:
            ap.error(f"--dp-link {args.dp_link!r}: {e}")
    cache = RuleCache(args.cache) if args.cache else RuleCache()
    t = time.perf_counter()
    if args.production:
        links = args.links or {"dp": (10e-6, 25e9)}
        print(f"synthetic GPT layers (metaspmd.planner.synthetic), dp link {links['dp']} (s per message, bytes/s), "
              "tp the intra-node default; ms per step under the cost model; budget: none or 0.9 x the pure-DP peak")
        print("| size | budget | planner ms | DP x TP ms | FSDP x TP ms | planner's axes |")
        print("|---|---|---|---|---|---|")
        for row in production_rows(links):
            print(f"| {row} |", flush=True)
        print(f"\n{time.perf_counter() - t:.1f} s")
        return 0
    if args.variants:
        print(f"variants on mesh {args.mesh}, hidden {args.variant_hidden}, batch {args.variant_batch}, "
              f"seq {args.variant_seq}; budget {args.budget_fraction} x the least peak with replicated weights")
        print("| variant | budget B | replicated needs | planner us | peak B | matches 1 device | float32 noise | "
              "XLA remat warnings |")
        print("|---|---|---|---|---|---|---|---|")
        rows = run_variants(args, cache)
        bad = [r for r in rows if not r.matches.startswith("yes")]
    else:
        links = f"; dp link {args.dp_link} (s per message : bytes/s)" if args.dp_link else ""
        print(f"GPT block: batch {args.batch}, seq {args.seq}, hidden {args.hidden}, heads {args.heads}, "
              f"MLP {4 * args.hidden}; mesh {args.mesh}{links}", flush=True)
        rows = []
        if args.framework in ("torch", "both"):
            rows += torch_case(args, args.mesh_shape, cache)
        if args.framework in ("jax", "both"):
            rows += jax_case(args, args.mesh_shape, cache)
        print_rows(rows, "Megatron" if args.mesh == "4" else
                   "DP x TP (batch on dp, Megatron on tp) / FSDP x TP (the same, weights also cut on dp)")
        bad = [r for r in rows if not r.matches.startswith("yes") or any(e[3].startswith("NO") for e in r.experts)]
    print(f"\n{time.perf_counter() - t:.1f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(pipe_safe(main)())  # `| head` ends it quietly
