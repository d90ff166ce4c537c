"""Canonical call signatures: what a rule depends on, as one readable string.

A rule depends on the ranks of the tensor inputs, on which dims are size 1 (broadcast)
or empty, on the dtype kind (float / complex / int / bool), and on the non-tensor
arguments. Exact sizes do not enter, so one entry serves every call of that shape class:

    self:f[*,*] mat2:f[*,*]
    self:f[*,*,*] dim=[-1] keepdim=True
    tensors:[f[*,*],f[*,*],f[*,*]] dim=0

Ops whose rules depend on some sizes themselves are keyed by those exact sizes
(``exact_sizes``: an argument name -> a slice of its dims): a reshape maps dims by all of
them, ``self:f[5,4,6] size=[20,6]``; a convolution's halo is its kernel's extent,
``weight:f[*,*,3,3]``.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # annotations only: reading a signature needs no numpy
    from .tensor_ops import TensorOps

# Every dim of an argument keyed by its exact size (a reshape's).
ALL_DIMS = slice(None)


def span(dims: Sequence[int]) -> slice | None:
    """The slice from the first to the last of ``dims`` (None for none): an argument's
    exact-size dims as one slice; a dim between them pinned too only makes the key coarser."""
    return slice(min(dims), max(dims) + 1) if dims else None


def pinned_dims(exact: slice | None, rank: int) -> range:
    """The dims of a rank-``rank`` tensor that ``exact`` (a slice of its dims) pins."""
    return range(rank)[exact] if exact is not None else range(0)


def tensor_token(ops: TensorOps, x: Any, exact: slice | None = None) -> str:
    shape = ops.shape(x)
    pinned = pinned_dims(exact, len(shape))
    dims = ",".join("*" if s > 1 and d not in pinned else str(s) for d, s in enumerate(shape))
    return f"{ops.dtype_kind(x)}[{dims}]"


def value_token(ops: TensorOps, x: Any, exact: slice | None = None) -> str:
    """A stable token for any argument value (tensors included); ``exact``: the dims of its
    tensors written with their sizes."""
    if ops.is_tensor(x):
        return tensor_token(ops, x, exact)
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return repr(x)
    if isinstance(x, complex):
        return repr(x)
    if isinstance(x, str):
        return repr(x)
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(value_token(ops, y, exact) for y in x) + "]"
    if isinstance(x, dict):
        return "{" + ",".join(f"{k}:{value_token(ops, x[k], exact)}" for k in sorted(x)) + "}"
    # dtypes, layouts, memory formats, enums: their own string form, without spaces
    return object_text(x).replace(" ", "")


def object_text(x: Any) -> str:
    """An object's text in a rule file: a function or class by its module and name (its str
    holds its address, new in each run), anything else by its str."""
    if inspect.isroutine(x) or inspect.isclass(x):
        return f"{x.__module__}.{x.__qualname__}"
    return str(x)


def has_tensor(ops: TensorOps, x: Any) -> bool:
    if ops.is_tensor(x):
        return True
    if isinstance(x, (list, tuple)):
        return any(has_tensor(ops, y) for y in x)
    return False


def arg_items(arg_names: tuple[str, ...], args: tuple, kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Name every argument: positional ones by schema name (or argN), then keywords sorted."""
    items = [(arg_names[i] if i < len(arg_names) else f"arg{i}", a) for i, a in enumerate(args)]
    items += [(k, kwargs[k]) for k in sorted(kwargs)]
    return items


def signature(ops: TensorOps, arg_names: tuple[str, ...], args: tuple, kwargs: Mapping[str, Any],
              exact_sizes: Mapping[str, slice] | None = None) -> str:
    """``exact_sizes``: argument name -> the slice of its dims whose sizes key the rules."""
    exact_sizes = exact_sizes or {}
    parts = []
    for name, value in arg_items(arg_names, args, kwargs):
        sep = ":" if has_tensor(ops, value) else "="
        parts.append(f"{name}{sep}{value_token(ops, value, exact_sizes.get(name))}")
    return " ".join(parts)


def split_signature(sig: str) -> list[tuple[str, str, str]]:
    """``'self:f[*,*] dim=-1'`` -> ``[('self', ':', 'f[*,*]'), ('dim', '=', '-1')]``; a bare
    name is ``(name, '=', '')``. Split where the reader ends each argument, not at every
    space: a string value may hold one (``s='a b'``). ValueError for a malformed ``sig``."""
    return list(_arguments(sig))


# Signatures as ``signature`` writes them, which ``signature_error`` reads back: arguments
# split by one space, each ``name:value`` when the value holds a tensor (has_tensor: outside
# dicts), ``name=value`` when not, or a bare name (split_signature reads it as ``name=``).
# A value is a tensor ``kind[dims]``, a list ``[v,...]``, a dict ``{k:v,...}``, a quoted
# repr of a string, or a word: a number, None, True, a dtype, a device (``cuda:0``), a
# complex (``(1+2j)``).
_SIG_NAME = re.compile(r"[^ :=\[\]{}(),'\"]+")  # split_signature splits on spaces alone
_SIG_WORD = re.compile(r"[^\s\[\]{},'\"][^\s\[\]{},]*")  # an object's str may hold quotes
_SIG_KEY = re.compile(r"[^\s\[\]{},:'\"]+")
_SIG_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_SIG_DIMS = re.compile(r"\[(?:(?:\*|\d{1,9})(?:,(?:\*|\d{1,9}))*)?\]")
_SIG_KINDS = frozenset("fciob")  # tensor_ops' dtype kinds (not imported: that module loads numpy)


def _sig_expected(sig: str, i: int, what: str) -> ValueError:
    found = repr(sig[i]) if i < len(sig) else "the end"
    return ValueError(f"expected {what} at column {i + 1}, found {found}")


def _sig_value(sig: str, i: int, tensors: list | None = None) -> tuple[int, bool]:
    """The end of the value starting at ``i``, and whether it holds a tensor outside a dict;
    ``tensors`` gets each such tensor's (kind, dims text)."""
    opening = sig[i:i + 1]
    if opening in ("[", "{"):
        close, tensor, i = "]" if opening == "[" else "}", False, i + 1
        if sig[i:i + 1] == close:
            return i + 1, False
        while True:
            if close == "}":
                key = _SIG_KEY.match(sig, i)
                if key is None or sig[key.end():key.end() + 1] != ":":
                    raise _sig_expected(sig, key.end() if key else i, "a dict key and ':'")
                i, _ = _sig_value(sig, key.end() + 1)  # has_tensor does not look into dicts
            else:
                i, inner = _sig_value(sig, i, tensors)
                tensor = tensor or inner
            if sig[i:i + 1] == close:
                return i + 1, tensor
            if sig[i:i + 1] != ",":
                raise _sig_expected(sig, i, f"',' or '{close}'")
            i += 1
    word = _SIG_STRING.match(sig, i) or _SIG_WORD.match(sig, i)
    if word is None:
        raise _sig_expected(sig, i, "a value")
    if sig[word.end():word.end() + 1] != "[":
        return word.end(), False
    if word.group() not in _SIG_KINDS:
        raise _sig_expected(sig, i, "a tensor kind (f, c, i, b or o) before '['")
    dims = _SIG_DIMS.match(sig, word.end())
    if dims is None:
        raise _sig_expected(sig, word.end(), "tensor dims such as [*,1,4]")
    if tensors is not None:
        tensors.append((word.group(), dims.group()[1:-1]))
    return dims.end(), True


def _sig_plain_end(sig: str, i: int, name: str) -> int:
    """The end of an '=' value: whatever ``value_token`` made of a value without a tensor
    (has_tensor does not look into dicts), an object's ``str`` too (``slice(1,2,None)``,
    ``<class'numpy.float32'>``), so only what no such value has is refused: no value, an
    unclosed bracket or string, a tensor alone."""
    start, depth = i, 0
    while i < len(sig) and (sig[i] != " " or depth):
        if sig[i] in "'\"" and (i == start or sig[i - 1] in "[{,:"):  # a repr of a string
            string = _SIG_STRING.match(sig, i)
            if string is None:
                raise _sig_expected(sig, len(sig), "a closing quote")
            i = string.end()
            continue
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(sig[i], 0)
        if depth < 0:
            raise _sig_expected(sig, i, "no closing bracket without an opening one")
        i += 1
    if depth:
        raise _sig_expected(sig, i, "a closing bracket")
    if i == start:
        raise _sig_expected(sig, i, "a value")
    if sig[start:start + 1] in _SIG_KINDS and _SIG_DIMS.fullmatch(sig, start + 1, i):
        raise ValueError(f"argument {name!r}: ':' goes before a value holding a tensor, '=' before any other")
    return i


def example_disagreement(sig: str, example_args: Sequence[tuple[str, Any]]) -> str | None:
    """Where a well-formed signature disagrees with the example call written beside it
    (``(name, value)`` pairs, tensors as objects with ``shape`` and ``dtype``); None where
    they agree. ``tensor_token`` writes a dim ``*`` where the example's size is above 1 and
    the size itself otherwise (or where the op's rules key on it), and kind ``b`` for bool."""
    parts = split_signature(sig)
    names = [name for name, _, _ in parts]
    if names != [name for name, _ in example_args]:
        return f"the signature names the arguments {names}, the example {[name for name, _ in example_args]}"
    for (name, sep, value), (_, v) in zip(parts, example_args):
        tokens: list[tuple[str, str]] = []
        if sep == ":":
            _sig_value(value, 0, tokens)
        elif value and not _example_tensors(v) and not _lossy(v) and value not in (_plain_token(v, True),
                                                                                   _plain_token(v, False)):
            return f"argument {name!r} is {value} in the signature, {v!r} in the example"
        tensors = _example_tensors(v)
        if len(tokens) != len(tensors):
            return f"argument {name!r} holds {len(tokens)} tensors in the signature, {len(tensors)} in the example"
        for (kind, dims), t in zip(tokens, tensors):
            sizes = dims.split(",") if dims else []
            if len(sizes) != len(t.shape):
                return f"argument {name!r} has rank {len(sizes)} in the signature, {len(t.shape)} in the example"
            for d, (token, n) in enumerate(zip(sizes, t.shape)):
                if (n <= 1) if token == "*" else (int(token) != n):
                    return f"argument {name!r} has dim {d} {token} in the signature, {n} in the example"
            expected = _kind_of_name(t.dtype)
            if (kind == "b") != (t.dtype == "bool") or expected is not None and kind != expected:
                return f"argument {name!r} is of kind {kind!r} in the signature but {t.dtype} in the example"
    return None


def _lossy(v: Any) -> bool:
    """An example's value that no longer says what the signature wrote: a dict the call had
    is its ``str`` there, which ``value_token`` writes otherwise."""
    if isinstance(v, str):
        return v.startswith("{")
    return isinstance(v, (list, tuple)) and any(_lossy(x) for x in v)


class _Word:
    """An example's string that stands for an object (a dtype written ``torch.float32``),
    which ``value_token`` writes by its ``str`` form."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


class _NoTensors:
    """The tensor ops ``value_token`` asks of a value without tensors."""

    @staticmethod
    def is_tensor(x: Any) -> bool:
        return False


def _plain_token(v: Any, quoted: bool) -> str:
    """``value_token`` of an example's value without tensors; ``quoted``: its strings are
    strings (written as their repr), else the ``str`` of objects the example holds as text."""
    def words(x: Any) -> Any:
        if isinstance(x, str):  # any object the call had is text in its example (np.float32(0.5): '0.5')
            return x if quoted else _Word(x)
        return [words(y) for y in x] if isinstance(x, (list, tuple)) else x

    return value_token(_NoTensors(), words(v))  # type: ignore[arg-type]


def _kind_of_name(dtype: Any) -> str | None:
    """The kind every framework gives a dtype of this name, or None where they differ or it
    is none of the common ones (``int4`` is an integer to jax, not to torch)."""
    if not isinstance(dtype, str):
        return None
    if dtype.startswith("complex"):
        return "c"
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        return "f"
    if dtype in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        return "i"
    return None


def _example_tensors(v: Any) -> list:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for x in v for t in _example_tensors(x)]
    return []


@functools.lru_cache(maxsize=8192)  # ops share signatures (self:f[*,*]): each is parsed once
def _arguments(sig: str) -> tuple[tuple[str, str, str], ...]:
    """``sig``'s arguments as (name, separator, value), read as ``signature`` writes them;
    ValueError naming the column where ``sig`` is not such a signature."""
    out: list[tuple[str, str, str]] = []
    i = 0
    while sig:  # "": a call without arguments
        name = _SIG_NAME.match(sig, i)
        if name is None:
            raise _sig_expected(sig, i, "an argument name")
        i = name.end()
        sep = sig[i:i + 1]
        if sep == ":":
            end, tensor = _sig_value(sig, i + 1)
            if not tensor:
                raise ValueError(f"argument {name.group()!r}: ':' goes before a value holding a tensor, "
                                 "'=' before any other")
        elif sep == "=":
            end = _sig_plain_end(sig, i + 1, name.group())
        else:  # a bare name: an empty value
            end, sep = i, ""
        out.append((name.group(), sep or "=", sig[i + 1:end]))
        i = end
        if i == len(sig):
            break
        if sig[i] != " ":
            raise _sig_expected(sig, i, "' ' between arguments")
        i += 1
    return tuple(out)


def signature_error(sig: str) -> str | None:
    """Why ``sig`` is not a signature as signature.signature writes it; None when it is one."""
    try:
        _arguments(sig)
    except ValueError as e:
        return str(e)
    except RecursionError:
        return "lists nest too deeply"
    return None
