"""DTensor handlers for ops DTensor refuses for machinery reasons, not for want of a rule.

DTensor computes every output's shape before it runs an op, on fake tensors: an op whose
output shape (``nonzero``, ``unique``) or value (``allclose``) depends on the input's values
raises there, whatever the placements, and ``register_sharding`` cannot help. Such an op
gets a custom handler (``DTensor._op_dispatcher._custom_op_handlers``, the extension point
DTensor's own convolution and ``as_strided`` use) that runs the all-replicated strategy:
every DTensor argument redistributed to Replicate, the op run on the full local tensors,
each tensor output a Replicate DTensor on the same mesh. Every rank runs the same
deterministic op on the same values, so this is sound where the op is deterministic: each
op listed here has a registry status (``ok``, ``derived`` or ``replicate-only``) that says
the sweep ran it replicated and found it so; ``tests/codegen/test_dtensor_handlers.py``
checks that against ``registry/torch``. Ops the sweep found no cut for (``replicate-only``,
absent from the generated table) and DTensor has no rule for get the all-replicated
strategy as their DTensor rule (``REPLICATE_ONLY``).

Two more extend DTensor's own behaviour only where it raises, never where it answers:
``logsumexp`` of a 0-d tensor (DTensor's rule asserts it has reduction dims) gets the
all-replicated strategy, and ``as_strided`` of a replicated tensor whose reads stay inside
its own elements (DTensor's handler takes only the identity view) is the same view of each
rank's full tensor. And in-place views whose out-of-place rule DTensor has (``transpose_``,
which ``stft``'s decomposition calls) get that rule, as DTensor gives ``squeeze_`` its own.

A random op ``register()`` installs strategies for gets ``drawing_handler``: drawn whole on
every rank, each keeping its shard (``drawn_whole``, which ``parallelize`` runs too), since
ranks seeded alike would draw one shard's values on every shard. DTensor's own random ops
(``DRAWN_ON_CPU``) get ``cpu_drawing_handler``, the same on a CPU mesh, which DTensor's RNG
tracker does not serve.

DTensor moves positional tensors only: an op ``register()`` installs that takes keyword-only
tensors (a histogram's ``weight=``) gets ``keyword_handler``, DTensor's own dispatch, which
replicates the keyword DTensors first where no verified strategy keeps them where they lie.
An op whose DTensor rule ``register()`` guards for the tensors it writes (a batch norm's
running statistics), and each in-place op DTensor decomposes, gets ``write_back_handler``:
where no strategy keeps them in place, the op runs on moved copies, which are then written
back; where DTensor finds no strategy at all for an in-place op (``tril_``), its out-of-place
twin runs and its result is written into self.

Nothing here imports DTensor at module import: ``install`` does, from ``register()``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import catalog

# op -> why DTensor cannot run it: its fake-tensor propagation raises on any placement.
_SHAPE = "output shape depends on the input's values, which DTensor's fake-tensor propagation cannot know"
REPLICATED = {
    "aten.nonzero.default": _SHAPE,
    "aten.masked_select.default": _SHAPE,
    "aten._unique.default": _SHAPE,
    "aten._unique2.default": _SHAPE,
    "aten.unique_consecutive.default": _SHAPE,
    "aten.unique_dim.default": _SHAPE,
    "aten.unique_dim_consecutive.default": _SHAPE,
    "aten.bincount.default": _SHAPE,
    "aten.repeat_interleave.Tensor": _SHAPE,
    "aten.linalg_lstsq.default": _SHAPE + " (the residuals' length depends on the rank found)",
    "aten.allclose.default": "returns a bool computed from the values, which fake-tensor propagation cannot know",
    "aten._histogramdd_bin_edges.default":
        "returns a list of tensors, which register_sharding cannot carry and DTensor has no rule for",
    # log_alpha's last dim is twice the longest target's length plus one; the op leaves its
    # entries past each target's length unwritten, run under torch's NaN fill (catalog.UNWRITTEN_FILLED)
    "aten._ctc_loss.default": _SHAPE + " (log_alpha's length is the longest target's)",
    "aten._ctc_loss.Tensor": _SHAPE + " (log_alpha's length is the longest target's)",
}

# Ops the sweep found no cut for (registry status replicate-only, so absent from the
# generated table) that DTensor has no rule for: the all-replicated strategy, installed as
# DTensor's rule (their output shapes follow from the arguments, so DTensor's propagation
# runs). The Tensor overloads of linspace and logspace, whose start or end is a 0-d tensor.
REPLICATE_ONLY = {
    "aten.linspace.Scalar_Tensor": "no cut: a 0-d end",
    "aten.logspace.Scalar_Tensor": "no cut: a 0-d end",
    "aten.logspace.Tensor_Scalar": "no cut: a 0-d start",
}

# Ops whose DTensor rule or handler raises on some calls: (what is extended, why).
EXTENDED = {
    "aten.logsumexp.default":
        "DTensor's rule asserts its input has reduction dims; a 0-d input has none and gets the all-replicated "
        "strategy",
    "aten.as_strided.default":
        "DTensor's handler takes only the identity view; a replicated input read inside its own elements is the "
        "same view of each rank's full tensor",
}

# DTensor's own random ops with a tensor input. On a mesh its RNG tracker does not serve
# (the CPU), each rank draws its shard from the generator state every rank shares: the same
# values on every shard (a dropout mask repeating across shards). ``cpu_drawing_handler``
# draws them whole on every rank there, each keeping its shard, as ``drawing_handler`` does
# for the random ops ``register()`` installs.
DRAWN_ON_CPU = {
    "aten.native_dropout.default": "functional",
    "aten.rand_like.default": "functional",
    "aten.randn_like.default": "functional",
    "aten.randint_like.default": "functional",
    "aten.randint_like.low_dtype": "functional",
    "aten.bernoulli.default": "functional",
    "aten.normal_.default": "in place",
    "aten.uniform_.default": "in place",
    "aten.bernoulli_.float": "in place",
}

# In-place views DTensor has the out-of-place rule of, as it has squeeze_'s: its own dim map
# (``register_op_strategy_map``, strict: no view that would need a redistribution), in place.
# stft's decomposition transposes its frames in place.
INPLACE_VIEWS = {
    "aten.transpose_.default": "transpose",
    "aten.unsqueeze_.default": "unsqueeze",
}


# Losses whose reduction='mean' is their sum over their total weight (the targets not
# ignored, weighted), both sums that split over a cut batch: ``mean_as_sum_handler``.
MEANS_AS_SUMS = ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
_MEAN, _SUM = 1, 2  # at::Reduction


def _dtensor():
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    return DTensor, Replicate, DTensorSpec, TensorMeta


def _replicated_spec(mesh, t: torch.Tensor):
    _, Replicate, DTensorSpec, TensorMeta = _dtensor()
    return DTensorSpec(mesh, (Replicate(),) * mesh.ndim, tensor_meta=TensorMeta(t.shape, t.stride(), t.dtype))


def replicated_handler(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """The all-replicated strategy, run: DTensor's own unwrapping (a plain tensor mixed in is
    refused as DTensor refuses it), every DTensor argument, keyword ones too, redistributed
    to Replicate, the op on the local (full) tensors, outputs wrapped Replicate."""
    from torch.distributed.tensor._redistribute import redistribute_local_tensor
    from torch.utils._pytree import tree_map, tree_unflatten

    DTensor, Replicate, DTensorSpec, _ = _dtensor()
    info = DTensor._op_dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    mesh = info.compute_mesh
    if not mesh._is_current_rank_part_of_mesh():
        raise NotImplementedError(f"{op_call}: its output shape depends on values this rank outside the mesh lacks")

    def full(spec, local):
        if not isinstance(spec, DTensorSpec):
            return local
        if spec.mesh != mesh:
            raise RuntimeError(f"{op_call}: DTensor arguments on different meshes ({spec.mesh} and {mesh})")
        if all(p.is_replicate() for p in spec.placements):
            return local
        target = DTensorSpec(mesh, (Replicate(),) * mesh.ndim, tensor_meta=spec.tensor_meta)
        return redistribute_local_tensor(local, spec, target)

    local_args = [full(s, a) for s, a in zip(info.flat_args_schema, info.local_args)]
    if info.args_tree_spec is not None:
        local_args = tree_unflatten(local_args, info.args_tree_spec)
    local_kwargs = {k: full(info.schema.kwargs_schema[k], v) for k, v in info.local_kwargs.items()}
    run = catalog.unwritten_filled(op_call) if catalog.aten_base(op_call) in catalog.UNWRITTEN_FILLED else op_call
    out = run(*local_args, **local_kwargs)  # ranks agree on what the op leaves unwritten too
    return tree_map(lambda t: DTensor(t, _replicated_spec(mesh, t), requires_grad=False)
                    if isinstance(t, torch.Tensor) else t, out)


def _logsumexp_strategy(own):
    """DTensor's logsumexp rule, with the all-replicated strategy for a 0-d input (where
    that rule raises: no reduction dims)."""
    from torch.distributed.tensor._op_schema import OpStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    Replicate = _dtensor()[1]

    def strategy(op_schema):
        first = op_schema.args_schema[0]
        if isinstance(first, OpStrategy) and first.ndim == 0:
            return expand_to_full_mesh_op_strategy(first.mesh, op_schema, [[Replicate(), Replicate()]], input_index=1)
        return own(op_schema)

    return strategy


def _replicated_strategy(op):
    """DTensor's strategy function placing every tensor, in and out, Replicate."""
    from torch.distributed.tensor._op_schema import OpStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    Replicate = _dtensor()[1]
    n_out = len(op._schema.returns)

    def strategy(op_schema):
        n_in = sum(isinstance(a, OpStrategy) for a in op_schema.args_schema) + sum(
            isinstance(v, OpStrategy) for v in op_schema.kwargs_schema.values())
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema,
                                               [[Replicate()] * (n_out + n_in)], input_index=n_out)

    return strategy


def _dense_footprint(size, stride) -> bool:
    """Whether a tensor of these sizes and strides covers its storage span exactly once."""
    expected = 1
    for s, n in sorted((s, n) for n, s in zip(size, stride) if n != 1):
        if s != expected:
            return False
        expected *= n
    return True


def _as_strided_handler(own):
    """DTensor's as_strided handler, and where it raises, the view of each rank's full
    tensor: when the input is Replicate on every mesh dim, its local tensor has the
    DTensor's strides, covers its span densely, and every element read lies inside it (a
    read outside would see the storage around the tensor, which no rank shares)."""
    from torch._library.utils import fill_defaults
    from torch.utils._python_dispatch import return_and_correct_aliasing

    DTensor = _dtensor()[0]

    def handler(op_call, args, kwargs):
        try:
            return own(op_call, args, kwargs)
        except RuntimeError:
            filled, _ = fill_defaults(op_call._schema, args, kwargs)
            x, size, stride, offset = filled
            offset = x.storage_offset() if offset is None else offset
            local = x._local_tensor if isinstance(x, DTensor) else None
            if local is None or not all(p.is_replicate() for p in x.placements) \
                    or tuple(local.stride()) != tuple(x.stride()) or not _dense_footprint(x.shape, x.stride()):
                raise
            size, stride = tuple(size), tuple(stride)
            last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset
            if any(s < 0 for s in stride) or offset < x.storage_offset() or last >= x.storage_offset() + x.numel():
                raise
            view = local.as_strided(size, stride, local.storage_offset() + offset - x.storage_offset())
            out = DTensor(view, _replicated_spec(x.device_mesh, view), requires_grad=False)
            return return_and_correct_aliasing(op_call, args, kwargs, out)

    return handler


class KeywordPlacementRefused(RuntimeError):
    """No installed strategy keeps a call's keyword tensors where they lie (DTensor moves
    positional tensors only): ``keyword_handler`` replicates them and asks again."""


class WritesMoved(RuntimeError):
    """Every strategy of DTensor's rule moves a tensor the op writes in place (the write
    would land in a moved copy): ``write_back_handler`` runs the op on copies placed as
    ``wanted`` says (position among the call's DTensors -> placements: those of the strategy
    DTensor would pick) and writes them back."""

    def __init__(self, message: str, wanted: dict):
        super().__init__(message)
        self.wanted = wanted


def _cause(e: BaseException | None, kind: type) -> BaseException | None:
    """The first exception of ``kind`` along ``e``'s causes (DTensor wraps what a rule raises)."""
    while e is not None:
        if isinstance(e, kind):
            return e
        e = e.__cause__
    return None


def _own_dispatch(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """DTensor's own dispatch, as it runs an op with no handler: unwrap, propagate,
    redistribute, run, wrap; an in-place op's result is its self, re-specced as the rule
    places the result (DTensor's dispatcher does the same)."""
    d = _dtensor()[0]._op_dispatcher
    info = d.unwrap_to_op_info(op_call, args, kwargs)
    d.sharding_propagator.propagate(info)
    spec = info.output_sharding.output_spec
    out = d.wrap(d._dispatch_get_local_results_slow_path(op_call, args, info), spec)
    if not in_place(op_call):
        return out
    if spec is not None and args[0]._spec.placements != spec.placements:
        args[0]._spec = spec
    return args[0]


def in_place(op: torch._ops.OpOverload) -> bool:
    """Does ``op`` write its first argument and return it (``tril_``, ``uniform_``)?"""
    args, returns = op._schema.arguments, op._schema.returns
    return (bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write and len(returns) == 1
            and returns[0].alias_info is not None and returns[0].alias_info.is_write)


def keyword_handler(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """DTensor's own dispatch, and where no strategy keeps a keyword tensor's placement (a
    cut ``weight=`` of a histogram, which DTensor would use where it lies), the same with
    every keyword DTensor first redistributed to Replicate: the placement DTensor never has
    to move."""
    from torch.utils._pytree import tree_map

    DTensor, Replicate = _dtensor()[:2]
    try:
        return _own_dispatch(op_call, args, kwargs)
    except Exception as e:
        if _cause(e, KeywordPlacementRefused) is None:
            raise
    return _own_dispatch(op_call, args, tree_map(lambda v: v.redistribute(v.device_mesh, [Replicate()] * v.device_mesh.ndim)
                                                 if isinstance(v, DTensor) else v, kwargs))


def write_back_handler(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """DTensor's own dispatch, and where every strategy of its rule moves a tensor the op
    writes (``WritesMoved``: a channel-cut batch norm's replicated running statistics), the
    op on copies of those tensors placed as DTensor's pick wants them, each copy then
    redistributed to its tensor's placement and written into it: the tensor is updated, where
    plain DTensor updated only the copy."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    DTensor = _dtensor()[0]
    try:
        return _own_dispatch(op_call, args, kwargs)
    except Exception as e:
        moved = _cause(e, WritesMoved)
        if moved is None:
            twin = _out_of_place_twin(op_call) if isinstance(e, NotImplementedError) else None
            if twin is None:
                raise
            return _in_place_by_twin(op_call, twin, args, kwargs, e)
        leaves, tree = tree_flatten((args, kwargs))
        tensors = [i for i, x in enumerate(leaves) if isinstance(x, DTensor)]
        if any(p.is_partial() for k in moved.wanted for p in leaves[tensors[k]].placements):
            raise  # DTensor moves nothing into a Partial placement: the copy could not be written back
    copies = {tensors[k]: _dense_copy(leaves[tensors[k]], placements) for k, placements in moved.wanted.items()}
    a, k = tree_unflatten([copies.get(i, x) for i, x in enumerate(leaves)], tree)
    out = _own_dispatch(op_call, a, k)
    with torch.no_grad():
        for i, copy in copies.items():
            leaves[i]._local_tensor.copy_(copy.redistribute(copy.device_mesh, leaves[i].placements)._local_tensor)
    return args[0] if in_place(op_call) else out  # an in-place op's self, written back where it lies


def mean_as_sum_handler(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """An nll_loss with reduction='mean' as its sum and its total weight (reduction='sum'),
    each made whole, the one divided by the other, as ATen divides them: over a cut batch
    those are Partial(sum), two scalars to reduce, where a mean has no placement (each
    rank's mean divides by its own weight), so the verified rules of the mean gather the
    input. Other reductions run as they are."""
    from .dtensor_refuted import argument

    Replicate = _dtensor()[1]
    if argument(op_call, args, kwargs, "reduction") != _MEAN:
        return _own_dispatch(op_call, args, kwargs)
    at = next(i for i, a in enumerate(op_call._schema.arguments) if a.name == "reduction")
    if at < len(args):
        args = (*args[:at], _SUM, *args[at + 1:])
    else:
        kwargs = {**kwargs, "reduction": _SUM}
    total, weight = _own_dispatch(op_call, args, kwargs)
    whole = [Replicate()] * total.device_mesh.ndim
    total, weight = total.redistribute(total.device_mesh, whole), weight.redistribute(weight.device_mesh, whole)
    return total / weight, weight


def install_mean_as_sum_handler(op: torch._ops.OpOverload, owner: Any = None) -> bool:
    """``mean_as_sum_handler`` for an op of ``MEANS_AS_SUMS`` whose DTensor rule register()
    replaced, where DTensor has no handler of its own (loss_parallel puts its own in place
    for the time of its context); whether it was put (by ``owner``)."""
    return catalog.op_name(op) in MEANS_AS_SUMS and _put_handler(op, mean_as_sum_handler, owner)


def _out_of_place_twin(op: torch._ops.OpOverload):
    """``tril`` for ``tril_``: the out-of-place overload of an in-place ATen op of the same
    arguments, or None."""
    name = op._schema.name.split("::")[-1]
    packet = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") and not name.startswith("_") else None
    if packet is None:
        return None
    arguments = [(a.name, str(a.type)) for a in op._schema.arguments]
    # the overload of the same name first: floor_divide_.Tensor's twin is floor_divide.default
    for overload in sorted(packet.overloads(), key=lambda o: o != op._overloadname):
        twin = getattr(packet, overload)
        if [(a.name, str(a.type)) for a in twin._schema.arguments] == arguments:
            return twin
    return None


def _in_place_by_twin(op_call, twin, args: tuple, kwargs: dict, refused: Exception):
    """An in-place op DTensor has no strategy for (no rule, and its decomposition path finds
    none: ``tril_``, which ``householder_product``'s backward calls) as its out-of-place
    twin, whose rule DTensor has, written into self at self's placement. Refused as
    DTensor refused it where the twin's result is not self's shape and dtype (in place, a
    promotion or a broadcast would fail), or would have to become a Partial self."""
    from torch.distributed.tensor import Partial

    self = args[0]
    out = _own_dispatch(twin, args, kwargs)
    if out.shape != self.shape or out.dtype != self.dtype or (
            out.placements != self.placements and any(isinstance(p, Partial) for p in self.placements)):
        raise refused  # (DTensor moves nothing into a Partial placement)
    with torch.no_grad():
        self._local_tensor.copy_(out.redistribute(out.device_mesh, self.placements)._local_tensor)
    return self


def _dense_copy(x, placements):
    """``x`` redistributed to ``placements``, its local tensor contiguous: a redistributed
    shard can be a strided view of a padded buffer, and torch 2.13's CPU ``_fused_adam_``
    computes wrong values into a non-contiguous ``exp_avg``, without an error (DTensor's
    ``contiguous()`` looks at the global strides and keeps the view)."""
    DTensor = _dtensor()[0]
    moved = x.redistribute(x.device_mesh, placements)
    local = moved._local_tensor
    if local.is_contiguous():
        return moved
    return DTensor.from_local(local.contiguous(), moved.device_mesh, moved.placements, run_check=False,
                              shape=moved.shape, stride=moved.stride())


def install_write_back_handler(op: torch._ops.OpOverload, owner: Any = None) -> bool:
    """``write_back_handler`` for an op whose DTensor rule ``register()`` guards for the
    tensors it writes, where DTensor has no handler of its own and none is installed
    already; whether it was put (by ``owner``)."""
    return _put_handler(op, write_back_handler, owner)


def install_keyword_handler(op: torch._ops.OpOverload, owner: Any = None) -> bool:
    """``keyword_handler`` for an op ``register()`` installed strategies for that takes
    keyword-only tensors, where DTensor has no handler of its own and none is installed
    already; whether it was put (by ``owner``, the report ``uninstall`` takes it back for)."""
    if op._schema.is_mutable or not any(a.kwarg_only and "Tensor" in str(a.type) for a in op._schema.arguments):
        return False
    return _put_handler(op, keyword_handler, owner)


def per_rank(local: torch.Tensor) -> torch.Tensor:
    """Under LocalTensorMode a replicated local is one plain tensor standing for every
    rank, which collectives treat as a constant and random ops draw from the process's
    generator, not the ranks' own, and an in-place op with a per-rank argument writes once
    per rank; a Partial value, a random op's input, or a tensor written in place needs one
    per rank."""
    try:
        from torch.distributed._local_tensor import LocalTensor, enabled_local_tensor_mode
    except ImportError:
        return local
    mode = enabled_local_tensor_mode()
    if mode is None or isinstance(local, LocalTensor):
        return local
    return LocalTensor({r: local.clone() for r in sorted(mode.ranks)})


def drawn_whole(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict, placements: list, mesh):
    """A random op run on whole tensors on every rank, each rank keeping its shard of the
    outputs (``placements``: each tensor output's, in order). Each rank drawing its own shard
    would draw the same values on every shard (ranks seed alike, and the CPU generator has
    no per-shard offsets, as DTensor's CUDA RNG tracker has): a dropout mask repeating
    across shards. Drawn whole, it is the mask one device draws. A fill reads only its
    input's shape; other random ops (``native_dropout``, ``bernoulli`` of a tensor of
    probabilities) gather their inputs, one per simulated rank under LocalTensorMode, whose
    ranks draw from generator states of their own."""
    from torch.distributed.tensor import distribute_tensor
    from torch.utils._pytree import tree_map

    from .random_ops import is_fill

    DTensor = _dtensor()[0]

    def whole(x):
        if not isinstance(x, DTensor):
            return x
        return torch.empty(x.shape, dtype=x.dtype, device=x.device) if is_fill(op_call) else per_rank(x.full_tensor())

    out = op_call(*tree_map(whole, args), **tree_map(whole, kwargs))
    it = iter(placements)
    return tree_map(lambda x: distribute_tensor(x, mesh, next(it), src_data_rank=None)
                    if isinstance(x, torch.Tensor) else x, out)


def drawing_handler(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """DTensor's dispatch for a random op ``register()`` installed strategies for (a
    functional one: ``register()`` leaves ops that write an input to DTensor), drawn whole
    (``drawn_whole``) at the output placements DTensor's propagation picks from those
    strategies; DTensor's own dispatch where the call draws nothing (dropout with p = 0)."""
    from .random_ops import draws

    if not draws(op_call, args, kwargs):
        return keyword_handler(op_call, args, kwargs)
    return _drawn_as_placed(op_call, args, kwargs)


def _drawn_as_placed(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """``drawn_whole`` at the output placements DTensor's propagation picks for the call."""
    from torch.utils._pytree import tree_flatten

    d = _dtensor()[0]._op_dispatcher
    info = d.unwrap_to_op_info(op_call, args, kwargs)
    d.sharding_propagator.propagate(info)
    placements = [s.placements for s in tree_flatten(info.output_sharding.output_spec)[0] if s is not None]
    return drawn_whole(op_call, args, kwargs, placements, info.compute_mesh)


def cpu_drawing_handler(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """DTensor's own random op (``DRAWN_ON_CPU``) on a CPU mesh, drawn whole on every rank at
    the placements DTensor's rule gives, each rank keeping its shard (an in-place one written
    into self): the values one device draws from the same generator state. Elsewhere (a
    cuda-like mesh, whose RNG tracker offsets each shard's draws; a Partial tensor; a call
    that draws nothing) DTensor's own dispatch."""
    from torch.distributed.tensor import Partial
    from torch.utils._pytree import tree_leaves

    from .random_ops import draws

    DTensor = _dtensor()[0]
    tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, DTensor)]
    if (not tensors or tensors[0].device_mesh.device_type != "cpu" or not draws(op_call, args, kwargs)
            or any(isinstance(p, Partial) for x in tensors for p in x.placements)):
        return _own_dispatch(op_call, args, kwargs)
    out = _drawn_as_placed(op_call, args, kwargs)
    if not in_place(op_call):
        return out
    self = args[0]
    with torch.no_grad():
        self._local_tensor.copy_(out.redistribute(out.device_mesh, self.placements)._local_tensor)
    return self


def install_drawing_handler(op: torch._ops.OpOverload, owner: Any = None) -> bool:
    """``drawing_handler`` for a random op ``register()`` installed strategies for, where
    DTensor has no handler of its own and none is installed already; whether it was put
    (by ``owner``)."""
    return _put_handler(op, drawing_handler, owner)


def _put_handler(op: torch._ops.OpOverload, handler, owner: Any) -> bool:
    """``handler`` as DTensor's custom handler for ``op``, where DTensor has none of its own
    and none is installed already; whether it was put (by ``owner``)."""
    handlers = _dtensor()[0]._op_dispatcher._custom_op_handlers
    if op in _INSTALLED or op in handlers:
        return False
    _INSTALLED[op] = ("handler", None, owner)
    handlers[op] = handler
    return True


_INSTALLED: dict = {}  # op -> (where: "handler" or "strategy", what was there before, the report that put it)


def install(names=None, has_rule=None, owner: Any = None) -> list[str]:
    """Install the handlers (of ``names`` only, when given) not installed already; return
    the ops this call installed, for ``owner`` (the report ``uninstall`` takes them back
    for). ``has_rule(op)``: whether DTensor has a rule of its own, which a replicated
    handler never shadows."""
    DTensor = _dtensor()[0]
    dispatcher = DTensor._op_dispatcher
    handlers, p = dispatcher._custom_op_handlers, dispatcher.sharding_propagator
    done = []
    for name in sorted(set(REPLICATED) | set(REPLICATE_ONLY) | set(EXTENDED) | set(INPLACE_VIEWS) | set(DRAWN_ON_CPU)):
        op = catalog.overload_named(name)
        if op is None or names is not None and name not in names:
            continue
        if op in _INSTALLED:
            continue
        if name in REPLICATED:
            if op in handlers or (has_rule is not None and has_rule(op)):
                continue  # DTensor runs it its own way here
            _INSTALLED[op] = ("handler", None, owner)
            handlers[op] = replicated_handler
        elif name in REPLICATE_ONLY:
            if has_rule is not None and has_rule(op):
                continue
            from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

            _INSTALLED[op] = ("strategy", None, owner)
            kwarg_names = [a.name for a in op._schema.arguments if a.kwarg_only] or None
            p.register_op_strategy(op, _replicated_strategy(op), RuntimeSchemaInfo(0, kwarg_names, needs_pytree=True))
        elif name in DRAWN_ON_CPU:
            if op in handlers:
                continue  # DTensor runs it its own way here
            _INSTALLED[op] = ("handler", None, owner)
            handlers[op] = cpu_drawing_handler
        elif name in INPLACE_VIEWS:
            if has_rule is not None and has_rule(op):
                continue
            from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
            from torch.distributed.tensor._ops._view_ops import register_op_strategy_map

            _INSTALLED[op] = ("strategy", None, owner)
            register_op_strategy_map(op, getattr(torch, INPLACE_VIEWS[name]), schema_info=RuntimeSchemaInfo(1),
                                     strict_view=True)
        elif name == "aten.logsumexp.default":
            own = p.op_strategy_funcs.get(op)
            if own is None:
                continue  # another DTensor: its rule is not the one extended here
            _INSTALLED[op] = ("strategy", own, owner)
            p.op_strategy_funcs[op] = _logsumexp_strategy(own)
        elif name == "aten.as_strided.default":
            own = handlers.get(op)
            if own is None:
                continue
            _INSTALLED[op] = ("handler", own, owner)
            handlers[op] = _as_strided_handler(own)
        done.append(name)
    return done


def uninstall(names, owner: Any = None) -> None:
    """Give DTensor back what it had for ``names``: those ``owner`` installed (any, if None)."""
    DTensor = _dtensor()[0]
    dispatcher = DTensor._op_dispatcher
    for name in names:
        op = catalog.overload_named(name)
        if op not in _INSTALLED or owner is not None and _INSTALLED[op][2] is not owner:
            continue
        where, before, _ = _INSTALLED.pop(op)
        p = dispatcher.sharding_propagator
        table = dispatcher._custom_op_handlers if where == "handler" else p.op_strategy_funcs
        if before is None:
            table.pop(op, None)
            if where == "strategy":
                p.op_to_schema_info.pop(op, None)
        else:
            table[op] = before


__all__ = ["EXTENDED", "INPLACE_VIEWS", "REPLICATED", "REPLICATE_ONLY", "KeywordPlacementRefused", "WritesMoved",
           "DRAWN_ON_CPU", "cpu_drawing_handler", "drawing_handler", "drawn_whole", "install",
           "install_drawing_handler", "install_keyword_handler", "in_place", "install_write_back_handler",
           "keyword_handler", "MEANS_AS_SUMS", "mean_as_sum_handler", "install_mean_as_sum_handler", "replicated_handler",
           "uninstall", "write_back_handler"]
