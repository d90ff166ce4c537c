#!/usr/bin/env python
"""PyTorch's own DTensor OpInfo test on the ops it marks failing: plain DTensor against
``register()``.

    python benchmarks/dtensor_opinfo_bench.py                 # all 217 entries, first sample each
    python benchmarks/dtensor_opinfo_bench.py --ops 'nn.functional.conv*' --samples 3
    python benchmarks/dtensor_opinfo_bench.py --all --uneven --mesh 2x2 --only-failing

The ops are the two lists of ``test/distributed/tensor/test_dtensor_ops.py`` (a 2026
revision): ``dtensor_fails`` (xfail and skip) and ``dtensor_fails_no_strategy``. Each
OpInfo that takes float32 on the CPU is run as that test's ``TestLocalDTensorOps`` runs
it: sizes L, M, S, XS set to 24, 12, 4, 2 so that dims split evenly, a fake process group
of 4 and ``LocalTensorMode``, the OpInfo's samples with ``requires_grad=True``, the
reference computed on the reconciled plain tensors, and every combination that torch's
``DTensorConverter`` gives (Replicate, plus Shard(d) for each dim of size > 1 divisible by
4, per tensor input). A combination whose output has no elements is passed over, as there;
the outputs are ``full_tensor()`` and compared, shape, ``requires_grad`` and values, with
``TestCase.assertEqual``, on every simulated rank.

Verdict per op, as the test counts: ``pass`` when every combination compared equal,
otherwise the first failure: ``wrong`` (a comparison failed) or ``error`` (an exception);
``nondet`` for a random or uninitialized output whose shapes all matched (its values are
no answer: the random ops, the empty family, a call in which an ATen op that samples ran
(``_reference``: attention's dropout), any op whose reference differs when run again
with the memory around its inputs and its allocations filled otherwise, ``_probe``);
``-`` when nothing was compared (no sample of the dtype, a sample or reference that fails
without DTensor, or every output empty). A ``wrong``
combination after an earlier error is counted apart (``wrong anywhere``), so a wrong answer
never hides behind an error. The test's own backward step is a no-op on the gathered
outputs; this one checks backward itself: the gradient of the first differentiable
output's sum with respect to each DTensor input, gathered, against the reference
gradient (``bwd`` column, same verdicts).

Three columns, in one process: plain DTensor; after ``register(replace_refuted=False)``
(DTensor's own rules kept, refuted ones included); after ``register()``, whose default also
replaces DTensor's refuted rules by verified ones ("replace").
``regressions``: ops that pass on plain DTensor and not after. Each op runs in a forked
child, so an op that crashes the process counts as an error. An op that still fails in the
last column has its reason (``WHY``) in the note column; the run ends with the list of
failing ops that have none.

Beyond the test: ``--all`` runs every OpInfo of torch's ``op_db``, not only the lists;
``--uneven`` keeps OpInfo's own sizes (L, M, S, XS = 20, 10, 5, 3, which 4 mostly does not
divide) and cuts every dim of size > 1, so shards are unequal or empty, as users' sizes
make them and the test never does; ``--mesh 2x2`` places each input over both dims of a
2 x 2 mesh (Replicate or Shard(d) on each, the same dim twice included). Those two draw at
most ``MAX_COMBINATIONS`` combinations per sample, with a seed fixed by the op's name, and
run float64 samples: in float32 a Partial(sum) strategy, which sums in another order than
one device, misses the test's tolerance (1e-5) by rounding alone (``addbmm``,
``conv_transpose3d``), and a wrong answer is to be told from that.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import logging
import math
import random
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metaspmd.cli import at_most, pipe_safe, positive_int, seconds

WORLD = 4
MESHES = {"4": (4,), "2x2": (2, 2)}
MAX_COMBINATIONS = 64  # per sample, with --uneven or a 2-D mesh (every combination otherwise)

# dtensor_fails of test_dtensor_ops.py: (OpInfo name, variant); xfail then skip.
DTENSOR_FAILS_XFAIL = [
    ("cartesian_prod", ""), ("flatten", ""), ("kron", ""), ("ravel", ""), ("repeat_interleave", ""),
    ("reshape", ""), ("reshape_as", ""), ("take_along_dim", ""), ("unbind", ""), ("unflatten", ""),
    ("view", ""), ("view_as", ""),
    ("arange", ""), ("broadcast_shapes", ""), ("eye", ""), ("full", ""), ("linspace", ""), ("logspace", ""),
    ("ones", ""), ("scalar_tensor", ""), ("signal.windows.bartlett", ""), ("signal.windows.blackman", ""),
    ("signal.windows.cosine", ""), ("signal.windows.exponential", ""), ("signal.windows.gaussian", ""),
    ("signal.windows.general_cosine", ""), ("signal.windows.general_hamming", ""),
    ("signal.windows.hamming", ""), ("signal.windows.hann", ""), ("signal.windows.kaiser", ""),
    ("signal.windows.nuttall", ""), ("zeros", ""),
    ("bernoulli", ""), ("cauchy", ""), ("nn.functional.alpha_dropout", ""), ("nn.functional.dropout", ""),
    ("normal", ""), ("normal", "in_place"), ("normal", "number_mean"), ("rand_like", ""), ("randint", ""),
    ("randint_like", ""), ("randn", ""), ("randn_like", ""), ("uniform", ""),
    ("__getitem__", ""), ("nn.functional.fractional_max_pool2d", ""), ("nn.functional.fractional_max_pool3d", ""),
    ("pca_lowrank", ""), ("quantile", ""), ("svd_lowrank", ""),
    ("combinations", ""), ("linalg.lstsq", ""), ("linalg.lstsq", "grad_oriented"), ("masked_select", ""),
    ("nn.functional.ctc_loss", ""),
    ("logsumexp", ""), ("masked.logsumexp", ""), ("transpose", ""),
    ("nn.functional.conv1d", ""), ("nn.functional.conv2d", ""), ("nn.functional.conv3d", ""),
    ("nn.functional.conv_transpose1d", ""), ("nn.functional.conv_transpose2d", ""),
    ("nn.functional.conv_transpose3d", ""),
    ("nn.functional.cosine_similarity", ""),
    ("resize_", ""), ("resize_as_", ""),
    ("sparse.sampled_addmm", ""), ("sparse.mm", "reduce"),
    ("squeeze", "multiple"), ("tensor_split", ""), ("unsafe_split", ""),
]
DTENSOR_FAILS_SKIP = [
    ("argwhere", ""), ("cumprod", ""), ("__rmatmul__", ""), ("meshgrid", "list_of_tensors"),
    ("meshgrid", "variadic_tensors"), ("nn.functional.scaled_dot_product_attention", ""),
    ("nn.functional.softmin", ""), ("nn.functional.embedding", ""), ("nn.functional.embedding_bag", ""),
    ("nn.functional.feature_alpha_dropout", "with_train"), ("nn.functional.feature_alpha_dropout", "without_train"),
    ("nn.functional.hinge_embedding_loss", ""), ("nn.functional.cosine_embedding_loss", ""), ("fft.hfft", ""),
    ("fft.hfft2", ""), ("fft.hfftn", ""), ("fft.ifftn", ""), ("fft.irfft", ""), ("istft", ""), ("isclose", ""),
    ("isreal", ""), ("matmul", ""), ("masked.mean", ""), ("masked.var", ""), ("masked.std", ""),
    ("masked.normalize", ""), ("prod", ""), ("_segment_reduce", "lengths"), ("_segment_reduce", "offsets"),
    ("squeeze", ""), ("empty", ""), ("empty_strided", ""), ("empty_like", ""), ("empty_permuted", ""),
    ("new_empty", ""), ("new_empty_strided", ""),
]
# dtensor_fails_no_strategy: ops DTensor has no sharding strategy for.
DTENSOR_FAILS_NO_STRATEGY = [
    ("_batch_norm_with_update", ""), ("_chunk_cat", ""), ("_native_batch_norm_legit", ""),
    ("_unsafe_masked_index", ""), ("_unsafe_masked_index_put_accumulate", ""), ("_upsample_bilinear2d_aa", ""),
    ("addbmm", ""), ("allclose", ""), ("as_strided", ""), ("as_strided", "partial_views"), ("as_strided_copy", ""),
    ("as_strided_scatter", ""), ("block_diag", ""), ("cdist", ""), ("cholesky", ""), ("cholesky_inverse", ""),
    ("cholesky_solve", ""), ("complex", ""), ("cross", ""), ("cummax", ""), ("cummin", ""),
    ("diagonal_scatter", ""), ("exponential", ""), ("fft.ihfft2", ""), ("fft.ihfftn", ""), ("geometric", ""),
    ("geqrf", ""), ("grid_sampler_2d", ""), ("histogram", ""), ("histogramdd", ""), ("index_add", ""),
    ("index_copy", ""), ("index_fill", ""), ("index_reduce", "prod"), ("index_reduce", "mean"),
    ("index_reduce", "amax"), ("index_reduce", "amin"), ("isin", ""), ("kthvalue", ""), ("linalg.cholesky", ""),
    ("linalg.cholesky_ex", ""), ("linalg.cross", ""), ("linalg.det", ""), ("linalg.eig", ""),
    ("linalg.eigvals", ""), ("linalg.householder_product", ""), ("linalg.inv", ""), ("linalg.inv_ex", ""),
    ("linalg.ldl_factor", ""), ("linalg.ldl_factor_ex", ""), ("linalg.ldl_solve", ""), ("linalg.lu", ""),
    ("linalg.lu_factor", ""), ("linalg.lu_factor_ex", ""), ("linalg.lu_solve", ""), ("linalg.matrix_power", ""),
    ("linalg.pinv", ""), ("linalg.pinv", "hermitian"), ("linalg.slogdet", ""), ("linalg.solve", ""),
    ("linalg.solve_ex", ""), ("linalg.solve_triangular", ""), ("linalg.tensorinv", ""), ("linalg.tensorsolve", ""),
    ("linalg.vander", ""), ("linspace", "tensor_overload"), ("log_normal", ""), ("logcumsumexp", ""),
    ("logdet", ""), ("logspace", "tensor_overload"), ("lu", ""), ("lu_solve", ""), ("lu_unpack", ""),
    ("masked.median", ""), ("masked_scatter", ""), ("matrix_exp", ""), ("max_pool2d_with_indices_backward", ""),
    ("median", ""), ("mode", ""), ("multinomial", ""), ("nanmean", ""), ("nanmedian", ""), ("nanquantile", ""),
    ("nansum", ""), ("native_batch_norm", ""), ("nn.functional.adaptive_avg_pool1d", ""),
    ("nn.functional.adaptive_avg_pool2d", ""), ("nn.functional.adaptive_avg_pool3d", ""),
    ("nn.functional.adaptive_max_pool1d", ""), ("nn.functional.adaptive_max_pool2d", ""),
    ("nn.functional.adaptive_max_pool3d", ""), ("nn.functional.avg_pool1d", ""), ("nn.functional.avg_pool2d", ""),
    ("nn.functional.avg_pool3d", ""), ("nn.functional.batch_norm", ""), ("nn.functional.bilinear", ""),
    ("nn.functional.grid_sample", ""), ("nn.functional.group_norm", ""), ("nn.functional.hardshrink", ""),
    ("nn.functional.instance_norm", ""), ("nn.functional.interpolate", "area"),
    ("nn.functional.interpolate", "nearest"), ("nn.functional.interpolate", "nearest-exact"),
    ("nn.functional.local_response_norm", ""), ("nn.functional.max_pool1d", ""), ("nn.functional.max_pool2d", ""),
    ("nn.functional.max_pool3d", ""), ("nn.functional.max_unpool1d", ""), ("nn.functional.max_unpool1d", "grad"),
    ("nn.functional.max_unpool2d", ""), ("nn.functional.max_unpool2d", "grad"), ("nn.functional.max_unpool3d", ""),
    ("nn.functional.max_unpool3d", "grad"), ("nn.functional.multi_margin_loss", ""),
    ("nn.functional.multilabel_margin_loss", ""), ("nn.functional.pad", "reflect"),
    ("nn.functional.pad", "replicate"), ("nn.functional.pad", "replicate_negative"), ("nn.functional.pdist", ""),
    ("nn.functional.rrelu", ""), ("nn.functional.threshold", ""), ("nn.functional.unfold", ""),
    ("nn.functional.upsample_nearest", ""), ("nonzero", ""), ("ormqr", ""), ("pinverse", ""), ("polar", ""),
    ("put", ""), ("renorm", ""), ("scatter_reduce", "amax"), ("scatter_reduce", "amin"),
    ("scatter_reduce", "mean"), ("scatter_reduce", "prod"), ("scatter_reduce", "sum"), ("searchsorted", ""),
    ("select_scatter", ""), ("special.airy_ai", ""), ("special.bessel_y0", ""), ("special.bessel_y1", ""),
    ("special.chebyshev_polynomial_t", ""), ("special.chebyshev_polynomial_u", ""),
    ("special.chebyshev_polynomial_v", ""), ("special.chebyshev_polynomial_w", ""), ("special.entr", ""),
    ("special.hermite_polynomial_h", ""), ("special.hermite_polynomial_he", ""),
    ("special.laguerre_polynomial_l", ""), ("special.legendre_polynomial_p", ""),
    ("special.modified_bessel_i0", ""), ("special.modified_bessel_i1", ""), ("special.modified_bessel_k0", ""),
    ("special.modified_bessel_k1", ""), ("special.scaled_modified_bessel_k0", ""),
    ("special.scaled_modified_bessel_k1", ""), ("special.shifted_chebyshev_polynomial_t", ""),
    ("special.shifted_chebyshev_polynomial_u", ""), ("special.shifted_chebyshev_polynomial_v", ""),
    ("special.shifted_chebyshev_polynomial_w", ""), ("special.xlog1py", ""), ("squeeze_copy", ""), ("stft", ""),
    ("take", ""), ("to_sparse", ""), ("triangular_solve", ""), ("unfold", ""), ("unfold_copy", ""),
    ("unique", ""), ("unique_consecutive", ""),
]
ENTRIES = sorted(set(DTENSOR_FAILS_XFAIL) | set(DTENSOR_FAILS_SKIP) | set(DTENSOR_FAILS_NO_STRATEGY))

# Ops the test leaves out of its own backward step (resolve_name of the op).
SKIP_BW = {None, "torch.bucketize", "torch.conj_physical", "torch.eq", "torch.isfinite", "torch.isnan"}

PASS, ERROR, WRONG, NONE, NONDET = "pass", "error", "wrong", "-", "nondet"

# The test's own notes: "random/stochastic ops: different RNG states between DTensor and
# reference", and the empty family, skipped "as their contents are nondeterministic". Their
# values are no answer to compare; so is any op whose reference differs from itself when run
# again with other memory around it (_probe: exponential_, rrelu in training, _segment_reduce
# reading past its data). Their shapes are still compared.


class _Timeout(Exception):
    pass


@dataclass
class Outcome:
    verdict: str = NONE  # as the test counts: first failure, or pass
    detail: str = ""
    compared: int = 0
    wrong_anywhere: bool = False
    bwd: str = NONE
    bwd_detail: str = ""
    nondeterministic: bool = False

    def fail(self, kind: str, detail: str) -> None:
        if self.verdict in (NONE, PASS):
            self.verdict, self.detail = kind, detail
        self.wrong_anywhere |= kind == WRONG


@dataclass
class Sample:
    args: list
    kwargs: dict
    ref: object  # reference outputs (plain tensors)
    ref_grads: object = None  # per differentiable input, or an Exception, or None
    nondeterministic: bool = False  # values are no answer: shapes and requires_grad only


@dataclass
class Case:
    key: str
    opinfo: object
    samples: list = field(default_factory=list)
    setup_error: str = ""


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:110] if msg else ''}"


def _tensors(tree):
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _first_differentiable(out):
    for t in _tensors(out):
        if t.requires_grad and (t.is_floating_point() or t.is_complex()):
            return t
    return None


def _concat_if_split(func, args, res):
    # as the test: split-like ops' pieces are concatenated back
    import torch
    from torch.overrides import resolve_name

    name = resolve_name(func)
    if name is not None and "split" in name:
        return torch.cat(res, dim=args[2] if len(args) == 3 else 0)
    return res


def _on_every_rank(t):
    """A gathered tensor per simulated rank (one when it is a plain tensor)."""
    from torch.distributed._local_tensor import LocalTensor

    return list(t._local_tensors.values()) if isinstance(t, LocalTensor) else [t]


def _assert_equal(tc, got, want, values: bool = True) -> None:
    """The test's assert_ref_dtensor_equal: same leaves, then shape, requires_grad and value
    of each tensor leaf, on every rank."""
    import torch
    from torch.utils._pytree import tree_leaves

    flat_got, flat_want = tree_leaves(got), tree_leaves(want)
    tc.assertEqual(len(flat_got), len(flat_want))
    for g, w in zip(flat_got, flat_want):
        if not isinstance(w, torch.Tensor):
            continue
        tc.assertIsInstance(g, torch.Tensor)
        tc.assertEqual(g.shape, w.shape, f"shape mismatch: reference {tuple(w.shape)}, DTensor {tuple(g.shape)}")
        tc.assertEqual(g.requires_grad, w.requires_grad, "requires_grad mismatch")
        if values:
            for r in _on_every_rank(g):
                tc.assertEqual(r, w)


# the test's "random/stochastic ops", the other samplers of the lists (seeded the same, DTensor's
# offset-based RNG still draws other values), and the empty family
NONDETERMINISTIC = {
    "bernoulli", "cauchy", "nn.functional.alpha_dropout", "nn.functional.dropout", "normal", "normal.in_place",
    "normal.number_mean", "rand_like", "randint", "randint_like", "randn", "randn_like", "uniform",
    "exponential", "geometric", "log_normal", "multinomial", "nn.functional.rrelu",
    "nn.functional.feature_alpha_dropout.with_train",
    "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided",
}


def _reference(fn, args, kwargs) -> tuple[object, bool]:
    """``fn``'s output, and whether it sampled: an ATen op tagged ``nondeterministic_seeded``
    ran (the dropout inside attention, whatever argument asked for it). OpInfo's wrapper
    seeds each call, so two reference runs agree, while DTensor's offset-based RNG draws
    other masks on a cut tensor."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Draws(TorchDispatchMode):
        drew = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.drew |= torch.Tag.nondeterministic_seeded in func.tags
            return func(*args, **(kwargs or {}))

    with Draws() as mode:
        out = fn(*args, **kwargs)
    return out, mode.drew


def _same(a, b) -> bool:
    """Same tensors, shapes and values, NaN where the other has NaN (an op's own NaN is an
    answer; a NaN read from the probe's filled memory is not)."""
    import torch

    def equal(x, y):
        if x.shape != y.shape or x.dtype != y.dtype or x.layout != torch.strided:
            return x.shape == y.shape and x.dtype == y.dtype and x.layout == y.layout
        if x.is_floating_point() or x.is_complex():
            return bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())
        return torch.equal(x, y)

    ta, tb = _tensors(a), _tensors(b)
    return len(ta) == len(tb) and all(equal(x.detach(), y.detach()) for x, y in zip(ta, tb))


_PAD = 64  # elements of NaN (or _OTHER_FILL) after each floating input's storage in the probe runs
_OTHER_FILL = 7.0


def _dense(t) -> bool:
    """Whether ``t`` covers its storage span once, each element in its own place."""
    expected = 1
    for stride, n in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= n
    return True


def _padded(t, fill: float = float("nan")):
    """A copy of ``t`` with its strides, in a storage that runs on past its last element
    with ``fill``: an op that reads past its input (``_segment_reduce`` with an offset beyond
    the data) sees ``fill`` there instead of whatever the allocator left."""
    import torch

    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or not (t.is_floating_point() or t.is_complex()) \
            or not _dense(t):
        return t
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    with torch.no_grad():
        buf = torch.full((span + _PAD,), fill, dtype=t.dtype)
        out = buf.as_strided(t.shape, t.stride(), 0)
        out.copy_(t.detach())
    return out.requires_grad_(t.requires_grad) if t.requires_grad else out


def _probe(fn, args, kwargs, pad_with: float = float("nan")):
    """``fn`` run with memory it does not own made different from the reference run's: every
    floating input padded with ``pad_with`` past its end (``_padded``) and every allocation filled
    (NaN, or the largest integer: ``torch.utils.deterministic.fill_uninitialized_memory``
    under deterministic algorithms, warnings only). An output that differs from the
    reference, or between two fills, read memory no input holds: its values are no answer
    (one fill alone can meet the same value left past the reference's inputs)."""
    import torch
    from torch.utils._pytree import tree_map

    det, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        pad = partial(_padded, fill=pad_with)
        return fn(*tree_map(pad, args), **tree_map(pad, kwargs))
    finally:
        torch.use_deterministic_algorithms(det, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def build_case(opinfo, n_samples: int, dtype: str = "float32") -> Case:
    """The OpInfo's first samples (made inside LocalTensorMode, as the test makes them) and
    their reference outputs and gradients."""
    import torch
    from torch.distributed._local_tensor import reconcile_args

    case = Case(_key(opinfo), opinfo)
    torch.manual_seed(0)  # the test's setUp seeds each test
    try:
        it = iter(opinfo.sample_inputs("cpu", getattr(torch, dtype), requires_grad=True))
        for _ in range(n_samples):
            try:
                s = next(it)
            except StopIteration:
                break
            args, kwargs = [s.input] + list(s.args), dict(s.kwargs)
            ref_args, ref_kwargs = reconcile_args(args, kwargs)
            raw, drew = _reference(opinfo.op, ref_args, ref_kwargs)
            ref = _concat_if_split(opinfo.op, args, raw)
            try:
                again, apart = (_concat_if_split(opinfo.op, args, _probe(opinfo.op, ref_args, ref_kwargs, fill))
                                for fill in (float("nan"), _OTHER_FILL))
            except Exception:  # noqa: BLE001 -- the probe's copies or modes refused: a plain second run
                again = apart = _concat_if_split(opinfo.op, args, opinfo.op(*ref_args, **ref_kwargs))
            nondeterministic = _key(opinfo) in NONDETERMINISTIC or drew or not _same(ref, again) \
                or not _same(again, apart)
            sample = Sample(args, kwargs, ref, nondeterministic=nondeterministic)
            # the first piece of a split, as run_case takes it, not the pieces concatenated
            out, ins = _first_differentiable(raw), [t for t in _tensors((ref_args, ref_kwargs)) if t.requires_grad]
            if out is not None and ins:
                try:
                    sample.ref_grads = torch.autograd.grad(out.sum(), ins, allow_unused=True)
                except Exception as e:  # noqa: BLE001 -- no reference gradient: nothing to compare
                    sample.ref_grads = e
            case.samples.append(sample)
    except Exception as e:  # noqa: BLE001 -- the test fails here too, before any DTensor
        case.setup_error = _short(e)
    return case


def _backward(tc, d_out, d_inputs, ref_grads) -> tuple[str, str]:
    import torch
    from torch.distributed.tensor import DTensor

    if ref_grads is None or isinstance(ref_grads, Exception) or d_out is None:
        return NONE, ""
    try:
        full = d_out.full_tensor() if isinstance(d_out, DTensor) else d_out
        grads = torch.autograd.grad(full.sum(), d_inputs, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        return ERROR, _short(e)
    try:
        for g, w in zip(grads, ref_grads):
            if w is None or g is None:
                tc.assertEqual(g is None, w is None, "gradient present on one side only")
                continue
            g = g.full_tensor() if isinstance(g, DTensor) else g
            tc.assertEqual(g.shape, w.shape)
            for r in _on_every_rank(g):
                tc.assertEqual(r, w)
    except AssertionError as e:
        return WRONG, _short(e)
    except Exception as e:  # noqa: BLE001
        return ERROR, _short(e)
    return PASS, ""


def every_cut_converter(uneven: bool):
    """A ``DTensorConverter`` that places each tensor input over every mesh dim, Replicate
    or Shard(d) along each dim of size > 1 (divisible by the mesh dim's size unless
    ``uneven``), and draws at most ``MAX_COMBINATIONS`` of the combinations."""
    import torch
    from torch.distributed.tensor import Replicate, Shard
    from torch.testing._internal.distributed._tensor.common_dtensor import DTensorConverter

    class EveryCut(DTensorConverter):
        def __init__(self, mesh, args, kwargs, seed: str):
            super().__init__(mesh, args, kwargs)
            choices = [self.gen_sharding_choices_for_arg(a) for a in self.flatten_args + self.flatten_kwargs
                       if isinstance(a, torch.Tensor)]
            total = math.prod(len(c) for c in choices)
            picked = range(total) if total <= MAX_COMBINATIONS else sorted(
                random.Random(seed).sample(range(total), MAX_COMBINATIONS))
            self.sharding_combs = iter([_nth_combination(choices, i) for i in picked])

        def gen_sharding_choices_for_arg(self, arg):
            if arg.dtype == torch.bool:  # as the test: c10d has no bool collectives
                return [(Replicate(),) * self.mesh.ndim]
            per_dim = [[Replicate()] + [Shard(d) for d, n in enumerate(arg.shape)
                                        if n > 1 and (uneven or n % self.mesh.size(m) == 0)]
                       for m in range(self.mesh.ndim)]
            return list(itertools.product(*per_dim))

        def to_dist_tensor(self, t, mesh, placements):
            return super().to_dist_tensor(t, mesh, list(placements[0]))

    return EveryCut


def _nth_combination(choices: list, i: int) -> tuple:
    """The ``i``-th element of ``itertools.product(*choices)``."""
    out = []
    for c in reversed(choices):
        i, r = divmod(i, len(c))
        out.append(c[r])
    return tuple(reversed(out))


def run_case(case: Case, mesh, tc, timeout: float, converter_class=None) -> Outcome:
    """``converter_class``: one made by ``every_cut_converter``, or None for torch's own."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed._tensor.common_dtensor import (
        DTensorConverter,
    )

    o = Outcome()
    if case.setup_error:  # the sample or its reference fails without DTensor: nothing to compare
        o.detail = "reference: " + case.setup_error
        return o
    func = case.opinfo.op
    bwd = []
    signal.setitimer(signal.ITIMER_REAL, timeout)  # not alarm(): it takes whole seconds, and alarm(0) is none
    try:
        for s in case.samples:
            converter = DTensorConverter(mesh, s.args, s.kwargs) if converter_class is None else \
                converter_class(mesh, s.args, s.kwargs, seed=case.key)
            for d_args, d_kwargs in converter:
                if not converter.successful():
                    o.fail(ERROR, "not every tensor input converts to a DTensor")
                    continue
                try:
                    d_rs = func(*d_args, **d_kwargs)
                except _Timeout:
                    raise
                except Exception as e:  # noqa: BLE001
                    o.fail(ERROR, _short(e))
                    continue
                if any(t.numel() == 0 for t in _tensors(d_rs)):
                    continue  # the test passes these over
                d_out = _first_differentiable(d_rs)
                try:  # gathering fails loudly (LocalTensor's own asserts included): an error, not a wrong answer
                    got = torch.utils._pytree.tree_map(
                        lambda e: e.full_tensor() if isinstance(e, DTensor) else e, d_rs)
                    got = _concat_if_split(func, s.args, got)
                except _Timeout:
                    raise
                except Exception as e:  # noqa: BLE001
                    o.fail(ERROR, _short(e))
                    continue
                try:
                    _assert_equal(tc, got, s.ref, values=not s.nondeterministic)
                    o.compared += 1
                    o.nondeterministic |= s.nondeterministic
                except AssertionError as e:
                    o.compared += 1
                    o.fail(WRONG, _short(e))
                except _Timeout:
                    raise
                except Exception as e:  # noqa: BLE001
                    o.fail(ERROR, _short(e))
                d_ins = [t for t in _tensors((d_args, d_kwargs)) if isinstance(t, DTensor) and t.requires_grad]
                if d_out is not None and d_ins and not s.nondeterministic:
                    bwd.append(_backward(tc, d_out, d_ins, s.ref_grads))
    except _Timeout:
        o.fail(ERROR, f"over {timeout:g} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if o.verdict == NONE and o.compared:
        o.verdict = NONDET if o.nondeterministic else PASS
    for kind in (WRONG, ERROR, PASS):  # the worst backward verdict over the combinations
        hit = [d for k, d in bwd if k == kind]
        if hit:
            o.bwd, o.bwd_detail = kind, hit[0]
            break
    return o


def run_isolated(case: Case, mesh, tc, timeout: float, converter_class=None) -> Outcome:
    """``run_case`` in a forked child: DTensor's own convolution backward handler crashes
    the process (SIGSEGV) on some placements, which then counts as an error of that op."""
    import os
    import pickle
    import select

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, leave without cleanup
        os.close(r)
        try:
            data = pickle.dumps(run_case(case, mesh, tc, timeout, converter_class))
        except BaseException as e:  # noqa: BLE001
            data = pickle.dumps(Outcome(ERROR, _short(e)))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout + 30
    with os.fdopen(r, "rb") as f:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([f], [], [], 1.0)
            if ready:
                chunk = f.read1(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    try:
        return pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 -- nothing, or cut short: say why below
        chunks.clear()
    if os.WIFSIGNALED(status):
        return Outcome(ERROR, f"process killed by {signal.Signals(os.WTERMSIG(status)).name}")
    return Outcome(ERROR, f"over {timeout:g} s")


def _key(opinfo) -> str:
    return _entry_key(opinfo.name, opinfo.variant_test_name)


def _entry_key(name: str, variant: str) -> str:
    return name + (f".{variant}" if variant else "")


def every_entry() -> list[tuple[str, str]]:
    """(name, variant) of every OpInfo of torch's op_db."""
    from torch.testing._internal.common_methods_invocations import op_db

    return sorted({(o.name, o.variant_test_name) for o in op_db})


def opinfos(patterns: list[str] | None, entries: list = ENTRIES, even_sizes: bool = True, dtype: str = "float32"):
    """The OpInfos of ``entries`` that the test instantiates, each with whether it takes
    ``dtype`` on the CPU (float32, as the test)."""
    import torch
    import torch.testing._internal.common_methods_invocations as common_ops
    from torch.testing._internal.common_methods_invocations import op_db

    if even_sizes:  # as the test: sizes that split evenly over 4
        common_ops.L, common_ops.M, common_ops.S, common_ops.XS = 24, 12, 4, 2
    out, missing = [], []
    for name, variant in entries:
        found = [o for o in op_db if o.name == name and o.variant_test_name == variant]
        if not found:
            missing.append((name, variant))
        for o in found:
            if patterns and not any(fnmatch.fnmatch(_key(o), p) for p in patterns):
                continue
            out.append((o, getattr(torch, dtype) in o.supported_dtypes("cpu")))
    return out, missing


# Why each op that still fails after register() (first sample) fails:
# the note column prints this in place of the error's first line.
_MIXED = ("its {} (C++, below autograd, where no DTensor extension point sees it) builds a plain "
          "tensor with at::zeros(sizes) and combines it with DTensors ({}); DTensor refuses the mix, "
          "as it must for a plain tensor that may differ by rank")
_FACTORY = "a factory: no tensor input, so torch's DTensorConverter has nothing to convert (the test fails it so too)"
WHY = {
    "__getitem__": "indexing by a Python list makes a plain index tensor before dispatch (aten.index with a "
                   "plain index); DTensor cannot tell it from a tensor that differs by rank",
    "nn.functional.scaled_dot_product_attention":
        "the math path (composite, decomposed before DTensor sees it) adds a plain causal mask made by "
        "ones().tril() to a DTensor; flash attention on the CPU takes no 3-d input",
    "tensor_split": "its composite reads the Tensor indices' values through their data pointer, which a "
                    "DTensor wrapper has not: no dispatch to intercept",
    "to_sparse": "a sparse COO output: DTensor wraps strided tensors only",
    "nn.functional.embedding": "LocalTensorMode's per-rank ints (LocalIntNode) have no guard_int, which "
                               "embedding's decomposition asks for: the simulation's machinery, before any rule",
    "nn.functional.fractional_max_pool2d": "its Python wrapper draws the random samples as a plain tensor "
                                           "(torch.rand) and passes them beside the DTensor input",
    "nn.functional.fractional_max_pool3d": "its Python wrapper draws the random samples as a plain tensor "
                                           "(torch.rand) and passes them beside the DTensor input",
    "pca_lowrank": "draws a plain random matrix (torch.randn) and multiplies it with the DTensor (mm)",
    "svd_lowrank": "draws a plain random matrix (torch.randn) and multiplies it with the DTensor (mm)",
    "unbind": "a view: along a cut dim its outputs would view a gathered copy, not the input; DTensor's strict "
              "view rule refuses rather than redistribute",
    "stft": "with the signal cut, its framing as_strided would view a gathered copy, not the input: views "
            "never redistribute (replicated signals run)",
    "normal.number_mean": "random, and torch's DTensorConverter cannot convert its sample's tensors",
    **{k: "runs torch's own custom op (torch_nn._linear_cross_entropy_batch_chunked*), not an ATen op: no table "
          "covers it (the sweep's are ATen's) and DTensor has no rule for it"
       for k in ("nn.functional.linear_cross_entropy.chunked", "nn.functional.linear_cross_entropy.chunked_none")},
    # later samples (--samples > 1)
    "matmul": "its backward with a 1-d operand meets DTensor's own error: a spec whose sizes and strides "
              "differ in length",
    "__rmatmul__": "its backward with a 1-d operand meets DTensor's own error: a spec whose sizes and strides "
                   "differ in length",
    "linalg.vander": _MIXED.format("backward formula", "where"),
    "prod": _MIXED.format("backward formula", "cat"),
    "put": _MIXED.format("backward formula", "put"),
    "unflatten": "DTensor's own unflatten rule refuses an uneven cut of the unflattened dim (a view: it does "
                 "not redistribute)",
    "nn.functional.adaptive_avg_pool2d": "its backward gets grad_output cut along a spatial dim shorter than the "
                                         "mesh (empty shards, cut as torch.chunk cuts), which the kernel refuses",
    "combinations": "of more than one element, its decomposition masks with a plain tensor (ones().triu(), below "
                    "autograd); one element, a one-element mask DTensor takes as replicated, runs",
    "cummax": _MIXED.format("backward formula", "scatter_add"),
    "cummin": _MIXED.format("backward formula", "scatter_add"),
    "cumprod": _MIXED.format("backward formula", "where"),
    "diagonal_scatter": _MIXED.format("backward formula", "diagonal_scatter of the src gradient"),
    "select_scatter": _MIXED.format("backward formula", "select_scatter of the src gradient"),
    "lu_unpack": _MIXED.format("backward (undefined output gradients made zeros)", "cat"),
    "unsafe_split": _MIXED.format("backward (undefined output gradients made zeros)", "cat"),
    "linalg.householder_product": "its backward calls tril_ (in place), which DTensor has no strategy for "
                                  "(register() runs it as tril written into self)",
    "ormqr": "its backward calls tril_ (in place), which DTensor has no strategy for (register() runs it as "
             "tril written into self)",
    "quantile": "its backward meets DTensor's own error: an output spec of shape [1] built without a stride",
    "nanquantile": "its backward meets DTensor's own error: an output spec of shape [1] built without a stride",
    "sgn": "its gradient (zeros, made below autograd) comes back as a plain LocalTensor, not a DTensor, and "
           "comparing that under LocalTensorMode crashes the process (SIGSEGV in isclose): the simulation, before "
           "any rule",
    **{k: _FACTORY for k in (
        "arange", "broadcast_shapes", "empty", "empty_permuted", "empty_strided", "eye", "full", "linspace",
        "logspace", "ones", "randint", "randn", "scalar_tensor", "zeros", "signal.windows.bartlett",
        "signal.windows.blackman", "signal.windows.cosine", "signal.windows.exponential",
        "signal.windows.gaussian", "signal.windows.general_cosine", "signal.windows.general_hamming",
        "signal.windows.hamming", "signal.windows.hann", "signal.windows.kaiser", "signal.windows.nuttall")},
}

# Errors met off the test's lists and cuts (--all, --uneven, --mesh) whose message says what
# refused, for an op with no WHY: (part of the message, reason). Loud by design; a wrong
# answer never gets one.
_EMPTY_SHARD = ("an uneven cut leaves a rank an empty shard (fewer elements than ranks along the cut), and the "
                "op's kernel refuses an empty input: DTensor runs each rank's shard as it is")
REFUSALS = (
    ("Cannot flatten unevenly sharded tensor", "DTensor's view rules refuse to flatten an uneven cut (a view "
                                               "does not redistribute)"),
    ("cannot be evenly sharded", "DTensor's own rule refuses the uneven cut"),
    ("not supported with DTensor", "DTensor refuses the op"),
    ("got mixed torch.Tensor and DTensor", "a plain tensor made below DTensor's dispatch (by a composite or a "
                                           "backward formula) meets a DTensor, and DTensor refuses the mix"),
    ("must have at least one element", _EMPTY_SHARD), ("over an empty dimension", _EMPTY_SHARD),
    ("input.numel() == 0", _EMPTY_SHARD), ("on an empty tensor", _EMPTY_SHARD), ("MKL FFT error", _EMPTY_SHARD),
    ("moves a tensor the op writes in place", "register() refuses a call of an installed strategy whose every "
                                              "strategy moves a tensor the op writes into a copy, which on real "
                                              "ranks would take the write"),
    ("Cannot unflatten tensor with _StridedShard placement", "DTensor's view rules (2 × 2 mesh): a dim cut over both "
                                                             "mesh dims (_StridedShard) whose split matches no dim of "
                                                             "the view, which a view cannot redistribute"),
    ("is invalid for input of size", "DTensor's view rules (2 × 2 mesh) give a rank a local view shape its shard "
                                     "does not have, and the local view fails, on plain DTensor alike"),
    ("must have the same set of extra dispatch keys", "LocalTensorMode, which simulates the ranks, asserts that "
                                                      "every rank's shard carries the same dispatch keys, and they "
                                                      "do not: the simulation refuses, before any answer"),
)


def reason(key: str, o: Outcome) -> str:
    """Why ``o`` fails: WHY's entry, or a refusal its error messages name (``REFUSALS``)."""
    if key in WHY:
        return WHY[key]
    if o.wrong_anywhere or WRONG in (o.verdict, o.bwd):
        return ""
    messages = [d for v, d in ((o.verdict, o.detail), (o.bwd, o.bwd_detail)) if v == ERROR]
    if not messages or not all(any(part in m for part, _ in REFUSALS) for m in messages):
        return ""
    return "refused: " + "; ".join(sorted({r for m in messages for part, r in REFUSALS if part in m}))


COLUMNS = ("plain", "register", "replace")  # DTensor; + register(replace_refuted=False); + register()

# setitimer refuses past about 1e9 s; no op of this test needs a day.
MAX_TIMEOUT = 86400.0
timeout_seconds = at_most(seconds, MAX_TIMEOUT, f"{MAX_TIMEOUT:g} seconds (a day)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ops", nargs="+", help="glob(s) over OpInfo names, e.g. 'nn.functional.conv*' (default: all)")
    ap.add_argument("--samples", type=positive_int, default=1, help="samples per OpInfo, first ones first (default 1)")
    ap.add_argument("--timeout", type=timeout_seconds, default=300.0,
                    help=f"seconds per op and run, at most {MAX_TIMEOUT:g} (default 300)")
    ap.add_argument("--no-replace", action="store_true", help="leave out the register() column (refuted rules replaced)")
    ap.add_argument("--in-process", action="store_true", help="run every op in this process (a crash ends the run)")
    ap.add_argument("--only-failing", action="store_true", help="print only rows that do not pass every way")
    ap.add_argument("--all", action="store_true", help="every OpInfo of torch's op_db, not only the test's lists")
    ap.add_argument("--uneven", action="store_true",
                    help="OpInfo's own sizes (20, 10, 5, 3) and Shard(d) along every dim of size > 1, uneven cuts "
                         f"included (at most {MAX_COMBINATIONS} combinations per sample)")
    ap.add_argument("--mesh", choices=sorted(MESHES), default="4",
                    help=f"4 (the test's) or 2x2: each input placed over both mesh dims (at most {MAX_COMBINATIONS} "
                         "combinations per sample)")
    args = ap.parse_args(argv)
    if not args.all:  # before torch starts: a glob that matches no entry would run nothing and exit 0
        _check_globs(ap, args.ops, ENTRIES, "of the test's lists ", "; --all takes every OpInfo of torch's op_db")

    import torch
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.common_utils import TestCase

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)  # a warning per nested gather on 2x2
    entries = every_entry() if args.all else ENTRIES
    if args.all:
        _check_globs(ap, args.ops, entries, "of op_db ")
    torch.set_num_threads(1)  # each op runs in a forked child, which must not inherit a started thread pool
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(_Timeout()))
    dist.init_process_group("fake", rank=0, world_size=WORLD)
    tc = TestCase()
    beyond = args.uneven or args.mesh != "4"  # the test's cuts or not
    dtype = "float64" if beyond else "float32"
    found, missing = opinfos(args.ops, entries, even_sizes=not args.uneven, dtype=dtype)
    run = run_case if args.in_process else run_isolated
    converter_class = every_cut_converter(args.uneven) if beyond else None
    columns = COLUMNS[:2] if args.no_replace else COLUMNS
    results: dict[str, dict] = {_key(o): {} for o, _ in found}
    times, reports = {}, {}
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = init_device_mesh("cpu", MESHES[args.mesh])
        t = time.perf_counter()
        cases = [build_case(o, args.samples, dtype) if supported else None for o, supported in found]
        times["samples"] = time.perf_counter() - t
        from metaspmd.backends.torch.dtensor_rules import register

        for column in columns:
            t = time.perf_counter()
            if column != "plain":
                reports[column] = register(replace_refuted=column == "replace")
            for (o, _), case in zip(found, cases):
                results[_key(o)][column] = run(case, mesh, tc, args.timeout, converter_class) if case else Outcome()
            times[column] = time.perf_counter() - t

    _print_table(results, columns, args.only_failing)
    print(f"\nOpInfos: {len(found)} from {len(entries)} entries"
          + (f" (not in this torch: {missing})" if missing else "")
          + f"; {sum(1 for c in cases if c is None)} without {dtype} on the CPU")
    print(f"mesh {args.mesh}; {dtype}; " + ("OpInfo's own sizes, every dim cut (uneven included)" if args.uneven
                                            else "the test's sizes, dims cut where they split evenly"))
    for column, report in reports.items():
        then = " then, on top of the register column's," if column == "replace" and "register" in reports else ""
        print(f"{column}:{then} register({'' if column == 'replace' else 'replace_refuted=False'}) {report}")
    print("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    return 0


def _check_globs(ap, globs, entries, of: str, hint: str = "") -> None:
    keys = [_entry_key(*e) for e in entries]
    unmatched = [g for g in globs or () if not any(fnmatch.fnmatch(k, g) for k in keys)]
    if unmatched:
        ap.error(f"--ops: no OpInfo entry {of}matches {' '.join(map(repr, unmatched))}{hint}")


def totals(results: dict, which: str) -> dict:
    out = {PASS: 0, ERROR: 0, WRONG: 0, NONDET: 0, NONE: 0, "wrong anywhere": 0, "bwd " + PASS: 0, "bwd " + ERROR: 0,
           "bwd " + WRONG: 0}
    for r in results.values():
        o = r[which]
        out[o.verdict] += 1
        out["wrong anywhere"] += o.wrong_anywhere
        if o.bwd != NONE:
            out["bwd " + o.bwd] += 1
    return out


def _passes(o: Outcome) -> bool:
    return o.verdict == PASS and o.bwd in (PASS, NONE)


def _print_table(results: dict, columns: tuple, only_failing: bool) -> None:
    w = max([len(k) for k in results] + [10])
    head = "".join(f"{c:<9}{'bwd':<7}" for c in columns)
    print(f"{'op':<{w}}  {head}note (last column that has one)")
    for k in sorted(results):
        row = [results[k][c] for c in columns]
        if only_failing and all(_passes(o) for o in row):
            continue
        note = next((o.detail or o.bwd_detail for o in reversed(row) if o.detail or o.bwd_detail), "")
        if _fails(row[-1]):
            why = reason(k, row[-1])
            note = f"why: {why}" if why else f"(no reason recorded) {note}"
        flags = ("W! " if any(o.wrong_anywhere for o in row[1:]) else "") + (
            "REGRESSION " if any(row[0].verdict == PASS != o.verdict for o in row[1:]) else "")
        cells = "".join(f"{o.verdict:<9}{o.bwd:<7}" for o in row)
        print(f"{k:<{w}}  {cells}{flags}{note}")
    print()
    sums = {c: totals(results, c) for c in columns}
    print(f"{'totals':<16}" + "".join(f"{c:>10}" for c in columns))
    for k in sums[columns[0]]:
        print(f"{k:<16}" + "".join(f"{sums[c][k]:>10}" for c in columns))
    print(f"{'regressions':<16}{'':>10}" + "".join(
        f"{sum(1 for r in results.values() if r['plain'].verdict == PASS != r[c].verdict):>10}" for c in columns[1:]))
    unexplained = sorted(k for k, r in results.items() if _fails(r[columns[-1]]) and not reason(k, r[columns[-1]]))
    print(f"failing in the last column with no reason recorded (WHY): {unexplained or 'none'}")


def _fails(o: Outcome) -> bool:
    return o.verdict in (ERROR, WRONG) or o.bwd in (ERROR, WRONG)


if __name__ == "__main__":
    sys.exit(pipe_safe(main)())  # `| head` ends it quietly
