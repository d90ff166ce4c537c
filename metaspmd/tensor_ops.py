"""The tensor-ops protocol: everything the framework-free core needs from a tensor library.

Each backend (torch, jax, tvm) implements it once; the explorer, verifier and combine
functions talk to tensors only through it, so the core never imports a framework.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

# Dtype kinds: the only dtype facts the core reasons about.
FLOAT, COMPLEX, INT, BOOL, OTHER = "f", "c", "i", "b", "o"


@runtime_checkable
class TensorOps(Protocol):
    """Small protocol over one tensor library. Tensors are opaque to the core."""

    def is_tensor(self, x: Any) -> bool:
        """True for a tensor leaf of an op's inputs or outputs."""

    def shape(self, x: Any) -> tuple[int, ...]: ...

    def dtype_kind(self, x: Any) -> str:
        """One of FLOAT, COMPLEX, INT, BOOL, OTHER."""

    def dtype_name(self, x: Any) -> str:
        """The library's own dtype name without prefix, e.g. 'float32', 'int64'."""

    def narrow(self, x: Any, dim: int, start: int, length: int) -> Any:
        """A copy of x[..., start:start+length, ...] along dim."""

    def concat(self, xs: Sequence[Any], dim: int) -> Any: ...

    def add(self, a: Any, b: Any) -> Any: ...

    def sub(self, a: Any, b: Any) -> Any: ...

    def multiply(self, a: Any, b: Any) -> Any: ...

    def maximum(self, a: Any, b: Any) -> Any: ...

    def minimum(self, a: Any, b: Any) -> Any: ...

    def scale(self, x: Any, factor: float) -> Any:
        """x * factor, keeping x's dtype (used for reduce(avg))."""

    def add_scalar(self, x: Any, amount: int) -> Any:
        """x + amount of an integer tensor, keeping its dtype (positions moved into a
        shard's own range, for an index offset)."""

    def sqrt(self, x: Any) -> Any:
        """Elementwise square root of a floating tensor (used for reduce(norm2))."""

    def logaddexp(self, a: Any, b: Any) -> Any:
        """log(exp(a) + exp(b)) of floating tensors, without overflow (used for scan(logsumexp))."""

    def to_numpy(self, x: Any) -> Any:
        """x's values as a numpy array (bfloat16 and half as float32), for combines that
        compare values (argreduce)."""

    def from_numpy(self, a: Any, like: Any) -> Any:
        """The numpy array ``a`` as a tensor of ``like``'s dtype."""

    def bitwise_xor(self, a: Any, b: Any) -> Any:
        """Elementwise exclusive or of integer or bool tensors (used for reduce(xor))."""

    def close(self, actual: Any, expected: Any) -> bool:
        """Same shape and dtype kind, and equal values.

        Exact for integer and bool tensors; for floating tensors a tolerance scaled to the
        magnitudes involved (NaN matches NaN at the same position).
        """

    def opaque(self, x: Any) -> str:
        """What keeps ``close`` from comparing x (a sparse or quantized tensor), or '' where
        nothing does: an op whose outputs it cannot compare cannot have a combine verified."""

    def one_nonfinite_value(self, x: Any) -> bool:
        """x has elements and every one is NaN, or every one is the same infinity (never for
        integer and bool tensors). A mix of NaN, +inf and -inf still has a pattern to compare."""

    def zeros_like(self, x: Any) -> Any: ...

    def random_like(self, x: Any, seed: int) -> Any:
        """Fresh signed, non-degenerate random values of x's shape and dtype.

        Floats: standard normal. Integers: signed values from a range wide enough that
        shards differ. Bools: fair coin flips.
        """

    def clone(self, x: Any) -> Any: ...
