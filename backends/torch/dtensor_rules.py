"""Installing verified rules into DTensor.

``register()`` installs the table's rules through ``register_sharding`` for the ops
DTensor has no rule for; ``register_op`` explores a custom op's rules on an example call
and installs them. Both project the rule model onto ``DTENSOR_REGISTER`` (the one place
that says what DTensor runs of a rule) and place through the DTensor adapter. DTensor's
own rules are left alone: ``register_sharding`` cannot override single-dim strategies,
and DTensor's hand-written rules for the rest are already trusted by its users.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from metaspmd.cache import RuleCache
from metaspmd.placement import Shard
from metaspmd.signature import signature
from metaspmd.spec import Strategy
from metaspmd.target import DTENSOR_REGISTER, cuts_line_up, project

from .catalog import exact_sizes, op_name, positional_names
from .dtensor import dtensor_has_rule, to_dtensor_placements
from .table import _SPEC_OPS, add_table, lookup, neighbour_rules, remove_table, table
from .views import shards_rewrite_call


def _resolve(name: str) -> torch._ops.OpOverload | None:
    namespace, family, overload = name.split(".", 2)
    packet = getattr(getattr(torch.ops, namespace), family, None)
    return getattr(packet, overload, None) if packet is not None else None


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
    return [x for x in tree_leaves((list(args), kwargs)) if isinstance(x, DTensorSpec)]


def _installable(op: torch._ops.OpOverload, strategies: Sequence[Strategy]) -> tuple:
    """The strategies DTensor runs, each with its placements per input and per output. A
    derived rule that cuts an input of ``squeeze_copy`` or ``as_strided_copy`` holds only
    with the call's arguments rewritten from the local shard (a shard of one row must not
    be squeezed), which DTensor does not do: there only rules with no cut input stay."""
    name, rewrites = op_name(op), shards_rewrite_call(op)
    out = []
    for s in strategies:
        a = project(s, DTENSOR_REGISTER, name)
        if a and not (rewrites and any(isinstance(p, Shard) for p in a.inputs)):
            out.append((s, to_dtensor_placements(a.inputs), to_dtensor_placements(a.outputs)))
    return tuple(out)


def dtensor_placements(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[tuple, tuple]]:
    """The table's strategies for this call that DTensor runs, as (input placements, output
    placements) in DTensor's types; [] on a table miss."""
    return [(ins, outs) for _, ins, outs in _installable(op, lookup(op, args, kwargs) or ())]


def _sharding_fn(op: torch._ops.OpOverload, strategies_by_sig: dict):
    """DTensor's strategy function for ``op``: all-Replicate, then the verified strategies
    at the call's signature whose cuts line up at its shapes."""
    names, sized = positional_names(op), exact_sizes(op)
    n_out = len(op._schema.returns)
    installable = {sig: _installable(op, ss) for sig, ss in strategies_by_sig.items()}
    by_label = {sig: {s.label: s for s in ss} for sig, ss in strategies_by_sig.items()}

    def strategies(*args, **kwargs):
        specs = _spec_leaves(args, kwargs)
        out = [([Replicate()] * n_out, [Replicate()] * len(specs))]
        sig = signature(_SPEC_OPS, names, args, kwargs, sized)
        shapes = [tuple(a.shape) for a in specs]
        seen = set()
        for s, ins, outs in installable.get(sig, ()):
            if len(ins) != len(shapes) or len(outs) != n_out:
                continue  # another number of tensors than this table entry's
            if (ins, outs) in seen or not cuts_line_up(s, shapes, by_label[sig]):
                continue
            seen.add((ins, outs))
            out.append((list(outs), list(ins)))
        return out

    return strategies


@dataclass
class RegisterReport:
    installed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # op -> reason

    def __str__(self) -> str:
        return f"installed metaspmd rules for {len(self.installed)} ops; skipped {len(self.skipped)}"


def register(ops: list[str] | None = None) -> RegisterReport:
    """Install table rules into DTensor for ops it has no rule for; report what was done."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    from torch.distributed.tensor.experimental import register_sharding

    report = RegisterReport()
    rules = table()
    for name in sorted(ops if ops is not None else rules.ops()):
        entries = rules.entries(name)
        op = _resolve(name) if entries is not None else None
        if op is None:
            report.skipped[name] = "no rule in the table" if entries is None else "not an ATen op here"
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
        if not any(_installable(op, ss) for ss in op_rules.values()):
            report.skipped[name] = _no_installable(op)
            continue
        register_sharding(op)(_sharding_fn(op, op_rules))
        report.installed.append(name)
    _clear_sharding_prop_cache()
    return report


_EXPLORED: dict = {}  # op -> signature -> the strategies register_op explored


def register_op(op: torch._ops.OpOverload, args: tuple, kwargs: dict | None = None, *,
                cache: RuleCache | None = None) -> RegisterReport:
    """Find the rules of ``op`` on an example call and install them into DTensor: for a
    user's custom op (``torch.library.custom_op``), which no table holds and DTensor has no
    rule for. The rules are explored live (ShardCombine on the call's signature, in a
    forked child where the process can fork) and cached, like ``parallelize``'s; each call
    adds its signature to those installed for the op. A call of another signature keeps
    DTensor's fallback: everything replicated. DTensor's own rules are left alone."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    from torch.distributed.tensor.experimental import register_sharding

    from metaspmd.resolve import resolve_call

    from .rules_at_runtime import call_of, live_exploration
    from .tensor_ops import TorchOps

    name, report = op_name(op), RegisterReport()
    # a rule register_op installed before counts as DTensor's own: it grows by signature
    why = "DTensor has its own rule" if dtensor_has_rule(op) and op not in _EXPLORED else _supported_schema(op)
    if why:
        report.skipped[name] = why
        return report
    with _disable_current_modes():  # the rules are about the op, not a simulation the caller runs
        call = call_of(op, tuple(args), dict(kwargs or {}))
        entry = resolve_call(name, call, TorchOps(), "torch", cache if cache is not None else RuleCache(),
                             live_exploration())
    strategies = tuple(entry.all_strategies())
    if not _installable(op, strategies):
        report.skipped[name] = f"{_no_installable(op)} ({entry.reason or entry.status})"
        return report
    _EXPLORED.setdefault(op, {})[entry.signature] = strategies
    register_sharding(op)(_sharding_fn(op, _EXPLORED[op]))
    _clear_sharding_prop_cache()
    report.installed.append(name)
    return report


def _no_installable(op: torch._ops.OpOverload) -> str:
    if shards_rewrite_call(op):
        return "its shards run the op with sizes from the local shard, which DTensor does not rewrite"
    return "no strategy DTensor can run"


def unregister(report: RegisterReport) -> None:
    """Remove what ``register`` installed (tests, or switching tables in one process)."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    p = DTensor._op_dispatcher.sharding_propagator
    for name in report.installed:
        op = _resolve(name)
        _EXPLORED.pop(op, None)
        p.op_strategy_funcs.pop(op, None)
        p.op_to_schema_info.pop(op, None)
    _clear_sharding_prop_cache()


__all__ = [
    "RegisterReport", "add_table", "dtensor_has_rule", "dtensor_placements", "lookup", "neighbour_rules", "register",
    "register_op", "remove_table", "table", "unregister",
]
