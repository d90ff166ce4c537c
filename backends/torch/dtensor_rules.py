"""Installing verified rules into DTensor.

``register()`` installs the table's rules as ``register_sharding`` does, for the ops
DTensor has no rule for; ``register_op`` explores a custom op's rules on an example call
and installs them. Both project the rule model onto ``DTENSOR_REGISTER`` (the one place
that says what DTensor runs of a rule) and place through the DTensor adapter. DTensor's
own rules are left alone, except those refuted on real DTensor (``REFUTED``), which
``register()`` replaces with verified strategies (``replace_refuted=False`` keeps them), and
those that may move a tensor the op writes in place, which it guards. Ops DTensor refuses
for its machinery's sake (data-dependent output shapes) get handlers (``dtensor_handlers``).

Importing this module starts neither DTensor nor the rule table (``torch.distributed.tensor``
takes about a second to import): both load on first use.
"""

from __future__ import annotations

import sys
import warnings
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

from . import catalog, dtensor_empty, dtensor_masks
from . import table as table_module
from .catalog import exact_sizes, op_name, overload_named, positional_names, tagged_random
from .dtensor_masks import MASKS_REDUCED
from .dtensor_refuted import REFUTED, REFUTED_AT, argument, refuted, spec_leaves
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
    if schema.is_mutable and not _in_place_of_values(op):
        return "mutates an input"
    if (not schema.returns and not schema.is_mutable) or any(str(r.type) != "Tensor" for r in schema.returns):
        return "returns something other than plain tensors"
    return ""


# In-place ops that write a tensor's storage or metadata, not values computed where it lies.
_WRITES_STORAGE = frozenset({
    "aten.resize_.default", "aten.resize_as_.default", "aten.set_.default", "aten.set_.source_Storage",
    "aten.set_.source_Storage_storage_offset", "aten.set_.source_Tensor", "aten.set_.source_Tensor_storage_offset",
    "aten.set_data.default", "aten.requires_grad_.default"})


def _in_place_of_values(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` writes new values into its self and nothing else (``addr_``,
    ``masked_scatter_``, ``_add_relu_``), or returns nothing and writes values into the
    tensors and tensor lists it is given (``_fused_sgd_``, ``_foreach_copy_``), so that its
    verified rules can go to DTensor with the written tensors kept where they lie
    (``_expanded``) and written back where they move them (``write_back_handler``). Not:
    random ops (a shard's draw is not the whole draw's), in-place views and storage writes
    (they change self's metadata, not its values), out= ops, and the ops DTensor runs
    through its decomposition path, which ``register()`` guards."""
    from torch.distributed.tensor._decompositions import DecompShardingStrategy

    from .dtensor_handlers import in_place

    written = [a for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    of_values = (in_place(op) and len(written) == 1) or (
        not op._schema.returns and bool(written)
        and all(str(a.type) in ("Tensor", "List[Tensor]") and not a.is_out for a in written))
    return (of_values and not tagged_random(op) and torch.Tag.inplace_view not in op.tags
            and op_name(op) not in _WRITES_STORAGE and not DecompShardingStrategy.has_decomp(op))


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
    placements) in DTensor's types; [] on a table miss. They are the table's as they stand:
    an added table's (``add_table``), which ``register()`` verifies at each call first, are
    not verified here."""
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
        specs = spec_leaves(args, kwargs)
        out = [([Replicate()] * n_out, [Replicate()] * len(specs))]
        rules = rules_of(args, kwargs)
        held = runnable.get(id(rules))
        if held is None or held[0] is not rules:
            held = runnable[id(rules)] = (rules, _installable(op, rules), {s.label: s for s in rules})
        shapes = [tuple(a.shape) for a in specs]
        written = _written_leaves(op, args, kwargs, every=True) if not n_out else []
        for s, ins, outs in held[1]:
            if written:
                outs = _written_in_place(outs, ins, written)
                if outs is None:
                    continue
            if len(ins) != len(shapes) or len(outs) > n_out:
                continue  # another number of tensors than this entry's (fewer outputs: _with_absent_outputs)
            if (list(outs), list(ins)) not in out and cuts_line_up(s, shapes, held[2]):
                out.append((list(outs), list(ins)))
        return out

    return strategies


def _written_in_place(outs: Sequence, ins: Sequence, written: Sequence[int]) -> tuple | None:
    """The outputs DTensor places of a strategy of an op that returns nothing (none), where
    the rule's outputs, the written tensors' new values in order, lie as those tensors lie
    (``written``: their positions among the inputs): written in place, each is then right
    where it is. None where one does not: that strategy would change a written tensor's
    placement, which an op that returns nothing cannot."""
    if len(outs) != len(written) or any(o != ins[i] for o, i in zip(outs, written) if i < len(ins)):
        return None
    return ()


def _sharding_fn(op: torch._ops.OpOverload, explored: dict, cache: RuleCache | None = None):
    """DTensor's strategy function for ``op``: at a signature of ``explored`` (signature ->
    the example's tensor shapes and dtypes, and the strategies verified there), those
    strategies at the example's shapes and dtypes, and the call's own verified rules at
    others (a user's kernel may branch on any size or dtype; a rule of torch's op found on
    a stand-in holds at the example's sizes); none at another signature."""
    from .table import _SPEC_OPS, call_key

    names, sized = positional_names(op), exact_sizes(op)
    at_other_sizes: dict = {}

    def rules_of(args, kwargs):
        found = explored.get(signature(_SPEC_OPS, names, args, kwargs, sized))
        if found is None:
            return ()
        layouts, strategies = found
        if tensor_layouts(args, kwargs) == layouts:
            return strategies
        key = call_key((args, kwargs))
        if key not in at_other_sizes:
            at_other_sizes[key] = _rules_at_call(op, args, kwargs, cache)
        return at_other_sizes[key]

    return _strategy_fn(op, rules_of)


def tensor_layouts(args: tuple, kwargs: dict) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """The shapes and dtypes of a call's tensors (or DTensorSpecs), in ``spec_leaves``' order."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    return tuple((tuple(x.shape), x.tensor_meta.dtype if isinstance(x, DTensorSpec) else x.dtype)
                 for x in tree_leaves((list(args), kwargs)) if isinstance(x, (torch.Tensor, DTensorSpec)))


def _install(op: torch._ops.OpOverload, strategies, own=None) -> None:
    """``strategies`` as DTensor's rule for ``op``, expanded to the mesh as
    ``register_sharding`` expands them, and kept only where DTensor runs them as placed
    (``_expanded``). They follow the call's signature, values included (a padding, a fill
    value), so every argument keys DTensor's cache of them; ``register_sharding`` keys on
    tensors and int arguments only, and would hand a call the strategies of another
    padding. ``own``: DTensor's own strategy function for an op whose rule is refuted at
    some calls only (``REFUTED_AT``), which its other calls keep."""
    _register_strategy(op, partial(_expanded, op, strategies, own))


def _register_strategy(op: torch._ops.OpOverload, fn) -> None:
    """``fn`` as DTensor's strategy function for ``op``, every argument keying its cache."""
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    info = RuntimeSchemaInfo(0, [a.name for a in op._schema.arguments if a.kwarg_only] or None, needs_pytree=True)
    _dtensor()[0]._op_dispatcher.sharding_propagator.register_op_strategy(op, fn, info)


def _specs_of(op_schema) -> tuple[tuple, dict]:
    """The call's arguments as DTensor hands a registered strategy function them
    (``OpStrategy`` per tensor), with each tensor's own spec in its place."""
    from torch.distributed.tensor._op_schema import OpStrategy, TupleStrategy

    def spec(x):
        if isinstance(x, OpStrategy):
            return x.strategies[0].output_spec
        if isinstance(x, TupleStrategy):
            return tuple(spec(c) for c in x.children)
        return type(x)(spec(c) for c in x) if isinstance(x, (list, tuple)) else x  # index_put_'s [None, mask]

    return tuple(spec(a) for a in op_schema.args_schema), {k: spec(v) for k, v in op_schema.kwargs_schema.items()}


def _expanded(op: torch._ops.OpOverload, strategies, own, op_schema):
    """The verified strategies over the mesh, less those DTensor would not run as placed.
    DTensor redistributes positional tensors only (``OpSchema.args_spec``): a keyword tensor
    (``weight=`` of a histogram, an out= tensor) is used as it is, so a strategy that places
    it otherwise computes on the wrong values. An in-place op writes self's storage, so
    self is never moved, while its placement may change as the rule says (DTensor's
    dispatcher re-specs self in place: ``fill_`` of a Partial(sum) self holds the fill on
    every rank); where every strategy moves a written tensor, ``WritesMoved`` hands the
    call to the write-back handler. Strategies that hold for even cuts only go where a cut
    is uneven (``_on_uneven_cuts``). A call DTensor's rule is not refuted at
    (``REFUTED_AT``) goes to that rule, ``own``; for an in-place op whose DTensor rule
    refuses a call where none of its strategies keeps self (``_falls_back``), ``own``
    answers the calls it keeps self at, and the verified strategies the others."""
    from torch.distributed.tensor._op_schema import OpSchema
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    args, kwargs = _specs_of(op_schema)
    called = OpSchema(op_schema.op, args, kwargs, schema_info=op_schema.schema_info)  # for its output shapes
    if own is not None and op_name(op) in REFUTED_AT:
        if not REFUTED_AT[op_name(op)](op, args, kwargs):
            return own(op_schema, called)
    elif own is not None:  # DTensor's rule first; the verified strategies where it keeps no self in place
        try:
            return own(op_schema, called)
        except RuntimeError as e:
            if _KEEPS_NO_SELF not in str(e):
                raise
    n_out = len(op._schema.returns)
    found = strategies(*args, **kwargs)
    if any(len(outs) < n_out for outs, _ in found):
        found = _with_absent_outputs(found, n_out, called, _dtensor()[0]._op_dispatcher.sharding_propagator)
    rows = [list(outs) + list(ins) for outs, ins in found]
    expanded = expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, rows, input_index=n_out)
    fixed = [s.placements for s in spec_leaves((), kwargs)]
    placed = [s for s in expanded.strategies
              if not fixed or [x.placements for x in s.input_specs][len(s.input_specs) - len(fixed):] == fixed]
    placed = _on_uneven_cuts(placed, called, _dtensor()[0]._op_dispatcher.sharding_propagator)
    keep = _writes_stay(placed, op, args, kwargs)
    runnable = _redistributable(keep, args, kwargs)
    if keep and not runnable:  # else DTensor picks one and fails naming no op
        raise NotImplementedError(
            f"{op}: every verified strategy that keeps the tensors it writes where they lie moves a cut input "
            "into a Partial placement, which DTensor cannot redistribute; place the inputs as the written "
            "tensors are placed (redistribute them first)")
    expanded.strategies = keep = runnable
    if not keep and placed and _written_leaves(op, args, kwargs):  # the write-back handler moves and writes back
        raise _moved_writes_refused(op, args, kwargs, "of the verified rules", _wanted_of(placed, op, args, kwargs))
    if not keep and fixed:
        from .dtensor_handlers import KeywordPlacementRefused

        raise KeywordPlacementRefused(
            f"{op}: no verified strategy keeps its keyword tensors placed {fixed}, and DTensor does not "
            "redistribute keyword tensors")
    return expanded


def _redistributable(strategies, args: tuple, kwargs: dict) -> list:
    """``strategies`` less those that move an input of the call from a cut, or from another
    Partial, into a Partial placement: DTensor's redistribute has no such move."""
    from torch.distributed.tensor import Partial, Shard

    placed = [x.placements for x in spec_leaves(args, kwargs)]

    def moves(src, dst) -> bool:
        return isinstance(dst, Partial) and src != dst and isinstance(src, (Shard, Partial))

    return [s for s in strategies
            if not any(moves(a, b) for have, spec in zip(placed, s.input_specs or ()) for a, b in zip(have, spec.placements))]


# What DTensor's expansion raises where no strategy of an in-place op keeps self's placement
_KEEPS_NO_SELF = "in-place operations that require placement changes"
IN_PLACE_FALLBACK = ("DTensor's rules of in-place ops fall back to the verified rules where none of theirs keeps "
                     "self where it lies")


# In-place ops whose DTensor rules take self at every placement (the source, or nothing, is
# what moves): hot paths that never fall back, so they keep DTensor's rules as they are
_SELF_AT_ANY_PLACEMENT = frozenset({"aten.copy_.default", "aten.zero_.default"})


def _falls_back(op: torch._ops.OpOverload, rules) -> bool:
    """Whether DTensor's rule of ``op`` goes behind the verified rules for the calls where it
    keeps no self in place (``x[mask] = 0`` on a row-cut x: DTensor's ``index_put_``
    strategies replicate self): an in-place op that writes values into self alone, with
    table rules. Not: pointwise ops (theirs or their out-of-place twin's tag, or DTensor's
    list), whose only such calls are on a Partial self, which no verified rule keeps either;
    in-place views, random ops, ``_SELF_AT_ANY_PLACEMENT``, nor ops set aside or handled
    already."""
    from torch.distributed.tensor._ops._pointwise_ops import pointwise_ops

    from .dtensor_handlers import _out_of_place_twin, in_place

    written = [a for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    twin = _out_of_place_twin(op) if in_place(op) else None
    pointwise = any(o is not None and (torch.Tag.pointwise in o.tags or o in pointwise_ops) for o in (op, twin))
    return (in_place(op) and len(written) == 1 and not pointwise and torch.Tag.inplace_view not in op.tags
            and not tagged_random(op) and op_name(op) not in _SELF_AT_ANY_PLACEMENT | _WRITES_STORAGE
            and rules.entries(op_name(op)) is not None and op not in _REPLACED
            and op not in _dtensor()[0]._op_dispatcher._custom_op_handlers)


def _with_absent_outputs(found, n_out: int, op_schema, propagator) -> list:
    """``found`` (output placements, input placements) with the outputs a call leaves None
    (``convolution_backward`` with ``output_mask=[False, True, True]``) placed None: the
    verified strategies of such a call place the outputs there are, in order, and DTensor
    takes None for the others. A strategy that places every output is given None at the
    absent ones too: over a mesh of two dims, one placing an absent output and one not would
    expand into a spec of both, ``(Replicate(), None)``. A strategy that does not fit the
    call's outputs is dropped."""
    from torch.distributed.tensor._dtensor_spec import TensorMeta

    got = propagator._propagate_tensor_meta_non_cached(op_schema)
    metas = [got] if isinstance(got, TensorMeta) or got is None else list(got)
    absent = {i for i, meta in enumerate(metas) if meta is None}
    out = []
    for outs, ins in found:
        if len(outs) == n_out == len(metas):
            out.append(([None if i in absent else o for i, o in enumerate(outs)], ins))
        elif len(outs) == n_out:
            out.append((outs, ins))
        elif len(outs) + len(absent) == n_out == len(metas):
            there = iter(outs)
            out.append(([None if i in absent else next(there) for i in range(n_out)], ins))
    return out


# Tensors an op writes besides its result: those its schema marks written (``Tensor(a!)``),
# and native_batch_norm's running statistics, which it updates in training undeclared.
_UNDECLARED_WRITES = {"aten.native_batch_norm.default": ("running_mean", "running_var")}


def _written_leaves(op: torch._ops.OpOverload, args: tuple, kwargs: dict, every: bool = False) -> list[int]:
    """The positions, among the call's DTensorSpecs (``spec_leaves``' order), of the
    tensors ``op`` writes in place. out= tensors are keyword tensors, which DTensor keeps
    where they are anyway. ``every``: those its schema marks written, whether or not the
    call writes them (the outputs of an op that returns nothing, in the rules)."""
    schema = op._schema.arguments
    names = {a.name for a in schema if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only}
    if op_name(op) in _UNDECLARED_WRITES:
        names.update(_UNDECLARED_WRITES[op_name(op)])
    if not every and any(a.name == "training" for a in schema) and not argument(op, args, kwargs, "training"):
        names -= {"running_mean", "running_var"}  # a batch norm in eval mode reads them only
    if not every and any(a.name == "grad_scale" for a in schema) and argument(op, args, kwargs, "grad_scale") is None:
        names -= {"grads"}  # a fused optimizer unscales its grads in place only when given a grad_scale
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
    placed = [x.placements for x in spec_leaves(args, kwargs)]
    kept = []
    for s in strategies:
        ins = s.input_specs or ()
        if any(ins[i].placements != placed[i] for i in written if i < len(ins)):
            continue
        if result_is_self and s.output_spec.placements != placed[0]:
            continue
        kept.append(s)
    return kept


def _moved_writes_refused(op: torch._ops.OpOverload, args: tuple, kwargs: dict, whose: str, wanted=None):
    """The refusal of a call every strategy of which (``whose``) moves a written tensor,
    carrying where DTensor's pick would put the written tensors (``wanted``: their positions
    among the call's DTensorSpecs -> placements; ``_wanted``)."""
    from .dtensor_handlers import WritesMoved

    names = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    names += list(_UNDECLARED_WRITES.get(op_name(op), ()))
    return WritesMoved(
        f"{op}: every strategy {whose} moves a tensor the op writes in place ({', '.join(names)}), so the write "
        "would land in a moved copy and the tensor keep its old values; place the written tensors as the op's "
        "other inputs are placed (redistribute them first)", wanted or {})


def _wanted(strategies, written: Mapping[int, int]) -> dict:
    """Where the strategy DTensor would pick (``_moving_cost``) puts each written tensor:
    ``written`` maps its position among a strategy's inputs to its position among the call's
    DTensorSpecs."""
    # DTensor moves nothing into a Partial placement: a strategy that would is no pick (a
    # Partial self of put_'s accumulation rule, on a 2-D mesh)
    movable = [s for s in strategies if not any(p.is_partial() for n in written if n < len(s.input_specs or ())
                                                for p in s.input_specs[n].placements)]
    pick = min(movable, key=_moving_cost, default=None)
    if pick is None:
        return {}
    return {at: tuple(pick.input_specs[n].placements) for n, at in written.items() if n < len(pick.input_specs or ())}


def _wanted_of(strategies, op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict:
    """``_wanted`` of a call's strategies, whose inputs are the call's DTensorSpecs."""
    written = _written_leaves(op, args, kwargs)
    return _wanted(strategies, dict(zip(written, written)))


def _moving_cost(strategy) -> float:
    """What DTensor weighs a strategy by: the cost of moving every input to it (each input
    of a call has one placement, so one cost)."""
    return sum(c[0] if c else 0.0 for c in strategy.redistribute_cost or ())


def _guarded_rule(op: torch._ops.OpOverload, own, op_schema):
    """DTensor's own rule for ``op`` (``own``), less its strategies that move a tensor the
    op writes in place (``_writes_stay``)."""
    from torch.distributed.tensor._op_schema import OpSchema, TupleStrategy

    args, kwargs = _specs_of(op_schema)
    found = own(op_schema, OpSchema(op_schema.op, args, kwargs, schema_info=op_schema.schema_info))
    if isinstance(found, TupleStrategy):
        return _guarded_positions(op, found, args, kwargs)
    kept = _writes_stay(found.strategies, op, args, kwargs)
    if not kept:
        raise _moved_writes_refused(op, args, kwargs, "of DTensor's rule", _wanted_of(found.strategies, op, args, kwargs))
    found.strategies = kept
    return found


def _guarded_positions(op: torch._ops.OpOverload, found, args: tuple, kwargs: dict):
    """A list op's rule (a fused optimizer's: a strategy per list position, each placing the
    lists' elements at that position) less the strategies that move a written element: its
    moment lists followed the parameters' placement, so a replicated ``exp_avg`` of a cut
    parameter was updated in a cut copy."""
    spec_type = _dtensor()[2]
    leaves, written = spec_leaves(args, kwargs), set(_written_leaves(op, args, kwargs))
    starts, k = [], 0
    for a in args:
        starts.append(k)
        k += sum(isinstance(x, spec_type) for x in tree_leaves(a))
    wanted = {}
    for i, child in enumerate(found.children):
        # position i of every list argument that has one, in argument order
        at = [starts[j] + i for j, a in enumerate(args) if isinstance(a, (list, tuple)) and i < len(a)
              and isinstance(a[i], spec_type)]
        ins = (child.strategies[0].input_specs or ()) if child.strategies else ()
        if len(at) > len(ins) or any(ins[n].tensor_meta.shape != leaves[g].tensor_meta.shape for n, g in enumerate(at)):
            continue  # not laid out as expected: DTensor's rule as it is
        mine = {n: g for n, g in enumerate(at) if g in written}
        kept = [s for s in child.strategies if all(s.input_specs[n].placements == leaves[g].placements for n, g in mine.items())]
        if not kept:
            wanted.update(_wanted(child.strategies, mine))
        child.strategies = kept
    if wanted or any(not c.strategies for c in found.children):
        raise _moved_writes_refused(op, args, kwargs, "of DTensor's rule", wanted)
    return found


@dataclass
class RegisterReport:
    installed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # op -> reason
    replaced: list[str] = field(default_factory=list)  # installed in place of a refuted DTensor rule
    handled: list[str] = field(default_factory=list)  # run by dtensor_handlers (all-replicated, extended, written back)
    guarded: list[str] = field(default_factory=list)  # DTensor's machinery kept from wrong answers (DECOMPOSED_EVEN, ...)

    def __str__(self) -> str:
        replaced = f" ({len(self.replaced)} in place of refuted DTensor rules)" if self.replaced else ""
        handled = (f"; handlers for {len(self.handled)} ops (DTensor's machinery refuses them, or a moved written "
                   "tensor is written back)" if self.handled else "")
        guarded = f"; guarded: {', '.join(self.guarded)}" if self.guarded else ""
        # a few skipped ops (register_op's one) with their reasons: the count alone hid why
        why = ("; ".join(f"{op}: {reason}" for op, reason in self.skipped.items())
               if 0 < len(self.skipped) <= 3 else "")
        return (f"installed metaspmd rules for {len(self.installed)} ops{replaced}{handled}{guarded}; "
                f"skipped {len(self.skipped)}" + (f" ({why})" if why else ""))


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
                # a write-back runs the pick on a copy placed as its self: one whose result is placed so too
                whole = [s for s in found.strategies if not in_place or s.output_spec.placements == s.input_specs[0].placements]
                raise _moved_writes_refused(op, args, kwargs, "DTensor derives from its decomposition",
                                            _wanted_of(whole, op, args, kwargs))
            found.strategies = _on_uneven_cuts(kept, op_schema, decomp.sharding_prop) or kept  # never none
        return found

    return propagate_strategy


def _guard_decompositions(report: RegisterReport) -> None:
    from . import dtensor_handlers

    if DECOMPOSED_EVEN in _GUARDS:
        return
    decomp = _dtensor()[0]._op_dispatcher.sharding_propagator.decomp_strategy
    decomp.propagate_strategy = _guarded_decomposition(decomp, type(decomp).propagate_strategy.__get__(decomp))
    _GUARDS[DECOMPOSED_EVEN] = report
    for guard in (DECOMPOSED_EVEN, DECOMPOSED_WRITES):
        if guard not in report.guarded:
            report.guarded.append(guard)
    for op in _decomposed_in_place():
        if dtensor_handlers.install_write_back_handler(op, report):
            report.handled.append(op_name(op))


def _decomposed_in_place() -> list:
    """The in-place ATen ops DTensor runs through its decomposition path (a decomposition,
    and no rule or handler of its own): ``index_add_``, ``scatter_add_``, ``index_copy_`` and
    the like, whose moved self the write-back handler writes back."""
    from torch._decomp import decomposition_table

    from .dtensor_handlers import in_place

    dispatcher = _dtensor()[0]._op_dispatcher
    p = dispatcher.sharding_propagator
    found = []
    for op in decomposition_table:
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or not op._schema.name.endswith("_") \
                or not in_place(op):
            continue
        if op in p.op_strategy_funcs or op in p.op_single_dim_strategy_funcs or op in p.op_to_rules \
                or op in dispatcher._custom_op_handlers:
            continue
        found.append(op)
    return sorted(found, key=op_name)


def _guard_masks(report: RegisterReport) -> None:
    if MASKS_REDUCED in _GUARDS:
        return
    dtensor_masks.guard(_dtensor()[0]._op_dispatcher.sharding_propagator)
    _GUARDS[MASKS_REDUCED] = report
    if MASKS_REDUCED not in report.guarded:
        report.guarded.append(MASKS_REDUCED)


def _unguard_masks(report: RegisterReport) -> None:
    if _GUARDS.get(MASKS_REDUCED) is report:
        del _GUARDS[MASKS_REDUCED]
        dtensor_masks.unguard(_dtensor()[0]._op_dispatcher.sharding_propagator)


def _writes_dtensor_may_move(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` writes a tensor that DTensor's in-place check does not keep in place:
    one besides the self of an op whose name ends in '_' (a fused optimizer's moment lists
    among them)."""
    schema = op._schema.arguments
    first_kept = op._schema.name.split("::")[-1].endswith("_")
    written = [a for i, a in enumerate(schema) if a.alias_info is not None and a.alias_info.is_write
               and not a.kwarg_only and not (i == 0 and first_kept)]
    return op_name(op) in _UNDECLARED_WRITES or bool(written)


def _guard_rule(op: torch._ops.OpOverload) -> None:
    """Put ``_guarded_rule`` of DTensor's own rule in its place (kept for ``unregister``)."""
    _register_strategy(op, partial(_guarded_rule, op, _set_aside(op)))


def _unguard_decompositions(report: RegisterReport) -> None:
    if _GUARDS.get(DECOMPOSED_EVEN) is report:
        del _GUARDS[DECOMPOSED_EVEN]
        decomp = _dtensor()[0]._op_dispatcher.sharding_propagator.decomp_strategy
        decomp.__dict__.pop("propagate_strategy", None)


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
    from .table import lookup, verified_per_call

    found = lookup(op, args, kwargs)
    if found is not None and not verified_per_call(op):
        return found  # the generated table's: they hold at every size their signature leaves open
    # a miss, a user's op (its kernel may branch on any size) or an added table's rules:
    # verified at the call's own sizes (as parallelize verifies them)
    return _rules_at_call(op, args, kwargs, cache)


def _rules_at_call(op: torch._ops.OpOverload, args: tuple, kwargs: dict, cache: RuleCache | None = None
                   ) -> tuple[Strategy, ...]:
    """The call's verified rules, found as ``parallelize`` finds them (the table's where
    they hold, neighbouring signatures' verified at the call, or live ShardCombine, in a
    forked child, cached), on random tensors of the call's shapes."""
    specs = spec_leaves(args, kwargs)
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
    """Put the verified strategies in place of DTensor's own rule for ``op`` (set aside)."""
    own = _set_aside(op)
    _install(op, _verified_fn(op, cache), own=own if op_name(op) in REFUTED_AT else None)


def _set_aside(op: torch._ops.OpOverload):
    """Set DTensor's own rule for ``op`` aside, kept for ``unregister``: its single-dim
    strategy and legacy rule (looked up before any registered strategy) and its custom
    handler (which runs before propagation) leave; the rule comes back as ``_own_rule``."""
    DTensor = _dtensor()[0]
    p, handlers = DTensor._op_dispatcher.sharding_propagator, DTensor._op_dispatcher._custom_op_handlers
    _REPLACED[op] = (p.op_single_dim_strategy_funcs.pop(op, None),
                     p.op_to_schema_info_for_single_dim_strategy.pop(op, None),
                     p.op_to_rules.pop(op, None), handlers.pop(op, None),
                     p.op_strategy_funcs.get(op), p.op_to_schema_info.get(op))
    return _own_rule(op, *_REPLACED[op][::4])


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
    keeps is redistributed instead of computed wrong; DTensor's rules keep the tensors an op
    writes in place where they are (``RULES_WRITES``); DTensor gives no rank an empty shard
    that the op's kernel refuses (``dtensor_empty``); and (``ops`` None) DTensor's
    decomposition path keeps what holds for even cuts only to even cuts (``DECOMPOSED_EVEN``)
    and written tensors where they are (``DECOMPOSED_WRITES``). ``False`` leaves DTensor's
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
                dtensor_handlers.install_keyword_handler(op, report) or \
                (op._schema.is_mutable and dtensor_handlers.install_write_back_handler(op, report)):
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
            if dtensor_handlers.install_mean_as_sum_handler(op, report):
                report.handled.append(name)
        p = _dtensor()[0]._op_dispatcher.sharding_propagator
        for op in sorted(set(p.op_strategy_funcs) | set(p.op_single_dim_strategy_funcs), key=op_name):
            name = op_name(op)
            if ops is not None and name not in ops or op in _REPLACED \
                    or not _writes_dtensor_may_move(op):
                continue  # (an op replaced above runs verified strategies, which keep them: _expanded)
            if op in _dtensor()[0]._op_dispatcher._custom_op_handlers:
                continue  # its handler runs before any rule (_amp_foreach_non_finite_check_and_unscale_'s)
            _guard_rule(op)
            _OWNERS[op] = report
            report.installed.append(name)
            if dtensor_handlers.install_write_back_handler(op, report):
                report.handled.append(name)
            if RULES_WRITES not in report.guarded:
                report.guarded.append(RULES_WRITES)
        for op in sorted(set(p.op_strategy_funcs) | set(p.op_single_dim_strategy_funcs), key=op_name):
            name = op_name(op)
            if ops is not None and name not in ops or not _falls_back(op, rules):
                continue
            _install(op, _verified_fn(op, cache), own=_set_aside(op))
            _OWNERS[op] = report
            report.installed.append(name)
            # where no strategy keeps self at all; the handler runs every call of the op off
            # DTensor's C++ fast path (x[m] = 0 on a replicated x: 15 -> 49 us a call)
            if dtensor_handlers.install_write_back_handler(op, report):
                report.handled.append(name)
            if IN_PLACE_FALLBACK not in report.guarded:
                report.guarded.append(IN_PLACE_FALLBACK)
        if ops is None:  # DTensor's machinery, for every op: not for a call that names some
            _guard_decompositions(report)
            _guard_masks(report)
    # DTensor's choice of a strategy, for the ops this call covers (or, leaving DTensor's
    # rules as they are, for those it installed)
    dtensor_empty.guard(report, frozenset(report.installed) if not replace_refuted
                        else None if ops is None else frozenset(ops))
    report.guarded.append(dtensor_empty.EMPTY_SHARDS_TRIED)
    report.handled += dtensor_handlers.install(ops, has_rule=dtensor_has_rule, owner=report)
    _clear_sharding_prop_cache()
    return report


def _warn_if_registered_before(rules: dict) -> None:
    """``register()`` installs the ops the tables hold when it runs: an op added after it has
    no rule in DTensor, which then raises NotImplementedError at the op's first call without
    a word about the order (``table.AFTER_ADD``)."""
    from .dtensor import dtensor_has_rule

    if not _OWNERS:
        return
    left = sorted(op for op in rules if (fn := overload_named(op)) is not None and fn not in _OWNERS
                  and not dtensor_has_rule(fn))
    if left:
        warnings.warn(f"add_table after register(): {', '.join(left[:5])}{' ...' if len(left) > 5 else ''} "
                      "has no rule in DTensor until register() runs again (or add the table first)",
                      UserWarning, stacklevel=4)


_EXPLORED: dict = {}  # op -> signature -> (the example's tensor shapes and dtypes, the strategies register_op explored)
_OWNERS: dict = {}  # op -> the report of the register() or register_op() call that installed its strategies
table_module.AFTER_ADD.append(_warn_if_registered_before)


def register_op(op: torch._ops.OpOverload, args: tuple, kwargs: dict | None = None, *,
                cache: RuleCache | None = None) -> RegisterReport:
    """Find the rules of ``op`` on an example call and install them into DTensor: for a
    user's custom op (``torch.library.custom_op``: the object it returns or its
    ``.default`` overload), which no table holds and DTensor has no rule for. The rules are
    explored live (ShardCombine on the call's signature, in a forked child where the
    process can fork) and cached, like ``parallelize``'s; each call adds its signature to
    those installed for the op; a call of it at other sizes gets rules verified at its own
    (a user's kernel may branch on any size), found as ``register`` finds a table miss's. A
    call of another signature keeps DTensor's fallback: everything replicated. DTensor's own
    rules are left alone."""
    from metaspmd.cache import RuleCache
    from metaspmd.resolve import resolve_call
    from metaspmd.runtime import check_cache

    from .dtensor import dtensor_has_rule
    from .rules_at_runtime import call_of, live_exploration
    from .tensor_ops import TorchOps

    op = _overload(op)
    args, kwargs = _example_call(args, kwargs)
    problem = catalog.schema_problem(op, args, kwargs)
    if problem:  # before exploring: every run would fail, and the report would blame DTensor
        raise TypeError(f"the example call of {op_name(op)} does not fit its schema ({op._schema}): {problem}")
    check_cache(cache)
    problem = _example_fails(op, args, kwargs)
    if problem:  # a cached signature would install without running it; else the report blames DTensor
        raise ValueError(f"the example call of {op_name(op)} fails, so it shows no rule: {problem.rstrip('.')}. "
                         "Pass a call the op runs")
    name, report = op_name(op), RegisterReport()
    # a rule register_op installed before counts as DTensor's own: it grows by signature
    why = "DTensor has its own rule" if dtensor_has_rule(op) and op not in _EXPLORED else _supported_schema(op)
    why = why or _shapes_unknown(op, args, kwargs)
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
    # the example's shapes and dtypes: a call at others gets its own verified rules
    _EXPLORED.setdefault(op, {})[entry.signature] = tensor_layouts(args, kwargs), strategies
    _install(op, _sharding_fn(op, _EXPLORED[op], cache))
    _OWNERS[op] = report  # the op's signatures so far, all of which unregister(report) takes back
    _clear_sharding_prop_cache()
    report.installed.append(name)
    return report


def _op_names(ops) -> list[str] | None:
    """``register``'s ops as a list of names. One name (or overload) is one op: iterated, a
    str would be its characters."""
    if ops is None:
        return None
    if isinstance(ops, (bytes, bytearray)):
        raise TypeError(f"ops must be op names as str (\"aten.mm.default\"), got bytes {bytes(ops)!r:.80}")
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
    if not names:  # an empty selection, from a filter that matched nothing: None is every op
        raise ValueError(f"ops={ops!r:.80} names no op: pass op names, or None for every op of the table")
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


def _shapes_unknown(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str:
    """Why DTensor cannot work out the example call's output shapes, or '': it runs the op
    on fake tensors (a custom op needs a fake kernel), and without them no rule runs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    if any(type(x) not in (torch.Tensor, torch.nn.Parameter) for x in tensors):
        return ""  # DTensor's own, or LocalTensors: their shapes are found as DTensor finds them
    with _disable_current_modes():
        mode = FakeTensorMode()
        fake = torch.utils._pytree.tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x,
                                            (args, kwargs))
        try:
            with mode:
                op(*fake[0], **fake[1])
        except Exception as e:  # noqa: BLE001 -- the op's own error, reported
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            return f"DTensor cannot find its output shapes on fake tensors: {type(e).__name__}: {first}"
    return ""


def _example_fails(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str:
    """The op's own error on ``register_op``'s example call (a wrong type, sizes that do not
    fit), or ''; a tensor on the meta device is refused (TypeError). It runs once on
    copies of its tensors (an in-place op would write the caller's), in a forked child where
    live exploration uses one (an op that aborts takes only the child). A call on tensor
    subclasses (DTensor, LocalTensor) is left to the exploration, which unwraps them."""
    from metaspmd.isolation import ChildFailed

    from .rules_at_runtime import live_exploration

    tensors = [x for x in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    meta = next((x for x in tensors if x.is_meta), None)
    if meta is not None:
        raise TypeError(f"the example call of {op_name(op)} has a tensor of shape {list(meta.shape)} on the meta "
                        "device, which holds no values to explore: pass real tensors of the same shapes")
    if any(type(x) not in (torch.Tensor, torch.nn.Parameter) for x in tensors):
        return ""
    copies = torch.utils._pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x,
                                          (args, kwargs))

    def run() -> None:
        op(*copies[0], **copies[1])

    isolation = live_exploration()
    try:
        with _disable_current_modes():
            run() if isolation is None else isolation.run(run)
    except ChildFailed as e:
        return str(e).removeprefix("raised ").splitlines()[0]
    except Exception as e:
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return ""


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
    _unguard_masks(report)
    dtensor_empty.unguard(report)
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
