"""``parallelize``: one skeleton for every framework, and the small interface each provides.

Capture a function as MetaIR, find every node's rules (the generated table, then live
ShardCombine, cached), project them onto the framework's target and plan on its mesh, then
run the plan. The steps are the same for every framework; what differs is a
``RuntimeBackend``: how to capture, the call of one node, the tensor ops live exploration
uses, the mesh, the target, and how to run a plan. A backend is found by the type of the
mesh it is given, and a framework's module is imported only then, so this core imports
none. A fourth framework is one module that calls ``register_runtime``.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import math
import numbers
import os
from typing import Any, Callable, ContextManager, Mapping, Protocol, Sequence

from . import planner
from .cache import RuleCache
from .ir import MetaIR, MetaOp
from .isolation import Isolation
from .placement import placements_str
from .planner.problem import constraint_problem
from .resolve import NodeCall, ResolveStats, resolve
from .shared_plan import graph_key
from .spec import Strategy
from .target import Target
from .tensor_ops import TensorOps


class Captured(Protocol):
    """What the skeleton reads of a capture: its MetaIR."""

    ir: MetaIR


class RuntimeBackend(Protocol):
    """One framework's runtime, made for one ``parallelize`` call (its options bound).

    ``name``: the backend's name in caches and registries; ``target``: what its runtime
    runs of a rule (``metaspmd.target``); ``ops``: the tensor ops live exploration uses;
    ``isolation`` / ``threads``: where table misses are explored (a forked child, or this
    many threads in process)."""

    name: str
    target: Target
    ops: TensorOps
    isolation: Isolation | None
    threads: int

    def planner_mesh(self, mesh: Any) -> planner.Mesh: ...

    def quiet(self) -> ContextManager:
        """The context capture and exploration run in (outside the caller's simulation modes)."""

    def capture(self, fn: Any, example_inputs: tuple) -> Captured: ...

    def node_call(self, captured: Captured, node: MetaOp) -> NodeCall: ...

    def strategies(self, captured: Captured, found: Mapping[str, tuple[Strategy, ...]]) -> dict:
        """The rule strategies the planner takes per node (a backend may drop slots the plan
        does not place, such as literal operands)."""

    def ties(self, captured: Captured) -> Sequence[tuple[str, str]]:
        """(parameter, gradient) groups: a gradient is delivered in its parameter's placement."""

    def constraints(self, captured: Captured, given: Mapping[Any, Any]) -> dict[str, planner.Placements]:
        """The placements the plan must give, by graph var name: ``given`` (keys and values
        in the framework's own terms: parameter names, input positions, its placement
        types) and the annotations the function itself carries."""

    def plan_options(self, captured: Captured) -> dict:
        """More of the planner's arguments (JAX plans a loop's body once, each node charged
        per iteration: ``repeats``, ``same_placement``); {} where there are none."""

    def one_plan(self, solve: Callable[[], planner.Plan], key: str) -> planner.Plan:
        """The plan every process runs: ``solve()`` where this process plans for all (one
        process, or the first of several, whose plan the others receive), so processes
        never run different plans (a time-limited solve can end differently on each).
        ``key``: the graph this process captured (``shared_plan.graph_key``); processes
        whose keys differ raise ``shared_plan.other_graph_error``, all of them."""

    def run(self, fn: Any, captured: Captured, plan: planner.Plan, stats: ResolveStats, mesh: Any) -> Any:
        """A callable that runs the plan on the framework's own distributed engine."""


# mesh type ("module.QualName") -> module whose RUNTIME makes the backend
_RUNTIMES: dict[str, str] = {
    "torch.distributed.device_mesh.DeviceMesh": "metaspmd.backends.torch.parallelize",
    "jax._src.mesh.Mesh": "metaspmd.backends.jax.parallelize",
}


def register_runtime(mesh_type: str, module: str) -> None:
    """Meshes of ``mesh_type`` (``"package.module.ClassName"``, a base class counts too) run
    on the ``RUNTIME`` of ``module``: a callable ``(mesh, **options) -> RuntimeBackend``."""
    _RUNTIMES[mesh_type] = module


def runtime_for(mesh: Any) -> Callable[..., RuntimeBackend]:
    """The runtime factory for ``mesh``'s type, found along its base classes."""
    for cls in type(mesh).__mro__:
        module = _RUNTIMES.get(f"{cls.__module__}.{cls.__qualname__}")
        if module is not None:
            return importlib.import_module(module).RUNTIME
    known = ", ".join(sorted(_RUNTIMES))
    raise TypeError(f"parallelize has no runtime for a {type(mesh).__module__}.{type(mesh).__qualname__} mesh "
                    f"(known: {known}; add one with metaspmd.runtime.register_runtime)")


def _refuse_unknown_options(factory: Callable[..., RuntimeBackend], mesh: Any, options: Mapping[str, Any]) -> None:
    """Refuse an option the mesh's runtime does not take, naming it and the ones it does
    (its constructor's TypeError names an internal class): a misspelt ``los_fn``, JAX's
    ``params`` on a torch mesh."""
    try:
        accepted = [name for name, p in inspect.signature(factory).parameters.items()
                    if name != "mesh" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    except (TypeError, ValueError):  # a factory without a signature: its own error stands
        return
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        near = difflib.get_close_matches(unknown[0], accepted + _OPTIONS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise TypeError(f"parallelize got an unknown option {unknown[0]!r}{hint}: on a "
                        f"{type(mesh).__module__}.{type(mesh).__qualname__} it takes "
                        f"{', '.join(_OPTIONS + accepted)}")


# parallelize's own options, beside those of the mesh's runtime
_OPTIONS = ["memory_budget", "time_limit", "solver", "cache", "cost_model", "constraints", "links"]


def check_options(example_inputs: Any, memory_budget: Any, time_limit: Any, *, solver: Any = "ilp",
                  cache: Any = None, cost_model: Any = None, constraints: Any = None,
                  options: Mapping[str, Any] | None = None) -> None:
    """Refuse, naming the option and its value, what would otherwise fail deep in capture,
    rule lookup or the planner (seconds later, with an error that names neither), or be
    ignored. ``options``: the runtime's own (``backward``, ``loss_fn``, ...)."""
    _check_inputs(example_inputs)
    # None: no budget; a time limit the planner sizes to the ILP
    _check_positive("memory_budget", memory_budget)
    _check_positive("time_limit", time_limit)
    if not isinstance(solver, str) or solver not in planner.SOLVER_CHOICES:
        raise ValueError(f"solver must be one of {', '.join(map(repr, planner.SOLVER_CHOICES))}, "
                         f"got {_short(solver)}")
    check_cache(cache)
    if cost_model is not None and not isinstance(cost_model, planner.CostModel):
        raise TypeError(f"cost_model must be a metaspmd.planner.CostModel or None, got {_shown(cost_model)}: pass "
                        "planner.CostModel(planner.Mesh.of(shape, names), planner.Device(...)), or None for "
                        "the default model")
    if constraints is not None and not isinstance(constraints, Mapping):
        raise TypeError(f"constraints must be a dict of placements by name (a parameter's name, an input's "
                        f"position), got {_shown(constraints)}: write {{name: (placement per mesh axis, ...)}}")
    _check_runtime_options(options or {})


def _short(value: Any) -> str:
    """``value``'s repr, cut short (10**400 is 401 digits)."""
    r = repr(value)
    return r if len(r) <= 60 else f"{r[:40]}... ({len(r)} characters)"


def _shown(value: Any) -> str:
    """``value`` in an error about its type: the type's name and the value."""
    if value is None or isinstance(value, bool):
        return repr(value)
    t = type(value)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} {_short(value)}"


def _check_inputs(example_inputs: Any) -> None:
    # tuple(tensor) would split a tensor into its rows
    if not isinstance(example_inputs, (tuple, list)):
        raise TypeError(f"example_inputs must be a tuple of the function's positional arguments, got a "
                        f"{type(example_inputs).__module__}.{type(example_inputs).__qualname__} "
                        "(for one input write (x,))")


def _check_positive(name: str, value: Any) -> None:
    """None, or a finite number > 0: nan compares false with everything, so a nan budget
    would constrain nothing, and an int past float's range fails the planner's arithmetic."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number or None, got {_short(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond any float
        finite = False
    if not finite or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {_short(value)}")


def check_cache(cache: Any) -> None:
    """``cache``: a RuleCache or None (the user's default one)."""
    if cache is None or isinstance(cache, RuleCache):
        return
    if isinstance(cache, (str, os.PathLike)):
        fix = f"pass metaspmd.cache.RuleCache({str(cache)!r}) to keep the rules under that folder"
    else:
        fix = "pass metaspmd.cache.RuleCache(folder), or None for the default folder"
    raise TypeError(f"cache must be a metaspmd.cache.RuleCache or None, got {_shown(cache)}: {fix}")


def check_flag(name: str, value: Any, meaning: str) -> None:
    """A yes/no option must be a bool: "no" would be true."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool ({meaning}), got {_shown(value)}")


def _check_runtime_options(options: Mapping[str, Any]) -> None:
    """The options every runtime reads the same way (one check for torch and JAX)."""
    check_flag("backward", options.get("backward", True), "True: plan forward and backward; False: forward only")


def _check_cost_model_mesh(cost_model: planner.CostModel | None, mesh: planner.Mesh, links: Any) -> None:
    """Before capture: a cost model is built on one mesh, its links included."""
    if cost_model is None or cost_model.mesh == mesh:
        return
    build = f"planner.Mesh.of({mesh.shape}, {mesh.names})" + (".with_links(links)" if links else "")
    raise ValueError(f"cost_model was built for {cost_model.mesh.described()}, but the plan's mesh is "
                     f"{mesh.described()}: build the cost model on {build}")


def parallelize(fn: Any, mesh: Any, example_inputs: tuple, *, memory_budget: float | None = None,
                time_limit: float | None = None, solver: str = "ilp", cache: RuleCache | None = None,
                cost_model: planner.CostModel | None = None, constraints: Mapping[Any, Any] | None = None,
                links: Mapping[str, tuple[float, float]] | None = None, **options: Any) -> Any:
    """Capture ``fn``, find every node's rules, plan on ``mesh`` and return a callable that
    runs the plan. ``constraints``: placements already decided, one per mesh axis, keyed as
    the runtime names values (a parameter's name, an input's position, a graph var), in
    the framework's placement types or metaspmd's; the function's own annotations
    (``with_sharding_constraint``) count too. ``time_limit``: the planner's seconds (None:
    sized to the problem). ``links``: the link of each named mesh axis, ``(seconds per
    message, bytes per second)``, where it is not an intra-node GPU link (5 µs, 100 GB/s):
    ``{"dp": (10e-6, 25e9)}`` for data parallelism across nodes. ``options`` go to the mesh's runtime
    (``backward``, ``loss_fn``; JAX's ``params`` and ``table``)."""
    check_options(example_inputs, memory_budget, time_limit, solver=solver, cache=cache, cost_model=cost_model,
                  constraints=constraints, options=options)
    factory = runtime_for(mesh)
    _refuse_unknown_options(factory, mesh, options)
    rt = factory(mesh, **options)
    planner_mesh = rt.planner_mesh(mesh).with_links(links)  # refuses an unknown axis before any work
    _check_cost_model_mesh(cost_model, planner_mesh, links)
    with rt.quiet():
        captured = rt.capture(fn, tuple(example_inputs))
        # before rule lookup, which can explore for seconds: a misnamed key fails now
        pinned = rt.constraints(captured, constraints or {})
        found, stats = resolve(captured.ir, lambda node: rt.node_call(captured, node), rt.ops, rt.name,
                               cache if cache is not None else RuleCache(), isolation=rt.isolation, threads=rt.threads)
    plan = rt.one_plan(lambda: planner.plan(
        captured.ir, rt.strategies(captured, found), planner_mesh, memory_budget=memory_budget,
        time_limit=time_limit, solver=solver, ties=rt.ties(captured), cost_model=cost_model, target=rt.target,
        constraints=pinned, **rt.plan_options(captured),
    ), graph_key(captured.ir))
    return rt.run(fn, captured, plan, stats, mesh)


def refuse_named_inputs(named: Mapping[str, Any]) -> None:
    """TypeError for inputs passed to a plan by keyword: it takes them by position, as the
    example inputs were given (a keyword would name nothing the trace kept)."""
    if named:
        raise TypeError(f"the plan takes its inputs by position, in example_inputs' order; got keyword "
                        f"argument{'s' if len(named) > 1 else ''} {', '.join(map(repr, named))}")


class UnknownName(KeyError):
    """A key that names no value; shown as its message (a KeyError shows its repr, which
    escapes the quotes of every bracketed name it lists)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def named_constraints(names: Mapping[Any, str], ir: MetaIR, given: Mapping[Any, Any],
                      placements: Callable[[Any], planner.Placements],
                      mesh_shape: tuple[int, ...]) -> dict[str, planner.Placements]:
    """``given`` keyed by graph var: each key a runtime's user-facing name (``names``) or a
    graph var itself, each value made metaspmd's placements (one per mesh axis) by
    ``placements``. A key that names nothing is refused with the names there are, and
    placements that cannot place the value on a mesh of ``mesh_shape`` (an uneven cut, a
    Partial input) with the reason, both naming the key (the planner would name the var)."""
    every = [*ir.input_list, *(v for op in ir.op_list for v in op.outputs)]
    known_vars = {v.name for v in every}
    shapes = {v.name: v.shape for v in every if v.is_tensor}
    inputs = {v.name for v in ir.input_list}
    out = {}
    for key, value in given.items():
        var = names.get(key, key if key in known_vars else None)
        if var is None:
            known = ", ".join(repr(k) for k in names)
            raise UnknownName(f"constraint on {key!r}: no such value (inputs are {known}, or name a graph var)")
        p = tuple(placements(value))
        why = constraint_problem(p, shapes[var], tuple(mesh_shape), var in inputs) if var in shapes else ""
        if why:
            raise ValueError(f"constraint on {key!r}: [{placements_str(p)}] cannot place its shape {shapes[var]} "
                             f"on a mesh of shape {tuple(mesh_shape)}: {why}")
        out[var] = p
    return out


quiet = contextlib.nullcontext  # the default ``RuntimeBackend.quiet``: nothing to leave


def one_process(solve: Callable[[], planner.Plan], key: str = "") -> planner.Plan:
    """The default ``RuntimeBackend.one_plan``: a single process plans for itself."""
    return solve()

__all__ = ["Captured", "RuntimeBackend", "check_cache", "check_flag", "check_options", "named_constraints",
           "one_process", "parallelize", "quiet", "register_runtime", "runtime_for"]
