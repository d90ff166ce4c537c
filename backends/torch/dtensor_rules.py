"""Installing verified rules into DTensor.

``register()`` installs the table's rules as ``register_sharding`` does, for the ops
DTensor has no rule for; ``register_op`` explores a custom op's rules on an example call
and installs them. Both project the rule model onto ``DTENSOR_REGISTER`` (the one place
that says what DTensor runs of a rule) and place through the DTensor adapter. DTensor's
own rules are left alone, except those refuted on real DTensor (``REFUTED``), which
``register()`` replaces with verified strategies (``replace_refuted=False`` keeps them). Ops DTensor refuses
for its machinery's sake (data-dependent output shapes) get handlers (``dtensor_handlers``).

Importing this module starts neither DTensor nor the rule table (``torch.distributed.tensor``
takes about a second to import): both load on first use.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from metaspmd.placement import Shard
from metaspmd.signature import signature
from metaspmd.spec import Strategy
from metaspmd.target import DTENSOR_REGISTER, cuts_line_up, makes_sparse, project

from .catalog import exact_sizes, op_name, overload_named, positional_names, tagged_random
from .views import shards_rewrite_call

if TYPE_CHECKING:
    from metaspmd.cache import RuleCache

# Re-exported, loaded on first use: the table module and the DTensor adapter import DTensor.
_LAZY = {"add_table": "table", "call_key": "table", "lookup": "table", "neighbour_rules": "table",
         "remove_table": "table", "table": "table", "_SPEC_OPS": "table", "dtensor_has_rule": "dtensor",
         "to_dtensor_placements": "dtensor"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__package__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _dtensor():
    """DTensor's classes, imported on first use."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    return DTensor, Replicate, DTensorSpec


def _clear_sharding_prop_cache() -> None:
    """Drop DTensor's cached propagations (its Python cache and its C++ fast path's) after
    its rules changed, as ``torch.distributed.tensor.debug._clear_sharding_prop_cache``
    does, without importing that module's visualization helpers at first use."""
    try:
        _dtensor()[0]._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
        torch._C._clear_DTensor_sharding_propagator_cache()
    except AttributeError:  # another torch: its own function
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _clear_sharding_prop_cache()


def _supported_schema(op: torch._ops.OpOverload) -> str:
    """Why register_sharding cannot carry this op's rules, or '' when it can. Tensor lists
    and optional tensors are carried: the strategies place DTensor's flattened inputs."""
    schema = op._schema
    if schema.is_mutable:
        return "mutates an input"
    if not schema.returns or any(str(r.type) != "Tensor" for r in schema.returns):
        return "returns something other than plain tensors"
    return ""


def _spec_leaves(args: tuple, kwargs: dict) -> list:
    """The call's DTensorSpecs in DTensor's order: positional arguments flattened (tensor
    lists, optional tensors), then keyword arguments. A strategy places exactly these
    (``expand_to_full_mesh_op_strategy`` counts them); the rule model numbers its tensor
    inputs in the same flattening order."""
    spec_type = _dtensor()[2]
    return [x for x in tree_leaves((list(args), kwargs)) if isinstance(x, spec_type)]


def _installable(op: torch._ops.OpOverload, strategies: Sequence[Strategy]) -> tuple:
    """The strategies DTensor runs, each with its placements per input and per output. A
    derived rule that cuts an input of ``squeeze_copy`` or ``as_strided_copy`` holds only
    with the call's arguments rewritten from the local shard (a shard of one row must not
    be squeezed), which DTensor does not do: there only rules with no cut input stay. It
    does for the ops whose size argument it restates from the output's local shape
    (``select_backward``, ``slice_backward``, the upsample backwards)."""
    from .dtensor import to_dtensor_placements

    restated = op in _dtensor()[0]._op_dispatcher.sharding_propagator.op_to_shape_and_stride_idx
    name, rewrites = op_name(op), shards_rewrite_call(op) and not restated
    out = []
    for s in strategies:
        a = project(s, DTENSOR_REGISTER, name)
        if a and not (rewrites and any(isinstance(p, Shard) for p in a.inputs)):
            out.append((s, to_dtensor_placements(a.inputs), to_dtensor_placements(a.outputs)))
    return tuple(out)


def dtensor_placements(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[tuple, tuple]]:
    """The table's strategies for this call that DTensor runs, as (input placements, output
    placements) in DTensor's types; [] on a table miss."""
    from .table import lookup

    return [(ins, outs) for _, ins, outs in _installable(op, lookup(op, args, kwargs) or ())]


def _strategy_fn(op: torch._ops.OpOverload, rules_of):
    """DTensor's strategy function for ``op``: all-Replicate, then the verified strategies
    ``rules_of(args, kwargs)`` gives the call (a tuple kept by its source, so what DTensor
    runs of it is worked out once), those whose cuts line up at the call's shapes."""
    _, Replicate, _ = _dtensor()
    n_out = len(op._schema.returns)
    runnable: dict = {}  # id of a rules tuple -> (the tuple, what DTensor runs of it, by label)

    def strategies(*args, **kwargs):
        specs = _spec_leaves(args, kwargs)
        out = [([Replicate()] * n_out, [Replicate()] * len(specs))]
        rules = rules_of(args, kwargs)
        held = runnable.get(id(rules))
        if held is None or held[0] is not rules:
            held = runnable[id(rules)] = (rules, _installable(op, rules), {s.label: s for s in rules})
        shapes = [tuple(a.shape) for a in specs]
        for s, ins, outs in held[1]:
            if len(ins) != len(shapes) or len(outs) != n_out:
                continue  # another number of tensors than this entry's
            if (list(outs), list(ins)) not in out and cuts_line_up(s, shapes, held[2]):
                out.append((list(outs), list(ins)))
        return out

    return strategies


def _sharding_fn(op: torch._ops.OpOverload, strategies_by_sig: dict):
    """DTensor's strategy function for ``op``: the verified strategies at the call's
    signature (``strategies_by_sig``), none at another."""
    from .table import _SPEC_OPS

    names, sized = positional_names(op), exact_sizes(op)
    return _strategy_fn(op, lambda args, kwargs: strategies_by_sig.get(
        signature(_SPEC_OPS, names, args, kwargs, sized), ()))


def _install(op: torch._ops.OpOverload, strategies, own=None) -> None:
    """``strategies`` as DTensor's rule for ``op``, expanded to the mesh as
    ``register_sharding`` expands them, and kept only where DTensor runs them as placed
    (``_expanded``). They follow the call's signature, values included (a padding, a fill
    value), so every argument keys DTensor's cache of them; ``register_sharding`` keys on
    tensors and int arguments only, and would hand a call the strategies of another
    padding. ``own``: DTensor's own strategy function for an op whose rule is refuted at
    some calls only (``REFUTED_AT``), which its other calls keep."""
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    info = RuntimeSchemaInfo(0, [a.name for a in op._schema.arguments if a.kwarg_only] or None, needs_pytree=True)
    _dtensor()[0]._op_dispatcher.sharding_propagator.register_op_strategy(
        op, partial(_expanded, op, strategies, own), info)


def _specs_of(op_schema) -> tuple[tuple, dict]:
    """The call's arguments as DTensor hands a registered strategy function them
    (``OpStrategy`` per tensor), with each tensor's own spec in its place."""
    from torch.distributed.tensor._op_schema import OpStrategy, TupleStrategy

    def spec(x):
        if isinstance(x, OpStrategy):
            return x.strategies[0].output_spec
        return tuple(spec(c) for c in x.children) if isinstance(x, TupleStrategy) else x

    return tuple(spec(a) for a in op_schema.args_schema), {k: spec(v) for k, v in op_schema.kwargs_schema.items()}


def _expanded(op: torch._ops.OpOverload, strategies, own, op_schema):
    """The verified strategies over the mesh, less those DTensor would not run as placed.
    DTensor redistributes positional tensors only (``OpSchema.args_spec``): a keyword tensor
    (``weight=`` of a histogram, an out= tensor) is used as it is, so a strategy that places
    it otherwise computes on the wrong values. An in-place op writes self's storage, so
    self is never moved, while its placement may change as the rule says (DTensor's
    dispatcher re-specs self in place: ``fill_`` of a Partial(sum) self holds the fill on
    every rank). Strategies that hold for even cuts only go where a cut is uneven
    (``_on_uneven_cuts``). A call DTensor's rule is not refuted at (``REFUTED_AT``) goes to
    that rule, ``own``."""
    from torch.distributed.tensor._op_schema import OpSchema
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    args, kwargs = _specs_of(op_schema)
    called = OpSchema(op_schema.op, args, kwargs, schema_info=op_schema.schema_info)  # for its output shapes
    if own is not None and not REFUTED_AT[op_name(op)](op, args, kwargs):
        return own(op_schema, called)
    rows = [list(outs) + list(ins) for outs, ins in strategies(*args, **kwargs)]
    n_out = len(op._schema.returns)
    expanded = expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, rows, input_index=n_out)
    fixed = [s.placements for s in _spec_leaves((), kwargs)]
    keep = [s for s in _writes_stay(expanded.strategies, op, args, kwargs)
            if not fixed or [x.placements for x in s.input_specs][len(s.input_specs) - len(fixed):] == fixed]
    expanded.strategies = keep = _on_uneven_cuts(keep, called, _dtensor()[0]._op_dispatcher.sharding_propagator)
    if not keep and fixed:
        from .dtensor_handlers import KeywordPlacementRefused

        raise KeywordPlacementRefused(
            f"{op}: no verified strategy keeps its keyword tensors placed {fixed}, and DTensor does not "
            "redistribute keyword tensors")
    return expanded


# Tensors an op writes besides its result: those its schema marks written (``Tensor(a!)``),
# and native_batch_norm's running statistics, which it updates in training undeclared.
_UNDECLARED_WRITES = {"aten.native_batch_norm.default": ("running_mean", "running_var")}


def _written_leaves(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[int]:
    """The positions, among the call's DTensorSpecs (``_spec_leaves``' order), of the
    tensors ``op`` writes in place. out= tensors are keyword tensors, which DTensor keeps
    where they are anyway."""
    schema = op._schema.arguments
    names = {a.name for a in schema if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only}
    if op_name(op) in _UNDECLARED_WRITES:
        names.update(_UNDECLARED_WRITES[op_name(op)])
    if any(a.name == "training" for a in schema) and not _argument(op, args, kwargs, "training"):
        names -= {"running_mean", "running_var"}  # a batch norm in eval mode reads them only
    if not names:
        return []
    spec_type = _dtensor()[2]
    out, k = [], 0
    for name, value in [(schema[i].name, v) for i, v in enumerate(args)] + list(kwargs.items()):
        n = sum(isinstance(x, spec_type) for x in tree_leaves(value))
        if name in names:
            out += range(k, k + n)
        k += n
    return out


def _writes_stay(strategies, op: torch._ops.OpOverload, args: tuple, kwargs: dict, result_is_self: bool = False):
    """``strategies`` less those that move a tensor the op writes in place: DTensor would
    redistribute it into a copy, the op would write the copy, and the tensor would keep its
    old values (a channel-cut batch norm's running statistics, kept replicated, were never
    updated). ``result_is_self``: DTensor's contract for an in-place op's decomposition,
    whose result's placement it gives self without moving self's data, so it must be self's."""
    written = _written_leaves(op, args, kwargs)
    if not written:
        return list(strategies)
    placed = [x.placements for x in _spec_leaves(args, kwargs)]
    kept = []
    for s in strategies:
        ins = s.input_specs or ()
        if any(ins[i].placements != placed[i] for i in written if i < len(ins)):
            continue
        if result_is_self and s.output_spec.placements != placed[0]:
            continue
        kept.append(s)
    return kept


def _moved_writes_refused(op: torch._ops.OpOverload, args: tuple, kwargs: dict, whose: str):
    names = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    names += list(_UNDECLARED_WRITES.get(op_name(op), ()))
    return RuntimeError(
        f"{op}: every strategy {whose} moves a tensor the op writes in place ({', '.join(names)}), so the write "
        "would land in a moved copy and the tensor keep its old values; place the written tensors as the op's "
        "other inputs are placed (redistribute them first)")


def _keeping_writes(op: torch._ops.OpOverload, own, op_schema):
    """DTensor's own rule for ``op`` (``own``), less its strategies that move a tensor the
    op writes in place (``_writes_stay``)."""
    from torch.distributed.tensor._op_schema import OpSchema

    args, kwargs = _specs_of(op_schema)
    found = own(op_schema, OpSchema(op_schema.op, args, kwargs, schema_info=op_schema.schema_info))
    kept = _writes_stay(found.strategies, op, args, kwargs)
    if not kept:
        raise _moved_writes_refused(op, args, kwargs, "of DTensor's rule")
    found.strategies = kept
    return found


@dataclass
class RegisterReport:
    installed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # op -> reason
    replaced: list[str] = field(default_factory=list)  # installed in place of a refuted DTensor rule
    handled: list[str] = field(default_factory=list)  # run by dtensor_handlers (all-replicated, or DTensor's extended)
    guarded: list[str] = field(default_factory=list)  # DTensor's machinery kept from refuted answers (DECOMPOSED_EVEN)

    def __str__(self) -> str:
        replaced = f" ({len(self.replaced)} in place of refuted DTensor rules)" if self.replaced else ""
        handled = f"; handlers for {len(self.handled)} ops DTensor's machinery refuses" if self.handled else ""
        guarded = f"; guarded: {', '.join(self.guarded)}" if self.guarded else ""
        return (f"installed metaspmd rules for {len(self.installed)} ops{replaced}{handled}{guarded}; "
                f"skipped {len(self.skipped)}")


# DTensor 2.13 rules refuted on real DTensor (fake process group and LocalTensorMode,
# against one device); tests/codegen/test_dtensor_register.py reproduces each.
REFUTED = {
    "aten.convolution.default":
        "with a spatial dim of the input cut, DTensor's handler convolves each shard as it is, without the "
        "neighbour's rows and without redistributing: wrong output shapes (conv1d/2d/3d, conv_transpose1d/2d/3d)",
    "aten.convolution_backward.default":
        "its handler runs the backward of the same shard-local convolution",
    "aten.linalg_pinv.atol_rtol_tensor":
        "with its keyword rtol (or atol) cut, DTensor's rule calls the output Replicate and runs each rank "
        "on its own rows of the thresholds, never redistributing them (linalg_pinv.rcond_tensor decomposes "
        "into it: each rank's output holds only its rows)",
    "aten.gather.default":
        "with index cut along a dim it does not gather and shorter there than self, DTensor's rule runs each "
        "rank's index rows against self's first rows (self Replicate) or against its own, longer, shard of "
        "self's rows (self cut alike): wrong values (take_along_dim decomposes into it)",
    "aten.fill_.Scalar":  # for a Partial self only (REFUTED_AT)
        "a Partial(sum) self stays Partial(sum), so every rank's fill counts once per rank (the "
        "decomposition of 1 - x fills an empty_like of x: cosine_embedding_loss with its second input Shard(1))",
}


def _partial_self(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    return any(p.is_partial() for p in args[0].placements)


def _argument(op: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str):
    """The value of ``op``'s argument ``name`` at this call: passed, or its default."""
    arguments = op._schema.arguments
    i = next(k for k, a in enumerate(arguments) if a.name == name)
    if i < len(args):
        return args[i]
    return kwargs.get(name, arguments[i].default_value if arguments[i].has_default_value() else None)


def _every_dim_as_an_empty_list(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """``dim=[]`` on a tensor with dims, which ATen reduces whole."""
    dim = _argument(op, args, kwargs, "dim")
    return isinstance(dim, (list, tuple)) and not dim and len(args[0].shape) > 0


# The reductions whose dim=[] means every dim (sum(x, dim=[]) sums all of x, and amax's
# default dim is []): DTensor's rules (_infer_reduction_dims) read it as no dim and keep
# the input's cut, giving one partial result per rank (keepdim) or an IndexError.
_EMPTY_DIM_REDUCTIONS = (
    "aten.amax.default", "aten.amax.out", "aten.amin.default", "aten.amin.out", "aten.linalg__powsum.default",
    "aten.linalg_vector_norm.default", "aten.logsumexp.default", "aten.mean.dim", "aten.mean.out",
    "aten.nansum.default", "aten.std.correction", "aten.std.correction_out", "aten.sum.dim_IntList",
    "aten.var.correction", "aten.var.correction_out", "aten.var_mean.correction", "aten.var_mean.correction_out",
)
REFUTED.update({
    name: "with dim=[] (every dim, in ATen) on a cut input, DTensor's rule reduces no dim and keeps the cut: "
          "each rank's own reduction, called one cut result (wrong values with keepdim, an IndexError without; "
          "the backward of norm(p=inf) sums its maxima so)"
    for name in _EMPTY_DIM_REDUCTIONS})


def _dim_from_the_end(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """A negative ``dim`` (counted from the last)."""
    dim = _argument(op, args, kwargs, "dim")
    return isinstance(dim, int) and dim < 0


# DTensor's rules that check a dim against the input's cut without first counting a
# negative dim from the last: cumsum(x, -1) of a column-cut x scans each rank's columns on
# their own, and calls the result cut (scan_strategy); argmax(x, -2) of a row-cut x fails.
_SCANS = ("aten.cumprod.default", "aten.cumsum.default", "aten.logcumsumexp.default")
_ARG_REDUCTIONS = ("aten.argmax.default", "aten.argmin.default")
REFUTED.update({
    name: "with a negative dim (cumsum(x, -1)) along the input's cut, DTensor's rule keeps the cut: each rank "
          "scans its own slice from its start, called one cut result (wrong values)"
    for name in _SCANS})
REFUTED.update({
    name: "with a negative dim other than -1 (argmax(x, -2)) along the input's cut, DTensor's rule gives a "
          "strategy its own dispatch cannot run (a view of the wrong size)"
    for name in _ARG_REDUCTIONS})
# The gradients of select and slice (narrow) put the gradient back into the input's sizes.
# DTensor's rules for them compare or shift cut dims against the dim without first counting
# a negative dim from the last.
_SELECT_BACKWARD, _SLICE_BACKWARD = "aten.select_backward.default", "aten.slice_backward.default"
REFUTED[_SELECT_BACKWARD] = (
    "with a negative dim (the gradient of select(x, -1, i)), DTensor's rule moves every cut of the gradient one "
    "dim on, cuts before the selected dim included: the gradient of x cut along dim 0 is called cut along dim 1, "
    "and its shards fail or, where they broadcast, are wrong (x of shape (4, 8), cut along its rows)")
REFUTED[_SLICE_BACKWARD] = (
    "with a negative dim (the gradient of narrow(x, -1, 2, 4)) and the gradient cut along it, DTensor's rule "
    "keeps the cut, so each rank pads its own columns as if they were the whole slice (wrong values, silently: "
    "the gradient of x in narrow(x, -1, 2, 4) @ w with w cut along its rows)")
# DTensor's rule for these cuts dims 0 and 1 as batch and channel; an unbatched input
# (channels first, no batch dim) has its first spatial dim there, whose windows or flat
# indices do not split with the cut.
_SPATIAL_DIMS = {"aten._adaptive_avg_pool2d_backward.default": 2, "aten.max_unpool2d.default": 2,
                 "aten.max_unpool3d.default": 3}
REFUTED.update({
    name: "on an unbatched input (channels, then the spatial dims), DTensor's rule cuts dim 1 as if it were the "
          "channels: the first spatial dim, whose pooling windows (or flat indices) do not split with the cut "
          "(the gradient of adaptive_avg_pool2d of a (8, 16, 8) input to (7, 7), cut along dim 1, is wrong; "
          "max_unpool fails)"
    for name in _SPATIAL_DIMS})


def _unbatched(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """An input of the op's spatial dims and a channel dim only, no batch dim."""
    return len(_argument(op, args, kwargs, "self").shape) == _SPATIAL_DIMS[op_name(op)] + 1


# DTensor's rules for these do not read an argument that changes what the op sums: the
# count of each index (scale_grad_by_freq) or of the targets not ignored, weighted (the
# mean of nll_loss, which the Partial(avg) of each rank's own mean is not).
REFUTED["aten.embedding_dense_backward.default"] = (
    "with scale_grad_by_freq=True and the indices cut, DTensor's rule sums the ranks' gradients (Partial(sum)) "
    "while each rank scales its rows by the counts of its own indices, not of all of them (wrong values, "
    "silently: the gradient of an nn.Embedding(scale_grad_by_freq=True) on a batch-cut input)")
_NLL_FORWARD = ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
REFUTED.update({
    name: "with reduction='mean' and the batch cut, DTensor's rule calls the loss Partial(avg): the mean of the "
          "ranks' means, each divided by its own weight of targets not ignored, which differs from rank to rank "
          "as soon as a target is ignored (ignore_index, -100 by default) or the classes are weighted (wrong "
          "values, silently: cross_entropy with padded targets)"
    for name in _NLL_FORWARD})


def _scaled_by_frequency(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    return bool(_argument(op, args, kwargs, "scale_grad_by_freq"))


def _a_mean(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    return _argument(op, args, kwargs, "reduction") == 1  # at::Reduction::Mean


# The ops whose DTensor rule is refuted at some of their calls only: (op, args, kwargs)
# of DTensorSpecs -> whether the call is one. Their other calls keep DTensor's rule.
REFUTED_AT = ({"aten.fill_.Scalar": _partial_self}
              | {name: _every_dim_as_an_empty_list for name in _EMPTY_DIM_REDUCTIONS}
              | {name: _dim_from_the_end for name in _SCANS + _ARG_REDUCTIONS + (_SELECT_BACKWARD, _SLICE_BACKWARD)}
              | {name: _unbatched for name in _SPATIAL_DIMS}
              | {"aten.embedding_dense_backward.default": _scaled_by_frequency}
              | {name: _a_mean for name in _NLL_FORWARD})


def _refuted_also_at(names, predicate, reason: str) -> None:
    """Refute DTensor's rule for ``names`` at the calls ``predicate`` picks too, beside any
    calls it is refuted at already (``REFUTED_AT``, whose reason this one joins)."""
    for name in names:
        REFUTED[name] = f"{REFUTED[name]}; also {reason}" if name in REFUTED else reason
        before = REFUTED_AT.get(name)
        REFUTED_AT[name] = predicate if before is None else (
            lambda op, args, kwargs, a=before, b=predicate: a(op, args, kwargs) or b(op, args, kwargs))


def _partial_ops(args: tuple, kwargs: dict) -> set:
    """The reduce ops of the call's Partial inputs ('sum', 'max', ...)."""
    return {p.reduce_op for s in _spec_leaves(args, kwargs) for p in s.placements if p.is_partial()}


def _infinite_order(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    order = _argument(op, args, kwargs, "ord" if op_name(op) == "aten.linalg_vector_norm.default" else "p")
    return isinstance(order, (int, float)) and abs(order) == float("inf")


def _integral_dtype(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    dtype = _argument(op, args, kwargs, "dtype")
    return dtype is not None and not (dtype.is_floating_point or dtype.is_complex)


# DTensor's rules that pass a Partial input through where the op is not linear in it (for a
# Partial(sum)) or not non-decreasing (for a Partial(max) or (min)) at the call's arguments:
# each rank's part is transformed on its own and the results reduced, which is no transform
# of the reduced value.
_refuted_also_at(
    ("aten.linalg__powsum.default",), lambda op, args, kwargs: bool(_partial_ops(args, kwargs)),
    "with a Partial input, DTensor's rule keeps it Partial(sum) though sum(|x|^p) of the ranks' parts is no "
    "sum(|x|^p) of their sum (_powsum(x, 2) of a Partial(sum) x of [1, 1] split [2, -1] and [-1, 2]: 10, not 2)")
_refuted_also_at(
    ("aten.linalg_vector_norm.default", "aten.norm.Scalar"),
    lambda op, args, kwargs: _infinite_order(op, args, kwargs) and bool(_partial_ops(args, kwargs) & {"max", "min"}),
    "with ord inf (or -inf) and a Partial(max) (or (min)) input, DTensor's rule reduces the ranks' max |x| by "
    "max, which is no |max x| (a rank's -10 beside another's 1: 10, not 1)")
_refuted_also_at(
    ("aten.sum.default", "aten.sum.dim_IntList"),
    lambda op, args, kwargs: _integral_dtype(op, args, kwargs) and bool(_partial_ops(args, kwargs)),
    "with an integral dtype= and a Partial(sum) input, each rank truncates its own part before the sum")
_refuted_also_at(
    ("aten.any.default", "aten.any.dim", "aten.any.dims"), lambda op, args, kwargs: bool(_partial_ops(args, kwargs)),
    "with a Partial(sum) input, DTensor's rule asks each rank whether its own part is nonzero (parts 1 and -1 "
    "of a 0: True)")
_refuted_also_at(
    ("aten.threshold.default",),
    lambda op, args, kwargs: _argument(op, args, kwargs, "value") > _argument(op, args, kwargs, "threshold")
    and bool(_partial_ops(args, kwargs) & {"max", "min"}),
    "with value > threshold and a Partial(max) (or (min)) input, DTensor's rule keeps it Partial, though the "
    "op is then not non-decreasing (threshold(x, 0, 5) of parts 1 and -1 of a 1: 5, not 1)")
_refuted_also_at(
    ("aten.nan_to_num.default",), lambda op, args, kwargs: bool(_partial_ops(args, kwargs) & {"max", "min"}),
    "with a Partial(max) (or (min)) input, DTensor's rule keeps it Partial, though a posinf or neginf below "
    "(or above) the finite values, or a nan beside them, is not order-kept (posinf=-5 of parts inf and 2: 2, "
    "not -5)")


def _on_uneven_cuts(strategies, op_schema, propagator) -> list:
    """``strategies`` (DTensor's, over the mesh) less those that hold for even cuts only,
    where an input they take is cut unevenly along the mesh dim they use: a Partial(avg)
    output, the mean of the ranks' means, is the mean only of equal shards; and an output
    cut along a dim of another length than the input's cut dim has local lengths that are
    not torch.chunk's, which DTensor takes them for (pixel_shuffle of 5 columns over 4
    ranks gives them 4, 4, 2 and 0 output columns; DTensor reads 3, 3, 3 and 1)."""
    from torch.distributed.tensor._dtensor_spec import TensorMeta
    from torch.distributed.tensor._ops.utils import is_tensor_evenly_shardable_on_dim

    def uneven_cuts(specs) -> dict:
        """mesh dim -> the lengths of the input dims cut unevenly along it."""
        out: dict = {}
        for spec in specs:
            for m, p in enumerate(spec.placements):
                if p.is_shard() and not is_tensor_evenly_shardable_on_dim(spec.shape, spec, p.dim):
                    out.setdefault(m, set()).add(spec.shape[p.dim])
        return out

    def holds(outputs, metas, uneven: dict) -> bool:
        for spec, meta in zip(outputs, metas):
            if spec is None:
                continue
            for m, p in enumerate(spec.placements):
                if m not in uneven:
                    continue
                if p.is_partial() and getattr(p, "reduce_op", None) == "avg":
                    return False
                if p.is_shard() and (meta is None or uneven[m] != {meta.shape[p.dim]}):
                    return False
        return True

    metas, kept = None, []
    for s in strategies:
        uneven = uneven_cuts(s.input_specs or ())
        if uneven:
            if metas is None:
                # not the cached one: it keys on the arguments its schema info names only
                got = propagator._propagate_tensor_meta_non_cached(op_schema)
                metas = [got] if isinstance(got, TensorMeta) or got is None else list(got)
            outputs = s.output_specs if isinstance(s.output_specs, tuple) else (s.output_specs,)
            if not holds(outputs, metas, uneven):
                continue
        kept.append(s)
    return kept


# DTensor 2.13 derives a rule for an op it has none for from the op's decomposition, traced
# on a mesh of one device (torch.distributed.tensor._decompositions), where every cut is
# even, so it keeps strategies that hold for even cuts only (``_on_uneven_cuts``): mse_loss,
# smooth_l1_loss, soft_margin_loss and binary_cross_entropy_with_logits of 10 rows over 4
# ranks averaged unequal shards' means. And it expands them without its own in-place check,
# so an in-place op's self was moved into a copy, the copy written and self relabelled with
# its data unchanged (index_add_, scatter_add_, index_copy_ of a row-cut self; masked_fill_
# of a Partial self). Guarded: those strategies are dropped there.
DECOMPOSED_EVEN = "DTensor's decomposition rules keep what holds for even cuts only to even cuts"
DECOMPOSED_WRITES = "DTensor's decomposition rules keep the tensors an op writes in place where they are"
# DTensor's own rules that may move a tensor the op writes (its in-place check keeps only
# the self of an op whose name ends in '_'): a channel-cut batch norm's replicated running
# statistics were moved to channel cuts, and the moved copies updated.
RULES_WRITES = "DTensor's rules keep the tensors an op writes in place where they are"
_GUARDS: dict = {}  # guard -> the report of the register() call that put it


def _guarded_decomposition(decomp, propagate):
    """DTensor's decomposition propagation, less what ``_on_uneven_cuts`` drops and what
    moves a tensor the op writes (``_writes_stay``, self's placement kept by the result)."""
    def propagate_strategy(op_schema):
        found = propagate(op_schema)
        if found is not None:
            op, args, kwargs = op_schema.op, op_schema.args_schema, op_schema.kwargs_schema
            first = op._schema.arguments[0] if op._schema.arguments else None
            in_place = first is not None and first.alias_info is not None and first.alias_info.is_write
            kept = _writes_stay(found.strategies, op, args, kwargs, result_is_self=in_place)
            if not kept:
                raise _moved_writes_refused(op, args, kwargs, "DTensor derives from its decomposition")
            found.strategies = _on_uneven_cuts(kept, op_schema, decomp.sharding_prop) or kept  # never none
        return found

    return propagate_strategy


def _guard_decompositions(report: RegisterReport) -> None:
    if DECOMPOSED_EVEN in _GUARDS:
        return
    decomp = _dtensor()[0]._op_dispatcher.sharding_propagator.decomp_strategy
    decomp.propagate_strategy = _guarded_decomposition(decomp, type(decomp).propagate_strategy.__get__(decomp))
    _GUARDS[DECOMPOSED_EVEN] = report
    for guard in (DECOMPOSED_EVEN, DECOMPOSED_WRITES):
        if guard not in report.guarded:
            report.guarded.append(guard)


def _writes_dtensor_may_move(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` writes a tensor that DTensor's in-place check does not keep in place:
    one besides the self of an op whose name ends in '_' (tensor lists, of the fused
    optimizers, aside: their rules place each list's elements on their own)."""
    schema = op._schema.arguments
    first_kept = op._schema.name.split("::")[-1].endswith("_")
    written = [a for i, a in enumerate(schema) if a.alias_info is not None and a.alias_info.is_write
               and not a.kwarg_only and not (i == 0 and first_kept)]
    return (op_name(op) in _UNDECLARED_WRITES
            or bool(written) and not any(isinstance(a.type, torch.ListType) for a in written))


def _guard_writes(op: torch._ops.OpOverload) -> None:
    """Put ``_keeping_writes`` of DTensor's own rule in its place (kept for ``unregister``)."""
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    DTensor = _dtensor()[0]
    p, handlers = DTensor._op_dispatcher.sharding_propagator, DTensor._op_dispatcher._custom_op_handlers
    _REPLACED[op] = (p.op_single_dim_strategy_funcs.pop(op, None),
                     p.op_to_schema_info_for_single_dim_strategy.pop(op, None),
                     p.op_to_rules.get(op), handlers.get(op), p.op_strategy_funcs.get(op), p.op_to_schema_info.get(op))
    info = RuntimeSchemaInfo(0, [a.name for a in op._schema.arguments if a.kwarg_only] or None, needs_pytree=True)
    p.register_op_strategy(op, partial(_keeping_writes, op, _own_rule(op, *_REPLACED[op][::4])), info)


def _unguard_decompositions(report: RegisterReport) -> None:
    if _GUARDS.get(DECOMPOSED_EVEN) is report:
        del _GUARDS[DECOMPOSED_EVEN]
        decomp = _dtensor()[0]._op_dispatcher.sharding_propagator.decomp_strategy
        decomp.__dict__.pop("propagate_strategy", None)


def refuted(op: torch._ops.OpOverload) -> str:
    """Why DTensor's own rule for ``op`` is not to be trusted at any call, or ''. An op
    refuted at some calls only (``REFUTED_AT``) gives '': at such a call DTensor's output
    placements are not the verified rule's, which ``parallelize`` checks node by node."""
    name = op_name(op)
    return "" if name in REFUTED_AT else REFUTED.get(name, "")


_REPLACED: dict = {}  # op -> what DTensor had for it: (single-dim strategy, its schema info, legacy rule, handler)


def _verified_fn(op: torch._ops.OpOverload, cache: RuleCache | None = None):
    """DTensor's strategy function for ``op``: the verified strategies of the call. The
    table's where it has the call's signature; else the call's own, found as ``parallelize``
    finds a table miss's (neighbouring signatures' rules verified at the call, or live
    ShardCombine, in a forked child, cached)."""
    from .table import call_key

    found: dict = {}

    def rules_of(args, kwargs):
        try:
            key = call_key((args, kwargs))
        except TypeError:  # an unhashable argument
            return _call_rules(op, args, kwargs, cache)
        if key not in found:
            found[key] = _call_rules(op, args, kwargs, cache)
        return found[key]

    return _strategy_fn(op, rules_of)


def _call_rules(op: torch._ops.OpOverload, args: tuple, kwargs: dict, cache: RuleCache | None = None
                ) -> tuple[Strategy, ...]:
    from .table import lookup

    found = lookup(op, args, kwargs)
    if found is not None:
        return found
    specs = _spec_leaves(args, kwargs)
    if any(not s.tensor_meta.dtype.is_floating_point for s in specs):
        return ()  # stand-ins for positions or masks would be made up: replicate
    from metaspmd.cache import RuleCache
    from metaspmd.resolve import resolve_call

    from .rules_at_runtime import call_of, live_exploration, stand_in_generator
    from .tensor_ops import TorchOps

    DTensorSpec = _dtensor()[2]
    generator = stand_in_generator()  # not the program's generator: its dropout draws stay as they were
    with _disable_current_modes():  # the rules are about the op, not the simulation running it
        stand_in = torch.utils._pytree.tree_map(
            lambda x: (torch.randn(tuple(x.shape), dtype=x.tensor_meta.dtype, generator=generator)
                       if isinstance(x, DTensorSpec) else x),
            (list(args), kwargs))
        try:
            entry = resolve_call(op_name(op), call_of(op, tuple(stand_in[0]), stand_in[1]), TorchOps(), "torch",
                                 cache if cache is not None else RuleCache(), live_exploration())
        except Exception:  # noqa: BLE001 -- no verified rule: everything replicated
            return ()
    return tuple(entry.all_strategies())


def _replace(op: torch._ops.OpOverload, cache: RuleCache | None = None) -> None:
    """Put the verified strategies in place of DTensor's own rule for ``op``: its single-dim
    strategy and legacy rule (looked up before any registered strategy) and its custom
    handler (which runs before propagation) step aside, kept for ``unregister``."""
    DTensor = _dtensor()[0]
    p, handlers = DTensor._op_dispatcher.sharding_propagator, DTensor._op_dispatcher._custom_op_handlers
    _REPLACED[op] = (p.op_single_dim_strategy_funcs.pop(op, None),
                     p.op_to_schema_info_for_single_dim_strategy.pop(op, None),
                     p.op_to_rules.pop(op, None), handlers.pop(op, None),
                     p.op_strategy_funcs.get(op), p.op_to_schema_info.get(op))
    _install(op, _verified_fn(op, cache), own=_own_rule(op, *_REPLACED[op][::4]) if op_name(op) in REFUTED_AT else None)


def _own_rule(op: torch._ops.OpOverload, single, strategy):
    """DTensor's own rule for ``op``, as a function of the schema DTensor hands a registered
    strategy (``OpStrategy`` arguments) and of the call (``DTensorSpec`` arguments): its
    strategy function, or its single-dim strategy expanded to the mesh as DTensor's
    propagator expands it."""
    if single is None:
        return lambda op_schema, called: strategy(op_schema)
    from torch.distributed.tensor._ops.single_dim_strategy import _expand_single_dim_strategy_to_mesh

    propagator = _dtensor()[0]._op_dispatcher.sharding_propagator

    def expanded(op_schema, called):
        out_meta = propagator._propagate_tensor_meta_non_cached(called)
        fn = _expand_single_dim_strategy_to_mesh(op_schema.get_mesh_from_args(), op_schema, single, out_meta)
        return fn(op, op_schema.args_meta, op_schema.kwargs_meta)

    return expanded


def _restore(op: torch._ops.OpOverload) -> None:
    single, single_info, rule, handler, strategy, info = _REPLACED.pop(op)
    DTensor = _dtensor()[0]
    p, handlers = DTensor._op_dispatcher.sharding_propagator, DTensor._op_dispatcher._custom_op_handlers
    for table_, value in ((p.op_single_dim_strategy_funcs, single), (p.op_to_schema_info_for_single_dim_strategy,
                          single_info), (p.op_to_rules, rule), (handlers, handler), (p.op_strategy_funcs, strategy),
                          (p.op_to_schema_info, info)):
        if value is None:
            table_.pop(op, None)
        else:
            table_[op] = value


def register(ops: list[str] | str | None = None, *, replace_refuted: bool = True,
             cache: RuleCache | None = None) -> RegisterReport:
    """Install table rules into DTensor for ops it has no rule for, and handlers for the ops
    its machinery refuses (``dtensor_handlers``: data-dependent output shapes run
    all-replicated); report what was done. ``replace_refuted`` (default): also put verified
    strategies in place of DTensor's own rule for the ops where that rule is refuted
    (``REFUTED``, or at the calls ``REFUTED_AT`` picks): a call whose cut no verified rule
    keeps is redistributed instead of computed wrong, and (``ops`` None) DTensor's decomposition
    path keeps what holds for even cuts only to even cuts (``DECOMPOSED_EVEN``); ``False`` leaves DTensor's
    rules, wrong answers included, as they are. ``cache``: where the rules of calls the table
    misses are kept (the user's rule cache by default, as ``parallelize``'s). ``ops``: op
    names (``"aten.mm.default"``), overloads or packets (``torch.ops.aten.mm``: each of its
    overloads), one or several, or None for every op of the table."""
    from metaspmd.runtime import check_cache, check_flag

    from . import dtensor_handlers
    from .table import table

    check_flag("replace_refuted", replace_refuted, "True: verified rules replace DTensor's refuted ones")
    check_cache(cache)
    ops = _op_names(ops)
    dtensor_has_rule = sys.modules[__name__].dtensor_has_rule  # lazy, and patchable in tests
    report = RegisterReport()
    rules = table()
    if ops is not None:
        unknown = [name for name in ops if overload_named(name) is None]
        if unknown:
            raise ValueError(f"no op is named {', '.join(map(repr, unknown))} in this torch: op names are "
                             "namespace.op.overload, as str(torch.ops.aten.mm.default) gives ('aten.mm.default')")
    for name in sorted(ops if ops is not None else rules.ops()):
        if replace_refuted and name in REFUTED:
            continue  # below
        if name in dtensor_handlers.REPLICATED:
            continue  # a handler, below: DTensor's propagation cannot run a strategy for it

        entries = rules.entries(name)
        op = overload_named(name) if entries is not None else None
        if op is None:
            report.skipped[name] = "no rule in the table" if entries is None else "not an ATen op here"
            continue
        if op in _OWNERS:
            report.skipped[name] = "installed already, by an earlier register()"
            continue
        if dtensor_has_rule(op):
            report.skipped[name] = "DTensor has its own rule"
            continue
        if name in DTENSOR_REGISTER.masked_ops:  # the table's row-cut strategy is DTensor's own, masked
            report.skipped[name] = "its table rules need DTensor's own rule, which masks positions"
            continue
        why = _supported_schema(op)
        if why:
            report.skipped[name] = why
            continue
        op_rules = {sig: rules.strategies(name, sig) for sig in entries}
        if not any(_installable(op, ss) for ss in op_rules.values()) and not _dtensor_needs_a_strategy(op):
            report.skipped[name] = _no_installable(op)
            continue
        # the table's rules at its signatures; a call of another signature (another scalar,
        # rank or dtype) gets its own, found as parallelize finds a table miss's
        _install(op, _verified_fn(op, cache))
        _OWNERS[op] = report
        report.installed.append(name)
        # a random op draws whole on every rank: drawn shard by shard, every shard's draw would be the same
        if (tagged_random(op) and dtensor_handlers.install_drawing_handler(op, report)) or \
                dtensor_handlers.install_keyword_handler(op, report):
            report.handled.append(name)
    if replace_refuted:
        for name in sorted(REFUTED):
            op = overload_named(name)
            if ops is not None and name not in ops or op is None:
                continue
            if op in _REPLACED:
                report.skipped[name] = "replaced already, by an earlier register()"
                continue
            _replace(op, cache)
            _OWNERS[op] = report
            report.installed.append(name)
            report.replaced.append(name)
        p = _dtensor()[0]._op_dispatcher.sharding_propagator
        for op in sorted(set(p.op_strategy_funcs) | set(p.op_single_dim_strategy_funcs), key=op_name):
            name = op_name(op)
            if ops is not None and name not in ops or op in _REPLACED or not _writes_dtensor_may_move(op):
                continue  # (an op replaced above runs verified strategies, which keep them: _expanded)
            _guard_writes(op)
            _OWNERS[op] = report
            report.installed.append(name)
            if RULES_WRITES not in report.guarded:
                report.guarded.append(RULES_WRITES)
        if ops is None:  # DTensor's machinery, for every op: not for a call that names some
            _guard_decompositions(report)
    report.handled += dtensor_handlers.install(ops, has_rule=dtensor_has_rule, owner=report)
    _clear_sharding_prop_cache()
    return report


_EXPLORED: dict = {}  # op -> signature -> the strategies register_op explored
_OWNERS: dict = {}  # op -> the report of the register() or register_op() call that installed its strategies


def register_op(op: torch._ops.OpOverload, args: tuple, kwargs: dict | None = None, *,
                cache: RuleCache | None = None) -> RegisterReport:
    """Find the rules of ``op`` on an example call and install them into DTensor: for a
    user's custom op (``torch.library.custom_op``: the object it returns or its
    ``.default`` overload), which no table holds and DTensor has no rule for. The rules are
    explored live (ShardCombine on the call's signature, in a forked child where the
    process can fork) and cached, like ``parallelize``'s; each call adds its signature to
    those installed for the op. A call of another signature keeps
    DTensor's fallback: everything replicated. DTensor's own rules are left alone."""
    from metaspmd.cache import RuleCache
    from metaspmd.resolve import resolve_call
    from metaspmd.runtime import check_cache

    from .dtensor import dtensor_has_rule
    from .rules_at_runtime import call_of, live_exploration
    from .tensor_ops import TorchOps

    op = _overload(op)
    args, kwargs = _example_call(args, kwargs)
    problem = _schema_problem(op, args, kwargs)
    if problem:  # before exploring: every run would fail, and the report would blame DTensor
        raise TypeError(f"the example call of {op_name(op)} does not fit its schema ({op._schema}): {problem}")
    check_cache(cache)
    name, report = op_name(op), RegisterReport()
    # a rule register_op installed before counts as DTensor's own: it grows by signature
    why = "DTensor has its own rule" if dtensor_has_rule(op) and op not in _EXPLORED else _supported_schema(op)
    if why:
        report.skipped[name] = why
        return report
    with _disable_current_modes():  # the rules are about the op, not a simulation the caller runs
        call = call_of(op, args, kwargs)
        entry = resolve_call(name, call, TorchOps(), "torch", cache if cache is not None else RuleCache(),
                             live_exploration())
    strategies = tuple(entry.all_strategies())
    if not _installable(op, strategies):
        report.skipped[name] = f"{_no_installable(op)} ({entry.reason or entry.status})"
        return report
    _EXPLORED.setdefault(op, {})[entry.signature] = strategies
    _install(op, _sharding_fn(op, _EXPLORED[op]))
    _OWNERS[op] = report  # the op's signatures so far, all of which unregister(report) takes back
    _clear_sharding_prop_cache()
    report.installed.append(name)
    return report


def _op_names(ops) -> list[str] | None:
    """``register``'s ops as a list of names. One name (or overload) is one op: iterated, a
    str would be its characters."""
    if ops is None:
        return None
    if isinstance(ops, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        ops = [ops]  # a packet iterates as its overloads' bare names ("default")
    try:
        given = list(ops)
    except TypeError:
        raise TypeError(f"ops must be op names (\"aten.mm.default\" or a list of them) or None, "
                        f"got {ops!r:.80} of type {type(ops).__qualname__}") from None
    names = []
    for n in given:
        if isinstance(n, torch._ops.OpOverloadPacket):
            names += [op_name(getattr(n, o)) for o in n.overloads()]
        else:
            names.append(op_name(n) if isinstance(n, torch._ops.OpOverload) else n)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"ops must be op names such as \"aten.mm.default\", got {bad[0]!r:.80} "
                        f"of type {type(bad[0]).__qualname__}")
    return names


def _overload(op) -> torch._ops.OpOverload:
    """``register_op``'s op as one overload: a ``torch.library.custom_op`` object gives the
    overload it defines; a packet (``torch.ops.aten.mm``) names several, so it is refused."""
    if isinstance(op, torch._ops.OpOverload):
        return op
    defined = getattr(op, "_opoverload", None)  # torch.library.custom_op's CustomOpDef
    if isinstance(defined, torch._ops.OpOverload):
        return defined
    if isinstance(op, torch._ops.OpOverloadPacket):
        overloads = op.overloads() or ["default"]
        raise TypeError(f"register_op takes one overload of an op, got the packet torch.ops.{op} (overloads: "
                        f"{', '.join(overloads)}): pass one of them, e.g. torch.ops.{op}.{overloads[0]}")
    raise TypeError(f"register_op takes an op overload (torch.ops.<namespace>.<op>.<overload>, or a "
                    f"torch.library.custom_op), got a {type(op).__qualname__} {op!r:.80}")


def _example_call(args, kwargs) -> tuple[tuple, dict]:
    """``register_op``'s example call, checked: ``tuple(tensor)`` would split a tensor into its rows."""
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of the op's positional arguments, got a "
                        f"{type(args).__module__}.{type(args).__qualname__} (for one argument write (x,))")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict of the op's keyword arguments or None, got a "
                        f"{type(kwargs).__qualname__}")
    return tuple(args), dict(kwargs or {})


def _schema_problem(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str:
    """How ``args`` and ``kwargs`` fail to bind to ``op``'s arguments, or ''."""
    arguments = op._schema.arguments
    positional = [a.name for a in arguments if not a.kwarg_only]
    if len(args) > len(positional):
        return f"it takes at most {len(positional)} positional arguments, got {len(args)}"
    unknown = sorted(set(kwargs) - {a.name for a in arguments})
    if unknown:
        return f"it has no argument {unknown[0]!r}"
    twice = sorted(set(positional[:len(args)]) & set(kwargs))
    if twice:
        return f"argument {twice[0]!r} is given both by position and by keyword"
    given = set(positional[:len(args)]) | set(kwargs)
    missing = [a.name for a in arguments if a.name not in given and not a.has_default_value()]
    return f"argument {missing[0]!r} is missing" if missing else ""


def _dtensor_needs_a_strategy(op: torch._ops.OpOverload) -> bool:
    """Whether DTensor runs ``op`` on DTensors only through a strategy installed for it (it
    takes a tensor, and DTensor has no decomposition of it) whose output a DTensor can hold.
    With no verified strategy DTensor runs (``hash_tensor``'s reduce by xor), the installed
    function still offers every input replicated, which holds for every op."""
    from torch.distributed.tensor._decompositions import DecompShardingStrategy

    takes_a_tensor = any(isinstance(a.type, torch.TensorType) for a in op._schema.arguments)
    return takes_a_tensor and not makes_sparse(op_name(op)) and not DecompShardingStrategy.has_decomp(op)


def _no_installable(op: torch._ops.OpOverload) -> str:
    if makes_sparse(op_name(op)):
        return "it gives a sparse tensor, which a DTensor cannot hold"
    if shards_rewrite_call(op):
        return "its shards run the op with sizes from the local shard, which DTensor does not rewrite"
    return "no strategy DTensor can run"


def unregister(report: RegisterReport) -> None:
    """Remove what ``register`` (or ``register_op``) installed, as the report it returned
    says (tests, or switching tables in one process): what that call installed and no later
    call took over; DTensor's own rules are never touched. Repeating it does nothing."""
    from . import dtensor_handlers

    if not isinstance(report, RegisterReport):
        raise TypeError(f"unregister takes the RegisterReport that register() or register_op() returned, got "
                        f"{report!r:.80} of type {type(report).__qualname__}")
    dtensor_handlers.uninstall(report.handled, owner=report)
    _unguard_decompositions(report)
    p = _dtensor()[0]._op_dispatcher.sharding_propagator
    for name in report.installed:
        op = overload_named(name)
        if _OWNERS.get(op) is not report:
            continue  # undone already, or installed again since by another call
        del _OWNERS[op]
        _EXPLORED.pop(op, None)
        if op in _REPLACED:
            _restore(op)
            continue
        p.op_strategy_funcs.pop(op, None)
        p.op_to_schema_info.pop(op, None)
    _clear_sharding_prop_cache()


__all__ = [  # noqa: F822 -- the table's names and dtensor_has_rule load on first use (__getattr__)
    "REFUTED", "RegisterReport", "add_table", "dtensor_has_rule", "dtensor_placements", "lookup", "neighbour_rules",
    "refuted", "register", "register_op", "remove_table", "table", "unregister",
]
