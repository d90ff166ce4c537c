"""DTensor's own sharding rules for one example call.

``DTensorQuery`` asks DTensor's sharding propagator, exactly as dispatch would, which
input placements it accepts on a 1-D mesh without redistributing any input, and which
output placements it gives them. No process group is needed: the mesh is built without
a backend. Placements are strings in DTensor's notation: ``R``, ``S(d)``, ``P(op)``.

Ops with a single-dim strategy are answered from the input tuples the strategy lists
(DTensor accepts inputs as-is only when they match one exactly); other ops are asked
every tuple of offered placements, fewest non-replicated inputs first, up to a cap.
Answers are cached on disk per op: decomposition-based rules trace the decomposition on
every query, which makes them the slow part of a full check.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from metaspmd import pytree
from metaspmd.case import OpCase
from metaspmd.tensor_ops import COMPLEX, FLOAT, INT, TensorOps

from . import catalog

Key = tuple[str, ...]  # one placement string per tensor input (or per tensor output)

SHARD_RE = re.compile(r"^S\((\d+)\)$")
STRIDED_SHARD_RE = re.compile(r"^_S\((\d+), (\d+)\)$")  # _StridedShard(dim, split_factor)
PARTIAL_RE = re.compile(r"^P\((\w+)\)$")
DTENSOR_PARTIALS = ("sum", "avg", "max", "min")
# One name per Partial of a bool output on both sides: sum and max are logical or, product
# and min logical and (the explorer tries max and min on bools).
BOOL_PARTIALS = {"P(sum)": "P(max)", "P(product)": "P(min)"}


# DTensor's _NormPartial(p) of a norm's output: p = 2 is our reduce(norm2). The local norms
# are non-negative, so p = 1 and p = 0 (a count) reduce by sum, p = inf by max, -inf by min.
NORM_RE = re.compile(r"^_NormP\((.+)\)$")
NORM2 = "_NormP(2)"
NORM_PARTIALS = {2.0: NORM2, 1.0: "P(sum)", 0.0: "P(sum)", math.inf: "P(max)", -math.inf: "P(min)"}


def _norm_name(key: str) -> str:
    m = NORM_RE.match(key)
    if not m:
        return key
    try:
        return NORM_PARTIALS.get(float(m[1]), key)
    except ValueError:
        return key


def canonical_names(keys: Key, outputs: Sequence[Any]) -> Key:
    """``keys`` (output placements first) with one name per reduce: the Partials of bool
    outputs renamed, and _NormPartial written as the Partial it equals."""
    return tuple(BOOL_PARTIALS.get(k, k) if j < len(outputs) and outputs[j].dtype == torch.bool else _norm_name(k)
                 for j, k in enumerate(keys))
# How DTensor handles an op, in its own lookup order; these are answered by propagation.
QUERIED = ("single-dim", "op-strategy", "decomposition", "rule")
ANSWER_FORMAT = 6  # part of every cache key: bump when the meaning of an answer changes
LIST_MAX_SHARDED = 2  # non-replicated tensors per tuple asked of calls with tensor lists


@dataclass(frozen=True)
class QueryConfig:
    mesh_size: int = 2  # DTensor refuses to shard a dim smaller than the mesh
    partials: tuple[str, ...] = ("sum",)  # Partial input placements offered
    max_combos: int = 256  # input placement tuples queried per example
    max_seconds: float = 30.0  # querying time per example
    exhaustive: bool = False  # query every tuple, also where a single-dim strategy lists them


def dtensor_support(func: torch._ops.OpOverload) -> str:
    """'custom-handler', one of QUERIED, or 'none' when DTensor cannot run the op at all."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._decompositions import DecompShardingStrategy

    dispatcher = DTensor._op_dispatcher
    prop = dispatcher.sharding_propagator
    if func in dispatcher._custom_op_handlers:
        return "custom-handler"
    if func in prop.op_single_dim_strategy_funcs:
        return "single-dim"
    if func in prop.op_strategy_funcs:
        return "op-strategy"
    if DecompShardingStrategy.has_decomp(func):
        return "decomposition"
    if func in prop.op_to_rules:
        return "rule"
    return "none"


_MESHES: dict[int, Any] = {}


def _mesh(size: int):
    from torch.distributed.device_mesh import DeviceMesh

    if size not in _MESHES:
        _MESHES[size] = DeviceMesh("cpu", list(range(size)), _init_backend=False, _rank=0)
    return _MESHES[size]


def placement(key: str):
    """The DTensor placement a key names ('R', 'S(1)', 'P(sum)')."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    if key == "R":
        return Replicate()
    m = SHARD_RE.match(key)
    if m:
        return Shard(int(m[1]))
    m = PARTIAL_RE.match(key)
    if m:
        return Partial(m[1])
    if key == NORM2:  # asked of out= tensors where our rule reduces by norm2 (_euclidean_dist.out)
        from torch.distributed.tensor._ops._math_ops import _NormPartial

        return _NormPartial(2)
    raise ValueError(f"not a placement: {key!r}")


@dataclass(frozen=True)
class _Slot:
    """Stands for one tensor of the call while its schema is built."""

    index: int


def _is_slot(x: Any) -> bool:
    return isinstance(x, _Slot)


def _positional(func, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Pass schema-positional arguments positionally: DTensor redistributes only those."""
    args, kwargs = list(args), dict(kwargs)
    params = [a for a in func._schema.arguments if not a.kwarg_only]
    for i, a in enumerate(params):
        if a.name not in kwargs or i < len(args):
            continue
        gap = params[len(args):i]
        if not all(p.has_default_value() for p in gap):
            break
        args += [p.default_value for p in gap] + [kwargs.pop(a.name)]
    return tuple(args), kwargs


def _flat(x: Any) -> list[Any]:
    """Leaves of a result or output-spec tree (tuples and lists), None included."""
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flat(v)]
    return [x]


def _parallel(tree: Any, other: Any, found: dict[int, Any]) -> bool:
    """Map each slot of ``tree`` to the value at the same place in ``other``."""
    if _is_slot(tree):
        found[tree.index] = other
        return True
    if isinstance(tree, (list, tuple)):
        return isinstance(other, (list, tuple)) and len(tree) == len(other) and all(
            _parallel(a, b, found) for a, b in zip(tree, other)
        )
    if isinstance(tree, dict):
        return isinstance(other, dict) and all(k in other and _parallel(v, other[k], found) for k, v in tree.items())
    return True


class DTensorQuery:
    """One example call, asked of DTensor one placement tuple at a time.

    Slots 0..n_inputs-1 are the call's tensors in flattening order (the registry's input
    order); ``out=`` tensors follow, shaped like the results, and must come out placed as
    they went in."""

    def __init__(self, func, case: OpCase, ops: TensorOps, mesh_size: int, result: Any):
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._dtensor_spec import TensorMeta

        self.func, self.ops, self.mesh_size = func, ops, mesh_size
        self.prop = DTensor._op_dispatcher.sharding_propagator
        leaves = pytree.leaves((tuple(case.args), dict(case.kwargs)), ops.is_tensor)
        self.n_inputs = len(leaves)
        self.result_flat = _flat(result)
        self.result_tensors = [x for x in self.result_flat if isinstance(x, torch.Tensor)]
        out_names = catalog.out_arg_names(func)
        if out_names and len(out_names) != len(self.result_tensors):
            raise ValueError("cannot match the out= arguments to the results")
        self.tensors = leaves + (self.result_tensors if out_names else [])
        self.metas = [TensorMeta(t.shape, t.stride(), t.dtype) for t in self.tensors]
        args, kwargs = pytree.replace((tuple(case.args), dict(case.kwargs)), ops.is_tensor,
                                      [_Slot(i) for i in range(len(leaves))])
        args, kwargs = _positional(func, args, kwargs)
        for j, name in enumerate(out_names):
            kwargs[name] = _Slot(len(leaves) + j)
        self.args, self.kwargs = args, kwargs
        self.has_tensor_lists = any(isinstance(a, (list, tuple)) and any(map(_is_slot, a)) for a in args)
        self.out_slots = tuple(range(len(leaves), len(self.tensors)))
        self.written_slots = self._written_slots()
        if len(self.written_slots) > len(self.result_flat):
            raise ValueError("the results do not include the written arguments")
        # DTensor never redistributes keyword tensors: only R can be told apart as-is there
        self.keyword_slots = frozenset(s.index for s in pytree.leaves(kwargs, _is_slot) if s.index < len(leaves))
        self.schema_info = (self.prop.op_to_schema_info.get(func)
                            or self.prop.op_to_schema_info_for_single_dim_strategy.get(func))

    def _written_slots(self) -> tuple[int, ...]:
        """Slots of the written arguments the case's runner appends to the op's results
        (backend.make_runner: the ones the op does not return, or all of them and the out=
        tensors when it returns nothing). DTensor leaves them placed as they came in."""
        schema = self.func._schema
        returned = set().union(*[r.alias_info.before_set for r in schema.returns if r.alias_info is not None])
        returns_tensors = any("Tensor" in str(r.type) for r in schema.returns)
        params = [a for a in schema.arguments if not a.kwarg_only]
        slots: list[int] = []
        for a in schema.arguments:
            if a.alias_info is None or not a.alias_info.is_write or a.is_out:
                continue
            if returns_tensors and a.alias_info.before_set & returned:
                continue
            i = next((k for k, p in enumerate(params) if p.name == a.name), None)
            value = self.args[i] if i is not None and i < len(self.args) else self.kwargs.get(a.name)
            slots += [x.index for x in pytree.leaves(value, _is_slot)]
        if not returns_tensors:
            slots += list(self.out_slots)
        return tuple(slots)

    def cache_key(self, config: QueryConfig) -> str:
        """Everything the answer depends on, hashed: torch, the op, the call's structure,
        tensor metadata, non-tensor arguments and the offered placements."""
        def token(x):
            if _is_slot(x):
                m = self.metas[x.index]
                return f"T{x.index}:{tuple(m.shape)}:{tuple(m.stride)}:{m.dtype}"
            if isinstance(x, (list, tuple)):
                return [token(y) for y in x]
            if isinstance(x, dict):
                return {k: token(v) for k, v in x.items()}
            return repr(x)

        text = json.dumps([ANSWER_FORMAT, torch.__version__, str(self.func), token(self.args), token(self.kwargs),
                           config.mesh_size, list(config.partials), config.max_combos, config.max_seconds,
                           config.exhaustive],
                          sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()

    def options(self, slot: int, partials: Sequence[str]) -> list[str]:
        """Placements offered for one tensor: R, S(d) on dims of size >= 2 (a shard of a
        size-1 dim is a replica), Partial for numbers (avg only for floats)."""
        if slot in self.keyword_slots:
            return ["R"]
        t = self.tensors[slot]
        out = ["R"] + [f"S({d})" for d, s in enumerate(t.shape) if s >= 2]
        kind = self.ops.dtype_kind(t)
        if kind in (FLOAT, COMPLEX):
            out += [f"P({p})" for p in partials]
        elif kind == INT:
            out += [f"P({p})" for p in partials if p != "avg"]
        return out

    def spec(self, slot: int, key: str):
        from torch.distributed.tensor._dtensor_spec import DTensorSpec

        return DTensorSpec(_mesh(self.mesh_size), (placement(key),), tensor_meta=self.metas[slot])

    def schema_args(self, combo: Sequence[str]) -> tuple[tuple, dict]:
        """The call's arguments with each tensor replaced by its DTensorSpec under ``combo``."""
        specs = {i: self.spec(i, k) for i, k in enumerate(combo)}

        def fill(tree):
            return pytree.replace(tree, _is_slot, [specs[s.index] for s in pytree.leaves(tree, _is_slot)])

        return tuple(fill(self.args)), {k: fill(v) for k, v in self.kwargs.items()}

    def _output_keys(self, output_spec: Any, combo: Sequence[str]) -> Key | None:
        returned = self.result_flat[: len(self.result_flat) - len(self.written_slots)]
        tensors = [x for x in returned if isinstance(x, torch.Tensor)]
        specs = _flat(output_spec) if tensors else []
        if len(specs) == len(returned):
            specs = [s for s, r in zip(specs, returned) if isinstance(r, torch.Tensor)]
        elif len([s for s in specs if s is not None]) == len(tensors):
            specs = [s for s in specs if s is not None]
        else:
            return None
        keys = []
        for s, t in zip(specs, tensors):
            if s is None:
                return None  # DTensor leaves this output undefined under these inputs
            key = str(s.placements[0])
            m = SHARD_RE.match(key)
            if m and (int(m[1]) >= t.dim() or t.shape[int(m[1])] <= 1):
                key = "R"  # a shard of a size-1 dim leaves it whole on one rank
            keys.append(key)
        return tuple(keys) + tuple(combo[i] for i in self.written_slots)

    def accepts(self, combo: Sequence[str]) -> Key | None:
        """The output placements DTensor gives ``combo`` (one key per slot) without
        redistributing any input; None when it redistributes or refuses."""
        from torch.distributed.tensor._op_schema import OpSchema

        schema = OpSchema(self.func, *self.schema_args(combo), schema_info=self.schema_info)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sharding = self.prop.propagate_op_sharding_non_cached(schema)
        except Exception:
            return None  # no strategy for these placements
        if sharding.redistribute_schema is not None:  # also set when only shape args change (views)
            found: dict[int, Any] = {}
            if not _parallel(self.args, sharding.redistribute_schema.args_schema, found):
                return None
            if any(not hasattr(v, "placements") or str(v.placements[0]) != combo[i] for i, v in found.items()):
                return None
        outs = self._output_keys(sharding.output_spec, combo)
        if outs is None:
            return None
        if self.out_slots and not set(self.out_slots) <= set(self.written_slots) and (
                len(outs) != len(self.out_slots) or any(outs[j] != combo[s] for j, s in enumerate(self.out_slots))):
            return None  # the out= tensors are written as placed: the op's results must come out so
        return outs

    def accepts_inputs(self, inputs: Key, output_options: Sequence[Sequence[str]]) -> Key | None:
        """DTensor's output for these input placements; out= tensors are tried placed as
        each of ``output_options`` (the outputs the caller expects)."""
        if any(k not in self.options(i, DTENSOR_PARTIALS) for i, k in enumerate(inputs)):
            return None  # not a placement DTensor can take as-is here (keyword tensor)
        if not self.out_slots:
            return self.accepts(inputs)
        for outs in itertools.islice(itertools.product(*output_options), 16):
            got = self.accepts(tuple(inputs) + tuple(outs))
            if got is not None:
                return got
        return None


@dataclass
class DTensorAnswer:
    accepted: dict[Key, Key] = field(default_factory=dict)  # input placements -> output placements
    queried: int = 0
    truncated: bool = False  # the cap stopped the enumeration
    runs: bool = True  # DTensor runs the call at all (replicated inputs, or any accepted tuple)
    # The clock (QueryConfig.max_seconds) stopped it: how far it got depends on the
    # machine's speed and load, so a slower run asks fewer tuples and counts fewer rules.
    clocked: bool = False


def _combos(options: list[list[str]], max_sharded: int | None = None) -> Iterator[tuple[str, ...]]:
    """Placement tuples with 1 to ``max_sharded`` non-R entries, fewest first."""
    n = len(options)
    for k in range(1, min(n, max_sharded or n) + 1):
        for slots in itertools.combinations(range(n), k):
            if any(len(options[i]) < 2 for i in slots):
                continue
            for choice in itertools.product(*(options[i][1:] for i in slots)):
                combo = ["R"] * n
                for i, c in zip(slots, choice):
                    combo[i] = c
                yield tuple(combo)


def single_dim_candidates(query: DTensorQuery, options: list[list[str]]) -> list[tuple[str, ...]] | None:
    """The tuples the op's single-dim strategy lists, within the offered placements.

    Any other tuple has a non-zero redistribution cost, so querying these gives the same
    answer as querying every tuple. None when the op has no such strategy."""
    from torch.distributed.tensor._op_schema import OpSchema
    from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder

    info = query.prop.op_single_dim_strategy_funcs.get(query.func)
    if info is None or query.has_tensor_lists:  # lists (foreach ops) are expanded element-wise elsewhere
        return None
    schema = query.prop._wrap_with_op_strategy(OpSchema(
        query.func, *query.schema_args(["R"] * len(query.metas)), schema_info=query.schema_info))
    try:
        listed = info.func(query.func, schema.args_meta, schema.kwargs_meta)
    except Exception:
        return None
    order = [s.index for s in pytree.leaves((query.args, query.kwargs), _is_slot)]  # DTensor's input order
    found = []
    for strategy in listed:  # [outputs..., inputs...]
        ins = list(strategy)[len(strategy) - len(order):]
        if len(ins) != len(order) or any(p is None for p in ins):
            continue
        combo = ["R"] * len(order)
        for slot, p in zip(order, ins):
            combo[slot] = f"S({p.dim})" if isinstance(p, _ShardingPlaceholder) else str(p)
        if all(k in opts for k, opts in zip(combo, options)) and any(k != "R" for k in combo):
            found.append(tuple(combo))
    return list(dict.fromkeys(found))


def dtensor_answer(query: DTensorQuery, config: QueryConfig) -> DTensorAnswer:
    """The input tuples with a non-R input that DTensor accepts as-is, and their outputs.

    A call DTensor cannot run on replicated inputs gets no further question. Asking stops
    at ``max_combos`` tuples or ``max_seconds`` (some decompositions take a second a
    question); the answer then says it is truncated."""
    answer = DTensorAnswer(queried=1)
    if query.accepts(["R"] * len(query.metas)) is None:
        answer.runs = False
        return answer
    options = [query.options(i, config.partials) for i in range(len(query.metas))]
    listed = None if config.exhaustive else single_dim_candidates(query, options)
    # Tensor lists (foreach ops) are placed element by element: their tuples multiply with
    # the list length, so only those with few non-replicated tensors are enumerated; ours,
    # however many tensors they place, are asked directly (DTensorQuery.accepts_inputs).
    max_sharded = LIST_MAX_SHARDED if query.has_tensor_lists else None
    combos = iter(listed) if listed is not None else _combos(options, max_sharded)
    deadline = time.monotonic() + config.max_seconds
    for combo in itertools.islice(combos, config.max_combos):
        answer.queried += 1
        outs = query.accepts(combo)
        inputs = combo[: query.n_inputs]
        if outs is not None and any(k != "R" for k in inputs):
            answer.accepted.setdefault(inputs, outs)
        if time.monotonic() > deadline:
            break
    left = next(combos, None) is not None
    answer.clocked = left and answer.queried <= config.max_combos  # queried counts the all-R question too
    answer.truncated = left or (max_sharded is not None and max_sharded < sum(len(o) > 1 for o in options))
    return answer


class AnswerCache:
    """DTensor's answers on disk, one JSON file per op, keyed by DTensorQuery.cache_key.

    Holds one op's answers in memory at a time; ``flush`` writes them atomically. A
    missing or unreadable file is an empty cache; one that cannot be written costs time."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self._op, self._data, self._dirty = "", {}, False

    def _load(self, op: str) -> None:
        if op == self._op:
            return
        self.flush()
        self._op, self._data, self._dirty = op, {}, False
        if self.folder is not None:
            try:
                self._data = json.loads((self.folder / f"{op}.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._data = {}

    def get(self, op: str, key: str) -> DTensorAnswer | None:
        self._load(op)
        got = self._data.get(key)
        try:
            accepted = {tuple(i): tuple(o) for i, o in got["accepted"]}
            truncated = bool(got["truncated"])
            if "clocked" not in got and truncated:
                return None  # capped before the clock was recorded: asked again
            return DTensorAnswer(accepted, int(got["queried"]), truncated, bool(got["runs"]),
                                 bool(got.get("clocked", False)))
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, op: str, key: str, answer: DTensorAnswer) -> None:
        self._load(op)
        self._data[key] = {"accepted": sorted([list(i), list(o)] for i, o in answer.accepted.items()),
                           "queried": answer.queried, "truncated": answer.truncated, "runs": answer.runs,
                           "clocked": answer.clocked}
        self._dirty = True

    def flush(self) -> None:
        if not (self._dirty and self.folder is not None):
            return
        self._dirty = False
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{self._op}.json"
            tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
            tmp.write_text(json.dumps(self._data, sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            pass


def default_cache_folder() -> Path:
    from .samples import default_cache_dir

    return default_cache_dir() / f"crosscheck-torch-{torch.__version__.replace('+', '_')}"


def answer_for(query: DTensorQuery, config: QueryConfig, cache: AnswerCache, op: str) -> DTensorAnswer:
    key = query.cache_key(config)
    answer = cache.get(op, key)
    if answer is None:
        answer = dtensor_answer(query, config)
        cache.put(op, key, answer)
    return answer


__all__ = [
    "AnswerCache", "BOOL_PARTIALS", "DTENSOR_PARTIALS", "DTensorAnswer", "DTensorQuery", "Key", "NORM2", "PARTIAL_RE",
    "QUERIED", "QueryConfig", "SHARD_RE", "STRIDED_SHARD_RE", "answer_for", "canonical_names", "default_cache_folder",
    "dtensor_answer", "dtensor_support", "placement", "single_dim_candidates",
]
