"""Empty shards under ``register()``: a cut of 5 over 4 ranks (2, 2, 1, 0) leaves one rank
none of the dim, and some kernels refuse an empty input (``max()`` of no elements, a
convolution with no rows, ``aminmax`` over an empty dim, an FFT). A rule, DTensor's or a
verified one, says how the ranks' outputs combine, not whether each rank's kernel runs. So
where a strategy leaves a rank an empty shard, the kernel is tried on that rank's shapes
(once per call), and DTensor picks among the strategies it takes; where it takes none, the
op runs replicated. Guarded at DTensor's one choice of a strategy
(``_select_min_cost_strategy``), for its own rules, the verified ones and its decompositions.
"""

from __future__ import annotations

import functools
import itertools

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map

from .catalog import op_name, tagged_random

# the guard's name in RegisterReport.guarded
EMPTY_SHARDS_TRIED = "DTensor gives no rank an empty shard that the op's kernel refuses"

# Kernels never tried: native_batch_norm_backward's CPU kernel dies of SIGFPE on a shard with
# no channels, and batch_norm_backward and _batch_norm_impl_index_backward run it (their
# channel cuts). A strategy that leaves a rank an empty shard of one is dropped untried.
_KILL_THE_PROCESS = frozenset({"aten.native_batch_norm_backward.default", "aten.native_batch_norm_backward.out",
                               "aten.batch_norm_backward.default",
                               "aten._batch_norm_impl_index_backward.default"})

_TRIED: dict = {}  # (op, what a rank's call is given) -> whether the kernel refused it
_OWNERS: list = []  # (a register() report, the op names it guards or None for every op)
_SAVED: list = []  # DTensor's own _select_min_cost_strategy, while guarded


def local_shapes(spec) -> tuple[tuple[int, ...], ...] | None:
    """The shape of ``spec``'s tensor on each rank of its mesh (DTensor's cuts, mesh dims in
    order); None where a placement's cut is not plain Shard's."""
    meta = spec.tensor_meta
    if meta is None:
        return None
    return _local_shapes(tuple(spec.mesh.shape), tuple(spec.placements), tuple(meta.shape))


@functools.lru_cache(maxsize=4096)  # a model's propagations ask for the same few cuts again and again
def _local_shapes(mesh_shape: tuple, placements: tuple, whole: tuple) -> tuple[tuple[int, ...], ...] | None:
    from torch.distributed.tensor import Shard

    if any(type(p) is not Shard and not (p.is_replicate() or p.is_partial()) for p in placements):
        return None  # _StridedShard's cut is not chunk's (nor, in torch 2.13, a Shard at all)
    shapes = []
    for coordinate in itertools.product(*(range(n) for n in mesh_shape)):
        shape = list(whole)
        for m, p in enumerate(placements):
            if p.is_shard():  # torch.chunk's pieces, as Shard cuts (not its own function: LocalTensorMode
                piece = -(-shape[p.dim] // mesh_shape[m])  # runs that for every rank)
                shape[p.dim] = max(0, min(shape[p.dim], piece * (coordinate[m] + 1)) - piece * coordinate[m])
        shapes.append(tuple(shape))
    return tuple(shapes)


def _emptied(shape: tuple[int, ...], whole) -> bool:
    return 0 in shape and 0 not in whole


def _emptied_somewhere(spec) -> bool:
    """Whether ``spec``'s cut leaves some rank an empty shard of a dim the tensor has."""
    meta = spec.tensor_meta
    if meta is None or not any(p.is_shard() for p in spec.placements):
        return False
    return _emptied_at_some_rank(tuple(spec.mesh.shape), tuple(spec.placements), tuple(meta.shape))


@functools.lru_cache(maxsize=4096)
def _emptied_at_some_rank(mesh_shape: tuple, placements: tuple, whole: tuple) -> bool:
    shapes = _local_shapes(mesh_shape, placements, whole)
    return shapes is not None and any(_emptied(x, whole) for x in shapes)


def kernel_refuses(op: torch._ops.OpOverload, strategy, op_schema) -> bool:
    """Whether ``op``'s kernel refuses what ``strategy`` (an OpSpec) gives a rank that it
    leaves an empty shard. The kernel runs on random data of the rank's shapes (integers
    zero), at most one rank's inputs at a time, with the sizes DTensor restates from the
    output's local shape (a view's, an upsample backward's input size) restated alike.
    Only ATen ops are tried (a user's op, or a collective, could wait on the other ranks),
    and not the random ones: a draw would move the generator the call's own draws come
    from; nor those whose other arguments DTensor restates per rank (group norm's N,
    squeeze's dims), which take empty shards."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    from .dtensor import rewrites_shape_args  # (DTensor's modules load on first use, not with register)

    specs = list(strategy.input_specs or ())
    if not any(_emptied_somewhere(s) for s in specs):
        return False
    per_spec = [local_shapes(s) for s in specs]
    if any(shapes is None for shapes in per_spec):
        return False
    if op_name(op) in _KILL_THE_PROCESS:  # (some rank's shard is empty, as the first check found)
        return True
    call = (list(op_schema.args_schema), dict(op_schema.kwargs_schema))
    sized = _restated_size(op)
    if op.namespace != "aten" or tagged_random(op) or (rewrites_shape_args(op) and sized is None) \
            or sum(isinstance(x, DTensorSpec) for x in tree_leaves(call)) != len(specs):
        return False  # (a strategy not placing the call's tensors one to one is not read here)
    outputs = [None] * len(per_spec[0]) if sized is None else _output_shapes(op, call, specs, strategy)
    if outputs is None:
        return False
    emptied = {(ranks, out) for ranks, out in zip(zip(*per_spec), outputs)
               if any(_emptied(shape, s.tensor_meta.shape) for shape, s in zip(ranks, specs))}
    plain = repr(tree_map(lambda x: "T" if isinstance(x, DTensorSpec) else x, call))
    dtypes = tuple(s.tensor_meta.dtype for s in specs)
    for shapes, out in sorted(emptied):
        key = (op, shapes, out, dtypes, plain)
        if len(_TRIED) > 4096:  # (calls of ever new shapes, dynamic ones, would grow it without end)
            _TRIED.clear()
        if key not in _TRIED:
            rank_call = call if out is None else ([*call[0][:sized], list(out), *call[0][sized + 1:]], call[1])
            _TRIED[key] = _raises(op, rank_call, shapes, specs)
        if _TRIED[key]:
            return True
    return False


def _restated_size(op: torch._ops.OpOverload) -> int | None:
    """The position of the size argument DTensor restates from the output's local shape
    (``view``'s sizes, ``new_zeros``' size, an upsample backward's input size), or None."""
    from torch.distributed.tensor import DTensor

    at = DTensor._op_dispatcher.sharding_propagator.op_to_shape_and_stride_idx.get(op)
    return at if isinstance(at, int) else None  # (new_empty_strided's stride too: a factory, untried)


def _output_shapes(op, call, specs, strategy) -> tuple[tuple[int, ...], ...] | None:
    """Each rank's shape of the op's output under ``strategy``, from its whole shape (the
    call run on meta tensors); None where the output's cut is not plain Shard's, or the
    call has no meta form (then the op is not tried, as DTensor would run it)."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    out = strategy.output_specs
    if not isinstance(out, DTensorSpec):
        return None
    try:
        with _disable_current_modes():
            made = iter([torch.empty(s.tensor_meta.shape, dtype=s.tensor_meta.dtype, device="meta") for s in specs])
            args, kwargs = tree_map(lambda x: next(made) if isinstance(x, DTensorSpec) else x, call)
            whole = tuple(op(*args, **kwargs).shape)
    except Exception:  # noqa: BLE001 -- no meta kernel, or a call the whole shapes refuse
        return None
    return _local_shapes(tuple(out.mesh.shape), tuple(out.placements), whole)


def _raises(op, call, shapes, specs) -> bool:
    """Whether ``op`` raises on data of ``shapes`` in the places of the call's tensors."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    device = specs[0].mesh.device_type
    g = torch.Generator(device=device).manual_seed(0)

    def data(shape, dtype):
        if dtype.is_floating_point or dtype.is_complex:
            return torch.randn(shape, dtype=dtype, device=device, generator=g)
        return torch.zeros(shape, dtype=dtype, device=device)

    try:
        with _disable_current_modes(), torch.no_grad():  # plain tensors, not the ranks' LocalTensors
            made = iter([data(shape, spec.tensor_meta.dtype) for shape, spec in zip(shapes, specs)])
            args, kwargs = tree_map(lambda x: next(made) if isinstance(x, DTensorSpec) else x, call)
            op(*args, **kwargs)
    except Exception:  # noqa: BLE001 -- any refusal of the rank's shapes
        return True
    return False


def _replicated(strategy):
    """``strategy`` (an OpSpec) with every input and output Replicate: each rank runs the
    whole op."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSpec

    def whole(spec):
        if spec is None:
            return None
        return DTensorSpec(spec.mesh, (Replicate(),) * spec.mesh.ndim, tensor_meta=spec.tensor_meta)

    outs = strategy.output_specs
    outs = tuple(whole(s) for s in outs) if isinstance(outs, tuple) else whole(outs)
    return OpSpec(outs, [whole(s) for s in strategy.input_specs or ()],
                  redistribute_cost=[[0.0] * len(c) for c in strategy.redistribute_cost or ()])


def taken(strategy, op_schema):
    """``strategy`` (an OpStrategy) less the strategies whose empty shards the kernel
    refuses; where none is left, the op replicated (an op that writes in place keeps them
    all: moving what it writes would lose the write, and the kernel's own error stands)."""
    from torch.distributed.tensor._op_schema import OpStrategy

    op = op_schema.op
    kept = [s for s in strategy.strategies if not kernel_refuses(op, s, op_schema)]
    if len(kept) == len(strategy.strategies):
        return strategy
    if not kept:
        if op._schema.is_mutable:
            return strategy
        kept = [_replicated(strategy.strategies[0])]
    return OpStrategy(kept)


def _covers(op) -> bool:
    name = op_name(op)
    return any(names is None or name in names for _, names in _OWNERS)


def _select_taken(strategy, op_schema=None):
    if op_schema is not None and _covers(op_schema.op):
        strategy = taken(strategy, op_schema)
    return _SAVED[0](strategy, op_schema)


def guard(owner, names: frozenset | None) -> None:
    """Have DTensor choose only strategies whose empty shards the kernel takes, for the ops
    ``names`` (every op: None), until ``unguard(owner)``."""
    from torch.distributed.tensor import _sharding_prop

    _OWNERS.append((owner, names))
    if not _SAVED:
        _SAVED.append(_sharding_prop._select_min_cost_strategy)
        _sharding_prop._select_min_cost_strategy = _select_taken


def unguard(owner) -> None:
    from torch.distributed.tensor import _sharding_prop

    _OWNERS[:] = [(o, names) for o, names in _OWNERS if o is not owner]
    if not _OWNERS and _SAVED:
        _sharding_prop._select_min_cost_strategy = _SAVED.pop()
