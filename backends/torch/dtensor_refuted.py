"""DTensor's own rules refuted on real DTensor: where, and why.

``REFUTED`` says, per op, why DTensor 2.13's rule is not to be trusted; ``REFUTED_AT``
picks, for an op refuted at some calls only, those calls (from the call's ``DTensorSpec``
arguments); its other calls keep DTensor's rule. ``register()`` (``dtensor_rules``) puts
verified strategies in their place; ``tests/codegen/test_dtensor_register.py`` reproduces
each on plain DTensor.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

from .catalog import op_name


def spec_leaves(args: tuple, kwargs: dict) -> list:
    """The call's DTensorSpecs in DTensor's order: positional arguments flattened (tensor
    lists, optional tensors), then keyword arguments. A strategy places exactly these
    (``expand_to_full_mesh_op_strategy`` counts them); the rule model numbers its tensor
    inputs in the same flattening order."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    return [x for x in tree_leaves((list(args), kwargs)) if isinstance(x, DTensorSpec)]


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
}
# The ops whose DTensor rule is refuted at some of their calls only: (op, args, kwargs) of
# DTensorSpecs -> whether the call is one (``_refuted_at``). Their other calls keep it.
REFUTED_AT: dict = {}


def _refuted_at(names, predicate, reason: str) -> None:
    """Refute DTensor's rule for ``names`` at the calls ``predicate`` picks, beside any calls
    it is refuted at already (whose reason this one joins)."""
    for name in names:
        REFUTED[name] = f"{REFUTED[name]}; also {reason}" if name in REFUTED else reason
        before = REFUTED_AT.get(name)
        REFUTED_AT[name] = predicate if before is None else (
            lambda op, args, kwargs, a=before, b=predicate: a(op, args, kwargs) or b(op, args, kwargs))


def _partial_self(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    return any(p.is_partial() for p in args[0].placements)


_refuted_at(
    ("aten.fill_.Scalar",), _partial_self,
    "a Partial(sum) self stays Partial(sum), so every rank's fill counts once per rank (the decomposition of "
    "1 - x fills an empty_like of x: cosine_embedding_loss with its second input Shard(1))")


def _index_of_other_lengths(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """gather's index shorter (or longer) than self along a dim it does not gather."""
    self, dim, index = args[0], args[1], args[2]
    dim %= max(len(self.shape), 1)
    return any(d != dim and n != m for d, (n, m) in enumerate(zip(index.shape, self.shape)))


_refuted_at(
    ("aten.gather.default",), _index_of_other_lengths,
    "with index cut along a dim it does not gather and shorter there than self, DTensor's rule runs each "
    "rank's index rows against self's first rows (self Replicate) or against its own, longer, shard of "
    "self's rows (self cut alike): wrong values (take_along_dim decomposes into it)")


def argument(op: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str):
    """The value of ``op``'s argument ``name`` at this call: passed, or its default."""
    arguments = op._schema.arguments
    i = next(k for k, a in enumerate(arguments) if a.name == name)
    if i < len(args):
        return args[i]
    return kwargs.get(name, arguments[i].default_value if arguments[i].has_default_value() else None)


def _every_dim_as_an_empty_list(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """``dim=[]`` on a tensor with dims, which ATen reduces whole."""
    dim = argument(op, args, kwargs, "dim")
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
_refuted_at(
    _EMPTY_DIM_REDUCTIONS, _every_dim_as_an_empty_list,
    "with dim=[] (every dim, in ATen) on a cut input, DTensor's rule reduces no dim and keeps the cut: each "
    "rank's own reduction, called one cut result (wrong values with keepdim, an IndexError without; the backward "
    "of norm(p=inf) sums its maxima so)")


def _dim_from_the_end(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """A negative ``dim`` (counted from the last)."""
    dim = argument(op, args, kwargs, "dim")
    return isinstance(dim, int) and dim < 0


# DTensor's rules that check a dim against the input's cut without first counting a
# negative dim from the last: cumsum(x, -1) of a column-cut x scans each rank's columns on
# their own, and calls the result cut (scan_strategy); argmax(x, -2) of a row-cut x fails.
_SCANS = ("aten.cumprod.default", "aten.cumsum.default", "aten.logcumsumexp.default")
_ARG_REDUCTIONS = ("aten.argmax.default", "aten.argmin.default")
_refuted_at(
    _SCANS, _dim_from_the_end,
    "with a negative dim (cumsum(x, -1)) along the input's cut, DTensor's rule keeps the cut: each rank scans "
    "its own slice from its start, called one cut result (wrong values)")
_refuted_at(
    _ARG_REDUCTIONS, _dim_from_the_end,
    "with a negative dim other than -1 (argmax(x, -2)) along the input's cut, DTensor's rule gives a strategy "
    "its own dispatch cannot run (a view of the wrong size)")
# The gradients of select and slice (narrow) put the gradient back into the input's sizes.
# DTensor's rules for them compare or shift cut dims against the dim without first counting
# a negative dim from the last.
_refuted_at(
    ("aten.select_backward.default",), _dim_from_the_end,
    "with a negative dim (the gradient of select(x, -1, i)), DTensor's rule moves every cut of the gradient one "
    "dim on, cuts before the selected dim included: the gradient of x cut along dim 0 is called cut along dim 1, "
    "and its shards fail or, where they broadcast, are wrong (x of shape (4, 8), cut along its rows)")
_refuted_at(
    ("aten.slice_backward.default",), _dim_from_the_end,
    "with a negative dim (the gradient of narrow(x, -1, 2, 4)) and the gradient cut along it, DTensor's rule "
    "keeps the cut, so each rank pads its own columns as if they were the whole slice (wrong values, silently: "
    "the gradient of x in narrow(x, -1, 2, 4) @ w with w cut along its rows)")


def _keepdim_by_position(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """keepdim=True among the positional arguments, where the dispatcher passes it."""
    i = next(k for k, a in enumerate(op._schema.arguments) if a.name == "keepdim")
    return i < len(args) and bool(args[i])


_refuted_at(
    ("aten.logsumexp.default",), _keepdim_by_position,
    "with keepdim=True, which DTensor's rule reads from the keyword arguments only, it drops the reduced dims "
    "from the output's placements: a cut after a reduced dim moves one dim down (logsumexp(x, 0, keepdim=True) "
    "of a column-cut x is called row-cut; its full tensor has the wrong shape, silently)")
# DTensor's rule for these cuts dims 0 and 1 as batch and channel; an unbatched input
# (channels first, no batch dim) has its first spatial dim there, whose windows or flat
# indices do not split with the cut.
_SPATIAL_DIMS = {"aten._adaptive_avg_pool2d_backward.default": 2, "aten.max_unpool2d.default": 2,
                 "aten.max_unpool3d.default": 3}


def _unbatched(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """An input of the op's spatial dims and a channel dim only, no batch dim."""
    return len(argument(op, args, kwargs, "self").shape) == _SPATIAL_DIMS[op_name(op)] + 1


_refuted_at(
    _SPATIAL_DIMS, _unbatched,
    "on an unbatched input (channels, then the spatial dims), DTensor's rule cuts dim 1 as if it were the "
    "channels: the first spatial dim, whose pooling windows (or flat indices) do not split with the cut (the "
    "gradient of adaptive_avg_pool2d of a (8, 16, 8) input to (7, 7), cut along dim 1, is wrong; max_unpool fails)")


# DTensor's rules for these do not read an argument that changes what the op sums: the
# count of each index (scale_grad_by_freq) or of the targets not ignored, weighted (the
# mean of nll_loss, which the Partial(avg) of each rank's own mean is not).
def _scaled_by_frequency(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    return bool(argument(op, args, kwargs, "scale_grad_by_freq"))


def _a_mean(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    return argument(op, args, kwargs, "reduction") == 1  # at::Reduction::Mean


_refuted_at(
    ("aten.embedding_dense_backward.default",), _scaled_by_frequency,
    "with scale_grad_by_freq=True and the indices cut, DTensor's rule sums the ranks' gradients (Partial(sum)) "
    "while each rank scales its rows by the counts of its own indices, not of all of them (wrong values, "
    "silently: the gradient of an nn.Embedding(scale_grad_by_freq=True) on a batch-cut input)")
_refuted_at(
    ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default"), _a_mean,
    "with reduction='mean' and the batch cut, DTensor's rule calls the loss Partial(avg): the mean of the ranks' "
    "means, each divided by its own weight of targets not ignored, which differs from rank to rank as soon as a "
    "target is ignored (ignore_index, -100 by default) or the classes are weighted (wrong values, silently: "
    "cross_entropy with padded targets)")


def _partial_ops(args: tuple, kwargs: dict) -> set:
    """The reduce ops of the call's Partial inputs ('sum', 'max', ...)."""
    return {p.reduce_op for s in spec_leaves(args, kwargs) for p in s.placements if p.is_partial()}


def _infinite_order(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    order = argument(op, args, kwargs, "ord" if op_name(op) == "aten.linalg_vector_norm.default" else "p")
    return isinstance(order, (int, float)) and abs(order) == float("inf")


def _norm_partial(args: tuple, kwargs: dict) -> bool:
    """A Partial input that is a p-norm's pending reduction (p not 1): x^p summed, then the
    p-th root, whose reduce_op still reads 'sum'."""
    return any(p.is_partial() and getattr(p, "norm_type", 1) != 1
               for s in spec_leaves(args, kwargs) for p in s.placements)


def _recast(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """A cast to another integral dtype, which may wrap."""
    dtype = argument(op, args, kwargs, "dtype")
    return dtype is not None and dtype != args[0].tensor_meta.dtype and not (dtype.is_floating_point
                                                                             or dtype.is_complex)


def _integral_dtype(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    dtype = argument(op, args, kwargs, "dtype")
    return dtype is not None and not (dtype.is_floating_point or dtype.is_complex)


# DTensor's rules that pass a Partial input through where the op is not linear in it (for a
# Partial(sum)) or not non-decreasing (for a Partial(max) or (min)) at the call's arguments:
# each rank's part is transformed on its own and the results reduced, which is no transform
# of the reduced value.
_refuted_at(
    ("aten.linalg__powsum.default",), lambda op, args, kwargs: bool(_partial_ops(args, kwargs)),
    "with a Partial input, DTensor's rule keeps it Partial(sum) though sum(|x|^p) of the ranks' parts is no "
    "sum(|x|^p) of their sum (_powsum(x, 2) of a Partial(sum) x of [1, 1] split [2, -1] and [-1, 2]: 10, not 2)")
_refuted_at(
    ("aten.linalg_vector_norm.default", "aten.norm.Scalar"),
    lambda op, args, kwargs: _infinite_order(op, args, kwargs) and bool(_partial_ops(args, kwargs) & {"max", "min"}),
    "with ord inf (or -inf) and a Partial(max) (or (min)) input, DTensor's rule reduces the ranks' max |x| by "
    "max, which is no |max x| (a rank's -10 beside another's 1: 10, not 1)")
_refuted_at(
    ("aten.sum.default", "aten.sum.dim_IntList"),
    lambda op, args, kwargs: _integral_dtype(op, args, kwargs) and bool(_partial_ops(args, kwargs)),
    "with an integral dtype= and a Partial(sum) input, each rank truncates its own part before the sum")
_refuted_at(
    ("aten.sum.default", "aten.sum.dim_IntList"), lambda op, args, kwargs: _norm_partial(args, kwargs),
    "with a p-norm's pending Partial input (p not 1: vector_norm(x, 2, dim=0) of a row-cut x, then .sum()), "
    "DTensor's rule reads its reduce_op 'sum' and keeps it, though the norm's root is taken after the sum: the "
    "root of the summed norms' powers, not the sum of the norms")
_refuted_at(
    ("aten._fft_r2c.default", "aten._fft_c2c.default"),
    lambda op, args, kwargs: bool(_partial_ops(args, kwargs) & {"max", "min"}),
    "with a Partial(max) (or (min)) input, DTensor's rule keeps it Partial: the transform is linear, not "
    "order-kept, so the ranks' transforms' max is no transform of the max")
_refuted_at(
    ("aten._to_copy.default",),
    lambda op, args, kwargs: _recast(op, args, kwargs) and bool(_partial_ops(args, kwargs) & {"max", "min"}),
    "with a Partial(max) (or (min)) input cast to another integral dtype, DTensor's rule keeps it Partial, "
    "though a narrowing cast wraps (121 and -118 of int64 as int8: max 121, not the max's -118)")
_refuted_at(
    ("aten.view.dtype",), lambda op, args, kwargs: args[1] != args[0].tensor_meta.dtype
    and bool(_partial_ops(args, kwargs)),
    "with a Partial input viewed as another dtype, DTensor's rule keeps it Partial: the ranks' bit patterns "
    "summed (or their max) are no bit pattern of the sum")
_refuted_at(
    ("aten.neg.default",), lambda op, args, kwargs: not (args[0].tensor_meta.dtype.is_floating_point
                                                        or args[0].tensor_meta.dtype.is_complex)
    and bool(_partial_ops(args, kwargs) & {"max", "min"}),
    "with an integral Partial(max) (or (min)) input, DTensor's rule turns it to Partial(min) (or (max)), "
    "though integer negation wraps (an unsigned 3 negates to 253)")
_refuted_at(
    ("aten.any.default", "aten.any.dim", "aten.any.dims"), lambda op, args, kwargs: bool(_partial_ops(args, kwargs)),
    "with a Partial(sum) input, DTensor's rule asks each rank whether its own part is nonzero (parts 1 and -1 "
    "of a 0: True)")
_refuted_at(
    ("aten.threshold.default",),
    lambda op, args, kwargs: argument(op, args, kwargs, "value") > argument(op, args, kwargs, "threshold")
    and bool(_partial_ops(args, kwargs) & {"max", "min"}),
    "with value > threshold and a Partial(max) (or (min)) input, DTensor's rule keeps it Partial, though the "
    "op is then not non-decreasing (threshold(x, 0, 5) of parts 1 and -1 of a 1: 5, not 1)")
_refuted_at(
    ("aten.nan_to_num.default",), lambda op, args, kwargs: bool(_partial_ops(args, kwargs) & {"max", "min"}),
    "with a Partial(max) (or (min)) input, DTensor's rule keeps it Partial, though a posinf or neginf below "
    "(or above) the finite values, or a nan beside them, is not order-kept (posinf=-5 of parts inf and 2: 2, "
    "not -5)")


def refuted(op: torch._ops.OpOverload) -> str:
    """Why DTensor's own rule for ``op`` is not to be trusted at any call, or ''. An op
    refuted at some calls only (``REFUTED_AT``) gives '': at such a call DTensor's output
    placements are not the verified rule's, which ``parallelize`` checks node by node."""
    name = op_name(op)
    return "" if name in REFUTED_AT else REFUTED.get(name, "")
