"""TorchBackend: the ATen catalog and its example calls, as the sweep sees them.

Where an op's examples come from, in order:
1. OpInfo calls captured for the overload itself (``samples.load_index``);
2. for in-place (``foo_``) and ``out=`` overloads, the captured calls of the functional
   overload they compute (``catalog.functional_sibling``), kept when they run;
3. inputs built from the schema (``schema_samples.find_schema_sample``).

In-place and ``out=`` overloads are explored as themselves, not mapped to the functional
op: the case's ``fn`` clones every argument the op writes before calling it (so repeated
calls on the same inputs agree) and allocates fresh empty ``out`` tensors, which the op
resizes. Its result is the op's return value followed by the written arguments the op does not
return (batch norm's running statistics), or the written and out arguments when the op
returns nothing (``_foreach_*_``, ``_foreach_*.out``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import sys
from typing import Any, Callable, Collection, Mapping, Sequence

import torch

from metaspmd import pytree, reproducible
from metaspmd.case import NoSample, OpCase, ShapeRefused, Skip
from metaspmd.signature import arg_items
from metaspmd.tensor_ops import ULP_STEPS, compared_as_bits
from metaspmd.sweep.failures import clean_reason
from metaspmd.sweep.user_modules import load_module

from . import catalog, hand_samples, local_params, model_programs, random_ops, sample_data, views
from .composite_calls import composite_names
from .dropping import dropping_form
from .model_calls import MODELS_ATTR, model_calls, unique_calls
from .samples import (
    BASE_SEED, MAX_SIGNATURES, SampleCall, build_index, call_signature, calls_at_other_sizes, load_index, regenerate,
    runs_in_float64, to_float64,
)
from .schema_samples import find_schema_sample, runs_on_fresh_inputs, schema_inputs
from .tensor_ops import TorchOps

OutSpec = Mapping[str, Any]  # out arg name -> dtype, or list of dtypes for Tensor[] outs

_OPS = TorchOps()


def _short_error(text: str) -> str:
    """An error's first line as a record's reason, as the sweep cleans every reason (no
    machine path, no memory address: the same bytes on every machine and run)."""
    return clean_reason(text, limit=200)


def _is_list_arg(arg) -> bool:
    return str(arg.real_type).startswith("List[")


def _list_out(args: list, dtype: Any) -> list[torch.Tensor]:
    """Out tensors for a Tensor[] out argument (``dtype``: one dtype, or one per out).

    ``_foreach_*`` ops do not resize their outs: when the first Tensor[] input has one
    entry per out, the outs take its (local) shapes; otherwise they start empty and the op
    resizes them.
    """
    inputs = next((a for a in args if isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a)), None)
    dtypes = list(dtype) if isinstance(dtype, (list, tuple)) else [dtype] * (len(inputs) if inputs else 1)
    if inputs is not None and len(inputs) == len(dtypes):
        return [torch.zeros(t.shape, dtype=d) for t, d in zip(inputs, dtypes)]
    return [torch.empty(0, dtype=d) for d in dtypes]


def _left_empty(result: Any, expected: Any) -> bool:
    """Is a tensor of ``result`` empty where the functional op's ``expected`` one is not?"""
    def tensors(tree: Any) -> list[torch.Tensor]:
        return pytree.leaves(tree, lambda x: isinstance(x, torch.Tensor))

    return any(g.numel() == 0 and w.numel() > 0 for g, w in zip(tensors(result), tensors(expected)))


def make_runner(func, out_spec: OutSpec | None = None, default_dtype: torch.dtype = torch.float32,
                shaped_by: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """``fn(*args, **kwargs)`` that runs ``func`` without touching its inputs.

    Written arguments are cloned first; out arguments are allocated (dtype from
    ``out_spec``, else ``default_dtype``) and must not be passed in. ``shaped_by``: the
    functional op, whose result on the same arguments (a shard's, on a shard) gives the outs
    their shapes and dtypes, as zeros, for kernels that do not resize an empty out
    (``_int_mm.out``, ``split_copy.Tensor_out``).
    """
    schema_args = func._schema.arguments
    written = [(i, a.name) for i, a in enumerate(schema_args) if a.name in catalog.written_arg_names(func)]
    outs = [a for a in schema_args if a.is_out]
    # written arguments the op does not also return (batch norm's running stats): their new
    # values are outputs too, or a rule could silently get the side effect wrong
    returned = set().union(*[r.alias_info.before_set for r in func._schema.returns if r.alias_info is not None])
    hidden = {a.name for a in schema_args if a.name in dict(written).values() and not (a.alias_info.before_set & returned)}
    spec = dict(out_spec or {})
    if not written and not outs:
        return func
    out_names = [(a.name, _is_list_arg(a)) for a in outs]

    def clone(x):
        if isinstance(x, torch.Tensor):
            return x.clone()
        if isinstance(x, (list, tuple)):
            return type(x)(clone(y) for y in x)
        return x

    def fn(*args, **kwargs):
        args, kwargs = list(args), dict(kwargs)
        mutated, extra = [], []
        for i, name in written:
            if i < len(args):
                args[i] = clone(args[i])
                mutated.append(args[i])
            elif name in kwargs:
                kwargs[name] = clone(kwargs[name])
                mutated.append(kwargs[name])
            else:
                continue
            if name in hidden and mutated[-1] is not None:
                extra.append(mutated[-1])
        if shaped_by is None:
            for name, listed in out_names:
                dtype = spec.get(name, default_dtype)
                kwargs[name] = _list_out(args, dtype) if listed else torch.empty(0, dtype=dtype)
        else:
            like = pytree.leaves(shaped_by(*args, **kwargs), _is_tensor)
            if len(out_names) == 1 and out_names[0][1]:
                kwargs[out_names[0][0]] = [torch.zeros_like(t) for t in like]
            else:
                kwargs.update((name, torch.zeros_like(t)) for (name, _), t in zip(out_names, like, strict=True))
        result = func(*args, **kwargs)
        if not pytree.leaves(result, _is_tensor):  # the core's walk: this runs on every shard
            written_out = [m for m in mutated if m is not None] + [kwargs[name] for name, _ in out_names]
            return tuple(written_out) if written_out else result
        if extra:
            return (*(result if isinstance(result, (tuple, list)) else (result,)), *extra)
        return result

    return fn


def out_spec_from_kwargs(func, kwargs: Mapping[str, Any]) -> tuple[dict, dict]:
    """Split captured out arguments from the rest: (out spec, other kwargs)."""
    outs = set(catalog.out_arg_names(func))
    spec = {}
    for name in outs & set(kwargs):
        v = kwargs[name]
        spec[name] = [t.dtype for t in v] if isinstance(v, (list, tuple)) else v.dtype
    return spec, {k: v for k, v in kwargs.items() if k not in outs}


def _out_spec_from_result(func, result: Any) -> dict:
    """Out dtypes for ``func`` from the functional op's result on the same inputs."""
    outs = [a for a in func._schema.arguments if a.is_out]
    tensors = [t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    if len(outs) == 1 and _is_list_arg(outs[0]):
        return {outs[0].name: [t.dtype for t in tensors]}
    if len(tensors) != len(outs):
        return {}
    return {a.name: t.dtype for a, t in zip(outs, tensors)}


def _float64_spec(spec: OutSpec) -> dict:
    def up(d):
        return {torch.float32: torch.float64, torch.complex64: torch.complex128}.get(d, d)

    return {k: [up(d) for d in v] if isinstance(v, (list, tuple)) else up(v) for k, v in spec.items()}


def _is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def _tensor_shapes(args: Any) -> list[tuple[int, ...]]:
    # the core's walk over tuples, lists and dicts (all an ATen call nests in): the guards
    # ask it on every shard's call, where torch's general pytree costs more than the kernel
    return [tuple(t.shape) for t in pytree.leaves(args, _is_tensor)]


def consistent_shards_only(fn: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any],
                           channels: bool = False, unread: Collection[int | str] = ()) -> Callable[..., Any]:
    """``fn`` that refuses shards which break the shape agreements of the example.

    Some kernels (pooling backward, batch norm) index one input by another's sizes without
    checking them, and crash the process when only one of them is sharded. Local inputs are
    refused (ShapeRefused, so the strategy simply fails) unless tensors of equal example shape
    shrink alike and the highest-rank tensors shrink along the same dims; with
    ``channels``, 1-D tensors (per-channel statistics, unless empty) must also keep the
    length of the highest-rank tensors' dim 1. Arguments in ``unread`` (positions or keyword names) are
    left out: the kernel never reads them, so their shapes cannot mislead it.
    """

    def shapes(a: tuple, k: Mapping[str, Any]) -> list[tuple[int, ...]]:
        if not unread:
            return _tensor_shapes((a, k))
        read = (tuple(x for i, x in enumerate(a) if i not in unread), {n: x for n, x in k.items() if n not in unread})
        return _tensor_shapes(read)

    example = shapes(tuple(args), kwargs)
    top = max((len(s) for s in example), default=0)

    def agrees(local: list[tuple[int, ...]]) -> bool:
        if len(local) != len(example) or local == example:
            return True
        changes = [tuple((d, n) for d, (n, e) in enumerate(zip(ls, es)) if n != e) for ls, es in zip(local, example)]
        by_shape: dict[tuple, set] = {}
        for es, ch in zip(example, changes):
            by_shape.setdefault(es, set()).add(ch)
        top_dims = {tuple(d for d, _ in ch) for es, ch in zip(example, changes) if len(es) == top}
        if any(len(v) > 1 for v in by_shape.values()) or len(top_dims) > 1:
            return False
        if channels and top >= 2:
            # an empty 1-D tensor is no per-channel statistic (batch_norm_backward's reserve)
            widths = ({ls[1] for ls in local if len(ls) == top}
                      | {ls[0] for ls, es in zip(local, example) if len(ls) == 1 and es != (0,)})
            return len(widths) <= 1
        return True

    verdicts: dict[tuple, bool] = {}  # by the local shapes: every Partial set beside a cut asks again

    def fn_checked(*a, **k):
        local = tuple(shapes(a, k))
        ok = verdicts.get(local)
        if ok is None:
            ok = verdicts[local] = agrees(list(local))
        if not ok:
            raise ShapeRefused("inconsistent shards for an op that trusts matching input shapes")
        return fn(*a, **k)

    return fn_checked


def indexed_dims_kept(fn: Callable[..., Any], names: tuple[str, ...], args: tuple, kwargs: Mapping[str, Any],
                      dims: Mapping[str, tuple[int, ...]]) -> Callable[..., Any]:
    """``fn`` that refuses local inputs cutting a dim that index values address
    (``catalog.INDEXED_DIMS``): the kernel would write past the local tensor."""
    def sizes(a, k) -> dict[str, tuple[int, ...]]:
        return {name: tuple(v.shape) for name, v in arg_items(names, a, k) if isinstance(v, torch.Tensor)}

    example = sizes(args, kwargs)

    def fn_checked(*a, **k):
        local = sizes(a, k)
        for name, ds in dims.items():
            if name in example and any(local[name][d] != example[name][d] for d in ds if -len(example[name]) <= d < len(example[name])):
                raise ValueError(f"{name}: a dim its index inputs address is cut")
        return fn(*a, **k)

    return fn_checked


def batches_alike(fn: Callable[..., Any], names: tuple[str, ...], core: Mapping[str, int]) -> Callable[..., Any]:
    """``fn`` that refuses local inputs whose batch dims (all but each argument's ``core``
    trailing ones, ``catalog.BATCH_TIED``) disagree: the kernel would write past a buffer."""
    def fn_checked(*a, **k):
        batches = {tuple(v.shape[: v.dim() - core[name]]) for name, v in arg_items(names, a, k)
                   if name in core and isinstance(v, torch.Tensor)}
        if len(batches) > 1:
            raise ValueError("inputs cut along a batch dim unlike the others")
        return fn(*a, **k)

    return fn_checked


def pairs_of_rows(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``fn`` (pdist's backward) that refuses a grad or pdist without one element per pair
    of self's rows: the kernel reads them by that count, past the end of a shorter one."""
    def fn_checked(*a, **k):
        items = dict(arg_items(names, a, k))
        rows = items["self"].shape[0]
        if any(items[name].numel() != rows * (rows - 1) // 2 for name in ("grad", "pdist")):
            raise ValueError("grad and pdist must hold one element per pair of self's rows")
        return fn(*a, **k)

    return fn_checked


def packed_rows(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``fn`` (``_pad_packed_sequence``) that refuses data without one row per step and
    sequence that batch_sizes counts, or batch_sizes that ever grow (sequences sorted
    longest first, as packing leaves them): the kernel trusts both, and reads and writes
    past its buffers otherwise (a reordered batch_sizes aborted it)."""
    def fn_checked(*a, **k):
        items = dict(arg_items(names, a, k))
        sizes = items["batch_sizes"]
        if items["data"].shape[0] != int(sizes.sum()) or bool((sizes[1:] > sizes[:-1]).any()):
            raise ValueError("data must hold as many rows as batch_sizes adds up to, batch_sizes never growing")
        return fn(*a, **k)

    return fn_checked


def pair_grid(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``fn`` (cdist's backward) that refuses grad or cdist not shaped (batch, x1's rows,
    x2's rows), or x1 and x2 of two batches or widths: the kernel reads them by those
    sizes, past the end of a shorter one."""
    def fn_checked(*a, **k):
        items = dict(arg_items(names, a, k))
        x1, x2 = items["x1"].shape, items["x2"].shape
        grid = (*x1[:-2], x1[-2], x2[-2])
        if x1[:-2] != x2[:-2] or x1[-1] != x2[-1] or any(tuple(items[n].shape) != grid for n in ("grad", "cdist")):
            raise ValueError("grad and cdist must be x1's rows by x2's rows, x1 and x2 of one batch and width")
        return fn(*a, **k)

    return fn_checked


def hidden_states_alike(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``fn`` (a recurrent layer) that refuses hidden states (an LSTM's h0 and c0) of two
    shapes, or with other than one per layer and direction in dim 0: the kernel walks them
    by the layer count and reads c0 by h0's sizes, past the end of a shorter one."""
    def fn_checked(*a, **k):
        items = dict(arg_items(names, a, k))
        hx = items["hx"] if isinstance(items["hx"], (list, tuple)) else [items["hx"]]
        states = items["num_layers"] * (2 if items["bidirectional"] else 1)
        if len({tuple(h.shape) for h in hx}) != 1 or hx[0].dim() < 1 or hx[0].shape[0] != states:
            raise ValueError("hidden states of two shapes, or not one per layer and direction")
        return fn(*a, **k)

    return fn_checked


def padding_within(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``fn`` (a reflection pad's backward) that refuses a local ``self`` no longer than its
    padding: the forward refuses one, the backward kernel reads past its buffer."""
    def fn_checked(*a, **k):
        items = dict(arg_items(names, a, k))
        padding, shape = list(items["padding"]), items["self"].shape  # (left, right) from the last dim
        if any(max(left, right) >= size for left, right, size in zip(padding[::2], padding[1::2], reversed(shape))):
            raise ValueError("a reflection padding as long as its input")
        return fn(*a, **k)

    return fn_checked


def convolution_output_shape(input_shape: tuple, weight_shape: tuple, items: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The shape of convolution's output on input and weight of these shapes, with ``items``'
    stride, padding, dilation, transposition, output padding and groups; None where the
    forward is not defined for them (channels that do not match or split into the groups,
    a kernel wider than the padded input, an output padding as wide as stride and dilation)."""
    k = len(input_shape) - 2
    if k < 1 or len(weight_shape) != k + 2:
        return None

    def per_dim(name: str) -> list[int]:
        v = list(items[name])
        return v * k if len(v) == 1 else v

    stride, padding, dilation, groups = per_dim("stride"), per_dim("padding"), per_dim("dilation"), items["groups"]
    span = [d * (w - 1) for d, w in zip(dilation, weight_shape[2:])]
    if items["transposed"]:
        extra = per_dim("output_padding")
        if input_shape[1] != weight_shape[0] or any(e >= max(s, d) for e, s, d in zip(extra, stride, dilation)):
            return None
        channels = weight_shape[1] * groups
        spatial = [(n - 1) * s - 2 * p + w + e + 1 for n, s, p, w, e in zip(input_shape[2:], stride, padding, span, extra)]
    else:
        if input_shape[1] != weight_shape[1] * groups:
            return None
        channels = weight_shape[0]
        spatial = [(n + 2 * p - w - 1) // s + 1 for n, s, p, w in zip(input_shape[2:], stride, padding, span)]
    if weight_shape[0] % groups or any(n < 1 for n in spatial):
        return None
    return (input_shape[0], channels, *spatial)


def convolution_grads(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``fn`` (convolution's backward) that refuses a grad_output not shaped as the forward's
    output of input and weight, or an input and weight the forward refuses: the kernel
    checks only some of that, and loops over input's batch (and grad_output's channels by
    groups) reading past a grad_output of fewer (its garbage differs from run to run, or
    not). bias_sizes is left out: the kernel sums grad_output, whatever it says."""
    def fn_checked(*a, **k):
        items = dict(arg_items(names, a, k))
        grad, x, w = (tuple(items[n].shape) for n in ("grad_output", "input", "weight"))
        if grad != convolution_output_shape(x, w, items):
            raise ShapeRefused("grad_output not shaped as the convolution's output of input and weight")
        return fn(*a, **k)

    return fn_checked


def convolution_double_grads(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``fn`` (convolution's double backward) that refuses inputs not shaped as one
    convolution's: gO as the forward's output of self and weight, ggI as self, ggW as weight
    and ggb as gO's channels. Its convolutions and their backward size some of these by
    others (``convolution_grads``)."""
    def fn_checked(*a, **k):
        items = dict(arg_items(names, a, k))
        x, w, g = (tuple(items[n].shape) for n in ("self", "weight", "gO"))
        wanted = {"ggI": x, "ggW": w, "ggb": g[1:2]}
        if g != convolution_output_shape(x, w, items) or any(
                items.get(n) is not None and tuple(items[n].shape) != shape for n, shape in wanted.items()):
            raise ShapeRefused("gO, ggI, ggW or ggb not shaped as one convolution's of self and weight")
        return fn(*a, **k)

    return fn_checked


def square_factor(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``fn`` (_cholesky_solve_helper) that refuses an A that is not square, has other than
    self's rows, or another batch: the kernel hands LAPACK self's sizes and reads A by them."""
    def fn_checked(*a, **k):
        items = dict(arg_items(names, a, k))
        b, f = items["self"].shape, items["A"].shape
        if len(f) < 2 or len(b) != len(f) or f[-1] != f[-2] or b[-2] != f[-1] or b[:-2] != f[:-2]:
            raise ShapeRefused("A not a square factor of self's rows and batch")
        return fn(*a, **k)

    return fn_checked


# catalog.EXACT_GUARDS's conditions, by name
EXACT_GUARDS: dict[str, Callable[[Callable[..., Any], tuple[str, ...]], Callable[..., Any]]] = {
    "pairs": pairs_of_rows, "pair_grid": pair_grid, "packed_rows": packed_rows, "hidden_states": hidden_states_alike,
    "conv_output": convolution_grads, "conv_double_output": convolution_double_grads, "square_factor": square_factor,
}


# The operands of ops on integer or bool data (bitwise_and, aminmax, mm, an integer
# convolution's weight, the tensors a cat joins): refilled like float data, whereas other
# integer arguments (index, indices, mask, offsets, target) stay in range.
DATA_ARGS = frozenset({
    "self", "other", "input", "mat", "mat1", "mat2", "vec", "vec1", "vec2", "batch1", "batch2", "tensor", "tensor1",
    "tensor2", "exponent", "end", "src", "source", "value", "values", "weight", "bias", "input1", "input2", "x1", "x2",
    "i1", "i2", "i3", "anchor", "positive", "negative", "tensors", "grad_output", "condition",
})


def _index_like(names: tuple[str, ...], args: tuple, kwargs: Mapping[str, Any]) -> frozenset[str]:
    """Integer or bool tensor arguments other than the data operands: kept as they are when
    inputs are refilled blindly."""
    fixed = set()
    for name, value in arg_items(names, args, kwargs):
        if name in DATA_ARGS:
            continue
        leaves = [x for x in torch.utils._pytree.tree_leaves(value) if isinstance(x, torch.Tensor)]
        if any(_OPS.dtype_kind(x) in ("i", "b") for x in leaves):
            fixed.add(name)
    return frozenset(fixed)


def _zeros_for_unspecified(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its tensor outputs zeroed: for ops whose values are unspecified (``empty``),
    a sharding is right when every local output has the right shape and dtype, and zeros
    compare exactly that."""
    def zeroed(*args, **kwargs):
        return torch.utils._pytree.tree_map(
            lambda x: torch.zeros_like(x) if isinstance(x, torch.Tensor) else x, fn(*args, **kwargs))

    return zeroed


def _float_bits(x: torch.Tensor) -> torch.Tensor:
    """A float tensor's bits as integers of its width; any other tensor as it is."""
    if x.is_floating_point():
        return x.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[x.element_size()])
    return x


def _scalars_as_tensors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its Python-number results as 0-d tensors (int64, float64, complex128 or
    bool, as ``torch.tensor`` of the number would hold it at full precision): the explorer
    compares and combines tensors, and a scalar's combine is a tensor's (the numels of row
    shards sum to the global numel; ``equal`` holds where it holds on every shard)."""
    dtypes = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}

    def as_tensor(x):
        dtype = dtypes.get(type(x))
        return torch.tensor(x, dtype=dtype) if dtype is not None else x

    def tensors(*args, **kwargs):
        return torch.utils._pytree.tree_map(as_tensor, fn(*args, **kwargs))

    return tensors


def _special_values(func):
    """The case's special-value generator: NaN alone among the data for the NaN-skipping
    ops (nanmean), one NaN or inf in one tensor at a time for the non-finite checks (AMP's
    unscale), ascending ramps for the histograms, matrices of chosen ranks for the rank
    queries, finite ones for the norms under a bound (renorm), the full set for the others;
    none for ops that crash on them."""
    if catalog.op_name(func) in catalog.CRASH_ON_SPECIAL_VALUES:
        return None
    if catalog.aten_base(func) in catalog.NAN_SKIPPING:
        return sample_data.with_nan_specks
    if catalog.aten_base(func) in catalog.NONFINITE_CHECKING:
        return sample_data.with_one_nonfinite
    if catalog.aten_base(func) in catalog.BINNING:
        return sample_data.with_ramps
    if catalog.aten_base(func) in catalog.RANK_QUERIES:
        return sample_data.with_low_rank
    if catalog.aten_base(func) in catalog.VALUE_BOUNDED:  # a NaN or inf would decide every norm
        return functools.partial(sample_data.with_special_values, nonfinite=())
    return sample_data.with_special_values


# Schema types of value arguments: a fill value, a bound, a threshold (ints are dims and sizes)
VALUE_TYPES = frozenset({"number", "float"})


def value_arguments(func, args: tuple, kwargs: dict) -> list[float]:
    """The call's values of arguments typed Scalar or float (alone, optional or in a list),
    and the unit ``round``'s negative ``decimals`` round to (-2: hundreds): values whose one
    side or the other the op treats apart."""
    names = catalog.positional_names(func)
    given = {**dict(zip(names, args)), **kwargs}
    decimals = given.get("decimals")
    rounding = catalog.aten_base(func).rstrip("_") == "round" and isinstance(decimals, int) and decimals < 0
    values: list[float] = [10.0 ** -decimals] if rounding else []
    for a in func._schema.arguments:
        kind = str(a.real_type).removeprefix("Optional[").removeprefix("List[").rstrip("]")
        if kind in VALUE_TYPES and a.name in given:
            value = given[a.name]
            values += [float(v) for v in (value if isinstance(value, (list, tuple)) else [value])
                       if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return values


def _planted(fresh: Callable[[int], tuple] | None, names: tuple[str, ...],
             skipped: tuple[str, str, Any]) -> Callable[[int], tuple] | None:
    """``fresh`` with the skipped label planted in each draw (``sample_data.with_sentinel``)."""
    if fresh is None:
        return None

    def planted(seed: int) -> tuple[tuple, dict]:
        return sample_data.with_sentinel(names, *fresh(seed), *skipped)

    return planted


def torch_case(func, args: tuple, kwargs: dict, runner: Callable[..., Any],
               fresh: Callable[[int], tuple] | None = None, stand_in_for: OpCase | None = None) -> OpCase:
    """The case the explorer works on for one call of an ATen overload: view-like ops get
    their shape-derived candidates, kernels that trust matching shapes refuse inconsistent
    shards, outputs constant on random data get special-value trials, and ops whose values
    are unspecified are compared on shapes and dtypes. The sweep and the runtime's live
    exploration both build cases here, so they find the same rules."""
    names = catalog.positional_names(func)
    skipped = catalog.sentinel(func)
    if skipped is not None:  # a label the op skips at one position, in every trial's labels
        args, kwargs = sample_data.with_sentinel(names, args, kwargs, *skipped)
        fresh = _planted(fresh, names, skipped)
    fn, candidates, notes, localize = runner, None, (), None
    if catalog.aten_base(func) in catalog.UNWRITTEN_FILLED:
        fn = runner = catalog.unwritten_filled(runner)
    if catalog.returns_scalars(func):
        fn = _scalars_as_tensors(fn)
    if catalog.aten_base(func).rstrip("_") in ULP_STEPS:  # nextafter_ too
        fn = compared_as_bits(fn, lambda x: isinstance(x, torch.Tensor), _float_bits)
    dropping = dropping_form(func, runner)
    random = catalog.nondeterministic_reason(func) is not None and random_ops.checkable(func)
    if catalog.unspecified_values(func) or (random and random_ops.is_fill(func)):
        fn = _zeros_for_unspecified(runner)
    if random and random_ops.draws_nothing(func, args, kwargs):
        random, notes = False, (random_ops.NO_DRAWS_NOTE.format(random_ops.LIMITS[catalog.op_name(func)][0]),)
    if random:
        fn, note = random_ops.checked_form(func, fn, args, kwargs)
        notes = (note,)
    # An in-place fill keeps self's placement, so a Partial self cannot come out replicated.
    value_free = random and random_ops.is_fill(func) and not catalog.written_arg_names(func)
    shared_dims = random_ops.shared_draw_dims(func, args, kwargs) if random else ()
    if views.is_view_like(func):
        # an out= overload writes what its functional sibling returns (the out tensor is
        # resized to fit): a shard runs the sibling's derived form, sizes rewritten
        view: Any = func
        if catalog.out_arg_names(func):
            sibling = catalog.functional_sibling(catalog.op_name(func))
            view = catalog.resolve(sibling) if sibling else None
        rule = views.derive(view, args, kwargs) if view is not None else None
        if rule is not None:
            fn, candidates, notes = rule.fn, rule.candidates, notes + rule.notes
            localize = local_params.localizer(func, args, kwargs) if view is func else None
            if localize is None and candidates:  # an out= overload writes whole pieces: no local params
                candidates = tuple(c for c in candidates if not any(getattr(p, "local", False) for p in c[0]))
            if view is not func:
                notes += (f"derived as {catalog.op_name(view)}, whose result the out= tensor takes",)
    fn = views.local_sizes(func, fn)
    guard = catalog.exact_guard(func)
    if catalog.trusts_matching_shapes(func) and guard is None:  # an exact guard replaces the shared one
        unread = catalog.unread_arg_names(func, args, kwargs)
        unread_at = [i for i, n in enumerate(names[: len(args)]) if n in unread] + sorted(unread)
        channels = "batch_norm" in catalog.op_name(func)
        fn = consistent_shards_only(fn, args, kwargs, channels=channels, unread=unread_at)
    if catalog.indexed_dims(func):
        fn = indexed_dims_kept(fn, names, args, kwargs, catalog.indexed_dims(func))
    if catalog.batch_tied(func):
        fn = batches_alike(fn, names, catalog.batch_tied(func))
    if catalog.reflects(func):
        fn = padding_within(fn, names)
    if guard is not None:
        fn = EXACT_GUARDS[guard](fn, names)
    value_sized = catalog.value_sized_reason(func, args, kwargs)  # by self, the first tensor
    values = value_arguments(func, args, kwargs)
    # a NaN or infinite value argument (index_fill's -inf) decides elements beside NaN and inf
    # data, which random trials never hold: a max of shards' fills passed where self held NaN
    nonfinite_value = not all(math.isfinite(v) for v in values)
    return OpCase(
        op=catalog.op_name(func), fn=fn, args=tuple(args), kwargs=dict(kwargs), arg_names=names,
        fresh=fresh, fixed=_index_like(names, args, kwargs), candidates=candidates,
        special=_special_values(func),
        special_always=catalog.aten_base(func) in catalog.SPECIAL_VALUE_SENSITIVE or nonfinite_value,
        value_args=tuple(v for v in values if math.isfinite(v)),
        random=random, value_free=value_free, shared_dims=shared_dims, dropping=dropping, localize=localize,
        exact_sizes=catalog.exact_sizes(func), trusts_shapes=catalog.trusts_matching_shapes(func), notes=notes,
        value_sized=value_sized, sized_by=frozenset({0}) if value_sized else frozenset(),
        uncut_dims=catalog.uncut_dims(func, args), stand_in_for=stand_in_for,
    )


def _with_primary(cases: list[OpCase]) -> list[OpCase]:
    """Spare samples stand beside the first ones, never in for them: where none of those
    runs, the next source of samples (the functional sibling's, schema-built) decides."""
    return cases if any(not c.reserve for c in cases) else []


EXAMPLES_ATTR = "METASPMD_EXAMPLES"


def _import_custom_ops(ref: str) -> tuple[frozenset[str], dict[str, list[tuple[tuple, dict]]]]:
    """Import a user's module of custom ops: the namespaces they are registered in, and
    the example calls to explore, by catalog name, one per signature: those it gives in
    ``METASPMD_EXAMPLES`` ({'ns::op' or 'ns.op.overload': [(args, kwargs), ...]}), then
    those its ``METASPMD_MODELS`` make (``model_calls``). Example calls pick the signatures
    a model uses; an op without any gets one schema-built sample. The module is imported
    under a fixed seed, so that every sweep worker sees the same example values."""
    before = set(torch._C._dispatch_get_all_op_names())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(BASE_SEED)
        name = load_module(ref)
    module = sys.modules[name]
    namespaces = catalog.custom_op_namespaces(name, set(torch._C._dispatch_get_all_op_names()) - before)
    examples: dict[str, list[tuple[tuple, dict]]] = {}
    for op, calls in _example_calls(ref, getattr(module, EXAMPLES_ATTR, {}), namespaces):
        examples.setdefault(op, []).extend(calls)
    models = getattr(module, MODELS_ATTR, ())
    if not isinstance(models, (list, tuple)):
        raise ValueError(f"{ref}: {MODELS_ATTR} must be a list of functions returning (model, inputs), "
                         f"got {type(models).__name__}")
    if namespaces:
        for op, calls in model_calls(models, namespaces, ref).items():
            examples.setdefault(op, []).extend(calls)
    return namespaces, {op: unique_calls(catalog.resolve(op), calls) for op, calls in examples.items()}


def _example_calls(ref: str, given: Any, namespaces: frozenset[str]) -> list[tuple[str, list[tuple[tuple, dict]]]]:
    """``METASPMD_EXAMPLES`` checked entry by entry, errors naming the module and the entry:
    (catalog name, [(args, kwargs), ...]) of each op, every call bound to its schema."""
    shape = "a dict of op name ('ns::op' or 'ns.op.overload') -> a list of (args, kwargs) calls"
    if not isinstance(given, dict):
        raise ValueError(f"{ref}: {EXAMPLES_ATTR} must be {shape}, got {type(given).__name__}")
    out = []
    for op, calls in given.items():
        where = f"{ref}: {EXAMPLES_ATTR}[{op!r}]"
        if not isinstance(op, str):
            raise ValueError(f"{where}: the key must be an op name, {shape}")
        qualified = op.replace("::", ".") + (".default" if "::" in op and "." not in op else "")
        try:
            func = catalog.resolve(qualified)
        except KeyError:
            raise ValueError(f"{ref}: {EXAMPLES_ATTR} names {op!r}, which is not a registered op (name it "
                             "'ns::op' or 'ns.op.overload')") from None
        if func.namespace not in namespaces:  # the sweep lists the module's ops only: it was dropped unsaid
            raise ValueError(f"{where}: not an op of this module (its namespaces: {', '.join(sorted(namespaces)) or 'none'})")
        if not isinstance(calls, (list, tuple)) or not calls:
            raise ValueError(f"{where} must be a non-empty list of (args, kwargs) calls (leave the op out for a "
                             "call built from its schema)")
        for i, call in enumerate(calls):
            if not (isinstance(call, (list, tuple)) and len(call) == 2 and isinstance(call[0], (list, tuple))
                    and isinstance(call[1], dict)):
                raise ValueError(f"{where}[{i}] must be an (args, kwargs) pair, a tuple and a dict")
            problem = catalog.schema_problem(func, tuple(call[0]), dict(call[1]))
            if problem:
                raise ValueError(f"{where}[{i}] does not fit the op's schema ({func._schema}): {problem}")
        out.append((qualified, [(tuple(args), dict(kwargs)) for args, kwargs in calls]))
    return out


def _default_device_context() -> Any:
    """The default device as ``torch.set_default_device`` holds it: None where it was never
    set. (``get_default_device`` says cpu then, and setting cpu back would install a device
    mode over every later torch call, tracing included.)"""
    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)


def _set_default_device_context(context: Any) -> None:
    torch.set_default_device(None if context is None else context.device)


def _set_deterministic(mode: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])


# (read, set) of each global setting of torch an op may change (the state the worker set up
# for every op: oneDNN and NNPACK off, ``prepare``), given back after each op (``op_state``)
_GLOBAL_SETTINGS = (
    (torch.get_default_dtype, torch.set_default_dtype),
    (_default_device_context, _set_default_device_context),
    (torch.is_grad_enabled, torch.set_grad_enabled),
    (torch.get_num_threads, torch.set_num_threads),
    (lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
     _set_deterministic),
    (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
    (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    (torch._C._get_mkldnn_enabled, torch._C._set_mkldnn_enabled),
    (torch._C._get_nnpack_enabled, torch._C._set_nnpack_enabled),
)


class TorchBackend:
    """metaspmd.case.Backend over every ATen overload."""

    name = "torch"

    def __init__(self, cache_dir: str | None = None, max_signatures: int = MAX_SIGNATURES, schema_samples: bool = True,
                 opinfos: Collection[str] | None = None, kernels: str | Sequence[str] | None = None,
                 model_programs: bool = True):
        """``opinfos``: capture only these OpInfos, in memory, bypassing the disk cache (tests).
        ``kernels``: modules (dotted names or .py files) of custom ops to sweep instead of
        ATen's; their samples are each module's METASPMD_EXAMPLES calls and the calls its
        METASPMD_MODELS make, or built from the schema, as no OpInfo covers them.
        ``model_programs``: explore the calls of ``model_programs.MODEL_PROGRAMS`` too."""
        self.cache_dir = cache_dir
        self.max_signatures = max_signatures
        self.schema_samples = schema_samples
        self.opinfos = None if opinfos is None else frozenset(opinfos)
        self._index: dict[str, tuple[SampleCall, ...]] | None = None
        self.model_programs = model_programs
        self._program_calls: dict[str, list[tuple[tuple, dict]]] | None = None
        self._ops = _OPS
        refs = [kernels] if isinstance(kernels, str) else list(kernels or ())
        self.custom_namespaces: frozenset[str] = frozenset()
        self.custom_examples: dict[str, list[tuple[tuple, dict]]] = {}
        for ref in refs:
            namespaces, examples = _import_custom_ops(ref)
            if not namespaces:
                raise ValueError(f"{ref}: defines no torch custom op (torch.library.custom_op or Library)")
            self.custom_namespaces |= namespaces
            for op, calls in examples.items():
                self.custom_examples.setdefault(op, []).extend(calls)

    # ------------------------------------------------------------------ Backend protocol

    @contextlib.contextmanager
    def op_state(self):
        """Run an op and give torch's global settings back as they were (the sweep's worker
        calls this around each op): a custom op that calls ``torch.set_default_dtype``
        changed the dtype of every later op's results in its worker."""
        saved = [get() for get, _ in _GLOBAL_SETTINGS]
        rng = torch.get_rng_state()
        try:
            yield
        finally:
            for value, (get, put) in zip(saved, _GLOBAL_SETTINGS):
                if get() != value:  # set only what changed (setting the thread count costs ms)
                    put(value)
            if not torch.equal(torch.get_rng_state(), rng):
                torch.set_rng_state(rng)

    def tensor_ops(self) -> TorchOps:
        return self._ops

    def list_ops(self) -> list[str]:
        if self.custom_namespaces:
            return list(catalog.overloads_in(self.custom_namespaces))
        return list(catalog.all_overloads())

    def resolve(self, op: str) -> torch._ops.OpOverload:
        return catalog.resolve(op)

    @property
    def index(self) -> dict[str, tuple[SampleCall, ...]]:
        if self._index is None:
            if self.opinfos is not None:
                self._index = build_index(self.max_signatures, opinfos=self.opinfos)
            else:
                self._index = load_index(self.cache_dir, self.max_signatures)
        return self._index

    @property
    def program_calls(self) -> dict[str, list[tuple[tuple, dict]]]:
        """The model programs' calls per overload (``model_programs.program_calls``)."""
        if self._program_calls is None:
            self._program_calls = model_programs.program_calls() if self.model_programs else {}
        return self._program_calls

    def prepare(self) -> None:
        """Load (or build, once per torch version) the sample index and run the model
        programs before any op's time limit starts; the sweep calls this in every worker.
        Custom ops need neither. In a process started with ``reproducible.ENV`` (sweep and
        cross-check workers), ops then run on torch's own kernels, not oneDNN's or
        NNPACK's, whose choices follow the machine: torch picks oneDNN for some ops by the
        CPU's features (``_scaled_mm``'s float8 product where the CPU has AMX), so the same
        op ran another kernel, with other rounding and other accepted dtypes, elsewhere;
        NNPACK blocks a convolution's channel sums by the CPU's cache sizes (a batch of 16
        or more, 256 input channels: other bits with an L1 cache of 32 KiB than of 48)."""
        if not self.custom_namespaces:
            _ = self.index, self.program_calls
        if reproducible.in_effect():
            # for the worker's life: torch's test utilities, which the OpInfo database
            # imports, refuse `torch.backends.mkldnn.enabled = False` outside flags()
            torch.backends.mkldnn.set_flags(_enabled=False, _fp32_precision=None)
            torch.backends.nnpack.set_flags(False)

    def cases(self, op: str) -> list[OpCase]:
        cases = self._all_cases(op)
        func = catalog.resolve(op)
        kept = [c for c in cases if catalog.keeps_numel(func, c.args, c.kwargs)]
        if cases and not kept:
            raise Skip("nondeterministic", catalog.RESIZE_REASON)
        return kept

    def cases_at_other_sizes(self, op: str, per_signature: int) -> list[OpCase]:
        """More OpInfo calls of ``op`` (of its functional sibling, for an in-place or out
        overload without calls of its own), up to ``per_signature`` per signature, each at
        other tensor shapes than the call the sweep explored: where the cross-check
        re-verifies the registry's rules (``samples.calls_at_other_sizes``)."""
        func = catalog.resolve(op)
        source = op if op in self.index else catalog.functional_sibling(op)
        if source not in self.index:
            return []
        explored = self.index[source]
        calls = calls_at_other_sizes(source, {c.ref.opinfo for c in explored}, per_signature, explored)
        if source == op:
            cases = []
            for c in calls:
                try:
                    cases.append(self._captured_case(func, c))
                except random_ops.NoLimit:
                    continue  # a random op's call without a deterministic limit, as in ``cases``
        else:
            sib_func = catalog.resolve(source)
            cases = self._cases_from_sibling(func, sib_func, [self._sibling_call(sib_func, c, False) for c in calls])
        return [c for c in cases if catalog.keeps_numel(func, c.args, c.kwargs)]

    def _all_cases(self, op: str) -> list[OpCase]:
        try:
            func = catalog.resolve(op)
        except KeyError as e:
            raise NoSample(str(e)) from None
        no_rule = catalog.no_rule_reason(func)
        if no_rule:
            raise Skip("replicate-only", no_rule)
        if op in catalog.MACHINE_DEPENDENT:
            raise NoSample(catalog.MACHINE_DEPENDENT[op])
        reason = catalog.nondeterministic_reason(func)
        if reason and not random_ops.checkable(func):
            raise Skip("nondeterministic", reason if catalog.aten_base(func) in catalog.UNINITIALIZED
                       else f"{reason}: {random_ops.UNCHECKABLE}")
        if not catalog.aten_base(func):  # a custom op: no OpInfo, no functional sibling
            if op in self.custom_examples:
                return [self._example_case(func, args, kwargs) for args, kwargs in self.custom_examples[op]]
            cases, error = self._schema_cases(func)
            if not cases:
                raise NoSample("schema-built inputs fail: " + _short_error(error))
            return cases
        cases, no_limit = [], []
        for c, reserve in self._calls(op):
            try:
                cases.append(self._reserved(self._captured_case(func, c), reserve))
            except random_ops.NoLimit as e:
                no_limit.append(str(e))
        cases = _with_primary(cases)
        if no_limit and not cases:
            raise Skip("nondeterministic", f"{reason}; {no_limit[0]}")
        cases = self._with_model_calls(func, op, cases)
        cases = self._with_hand_leads(func, cases)
        if not cases:
            cases = self._sibling_cases(func, op)
        if cases:
            return cases
        if not self.schema_samples:
            raise NoSample("no OpInfo sample reaches it")
        cases, error = self._schema_cases(func)
        if not cases:  # an out= overload checks its outs' dtype: its sibling's result gives it
            cases = self._sibling_schema_cases(func, op)
        if not cases:
            raise NoSample("no OpInfo sample reaches it; schema-built inputs fail: " + _short_error(error))
        return cases

    # ------------------------------------------------------------------ case building

    def _case(self, func, args: tuple, kwargs: dict, runner: Callable, fresh: Callable[[int], tuple] | None) -> OpCase:
        return torch_case(func, args, kwargs, runner, fresh)

    def _example_case(self, func, args: tuple, kwargs: dict) -> OpCase:
        """A case from a user's example call, in float64 where the op takes it (as OpInfo
        samples are); fresh trials refill its tensors with random data."""
        if runs_in_float64(func, args, kwargs):
            args, kwargs = to_float64((args, kwargs))
        # its out= tensors are allocated afresh for every shard, shaped as the functional
        # overload's result where the kernel does not resize an empty one (writes by copy_)
        _, kwargs = out_spec_from_kwargs(func, kwargs)
        sibling = catalog.overload_functional_sibling(func)
        cases = self._cases_from_sibling(func, sibling, [(tuple(args), dict(kwargs), None, False)]) if sibling else []
        return cases[0] if cases else self._case(func, tuple(args), dict(kwargs), make_runner(func), None)

    def _captured_case(self, func, call: SampleCall, source: SampleCall | None = None) -> OpCase:
        spec, kwargs = out_spec_from_kwargs(func, call.kwargs)
        args = tuple(call.args)
        if call.float64:
            args, kwargs = to_float64((args, kwargs))
            spec = _float64_spec(spec)
        return self._case(func, args, kwargs, make_runner(func, spec), self._fresh_for(func, call))

    def _fresh_for(self, func, call: SampleCall) -> Callable[[int], tuple] | None:
        if not call.regenerable:
            return None
        outs = set(catalog.out_arg_names(func))

        def fresh(seed: int) -> tuple[tuple, dict]:
            got = regenerate(call, seed)
            if got is None:
                raise ValueError("the sample did not regenerate")
            args, kwargs = got
            kwargs = {k: v for k, v in kwargs.items() if k not in outs}
            return to_float64((tuple(args), kwargs)) if call.float64 else (tuple(args), kwargs)

        return fresh

    def _calls(self, op: str) -> list[tuple[SampleCall, bool]]:
        """The index's calls of ``op``, each with whether it is a spare (beyond max_signatures)."""
        return [(c, k >= self.max_signatures) for k, c in enumerate(self.index.get(op, ()))]

    @staticmethod
    def _reserved(case: OpCase, reserve: bool) -> OpCase:
        return dataclasses.replace(case, reserve=True) if reserve else case

    def _with_model_calls(self, func, op: str, cases: list[OpCase]) -> list[OpCase]:
        """``cases`` and, at up to MAX_MODEL_SIGNATURES signatures no primary case has, the
        model programs' calls of ``op``: a spare OpInfo case of such a signature becomes
        primary (it regenerates), else the program's call is added. A composite op's calls
        only where it has no OpInfo case."""
        calls = self.program_calls.get(op, ())
        if not calls:  # most ops: no signature to compute
            return cases
        if cases and op in composite_names():  # see model_programs: only where OpInfo reaches none
            return cases
        cases = list(cases)
        primary = {call_signature(func, c.args, c.kwargs) for c in cases if not c.reserve}
        spares = {call_signature(func, c.args, c.kwargs): k for k, c in enumerate(cases) if c.reserve}
        added = 0
        for args, kwargs in calls:
            sig = call_signature(func, args, kwargs)
            if sig in primary or added == model_programs.MAX_MODEL_SIGNATURES:
                continue
            try:
                if sig in spares:
                    cases[spares[sig]] = dataclasses.replace(cases[spares[sig]], reserve=False)
                else:
                    cases.append(self._example_case(func, args, kwargs))
            except random_ops.NoLimit:
                continue
            primary.add(sig)
            added += 1
        return cases

    def _with_hand_leads(self, func, cases: list[OpCase]) -> list[OpCase]:
        """``cases`` led by the op's hand samples (``hand_samples.LEADING``), which stand in
        for OpInfo's calls at the signatures they share; an out= overload takes its
        functional op's, its outs' dtypes from that op's result."""
        leads = [self._case(func, *hand_samples.inputs(func, g, 0), make_runner(func),
                            lambda seed, g=g: hand_samples.inputs(func, g, seed)) for g in hand_samples.leading(func)]
        sibling = catalog.functional_sibling(catalog.op_name(func)) if catalog.out_arg_names(func) else None
        if not leads and sibling is not None:
            calls = [(*hand_samples.inputs(func, g, 0), lambda seed, g=g: hand_samples.inputs(func, g, seed), False)
                     for g in hand_samples.leading(catalog.resolve(sibling))]
            leads = self._cases_from_sibling(func, catalog.resolve(sibling), calls) if calls else []
        led = {call_signature(func, c.args, c.kwargs) for c in leads}
        return leads + [c for c in cases if call_signature(func, c.args, c.kwargs) not in led] if leads else cases

    def _sibling_cases(self, func, op: str) -> list[OpCase]:
        """Cases for an in-place or out overload from its functional overload's samples: its
        OpInfo samples, or where it has none, the model programs' calls of it."""
        sibling = catalog.functional_sibling(op)
        if sibling is None:
            return []
        sib_func = catalog.resolve(sibling)
        calls = [self._sibling_call(sib_func, call, reserve) for call, reserve in self._calls(sibling)]
        if not calls:
            for args, kwargs in self.program_calls.get(sibling, ())[: model_programs.MAX_MODEL_SIGNATURES]:
                if runs_in_float64(sib_func, args, kwargs):
                    args, kwargs = to_float64((args, kwargs))
                calls.append((tuple(args), dict(kwargs), None, False))
        return self._cases_from_sibling(func, sib_func, calls)

    def _sibling_call(self, sib_func, call: SampleCall, reserve: bool) -> tuple[tuple, dict, Callable | None, bool]:
        """A functional sibling's indexed call as ``_cases_from_sibling`` takes it."""
        args, kwargs = tuple(call.args), dict(call.kwargs)
        if call.float64:
            args, kwargs = to_float64((args, kwargs))
        return args, kwargs, self._fresh_for(sib_func, call), reserve

    def _sibling_schema_cases(self, func, op: str) -> list[OpCase]:
        """Cases for an in-place or out overload from its functional overload's schema-built
        sample, for overloads whose own guesses fail (fft's out wants a complex tensor,
        float_power's out a double one: the functional op's result tells which)."""
        sibling = catalog.functional_sibling(op)
        if sibling is None:
            return []
        sib_func = catalog.resolve(sibling)
        built, _ = self._schema_cases(sib_func)
        return self._cases_from_sibling(func, sib_func, [(c.args, c.kwargs, c.fresh, False) for c in built])

    def _cases_from_sibling(self, func, sib_func, calls: list[tuple[tuple, dict, Callable | None, bool]]) -> list[OpCase]:
        """Cases for ``func`` on its functional sibling's (args, kwargs, fresh, reserve)
        calls, out dtypes taken from the sibling's result; calls it cannot run are left out."""
        cases = []
        for args, kwargs, fresh, reserve in calls:
            try:
                outs = bool(catalog.out_arg_names(func))
                expected = sib_func(*args, **kwargs) if outs else None
                spec = _out_spec_from_result(func, expected) if outs else {}
                runner = make_runner(func, spec)
                try:
                    result = runner(*args, **kwargs)  # an in-place op may refuse its own input's shape
                    left_empty = outs and _left_empty(result, expected)
                except Exception:
                    if not outs:
                        raise
                    left_empty = True
                if left_empty:
                    # a kernel that does not resize an empty out, loudly or silently
                    # (binary_cross_entropy_backward's returns it empty): outs shaped as the
                    # functional op's result
                    runner = make_runner(func, spec, shaped_by=sib_func)
                    runner(*args, **kwargs)
                cases.append(self._reserved(self._case(func, args, kwargs, runner, fresh), reserve))
            except Exception:
                continue  # e.g. an in-place op cannot broadcast its own input
        return _with_primary(cases)

    def _schema_cases(self, func) -> tuple[list[OpCase], str]:
        """One case from schema-built inputs, or none and the last error."""
        if catalog.op_name(func) in catalog.CRASH_ON_GUESSED_INPUTS:
            return [], "guessed inputs crash the process or read out of bounds"
        # out overloads check their outs' dtype: try the common ones
        dtypes = (torch.float32, torch.int64, torch.bool) if catalog.out_arg_names(func) else (torch.float32,)
        guess, error = None, ""
        for dtype in dtypes:
            runner = make_runner(func, default_dtype=dtype)
            guess, err = find_schema_sample(lambda a, k: runner(*a, **k), func)
            error = error or err
            if guess is not None:
                break
        if guess is None:
            return [], error
        if guess.dtype == "float32":  # float64 ground truth when the op takes it
            f64 = dataclasses.replace(guess, dtype="float64")
            runner64 = make_runner(func, default_dtype=torch.float64 if dtype == torch.float32 else dtype)
            try:
                a64, k64 = schema_inputs(func, f64, BASE_SEED)
                runner64(*a64, **k64)
                runs_on_fresh_inputs(lambda a, k: runner64(*a, **k), func, f64)
                guess, runner = f64, runner64
            except Exception:
                pass
        args, kwargs = schema_inputs(func, guess, BASE_SEED)

        def fresh(seed: int) -> tuple[tuple, dict]:
            return schema_inputs(func, guess, seed)

        return [self._case(func, args, kwargs, runner, fresh)], ""


__all__ = ["TorchBackend", "make_runner", "out_spec_from_kwargs"]
