"""Samples built from an op's schema, for the overloads no OpInfo reaches: every required
argument filled from its schema type and name, trying a few tensor shapes and layouts;
the first call that runs (on the explorer's fresh seeds too) is the sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from . import catalog, dense_cpu, hand_samples
from .hand_samples import HandGuess
from .samples import BASE_SEED, FRESH_SEEDS, call_signature, quiet, shapes_of


SHAPE_GUESSES = ((4, 6), (3, 4, 5), (6,), (2, 3, 4, 5), (2, 3, 4, 5, 6), ())
# Tried only once every guess above has failed, so an op that runs under one keeps its
# sample: square matrices (linalg, mm of one shape), Optional arguments filled (clamp with
# min and max both None fails; eval batch norm needs running stats), and the tensors after
# the first 0-d (a learning rate, a step count, foreach's scalar operand).
SQUARE_SHAPES = ((2, 4, 4), (4, 4))  # batched first: its batch dim can be cut
# Per-channel vectors (batch norm statistics, affine parameters) have the channel dim's size.
_CHANNEL_NAMES = frozenset({
    "weight", "bias", "running_mean", "running_var", "save_mean", "save_var", "save_invstd", "mean",
    "invstd", "var",
})
_COUNT_INTS = frozenset({"n", "k", "chunks", "sections", "split_size", "repeats", "steps", "window_length", "size", "length"})
# a fake quantizer's range: with both ends 1 every input quantizes to one level, an output
# that no data can vary
_QUANT_RANGE = {"quant_min": 0, "quant_max": 255}
# a per-tensor quantizer's parameters and observed range: one element each (a longer one is
# read at [0], a 0-d one refused)
_QUANT_PARAMS = frozenset({"scale", "zero_point", "running_min", "running_max"})
# flags an op reads or writes as 0 or 1 (a fake quantizer's switches, AMP's found_inf): 1 in
# the example, so a quantizer's rules are explored on its quantizing path, and drawn from
# {0, 1} on the other seeds, so they hold on both paths (random floats truncate to 0 on most
# draws, and a found_inf above 1 is no flag)
_FLAGS = frozenset({"observer_on", "fake_quant_on", "fake_quant_enabled", "found_inf"})
_UNSUPPORTED = frozenset({"Storage", "Stream", "Dimname", "List[Dimname]", "Optional[List[Dimname]]"})
# With scalar_tensors: tensor lists of one number per tensor (an optimizer's step counts) are
# 0-d, foreach's packed scalars hold one per list element, and an optimizer's amsgrad is on
# (off, it requires max_exp_avg_sqs empty, where the filler fills every list)
_SCALAR_LISTS = frozenset({"state_steps"})
# arguments the op asks to be ascending along their last dim (searchsorted's, bucketize's):
# unsorted data would verify rules outside the op's contract
_SORTED_NAMES = frozenset({"sorted_sequence", "boundaries"})
_PACKED_SCALARS = frozenset({"scalars"})
_TRUE_BOOLS = frozenset({"amsgrad"})


@dataclass(frozen=True)
class SchemaGuess:
    """How a schema-built sample fills its tensors: enough to rebuild it with another seed."""

    shape: tuple[int, ...]
    channel_vectors: bool  # per-channel tensors are 1-D
    flat_index: bool  # index tensors are 1-D
    dtype: str  # data tensors' dtype
    optionals: bool = False  # Optional arguments filled, not None
    scalar_tensors: bool = False  # tensors after the first are 0-d


def _is_index_name(name: str) -> bool:
    return "index" in name or "indices" in name or name in ("target", "targets", "labels", "offsets")


class _Filler:
    """Builds one argument value from its schema type and name, under one guess."""

    def __init__(self, func, guess: SchemaGuess, seed: int):
        self.func, self.guess = func, guess
        self.gen = torch.Generator().manual_seed(seed)
        self.example = seed == BASE_SEED
        self.base = func._schema.name.split("::")[1]
        spatial = max(len(guess.shape) - 2, 1)
        self.spatial = spatial if any(k in self.base for k in ("conv", "pool", "upsample", "im2col", "col2im", "reflection", "replication", "pad")) else 1
        self.tensors_made = 0

    def data(self, shape) -> torch.Tensor:
        dtype = getattr(torch, self.guess.dtype)
        if dtype.is_floating_point:
            return torch.randn(shape, generator=self.gen, dtype=dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=self.gen).to(torch.bool)
        return torch.randint(-9, 10, shape, generator=self.gen, dtype=dtype)

    def index(self) -> torch.Tensor:
        high = min(self.guess.shape) if self.guess.shape else 1
        shape = (3,) if self.guess.flat_index else self.guess.shape
        return torch.randint(0, high, shape, generator=self.gen, dtype=torch.int64)

    def tensor(self, name: str, listed: bool = False) -> torch.Tensor:
        shape = self.guess.shape
        self.tensors_made += 1
        if self.guess.scalar_tensors and (name in _SCALAR_LISTS if listed else self.tensors_made > 1):
            shape = (2,) if name in _PACKED_SCALARS else ()
        if name == "offsets":
            return torch.tensor([0, 2], dtype=torch.int64)
        if _is_index_name(name):
            return self.index()
        if "mask" in name:
            return torch.randint(0, 2, shape, generator=self.gen).to(torch.bool)
        if name in _SORTED_NAMES and shape:
            return self.data(shape).sort(dim=-1).values
        if name in _FLAGS:
            on = self.example or bool(torch.randint(0, 2, (), generator=self.gen))
            return torch.full(shape, float(on), dtype=getattr(torch, self.guess.dtype))
        if name in _QUANT_PARAMS and ("per_tensor" in self.base or "moving_avg_obs" in self.base):
            shape = (1,)
        if self.guess.channel_vectors and name in _CHANNEL_NAMES and len(shape) >= 2:
            t = self.data((shape[1],))
            return t.abs() + 0.5 if "var" in name or "std" in name else t
        return self.data(shape)

    def int_list(self, name: str, n: int | None) -> list[int]:
        shape = self.guess.shape
        k = n or self.spatial
        if name in ("size", "shape", "sizes", "input_size", "input_sizes", "normalized_shape"):
            return list(shape[-1:]) if name == "normalized_shape" else list(shape)
        if name == "stride" and self.spatial == 1 and "pool" not in self.base and "conv" not in self.base:
            return list(torch.empty(shape).stride()) if shape else []
        if name in ("dim", "dims"):
            return [0]
        if name in ("kernel_size", "output_size"):
            return [2] * k
        if name in ("padding", "output_padding", "pad"):
            return [0] * (n or (2 * k if name == "pad" else k))
        if name == "repeats":
            return [1] * len(shape)
        if name in ("split_size", "split_sizes") and shape and shape[0] > 1:
            return [1, shape[0] - 1]  # pieces of dim 0 (the default dim), which they must sum to
        return [1] * k

    def scalar_int(self, name: str) -> int:
        if name in ("dim", "axis", "dim0", "start_dim", "dimension", "index"):
            return 0
        if name in ("dim1",):
            return 1
        if name in ("end_dim",):
            return -1
        if name in _COUNT_INTS:
            return 2
        if name in _QUANT_RANGE:
            return _QUANT_RANGE[name]
        return 1

    def value(self, arg) -> Any:
        t, name = str(arg.real_type), arg.name
        if t in _UNSUPPORTED or "torch.classes" in t or name in ("filename", "path"):
            raise TypeError(f"cannot build a {t} argument")
        if t.startswith("Optional["):
            if self.guess.optionals:
                try:
                    return self.value_of(t[len("Optional["):-1], arg)
                except TypeError:
                    return None
            if name not in ("output_size", "dim"):
                return None
            # upsample .vec overloads need output_size or scales; a reduction over dim 0
            # (var.dim) leaves the other dims to cut, where None would reduce them all
            t = t[len("Optional["):-1]
        return self.value_of(t, arg)

    def value_of(self, t: str, arg) -> Any:
        name = arg.name
        if t == "Tensor":
            return self.tensor(name)
        if t == "List[Tensor]":
            return [self.tensor(name, listed=True), self.tensor(name, listed=True)]
        if t == "List[Optional[Tensor]]":
            return [torch.randint(0, min(self.guess.shape or (1,)), (3,), generator=self.gen, dtype=torch.int64)]
        if t == "int":
            return self.scalar_int(name)
        if t == "List[int]":
            return self.int_list(name, arg.N)
        if t == "float":
            return 1e-5 if "eps" in name else 0.5
        if t == "number":
            if self.guess.optionals and name in ("min", "max"):  # clamp's bounds, filled apart
                return -0.5 if name == "min" else 0.5
            return 2
        if t == "List[number]":
            return [2, 2]
        if t == "List[float]":
            return [0.5] * (arg.N or 1)
        if t == "bool":
            return self.guess.scalar_tensors and name in _TRUE_BOOLS
        if t == "List[bool]":
            return [True] * (arg.N or 3)
        if t == "str":
            return "sum"
        if t == "ScalarType":
            return torch.float32
        if t == "Layout":
            return torch.strided
        if t == "Device":
            return torch.device("cpu")
        if t == "MemoryFormat":
            return torch.contiguous_format
        raise TypeError(f"cannot build a {t} argument")


def schema_inputs(func, guess: SchemaGuess | HandGuess, seed: int) -> tuple[tuple, dict]:
    """Required arguments of ``func`` filled under ``guess``: positional ones up to the first
    default, the rest by keyword. Out arguments are left to the caller. A hand-written
    sample (``HandGuess``) is its builder's call."""
    if isinstance(guess, HandGuess):
        return hand_samples.inputs(func, guess, seed)
    filler = _Filler(func, guess, seed)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True
    for arg in func._schema.arguments:
        if arg.is_out:
            continue
        if arg.has_default_value():
            positional = False
            if guess.optionals and arg.default_value is None and str(arg.real_type).startswith("Optional["):
                value = filler.value(arg)
                if value is not None:
                    kwargs[arg.name] = value
            continue
        value = filler.value(arg)
        if positional and not arg.kwarg_only:
            args.append(value)
        else:
            positional = False
            kwargs[arg.name] = value
    return tuple(args), kwargs


def schema_guesses() -> Iterator[SchemaGuess]:
    first = [(shape, False, False) for shape in SHAPE_GUESSES]
    then = [(shape, optionals, scalars) for optionals, scalars in ((False, False), (True, False), (False, True), (True, True))
            for shape in SHAPE_GUESSES + SQUARE_SHAPES]
    for shape, optionals, scalars in first + [g for g in then if g not in first]:
        # float64 (float_power_ writes a double into its input) and bool (_is_all_true) last
        dtypes = ("float32", "int64") if (shape, optionals, scalars) in first else ("float32", "int64", "float64", "bool")
        for channel_vectors in (False, True):
            for flat_index in (False, True):
                for dtype in dtypes:
                    yield SchemaGuess(shape, channel_vectors, flat_index, dtype, optionals, scalars)


def runs_on_fresh_inputs(run: Callable[[tuple, dict], Any], func, guess: SchemaGuess | HandGuess) -> None:
    """Raises unless ``run`` accepts the guess's inputs for every seed the explorer draws its
    fresh trials with: the values decide some ops' checks (quantile's q in [0, 1], a
    repeat count not negative), and a guess that ran once by chance is no sample."""
    for seed in range(BASE_SEED + 1, BASE_SEED + FRESH_SEEDS + 1):
        run(*schema_inputs(func, guess, seed))


def _error_text(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def _hand_sample(run: Callable[[tuple, dict], Any], func) -> tuple[HandGuess | None, str]:
    """The op's hand-written sample if it has one and ``run`` accepts it on every seed; else
    None and why not ('' when no builder is written for it)."""
    guess = hand_samples.guess_for(func)
    if guess is None:
        return None, ""
    try:
        with quiet():
            run(*schema_inputs(func, guess, BASE_SEED))
            runs_on_fresh_inputs(run, func, guess)
    except Exception as e:  # noqa: BLE001 - the op's own error, reported if no guess runs either
        return None, "hand-written sample: " + _error_text(e)
    return guess, ""


def find_schema_sample(run: Callable[[tuple, dict], Any], func) -> tuple[SchemaGuess | HandGuess | None, str]:
    """The op's hand-written sample (``hand_samples``) if it runs, else the first guess whose
    inputs ``run`` accepts, and the last error otherwise: for an op that does not run on
    dense CPU tensors (``dense_cpu``), why not.

    ``run(args, kwargs)`` calls the op (wrapped for in-place and out overloads); a guess
    whose inputs are identical to an earlier failed one is not retried. A guess of 0-d
    tensors only is taken last: it leaves no dim to cut, where a later guess may run with
    data of some length beside 0-d operands (a foreach op's scalar tensor, an optimizer's
    learning rate, AMP's found_inf).
    """
    hand, hand_error = _hand_sample(run, func)
    if hand is not None:
        return hand, ""
    guess, error = _guessed_sample(run, func)
    if guess is not None:
        return guess, ""
    not_dense = dense_cpu.reason(catalog.op_name(func)) if func.namespace == catalog.NAMESPACE else None
    if not_dense:
        return None, f"the op does not run on dense CPU tensors: {not_dense}"
    return None, hand_error or error


def _guessed_sample(run: Callable[[tuple, dict], Any], func) -> tuple[SchemaGuess | None, str]:
    error, tried, scalars_only = "", set(), None
    for guess in schema_guesses():
        if scalars_only is not None and not guess.shape:
            continue
        try:
            args, kwargs = schema_inputs(func, guess, BASE_SEED)
        except TypeError as e:
            return None, str(e)
        key = call_signature(func, args, kwargs) + repr(shapes_of(args, kwargs))
        if key in tried:
            continue
        tried.add(key)
        try:
            with quiet():
                run(args, kwargs)
                runs_on_fresh_inputs(run, func, guess)
        except Exception as e:  # the first guess's error is the most telling one
            error = error or _error_text(e)
            if isinstance(e, NotImplementedError) and str(e).startswith("Could not run"):
                break  # no CPU kernel: no other strided tensor reaches one either
            continue
        if guess.shape:
            return guess, ""
        scalars_only = guess
    return (scalars_only, "") if scalars_only is not None else (None, error or "no guess")
