"""Run a planned torch graph on DTensor.

Every graph input is distributed to its planned placements; every node's DTensor inputs
are redistributed to the placements its strategy wants (the planned edges), then the
node runs locally on each shard with the output wrapped as the plan says, which is
exactly the verified ShardCombine rule. DTensor's own rule runs it instead where DTensor
takes the placed inputs as they are and gives the planned outputs (the two agree), and
for view-like ops, whose shape arguments DTensor rewrites for each shard. DTensor's rule
is not taken on trust: its convolution rule, for one, reads only the input's placements,
and calls an output Replicate that a weight cut by output channels leaves cut; and the
ops whose DTensor rule is refuted on real DTensor at every call (``dtensor_rules.REFUTED``)
always run by their verified rule, as ``register()`` makes DTensor run them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._ops._embedding_ops import _MaskPartial  # DTensor keeps it private
from torch.utils._python_dispatch import _disable_current_modes

try:
    from torch.distributed._local_tensor import LocalTensor, local_tensor_mode
except ImportError:  # a torch without it
    LocalTensor = local_tensor_mode = None

from metaspmd import placement as mp
from metaspmd import planner, runtime
from metaspmd.cache import RuleCache
from metaspmd.resolve import ResolveStats
from metaspmd.runtime import named_constraints, refuse_named_inputs
from metaspmd.target import DTENSOR_PLAN

from .capture import Captured, capture, current_state, graph_failure, refuse_other_inputs, refuse_replaced_constants
from .dtensor import dtensor_has_rule, from_dtensor, to_dtensor_placements
from .dtensor_handlers import drawn_whole, per_rank
from .dtensor_rules import refuted
from .random_ops import draws
from .rules_at_runtime import live_exploration, node_call
from .shared_plan import one_plan
from .tensor_ops import TorchOps
from .views import derive, is_view_like, local_sizes, shards_rewrite_call


def planner_mesh(mesh: DeviceMesh) -> planner.Mesh:
    names = mesh.mesh_dim_names or tuple(f"axis{i}" for i in range(mesh.ndim))
    return planner.Mesh.of(tuple(mesh.shape), names)


@dataclass(eq=False)  # hashed by identity, as a function is (torch.compile, jax.jit of a wrapper)
class Parallelized:
    """A captured function with its plan, callable on the caller's inputs."""

    captured: Captured
    plan: planner.Plan
    stats: ResolveStats
    mesh: DeviceMesh
    module: torch.nn.Module | None = None  # the module planned, read at each call (None: a function)
    # node -> runs on DTensor's own rule: the placements are the plan's, so one answer per node
    on_dtensor: dict[str, bool] = field(default_factory=dict, repr=False)

    def __call__(self, *inputs, **named):
        """Run on DTensor; returns the function's outputs (and gradients) as full tensors.
        Buffers the model writes (running statistics) are written back into the module, and
        input tensors it writes in place into the caller's inputs, as eager leaves them."""
        refuse_named_inputs(named)
        refuse_other_inputs(self.captured, inputs)  # the plan and the graph hold for the example's
        refuse_replaced_constants(self.captured)
        _refuse_fake_collectives()
        _refuse_unsimulated_ranks(self.mesh)
        params, buffers = current_state(self.captured, self.module) if self.module is not None else ([], {})
        try:
            outs = _PlannedRun(self).run(*params, *buffers.values(), *inputs)
        except RuntimeError as err:  # the model's own error as the model, its inputs and the op, not an FX node
            fx_page = "\n\nWhile executing" in str(err)
            own = _one_device_error(self.captured.gm, params, buffers, inputs) if fx_page else None
            if own is None:
                raise
            raise RuntimeError(graph_failure(self.module, inputs, str(own))) from own
        if self.captured.updated_buffers or self.captured.updated_inputs:
            outs, updates = outs
            leaves = torch.utils._pytree.tree_leaves(inputs)
            written = ([buffers[name] for name in self.captured.updated_buffers]
                       + [leaves[i] for i in self.captured.updated_inputs])
            with torch.no_grad():  # as eager leaves them: written in place
                for x, new in zip(written, updates):
                    x.copy_(_plain(new.full_tensor()) if isinstance(new, DTensor) else new)
        if self.captured.trainable:  # forward + backward: (outputs, gradients of the trainable parameters)
            out, grads = _tree_full(outs)
            return _plain_containers(out), self.captured.all_gradients(list(grads))
        return _plain_containers(_tree_full(outs))

    def explain(self) -> str:
        return self.plan.table() if hasattr(self.plan, "table") else str(self.plan)


def _one_device_error(gm: torch.fx.GraphModule, params, buffers, inputs) -> Exception | None:
    """The graph's error on plain tensors, if it fails there too: a planned run's error is
    then the model's (float16 inputs to float32 weights), not the plan's, and named as such."""
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes(), torch.no_grad():
            torch.fx.Interpreter(gm).run(*params, *buffers.values(), *inputs)
    except Exception as e:  # noqa: BLE001 - any error: the model's own
        return e
    return None


def _refuse_unsimulated_ranks(mesh: DeviceMesh) -> None:
    """Under LocalTensorMode the mode simulates exactly the mesh's ranks: a shard placed on
    a rank it does not simulate has no local tensor to hold it, and a simulated rank outside
    the mesh has no coordinate on it (DTensor asserts deep inside)."""
    mode = local_tensor_mode() if local_tensor_mode is not None else None
    if mode is None:
        return
    ranks, simulated = set(mesh.mesh.flatten().tolist()), set(mode.ranks)
    if ranks != simulated:
        missing, extra = sorted(ranks - simulated), sorted(simulated - ranks)
        what = (f"has ranks {missing} that the LocalTensorMode around the call does not simulate" if missing else
                f"lacks ranks {extra} that the LocalTensorMode around the call simulates")
        raise ValueError(f"the mesh {what} (the mode simulates {sorted(simulated)}, the mesh has {sorted(ranks)}): "
                         f"give the mode exactly the mesh's ranks, LocalTensorMode(frozenset({sorted(ranks)}))")


def _refuse_fake_collectives() -> None:
    """The fake process group's collectives move no data: outside ``LocalTensorMode``,
    which simulates the ranks in one process, a plan that communicates gives wrong values."""
    import torch.distributed as dist

    if (dist.is_initialized() and dist.get_backend() == "fake" and dist.get_world_size() > 1
            and (local_tensor_mode is None or local_tensor_mode() is None)):
        raise RuntimeError("the process group is torch's fake one, whose collectives move no data: call the "
                           "parallelized model inside LocalTensorMode (torch.distributed._local_tensor), or run "
                           "one process per rank (torchrun, gloo or nccl)")


def _tree_full(tree: Any) -> Any:
    return torch.utils._pytree.tree_map(lambda x: _plain(x.full_tensor()) if isinstance(x, DTensor) else x, tree)


def _plain_containers(x: Any) -> Any:
    """``x`` with fx's immutable lists and dicts (a traced function's list or dict output)
    made the plain ones the function returns; tuples, named ones included, kept."""
    if isinstance(x, dict):
        return {k: _plain_containers(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain_containers(v) for v in x]
    if isinstance(x, tuple):
        items = [_plain_containers(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    return x


def _plain(x: torch.Tensor) -> torch.Tensor:
    """A full tensor as one tensor: under ``LocalTensorMode`` it is a LocalTensor holding a
    copy per simulated rank, and a caller's update with it outside the mode (``w -= lr * g``)
    would apply once per rank. The copies must agree, NaN where NaN (``LocalTensor.reconcile``
    compares with ``==``, so an output holding NaN, as eager's may, never agreed)."""
    if LocalTensor is None or not isinstance(x, LocalTensor):
        return x
    with _disable_current_modes():
        copies = list(x._local_tensors.values())
        if not all(_same_values(c, copies[0]) for c in copies[1:]):
            raise RuntimeError(f"the simulated ranks hold different values of a full {tuple(x.shape)} tensor "
                               f"{x.dtype}: the plan is wrong here (please report it)")
        out = copies[0].clone().detach()
    return out.requires_grad_(x.requires_grad)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    return torch.equal(a, b)


class _PlannedRun(torch.fx.Interpreter):
    def __init__(self, p: Parallelized):
        super().__init__(p.captured.gm)
        self.p = p
        self.placeholder_index = 0

    def placeholder(self, target, args, kwargs):
        value = super().placeholder(target, args, kwargs)
        name = self.p.captured.ir.input_list[self.placeholder_index].name
        self.placeholder_index += 1
        if not isinstance(value, torch.Tensor):
            return value
        # contiguous, as the example was traced: the graph's views need the strides they
        # were traced with (a permuted input reshaped is a copy in eager, a view in the graph);
        # a copy: across processes distribute_tensor broadcasts rank 0's values into the very
        # tensor it is given, which was the caller's input or parameter on the other ranks
        return distribute_tensor(value.detach().clone(memory_format=torch.contiguous_format), self.p.mesh,
                                 to_dtensor_placements(self.p.plan.placement(name)))

    def run_node(self, n: torch.fx.Node) -> Any:
        self.current = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        if not isinstance(target, torch._ops.OpOverload):
            return super().call_function(target, args, kwargs)
        strategy = self.p.plan.strategy(self.current.name)
        wanted = iter(strategy.inputs)
        mesh = self.p.mesh

        def place(x):
            if isinstance(x, DTensor):
                return redistribute(x, mesh, to_dtensor_placements(next(wanted)))
            if isinstance(x, torch.Tensor):  # a constant created outside the graph inputs
                return distribute_tensor(x, mesh, to_dtensor_placements(next(wanted)))
            return x

        args, kwargs = torch.utils._pytree.tree_map(place, (args, kwargs))
        if target in _VIEWS_OF_STRIDES:
            args = (_contiguous_shard(args[0]), *args[1:])
        out_placements = [to_dtensor_placements(p) for p in strategy.outputs]
        if draws(target, args, kwargs):
            return drawn_whole(target, args, kwargs, out_placements, mesh)
        name = self.current.name
        if name not in self.p.on_dtensor:
            # a refuted DTensor rule (dtensor_rules.REFUTED) never runs a node: its verified rule does
            self.p.on_dtensor[name] = dtensor_has_rule(target, handlers=False) and not refuted(target) and (
                is_view_like(target) or _dtensor_agrees(target, args, kwargs, out_placements))
        if self.p.on_dtensor[name]:
            out = target(*args, **kwargs)
            return _match_outputs(out, out_placements, mesh)
        return _run_local(target, args, kwargs, out_placements, mesh, self.current)


# Views that need strides they can reinterpret. A shard is not laid out as the traced
# tensor was: nn.MultiheadAttention views a transpose whose traced input was stored
# transposed, so the transpose was contiguous there, and is not on a shard made contiguous.
# The graph is functional (capture functionalizes any in-place write), so a copy in place
# of a view changes no value.
_VIEWS_OF_STRIDES = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _contiguous_shard(x: Any) -> Any:
    if not isinstance(x, DTensor):
        return x.contiguous() if isinstance(x, torch.Tensor) else x
    local = x.to_local()
    if local.is_contiguous():
        return x
    return DTensor.from_local(local.contiguous(), x.device_mesh, x.placements, run_check=False,
                              shape=x.shape, stride=_contiguous_strides(x.shape))


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``: the global layout of shards made contiguous."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _dtensor_agrees(target, args, kwargs, out_placements: list[tuple]) -> bool:
    """Whether DTensor's rule takes these placed inputs as they are and gives the planned
    output placements (its masked Partial counted as the Partial(sum) it reduces as)."""
    dispatcher = DTensor._op_dispatcher
    try:
        info = dispatcher.unwrap_to_op_info(target, args, kwargs)
        sharding = dispatcher.sharding_propagator.propagate_op_sharding(info.schema)
    except Exception:  # DTensor has no strategy for these placements
        return False
    if sharding.redistribute_schema is not None:  # set as well where only shape arguments change
        wanted = [w.placements for w in sharding.redistribute_schema.args_spec]
        given = [g.placements for g in info.schema.args_spec]
        if len(wanted) != len(given) or not all(map(_kept, wanted, given)):
            return False
    specs = [s for s in torch.utils._pytree.tree_leaves(sharding.output_spec) if s is not None]
    if len(specs) != len(out_placements):
        return False
    return all(tuple(map(_as_reduced, s.placements)) == tuple(map(_as_reduced, want))
               for s, want in zip(specs, out_placements))


def _kept(wanted: tuple, given: tuple) -> bool:
    # Replicate positions that DTensor's row-cut lookup masks (Replicate -> _MaskPartial)
    # stay where they are: the mask is computed on each shard, nothing moves
    return all(w == g or (isinstance(w, _MaskPartial) and isinstance(g, Replicate)) for w, g in zip(wanted, given))


def _as_reduced(p):
    return Partial(p.reduce_op) if isinstance(p, _MaskPartial) else p


def _unmasked(x: DTensor, mesh: DeviceMesh) -> DTensor:
    """``x`` with its _MaskPartial placements as plain Partial(sum). DTensor's row-cut
    embedding gives one: its local rows for positions outside the shard are still there,
    masked only when it is reduced, and DTensor refuses to redistribute it to Partial. The
    mask applied as that reduction would, the rows the shard does not hold are zero."""
    masked = [axis for axis, p in enumerate(x.placements) if isinstance(p, _MaskPartial)]
    if not masked:
        return x
    local = x.to_local().clone()
    for axis in masked:
        x.placements[axis].mask_buffer.apply_mask(local)
        x.placements[axis].mask_buffer.release_mask()
    placements = tuple(Partial(p.reduce_op) if axis in masked else p for axis, p in enumerate(x.placements))
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=x.shape, stride=x.stride())


def redistribute(x: DTensor, mesh: DeviceMesh, target: tuple) -> DTensor:
    """DTensor.redistribute, plus Replicate/Shard -> Partial, which DTensor keeps internal,
    and _MaskPartial -> Partial (``_unmasked``).

    A value becomes Partial(sum) over an axis by dividing it by the axis size on every
    device, or, for integers, which do not divide, by keeping it on the axis' first device
    and zeros on the others (max/min/avg: every device keeps it as is)."""
    x = _unmasked(x, mesh)
    to_partial = [
        axis for axis, (src, dst) in enumerate(zip(x.placements, target))
        if isinstance(dst, Partial) and not isinstance(src, Partial)
    ]
    if not to_partial:
        return x if tuple(x.placements) == tuple(target) else x.redistribute(mesh, target)
    interim = tuple(Replicate() if axis in to_partial else p for axis, p in enumerate(target))
    local = per_rank(x.redistribute(mesh, interim).to_local())
    for axis in to_partial:
        if target[axis].reduce_op == "sum":
            if local.is_floating_point() or local.is_complex():
                local = local / mesh.size(axis)
            else:
                local = _on_first_of_axis(local, mesh, axis)
    return DTensor.from_local(local, mesh, target, run_check=False, shape=x.shape, stride=x.stride())


def _on_first_of_axis(local: torch.Tensor, mesh: DeviceMesh, axis: int) -> torch.Tensor:
    """``local`` where the device is first along ``axis``, zeros elsewhere: a Partial(sum)
    of it for any dtype."""
    def first(rank: int) -> bool:
        return int((mesh.mesh == rank).nonzero()[0][axis]) == 0

    ranks = getattr(local, "_local_tensors", None)  # LocalTensorMode: every rank in one process
    if ranks is not None:
        return type(local)({r: t if first(r) else torch.zeros_like(t) for r, t in ranks.items()})
    return local if mesh.get_coordinate()[axis] == 0 else torch.zeros_like(local)


def _match_outputs(out, placements, mesh):
    it = iter(placements)

    def fix(x):
        if isinstance(x, DTensor):
            want = next(it)
            return redistribute(x, mesh, want)
        return x

    return torch.utils._pytree.tree_map(fix, out)


def _run_local(target, args, kwargs, placements, mesh, node: torch.fx.Node):
    local_args, local_kwargs = torch.utils._pytree.tree_map(
        lambda x: x.to_local() if isinstance(x, DTensor) else x, (args, kwargs)
    )
    out = _shard_fn(target, args, kwargs)(*local_args, **local_kwargs)
    it = iter(placements)
    metas = iter(m for m in torch.utils._pytree.tree_leaves(node.meta.get("val")) if isinstance(m, torch.Tensor))

    def wrap(x):
        if isinstance(x, torch.Tensor):
            meta = next(metas)
            return DTensor.from_local(x, mesh, next(it), run_check=False, shape=meta.shape, stride=meta.stride())
        return x

    return torch.utils._pytree.tree_map(wrap, out)


def _shard_fn(target, args, kwargs) -> Callable:
    """What each shard runs: the op, or for a view whose shards take sizes from the local
    shard (``as_strided`` of a cut dim), the derived rule's function, which its rules were
    verified with; called with the global sizes, a shard reads past its own storage. An op
    that restates its input's sizes (group norm's N) takes them from the local input."""
    if not shards_rewrite_call(target):
        return target
    if not is_view_like(target):  # sizes restated in the arguments (group norm's N)
        return local_sizes(target, target)

    def meta(x):  # the global tensor as the rule derives from it: shape, strides, dtype
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x

    global_args, global_kwargs = torch.utils._pytree.tree_map(meta, (args, kwargs))
    rule = derive(target, tuple(global_args), dict(global_kwargs))
    return rule.fn if rule is not None else target


@dataclass
class TorchRuntime:
    """The runtime backend for a torch ``DeviceMesh``: capture with ``make_fx`` (forward and
    backward for a module), run on DTensor."""

    mesh: DeviceMesh
    backward: bool = True
    loss_fn: Callable | None = None

    name = "torch"
    target = DTENSOR_PLAN
    ops = TorchOps()
    threads = 1  # kernels use the process's threads; exploration forks a child instead

    def __post_init__(self):
        # planned inside a LocalTensorMode, it runs there: a mesh the mode does not simulate
        # is refused now, not at the first call after capture, lookup and planning
        _refuse_unsimulated_ranks(self.mesh)

    @property
    def isolation(self):
        return live_exploration()

    def planner_mesh(self, mesh: DeviceMesh) -> planner.Mesh:
        return planner_mesh(mesh)

    def quiet(self):
        # capture and exploration run on plain tensors, outside any mode the caller is in
        # (LocalTensorMode, for one): the rules are about the op, not about the simulation
        return _disable_current_modes()

    def capture(self, fn, example_inputs: tuple) -> Captured:
        return capture(fn, example_inputs, backward=self.backward, loss_fn=self.loss_fn)

    def node_call(self, captured: Captured, node):
        return node_call(captured, node)

    def strategies(self, captured: Captured, found):
        return dict(found)

    def ties(self, captured: Captured):
        return captured.parameter_gradient_ties()

    def constraints(self, captured: Captured, given) -> dict:
        """Keys: a parameter's or buffer's name (``"fc1.weight"``), a user input's position
        (0, 1, ...), a tensor's name in a nested input (``"input 1[0]"``) or a graph var;
        values: DTensor placements, one per mesh axis (or one placement on a 1-D mesh);
        ``Shard(-1)`` counts from the last dim, as DTensor's does."""
        names, shapes = _user_names(captured), _var_shapes(captured)
        numbers = {v.name for v in captured.ir.input_list if not v.is_tensor}
        placed = {}
        for key, value in given.items():
            if isinstance(names.get(key), _SeveralLeaves):
                names[key].refuse()
            if names.get(key, key) in numbers:
                raise TypeError(f"constraint on {key!r}: the value is no tensor (the graph holds it as a constant), "
                                "so it has no placement")
            shape = shapes.get(names.get(key, key))
            # a key that names nothing keeps its value: named_constraints refuses it, listing the names
            placed[key] = value if shape is None else _constraint_placements(key, value, shape, self.mesh.ndim)
        leaves = {k: v for k, v in names.items() if not isinstance(v, _SeveralLeaves)}  # the names a key may take
        return named_constraints(leaves, captured.ir, placed, tuple, tuple(self.mesh.shape))

    def plan_options(self, captured: Captured) -> dict:
        return {}

    def one_plan(self, solve, key: str = ""):
        # one rank plans, every rank of the mesh runs that plan (see shared_plan)
        return one_plan(self.mesh, solve, key)

    def run(self, fn, captured: Captured, plan: planner.Plan, stats: ResolveStats, mesh: DeviceMesh) -> "Parallelized":
        # the trace names its inputs arg0_1, ...: the plan shows and takes the user's names
        labels = tuple((var, key) for key, var in _user_names(captured).items() if isinstance(var, str))
        plan = dataclasses.replace(plan, labels=labels)
        return Parallelized(captured, plan, stats, mesh, fn if isinstance(fn, torch.nn.Module) else None)


RUNTIME = TorchRuntime


def _user_names(captured: Captured) -> dict:
    """The graph input of each parameter, buffer (by each of its names, a tied weight's
    too) and user input: by position and as ``"input 0"`` where the argument is one value,
    and by its leaf's name (``"input 1[0]"``, as errors name it) where it holds several (a
    tuple, a dict). A position whose argument holds several is refused naming its leaves
    (``_SeveralLeaves``): it would place one of them."""
    inputs = [v.name for v in captured.ir.input_list]
    n_p, n_b = len(captured.param_names), len(captured.buffer_names)
    names: dict = dict(zip(captured.param_names, inputs))
    names.update(zip(captured.buffer_names, inputs[n_p:]))
    names.update((second, names[first]) for second, first in captured.tied if first in names)  # tied weights
    leaves = dict(zip((t.name for t in captured.inputs), inputs[n_p + n_b:]))
    for i in range(captured.n_user_inputs):
        own = f"input {i}"  # its name in the plan's table and in errors, beside the position
        if own in leaves:
            names[i] = names[own] = leaves[own]
            continue
        nested = {k: v for k, v in leaves.items() if k.startswith(own + "[")}
        names[i] = names[own] = _SeveralLeaves(i, tuple(nested))
        names.update(nested)
    return names


@dataclass(frozen=True)
class _SeveralLeaves:
    """A user input's position whose argument holds several values (or none)."""

    position: int
    leaves: tuple[str, ...]

    def refuse(self) -> None:
        which = (f"name its values instead: {', '.join(map(repr, self.leaves))}" if self.leaves
                 else "it holds none")
        raise KeyError(f"constraint on {self.position!r}: input {self.position} is no single value, so its position "
                       f"names none: {which}")


def parallelize(
    fn_or_module: Callable | torch.nn.Module,
    mesh: DeviceMesh,
    example_inputs: tuple,
    *,
    backward: bool = True,
    loss_fn: Callable | None = None,
    memory_budget: float | None = None,
    time_limit: float | None = None,
    solver: str = "ilp",
    cache: RuleCache | None = None,
    cost_model: planner.CostModel | None = None,
    constraints: dict | None = None,
    links: dict | None = None,
) -> Parallelized:
    """Capture, look up or explore every node's rules, plan on ``mesh``, and return a
    callable that runs the plan on DTensor (a module runs forward + backward).
    ``constraints``: DTensor placements already decided, by parameter name, input position,
    or for an input holding several tensors, each one's name (``"input 1[0]"``).
    ``links``: each named mesh axis's ``(seconds per message, bytes per second)``
    (``metaspmd.parallelize``'s)."""
    return runtime.parallelize(fn_or_module, mesh, example_inputs, backward=backward, loss_fn=loss_fn,
                               memory_budget=memory_budget, time_limit=time_limit, solver=solver, cache=cache,
                               cost_model=cost_model, constraints=constraints, links=links)


def _var_shapes(captured: Captured) -> dict[str, tuple[int, ...]]:
    """The shape of every graph var: the inputs' and every node's outputs'."""
    ir = captured.ir
    return {v.name: v.shape for v in (*ir.input_list, *(v for op in ir.op_list for v in op.outputs))}


def _constraint_placements(key: Any, value: Any, shape: tuple[int, ...], mesh_ndim: int) -> tuple:
    """A constraint's placements as metaspmd's, one per mesh axis; refused naming the key
    (the planner would name the graph var, which the user never wrote)."""
    if isinstance(value, (Placement, mp.Shard, mp.Partial, mp.Replicate)):
        if mesh_ndim != 1:
            raise TypeError(f"constraint on {key!r}: one placement {value!r}, but the mesh has {mesh_ndim} axes: "
                            "give one placement per mesh axis, as a tuple")
        value = (value,)
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"constraint on {key!r}: expected a tuple of placements, one per mesh axis, got "
                        f"{value!r} of type {type(value).__qualname__}")
    if len(value) != mesh_ndim:
        axes = "1 axis" if mesh_ndim == 1 else f"{mesh_ndim} axes"
        raise ValueError(f"constraint on {key!r}: {len(value)} placements {tuple(value)}, but the mesh has {axes}: "
                         "give one placement per mesh axis")
    return tuple(_constraint_placement(key, p, shape) for p in value)


def _constraint_placement(key: Any, p: Any, shape: tuple[int, ...]):
    """One mesh axis's placement as metaspmd's; a Shard's dim counted from the end where
    negative (DTensor's ``Shard(-1)``) and refused where the tensor has no such dim."""
    if isinstance(p, (Shard, mp.Shard)):
        dim = p.dim + len(shape) if p.dim < 0 else p.dim
        if not 0 <= dim < len(shape):
            raise ValueError(f"constraint on {key!r}: {p!r} names dim {p.dim}, but the value has shape {shape} "
                             f"({len(shape)} dims)")
        return mp.Shard(dim)
    try:
        return from_dtensor(p)
    except TypeError:
        raise TypeError(f"constraint on {key!r}: {p!r} is not a placement: pass Shard(dim), Replicate() or "
                        "Partial() of torch.distributed.tensor") from None
