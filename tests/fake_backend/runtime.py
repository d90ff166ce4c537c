"""A numpy runtime backend: a fourth framework for ``metaspmd.parallelize`` in one module.

A function of numpy arrays written with ``call(op, *args)`` is captured by running it on
traced values; each node's rules are explored live with the numpy tensor ops; the plan
runs on a simulated mesh, every device holding its own local arrays, resharded by
materialising a value and cutting it again. Registered for ``FakeMesh`` by importing this
module (``register_runtime``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from metaspmd import planner
from metaspmd.case import OpCase
from metaspmd.ir import MetaIR, MetaOp, MetaVar
from metaspmd.placement import Partial, Placements, Shard
from metaspmd.resolve import NodeCall, ResolveStats
from metaspmd import runtime
from metaspmd.runtime import register_runtime
from metaspmd.signature import signature
from metaspmd.target import Target

from .numpy_ops import NumpyOps

OPS = {"matmul": np.matmul, "add": np.add, "tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}
NUMPY_TARGET = Target("numpy simulation", frozenset({"sum"}), frozenset({"sum", "max", "min"}))


@dataclass(frozen=True)
class FakeMesh:
    """A 1-D mesh of ``n`` simulated devices."""

    n: int


@dataclass
class _Traced:
    var: MetaVar
    value: np.ndarray


@dataclass
class _Tracer:
    ops: list[MetaOp] = field(default_factory=list)
    values: dict[str, tuple] = field(default_factory=dict)  # node -> its example arguments


_TRACER: list[_Tracer] = []


def call(op: str, *args):
    """``OPS[op](*args)``; under capture, also a node of the graph."""
    if not _TRACER or not any(isinstance(a, _Traced) for a in args):
        return OPS[op](*(a.value if isinstance(a, _Traced) else a for a in args))
    tracer = _TRACER[-1]
    values = tuple(a.value if isinstance(a, _Traced) else a for a in args)
    out = OPS[op](*values)
    name = f"{op}_{len(tracer.ops)}"
    var = MetaVar(f"{name}_out", out.shape, str(out.dtype))
    node = MetaOp(name, f"np.{op}", tuple(a.var if isinstance(a, _Traced) else a for a in args), {}, (var,), OPS[op])
    tracer.ops.append(node)
    tracer.values[name] = values
    return _Traced(var, out)


@dataclass(frozen=True)
class Captured:
    ir: MetaIR
    values: dict


class NumpyRuntime:
    name = "numpy"
    target = NUMPY_TARGET
    ops = NumpyOps()
    isolation = None
    threads = 1
    quiet = staticmethod(contextlib.nullcontext)

    def __init__(self, mesh: FakeMesh):
        self.mesh = mesh

    def planner_mesh(self, mesh: FakeMesh) -> planner.Mesh:
        return planner.Mesh.of((mesh.n,), ("x",))

    def capture(self, fn: Callable, example_inputs: tuple) -> Captured:
        inputs = [_Traced(MetaVar(f"in{i}", x.shape, str(x.dtype)), x) for i, x in enumerate(example_inputs)]
        _TRACER.append(_Tracer())
        try:
            out = fn(*inputs)
        finally:
            tracer = _TRACER.pop()
        return Captured(MetaIR(tuple(t.var for t in inputs), tuple(tracer.ops), (out.var,)), tracer.values)

    def node_call(self, captured: Captured, node: MetaOp) -> NodeCall:
        args = captured.values[node.name]
        names = tuple(f"x{i}" for i in range(len(args)))
        rng = np.random.default_rng

        def case() -> OpCase:
            return OpCase(node.op, node.fn, args, {}, names,
                          fresh=lambda seed: (tuple(rng(seed + 1).standard_normal(a.shape) for a in args), {}))

        return NodeCall(signature(self.ops, names, args, {}), None, case)  # no table: every node explored live

    def strategies(self, captured: Captured, found):
        return dict(found)

    def ties(self, captured: Captured):
        return []

    def constraints(self, captured: Captured, given):
        return runtime.named_constraints({i: v.name for i, v in enumerate(captured.ir.input_list)}, captured.ir,
                                         given, tuple, (self.mesh.n,))

    def plan_options(self, captured: Captured) -> dict:
        return {}

    one_plan = staticmethod(runtime.one_process)  # one process plans for itself

    def run(self, fn, captured: Captured, plan: planner.Plan, stats: ResolveStats, mesh: FakeMesh) -> "Planned":
        return Planned(captured, plan, stats, mesh.n)


@dataclass(frozen=True)
class Planned:
    """The plan, callable on the function's inputs; every device runs its own shards."""

    captured: Captured
    plan: planner.Plan
    stats: ResolveStats
    n: int

    def __call__(self, *inputs: np.ndarray) -> np.ndarray:
        return _run(self.captured.ir, self.plan, self.n, inputs)


RUNTIME = NumpyRuntime


def _full(locals_: list[np.ndarray], p: Placements) -> np.ndarray:
    (q,) = p
    if isinstance(q, Shard):
        return np.concatenate(locals_, axis=q.dim)
    if isinstance(q, Partial):
        return {"sum": np.sum, "max": np.max, "min": np.min}[q.op](np.stack(locals_), axis=0)
    return locals_[0]


def _cut(x: np.ndarray, p: Placements, n: int) -> list[np.ndarray]:
    (q,) = p
    if isinstance(q, Shard):
        return np.split(x, n, axis=q.dim)  # the planner cuts evenly
    if isinstance(q, Partial):  # the whole on the first device, the reduction's identity elsewhere
        rest = {"sum": 0.0, "max": -np.inf, "min": np.inf}[q.op]
        return [x] + [np.full_like(x, rest) for _ in range(n - 1)]
    return [x] * n


def _run(ir: MetaIR, plan: planner.Plan, n: int, inputs: tuple) -> np.ndarray:
    held: dict[str, tuple[list[np.ndarray], Placements]] = {}
    for v, x in zip(ir.input_list, inputs):
        p = plan.placement(v.name)
        held[v.name] = (_cut(x, p, n), p)

    def moved(name: str, want: Placements) -> list[np.ndarray]:
        locals_, p = held[name]
        return locals_ if p == want else _cut(_full(locals_, p), want, n)

    for op in ir.op_list:
        s = plan.strategy(op.name)
        wanted = iter(s.inputs)
        per_arg = [moved(a.name, next(wanted)) if isinstance(a, MetaVar) else [a] * n for a in op.args]
        outs = [op.fn(*(arg[d] for arg in per_arg)) for d in range(n)]
        held[op.outputs[0].name] = (outs, s.outputs[0])
    (out,) = ir.output_list
    return _full(*held[out.name])


register_runtime(f"{FakeMesh.__module__}.{FakeMesh.__qualname__}", __name__)

__all__ = ["FakeMesh", "NumpyRuntime", "OPS", "Planned", "RUNTIME", "call"]
