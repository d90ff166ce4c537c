"""Sample inputs per ATen overload, captured from torch's OpInfo database.

Every OpInfo sample (CPU; float32, int64 and bool where the OpInfo supports them; the
in-place variant and the backward pass in float32) runs under a dispatch mode that
records each ATen call; a second round of the same samples records the calls of
CompositeImplicitAutograd overloads, which no dispatch mode sees (``composite_calls``).
Calls are deduplicated per overload by canonical signature, and a
few signatures per overload are kept. Each kept call remembers where it came from
(``SampleRef``), so ``regenerate`` can rebuild the same call from the sample's own
generator with another seed: indices, positive-definite matrices and probabilities stay
valid.

Capturing costs tens of seconds and importing the OpInfo database several; the index is
built once per torch version and cached on disk, so a sweep worker only loads a file.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import fcntl
import functools
import os
import random
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import numpy
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from metaspmd import pytree, reproducible
from metaspmd.cache import default_cache_dir
from metaspmd.signature import signature

from .catalog import NAMESPACE, exact_sizes, op_name, positional_names
from .composite_calls import CompositeRecorder, composite_kernels, composite_names
from .tensor_ops import TorchOps

FORMAT_VERSION = 18  # bump when capture or selection changes: old caches are then ignored (18: ones built
# under a variable reproducible.UNSET now leaves out could hold other samples)
BASE_SEED = 0  # the seed the cached examples were generated with
FRESH_SEEDS = 4  # a schema-built sample runs on the seeds after BASE_SEED too (explorer trials)
MAX_SIGNATURES = 4  # explored per overload
# Kept beyond those, explored only where none of them gives a strategy: OpInfo's var samples
# that come first all reduce every dim; one that keeps a dim has rules.
RESERVE_SIGNATURES = 4
MAX_CANDIDATES = 32  # seen per overload and dtype-kind pattern, before choosing (empty calls aside)
MAX_SAMPLES = 64  # per OpInfo and pass: bounds capture and regeneration time
# Samples with an empty tensor do not count toward MAX_SAMPLES (unfold's first 81 all have an
# empty batch, which no cut can tell apart), up to this many samples generated in all.
MAX_SAMPLES_SCANNED = 4 * MAX_SAMPLES

# (mode, dtype) passes, in order of preference: earlier passes fill the index first.
PASSES = (
    ("forward", torch.float32),
    ("forward", torch.int64),
    ("forward", torch.bool),
    ("inplace", torch.float32),
    ("backward", torch.float32),
)

_OPS = TorchOps()
_PLAIN = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


@dataclass(frozen=True)
class SampleRef:
    """Where a captured call came from: enough to regenerate it."""

    opinfo: str
    variant: str
    dtype: str  # the dtype the OpInfo made its samples in
    mode: str  # 'forward', 'inplace' or 'backward'
    sample: int  # index in the OpInfo's sample order
    occurrence: int  # among the sample's calls of this overload with this signature


@dataclass(frozen=True, eq=False)  # holds tensors: compare fields explicitly
class SampleCall:
    """One ATen call recorded from an OpInfo sample: the op's example inputs and their origin
    (not ``capture.Captured``, a model's traced graph)."""

    op: str
    signature: str
    args: tuple
    kwargs: Mapping[str, Any]
    ref: SampleRef
    regenerable: bool = False  # regenerate(ref, seed) gives the same shapes with new values
    float64: bool = False  # the call also runs with its float32 tensors in float64


# --------------------------------------------------------------------------- recording


def _cacheable(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return x.layout == torch.strided and not x.is_quantized and x.device.type == "cpu" and not x.is_nested
    if isinstance(x, (list, tuple)):
        return all(_cacheable(y) for y in x)
    if isinstance(x, dict):
        return all(isinstance(k, str) and _cacheable(v) for k, v in x.items())
    return isinstance(x, _PLAIN)


def _snapshot(x: Any) -> Any:
    """A detached copy that later in-place calls cannot change."""
    if isinstance(x, torch.Tensor):
        return x.detach().resolve_conj().resolve_neg().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_snapshot(y) for y in x)
    return x


def _set(x: Any, gen: torch.Generator) -> Any:
    """``x`` with float tensors that are NaN throughout, what torch.empty gives under
    filled_memory, refilled from ``gen``: an output buffer the op overwrites (copy_'s self,
    rrelu_with_noise's noise) must still differ from shard to shard to tell dims apart."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and x.numel() and bool(torch.isnan(x).all()):
            return torch.randn(x.shape, generator=gen, dtype=x.dtype)
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_set(y, gen) for y in x)
    if isinstance(x, dict):
        return {k: _set(v, gen) for k, v in x.items()}
    return x


def _captured_values(args: tuple, kwargs: dict, seed: int) -> tuple[tuple, dict]:
    """A call's inputs, snapshotted, with unset buffers filled under ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return _set(_snapshot(tuple(args)), gen), _set({k: _snapshot(v) for k, v in kwargs.items()}, gen)


class _Recorder(TorchDispatchMode):
    """Hands every aten call to ``on_call(func, args, kwargs)`` before running it (in-place
    ops change their inputs); what that returns, if anything, is called once the call has
    succeeded, so calls that raise are never kept."""

    def __init__(self, on_call: Callable[[Any, tuple, dict], Callable[[], None] | None]):
        super().__init__()
        self.on_call = on_call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        commit = None
        if isinstance(func, torch._ops.OpOverload) and func.namespace == NAMESPACE:
            commit = self.on_call(func, args, kwargs)
        out = func(*args, **kwargs)
        if commit is not None:
            commit()
        return out


def call_signature(func, args: tuple, kwargs: Mapping[str, Any]) -> str:
    return signature(_OPS, positional_names(func), args, kwargs, exact_sizes(func))


def shapes_of(args: tuple, kwargs: Mapping[str, Any]) -> list[tuple[int, ...]]:
    """Every tensor's shape, in argument order (the core's pytree: torch's costs several
    times more, asked for every regenerated call)."""
    return [tuple(x.shape) for x in pytree.leaves((args, dict(kwargs)), _OPS.is_tensor)]


def _has_empty(args: tuple, kwargs: Mapping[str, Any]) -> bool:
    """Has the call an empty tensor (whose shards cannot differ)?"""
    return any(0 in shape for shape in shapes_of(args, kwargs))


def _kinds(args: tuple, kwargs: Mapping[str, Any]) -> str:
    out = []
    tree_map(lambda x: out.append(_OPS.dtype_kind(x)) if isinstance(x, torch.Tensor) else None, (list(args), dict(kwargs)))
    return "".join(out)


# --------------------------------------------------------------------------- OpInfo samples


def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db  # slow import: only when needed

    return op_db


@functools.lru_cache(maxsize=1)
def _opinfos() -> dict[tuple[str, str], Any]:
    return {(info.name, info.variant_test_name): info for info in _op_db()}


def _opinfo(name: str, variant: str):
    try:
        return _opinfos()[(name, variant)]
    except KeyError:
        raise KeyError(f"no OpInfo {name}.{variant}") from None


def _wants(info, mode: str, dtype: torch.dtype) -> bool:
    try:
        if mode == "backward":
            return info.supports_autograd and dtype in info.supported_backward_dtypes("cpu")
        if mode == "inplace" and info.inplace_variant is None:
            return False
        return dtype in info.supported_dtypes("cpu")
    except Exception:
        return False


@contextlib.contextmanager
def _outside_unittest():
    """OpInfo's sample_inputs looks for the unittest.TestCase running it on every call,
    with inspect.stack() (two calls, 60-130 ms here, most of an elementwise op's
    exploration). The samples must not depend on who calls (a sweep runs in no TestCase):
    the search answers None, as it does outside any test, without searching."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    saved = common_utils.extract_test_fn, core.extract_test_fn
    common_utils.extract_test_fn = core.extract_test_fn = lambda: None
    try:
        yield
    finally:
        common_utils.extract_test_fn, core.extract_test_fn = saved


def _sample_iter(info, mode: str, dtype: torch.dtype) -> Iterator:
    # set_seed=False: the OpInfo would otherwise reseed before every sample, and fresh
    # inputs need our own seed to reach the sample generator.
    with _outside_unittest():
        return iter(info.sample_inputs("cpu", dtype, requires_grad=(mode == "backward"), set_seed=False))


def _run_sample(info, mode: str, sample, recorder: _Recorder | CompositeRecorder) -> None:
    """Run one sample; the recorder sees the ATen calls of the pass's mode only."""
    if mode == "forward":
        with recorder:
            info(sample.input, *sample.args, **sample.kwargs)
    elif mode == "inplace":
        x = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, sample.input)
        with recorder:
            info.inplace_variant(x, *sample.args, **sample.kwargs)
    else:
        out = info(sample.input, *sample.args, **sample.kwargs)
        outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        if not outs:
            return
        grads = [torch.randn_like(t) for t in outs]  # seeded with the sample: regenerable
        with recorder:
            torch.autograd.backward(outs, grads)


@contextlib.contextmanager
def filled_memory():
    """Uninitialised memory filled (NaN, the largest integer) rather than left as it was:
    copy_, fill_ and bernoulli_ get their self from torch.empty, and garbage there made the
    samples' ranking (_low_entropy) differ from one build of the index to the next. Memory
    a kernel allocates for itself, which that setting does not reach, is filled too
    (``_junk_filled_allocations``)."""
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn only: no op refuses to run
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with _junk_filled_allocations():
            yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


# c10's own switch (a flag of its CPU allocator, "fill memory with deterministic junk when
# allocating on CPU"), which torch sets from no Python API: set here on libc10's symbol.
_JUNK_FILL_FLAG = "FLAGS_caffe2_cpu_allocator_do_junk_fill"


@functools.cache
def _junk_fill_flag() -> ctypes.c_bool | None:
    """libc10's junk-fill flag, or None in a build that does not export it."""
    for lib in sorted((Path(torch.__file__).parent / "lib").glob("libc10.*")):
        try:
            return ctypes.c_bool.in_dll(ctypes.CDLL(str(lib)), _JUNK_FILL_FLAG)
        except (OSError, ValueError):
            continue
    return None


@contextlib.contextmanager
def _junk_filled_allocations():
    """Every CPU allocation filled with the same bytes, not left as the heap had it. A
    kernel's own buffers that a sample reads unwritten (repeat's backward passing one to
    narrow, linalg.eig's backward to resolve_conj) held the heap's leftovers, so two builds
    of the index differed there, and so could the rules explored on those samples. Where
    the flag is missing the heap's bytes stay, as before."""
    flag = _junk_fill_flag()
    if flag is None:
        yield
        return
    before, flag.value = flag.value, True
    try:
        yield
    finally:
        flag.value = before


@contextlib.contextmanager
def _one_thread():
    """Samples computed on one thread: a parallel kernel's sums (softmax, fft) differ in the
    last bits with the thread count, and the index must not depend on the machine's cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _samples_of(info, mode: str, dtype: torch.dtype, seed: int, upto: int,
                scanned: int | None = None) -> Iterator[tuple[int, Any]]:
    """(index, sample) for the first ``upto`` samples, generated under ``seed``; with
    ``scanned``, samples with an empty tensor are yielded without counting toward ``upto``,
    among the first ``scanned``. Python's and numpy's generators are seeded too: some
    OpInfos draw scalars from them (huber_loss's delta, clamp's bounds), and an unseeded
    draw would change the registry run to run. Only the CPU generator is seeded, where
    samples are made: ``torch.manual_seed`` also queues a seeding of every lazy device
    (cuda, xpu, mtia) with its caller's formatted stack, ~1 ms and a queue entry per
    regenerated sample."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed)
    it = _sample_iter(info, mode, dtype)
    counted = 0
    for k in range(upto if scanned is None else scanned):
        if counted >= upto:
            return
        try:
            sample = next(it)
        except StopIteration:
            return
        counted += scanned is None or not _has_empty((sample.input, *sample.args), sample.kwargs)
        yield k, sample


@dataclass
class _Pool:
    """Candidate calls per overload, in discovery order."""

    by_op: dict[str, dict[str, SampleCall]] = field(default_factory=dict)
    per_kinds: dict[tuple[str, str], int] = field(default_factory=dict)

    def offer(self, func, args: tuple, kwargs: dict, ref_of: Callable[[str, str], SampleRef]) -> Callable[[], None] | None:
        """A commit that pools this call (snapshotted now), or None when it is not wanted."""
        if not _cacheable((args, kwargs)):
            return None
        name = op_name(func)
        sig = call_signature(func, args, kwargs)
        ref = ref_of(name, sig)  # counts occurrences even for calls already pooled
        seen = self.by_op.setdefault(name, {})
        key = (name, _kinds(args, kwargs))
        # calls with an empty tensor take no place from the others (unfold's empty batches
        # come first), and rank last when chosen
        counts = not _has_empty(args, kwargs)
        if sig in seen or counts and self.per_kinds.get(key, 0) >= MAX_CANDIDATES:
            return None
        call = SampleCall(name, sig, *_captured_values(args, kwargs, BASE_SEED), ref)

        def commit() -> None:
            if sig not in seen:
                self.per_kinds[key] = self.per_kinds.get(key, 0) + counts
                seen[sig] = call

        return commit


def _direct(c: SampleCall) -> bool:
    """Did the call come from the OpInfo written for this op (not from a composite's internals)?"""
    base = c.op.split(".")[1].strip("_")
    return c.ref.opinfo.split(".")[-1].strip("_") in (base, base.removeprefix("native_"))


def _float_leaves(tree: Any) -> list[torch.Tensor]:
    return [x for x in torch.utils._pytree.tree_leaves(tree) if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())]


def _low_entropy(args: tuple, kwargs: Mapping[str, Any]) -> bool:
    """A floating input with mostly repeated values (saturated, one-hot, constant): shards of
    it barely differ, so strategies cannot be told apart on it."""
    def distinct(x: torch.Tensor) -> int:
        flat = torch.view_as_real(x).flatten(-2) if x.is_complex() else x
        return torch.unique(flat.detach().reshape(-1)).numel()

    return any(x.numel() >= 4 and distinct(x) < x.numel() / 2 for x in _float_leaves((list(args), dict(kwargs))))


def _rank_key(c: SampleCall, discovered: int) -> tuple:
    """Non-empty, varied inputs with a few shardable (size > 1) dims, from the op's own
    OpInfo, first; beyond three such dims, more is not better (exotic high-rank calls),
    fewer size-1 dims is."""
    shapes = shapes_of(c.args, c.kwargs)
    richness = sum(1 for shape in shapes for size in shape if size > 1)
    ones = sum(1 for shape in shapes for size in shape if size == 1)
    return (any(0 in s for s in shapes), richness == 0, _low_entropy(c.args, c.kwargs), not _direct(c),
            -min(richness, 3), ones, discovered)


def _structure(c: SampleCall) -> str:
    """The tensor part of a signature: calls that differ only in non-tensor values share it."""
    return " ".join(part for part in c.signature.split(" ") if ":" in part)


def _arguments(c: SampleCall) -> str:
    """The non-tensor part of a signature (argmax's dim=1 beside its flattening dim=None)."""
    return " ".join(part for part in c.signature.split(" ") if ":" not in part)


def _spares(candidates: list[SampleCall], chosen: list[SampleCall], limit: int) -> list[SampleCall]:
    """Up to ``limit`` more signatures, for where ``chosen`` gives no strategy: new non-tensor
    arguments first (every argmax call the first pick holds flattens), then the rest, each
    part richest first."""
    ranked = [c for _, c in sorted(enumerate(candidates), key=lambda ic: _rank_key(ic[1], ic[0]))]
    taken = {c.signature for c in chosen}
    seen = {_arguments(c) for c in chosen}
    spares: list[SampleCall] = []
    for c in ranked:
        if c.signature not in taken and _arguments(c) not in seen:
            seen.add(_arguments(c))
            spares.append(c)
    spares += [c for c in ranked if c.signature not in taken and c not in spares]
    return spares[:limit]


def _choose(candidates: list[SampleCall], limit: int) -> list[SampleCall]:
    """Up to ``limit`` signatures, richest first, then variety: a new dtype-kind pattern, then
    a new tensor structure, then the rest in rank order. A call with an empty tensor brings
    no variety (its shards cannot differ): it comes in with the rest."""
    ranked = [c for _, c in sorted(enumerate(candidates), key=lambda ic: _rank_key(ic[1], ic[0]))]
    chosen: list[SampleCall] = ranked[:1]
    facets = (lambda c: _kinds(c.args, c.kwargs), _structure, lambda c: c.signature)
    for facet in facets:
        seen = {facet(c) for c in chosen}
        for c in ranked:
            if len(chosen) >= limit:
                return chosen
            if facet(c) not in seen and (facet is facets[-1] or not _has_empty(c.args, c.kwargs)):
                seen.add(facet(c))
                chosen.append(c)
    return chosen


def _recorder(composite: bool, on_call) -> _Recorder | CompositeRecorder:
    """The recorder of composite calls (within ``composite_kernels``) or of all others."""
    return CompositeRecorder(on_call) if composite else _Recorder(on_call)


def _composite_kernels_if(composite: bool):
    """What a composite recorder needs around it."""
    return composite_kernels() if composite else contextlib.nullcontext()


def _capture_pass(pool: _Pool | _EveryCall, mode: str, dtype: torch.dtype, opinfos: Collection[str] | None,
                  composite: bool) -> None:
    for info in _op_db():
        if opinfos is not None and info.name not in opinfos:
            continue
        if not _wants(info, mode, dtype):
            continue
        dname = str(dtype).removeprefix("torch.")
        try:
            for k, sample in _samples_of(info, mode, dtype, BASE_SEED, MAX_SAMPLES, MAX_SAMPLES_SCANNED):
                counts: dict[tuple[str, str], int] = {}

                def ref_of(name: str, sig: str, k=k, counts=counts) -> SampleRef:
                    n = counts.get((name, sig), 0)
                    counts[(name, sig)] = n + 1
                    return SampleRef(info.name, info.variant_test_name, dname, mode, k, n)

                try:
                    _run_sample(info, mode, sample, _recorder(composite, lambda f, a, kw: pool.offer(f, a, kw, ref_of)))
                except Exception:
                    pass  # calls recorded before the failure are still valid samples
        except Exception:
            continue  # the OpInfo's sample generator itself failed


def _regenerated_calls(ref: SampleRef, op: str, sig: str, seed: int) -> list[tuple[tuple, dict]]:
    """The calls of ``op`` with signature ``sig`` in the regenerated sample, in order."""
    info = _opinfo(ref.opinfo, ref.variant)
    dtype = getattr(torch, ref.dtype)
    found: list[tuple[tuple, dict]] = []

    def on_call(func, args, kwargs):
        if op_name(func) == op and _cacheable((args, kwargs)) and call_signature(func, args, kwargs) == sig:
            call = _captured_values(args, kwargs, seed)
            return lambda: found.append(call)
        return None

    composite = op in composite_names()
    with torch.random.fork_rng(devices=[]), quiet(), filled_memory(), _one_thread(), _composite_kernels_if(composite):
        for k, sample in _samples_of(info, ref.mode, dtype, seed, ref.sample + 1):
            if k == ref.sample:
                try:
                    _run_sample(info, ref.mode, sample, _recorder(composite, on_call))
                except Exception:
                    pass
    return found


# Regenerated calls kept per (sample, op, signature, seed), the most recently used: the
# overloads of one OpInfo (add.Tensor, add.out, add_.Tensor, explored one after another)
# regenerate the same calls under the same seeds, four in ten of a sweep's regenerations.
_REGENERATED: collections.OrderedDict[tuple, list[tuple[tuple, dict]]] = collections.OrderedDict()
REGENERATED_KEPT = 128


def _regenerated(ref: SampleRef, op: str, sig: str, seed: int) -> list[tuple[tuple, dict]]:
    """``_regenerated_calls``, kept (a pure function of its arguments: the sample is rebuilt
    under ``seed`` with every generator forked and seeded)."""
    key = (ref.opinfo, ref.variant, ref.dtype, ref.mode, ref.sample, op, sig, seed)
    calls = _REGENERATED.get(key)
    if calls is None:
        calls = _REGENERATED[key] = _regenerated_calls(ref, op, sig, seed)
        if len(_REGENERATED) > REGENERATED_KEPT:
            _REGENERATED.popitem(last=False)
    else:
        _REGENERATED.move_to_end(key)
    return calls


def regenerate(call: SampleCall, seed: int) -> tuple[tuple, dict] | None:
    """The same call rebuilt from its OpInfo sample under ``seed``; None if it cannot be.
    Its tensors are the caller's own (copies of those kept)."""
    calls = _regenerated(call.ref, call.op, call.signature, seed)
    want = shapes_of(call.args, call.kwargs)
    if call.ref.occurrence < len(calls) and shapes_of(*calls[call.ref.occurrence]) == want:
        found = calls[call.ref.occurrence]
    else:
        found = next((c for c in calls if shapes_of(*c) == want), None)
    if found is None:
        return None
    args, kwargs = found
    return _snapshot(args), {k: _snapshot(v) for k, v in kwargs.items()}


def _tensors_differ(a: tuple[tuple, dict], b: tuple[tuple, dict]) -> bool:
    xs = torch.utils._pytree.tree_leaves(a)
    ys = torch.utils._pytree.tree_leaves(b)
    return any(
        isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 0 and not torch.equal(x, y)
        for x, y in zip(xs, ys)
    )


def to_float64(tree: Any) -> Any:
    """float32 tensors cast to float64 (and complex64 to complex128); the rest unchanged."""
    def cast(x):
        if isinstance(x, torch.Tensor):
            if x.dtype == torch.float32:
                return x.to(torch.float64)
            if x.dtype == torch.complex64:
                return x.to(torch.complex128)
        return x

    return tree_map(cast, tree)


def runs_in_float64(func, args: tuple, kwargs: Mapping[str, Any]) -> bool:
    if not any(
        isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.complex64)
        for x in torch.utils._pytree.tree_leaves((list(args), dict(kwargs)))
    ):
        return False  # nothing to cast
    a64, k64 = to_float64((list(args), dict(kwargs)))
    try:
        with quiet():
            func(*a64, **k64)
        return True
    except Exception:
        return False


def _uniform_mask(x: Any) -> bool:
    """A bool tensor of one value throughout (a mask from ``isnan`` of finite data): every
    call on it takes one branch, so no rule's effect on the other is ever seen."""
    return isinstance(x, torch.Tensor) and x.dtype == torch.bool and x.numel() >= 2 and bool((x == x.flatten()[0]).all())


def _uniform_masks(args: tuple, kwargs: Mapping[str, Any]) -> bool:
    return any(_uniform_mask(x) for x in torch.utils._pytree.tree_leaves((list(args), dict(kwargs))))


def _random_mask(shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    mask = torch.rand(shape, generator=gen) < 0.5
    flat = mask.view(-1)
    flat[0], flat[1] = True, False  # both values, whatever the draw
    return mask


def with_varied_masks(func, args: tuple, kwargs: dict, probe=None) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with uniform bool masks drawn anew (seeded, both values), if
    the op takes them so; else as they are. For a user's example call, whose padding mask
    may be all False when the model is traced. ``probe`` runs the op's trial call (in a
    forked child, after the op crashed one); None: here."""
    if not _uniform_masks(args, kwargs):
        return args, kwargs
    gen = torch.Generator().manual_seed(BASE_SEED)
    varied = tree_map(lambda x: _random_mask(x.shape, gen) if _uniform_mask(x) else x, (list(args), dict(kwargs)))

    def trial() -> None:
        with quiet():
            func(*_snapshot(tuple(varied[0])), **_snapshot(varied[1]))

    try:
        trial() if probe is None else probe(trial)
    except Exception:
        return args, kwargs
    return tuple(varied[0]), varied[1]


def _varied(call: SampleCall, func, floats: bool, masks: bool) -> SampleCall | None:
    """The call with seeded new values where its own carry too little to tell strategies
    apart: every floating input (``floats``), uniform bool masks (``masks``). None if the
    op rejects it. Not regenerable: its sample's generator would only repeat the old values."""
    gen = torch.Generator().manual_seed(BASE_SEED)

    def refill(x):
        if floats and isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
            return torch.randn(x.shape, generator=gen, dtype=x.dtype)
        if masks and _uniform_mask(x):
            return _random_mask(x.shape, gen)
        return x

    args, kwargs = tree_map(refill, (list(call.args), dict(call.kwargs)))
    try:
        with quiet():
            func(*_snapshot(tuple(args)), **_snapshot(dict(kwargs)))
    except Exception:
        return None
    return SampleCall(call.op, call.signature, tuple(args), kwargs, call.ref, False,
                    runs_in_float64(func, tuple(args), kwargs))


def _finish(call: SampleCall, func) -> SampleCall:
    """Check regeneration (seed 1 must give the same shapes, other values) and float64.

    A call whose floating inputs are mostly repeated values (a composite's saturated
    intermediate) gets fresh normal values instead, and no regeneration. So does a uniform
    bool mask: rules verified on an all-False mask only (``index_put_`` of ``isnan``) held
    for the branch taken and not for the other.
    """
    floats, masks = _low_entropy(call.args, call.kwargs), _uniform_masks(call.args, call.kwargs)
    # masks and floats anew, else (an op that refuses a mask drawn at random) floats only
    for f, m in ((floats, True), (floats, False)) if masks else ((floats, False),):
        if (f or m) and (varied := _varied(call, func, f, m)) is not None:
            return varied
    fresh = regenerate(call, BASE_SEED + 1)
    regen = fresh is not None and (_tensors_differ(fresh, (call.args, dict(call.kwargs))) or not _float_leaves(
        (list(call.args), dict(call.kwargs))
    ))
    return SampleCall(call.op, call.signature, call.args, call.kwargs, call.ref, regen, runs_in_float64(func, call.args, call.kwargs))


def build_index(max_signatures: int = MAX_SIGNATURES, log: Callable[[str], None] | None = None,
                opinfos: Collection[str] | None = None) -> dict[str, tuple[SampleCall, ...]]:
    """Capture every OpInfo sample (or those of the OpInfos named in ``opinfos``) and keep
    up to ``max_signatures`` calls per overload, and ``RESERVE_SIGNATURES`` more after them."""
    from .catalog import resolve

    pool = _Pool()
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]), quiet(), filled_memory(), _one_thread():
        for composite in (False, True):
            with _composite_kernels_if(composite):
                for mode, dtype in PASSES:
                    _capture_pass(pool, mode, dtype, opinfos, composite)
                    if log:
                        found = sum(map(bool, pool.by_op.values()))
                        log(f"{'composite ' * composite}{mode} {dtype}: {found} overloads, {time.perf_counter() - start:.1f} s")
        index = {}
        for name in sorted(n for n, calls in pool.by_op.items() if calls):
            func = resolve(name)
            candidates = list(pool.by_op[name].values())
            chosen = _choose(candidates, max_signatures)
            chosen += _spares(candidates, chosen, RESERVE_SIGNATURES)
            index[name] = tuple(_finish(c, func) for c in chosen)
    if log:
        log(f"checked regeneration and float64: {time.perf_counter() - start:.1f} s")
    return index


@dataclass
class _EveryCall:
    """The calls of one overload, several per signature (distinct tensor shapes), in
    discovery order: the index keeps one call per signature."""

    op: str
    per_signature: int
    passed_over: Collection[tuple[str, tuple]] = ()  # (signature, shapes) of calls not wanted
    by_signature: dict[str, list[SampleCall]] = field(default_factory=dict)

    def offer(self, func, args: tuple, kwargs: dict, ref_of: Callable[[str, str], SampleRef]) -> Callable[[], None] | None:
        name = op_name(func)
        if name != self.op or not _cacheable((args, kwargs)):
            return None
        sig = call_signature(func, args, kwargs)
        ref = ref_of(name, sig)  # counts occurrences as regeneration does
        kept = self.by_signature.setdefault(sig, [])
        shapes = shapes_of(args, kwargs)
        if len(kept) >= self.per_signature or (sig, tuple(shapes)) in self.passed_over or any(
                shapes_of(c.args, c.kwargs) == shapes for c in kept):
            return None
        call = SampleCall(name, sig, *_captured_values(args, kwargs, BASE_SEED), ref)
        return lambda: kept.append(call) if len(kept) < self.per_signature else None


def calls_at_other_sizes(op: str, opinfos: Collection[str], per_signature: int,
                         explored: Sequence[SampleCall] = ()) -> list[SampleCall]:
    """Up to ``per_signature`` calls of ``op`` per signature, each at other tensor shapes
    than the others and than the ``explored`` calls, from the samples of the OpInfos named
    in ``opinfos`` (regenerable as the index's are). A rule is verified on one call of its
    signature and applied at every other: these are calls to check that on."""
    from .catalog import resolve

    func = resolve(op)
    pool = _EveryCall(op, per_signature, {(c.signature, tuple(shapes_of(c.args, c.kwargs))) for c in explored})
    composite = op in composite_names()
    with torch.random.fork_rng(devices=[]), quiet(), filled_memory(), _one_thread(), _composite_kernels_if(composite):
        for mode, dtype in PASSES:
            _capture_pass(pool, mode, dtype, opinfos, composite)
    return [_finish(c, func) for calls in pool.by_signature.values() for c in calls]


# --------------------------------------------------------------------------- disk cache
# The cache is loaded with torch.load(weights_only=True): plain containers, tensors and
# dtypes only. memory_format does not pickle, so it is stored by name.

_MEMORY_FORMATS = {str(f): f for f in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format)}
_MF_TAG = "__memory_format__"


def _encode(x: Any) -> Any:
    if isinstance(x, torch.memory_format):
        return [_MF_TAG, str(x)]
    if isinstance(x, tuple):
        return ("t", [_encode(y) for y in x])
    if isinstance(x, list):
        return ("l", [_encode(y) for y in x])
    if isinstance(x, dict):
        return ("d", {k: _encode(v) for k, v in x.items()})
    return x


def _decode(x: Any) -> Any:
    if isinstance(x, list) and len(x) == 2 and x[0] == _MF_TAG:
        return _MEMORY_FORMATS[x[1]]
    if isinstance(x, tuple) and len(x) == 2 and x[0] in ("t", "l", "d"):
        tag, body = x
        if tag == "t":
            return tuple(_decode(y) for y in body)
        if tag == "l":
            return [_decode(y) for y in body]
        return {k: _decode(v) for k, v in body.items()}
    return x


def _encode_index(index: Mapping[str, tuple[SampleCall, ...]]) -> dict:
    return {
        op: [
            {
                "signature": c.signature, "args": _encode(tuple(c.args)), "kwargs": _encode(dict(c.kwargs)),
                "ref": [c.ref.opinfo, c.ref.variant, c.ref.dtype, c.ref.mode, c.ref.sample, c.ref.occurrence],
                "regenerable": c.regenerable, "float64": c.float64,
            }
            for c in calls
        ]
        for op, calls in index.items()
    }


def _decode_index(raw: Mapping) -> dict[str, tuple[SampleCall, ...]]:
    return {
        op: tuple(
            SampleCall(op, c["signature"], _decode(c["args"]), _decode(c["kwargs"]), SampleRef(*c["ref"]), c["regenerable"], c["float64"])
            for c in calls
        )
        for op, calls in raw.items()
    }


def cache_path(cache_dir: Path | None = None, max_signatures: int = MAX_SIGNATURES) -> Path:
    version = torch.__version__.replace("+", "_")
    return Path(cache_dir or default_cache_dir()) / f"torch-{version}-opinfo-v{FORMAT_VERSION}-k{max_signatures}.pt"


def load_index(cache_dir: Path | None = None, max_signatures: int = MAX_SIGNATURES, rebuild: bool = False,
               log: Callable[[str], None] | None = None) -> dict[str, tuple[SampleCall, ...]]:
    """The cached index, building it first when missing or unreadable (one builder at a time).
    A build says so on stderr once: it takes a minute or more, and nothing else prints."""
    path = cache_path(cache_dir, max_signatures)
    if path.is_dir():  # the rename would fail only after the minute-long build
        raise IsADirectoryError(_unwritable(path, "it is a directory"))

    def cached() -> dict[str, tuple[SampleCall, ...]] | None:
        if rebuild or not path.exists():
            return None
        try:
            if not path.is_file():  # a FIFO would block the read, a device fill memory
                raise OSError("not a regular file")
            return read_index(path)
        except Exception as e:  # noqa: BLE001 - truncated, corrupt, an older format, not an index: build it again
            print(f"metaspmd: the sample index {path} is unreadable ({type(e).__name__}: {str(e)[:200]}); "
                  "rebuilding it", file=sys.stderr, flush=True)
            return None

    def building(where: str) -> None:
        print(f"metaspmd: building the OpInfo sample index {where} (once per torch version; a minute or more)",
              file=sys.stderr, flush=True)

    index = cached()
    if index is not None:
        return index
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "w")
    except OSError:  # no writable cache: build for this process only
        building(f"in memory ({path.parent} is not writable)")
        return build_index(max_signatures, log)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent workers wait for the first builder
        index = cached()  # another process may have built it meanwhile
        if index is not None:
            return index
        building(str(path))
        if not reproducible.in_effect():  # the samples would be this process's own
            _build_in_child(path, max_signatures, log)
            return read_index(path)
        index = build_index(max_signatures, log)
        write_index(path, index)
    return index


# The child imports the code its parent runs: metaspmd from the parent's folder first, and
# metaspmd.cli, which maps metaspmd.backends to the checkout's own (a clone's tools beside
# another checkout installed editable); Ctrl-C ends it quietly, the parent says so.
_BUILD = ("import sys; sys.path.insert(0, sys.argv[3]); import metaspmd.cli\n"
          "from metaspmd.backends.torch import samples as s\n"
          "try: s.write_index(s.Path(sys.argv[1]), s.build_index(int(sys.argv[2]), lambda m: print(m, flush=True)))\n"
          "except KeyboardInterrupt: sys.exit(130)")


def _build_in_child(path: Path, max_signatures: int, log: Callable[[str], None] | None) -> None:
    """Build and write the index in a process started with ``reproducible.ENV``, on this
    process's code."""
    import metaspmd

    root = str(Path(metaspmd.__file__).resolve().parent.parent)
    with subprocess.Popen([sys.executable, "-c", _BUILD, str(path), str(max_signatures), root],
                          env=reproducible.child_env(), stdout=subprocess.PIPE, text=True) as child:
        for line in child.stdout:
            if log:
                log(line.rstrip("\n"))
    if child.returncode:
        raise RuntimeError(f"building the sample index {path} failed (exit status {child.returncode})")


def _unwritable(path: Path, why: str) -> str:
    return (f"cannot write the sample index {path} ({why}); remove that path, or set METASPMD_CACHE_DIR "
            "to another directory")


def write_index(path: Path, index: Mapping[str, tuple[SampleCall, ...]]) -> None:
    """Atomic write: readers never see half a file, and a failed write leaves no temporary one."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    raw = _encode_index(index)
    try:
        torch.save(raw, tmp)
        os.replace(tmp, path)
    except Exception as e:  # not only OSError: torch.save reports a full disk as RuntimeError
        raise OSError(_unwritable(path, f"{type(e).__name__}: {e}")) from e
    finally:
        tmp.unlink(missing_ok=True)  # gone after the rename; else a 12 MB leftover per failed build


_CALL_KEYS = frozenset({"signature", "args", "kwargs", "ref", "regenerable", "float64"})  # _encode_index's


def _check_raw(raw: Any) -> None:
    """Raise ValueError unless ``raw`` has the shape ``_encode_index`` gives a built index:
    a non-empty dict, each overload a non-empty list of calls. A file that loads but holds
    anything else (``{}``) would give a sweep no samples: ``--check`` would report rules lost
    and a sweep would write a registry with fewer."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"holds {'an empty dict' if isinstance(raw, dict) else 'a ' + type(raw).__name__}, "
                         "not a dict of overloads")
    for op, calls in raw.items():
        if not (isinstance(op, str) and isinstance(calls, list) and calls
                and all(isinstance(c, dict) and c.keys() == _CALL_KEYS for c in calls)):
            raise ValueError(f"its entry {str(op)[:80]!r} is not a non-empty list of calls "
                             f"with keys {sorted(_CALL_KEYS)}")


def read_index(path: Path) -> dict[str, tuple[SampleCall, ...]]:
    """The index in ``path``; ValueError for a file that loads but is no index ``write_index`` wrote."""
    raw = torch.load(path, weights_only=True)
    _check_raw(raw)
    return _decode_index(raw)


__all__ = [
    "BASE_SEED", "MAX_SIGNATURES", "RESERVE_SIGNATURES", "SampleCall", "SampleRef", "build_index", "cache_path",
    "call_signature", "default_cache_dir", "load_index", "read_index", "regenerate", "to_float64", "write_index",
]
