"""Capture a torch module or function as MetaIR: its joint forward+backward ATen graph.

make_fx traces the function (and, for a module, ``torch.autograd.grad`` of a scalar loss
with respect to its parameters) into ATen ops, on fake tensors where it can (shapes only,
no arithmetic). An Interpreter run on the example inputs records every node's real
argument values, so ops missing from the rule table can be explored live on the very
shapes and values the model uses; it runs on first use only (a warm rule cache needs
shapes alone, which every node's ``meta["val"]`` has).

A module's buffers are graph inputs after its parameters. Where the model writes to them
(BatchNorm's running statistics in training), the graph is functionalized: the writes
become ops with outputs, which the rules cover like any other, and the new values are
extra graph outputs that the runtime writes back into the module. A graph with any other
in-place op (an LSTM's ``sigmoid_``, a backward's ``add_``, a model's ``relu_``) is
functionalized too: the plan may reshard a value into a copy before the op writes it.
A batched matmul traced as ``view(merge) -> bmm -> view(split)`` is put back as one
``aten.matmul`` on its unmerged operands (``batched_matmuls``), so heads stay a dim of
their own that a plan can cut.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import operator
import os
import re
import reprlib
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from metaspmd.ir import MetaIR, MetaOp, MetaVar, RecordedValues
from metaspmd.tensor_ops import TensorOps

from .batched_matmuls import unmerge_batched_matmuls
from .catalog import TORCH_NAMESPACES, op_name, positional_names
from .tensor_ops import TorchOps

_OPS: TensorOps = TorchOps()


@dataclass(frozen=True)
class Captured:
    """The graph, its MetaIR, and how the graph's inputs map to the caller's values."""

    ir: MetaIR
    gm: torch.fx.GraphModule
    param_names: tuple[str, ...]  # leading graph inputs, in order: the module's parameters
    n_user_inputs: int
    values: Mapping  # node name -> (args, kwargs) with the real example values (recorded on first use)
    n_outputs: int  # leading graph outputs that are the function's own outputs (then gradients)
    buffer_names: tuple[str, ...] = ()  # graph inputs after the parameters: the module's buffers
    updated_buffers: tuple[str, ...] = ()  # buffers the model writes; their new values are the last outputs
    inputs: tuple[TracedInput, ...] = ()  # the example inputs' leaves, as the trace took them
    input_structure: Any = None  # their pytree structure
    trainable: tuple[int, ...] = ()  # the parameters (by index) whose gradients are the outputs after n_outputs
    modes: tuple[tuple[str, bool], ...] = ()  # each submodule's name and ``training`` flag, as traced
    updated_inputs: tuple[int, ...] = ()  # input tensors (leaf indices) the model writes; new values last
    constants: tuple[HeldConstant, ...] = ()  # tensors the graph holds as constants, by name
    # (a second name, the first name) of each parameter or buffer the module holds under
    # several (tied weights: a head sharing the embedding's), which named_parameters() hides
    tied: tuple[tuple[str, str], ...] = ()

    @functools.cached_property
    def nodes(self) -> dict[str, torch.fx.Node]:
        """The graph's nodes by name (a MetaOp's name is its node's)."""
        return {n.name: n for n in self.gm.graph.nodes}

    def parameter_gradient_ties(self) -> list[tuple[str, str]]:
        """(parameter input, its gradient output) node names: a gradient is delivered in its
        parameter's placement. Empty when the graph has no backward."""
        grads = self.ir.output_list[self.n_outputs:]
        return [(self.ir.input_list[i].name, g.name) for i, g in zip(self.trainable, grads)]

    def all_gradients(self, grads: list) -> list:
        """``grads`` (of the trainable parameters) at every parameter's place, None at a
        frozen one's (as its ``.grad`` stays)."""
        full: list = [None] * len(self.param_names)
        for i, g in zip(self.trainable, grads):
            full[i] = g
        return full


@dataclass(frozen=True)
class TracedInput:
    """One leaf of the example inputs as the trace took it: a tensor of ``shape`` and
    ``dtype``, or (``dtype`` None) a ``value`` the graph holds as a constant."""

    name: str  # "input 1", "input 0['mask']"
    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    value: Any = None


@dataclass(frozen=True)
class HeldConstant:
    """A tensor the trace holds as a constant: a module's plain tensor attribute, or a
    variable a function closes over or reads as a global. ``current`` reads what the name
    holds now."""

    what: str  # "attribute 'mask'", "the variable 'w' the function reads"
    traced: torch.Tensor
    current: Callable[[], Any]


def held_constants(fn_or_module) -> tuple[HeldConstant, ...]:
    """The tensors the trace will take as constants, by name."""
    if isinstance(fn_or_module, torch.nn.Module):
        return tuple(HeldConstant(f"attribute {(m + '.' if m else '') + k!r}", v, functools.partial(_attribute, sub, k))
                     for m, sub in fn_or_module.named_modules() for k, v in vars(sub).items()
                     if isinstance(v, torch.Tensor))
    read = _variables_read(fn_or_module)
    tensors = tuple(HeldConstant(f"the variable {k!r} the function reads", v,
                                 functools.partial(_variable_read, fn_or_module, k))
                    for k, v in read.items() if isinstance(v, torch.Tensor))
    # a module the function calls: its parameters, buffers and tensor attributes are constants too
    return tensors + tuple(
        HeldConstant(f"{what} {(m + '.' if m else '') + k!r} of the module {name!r} the function reads", v,
                     functools.partial(_module_tensor, fn_or_module, name, m, k))
        for name, module in read.items() if isinstance(module, torch.nn.Module)
        for m, sub in module.named_modules()
        for what, held in (("parameter", sub._parameters), ("buffer", sub._buffers), ("attribute", vars(sub)))
        for k, v in held.items() if isinstance(v, torch.Tensor))


def _read_by(gm: torch.fx.GraphModule, constants: tuple[HeldConstant, ...]) -> tuple[HeldConstant, ...]:
    """Those of ``constants`` the graph holds (its ``get_attr`` tensors are the very
    tensors): an attribute the model never reads, or writes itself, is no constant of it."""
    held = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    storages = {t.untyped_storage().data_ptr() for t in held if isinstance(t, torch.Tensor) and t.device.type != "meta"}
    return tuple(c for c in constants if any(t is c.traced for t in held)
                 or c.traced.device.type != "meta" and c.traced.untyped_storage().data_ptr() in storages)


def _attribute(module: torch.nn.Module, name: str) -> Any:
    return vars(module).get(name)


def _variables_read(fn) -> dict[str, Any]:
    try:
        seen = inspect.getclosurevars(fn)
    except (TypeError, ValueError):  # a builtin, a callable object: the trace's check stands (_no_local_constants)
        return {}
    return {**seen.globals, **seen.nonlocals}


def _variable_read(fn, name: str) -> Any:
    return _variables_read(fn).get(name)


def _module_tensor(fn, name: str, path: str, key: str) -> Any:
    """What the module the function reads as ``name`` holds now at ``path`` as ``key``."""
    module = _variables_read(fn).get(name)
    try:
        sub = module.get_submodule(path) if path else module
    except AttributeError:  # the submodule is gone
        return None
    return sub._parameters.get(key, sub._buffers.get(key, vars(sub).get(key)))


def refuse_replaced_constants(captured: Captured) -> None:
    """Refuse, naming it, a call after a tensor the graph holds as a constant was replaced
    (``m.mask = new``): the plan would silently compute with the traced one. A constant
    changed in place is the same tensor, which the graph reads."""
    for c in captured.constants:
        if c.current() is not c.traced:
            raise ValueError(f"{c.what} was replaced since the plan was traced, and the graph holds the traced "
                             "tensor as a constant: register it as a buffer (module.register_buffer) or pass it as "
                             "an input, which each call reads, change it in place, or parallelize again")


def traced_inputs(example_inputs: tuple) -> tuple[tuple[TracedInput, ...], Any]:
    """The example inputs' leaves (``TracedInput``) and their pytree structure."""
    pairs, structure = torch.utils._pytree.tree_flatten_with_path(tuple(example_inputs))
    leaves = tuple(
        TracedInput(_input_name(path), tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor)
        else TracedInput(_input_name(path), None, None, x)
        for path, x in pairs)
    return leaves, structure


def _input_name(path: tuple) -> str:
    return f"input {path[0].idx}{torch.utils._pytree.keystr(path[1:])}"


def _refuse_other_structure(given: Any, planned: Any, where: str) -> None:
    """TypeError naming where two pytree structures (TreeSpecs) first differ."""
    def form(spec) -> tuple:
        return spec.type, spec.context, spec.num_children

    def described(spec) -> str:
        if spec.is_leaf():
            return "one value"
        if isinstance(spec.context, type):  # a namedtuple, its class the context
            return f"a {spec.context.__name__}"
        if spec.type is dict:
            return f"a dict with keys {list(spec.context)}"
        return f"a {getattr(spec.type, '__name__', spec.type)} of {spec.num_children}"

    if form(given) != form(planned):
        raise TypeError(f"{where} is {described(given)}, but the plan is for {described(planned)}")
    if planned.type is dict:
        keys = [f"[{k!r}]" for k in planned.context]
    elif isinstance(planned.context, type) and hasattr(planned.context, "_fields"):
        keys = [f".{f}" for f in planned.context._fields]
    else:
        keys = [f"[{i}]" for i in range(planned.num_children)]
    for key, a, b in zip(keys, given.children(), planned.children()):
        _refuse_other_structure(a, b, where + key)


def refuse_other_inputs(captured: Captured, inputs: tuple) -> None:
    """Refuse, naming the input, a call the plan does not hold for: another structure,
    shape or dtype than the example's, or another value where the example had a number,
    a string or None, which the trace baked into the graph as a constant (a scale of 2.0
    would silently stay 2.0)."""
    if len(inputs) != captured.n_user_inputs:
        raise TypeError(f"the plan takes {captured.n_user_inputs} inputs, got {len(inputs)}")
    leaves, structure = torch.utils._pytree.tree_flatten(tuple(inputs))
    if captured.input_structure is not None and structure != captured.input_structure:
        for i, (given, planned) in enumerate(zip(structure.children(), captured.input_structure.children())):
            _refuse_other_structure(given, planned, f"input {i}")
        # a difference the walk does not name (none it knows of): refused all the same
        raise TypeError(f"the inputs are structured as {structure}, but the plan is for {captured.input_structure}")
    again = "parallelize again for"
    for traced, x in zip(captured.inputs, leaves):
        refuse_unplannable(traced.name, x)
        if traced.dtype is None:
            if isinstance(x, torch.Tensor) or type(x) is not type(traced.value) or not _same(x, traced.value):
                raise ValueError(f"{traced.name} is {_shown(x)}, but the plan was traced with {traced.value!r}, "
                                 f"which the graph holds as a constant: {again} this value, or pass it as a tensor")
        elif not isinstance(x, torch.Tensor):
            raise TypeError(f"{traced.name} is {_shown(x)}, but the plan was traced with a tensor there")
        elif tuple(x.shape) != traced.shape:
            raise ValueError(f"{traced.name}: shape {tuple(x.shape)}, but the plan is for {traced.shape}: "
                             f"{again} these shapes")
        elif x.dtype != traced.dtype:
            raise TypeError(f"{traced.name}: dtype {x.dtype}, but the plan is for {traced.dtype}: {again} this dtype")
        else:
            _refuse_ranks_that_differ(traced.name, x)
    refuse_aliased_writes(captured.updated_inputs, captured.inputs, leaves)


def _refuse_ranks_that_differ(name: str, x: torch.Tensor) -> None:
    """Refuse an input made inside LocalTensorMode whose simulated ranks hold different
    values (``torch.randn(..., generator=g)`` draws one batch per rank): the plan places
    rank 0's values, as ``distribute_tensor`` does, and would silently drop the others'."""
    if not _is_local_tensor(x):
        return
    ranks = dict(x._local_tensors)
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        first, *others = (ranks[r] for r in sorted(ranks))
        differ = [r for r, t in zip(sorted(ranks)[1:], others) if not _same_values(first, t)]
    if differ:
        raise ValueError(f"{name} holds other values on simulated rank {differ[0]} than on rank {min(ranks)} (a "
                         "tensor made inside LocalTensorMode, drawn once per rank): the plan places one global "
                         "tensor, rank 0's, as distribute_tensor does. Pass the same values on every rank: make the "
                         "batch outside LocalTensorMode")


def _is_local_tensor(x: Any) -> bool:
    """A tensor made inside LocalTensorMode, one tensor per simulated rank."""
    try:
        from torch.distributed._local_tensor import LocalTensor
    except ImportError:  # a torch without it
        return False
    return isinstance(x, LocalTensor)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element by element, NaN where the other has NaN."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def refuse_aliased_writes(written: Sequence[int], traced: Sequence[TracedInput], leaves: Sequence[Any]) -> None:
    """Refuse, naming both, an input the model writes in place that shares memory with
    another input (``f(x, x)``, a view of it): eager reads the write through the other, the
    plan places each input apart and would not."""
    def storage(x: Any) -> int | None:
        return x.untyped_storage().data_ptr() if isinstance(x, torch.Tensor) and x.device.type != "meta" else None

    for i in written:
        mine = storage(leaves[i])
        other = next((j for j, y in enumerate(leaves) if j != i and storage(y) == mine), None) if mine else None
        if other is not None:
            raise ValueError(f"{traced[i].name} and {traced[other].name} share memory (one tensor, or views of one), "
                             f"and the model writes {traced[i].name} in place: eager would read that write through "
                             f"{traced[other].name}, a plan places them apart. Pass separate tensors (.clone())")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) or (a != a and b != b)  # nan traced, nan given
    except Exception:  # noqa: BLE001 - a value without a plain comparison
        return a is b


def _shown(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # a numpy array: not printed whole
        return f"a {type(x).__module__.split('.')[0]}.{type(x).__qualname__} of shape {tuple(x.shape)}"
    return reprlib.repr(x)


def _dtype(x: torch.Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


def _joint(module: torch.nn.Module, loss_fn: Callable[[Any], torch.Tensor] | None, names: list[str],
           buffer_names: list[str], trainable: tuple[int, ...]):
    def joint(params: list[torch.Tensor], buffers: list[torch.Tensor], *inputs):
        state = {**dict(zip(names, params)), **dict(zip(buffer_names, buffers))}
        out = torch.func.functional_call(module, state, inputs)
        if loss_fn is None and not isinstance(out, torch.Tensor):
            raise TypeError(f"{type(module).__qualname__} returns a {type(out).__qualname__}, not a tensor, so the "
                            "default loss out.sum() does not apply: pass loss_fn= (output -> scalar loss tensor), "
                            "or backward=False to plan the forward only")
        loss = loss_fn(out) if loss_fn is not None else out.sum()
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss_fn returned a {type(loss).__qualname__}, not a tensor")
        if loss.is_complex():  # autograd's gradient of a complex loss is no gradient descent step
            raise TypeError(f"{'loss_fn' if loss_fn is not None else 'the default loss, out.sum(),'} is complex "
                            f"({_dtype(loss)}): return a real loss (.real, .abs())")
        if loss.dim() != 0:  # autograd would seed it with ones: the gradient of its sum, unasked
            raise ValueError(f"loss_fn returned a tensor of shape {tuple(loss.shape)}, not a scalar: reduce it "
                             "(.sum(), .mean()) to the loss to differentiate")
        if not loss.requires_grad:
            _no_gradient(module, out, loss, loss_fn)
        # The seed gradient d(loss)/d(loss) is the constant 1. autograd's default seed,
        # ones_like(loss), traces as a node that reads the loss, so a plan that shards the
        # batch would have to all-reduce the (Partial) loss just to learn its shape; a
        # factory op depends on nothing. Same values, one data dependency less.
        seed = torch.ones(loss.shape, dtype=loss.dtype, device=loss.device)
        # a parameter the forward does not use gets zeros, as its gradient is
        grads = torch.autograd.grad(loss, [params[i] for i in trainable], grad_outputs=seed, allow_unused=True,
                                    materialize_grads=True)
        return out, list(grads)

    return joint


def _no_gradient(module: torch.nn.Module, out: Any, loss: torch.Tensor, loss_fn: Callable | None) -> None:
    """Raise, naming why, where the loss carries no gradient (autograd would only say that
    "element 0 of tensors does not require grad")."""
    name, forward = type(module).__qualname__, "pass backward=False to plan its forward only"
    if not torch.is_grad_enabled():
        raise RuntimeError(f"gradients are off where {name} was captured (torch.no_grad() or torch.inference_mode()): "
                           f"call parallelize outside it, or {forward}")
    floating = loss.is_floating_point() or loss.is_complex()
    if loss_fn is None and not floating:
        raise TypeError(f"{name} returns an integer tensor ({out.dtype}), which carries no gradient, so the default "
                        f"loss out.sum() has none to compute: {forward}")
    if loss_fn is None:
        raise ValueError(f"{name}'s output does not require grad (its forward reads none of its parameters, or "
                         f"computes under torch.no_grad() or from detached values), so the default loss out.sum() "
                         f"has no gradient to compute: {forward}")
    what = f"an integer tensor ({loss.dtype})" if not floating else "a tensor that does not require grad"
    raise TypeError(f"loss_fn returned {what}, so there is no gradient to compute: return a float scalar computed "
                    f"from {name}'s float outputs, or {forward}")


def capture(
    fn_or_module: Callable | torch.nn.Module,
    example_inputs: tuple,
    *,
    backward: bool = True,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> Captured:
    """Trace to ATen; a module traces forward + backward (gradients of ``loss_fn(out)``,
    default ``out.sum()``) unless ``backward=False``.

    Traced without oneDNN: its fused RNN layer (``mkldnn_rnn_layer`` and its backward)
    hands the backward a workspace that the trace records as None, so the graph cannot run
    again; without it, ``nn.LSTM`` and ``nn.GRU`` trace into matmuls and pointwise ops,
    which have rules and shard."""
    constants = held_constants(fn_or_module)
    _check_inputs(fn_or_module, example_inputs, backward, loss_fn, constants)
    with warnings.catch_warnings():  # switching oneDNN's flags warns about Intel GPUs
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False), callers_generators_kept():
            try:
                captured = _capture(fn_or_module, example_inputs, backward, loss_fn)
                return dataclasses.replace(captured, constants=_read_by(captured.gm, constants))
            except _ModelFailed as err:
                raise RuntimeError(graph_failure(fn_or_module, example_inputs, str(err))) from err.__cause__


class _ModelFailed(RuntimeError):
    """The model itself raised while it was traced on its example inputs (``_make_fx``)."""


def graph_failure(fn_or_module, example_inputs: tuple, message: str) -> str:
    """An op's error while the model's graph ran (traced, recorded or planned), as the model
    (None: a function planned), its inputs and the op: the FX page it comes with (the node,
    "Use tlparse") names no input."""
    first, _, rest = message.partition("\n\nWhile executing")
    node = re.search(r"target=torch\.ops\.([\w.]+)", rest)
    what = (type(fn_or_module).__qualname__ if isinstance(fn_or_module, torch.nn.Module)
            else "the function" if fn_or_module is None else getattr(fn_or_module, "__qualname__", repr(fn_or_module)))
    leaves = torch.utils._pytree.tree_leaves(list(example_inputs))
    inputs = ", ".join(f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}" if isinstance(x, torch.Tensor)
                       else type(x).__name__ for x in leaves)
    params = ""
    if isinstance(fn_or_module, torch.nn.Module):
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in fn_or_module.parameters()})
        params = f" and {'/'.join(dtypes)} parameters" if dtypes else ""
    at = f" at {node.group(1)}" if node else ""
    return f"{what} fails on its inputs ({inputs}){params}{at}: {first.strip()}"


def callers_generators_kept():
    """A context that gives the caller's random generators back as they were: tracing and
    recording run the model's dropout, and a program that plans before it trains draws the
    same masks as one that does not. The CPU generator, and the GPUs' once CUDA is in use."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else [])


def _check_inputs(fn_or_module, example_inputs: tuple, backward: bool, loss_fn: Any = None,
                  constants: tuple[HeldConstant, ...] = ()) -> None:
    """Refuse, naming the value, what would fail deep inside make_fx or autograd."""
    if not callable(fn_or_module):
        raise TypeError(f"parallelize takes a torch.nn.Module or a function of the example inputs, got "
                        f"{fn_or_module!r}")
    if isinstance(fn_or_module, type) and issubclass(fn_or_module, torch.nn.Module):
        raise TypeError(f"parallelize takes a module, got the class {fn_or_module.__qualname__}: pass an instance, "
                        f"{fn_or_module.__qualname__}(...)")
    # torch.compile's wrapper, which FX cannot trace (its message speaks of dynamo, not of the model)
    if isinstance(getattr(fn_or_module, "_orig_mod", None), torch.nn.Module):
        raise TypeError(f"parallelize takes the module itself, got torch.compile's wrapper of a "
                        f"{type(fn_or_module._orig_mod).__qualname__}: pass model._orig_mod (and compile the "
                        "parallelized model, if you will)")
    if not isinstance(example_inputs, (tuple, list)):
        raise TypeError("example_inputs must be a tuple of positional arguments, got a "
                        f"{type(example_inputs).__qualname__} (for one input write (x,))")
    if loss_fn is not None and not isinstance(fn_or_module, torch.nn.Module):
        raise TypeError("loss_fn applies to a module, whose parameters get gradients: a function has none, and its "
                        "forward is planned as it is; compute the loss inside the function")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError("loss_fn must be callable (a function of the model's output, returning a scalar tensor), "
                        f"got {loss_fn!r}")
    if loss_fn is not None and not backward:
        raise ValueError("loss_fn is the loss the backward differentiates, but backward=False plans the forward "
                         "only: drop loss_fn, or pass backward=True")
    values = [(f"example input {i}", x) for i, x in enumerate(torch.utils._pytree.tree_leaves(list(example_inputs)))]
    if isinstance(fn_or_module, torch.nn.Module):
        values += [(f"parameter {n!r}", p) for n, p in fn_or_module.named_parameters()]
        values += [(f"buffer {n!r}", b) for n, b in fn_or_module.named_buffers()]
        if backward and next(fn_or_module.parameters(), None) is None:
            raise ValueError(f"{type(fn_or_module).__qualname__} has no parameters, so there are no gradients to "
                             "compute: pass backward=False to plan its forward only")
        if backward and not any(p.requires_grad for p in fn_or_module.parameters()):
            raise ValueError(f"every parameter of {type(fn_or_module).__qualname__} is frozen (requires_grad=False), "
                             "so there are no gradients to compute: pass backward=False to plan its forward only")
    for what, x in values:
        refuse_unplannable(what, x)
    values += [(c.what, c.traced) for c in constants]
    for what, x in values:
        # a LocalTensor holds one tensor per simulated rank; tracing it recurses without end
        if _is_local_tensor(x):
            raise TypeError(f"{what} is a LocalTensor (made inside LocalTensorMode): create the model and its "
                            "example inputs outside the mode; only calling the parallelized model needs it")
        _refuse_placed(what, x)


def refuse_unplannable(what: str, x: Any) -> None:
    """Refuse, naming it, a value the plan neither traces nor runs on: a JAX array, a
    module (its tensors would be baked into the graph, and a later change not seen), a
    sparse, meta-device or DTensor tensor."""
    if type(x).__module__.split(".")[0] in ("jax", "jaxlib"):
        raise TypeError(f"{what} is a JAX array: a torch DeviceMesh plans torch modules and functions of torch "
                        "tensors; plan a JAX function on a jax.sharding.Mesh")
    if isinstance(x, torch.nn.Module):
        raise TypeError(f"{what} is a module ({type(x).__qualname__}): its tensors would be baked into the plan as "
                        "constants. Parallelize the module itself, parallelize(module, mesh, inputs), or pass its "
                        "tensors as inputs")
    if isinstance(x, torch.Tensor) and x.layout != torch.strided:
        raise TypeError(f"{what} is a {str(x.layout).removeprefix('torch.')} tensor: parallelize plans dense "
                        "tensors; pass x.to_dense() and keep the sparse form inside the model")
    if isinstance(x, torch.Tensor) and x.is_meta:
        raise TypeError(f"{what} is on the meta device, which holds no values to plan and check with: pass "
                        "real tensors (the planner's one-device check runs the model on them)")
    _refuse_placed(what, x)


def _refuse_placed(what: str, x: Any) -> None:
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):  # the plan places every value itself
        raise TypeError(f"{what} is a DTensor (placed already): pass the model and its inputs with plain tensors "
                        "(DTensor.full_tensor()); constraints= keeps placements you have decided")


def _capture(fn_or_module: Callable | torch.nn.Module, example_inputs: tuple, backward: bool,
             loss_fn: Callable[[Any], torch.Tensor] | None) -> Captured:
    traced, structure = traced_inputs(example_inputs)
    # Tracing (on real values where fake ones fail) and recording run the model, which may
    # write its inputs: each runs on fresh copies, and the caller's example stays as it was.
    if not isinstance(fn_or_module, torch.nn.Module):
        gm = _make_fx(fn_or_module, _input_copies(example_inputs))
        _draws_in_memory_order(gm)
        _, written_inputs = _written(gm, [], 0)
        refuse_aliased_writes(written_inputs, traced, torch.utils._pytree.tree_leaves(tuple(example_inputs)))
        if written_inputs or _mutates(gm):
            gm = _functionalized_function(gm, written_inputs, _input_copies(example_inputs))
        unmerge_batched_matmuls(gm)
        values = recorded_values(gm, torch.utils._pytree.tree_leaves(_input_copies(example_inputs)), fn_or_module,
                                 example_inputs)
        ir = to_metair(gm)
        return Captured(ir, gm, (), len(example_inputs), values, len(ir.output_list) - len(written_inputs),
                        inputs=traced, input_structure=structure, updated_inputs=tuple(written_inputs))
    module = fn_or_module
    names = [n for n, _ in module.named_parameters()]
    buffer_names = [n for n, _ in module.named_buffers()]
    # frozen parameters (requires_grad=False) get no gradient: none is traced, planned or returned
    params = [p.detach().requires_grad_(p.requires_grad) for _, p in module.named_parameters()]
    trainable = tuple(i for i, p in enumerate(params) if p.requires_grad) if backward else ()
    if backward:
        fn = _joint(module, loss_fn, names, buffer_names, trainable)
    else:
        def fn(params, buffers, *inputs):
            state = {**dict(zip(names, params)), **dict(zip(buffer_names, buffers))}
            return torch.func.functional_call(module, state, inputs)
    with _module_state_kept(module):
        gm = _make_fx(fn, (params, _buffer_copies(module), *_input_copies(example_inputs)),
                      decomposition_table=_DECLARED_WRITES)
    _draws_in_memory_order(gm)
    written, written_inputs = _written(gm, names, len(buffer_names))
    refuse_aliased_writes(written_inputs, traced, torch.utils._pytree.tree_leaves(tuple(example_inputs)))
    if written or written_inputs or _mutates(gm):
        gm = _functionalized(gm, written, written_inputs, params, _buffer_copies(module),
                             _input_copies(example_inputs))
    if backward:
        # The loss itself is no output (only its gradients are): drop it and anything
        # else nothing reads. The traced ATen graph is functional, so this is exact, but for
        # ops run for their effect alone (torch._assert_async's check).
        gm.graph.eliminate_dead_code(is_impure_node=_run_for_its_effect)
        gm.recompile()
    unmerge_batched_matmuls(gm)
    values = recorded_values(gm, [p.detach() for p in params] + _buffer_copies(module)
                             + torch.utils._pytree.tree_leaves(_input_copies(example_inputs)), module, example_inputs)
    ir = to_metair(gm)
    n_outputs = 1 if backward else len(ir.output_list) - len(written) - len(written_inputs)
    updated = tuple(buffer_names[i] for i in written)
    return Captured(ir, gm, tuple(names), len(example_inputs), values, n_outputs, tuple(buffer_names), updated,
                    traced, structure, trainable, training_modes(module), tuple(written_inputs),
                    tied=_tied_names(module))


def _tied_names(module: torch.nn.Module) -> tuple[tuple[str, str], ...]:
    """(a second name, the first name) of each tensor the module holds under several names."""
    tied = []
    for named in (module.named_parameters, module.named_buffers):
        first: dict[int, str] = {}
        for name, t in named(remove_duplicate=False):
            if id(t) in first:
                tied.append((name, first[id(t)]))
            else:
                first[id(t)] = name
    return tuple(tied)


def _run_for_its_effect(node: torch.fx.Node) -> bool:
    """Is ``node`` kept though nothing reads it? fx's own list of side-effectful calls has
    ``aten._assert_async.msg`` but not ``.default``: any op that returns nothing runs for
    its effect (an error on bad values) alone."""
    return node.is_impure() or (isinstance(node.target, torch._ops.OpOverload)
                                and not node.target._schema.returns)


def training_modes(module: torch.nn.Module) -> tuple[tuple[str, bool], ...]:
    """Each submodule's name (the module itself as its class) and ``training`` flag."""
    return tuple((name or type(module).__qualname__, m.training) for name, m in module.named_modules())


def current_state(captured: Captured, module: torch.nn.Module) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The module's parameters (detached) and buffers as a call finds them, in the trace's
    order: an optimizer's step in place, ``load_state_dict``, and a parameter or buffer
    replaced (``m.weight = nn.Parameter(w)``, ``model.to()``) are all seen. Refused, naming
    it, where one is no longer what the plan was traced for: another set of names, shape,
    dtype, ``requires_grad``, or train or eval mode."""
    refuse_other_modes(captured, module)
    again = "parallelize again for the module as it is now"
    params, buffers = dict(module.named_parameters()), dict(module.named_buffers())
    for what, now, traced in (("parameters", params, captured.param_names),
                              ("buffers", buffers, captured.buffer_names)):
        if tuple(now) != tuple(traced):
            raise ValueError(f"the module's {what} are now {sorted(now)}, but the plan was traced with "
                             f"{sorted(traced)}: {again}")
    names = (*captured.param_names, *captured.buffer_names)
    for name, x, v in zip(names, (*params.values(), *buffers.values()), captured.ir.input_list):
        if tuple(x.shape) != v.shape or _dtype(x) != v.dtype:
            raise ValueError(f"{name!r} is now {_dtype(x)}{list(x.shape)}, but the plan was traced with "
                             f"{v.dtype}{list(v.shape)}: {again}")
    if captured.trainable:
        trainable = tuple(i for i, p in enumerate(params.values()) if p.requires_grad)
        if trainable != captured.trainable:
            changed = sorted(captured.param_names[i] for i in set(trainable) ^ set(captured.trainable))
            raise ValueError(f"requires_grad changed on {changed} since the plan was traced (frozen parameters "
                             f"are neither traced nor planned): {again}")
    return [p.detach() for p in params.values()], buffers


def refuse_other_modes(captured: Captured, module: torch.nn.Module) -> None:
    """Refuse a call after ``model.train()`` or ``model.eval()`` changed a mode the trace
    took: the graph holds train mode's batch statistics and dropout, or eval mode's
    running statistics, whichever was traced."""
    now = dict(training_modes(module))
    for name, traced in captured.modes:
        if now.get(name, traced) != traced:
            mode = {True: "training", False: "eval"}
            raise ValueError(f"module {name!r} is in {mode[now[name]]} mode, but the plan was traced in "
                             f"{mode[traced]} mode: parallelize again after model.train() or model.eval() "
                             "(one parallelized model per mode)")


def _make_fx(fn: Callable, args: tuple, **kwargs) -> torch.fx.GraphModule:
    """make_fx on fake tensors: the same graph as a real trace, without computing any value
    (the real trace's arithmetic, and the fake copy of every value it records as the node's
    ``meta["val"]``, were most of a GPT's capture). A real tensor the model holds as a
    constant (a closure's labels, a plain attribute) is kept as one, as the real trace keeps
    it: on the real values, the value checks some kernels make (``one_hot``'s range) would
    read a traced tensor. What fake tensors cannot trace (an op whose output shape depends
    on values) is traced on the real values as before; a refusal of metaspmd's own (a
    model output the default loss cannot take) holds on either and is raised as it is:
    on real values the model may fail first on another path (Hugging Face models read a
    value where the tensors are not fake)."""
    fn = _value_checks_kept(fn)
    try:
        with _fake_kernel_errors_unlogged():
            traced = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True, **kwargs)(*args)
            return _no_local_constants(traced)
    except (TypeError, ValueError) as err:
        if _raised_by_us(err):
            raise
    except Exception:  # noqa: BLE001 - the real trace raises the error that matters, if any
        pass
    try:
        return _no_local_constants(make_fx(fn, **kwargs)(*args))
    except RuntimeError as err:
        if type(err) is not RuntimeError:  # the model's own class (NotImplementedError, ...): as it is
            raise
        if "get value out of a tracing tensor" not in str(err):
            raise _ModelFailed(str(err)) from err
        # Python that branches on a tensor's value (``if y.sum() > 0``) or slices by one
        # (``cache[:pos[0]]``): make_fx's own advice (tracing_mode='symbolic') is not the user's
        raise ValueError("the model reads a tensor's value into Python while it is traced (an if or a loop on a "
                         f"tensor, a slice bound or a size taken from one){_reading_line(err)}: parallelize plans "
                         "one graph for every call, so keep the choice in tensors (torch.where, masks) or pass such "
                         "values as Python numbers") from err


_ONE_HOT = inspect.signature(lambda tensor, num_classes=-1: None)  # torch.nn.functional.one_hot's (a builtin)


class _ValueChecks(torch.overrides.TorchFunctionMode):
    """Writes into the graph the value checks a kernel makes in C++ and the trace leaves out:
    ``one_hot`` checks its classes' range on the values, which a fake trace cannot read, so
    it traced the arithmetic alone (``eq(unsqueeze(x), arange(n))``), and classes out of
    range gave rows of zeros instead of an error."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.one_hot:
            bound = _ONE_HOT.bind(*args, **kwargs).arguments
            x, n = bound["tensor"], bound.get("num_classes", -1)
            if isinstance(x, torch.Tensor) and isinstance(n, int) and n >= 0:  # -1: n read off the values
                torch.ops.aten._assert_async.msg(((x >= 0) & (x < n)).all(),
                                                 f"one_hot: class values must be in [0, {n})")
        return func(*args, **kwargs)


def _value_checks_kept(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def checked(*args):
        with _ValueChecks():
            return fn(*args)

    return checked


_TORCH_DIR = os.path.dirname(torch.__file__)
_LAYERS = tuple(os.path.join(_TORCH_DIR, "nn", part) for part in ("modules", "functional.py"))
_BACKENDS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # metaspmd's own frames (the joint loss)


def _raised_by_us(err: BaseException) -> bool:
    """Was ``err`` raised by metaspmd's own code (a check of the traced function's output),
    not by the model, its loss or torch?"""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_BACKENDS_DIR + os.sep)


def _reading_line(err: BaseException) -> str:
    """Where the model read the value: the innermost line of its own code or of a torch
    layer (``BatchNorm``'s ``float(self.num_batches_tracked)`` with ``momentum=None``), not
    of torch's tracing machinery."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        ours = frame.filename.startswith(_BACKENDS_DIR)
        machinery = frame.filename.startswith(_TORCH_DIR) and (not frame.filename.startswith(_LAYERS)
                                                              or frame.filename.endswith("module.py"))
        if not ours and not machinery:
            where = os.path.relpath(frame.filename, os.path.dirname(_TORCH_DIR)) \
                if frame.filename.startswith(_TORCH_DIR) else frame.filename
            return f", at {where}:{frame.lineno} in {frame.name}" + (f": {frame.line}" if frame.line else "")
    return ""


def _no_local_constants(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm``, unless it holds a LocalTensor as a constant: a tensor made inside
    LocalTensorMode that the model reads as an attribute or a closure's variable (not a
    parameter, buffer or input, which ``_check_inputs`` names) computes per simulated rank
    outside the trace, and the graph would give its example output whatever the input."""
    for node in gm.graph.nodes:
        if node.op == "get_attr" and _is_local_tensor(getattr(gm, node.target, None)):
            raise TypeError("the model reads a LocalTensor (a tensor made inside LocalTensorMode) that is neither a "
                            "parameter, a buffer nor an example input: an attribute or a variable it closes over. "
                            "Create it outside the mode; only calling the parallelized model needs it")
    return gm


@contextlib.contextmanager
def _fake_kernel_errors_unlogged():
    """FakeTensorMode logs a page of traceback for a meta kernel that raises (a wrong input
    shape) before raising it; the real trace after it says what matters."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def _module_state_kept(module: torch.nn.Module):
    """Every submodule's parameters, buffers and plain tensor attributes given back as they
    were, whatever tracing did to them: ``functional_call`` restores a submodule registered
    under two names (``self.a = self.b = layer``) with the traced (fake) tensors it swapped
    in, and a forward that keeps a result (``self.last = y.detach()``) would leave a traced one."""
    def tensors(m):
        return {k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)}

    saved = [(m, dict(m._parameters), dict(m._buffers), tensors(m)) for m in module.modules()]
    try:
        yield
    finally:
        for m, parameters, buffers, attributes in saved:
            m._parameters.clear()
            m._parameters.update(parameters)
            m._buffers.clear()
            m._buffers.update(buffers)
            for k in tensors(m).keys() - attributes.keys():  # made by the trace
                delattr(m, k)
            for k, v in attributes.items():
                setattr(m, k, v)


def _buffer_copies(module: torch.nn.Module) -> list[torch.Tensor]:
    """Tracing and recording run the model, which may write its buffers: they run on copies
    (and on copies of the example inputs, ``_input_copies``)."""
    return [b.detach().clone() for b in module.buffers()]


def _input_copies(example_inputs: tuple) -> tuple:
    """The example inputs with each tensor copied, requiring grad as it does."""
    def copy(x):
        return x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x

    return torch.utils._pytree.tree_map(copy, tuple(example_inputs))


def _batch_norm_declaring_writes(input, weight, bias, running_mean, running_var, training, momentum, eps):
    # native_batch_norm updates the running statistics without declaring it in its schema,
    # so functionalization cannot see the writes; _native_batch_norm_legit is the same
    # kernel with the writes declared (Tensor(a!)).
    aten = torch.ops.aten
    if running_mean is None or running_var is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    if not training:  # reads the running statistics, writes nothing
        return aten._native_batch_norm_legit_no_training.default(
            input, weight, bias, running_mean, running_var, momentum, eps)
    return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, training, momentum, eps)


_DECLARED_WRITES = {torch.ops.aten.native_batch_norm.default: _batch_norm_declaring_writes}


def _written(gm: torch.fx.GraphModule, names: list[str], n_buffers: int) -> tuple[list[int], list[int]]:
    """The buffers (by index) and the user inputs' tensors (by leaf index) that some op of
    ``gm`` writes in place (by its schema), directly or through a view of one; a write into
    a parameter (``names``, the leading inputs) is refused, naming it: the plan writes
    buffers and inputs back, as eager would leave them, and parameters are the caller's."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = {node: name for node, name in zip(placeholders, names)}
    buffers = {node: i for i, node in enumerate(placeholders[len(names):len(names) + n_buffers])}
    inputs = {node: i for i, node in enumerate(placeholders[len(names) + n_buffers:])}
    base = {node: node for node in placeholders}  # a view's (detach, select, view) input it aliases
    written, written_inputs = set(), set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        returned = schema.returns[0].alias_info if len(schema.returns) == 1 else None
        for arg, value in zip(schema.arguments, node.args):
            if returned is not None and arg.alias_info is not None and value in base and (
                    set(arg.alias_info.before_set) & set(returned.before_set)):
                base[node] = base[value]  # a write into node is a write into the placeholder
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = base.get(value, value)
            if value in params:
                what = f"the forward writes parameter {params[value]!r} in place ({op_name(node.target)}"
                if node.target is torch.ops.aten.embedding_renorm_.default:
                    raise ValueError(f"{what}: nn.Embedding(max_norm=...) renormalizes its weight so), which a plan "
                                     "does not write back: renormalize outside the model under torch.no_grad, or "
                                     "pass no max_norm")
                raise ValueError(f"{what}), which a plan does not write back (it returns gradients, and writes back "
                                 "buffers and inputs only): update parameters outside the forward, or keep the "
                                 "value in a buffer (register_buffer)")
            if value in buffers:
                written.add(buffers[value])
            if value in inputs:
                written_inputs.add(inputs[value])
    return sorted(written), sorted(written_inputs)


def _draws_in_memory_order(gm: torch.fx.GraphModule) -> None:
    """Put each ``bernoulli_(p)`` of a strided tensor (eager dropout's noise on the CPU:
    ``empty_like`` of a transposed activation) on the view of it that lists its elements in
    memory order. Eager draws in memory order; ``functionalize`` makes the write a
    ``bernoulli.p``, which draws into a contiguous tensor, in index order: another mask
    under the same generator state (the other random fills keep the layout). On that view
    the functional draw is in memory order too, and the mask is eager's."""
    moved = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.bernoulli_.float:
            continue
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.is_contiguous():
            continue
        order = sorted(range(val.dim()), key=lambda d: -val.stride(d))
        if not val.permute(order).is_contiguous():
            continue  # not dense: no view lists it in memory order
        with gm.graph.inserting_before(node):
            view = gm.graph.call_function(torch.ops.aten.permute.default, (node.args[0], order))
        view.meta["val"] = val.permute(order)
        node.replace_all_uses_with(node.args[0])  # the write returns the tensor it wrote
        node.args = (view, *node.args[1:])
        moved = True
    if moved:
        gm.recompile()


def _mutates(gm: torch.fx.GraphModule) -> bool:
    """Some op of ``gm`` writes in place (an LSTM's ``sigmoid_``, a backward's ``add_``).
    The graph then reads a value by the node that made it before the write; the plan,
    which may reshard that value into a copy first, would write the copy instead.
    A custom op that writes in place is refused, naming it: functionalize, which removes
    the writes, cannot rewrite one (its error speaks of alias annotations)."""
    writers = [node.target for node in gm.graph.nodes if node.op == "call_function"
               and isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable]
    custom = next((op for op in writers if op.namespace not in ("aten", "prims")), None)
    if custom is not None:
        raise ValueError(f"the custom op {custom.name()} writes its input in place (mutates_args): parallelize "
                         "plans a graph without in-place writes, and torch cannot rewrite a custom op's; give the "
                         "op a form that returns the new value instead (mutates_args=())")
    return bool(writers)


def _functionalized(gm, written: list[int], written_inputs: list[int], params, buffers,
                    example_inputs) -> torch.fx.GraphModule:
    """``gm`` retraced without in-place writes: it returns (its outputs, the new values of the
    written buffers, then of the written inputs' tensors), or just its outputs where it
    writes neither. ``gm`` is plain ATen by now (autograd already traced), which
    ``functionalize`` composes with."""
    def with_updates(params, buffers, *inputs):
        out = gm(params, buffers, *inputs)
        leaves = torch.utils._pytree.tree_leaves(inputs)
        updates = [buffers[i] for i in written] + [leaves[i] for i in written_inputs]
        return (out, updates) if updates else out

    return _without_writes_back(_make_fx(torch.func.functionalize(with_updates, remove="mutations"),
                                         ([p.detach() for p in params], buffers, *example_inputs)))


def _functionalized_function(gm, written_inputs: list[int], example_inputs) -> torch.fx.GraphModule:
    """A function's ``gm`` retraced without in-place writes: (its outputs, the new values of
    the written inputs' tensors), or just its outputs where it writes no input."""
    def with_updates(*inputs):
        out = gm(*inputs)
        leaves = torch.utils._pytree.tree_leaves(inputs)
        return (out, [leaves[i] for i in written_inputs]) if written_inputs else out

    return _without_writes_back(_make_fx(torch.func.functionalize(with_updates, remove="mutations"),
                                         example_inputs))


def _without_writes_back(functional: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The new values are outputs now; the copies back into the inputs that functionalize
    appends are the writes themselves, which the runtime does instead (on the caller's
    tensors, after the planned run)."""
    placeholders = {n for n in functional.graph.nodes if n.op == "placeholder"}
    for node in list(functional.graph.nodes):
        if node.target is torch.ops.aten.copy_.default and node.args[0] in placeholders and not node.users:
            functional.graph.erase_node(node)
    functional.recompile()
    return functional


def recorded_values(gm: torch.fx.GraphModule, flat_inputs: list, fn_or_module: Any = None,
                    example_inputs: tuple = ()) -> RecordedValues:
    """node name -> (args, kwargs) with the real example values, recorded by running the
    graph once on first access (``metaspmd.ir.RecordedValues``). Recorded outside any mode
    the caller is in (LocalTensorMode), without oneDNN, as the graph was traced, and with
    the caller's generators given back after. An op that fails on the real values (a dtype
    mismatch that the trace's fake tensors let pass) is named with ``fn_or_module`` and its
    ``example_inputs``."""

    def record() -> dict:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
            with torch.backends.mkldnn.flags(enabled=False), callers_generators_kept():
                try:
                    return _record_values(gm, flat_inputs)
                except RuntimeError as err:
                    if fn_or_module is None or "\n\nWhile executing" not in str(err):
                        raise
                    raise RuntimeError(graph_failure(fn_or_module, example_inputs, str(err))) from err

    return RecordedValues(record)


def _record_values(gm: torch.fx.GraphModule, flat_inputs: list) -> dict:
    values: dict = {}

    class Recorder(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            if isinstance(target, torch._ops.OpOverload):
                values[self._current.name] = (args, kwargs)
            out = super().call_function(target, args, kwargs)
            if isinstance(target, torch._ops.OpOverload) and target.namespace not in TORCH_NAMESPACES:
                _check_fake_kernel(target, self._current, out)
            return out

        def run_node(self, n):
            self._current = n
            return super().run_node(n)

    with torch.no_grad():
        Recorder(gm).run(*flat_inputs)
    return values


def _check_fake_kernel(op: torch._ops.OpOverload, node: torch.fx.Node, out: Any) -> None:
    """A user's op whose fake kernel (``register_fake``) disagrees with its real one on the
    example: the plan is made from the traced (fake) shapes and the rules from the real
    ones, so the run would fail later, deep in DTensor, without naming the op."""
    def described(leaves: list) -> list[str]:
        return [f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__ for x in leaves]

    if "val" not in node.meta:
        return
    fake = torch.utils._pytree.tree_leaves(node.meta["val"])
    real = torch.utils._pytree.tree_leaves(out)
    tensors = [(f, r) for f, r in zip(fake, real) if isinstance(f, torch.Tensor)]
    if not all(isinstance(d, int) for f, _ in tensors for d in f.shape):  # data-dependent sizes: not comparable
        return
    if len(fake) != len(real) or any(not isinstance(r, torch.Tensor) or tuple(f.shape) != tuple(r.shape)
                                     or f.dtype != r.dtype for f, r in tensors):
        raise TypeError(f"{op} (node {node.name}): its fake kernel gives {described(fake)} but the op returns "
                        f"{described(real)} on the example inputs; the plan is made from the fake kernel's "
                        "shapes, so they must agree (see the op's register_fake)")


def _var(name: str, x: Any) -> MetaVar:
    if isinstance(x, torch.Tensor):
        return MetaVar(name, tuple(x.shape), _dtype(x))
    return MetaVar(name, (), type(x).__name__, is_tensor=False)


def to_metair(gm: torch.fx.GraphModule, values: Any = None) -> MetaIR:
    """MetaIR of an ATen FX graph; getitem nodes become references to op outputs."""
    env: dict[str, Any] = {}  # fx node name -> MetaVar or tuple of MetaVars
    inputs, constants, ops = [], [], []

    def as_meta(a):
        if isinstance(a, torch.fx.Node):
            return env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(as_meta(x) for x in a)
        if isinstance(a, dict):
            return {k: as_meta(v) for k, v in a.items()}
        return a

    outputs: list[MetaVar] = []
    value_sized = None  # the first op whose output's length its inputs' values decide
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            env[node.name] = _var(node.name, val)
            inputs.append(env[node.name])
        elif node.op == "call_function" and node.target is operator.getitem:
            env[node.name] = env[node.args[0].name][node.args[1]]
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            _refuse_values_read_into_python(node, val)
            if value_sized is None and _sized_by_values(val) and not any(
                    _is_symbolic(a.meta.get("val")) for a in node.all_input_nodes):
                value_sized = node
            if isinstance(val, (list, tuple)):
                outs = tuple(_var(f"{node.name}.{i}", v) for i, v in enumerate(val))
                env[node.name] = outs
            else:
                outs = (_var(node.name, val),)
                env[node.name] = outs[0]
            ops.append(MetaOp(node.name, op_name(node.target), as_meta(tuple(node.args)), as_meta(dict(node.kwargs)),
                              tuple(o for o in outs if o.is_tensor), node.target))
        elif node.op == "output":
            flat = torch.utils._pytree.tree_leaves(as_meta(node.args[0]), is_leaf=lambda x: isinstance(x, MetaVar))
            outputs = [v for v in flat if isinstance(v, MetaVar)]
        elif node.op == "get_attr":  # a tensor the function holds but does not take (a module's plain attribute)
            env[node.name] = _var(node.name, getattr(gm, node.target))
            constants.append(env[node.name])
        else:
            raise NotImplementedError(f"cannot capture FX node {node.format_node()}")
    if value_sized is not None:  # after the loop: a size read into Python names its reader too
        raise ValueError(f"{op_name(value_sized.target)} at {value_sized.name} makes a tensor whose length depends "
                         "on the values of its inputs (unique, nonzero, bincount), which no plan can shard or look "
                         "up: compute it outside the model, or give the op a fixed size where it takes one")
    # Constants are planned like inputs, after the graph's own (whose order the runtime follows)
    return MetaIR(tuple(inputs + constants), tuple(ops), tuple(outputs))


def _refuse_values_read_into_python(node: torch.fx.Node, val: Any) -> None:
    """A plan shards tensors: a number the graph reads out of a tensor's values (``.item()``)
    or a size that depends on them (``x[x > 0]``) and that later ops use has no placement.
    The error names the op the value came from, which the user wrote, beside the node that
    reads it, which the trace made."""
    if isinstance(val, torch.Tensor) or not node.users:
        return
    if isinstance(val, (list, tuple)) and all(isinstance(v, torch.Tensor) or v is None for v in val):
        return
    used_by = sorted({op_name(u.target) for u in node.users if isinstance(u.target, torch._ops.OpOverload)})
    if not used_by:
        return
    origin = _value_dependent_origin(node)
    made = ("" if origin is None or origin is node else
            f", a size made by {op_name(origin.target)} at {origin.name} (its output's length depends on the values)")
    raise ValueError(f"the traced graph reads a Python value out of tensor data at {node.name} "
                     f"({op_name(node.target)}){made}, and {', '.join(used_by)} use it: from .item(), .tolist() or "
                     "a size that depends on values (x[mask], nonzero, torch.where(mask) of one argument). "
                     "parallelize plans graphs whose shapes and values stay tensors: keep the value a tensor "
                     "(y * y.sum() rather than y * y.sum().item()), or mask rather than select "
                     "(torch.where(mask, x, 0) rather than x[mask])")


def _is_symbolic(val: Any) -> bool:
    """A traced value whose size or value the trace does not know (an unbacked symbol)."""
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(val, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in val.shape)
    return isinstance(val, (list, tuple)) and any(_is_symbolic(v) for v in val)


def _sized_by_values(val: Any) -> bool:
    """A traced output with a tensor whose length is an unbacked symbol (``unique``'s)."""
    if isinstance(val, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in val.shape)
    return isinstance(val, (list, tuple)) and any(_sized_by_values(v) for v in val)


def _value_dependent_origin(node: torch.fx.Node) -> torch.fx.Node | None:
    """The nearest op at or before ``node`` whose output is symbolic though none of its
    inputs is: where a value became a size or a number (nonzero, masked indexing, .item())."""
    seen, queue = {node}, [node]
    while queue:
        n = queue.pop(0)
        inputs = n.all_input_nodes
        if _is_symbolic(n.meta.get("val")) and not any(_is_symbolic(a.meta.get("val")) for a in inputs):
            return n
        for a in inputs:
            if a not in seen:
                seen.add(a)
                queue.append(a)
    return None


def arg_names(op: MetaOp) -> tuple[str, ...]:
    return positional_names(op.fn)


def meta_call(node: torch.fx.Node) -> tuple[tuple, dict] | None:
    """A node's (args, kwargs) with each input node replaced by its traced value (a fake
    tensor): the shapes, dtypes and other arguments a signature reads. None where an input
    has no traced value."""
    missing = []

    def val(n: torch.fx.Node):
        if "val" not in n.meta:
            missing.append(n)
        return n.meta.get("val")

    args, kwargs = torch.fx.node.map_arg((tuple(node.args), dict(node.kwargs)), val)
    return None if missing else (args, kwargs)
