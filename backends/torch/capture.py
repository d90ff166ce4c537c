"""Capture a torch module or function as MetaIR: its joint forward+backward ATen graph.

make_fx traces the function (and, for a module, ``torch.autograd.grad`` of a scalar loss
with respect to its parameters) into ATen ops. An Interpreter run on the example inputs
records every node's real argument values, so ops missing from the rule table can be
explored live on the very shapes and values the model uses.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from metaspmd.ir import MetaIR, MetaOp, MetaVar
from metaspmd.tensor_ops import TensorOps

from .dtensor_rules import op_name, positional_names
from .tensor_ops import TorchOps

_OPS: TensorOps = TorchOps()


@dataclass(frozen=True)
class Captured:
    """The graph, its MetaIR, and how the graph's inputs map to the caller's values."""

    ir: MetaIR
    gm: torch.fx.GraphModule
    param_names: tuple[str, ...]  # leading graph inputs, in order: the module's parameters
    n_user_inputs: int
    values: dict  # node name -> (args, kwargs) with the real example values
    n_outputs: int  # leading graph outputs that are the function's own outputs (then gradients)

    def parameter_gradient_ties(self) -> list[tuple[str, str]]:
        """(parameter input, its gradient output) node names: a gradient is delivered in its
        parameter's placement. Empty when the graph has no backward."""
        grads = self.ir.output_list[self.n_outputs:]
        return [(self.ir.input_list[i].name, grads[i].name) for i in range(min(len(self.param_names), len(grads)))]


def _dtype(x: torch.Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


def _joint(module: torch.nn.Module, loss_fn: Callable[[Any], torch.Tensor] | None, names: list[str]):
    def joint(params: list[torch.Tensor], *inputs):
        out = torch.func.functional_call(module, dict(zip(names, params)), inputs)
        loss = loss_fn(out) if loss_fn is not None else out.sum()
        # The seed gradient d(loss)/d(loss) is the constant 1. autograd's default seed,
        # ones_like(loss), traces as a node that reads the loss, so a plan that shards the
        # batch would have to all-reduce the (Partial) loss just to learn its shape; a
        # factory op depends on nothing. Same values, one data dependency less.
        seed = torch.ones(loss.shape, dtype=loss.dtype, device=loss.device)
        grads = torch.autograd.grad(loss, params, grad_outputs=seed)
        return out, list(grads)

    return joint


def capture(
    fn_or_module: Callable | torch.nn.Module,
    example_inputs: tuple,
    *,
    backward: bool = True,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> Captured:
    """Trace to ATen; a module traces forward + backward (gradients of ``loss_fn(out)``,
    default ``out.sum()``) unless ``backward=False``."""
    if isinstance(fn_or_module, torch.nn.Module):
        names = [n for n, _ in fn_or_module.named_parameters()]
        params = [p.detach().requires_grad_(True) for _, p in fn_or_module.named_parameters()]
        if backward:
            fn = _joint(fn_or_module, loss_fn, names)
        else:
            def fn(params, *inputs):
                return torch.func.functional_call(fn_or_module, dict(zip(names, params)), inputs)
        gm = make_fx(fn)(params, *example_inputs)
        if backward:
            # The loss itself is no output (only its gradients are): drop it and anything
            # else nothing reads. The traced ATen graph is functional, so this is exact.
            gm.graph.eliminate_dead_code()
            gm.recompile()
        flat_inputs = params + list(example_inputs)
        n_outputs = 1 if backward else -1
    else:
        names, gm = [], make_fx(fn_or_module)(*example_inputs)
        flat_inputs, n_outputs = list(example_inputs), -1
    values = _record_values(gm, flat_inputs)
    ir = to_metair(gm, values)
    if n_outputs == -1:
        n_outputs = len(ir.output_list)
    return Captured(ir, gm, tuple(names), len(example_inputs), values, n_outputs)


def _record_values(gm: torch.fx.GraphModule, flat_inputs: list) -> dict:
    values: dict = {}

    class Recorder(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            if isinstance(target, torch._ops.OpOverload):
                values[self._current] = (args, kwargs)
            return super().call_function(target, args, kwargs)

        def run_node(self, n):
            self._current = n.name
            return super().run_node(n)

    with torch.no_grad():
        Recorder(gm).run(*flat_inputs)
    return values


def _var(name: str, x: Any) -> MetaVar:
    if isinstance(x, torch.Tensor):
        return MetaVar(name, tuple(x.shape), _dtype(x))
    return MetaVar(name, (), type(x).__name__, is_tensor=False)


def to_metair(gm: torch.fx.GraphModule, values: dict) -> MetaIR:
    """MetaIR of an ATen FX graph; getitem nodes become references to op outputs."""
    env: dict[str, Any] = {}  # fx node name -> MetaVar or tuple of MetaVars
    inputs, ops = [], []

    def as_meta(a):
        if isinstance(a, torch.fx.Node):
            return env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(as_meta(x) for x in a)
        if isinstance(a, dict):
            return {k: as_meta(v) for k, v in a.items()}
        return a

    outputs: list[MetaVar] = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            env[node.name] = _var(node.name, val)
            inputs.append(env[node.name])
        elif node.op == "call_function" and node.target is operator.getitem:
            env[node.name] = env[node.args[0].name][node.args[1]]
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
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
        elif node.op != "get_attr":
            raise NotImplementedError(f"cannot capture FX node {node.format_node()}")
    return MetaIR(tuple(inputs), tuple(ops), tuple(outputs))


def arg_names(op: MetaOp) -> tuple[str, ...]:
    return positional_names(op.fn)
