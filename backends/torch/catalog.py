"""The ATen op catalog: every overload by name, and the schema facts the sweep needs.

Names follow ``str(torch.ops.aten.mm.default)``: ``aten.<name>.<overload>``, with
``default`` for the unnamed overload. A user's custom ops (``--kernels``) are named the
same way in their own namespace.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any, Callable, Collection, Iterable

import torch

from metaspmd.signature import ALL_DIMS, arg_items

NAMESPACE = "aten"
# torch's own ops, which change with its version; any other namespace holds a user's ops
TORCH_NAMESPACES = frozenset({NAMESPACE, "prims"})

TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory", "memory_format"})

# Ops whose output values are wholly unspecified (fresh uninitialized memory): their rules
# are verified on shapes and dtypes, the only thing the op defines.
UNSPECIFIED_VALUES = frozenset({
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "_make_dep_token",  # an empty 0-d tensor: a token whose value nothing reads
})
# Ops whose output is partly uninitialized memory (_resize_output keeps old data, quantized
# empties carry scales): their results cannot be compared at all.
UNINITIALIZED = frozenset({
    "_empty_affine_quantized", "_empty_per_channel_affine_quantized", "_resize_output", "_resize_output_",
    "empty_quantized", "_nested_tensor_from_mask_left_aligned",
})
# Ops that leave parts of an output they allocate unwritten (_ctc_loss's log_alpha past each
# target's length), run under torch's deterministic algorithms, which fill new memory with
# NaN: the unwritten parts compare as NaN at the same positions, the written ones by value.
UNWRITTEN_FILLED = frozenset({"_ctc_loss"})
# Ops that restride self to a new size (the argument named here, or its shape): to as many
# elements as self holds they reshape its contiguous data; to any other number the new
# elements are uninitialized memory, or the kept ones a prefix of the storage. Only calls of
# the first kind are explored (RESIZE_REASON for an op with no other).
RESIZING = {"resize": "size", "resize_": "size", "resize_as": "the_template", "resize_as_": "the_template"}
RESIZE_REASON = ("resizes to another number of elements: the new elements are uninitialized memory, the kept ones a "
                 "prefix of the storage")
# Random ops the nondeterministic_seeded tag misses (they take a Generator or draw from it).
RANDOM = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "bernoulli",
    "bernoulli_", "normal", "normal_", "uniform", "uniform_", "cauchy", "cauchy_", "exponential",
    "exponential_", "geometric", "geometric_", "log_normal", "log_normal_", "random", "random_",
    "multinomial", "poisson", "dropout", "dropout_", "feature_dropout", "alpha_dropout",
    "feature_alpha_dropout", "native_dropout", "rrelu", "rrelu_", "rrelu_with_noise", "rrelu_with_noise_",
    "_fused_dropout", "_standard_gamma", "_sample_dirichlet", "binomial",
})
# Ops tagged nondeterministic_seeded that draw nothing: _fused_sdp_choice only names the
# attention kernel its arguments would run (its dropout_p is one of them).
TAGGED_DRAWING_NOTHING = frozenset({"_fused_sdp_choice"})

# Ops that abort the process (native asserts, segfaults) on inputs guessed from the schema,
# found by running every overload's schema-built inputs in a child process; and ops that
# read out of bounds on them without checking shapes (_compute_linear_combination: the
# rules found there rested on whatever memory followed, and changed from sweep to sweep).
# _batch_norm_impl_index_backward, _batch_norm_no_update, _compute_linear_combination and
# _thnn_differentiable_gru_cell_backward left the list: their hand-written samples
# (hand_samples) come before any guess. Their out= forms stay (the first segfaults on the
# outs the runner allocates).
CRASH_ON_GUESSED_INPUTS = frozenset({
    "aten._batch_norm_no_update.out",
    "aten._compute_linear_combination.out", "aten._convert_indices_from_coo_to_csr.default",
    "aten._convert_indices_from_coo_to_csr.out", "aten._convert_indices_from_csr_to_coo.default",
    "aten._convert_indices_from_csr_to_coo.out", "aten._lstm_mps.default",
    "aten._sobol_engine_initialize_state_.default",
    # crash with another signal, or not at all, from run to run (_cholesky_solve_helper on a
    # guessed non-square A), or give other results (weight norm on a g and norms shaped like v)
    "aten._cholesky_solve_helper.out",
    "aten._weight_norm_interface.default", "aten._weight_norm_interface.out",
    "aten._weight_norm_interface_backward.default", "aten._weight_norm_interface_backward.out",
})

# Ops that run on some machines only: swept, their files would depend on the machine that
# swept them (a reviewed registry must not). Left unswept, with the reason.
MACHINE_DEPENDENT = {
    f"aten._nnpack_spatial_convolution.{overload}": "NNPACK's kernel runs on some CPUs only "
    "(torch._nnpack_available()): its rules would depend on the machine sweeping it"
    for overload in ("default", "out")
}

# Ops that crash the process (SIGSEGV) on special-value inputs: a NaN grid sends
# grid_sampler_2d_backward out of bounds. They get no special-value trials.
CRASH_ON_SPECIAL_VALUES = frozenset({
    "aten.grid_sampler_2d_backward.default", "aten.grid_sampler_2d_backward.out",
})


# Ops that answer a question about the tensor object, not about its values, shape or dtype:
# memory layout (a narrowed shard keeps the global strides, a copied one does not), storage,
# conjugate and negative bits, autograd state, device, kernel availability. A shard's answer
# depends on how the shard was made, not on the op, so no sharding rule describes them.
OBJECT_QUERIES = frozenset({
    "stride", "sym_stride", "storage_offset", "sym_storage_offset", "is_contiguous", "sym_is_contiguous",
    "is_non_overlapping_and_dense", "is_strides_like_format", "_debug_has_internal_overlap", "is_set_to",
    "_has_same_storage_numel", "_has_compatible_shallow_copy_type", "is_conj", "is_neg", "_is_zerotensor",
    "_version", "output_nr", "is_leaf", "retains_grad", "is_inference", "is_pinned", "get_device",
    "is_distributed", "cudnn_is_acceptable", "_use_cudnn_rnn_flatten_weight",
})
OBJECT_QUERY_REASON = ("a query of the tensor object (layout, storage, autograd state, device), not of its "
                       "values: the answer on a shard depends on how the shard was made")
# Ops whose answer compares their inputs' shapes: a signature holds shapes as ranks, and
# the samples hold them equal, where every shard agrees (identity); with unequal shapes of
# the same signature only reduce(min) is right. No sample shows that, so no rule is kept.
SHAPE_COMPARISONS = frozenset({"is_same_size"})
SHAPE_COMPARISON_REASON = ("compares the shapes of its inputs, which its samples hold equal: a rule verified there "
                           "would not cover unequal shapes of the same signature")
# oneDNN's recurrent layer hands its backward an opaque workspace (bytes laid out for the
# whole call's sizes) among its results: a shard's workspace is no piece of the whole one,
# and the backward, given tensors cut unlike its workspace, corrupts the heap. lstm runs
# it on CPU in float32, and has rules of its own.
OPAQUE_WORKSPACE = frozenset({"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"})
OPAQUE_WORKSPACE_REASON = ("oneDNN's recurrent layer and its backward pass an opaque workspace laid out for the "
                           "whole call's sizes: a shard's is no piece of it, so no combine of it can be checked")
# functorch's wrapping of a tensor as one vmap level's batch: its output is a BatchedTensor,
# which no op outside that level reads (comparing it raises "Batching rule not implemented")
VMAP_WRAPPERS = frozenset({"_add_batch_dim"})
VMAP_WRAPPER_REASON = ("returns a functorch BatchedTensor, vmap's wrapper of one level, whose values no op outside "
                       "that level reads: no combine of it can be checked")
# Ops that treat values apart that random floats never hold, so their cases verify on
# special values too: equal elements (unique_consecutive merges equal neighbours), and
# NaN, which the NaN-skipping ops skip (the mean of shards' nanmeans is the global one
# only where every shard holds as many NaN) or replace (nan_to_num is not linear there).
# The latter plant NaN alone among the data, since a planted inf would decide the output.
TIE_SENSITIVE = frozenset({"unique_consecutive", "unique_dim_consecutive"})
NAN_SKIPPING = frozenset({"nanmean", "nansum", "nanmedian", "nanquantile", "nan_to_num", "nan_to_num_", "fmax", "fmin"})
# and ops that exist to catch NaN and inf: AMP's check sets found_inf to 1 on every shard
# that holds one, so a Partial(sum) found_inf, true on finite data, adds up to the shard count
NONFINITE_CHECKING = frozenset({
    "_amp_foreach_non_finite_check_and_unscale", "_amp_foreach_non_finite_check_and_unscale_",
    "_amp_update_scale", "_amp_update_scale_",
})
# and histograms, whose random samples land no point in a bin of every dim: empty on every
# trial, they passed any combine (Partial edges as identity); ascending ramps fill them
BINNING = frozenset({"histogramdd", "_histogramdd_from_bin_tensors", "_histogramdd_from_bin_cts", "histogram"})
# and rank queries: random matrices have full rank, on every shard as on the whole, so
# they passed combines that rank deficiency breaks (a sum of the ranks of row blocks, the
# rank of a Partial summand); matrices of chosen low ranks refute them
RANK_QUERIES = frozenset({"linalg_matrix_rank", "matrix_rank"})
# and ops that act only where a norm passes a bound they take: random slices of a small
# stand-in stay under renorm's maxnorm, so a cut across the normed slices passed; the
# special values plant the bound itself
VALUE_BOUNDED = frozenset({"renorm", "renorm_", "embedding_renorm", "embedding_renorm_"})
SPECIAL_VALUE_SENSITIVE = TIE_SENSITIVE | NAN_SKIPPING | NONFINITE_CHECKING | BINNING | RANK_QUERIES | VALUE_BOUNDED

# Return types the explorer takes as 0-d tensors: a scalar return (numel, item, equal) has
# sharding rules like a tensor's (numel of a row shard sums to the global numel). 'number'
# is a Scalar return (item's): int, float, bool or complex, as the call gives it.
SCALAR_RETURNS = frozenset({"int", "SymInt", "float", "SymFloat", "bool", "SymBool", "number"})


@functools.lru_cache(maxsize=1)
def all_overloads() -> tuple[str, ...]:
    """Every registered aten overload, sorted."""
    return overloads_in((NAMESPACE,))


def overloads_in(namespaces: Collection[str]) -> tuple[str, ...]:
    """Every overload registered in these namespaces ('ns.op.overload'), sorted."""
    names = set()
    for full in torch._C._dispatch_get_all_op_names():
        ns, sep, rest = full.partition("::")
        if ns not in namespaces or not sep:
            continue
        base, _, overload = rest.partition(".")
        names.add(f"{ns}.{base}.{overload or 'default'}")
    return tuple(sorted(names))


def schema_problem(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str:
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


def custom_op_namespaces(module_name: str, registered_by_import: Collection[str] = ()) -> frozenset[str]:
    """The namespaces of the ops a user's module defines: its ``torch.library.custom_op``
    functions and ``Library`` objects, and those of ``registered_by_import`` (dispatcher
    names, 'ns::op', that appeared while it was imported). Never aten: a module that adds
    kernels to ATen ops adds no ops."""
    found = set()
    for value in vars(sys.modules[module_name]).values():
        if isinstance(value, torch._library.custom_ops.CustomOpDef):
            found.add(value._namespace)
        elif isinstance(value, torch.library.Library):
            found.add(value.ns)
    found |= {name.partition("::")[0] for name in registered_by_import}
    return frozenset(found - {NAMESPACE})


def split_name(name: str) -> tuple[str, str]:
    """'aten.add.Tensor' -> ('add', 'Tensor')."""
    ns, base, overload = name.split(".")
    if ns != NAMESPACE:
        raise KeyError(f"not an aten op: {name}")
    return base, overload


def resolve(name: str) -> torch._ops.OpOverload:
    """The OpOverload for a catalog name ('aten.mm.default', or a custom op's
    'mylib.rms_norm.default'); KeyError when it does not exist."""
    parts = name.split(".")
    if len(parts) != 3:
        raise KeyError(f"not an op name (namespace.op.overload): {name}")
    ns, base, overload = parts
    try:
        return getattr(getattr(getattr(torch.ops, ns), base), overload)
    except (AttributeError, RuntimeError) as e:
        raise KeyError(f"unknown op {name}") from e


def op_name(func: torch._ops.OpOverload) -> str:
    """``aten.mm.default``; an op of another namespace keeps it (``mylib.rms_norm.default``)."""
    return str(func)


def overload_named(name: str) -> torch._ops.OpOverload | None:
    """The overload ``op_name`` names (``aten.mm.default``), or None where this torch has
    none of that name (a misspelling, a name without its overload)."""
    parts = name.split(".", 2) if isinstance(name, str) else ()
    if len(parts) != 3 or not all(parts):
        return None
    namespace, family, overload = parts
    packet = getattr(getattr(torch.ops, namespace, None), family, None)
    found = getattr(packet, overload, None) if packet is not None else None
    return found if isinstance(found, torch._ops.OpOverload) else None


def aten_base(func: torch._ops.OpOverload) -> str:
    """The base name of an ATen op (``mm`` of ``aten::mm.out``), which the catalog's sets
    name; '' for an op of another namespace (a user's custom op that shares a name with
    an ATen op is not that op)."""
    namespace, _, base = func._schema.name.partition("::")
    return base if namespace == NAMESPACE else ""


def positional_names(func: torch._ops.OpOverload) -> tuple[str, ...]:
    """Schema names of the positional arguments (what OpCase.arg_names holds)."""
    return tuple(a.name for a in func._schema.arguments if not a.kwarg_only)


# ops whose dims map by their sizes (a view of [2, 3, 4] as [6, 4] merges dims 0 and 1; of
# [4, 3, 2], it cannot): every size of theirs keys their rules
RESHAPES = frozenset({"view", "_unsafe_view", "reshape", "_reshape_copy", "view_as", "reshape_as", *RESIZING})


def is_reshape(func: torch._ops.OpOverload) -> bool:
    """A reshape (or its ``_copy`` form), not a reinterpretation of the dtype (``view.dtype``)."""
    base = aten_base(func)
    return (base in RESHAPES or base.removesuffix("_copy") in RESHAPES) and not func._overloadname.startswith("dtype")


# Dims a kernel reads by an int argument without checking them: pinned, so the explorer
# does not lengthen them into calls the op is not defined for. _dyn_quant_matmul_4bit reads
# inp's rows in_features wide (a wider inp was read askew, row r from r * in_features).
# And dims whose size places an output dim: a signature that left it open keyed a gather of
# one output dim by calls where it is another.
PINNED_DIMS = {"_dyn_quant_matmul_4bit": {"inp": slice(-1, None)},
               # the output's rank is indices' length plus values' dense dims
               "sparse_coo_tensor": {"indices": slice(0, 1)}}


def exact_sizes(func: torch._ops.OpOverload) -> dict[str, slice]:
    """The argument dims whose sizes key the op's rules (OpCase.exact_sizes): every dim of a
    reshape's; a convolution kernel's extent, which sets its halo: its weight's dims after
    the two channel dims (conv_tbc's weight is [kernel, in, out]); PINNED_DIMS."""
    names = positional_names(func)
    if is_reshape(func):
        return {name: ALL_DIMS for name in names}
    base = aten_base(func)
    if base in PINNED_DIMS:
        return dict(PINNED_DIMS[base])
    if "conv" in base and "weight" in names:
        return {"weight": slice(0, 1) if base.startswith("conv_tbc") else slice(2, None)}
    return {}


def out_arg_names(func: torch._ops.OpOverload) -> tuple[str, ...]:
    """The ``out=``-style arguments (written, keyword-only)."""
    return tuple(a.name for a in func._schema.arguments if a.is_out)


def written_arg_names(func: torch._ops.OpOverload) -> tuple[str, ...]:
    """Arguments the op mutates in place, out arguments excluded."""
    return tuple(
        a.name for a in func._schema.arguments
        if a.alias_info is not None and a.alias_info.is_write and not a.is_out
    )


def unspecified_values(func: torch._ops.OpOverload) -> bool:
    """True when the op defines only its output's shape and dtype (``empty_like``)."""
    return aten_base(func) in UNSPECIFIED_VALUES


def keeps_numel(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Does a call of a RESIZING op keep self's number of elements (a reshape)? True for
    every other op."""
    name = RESIZING.get(aten_base(func))
    if name is None:
        return True
    bound = dict(arg_items(positional_names(func), args, kwargs))
    size = bound[name].shape if name == "the_template" else bound[name]
    return math.prod(size) == bound["self"].numel()


def tagged_random(func: torch._ops.OpOverload) -> bool:
    """Is the op tagged as drawing random numbers (``nondeterministic_seeded``), and does it?"""
    return torch.Tag.nondeterministic_seeded in func.tags and aten_base(func) not in TAGGED_DRAWING_NOTHING


def unwritten_filled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` under torch's deterministic algorithms, whose fill of new memory (NaN) makes
    the parts of an output an op leaves unwritten the same on every run (``UNWRITTEN_FILLED``)."""
    def filled(*args, **kwargs):
        was, fill = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        try:
            return fn(*args, **kwargs)
        finally:
            torch.use_deterministic_algorithms(was, warn_only=warn_only)
            torch.utils.deterministic.fill_uninitialized_memory = fill

    return filled


def nondeterministic_reason(func: torch._ops.OpOverload) -> str | None:
    """Why the op's output cannot be compared across runs, or None."""
    base = aten_base(func)
    if tagged_random(func):
        return "tagged nondeterministic_seeded (random sampling)"
    if base in RANDOM or base.rstrip("_") in RANDOM:
        return "draws random numbers"
    if base in UNINITIALIZED:
        return "output is uninitialized memory"
    if any(str(a.real_type).endswith("Generator") or str(a.real_type) == "Optional[Generator]" for a in func._schema.arguments):
        return "takes a random generator"
    return None


@functools.lru_cache(maxsize=1)
def _overloads_by_base() -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for name in all_overloads():
        out.setdefault(split_name(name)[0], []).append(name)
    return {k: tuple(v) for k, v in out.items()}


def _arg_key(arg) -> tuple[str, str]:
    return arg.name, str(arg.real_type)


def _functional_of_out(func: torch._ops.OpOverload, others: Iterable[torch._ops.OpOverload]) -> torch._ops.OpOverload | None:
    """The first of ``others`` that is the ``out=`` overload ``func``'s functional form: it
    writes nothing and takes ``func``'s arguments but its outs."""
    want = [_arg_key(a) for a in func._schema.arguments if not a.is_out]
    names = {n for n, _ in want}
    for g in others:
        if g is func or out_arg_names(g) or written_arg_names(g):
            continue
        # factory functionals take tensor options that their out overloads lack
        if [_arg_key(a) for a in g._schema.arguments if a.name in names or a.name not in TENSOR_OPTIONS] == want:
            return g
    return None


def overload_functional_sibling(func: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """An ``out=`` overload's functional overload in its own packet (a user's op, which
    ``functional_sibling``'s ATen names do not reach)."""
    packet = func.overloadpacket
    return _functional_of_out(func, (getattr(packet, n) for n in packet.overloads())) if out_arg_names(func) else None


@functools.lru_cache(maxsize=None)
def functional_sibling(name: str) -> str | None:
    """The functional overload an in-place (``foo_``) or ``out=`` overload computes.

    In-place: the overload of the name without the trailing underscore that takes the same
    argument types, the same-named one first (``float_power_.Scalar`` takes a tensor to a
    number's power, as ``float_power.Tensor_Scalar`` does, not ``float_power.Scalar``);
    else the same-named one. Out: the overload of the same name whose arguments are the
    out overload's minus its out args.
    """
    func = resolve(name)
    base, overload = split_name(name)
    if written_arg_names(func) and base.endswith("_") and not base.endswith("__"):
        same = f"{NAMESPACE}.{base[:-1]}.{overload}"
        overloads = _overloads_by_base().get(base[:-1], ())
        types = [str(a.real_type) for a in func._schema.arguments]
        for other in sorted(overloads, key=lambda o: o != same):
            g = resolve(other)
            if not (out_arg_names(g) or written_arg_names(g)) and [str(a.real_type) for a in g._schema.arguments] == types:
                return other
        return same if same in overloads else None
    if not out_arg_names(func):
        return None
    others = {resolve(other): other for other in _overloads_by_base().get(base, ()) if other != name}
    g = _functional_of_out(func, others)
    return None if g is None else others[g]


# Backward ops whose kernels never size one input by another: to_dense_backward and
# to_mkldnn_backward read input for its layout only; rrelu_with_noise_backward is
# noise * grad_output in training (self unread) and an elementwise op, which checks that
# shapes broadcast, otherwise. (convolution_backward does size grad_output by input's
# batch, unchecked: its exact guard, EXACT_GUARDS, replaces the shared one, whose rule
# that tensors of the top rank shrink alike kept its weight whole beside a cut batch.)
SHAPE_SAFE_BACKWARD = frozenset({
    "to_dense_backward", "to_mkldnn_backward", "rrelu_with_noise_backward",
})


# Fused optimizer steps walk every tensor list by the parameters' sizes: a gradient cut
# beside a whole parameter corrupts the heap (SIGABRT).
FUSED_OPTIMIZERS = frozenset({"_fused_adam", "_fused_adamw", "_fused_sgd", "_fused_adagrad"})
# Weight norm walks g by v's size along dim: a v cut there beside a whole g aborts (SIGABRT).
WEIGHT_NORMS = frozenset({"_weight_norm", "_weight_norm_interface"})


def trusts_matching_shapes(func: torch._ops.OpOverload) -> bool:
    """Kernels that size one input by another without checking (backward ops, batch norm,
    fused optimizers, weight norm): inconsistent shards crash them, so their local calls
    are guarded."""
    base = aten_base(func)
    return (("backward" in base and base not in SHAPE_SAFE_BACKWARD) or "batch_norm" in base
            or base.rstrip("_") in FUSED_OPTIMIZERS or base in WEIGHT_NORMS)


def unread_arg_names(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> frozenset[str]:
    """Tensor arguments this call never reads, whatever their shape: batch norm's backward
    kernels read the running statistics in eval mode only (in training, running stats of any
    length, NaN or None give the same gradients) and the saved ones in training only (in
    eval mode they are empty), so the shape guard leaves out the ones the mode skips."""
    base = aten_base(func)
    if "batch_norm" not in base or "backward" not in base:
        return frozenset()
    bound = dict(zip(positional_names(func), args)) | dict(kwargs)
    training = bound.get("update", bound.get("train"))
    if training is True:
        return frozenset({"running_mean", "running_var"})
    if training is False:
        return frozenset(n for n in ("save_mean", "save_invstd", "save_var") if n in bound)
    return frozenset()


# Dims that index tensors address by value: sharding them leaves the indices pointing past
# the local tensor, and these kernels write there unchecked (heap corruption, not an error).
# Local calls that cut them are refused. Names are schema argument names; dims may be negative.
INDEXED_DIMS: dict[str, dict[str, tuple[int, ...]]] = {
    "adaptive_max_pool2d_backward": {"self": (-2, -1)},  # indices: flat positions in the H x W plane
    "adaptive_max_pool3d_backward": {"self": (-3, -2, -1)},
    "nll_loss2d_backward": {"self": (1,), "weight": (0,)},  # target: class numbers
    # targets: class numbers into C; input_lengths: steps of T; log_alpha's last dim: positions
    # in the blank-padded targets; the batch is sized by the lengths lists, which a cut leaves
    # whole: every dim is addressed (cuts segfault)
    "_ctc_loss_backward": {"grad": (0,), "log_probs": (0, 1, 2), "targets": (0, 1), "neg_log_likelihood": (0,),
                           "log_alpha": (0, 1, 2)},
    # pivots: row numbers; a cut batch of LD and pivots broadcast against B's whole one segfaults
    "linalg_ldl_solve": {"LD": (-3, -2, -1), "pivots": (-2, -1), "B": (-2,)},
}


# Batched ops whose kernels size every input's batch by one of them: a batch cut in one
# input and not another writes past a buffer (lu_unpack frees a corrupted heap). Per argument,
# its count of trailing non-batch dims; the leading (batch) dims must agree.
BATCH_TIED: dict[str, dict[str, int]] = {
    "lu_unpack": {"LU_data": 2, "LU_pivots": 1},
    # the results are written into values and indices, sized by self: every dim agrees
    "_cummax_helper": {"self": 0, "values": 0, "indices": 0},
    "_cummin_helper": {"self": 0, "values": 0, "indices": 0},
    # batch and heads: a cut in query's and not in key's divides by zero (SIGFPE)
    "_scaled_dot_product_flash_attention_for_cpu": {"query": 2, "key": 2, "value": 2},
}


def batch_tied(func: torch._ops.OpOverload) -> dict[str, int]:
    """Per argument name, its trailing non-batch dims (see BATCH_TIED)."""
    return BATCH_TIED.get(aten_base(func), {})


def reflects(func: torch._ops.OpOverload) -> bool:
    """A reflection pad's backward, whose kernel trusts its padding to be shorter than self
    (a proportional cut of grad_output and self gives shards that are not)."""
    base = aten_base(func)
    return base.startswith("reflection_pad") and base.endswith("_backward")


# Kernels that read inputs by another input's sizes or values, unchecked, each with the
# exact condition its local inputs must meet (backend.EXACT_GUARDS checks it), which
# replaces the shared shape guard where that applies:
# - pairs: pdist's backward reads grad and pdist by the number of pairs of self's rows;
# - pair_grid: cdist's backward reads grad and cdist as x1's rows by x2's rows, and x2 by
#   x1's width (the shared guard kept x1's rows whole beside a cut grad);
# - packed_rows: unpacking a packed sequence reads data's rows by batch_sizes, one step of
#   that many rows per entry, sorted longest first;
# - hidden_states: a recurrent layer walks its hidden states by the layer count and reads
#   c0 by h0's sizes (an h0 with more layers than c0 read past c0: SIGSEGV);
# - conv_output: convolution's backward loops over input's batch, reading grad_output by
#   it, and takes grad_output's channels, a kernel of another extent and channels that do
#   not split into the groups unchecked: grad_output must be the forward's output shape;
# - conv_double_output: its double backward runs convolutions and their backward: gO the
#   forward's output shape, ggI and ggW shaped as self and weight (the shared guard kept the
#   weights whole beside a cut batch);
# - square_factor: _cholesky_solve_helper hands LAPACK self's sizes and reads A by them: A
#   square, as many rows as self, one batch (a cut of A alone corrupted the heap).
EXACT_GUARDS = {
    "_pdist_backward": "pairs", "_cdist_backward": "pair_grid", "_pad_packed_sequence": "packed_rows",
    "convolution_backward": "conv_output", "_convolution_double_backward": "conv_double_output",
    "_cholesky_solve_helper": "square_factor",
    **dict.fromkeys(("lstm", "gru", "rnn_tanh", "rnn_relu"), "hidden_states"),
}


def exact_guard(func: torch._ops.OpOverload) -> str | None:
    """The name of the exact condition on the op's local inputs (see EXACT_GUARDS), or None."""
    return EXACT_GUARDS.get(aten_base(func))


def indexed_dims(func: torch._ops.OpOverload) -> dict[str, tuple[int, ...]]:
    """Per argument name, the dims the op's index inputs address (see INDEXED_DIMS)."""
    return INDEXED_DIMS.get(aten_base(func), {})


# Index inputs whose positions an argument's value tells the op to skip (a label of
# ``ignore_index``: out of the class range, -100 by default, so random labels never hold it,
# and a mean over the kept labels looked like a mean of shard means). The explorer's samples
# hold that value at one position (``sentinel``), as padded batches do. Forward ops only:
# the backward kernels read the count from their total_weight input, and write at their
# labels unchecked, where an offset label (-100 moved by a shard's start) lands out of bounds.
SENTINELS: dict[str, tuple[str, str]] = {
    base: ("target", "ignore_index")
    for base in ("nll_loss", "nll_loss2d", "nll_loss_nd", "nll_loss_forward", "nll_loss2d_forward", "cross_entropy_loss")
}


def sentinel(func: torch._ops.OpOverload) -> tuple[str, str, Any] | None:
    """(index input, argument, the argument's schema default) of an op in ``SENTINELS``."""
    entry = SENTINELS.get(aten_base(func))
    if entry is None:
        return None
    default = next((a.default_value for a in func._schema.arguments if a.name == entry[1]), None)
    return (*entry, default)


def is_core(func: torch._ops.OpOverload) -> bool:
    return torch.Tag.core in func.tags


# Ops whose output's size follows the values of their first tensor, self (OpCase.value_sized),
# by base name: the reason, and the condition on the call's arguments (by schema name) under
# which it does. bincount's weights, split into parts beside a whole self, still sum.
VALUE_SIZED = {
    "bincount": ("the output's length is the largest value plus one (minlength at least), "
                 "which a shard would read from its own values", lambda a: True),
    "one_hot": ("without num_classes the output's last dim is the largest value plus one, "
                "which a shard would read from its own values", lambda a: a.get("num_classes", -1) == -1),
}


# Ops given positions that may repeat, by base name: how many trailing dims of self and of
# its indices (its first two tensors) they place into. max_unpool's indices come from a
# pooling whose windows may overlap, so one position may stand in two rows of indices: two
# shards would both write it, and a sum of their outputs count it twice (OpCase.uncut_dims).
REPEATED_POSITIONS = {"max_unpool2d": 2, "max_unpool3d": 3}


def uncut_dims(func: torch._ops.OpOverload, args: tuple) -> frozenset[tuple[int, int]]:
    """REPEATED_POSITIONS as (tensor leaf, dim) pairs of this call."""
    k = REPEATED_POSITIONS.get(aten_base(func))
    if k is None or not args or not isinstance(args[0], torch.Tensor):
        return frozenset()
    rank = args[0].dim()
    return frozenset((leaf, d) for leaf in (0, 1) for d in range(rank - k, rank))


def value_sized_reason(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str:
    """VALUE_SIZED's reason where this call's output size follows its values, else ''."""
    found = VALUE_SIZED.get(aten_base(func))
    if found is None:
        return ""
    given = dict(zip(positional_names(func), args)) | dict(kwargs)
    return found[0] if found[1](given) else ""


def no_rule_reason(func: torch._ops.OpOverload) -> str | None:
    """Why no sharding rule can describe the op (a query of the tensor object, a comparison
    of shapes its samples hold equal, an opaque workspace), or None."""
    base = aten_base(func)
    if base in OBJECT_QUERIES:
        return OBJECT_QUERY_REASON
    if base in SHAPE_COMPARISONS:
        return SHAPE_COMPARISON_REASON
    if base in OPAQUE_WORKSPACE:
        return OPAQUE_WORKSPACE_REASON
    if base in VMAP_WRAPPERS:
        return VMAP_WRAPPER_REASON
    return None


# A kernel at any of these keys runs on dense CPU tensors instead of the composite one.
_CPU_KERNEL_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


@functools.lru_cache(maxsize=1)
def aten_overloads() -> tuple[torch._ops.OpOverload, ...]:
    """Every aten overload that resolves, as an OpOverload."""
    found = []
    for name in all_overloads():
        try:
            found.append(resolve(name))
        except KeyError:
            continue
    return tuple(found)


@functools.lru_cache(maxsize=1)
def composite_implicit_overloads() -> tuple[torch._ops.OpOverload, ...]:
    """The aten overloads that run on CPU tensors by their CompositeImplicitAutograd kernel:
    they decompose above the Python dispatch key, so a dispatch mode sees only the ops they
    call, never them. Not those with a CPU kernel as well (``silu_backward``: the composite
    kernel serves other backends)."""
    found = []
    for func in aten_overloads():
        has = functools.partial(torch._C._dispatch_has_kernel_for_dispatch_key, func.name())
        if has("CompositeImplicitAutograd") and not any(map(has, _CPU_KERNEL_KEYS)):
            found.append(func)
    return tuple(found)


def returns_scalars(func: torch._ops.OpOverload) -> bool:
    """Every return is a Python number (int, float, bool, or a Scalar: ``item``)."""
    returns = func._schema.returns
    return bool(returns) and all(str(r.type) in SCALAR_RETURNS for r in returns)


__all__ = [
    "CRASH_ON_GUESSED_INPUTS", "CRASH_ON_SPECIAL_VALUES", "MACHINE_DEPENDENT", "NAMESPACE", "UNWRITTEN_FILLED", "all_overloads",
    "aten_overloads", "composite_implicit_overloads", "custom_op_namespaces", "functional_sibling", "is_core",
    "keeps_numel", "overloads_in", "nondeterministic_reason", "op_name", "tagged_random", "unwritten_filled",
    "out_arg_names", "positional_names", "exact_guard", "resolve", "split_name", "trusts_matching_shapes",
    "written_arg_names", "batch_tied", "reflects", "no_rule_reason", "returns_scalars", "value_sized_reason",
    "uncut_dims",
]
