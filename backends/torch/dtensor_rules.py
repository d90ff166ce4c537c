"""The generated DTensor rule table at runtime: lookup, and installation into DTensor.

``register()`` installs table rules through ``register_sharding`` for the ops DTensor
has no rule for. It leaves DTensor's own rules alone: ``register_sharding`` cannot
override single-dim strategies, and DTensor's hand-written rules for the rest are
already trusted by its users.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._ops._math_ops import _NormPartial
from torch.utils._python_dispatch import _disable_current_modes

from metaspmd.cache import RuleCache
from metaspmd.codegen.model import Placement, placement_rule
from metaspmd.signature import signature, split_signature, value_token

from .catalog import exact_sizes, op_name, positional_names
from .tensor_ops import dtype_kind
from .views import shards_rewrite_call


class SpecOps:
    """Just enough of the TensorOps protocol to compute signatures over DTensorSpecs."""

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, (DTensorSpec, torch.Tensor))

    def shape(self, x) -> tuple[int, ...]:
        return tuple(x.shape)

    def dtype_kind(self, x) -> str:
        return dtype_kind(x.tensor_meta.dtype if isinstance(x, DTensorSpec) else x.dtype)

_SPEC_OPS = SpecOps()


_ADDED: dict = {}  # tables added with add_table: a user's custom ops, swept offline


def _builtin() -> dict:
    from metaspmd.generated.torch_rules import RULES

    return RULES


def table() -> dict:
    """Every op's table rules: the generated table's, with added tables' over them."""
    return {**_builtin(), **_ADDED} if _ADDED else _builtin()


def _rules_of(name: str) -> dict | None:
    """One op's table rules, without merging whole tables per lookup."""
    return _ADDED[name] if name in _ADDED else _builtin().get(name)


def add_table(rules: dict) -> None:
    """Look ops up in ``rules`` too: the ``RULES`` of a table generated from a registry of
    one's own custom ops (``tools/sweep.py --backend torch --kernels MODULE --out DIR``, then
    ``tools/codegen.py --backend torch --registry DIR --out GEN``). ``parallelize`` and
    ``register`` then find those ops' rules without exploring them live; an op in both
    tables takes the added one's."""
    _ADDED.update(rules)
    _forget_lookups()


def remove_table(rules: dict) -> None:
    """Undo ``add_table(rules)``."""
    for name in rules:
        _ADDED.pop(name, None)
    _forget_lookups()


def _forget_lookups() -> None:
    """Drop what was looked up in the tables before they changed (a miss is memoized too)."""
    _INFO.clear()
    _LOOKUPS.clear()


def masked_by_dtensor() -> tuple[str, ...]:
    """Ops whose table lists row-cut strategies that DTensor's own rule masks."""
    from metaspmd.generated.torch_rules import MASKED_BY_DTENSOR

    return MASKED_BY_DTENSOR


_IGNORED = frozenset({"memory_format", "pin_memory"})  # change strides or allocation, never values


@dataclass
class _OpInfo:
    """Per-op facts the lookup needs, computed once."""

    names: tuple[str, ...]
    entries: dict | None
    defaults: dict  # arg name -> token of its default value
    exact_sizes: dict[str, slice]  # the dims keyed by their sizes (catalog.exact_sizes)
    _normalized: dict | None = None

    def normalized(self) -> dict:
        """The op's table entries by normalized signature."""
        if self._normalized is None:
            self._normalized = {}
            for sig, rules in (self.entries or {}).items():
                self._normalized.setdefault(normalize(sig, self.defaults), rules)
        return self._normalized


_INFO: dict = {}


def op_info(op: torch._ops.OpOverload) -> _OpInfo:
    info = _INFO.get(op)
    if info is None:
        defaults = {}
        for a in op._schema.arguments:
            if a.has_default_value():
                try:
                    defaults[a.name] = value_token(_SPEC_OPS, a.default_value)
                except Exception:  # noqa: BLE001 - an exotic default: never dropped
                    pass
        info = _INFO[op] = _OpInfo(positional_names(op), _rules_of(op_name(op)), defaults, exact_sizes(op))
    return info


def normalize(sig: str, defaults: dict) -> str:
    """The signature without arguments that cannot change the result: a memory format, pin
    memory, or an argument given at its default value (captured graphs spell defaults out,
    samples usually leave them out). Two calls with one normalized signature are the same call."""
    kept = [n + sep + v for n, sep, v in split_signature(sig)
            if not (n in _IGNORED or (sep == "=" and defaults.get(n) == v))]
    return " ".join(kept)


def call_key(x: Any) -> Any:
    """A hashable key of a call's arguments that determines its signature: tensor and spec
    shapes and dtypes, and every other value with its type (1, 1.0 and True differ)."""
    if isinstance(x, torch.Tensor):
        return (x.shape, x.dtype)
    t = type(x)
    if t is list or t is tuple:
        return (t, tuple(call_key(y) for y in x))
    if isinstance(x, DTensorSpec):
        return (x.shape, x.tensor_meta.dtype)
    if t is dict:
        return (t, tuple((k, call_key(v)) for k, v in sorted(x.items())))
    return (t, x)


_LOOKUPS: dict = {}


def lookup(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple | None:
    """The table's strategies for this call (tensors or DTensorSpecs), or None. Looked up by
    signature, then by normalized signature; memoized per (op, shapes, dtypes, arguments)."""
    try:
        key = (op, call_key(args), call_key(kwargs) if kwargs else None)
        return _LOOKUPS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable argument: no memo
        return _lookup(op, args, kwargs)
    found = _LOOKUPS[key] = _lookup(op, args, kwargs)
    return found


def _lookup(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple | None:
    info = op_info(op)
    if info.entries is None:
        return None
    sig = signature(_SPEC_OPS, info.names, args, kwargs, info.exact_sizes)
    found = info.entries.get(sig)
    if found is None:
        found = info.normalized().get(normalize(sig, info.defaults))
    return found


def _is_flag(value: str) -> bool:
    return value in ("True", "False") or (value[:1] == "[" and all(v in ("True", "False") for v in value[1:-1].split(",")))


def _structure(items: list[tuple[str, str, str]]) -> tuple:
    """What a signature says of its tensor arguments (dtype kind and shape pattern, the
    optional ones left out) and of its flags (``keepdim``, ``output_mask``), which can
    change the outputs' number and ranks."""
    return tuple((name, value) for name, sep, value in items if sep == ":" or value == "None" or _is_flag(value))


def neighbour_rules(op: torch._ops.OpOverload, sig: str) -> tuple:
    """The table's rules for the op at its neighbouring signature: the same tensor
    arguments and flags, other values elsewhere (a layer norm's ``normalized_shape``, a
    scalar operand); of several, the one with the most arguments equal to this one's.
    Candidates to verify at a call the table misses; () where there is none."""
    info = op_info(op)
    mine = split_signature(normalize(sig, info.defaults))
    best, most = (), -1
    for other, rules in (info.entries or {}).items():
        theirs = split_signature(normalize(other, info.defaults))
        if _structure(theirs) == _structure(mine) and len(set(theirs) & set(mine)) > most:
            best, most = rules, len(set(theirs) & set(mine))
    return best


def dtensor_has_rule(op: torch._ops.OpOverload) -> bool:
    p = DTensor._op_dispatcher.sharding_propagator
    return op in p.op_single_dim_strategy_funcs or op in p.op_strategy_funcs or op in p.op_to_rules


def _resolve(name: str) -> torch._ops.OpOverload | None:
    namespace, family, overload = name.split(".", 2)
    packet = getattr(getattr(torch.ops, namespace), family, None)
    return getattr(packet, overload, None) if packet is not None else None


def _supported_schema(op: torch._ops.OpOverload) -> str:
    """Why register_sharding cannot carry this op's rules, or '' when it can."""
    schema = op._schema
    if schema.is_mutable:
        return "mutates an input"
    if not schema.returns or any(str(r.type) != "Tensor" for r in schema.returns):
        return "returns something other than plain tensors"
    if any(str(a.type) in ("Tensor[]", "Tensor?[]") for a in schema.arguments):
        return "takes a list of tensors"
    return ""


def _sharding_fn(op: torch._ops.OpOverload, rules_by_sig: dict):
    names, sized = positional_names(op), exact_sizes(op)
    n_out = len(op._schema.returns)

    def strategies(*args, **kwargs):
        is_spec = [isinstance(a, DTensorSpec) for a in args]
        replicate_all = ([Replicate()] * n_out, [Replicate() if s else None for s in is_spec])
        rules = rules_by_sig.get(signature(_SPEC_OPS, names, args, kwargs, sized), ())
        out = [replicate_all]
        specs = [a for a, s in zip(args, is_spec) if s]
        for ins, outs in rules:
            if len(ins) != sum(is_spec) or len(outs) != n_out:
                continue  # the call passes tensors by keyword: not this table entry's shape
            if not _shards_line_up(ins, [tuple(a.shape) for a in specs]):
                continue
            it = iter(ins)
            out.append((list(outs), [next(it) if s else None for s in is_spec]))
        return out

    return strategies


def _shards_line_up(ins, shapes) -> bool:
    """Do the inputs a table rule shards have one length along their sharded dims? A
    label cuts its dims at the same bounds, verified on dims of one length only (a gather's
    index narrower than self, cut with it, takes the wrong columns). The table keeps no
    labels: a rule joining independent parts of different lengths is passed over too."""
    return len({shape[p.dim] for p, shape in zip(ins, shapes) if isinstance(p, Shard) and p.dim < len(shape)}) <= 1


def _uncut_if_rewritten(op: torch._ops.OpOverload, rules_by_sig: dict) -> dict:
    """The op's rules that DTensor can run as they are. DTensor calls the op on each shard
    with the call's own arguments; a derived rule that cuts an input of ``squeeze_copy`` or
    ``as_strided_copy`` holds only with those arguments rewritten from the local shard (a
    shard of one row must not be squeezed), so there only rules with no cut input stay."""
    if not shards_rewrite_call(op):
        return rules_by_sig
    return {sig: tuple(r for r in rules if not any(isinstance(p, Shard) for p in r[0]))
            for sig, rules in rules_by_sig.items()}


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
    for name in sorted(ops if ops is not None else rules):
        op = _resolve(name) if name in rules else None
        if op is None:
            report.skipped[name] = "no rule in the table" if name not in rules else "not an ATen op here"
            continue
        if dtensor_has_rule(op):
            report.skipped[name] = "DTensor has its own rule"
            continue
        if name in masked_by_dtensor():  # the table's row-cut strategy is DTensor's own, masked
            report.skipped[name] = "its table rules need DTensor's own rule, which masks positions"
            continue
        why = _supported_schema(op)
        if why:
            report.skipped[name] = why
            continue
        op_rules = _uncut_if_rewritten(op, rules[name])
        if not any(op_rules.values()):
            report.skipped[name] = "its shards run the op with sizes from the local shard, which DTensor does not rewrite"
            continue
        register_sharding(op)(_sharding_fn(op, op_rules))
        report.installed.append(name)
    _clear_sharding_prop_cache()
    return report


_EXPLORED: dict = {}  # op -> signature -> strategies that register_op installed


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

    from .parallelize import _live_exploration  # both import this module
    from .rules_at_runtime import call_of
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
                             _live_exploration())
    rules = [placement_rule(s) for s in entry.all_strategies()]
    placed = tuple(dict.fromkeys((tuple(map(_torch_placement, r.inputs)), tuple(map(_torch_placement, r.outputs)))
                                 for r in rules if r is not None))
    if not placed:
        report.skipped[name] = f"no strategy DTensor can run ({entry.reason or entry.status})"
        return report
    _EXPLORED.setdefault(op, {})[entry.signature] = placed
    register_sharding(op)(_sharding_fn(op, _EXPLORED[op]))
    _clear_sharding_prop_cache()
    report.installed.append(name)
    return report


def _torch_placement(p: Placement) -> Any:
    """A codegen Placement as the torch.distributed.tensor placement it names."""
    if p.kind == "Shard":
        return Shard(p.dim)
    if p.kind == "Partial":
        return _NormPartial(2) if p.op == "norm2" else Partial(p.op)
    return Replicate()


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
