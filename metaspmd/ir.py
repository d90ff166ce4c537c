"""MetaIR: a framework-free dataflow graph of ops, what captures produce and the planner reads.

MetaVar is a value (tensor or not) with its shape and dtype; MetaOp is one op call whose
inputs are a pytree of MetaVars and constants; MetaIR lists the graph inputs, the ops in
topological order, and the outputs.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import pytree


@dataclass(frozen=True)
class MetaVar:
    name: str
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    is_tensor: bool = True

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _is_var(x: Any) -> bool:
    return isinstance(x, MetaVar)


@dataclass(frozen=True)
class MetaOp:
    """One op call. ``args``/``kwargs`` hold MetaVars where values flow in, constants elsewhere."""

    name: str  # unique node name in the graph
    op: str  # op identifier, e.g. 'aten.mm.default' or 'dot_general'
    args: tuple = ()
    kwargs: dict = field(default_factory=dict, hash=False, compare=False)
    outputs: tuple[MetaVar, ...] = ()
    fn: Callable[..., Any] | None = field(default=None, hash=False, compare=False)

    @property
    def input_vars(self) -> list[MetaVar]:
        return pytree.leaves((self.args, self.kwargs), _is_var)


class IRError(ValueError):
    pass


@dataclass(frozen=True)
class MetaIR:
    input_list: tuple[MetaVar, ...]
    op_list: tuple[MetaOp, ...]
    output_list: tuple[MetaVar, ...]

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """A DAG in topological order: every var is defined once, before it is used."""
        defined: set[str] = set()
        for v in self.input_list:
            if v.name in defined:
                raise IRError(f"input {v.name} defined twice")
            defined.add(v.name)
        names: set[str] = set()
        for op in self.op_list:
            if op.name in names:
                raise IRError(f"op name {op.name} used twice")
            names.add(op.name)
            for v in op.input_vars:
                if v.name not in defined:
                    raise IRError(f"op {op.name} ({op.op}) reads {v.name} before it is defined")
            for v in op.outputs:
                if v.name in defined:
                    raise IRError(f"op {op.name} redefines {v.name}")
                defined.add(v.name)
        for v in self.output_list:
            if v.name not in defined:
                raise IRError(f"output {v.name} is never defined")

    def producers(self) -> dict[str, MetaOp]:
        return {v.name: op for op in self.op_list for v in op.outputs}

    def consumers(self) -> dict[str, list[MetaOp]]:
        out: dict[str, list[MetaOp]] = {}
        for op in self.op_list:
            for v in op.input_vars:
                out.setdefault(v.name, []).append(op)
        return out

    def __iter__(self) -> Iterator[MetaOp]:
        return iter(self.op_list)

    def __len__(self) -> int:
        return len(self.op_list)


class RecordedValues(Mapping):
    """node name -> the node's real operands, recorded by ``record`` on first access: only
    live exploration reads them (a signature needs the traced shapes alone), so planning
    with a warm rule cache runs none of the model. Explorations run in threads: one
    records, the others wait for it."""

    def __init__(self, record: Callable[[], dict]):
        self._record: Callable[[], dict] | None = record
        self._values: dict | None = None
        self._lock = threading.Lock()

    def record(self) -> dict:
        with self._lock:
            if self._values is None:
                self._values = self._record()  # type: ignore[misc]
                self._record = None  # recorded: what it closed over is not needed any more
        return self._values

    def __getitem__(self, name: str):
        return self.record()[name]

    def __iter__(self):
        return iter(self.record())

    def __len__(self) -> int:
        return len(self.record())
