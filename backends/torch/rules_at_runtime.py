"""Rules for captured torch nodes: table lookup on recorded values, live cases on a miss."""

from __future__ import annotations

from typing import Callable

import torch

from metaspmd.case import OpCase
from metaspmd.fingerprint import code_fingerprint
from metaspmd.ir import MetaOp
from metaspmd.isolation import Isolation, can_fork
from metaspmd.explorer.common import example_value
from metaspmd.resolve import NodeCall, example_shapes, gives_pieces
from metaspmd.rules import Example
from metaspmd.signature import arg_items

from . import catalog, table
from .backend import make_runner, out_spec_from_kwargs, torch_case
from .capture import Captured, meta_call
from .samples import BASE_SEED, call_signature, with_varied_masks
from .tensor_ops import TorchOps

_TENSOR_OPS = TorchOps()

# Live exploration runs in a forked child, with the sweep's per-op limit of CPU time; the child
# must not touch the OpenMP pool the parent already started (it hangs).
LIVE_EXPLORATION = Isolation(timeout=60.0, setup=lambda: torch.set_num_threads(1))


def live_exploration() -> Isolation | None:
    """Where a table miss is explored: in a forked child, or in place in a process that
    started CUDA, which a forked child cannot use again."""
    return LIVE_EXPLORATION if can_fork() and not torch.cuda.is_initialized() else None


def stand_in_generator() -> torch.Generator:
    """The generator of the data live cases make up: seeded alike for every call, so a
    call always gets the same case, and so the same rules, in any process; and the
    caller's own generator, which a training run's dropout draws from, stays where it was."""
    return torch.Generator().manual_seed(BASE_SEED)


def _float64(tree):
    def cast(x):
        return x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float16, torch.bfloat16) else x

    return torch.utils._pytree.tree_map(cast, tree)


def _shrunk(tree, small=(6, 8, 10, 12, 14, 16, 18, 20, 22, 24)):
    """The call on small random float tensors of the same signature, so live exploration
    costs milliseconds, not seconds. Each distinct size maps to its own small size, keeping
    size 1 and equal sizes equal (mm's contraction dims must still match). Calls with
    integer or bool tensors (indices, masks) keep their real values: shrinking them
    could make them invalid. Not shrunk when there are too many distinct sizes."""
    leaves = [x for x in torch.utils._pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]
    if any(not x.is_floating_point() for x in leaves):
        return tree
    sizes = sorted({s for x in leaves for s in x.shape if s > small[0]})
    if len(sizes) > len(small):
        return tree
    new = dict(zip(sizes, small))
    generator = stand_in_generator()

    def shrink(x):
        if isinstance(x, torch.Tensor):
            return torch.randn([new.get(s, s) for s in x.shape], dtype=x.dtype, generator=generator)
        return x

    return torch.utils._pytree.tree_map(shrink, tree)


def call_case(fn: torch._ops.OpOverload, args: tuple, kwargs: dict, probe: Callable | None = None) -> OpCase:
    """The case live exploration verifies for one call: on small float64 tensors of the
    call's signature where the op takes them, else on the call's own values. ``probe``
    runs the op's calls that choose them (``NodeCall.probed_case``); None: here. The op
    runs as the sweep runs it (``make_runner``): an argument it writes is cloned first and
    its out= tensors are allocated afresh, of the call's dtypes; written in place, every
    shard's run would share one out= tensor, and its outputs all equal the last one's.

    The small tensors are taken only where the call keeps its signature and its number of
    outputs on them: where it pins sizes (a view's ``size=[-1, 8]`` beside its input's) or
    splits into pieces of a size, they would make another call, whose rules need not hold
    for this one. Where torch's op takes a position, the rules they give are checked at the
    call's own sizes too (``OpCase.stand_in_for``), and hold there only (``NodeCall.at``).
    A user's op is never shrunk nor cast."""
    call = (tuple(args), dict(kwargs))
    # a user's kernel may branch on any size or dtype (a fast path for short inputs, blocks of
    # 8 rows, a float32-only path): its calls are explored at their own sizes and dtypes
    framework = fn.namespace in catalog.TORCH_NAMESPACES
    own = _float64(call) if framework else call
    small = _shrunk(call) if framework else call
    shrunk = _float64(small) if small is not call else None
    a, k = own
    alike = shrunk and call_signature(fn, *shrunk) == call_signature(fn, *own) and _pieces(fn, *shrunk) == _pieces(fn, *own)
    for candidate in (shrunk, own) if alike else (own,):
        try:
            _run(probe, _runner(fn, candidate[1]), *candidate)
        except Exception:  # shapes baked into the arguments, no float64 kernel, a crash in a child
            continue
        a, k = candidate
        break
    if shrunk is not None and a is shrunk[0]:  # no masks to vary: shrunk calls hold float tensors only
        # checked at the call's own sizes too, where a position it names may make it another op
        check = _shapes(shrunk) != _shapes(own) and _reads_positions(fn)
        return torch_case(fn, a, k, _runner(fn, k),
                          stand_in_for=torch_case(fn, *own, _runner(fn, own[1])) if check else None)
    # a mask of one value takes one branch only: rules verified there need not hold for
    # the other (masked_fill's Partial self where the mask is False everywhere)
    a, k = with_varied_masks(fn, a, k, probe)
    return torch_case(fn, a, k, _runner(fn, k))


# Number arguments of torch's ops that name dims or kinds, not positions, sizes or values: a
# stand-in of the same ranks reads them as the call does.
_NOT_POSITIONS = ("dim", "dtype", "layout", "memory_format", "reduction")
_NUMBERS = ("int", "float", "scalar", "number")


def _reads_positions(fn: torch._ops.OpOverload) -> bool:
    """Can torch's op compute otherwise on a smaller stand-in of a call than on the call?
    Where it takes a number that may be a position or a size (tril's diagonal, roll's
    shifts, topk's k) or a bound on values (renorm's maxnorm: the stand-in's small rows
    stayed under it, so a column cut passed; histc's min and max)."""
    return any(any(n in str(a.type).lower() for n in _NUMBERS) and "tensor" not in str(a.type).lower()
               and not any(word in a.name for word in _NOT_POSITIONS) for a in fn._schema.arguments)


def _pieces(fn: torch._ops.OpOverload, args: tuple, kwargs: dict) -> int | None:
    """How many tensors a call of an op returning a list gives (``split(x, 7)`` of 30 rows
    5, of 8 rows 2; ``unbind`` one per row), which its signature does not say; None for
    any other op, and where the op has no meta kernel to ask."""
    returns = getattr(getattr(fn, "_schema", None), "returns", ())
    if len(returns) != 1 or str(returns[0].type) != "List[Tensor]":
        return None

    def meta(x):
        return torch.empty(x.shape, dtype=x.dtype, device="meta") if isinstance(x, torch.Tensor) else x

    try:
        a, k = torch.utils._pytree.tree_map(meta, (tuple(args), dict(kwargs)))
        return len(fn(*a, **k))
    except Exception:  # no meta kernel
        return None


def _shapes(tree) -> list:
    return [tuple(x.shape) for x in torch.utils._pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _runner(fn: torch._ops.OpOverload, kwargs: dict) -> Callable:
    """``fn`` as ``make_runner`` runs it, its outs of the dtypes of the call's own."""
    return make_runner(fn, out_spec_from_kwargs(fn, kwargs)[0])


def _run(probe: Callable | None, fn: Callable, args: tuple, kwargs: dict) -> None:
    """``fn(*args, **kwargs)``, by ``probe`` where given (a child's result must pickle: none)."""
    def call() -> None:
        fn(*args, **kwargs)

    call() if probe is None else probe(call)


_SIGNATURES: dict = {}


def _signature(fn: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str:
    """call_signature, memoized as table.lookup is."""
    return table.memoized(_SIGNATURES, call_signature, fn, args, kwargs)


def call_of(fn: torch._ops.OpOverload, args: tuple, kwargs: dict, real=None, prepare=None) -> NodeCall:
    """One call's signature, the table's rules for it (None: the table lacks them), the
    case live exploration would verify, and the table's rules at neighbouring signatures.
    ``args``/``kwargs`` may be fake tensors, with ``real`` giving the real (args, kwargs)
    the case needs, and ``prepare`` making them ready (before a forked child reads them)."""
    sig = _signature(fn, tuple(args), dict(kwargs))
    found = table.lookup(fn, tuple(args), dict(kwargs))
    pieces = _pieces(fn, args, kwargs)
    if found and not gives_pieces(found, pieces):
        found = None  # rules of the sweep's example, split into another number of pieces
    sizes, swept = None, ()
    per_call = table.verified_per_call(fn)
    if per_call:
        # a user's kernel may branch on any size (keep its first 32 rows), and an added table
        # was swept elsewhere: its table rules are verified at the call's own before they stand
        sizes = example_shapes(Example(tuple((n, example_value(_TENSOR_OPS, v))
                                             for n, v in arg_items(catalog.positional_names(fn), args, kwargs))))
        swept, found = tuple((s.inputs, s.outputs) for s in found or ()), None

    def neighbours() -> tuple:
        return swept or tuple((s.inputs, s.outputs) for s in table.neighbour_rules(fn, sig))

    def case(probe: Callable | None = None) -> OpCase:
        a, k = real() if real is not None else (args, kwargs)
        return call_case(fn, a, k, probe)

    at = _tensors_at(args, kwargs) if found is None and (per_call or _reads_positions(fn)) else None
    return NodeCall(sig, found, case, neighbours if found is None else None, prepare, case,
                    implementation(fn) if found is None else "", pieces, sizes, at)


def _tensors_at(args: tuple, kwargs: dict) -> str:
    """A call's tensor dtypes and shapes, in argument order (``NodeCall.at``): 'float32[4, 8] int64[3]'."""
    leaves = torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs)))
    return " ".join(f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}" for x in leaves if isinstance(x, torch.Tensor))


def implementation(fn: torch._ops.OpOverload) -> str | None:
    """The rule cache's key for the code behind ``fn`` (``NodeCall.implementation``): ''
    for torch's own ops; for a ``torch.library.custom_op``, a fingerprint of its Python
    kernels; None for an op whose kernels are not Python functions metaspmd can read (C++,
    ``Library.impl``), which is then cached in memory only."""
    if fn.namespace in catalog.TORCH_NAMESPACES:
        return ""
    definition = torch._library.custom_ops.OPDEFS.get(fn._schema.name)
    if definition is None:
        return None
    kernels = [definition._init_fn, *definition._backend_fns.values()]
    return code_fingerprint((k for k in kernels if k is not None), frameworks=("torch",))


def node_call(captured: Captured, node: MetaOp) -> NodeCall:
    """The node's call: its signature and table rules from the traced shapes; the real
    example values, recorded on first use, for live exploration only."""
    def real() -> tuple:
        return captured.values[node.name]

    traced = meta_call(captured.nodes[node.name])
    args, kwargs = traced if traced is not None else real()
    record = getattr(captured.values, "record", None)
    return call_of(node.fn, args, kwargs, real, record)
