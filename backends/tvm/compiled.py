"""Building a registered kernel: validate its TE graph, compile it once with symbolic
shapes, and wrap the destination-passing function as ``out = kernel(*inputs)``.

The explorer runs a kernel on shards of many sizes, so every input dim that can be
sharded must be a symbolic ``te.var``; the output buffers are sized at call time by
evaluating the output shape expressions with the vars bound from the actual inputs.
"""

from __future__ import annotations

import functools
import inspect
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
import tvm
from tvm import te, tirx
from tvm.sym import Analyzer

from metaspmd.case import OutOfMemory, out_of_memory
from .registry import KernelError, KernelSpec, Params

TARGET = "llvm"


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}".strip()


# --------------------------------------------------------------------------- graph checks


def _name(t: te.Tensor) -> str:
    # TVM hands out its own str subclass; plain str keeps YAML dumps and dict keys simple
    return str(t.op.name)


# The operations te.create_prim_func lowers (TVM 0.27); a te.scan reaches it as a ScanOp,
# whose state placeholder would otherwise be reported as a missing input.
_LOWERED = (te.PlaceholderOp, te.ComputeOp, te.ExternOp)


def _placeholders_read(op: str, outputs: list[te.Tensor]) -> list[te.Tensor]:
    """Every placeholder the outputs depend on, in first-reached order; refuses an operation
    the build cannot lower, naming it."""
    seen, found, stack = set(), [], list(reversed(outputs))
    while stack:
        t = stack.pop()
        if not isinstance(t.op, _LOWERED):
            raise KernelError(
                op, f"{_name(t)!r} is a {type(t.op).__name__}, which te.create_prim_func cannot lower "
                "(it takes te.placeholder, te.compute and te.extern): write it with te.compute",
            )
        if isinstance(t.op, te.PlaceholderOp):
            if not any(p.same_as(t) for p in found):
                found.append(t)
            continue
        key = t.op, t.value_index  # TVM objects hash by handle; id() of a wrapper is not stable
        if key in seen:
            continue
        seen.add(key)
        stack.extend(reversed(list(t.op.input_tensors)))
    return found


def _split_result(op: str, result: Any) -> tuple[list[te.Tensor], list[te.Tensor]]:
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise KernelError(op, "the builder must return (inputs, output) or (inputs, [outputs])")
    inputs, outputs = result
    if isinstance(outputs, te.Tensor):
        outputs = [outputs]
    if not isinstance(inputs, (list, tuple)) or not all(isinstance(t, te.Tensor) for t in inputs):
        raise KernelError(op, "inputs must be a list of te.placeholder tensors")
    if not outputs or not isinstance(outputs, (list, tuple)) or not all(isinstance(t, te.Tensor) for t in outputs):
        raise KernelError(op, "the output must be a te.Tensor or a non-empty list of them")
    for t in inputs:
        if not isinstance(t.op, te.PlaceholderOp):
            raise KernelError(op, f"input {_name(t)!r} is not a te.placeholder")
    for t in outputs:
        if isinstance(t.op, te.PlaceholderOp):
            raise KernelError(op, f"output {_name(t)!r} is a placeholder, not a compute")
    return list(inputs), list(outputs)


def _check_arity(op: str, inputs: list[te.Tensor], outputs: list[te.Tensor]) -> None:
    names = [_name(t) for t in inputs]
    if len(set(names)) != len(names):
        raise KernelError(op, f"input names must be unique (they name the arguments): {names}")
    read = _placeholders_read(op, outputs)
    missing = [_name(t) for t in read if not any(t.same_as(i) for i in inputs)]
    unused = [_name(i) for i in inputs if not any(i.same_as(t) for t in read)]
    if missing:
        raise KernelError(op, f"wrong arity: the compute reads placeholder(s) {missing} not among the inputs {names}")
    if unused:
        raise KernelError(op, f"wrong arity: input(s) {unused} are not read by the compute")


def _input_vars(op: str, inputs: list[te.Tensor]) -> dict[str, tirx.Var]:
    """Symbolic vars of the input shapes by name; rejects fixed dims that could be sharded."""
    by_name: dict[str, tirx.Var] = {}
    for t in inputs:
        for d, s in enumerate(t.shape):
            if isinstance(s, tirx.IntImm):
                if int(s) > 1:
                    raise KernelError(
                        op, f"input {_name(t)!r} dim {d} has fixed size {int(s)}: a dim that can be sharded "
                        "must be a symbolic te.var, so the kernel runs on shards of any size",
                    )
            elif isinstance(s, tirx.Var):
                other = by_name.setdefault(s.name, s)
                if not other.same_as(s):
                    raise KernelError(op, f"two different symbolic vars are named {s.name!r}")
            else:
                raise KernelError(op, f"input {_name(t)!r} dim {d} is the expression {s}: use a te.var (or 1)")
    return by_name


# --------------------------------------------------------------------------- the kernel


@dataclass(frozen=True)
class CompiledKernel:
    """One built variant of a kernel: ``kernel(*inputs)`` returns its output(s)."""

    op: str
    params: Params
    inputs: tuple[te.Tensor, ...]
    outputs: tuple[te.Tensor, ...]
    variables: Mapping[str, tirx.Var]
    func: Any  # the compiled destination-passing function

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(_name(t) for t in self.inputs)

    def input_dtype(self, i: int) -> str:
        return str(self.inputs[i].dtype)

    def input_shape(self, i: int, sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(sizes[s.name] if isinstance(s, tirx.Var) else int(s) for s in self.inputs[i].shape)

    def var_dims(self, i: int, names: Iterable[str]) -> list[int]:
        """The dims of input ``i`` that one of the symbolic vars ``names`` sizes."""
        names = set(names)
        return [d for d, s in enumerate(self.inputs[i].shape) if isinstance(s, tirx.Var) and s.name in names]

    def bind(self, tensors: tuple) -> dict[str, int]:
        """Var sizes from the actual input shapes; a conflict is an error naming the kernel."""
        if len(tensors) != len(self.inputs):
            raise TypeError(f"kernel {self.op} takes {len(self.inputs)} inputs {list(self.input_names)}, "
                            f"got {len(tensors)}")
        sizes: dict[str, int] = {}
        for t, p in zip(tensors, self.inputs):
            where = f"kernel {self.op}: input {_name(p)!r}"
            if not isinstance(t, tvm.runtime.Tensor):
                raise TypeError(f"{where} must be a tvm.runtime.Tensor, got {type(t).__name__}")
            if str(t.dtype) != str(p.dtype):
                raise TypeError(f"{where} must be {p.dtype}, got {t.dtype}")
            if len(t.shape) != len(p.shape):
                raise ValueError(f"{where} must have rank {len(p.shape)}, got shape {tuple(t.shape)}")
            for d, (actual, s) in enumerate(zip(t.shape, p.shape)):
                want = sizes.setdefault(s.name, int(actual)) if isinstance(s, tirx.Var) else int(s)
                if int(actual) != want:
                    name = s.name if isinstance(s, tirx.Var) else "the fixed size"
                    raise ValueError(f"{where} dim {d} is {int(actual)}, but {name} is {want}")
        return sizes

    def output_shapes(self, sizes: Mapping[str, int]) -> list[tuple[int, ...]]:
        analyzer = Analyzer()
        for name, value in sizes.items():
            analyzer.bind(self.variables[name], value)
        shapes = []
        for out in self.outputs:
            dims = []
            for s in out.shape:
                value = analyzer.simplify(s)
                if not isinstance(value, tirx.IntImm):
                    raise ValueError(f"kernel {self.op}: output dim {s} does not follow from the input shapes")
                if int(value) < 0:
                    raise ValueError(f"kernel {self.op}: output dim {s} is negative ({int(value)}) for sizes {sizes}")
                dims.append(int(value))
            shapes.append(tuple(dims))
        return shapes

    def __call__(self, *tensors: tvm.runtime.Tensor) -> Any:
        shapes = self.output_shapes(self.bind(tensors))
        outs = [tvm.runtime.empty(shape, str(o.dtype)) for shape, o in zip(shapes, self.outputs)]
        self.func(*(_canaried(t) for t in tensors), *outs)
        return outs[0] if len(outs) == 1 else tuple(outs)


# Elements after each input, which a kernel reading past its end (``x[i + 1]`` up to n) reads
# instead of whatever memory follows: values drawn from the input's own bytes, so that a
# shard's read and the whole input's differ (no rule holds by the heap's luck, or by the
# zeros it often holds) and a second call on the same input reads the same (a sweep is
# reproducible). Reads before the start are not covered: the compiled function takes no
# input that begins inside its buffer.
CANARY_ELEMENTS = 64


def _canaried(t: tvm.runtime.Tensor) -> tvm.runtime.Tensor:
    data = t.numpy()
    rng = np.random.default_rng(zlib.crc32(data.tobytes()) ^ zlib.crc32(str(data.shape).encode()))
    if data.dtype == np.bool_:
        tail = rng.random(CANARY_ELEMENTS) < 0.5
    elif np.issubdtype(data.dtype, np.integer):
        info = np.iinfo(data.dtype)
        tail = rng.integers(max(info.min, -1000), min(info.max, 1000), CANARY_ELEMENTS, endpoint=True)
    else:
        tail = rng.standard_normal(CANARY_ELEMENTS) * 1e3
    buffer = tvm.runtime.tensor(np.concatenate([data.ravel(), tail.astype(data.dtype)]))
    return buffer._create_view(tuple(data.shape), str(t.dtype))


def _call_builder(spec: KernelSpec, params: Params) -> Any:
    try:
        inspect.signature(spec.builder).bind(**dict(params))
    except TypeError as e:
        raise KernelError(spec.op, f"the builder does not take the variant arguments {dict(params)}: {e}") from None
    try:
        return spec.builder(**dict(params))
    except KernelError:
        raise
    except Exception as e:
        _raise_if_out_of_memory(spec.op, "building", e)
        raise KernelError(spec.op, f"the builder raised {_first_line(e)}") from e


def _raise_if_out_of_memory(op: str, stage: str, e: Exception) -> None:
    """An allocation that failed is the machine's limit, not the kernel's fault: a sweep
    keeps the kernel's previous file (OutOfMemory), as for a run of the op."""
    if out_of_memory(e):
        raise OutOfMemory(f"{op}: {stage} the kernel failed to allocate memory: {_first_line(e)}") from e


def build_kernel(spec: KernelSpec, params: Params = ()) -> CompiledKernel:
    """Build, check and compile one variant of ``spec`` (cached per process)."""
    return _build(spec, params, _typed(params))


def _typed(value: Any) -> Any:
    """``value`` with each leaf's type beside it: variants {"scale": 2} and {"scale": 2.0}
    (or 1 and True) are equal and hash alike, so a plain cache gave the second the first's
    kernel."""
    if isinstance(value, tuple):
        return tuple(_typed(v) for v in value)
    return type(value).__qualname__, value


@functools.lru_cache(maxsize=None)
def _build(spec: KernelSpec, params: Params, typed: Any) -> CompiledKernel:
    inputs, outputs = _split_result(spec.op, _call_builder(spec, params))
    _check_arity(spec.op, inputs, outputs)
    variables = _input_vars(spec.op, inputs)
    example = dict(spec.example)
    unbound = sorted(set(variables) - set(example))
    if unbound:
        raise KernelError(spec.op, f"the example gives no size for symbolic var(s) {unbound}")
    analyzer = Analyzer()
    for name, var in variables.items():
        analyzer.bind(var, example[name])
    for out in outputs:
        for s in out.shape:
            if not isinstance(analyzer.simplify(s), tirx.IntImm):
                raise KernelError(spec.op, f"output {_name(out)!r} dim {s} does not follow from the input shapes")
    try:
        func = te.create_prim_func([*inputs, *outputs])
        compiled = tvm.compile(tvm.IRModule({"main": func}), target=TARGET)
    except Exception as e:
        _raise_if_out_of_memory(spec.op, "compiling", e)
        raise KernelError(spec.op, f"build failed: {_first_line(e)}") from e
    return CompiledKernel(spec.op, params, tuple(inputs), tuple(outputs), variables, compiled)


__all__ = ["CompiledKernel", "TARGET", "build_kernel"]
