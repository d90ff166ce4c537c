"""Shardy's own sharding rule for a jax call, read without compiling.

The call is lowered to StableHLO, calls are inlined, and Shardy's
``sdy-populate-op-sharding-rules`` pass annotates every op with its factor rule, e.g.

    #sdy.op_sharding_rule<([i, k], [k, j])->([i, j]) {i=4, j=5, k=6} reduction={k}>

A primitive may lower to several ops (argmax: a variadic reduce; cumsum: a reduce_window
and a broadcast), so the per-op factors are joined across the function: two (value, dim)
pairs that carry the same factor of some op are one function-level factor. Each factor
that touches an input dim is classified by what Shardy says about it anywhere on the way:
need-replication, permutation, reduction (never reaches an output), or pass-through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
from jax._src.lib.mlir import ir, passmanager

PIPELINE = "builtin.module(inline,func.func(sdy-populate-op-sharding-rules{conservative-propagation=false}))"
_RULE_RE = re.compile(r"^#sdy\.op_sharding_rule<\((.*)\)->\((.*)\)(.*)>$", re.S)
_FACTOR_RE = re.compile(r"[a-z](?:_[0-9]+)?")
_SETS = ("reduction", "need_replication", "permutation", "blocked_propagation")
# Ops without a rule that are still fine: they carry no input data (an op with no ranked
# operand, such as a constant or an iota, starts new values and links nothing).
_NO_RULE_OK = {"stablehlo.constant", "func.return", "stablehlo.return"}
_TERMINATORS = ("func.return", "stablehlo.return")
# Elementwise CHLO ops: Shardy's pass gives CHLO no rule (XLA legalizes it into elementwise
# StableHLO before partitioning), so they get a pointwise one here.
_POINTWISE_CHLO = {
    "chlo." + n for n in ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh", "tan", "lgamma", "digamma",
                          "erf", "erfc", "erf_inv", "bessel_i1e", "polygamma", "zeta", "next_after", "conj", "is_inf",
                          "is_neg_inf", "is_pos_inf", "square", "mulhi")
}
# Ops whose results are their operands (values pass through unchanged).
_IDENTITY = {"stablehlo.optimization_barrier"}


class NoShardyRule(Exception):
    """The lowered call has an op that Shardy gives no rule (a LAPACK custom call...)."""


@dataclass(frozen=True)
class OpRule:
    """One op's rule: factor names per dim of each operand and result."""

    operands: tuple[tuple[tuple[str, ...], ...], ...]
    results: tuple[tuple[tuple[str, ...], ...], ...]
    sizes: dict
    sets: dict  # 'reduction' | 'need_replication' | 'permutation' | ... -> frozenset of factors


def _dims(text: str) -> tuple[tuple[tuple[str, ...], ...], ...]:
    """'[i, k], [k, j]' -> ((('i',), ('k',)), (('k',), ('j',)))."""
    tensors = re.findall(r"\[([^\]]*)\]", text)
    return tuple(tuple(tuple(_FACTOR_RE.findall(d.strip())) for d in t.split(",") if d.strip()) for t in tensors)


def parse_rule(text: str) -> OpRule:
    m = _RULE_RE.match(text.strip())
    if not m:
        raise ValueError(f"not a Shardy rule: {text}")
    operands, results, tail = m[1], m[2], m[3]
    sizes = {k: int(v) for k, v in re.findall(r"([a-z](?:_[0-9]+)?)=([0-9]+)", tail.split("}")[0])} if "{" in tail else {}
    sets = {}
    for name in _SETS:
        sm = re.search(name + r"=\{([^}]*)\}", tail)
        sets[name] = frozenset(_FACTOR_RE.findall(sm[1])) if sm else frozenset()
    return OpRule(_dims(operands), _dims(results), sizes, sets)


@dataclass(frozen=True)
class Factor:
    """A function-level factor that touches at least one input dim."""

    # 'pass-through' | 'reduction' | 'permutation' | 'need-replication' | 'compound' (the minor
    # factor of a merged dim, not shardable alone) | 'merged' (links two dims of one tensor
    # across several ops) | 'unused'
    kind: str
    size: int
    inputs: tuple[tuple[int, int], ...]  # (input index, dim)
    outputs: tuple[tuple[int, int], ...]  # (output index, dim)
    ops: tuple[str, ...]  # the StableHLO ops it passes through

    def describe(self) -> str:
        ins = ", ".join(f"in{i}.{d}" for i, d in self.inputs)
        outs = ", ".join(f"out{i}.{d}" for i, d in self.outputs) or "-"
        return f"{self.kind}[{self.size}] ({ins}) -> ({outs})"


class _Classes:
    """Union-find over (value, dim) pairs, with what Shardy says about each class."""

    def __init__(self):
        self.parent: dict = {}
        self.flags: dict = {}
        self.sizes: dict = {}
        self.ops: dict = {}

    def find(self, k):
        self.parent.setdefault(k, k)
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            self.flags.setdefault(ra, set()).update(self.flags.pop(rb, set()))
            self.ops.setdefault(ra, set()).update(self.ops.pop(rb, set()))
            self.sizes.setdefault(ra, self.sizes.pop(rb, 0))

    def mark(self, k, flags, size: int, op: str) -> None:
        r = self.find(k)
        self.flags.setdefault(r, set()).update(flags)
        if op:
            self.ops.setdefault(r, set()).add(op)
        self.sizes[r] = max(self.sizes.get(r, 0), size)


def _annotated_module(fn: Callable[..., Any], leaves: Sequence[Any]) -> ir.Module:
    lowered = jax.jit(fn, keep_unused=True).lower(*leaves)
    module = lowered.compiler_ir()
    with module.context:
        clone = ir.Module.parse(str(module))  # compiler_ir() is cached: never mutate it
        passmanager.PassManager.parse(PIPELINE).run(clone.operation)
    return clone


def _functions(module: ir.Module) -> dict:
    return {str(op.attributes["sym_name"]).strip('"'): op for op in module.body.operations
            if op.operation.name == "func.func"}


def _tensor_type(t) -> ir.RankedTensorType | None:
    try:
        return ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return None


def _ranked(v) -> bool:
    t = _tensor_type(v.type)
    return t is not None and t.rank > 0


def _same_shapes(op) -> bool:
    shapes = {tuple(_tensor_type(v.type).shape) if _tensor_type(v.type) else None
              for v in list(op.operands) + list(op.results)}
    return len(shapes) == 1 and None not in shapes


def _pointwise(op) -> OpRule:
    """The rule of an elementwise CHLO op: every dim of every operand and result is one factor."""
    rank = _tensor_type(op.results[0].type).rank
    dims = tuple((f"f{d}",) for d in range(rank))
    return OpRule(tuple(dims for _ in op.operands), tuple(dims for _ in op.results),
                  {f"f{d}": s for d, s in enumerate(_tensor_type(op.results[0].type).shape)},
                  {name: frozenset() for name in _SETS})


def _rank(v) -> int:
    t = _tensor_type(v.type)
    return t.rank if t is not None else 0


class _Walker:
    """Feeds every op's rule into the classes, following calls into their callees (jax
    lowers some primitives to a private function: cumsum, argmax, LAPACK wrappers)."""

    def __init__(self, functions: dict):
        self.functions = functions
        self.classes = _Classes()
        self.ids: dict = {}
        self.done: set[str] = set()

    def vid(self, v) -> int:  # ir.Value hashes by identity of the underlying value
        return self.ids.setdefault(v, len(self.ids))

    def link(self, a, b) -> None:
        for d in range(min(_rank(a), _rank(b))):
            self.classes.union((self.vid(a), d), (self.vid(b), d))

    def block(self, block) -> list:
        """Walk one function body; its returned values."""
        results: list = []
        for op in block.operations:
            op = op.operation  # the generic form: .name is the op type, not a symbol
            if op.name in _TERMINATORS:
                results = list(op.operands)
            elif op.name == "func.call":
                self.call(op)
            elif "sdy.sharding_rule" in op.attributes:
                self.rule(op, parse_rule(str(op.attributes["sdy.sharding_rule"])))
            elif op.name in _POINTWISE_CHLO and _same_shapes(op):
                self.rule(op, _pointwise(op))
            elif op.name in _IDENTITY:
                for a, b in zip(op.operands, op.results):
                    self.link(a, b)
            elif op.name == "stablehlo.while":
                self.loop(op)
            elif op.name not in _NO_RULE_OK and any(_ranked(v) for v in op.operands):
                raise NoShardyRule(f"no Shardy rule for {op.name}")
        return results

    def call(self, op) -> None:
        name = str(op.attributes["callee"]).lstrip("@").strip('"')
        body = self.functions[name].regions[0].blocks[0]
        for a, b in zip(op.operands, body.arguments):
            self.link(a, b)
        if name in self.done:
            raise NoShardyRule(f"function {name} is called twice: its factors would merge")
        self.done.add(name)
        for r, b in zip(self.block(body), op.results):
            self.link(r, b)

    def loop(self, op) -> None:
        """A while loop: each carried value links operand, condition and body arguments, the
        body's yield and the result; the ops of both regions add their own factors."""
        cond, body = (r.blocks[0] for r in op.regions)
        for k, (a, r) in enumerate(zip(op.operands, op.results)):
            self.link(a, cond.arguments[k])
            self.link(a, body.arguments[k])
            self.link(a, r)
        self.block(cond)
        for y, r in zip(self.block(body), op.results):
            self.link(y, r)

    def rule(self, op, rule: OpRule) -> None:
        where: dict[str, list] = {}
        minor: set[str] = set()
        for values, dims in ((list(op.operands), rule.operands), (list(op.results), rule.results)):
            for v, per_dim in zip(values, dims):
                for d, factors in enumerate(per_dim):
                    if factors:
                        where.setdefault(factors[0], []).append((self.vid(v), d))
                        minor.update(factors[1:])
        for f, keys in where.items():
            flags = {name for name in _SETS if f in rule.sets[name]} | ({"compound"} if f in minor else set())
            for k in keys[1:]:
                self.classes.union(keys[0], k)
            self.classes.mark(keys[0], flags, rule.sizes.get(f, 0), op.name.removeprefix("stablehlo."))


def function_factors(fn: Callable[..., Any], leaves: Sequence[Any]) -> list[Factor]:
    """Shardy's factors of ``fn`` at its inputs, for a call on ``leaves``."""
    module = _annotated_module(fn, leaves)
    with module.context:
        walker = _Walker(_functions(module))
        classes = walker.classes
        main = walker.functions.get("main")
        if main is None:
            raise NoShardyRule("lowered module has no main function")
        body = main.regions[0].blocks[0]
        args = list(body.arguments)
        for a in args:  # every input dim is a class, even one no op touches (an identity call)
            t = _tensor_type(a.type)
            for d, size in enumerate(t.shape if t is not None else ()):
                classes.mark((walker.vid(a), d), set(), size, "")
        results = walker.block(body)
        arg_ids = {walker.vid(a): i for i, a in enumerate(args)}
        out_ids = {walker.vid(r): j for j, r in enumerate(results)}
        members: dict = {}
        for key in list(classes.parent):
            members.setdefault(classes.find(key), []).append(key)
    factors = []
    for root, keys in members.items():
        ins = tuple(sorted((arg_ids[v], d) for v, d in keys if v in arg_ids))
        if not ins:
            continue
        outs = tuple(sorted((out_ids[v], d) for v, d in keys if v in out_ids))
        flags = classes.flags.get(root, set())
        joined = len({i for i, _ in ins}) < len(ins) or len({j for j, _ in outs}) < len(outs)
        if joined:  # e.g. a transpose feeding an add: not one dim per tensor, not a factor to shard
            kind = "merged"
        elif "need_replication" in flags:
            kind = "need-replication"
        elif "compound" in flags:
            kind = "compound"
        elif "permutation" in flags:
            kind = "permutation"
        elif outs:
            kind = "pass-through"
        elif "reduction" in flags:
            kind = "reduction"
        elif not classes.ops.get(root):
            kind = "unused"
        else:
            kind = "need-replication"  # reaches no output and is not reduced: Shardy keeps it whole
        factors.append(Factor(kind, classes.sizes.get(root, 0), ins, outs, tuple(sorted(classes.ops.get(root, ())))))
    return sorted(factors, key=lambda f: (f.inputs, f.outputs))
