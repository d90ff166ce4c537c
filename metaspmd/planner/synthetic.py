"""Hand-built MetaIR graphs with hand-written rules in paper notation, for tests and
benchmarks: a 2-layer MLP and a GPT-like transformer (forward and backward).

Activations are 2-D (tokens, hidden); attention runs on 4-D (batch, heads, seq, head_dim)
tensors. The rules are what ShardCombine finds for these ops (plus Partial inputs for
ops linear in an input).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .. import spec
from ..ir import MetaIR, MetaOp, MetaVar


def rules(shard: str, combine: str, partial: str | None = None) -> tuple[spec.Strategy, ...]:
    """Strategies from paper-notation tables, e.g. rules('[[S1, S2], [S2, S3]]', '{S1: gather(dim=0), ...}')."""
    sh = spec.ShardSpec.parse(shard)
    pa = spec.PartialSpec.parse(partial) if partial else spec.PartialSpec(tuple(() for _ in sh.inputs))
    return tuple(spec.strategies(sh, pa, spec.CombineSpec.parse(combine)))


def _labels(rank: int, first: int = 1) -> list[str]:
    return [f"S{first + d}" for d in range(rank)]


def _gathers(rank: int, perm: Sequence[int] | None = None, first: int = 1) -> list[str]:
    perm = list(range(rank)) if perm is None else list(perm)
    return [f"S{first + d}: gather(dim={perm[d]})" for d in range(rank)]


def _table(dims: Sequence[Sequence[str]]) -> str:
    return "[" + ", ".join("[" + ", ".join(d) + "]" for d in dims) + "]"


def mm_rules() -> tuple[spec.Strategy, ...]:
    return rules(
        "[[S1, S2], [S2, S3]]",
        "{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1), S4: reduce(sum), S5: reduce(sum)}",
        "[[S4(sum)], [S5(sum)]]",
    )


def matmul4_rules() -> tuple[spec.Strategy, ...]:
    """(b, h, m, k) @ (b, h, k, n)."""
    return rules(
        "[[S1, S2, S3, S4], [S1, S2, S4, S5]]",
        "{S1: gather(dim=0), S2: gather(dim=1), S3: gather(dim=2), S4: reduce(sum), S5: gather(dim=3),"
        " S6: reduce(sum), S7: reduce(sum)}",
        "[[S6(sum)], [S7(sum)]]",
    )


def elementwise_rules(
    rank: int, n_inputs: int = 1, linear_in: Sequence[int] = (), skip: Sequence[int] = ()
) -> tuple[spec.Strategy, ...]:
    """Same-shape elementwise op. ``linear_in``: inputs it is jointly linear in (Partial
    allowed there, the others replicated); ``skip``: dims that may not be split (softmax dim)."""
    labs = [lab if d not in skip else "N" for d, lab in enumerate(_labels(rank))]
    combine = [g for d, g in enumerate(_gathers(rank)) if d not in skip]
    partial = "[]"
    if linear_in:
        p = f"S{rank + 1}"
        combine.append(f"{p}: reduce(sum)")
        partial = _table([[f"{p}(sum)"] if i in linear_in else [] for i in range(n_inputs)])
    return rules(_table([labs] * n_inputs), "{" + ", ".join(combine) + "}", partial if linear_in else None)


def bias_add_rules() -> tuple[spec.Strategy, ...]:
    """x (t, n) + b (n,)."""
    return rules(
        "[[S1, S2], [S2]]", "{S1: gather(dim=0), S2: gather(dim=1), S3: reduce(sum)}", "[[S3(sum)], [S3(sum)]]"
    )


def sum0_rules() -> tuple[spec.Strategy, ...]:
    """sum over dim 0 of (t, n) -> (n,)."""
    return rules("[[S1, S2]]", "{S1: reduce(sum), S2: gather(dim=0), S3: reduce(sum)}", "[[S3(sum)]]")


def transpose_rules(rank: int) -> tuple[spec.Strategy, ...]:
    """Swap the last two dims."""
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    combine = _gathers(rank, perm) + [f"S{rank + 1}: reduce(sum)"]
    return rules(_table([_labels(rank)]), "{" + ", ".join(combine) + "}", f"[[S{rank + 1}(sum)]]")


def to_heads_rules() -> tuple[spec.Strategy, ...]:
    """(b*s, h*d) -> (b, h, s, d): tokens split by whole sequences, hidden by whole heads."""
    return rules("[[S1, S2]]", "{S1: gather(dim=0), S2: gather(dim=1), S3: reduce(sum)}", "[[S3(sum)]]")


def from_heads_rules() -> tuple[spec.Strategy, ...]:
    return rules("[[S1, S2, N, N]]", "{S1: gather(dim=0), S2: gather(dim=1), S3: reduce(sum)}", "[[S3(sum)]]")


def layer_norm_rules() -> tuple[spec.Strategy, ...]:
    """layer_norm(x (t, h), weight (h,), bias (h,)) normalises over h: split tokens only."""
    return rules("[[S1, N], [N], [N]]", "{S1: gather(dim=0)}")


def layer_norm_backward_rules() -> tuple[spec.Strategy, ...]:
    """(dy, x, weight) -> (dx, dweight, dbias); linear in dy."""
    return rules(
        "[[S1, N], [S1, N], [N]]",
        "{S1: [gather(dim=0), reduce(sum), reduce(sum)], S2: [reduce(sum), reduce(sum), reduce(sum)]}",
        "[[S2(sum)], [], []]",
    )


@dataclass
class GraphBuilder:
    """Appends ops in program order and records each node's rule strategies."""

    inputs: list[MetaVar] = field(default_factory=list)
    ops: list[MetaOp] = field(default_factory=list)
    strategies: dict[str, tuple[spec.Strategy, ...]] = field(default_factory=dict)
    params: list[tuple[str, str]] = field(default_factory=list)  # (parameter, gradient)
    dtype: str = "float32"

    def input(self, name: str, shape: tuple[int, ...]) -> MetaVar:
        v = MetaVar(name, tuple(shape), self.dtype)
        self.inputs.append(v)
        return v

    def op(self, op: str, args: Sequence[MetaVar], out_shapes: Sequence[tuple[int, ...]],
           strategies: tuple[spec.Strategy, ...], name: str | None = None) -> tuple[MetaVar, ...]:
        parts = op.split(".")
        name = name or f"{parts[1] if parts[0] == 'aten' and len(parts) > 1 else parts[-1]}_{len(self.ops)}"
        outs = tuple(MetaVar(f"{name}.{k}" if len(out_shapes) > 1 else name, tuple(s), self.dtype)
                     for k, s in enumerate(out_shapes))
        self.ops.append(MetaOp(name, op, tuple(args), {}, outs))
        self.strategies[name] = strategies
        return outs

    def one(self, op: str, args: Sequence[MetaVar], shape: tuple[int, ...], strategies,
            name: str | None = None) -> MetaVar:
        return self.op(op, args, [shape], strategies, name)[0]

    # ---------------------------------------------------------------- ops
    def mm(self, a: MetaVar, b: MetaVar, name: str | None = None) -> MetaVar:
        return self.one("aten.mm.default", [a, b], (a.shape[0], b.shape[1]), mm_rules(), name)

    def matmul4(self, a: MetaVar, b: MetaVar) -> MetaVar:
        return self.one("aten.matmul.default", [a, b], (*a.shape[:3], b.shape[3]), matmul4_rules())

    def t(self, x: MetaVar) -> MetaVar:
        return self.one("aten.t.default", [x], (x.shape[1], x.shape[0]), transpose_rules(2))

    def transpose4(self, x: MetaVar) -> MetaVar:
        return self.one("aten.transpose.int", [x], (*x.shape[:2], x.shape[3], x.shape[2]), transpose_rules(4))

    def unary(self, op: str, x: MetaVar, linear: bool = False, name: str | None = None) -> MetaVar:
        return self.one(op, [x], x.shape, elementwise_rules(len(x.shape), 1, (0,) if linear else ()), name)

    def add(self, a: MetaVar, b: MetaVar, name: str | None = None) -> MetaVar:
        return self.one("aten.add.Tensor", [a, b], a.shape, elementwise_rules(len(a.shape), 2, (0, 1)), name)

    def bias_add(self, x: MetaVar, b: MetaVar) -> MetaVar:
        return self.one("aten.add.Tensor", [x, b], x.shape, bias_add_rules())

    def sum0(self, x: MetaVar) -> MetaVar:
        return self.one("aten.sum.dim_IntList", [x], (x.shape[1],), sum0_rules())

    def softmax(self, x: MetaVar) -> MetaVar:
        r = len(x.shape)
        return self.one("aten._softmax.default", [x], x.shape, elementwise_rules(r, 1, (), (r - 1,)))

    def softmax_backward(self, g: MetaVar, y: MetaVar) -> MetaVar:
        r = len(g.shape)
        return self.one("aten._softmax_backward_data.default", [g, y], g.shape, elementwise_rules(r, 2, (), (r - 1,)))

    def gelu_backward(self, g: MetaVar, x: MetaVar) -> MetaVar:
        r = len(g.shape)
        strategies = elementwise_rules(r, 2) + rules(_table([["N"] * r] * 2), "{S1: reduce(sum)}", "[[S1(sum)], []]")
        return self.one("aten.gelu_backward.default", [g, x], g.shape, strategies)

    def layer_norm(self, x: MetaVar, w: MetaVar, b: MetaVar) -> MetaVar:
        return self.one("aten.native_layer_norm.default", [x, w, b], x.shape, layer_norm_rules())

    def layer_norm_backward(self, g: MetaVar, x: MetaVar, w: MetaVar) -> tuple[MetaVar, ...]:
        return self.op("aten.native_layer_norm_backward.default", [g, x, w], [x.shape, w.shape, w.shape],
                       layer_norm_backward_rules())

    def to_heads(self, x: MetaVar, batch: int, heads: int) -> MetaVar:
        t, h = x.shape
        return self.one("to_heads", [x], (batch, heads, t // batch, h // heads), to_heads_rules())

    def from_heads(self, x: MetaVar) -> MetaVar:
        b, h, s, d = x.shape
        return self.one("from_heads", [x], (b * s, h * d), from_heads_rules())

    def build(self, outputs: Sequence[MetaVar]) -> tuple[MetaIR, dict[str, tuple[spec.Strategy, ...]]]:
        return MetaIR(tuple(self.inputs), tuple(self.ops), tuple(outputs)), dict(self.strategies)


def mlp(batch: int, dim: int, hidden: int) -> tuple[MetaIR, dict]:
    """y = relu(x @ w1) @ w2, nodes 'mm1', 'relu', 'mm2'."""
    g = GraphBuilder()
    x = g.input("x", (batch, dim))
    w1 = g.input("w1", (dim, hidden))
    w2 = g.input("w2", (hidden, dim))
    h = g.mm(x, w1, "mm1")
    a = g.unary("aten.relu.default", h, name="relu")
    y = g.mm(a, w2, "mm2")
    return g.build([y])


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 12
    batch: int = 8
    seq: int = 512
    hidden: int = 768
    heads: int = 12
    backward: bool = True


def gpt(cfg: GPTConfig) -> tuple[MetaIR, dict, list[tuple[str, str]]]:
    """A pre-LN GPT stack (attention + GELU MLP per layer) and, when ``cfg.backward``, its
    backward pass. Returns (ir, strategies by node, [(parameter, gradient)])."""
    g = GraphBuilder()
    b, h, t = cfg.batch, cfg.hidden, cfg.batch * cfg.seq
    x = g.input("x", (t, h))
    saved = []
    params: list[dict[str, MetaVar]] = []
    for layer in range(cfg.layers):
        p = {k: g.input(f"l{layer}.{k}", s) for k, s in [
            ("ln1_w", (h,)), ("ln1_b", (h,)), ("wq", (h, h)), ("wk", (h, h)), ("wv", (h, h)),
            ("bq", (h,)), ("bk", (h,)), ("bv", (h,)), ("wo", (h, h)), ("bo", (h,)),
            ("ln2_w", (h,)), ("ln2_b", (h,)), ("w1", (h, 4 * h)), ("b1", (4 * h,)), ("w2", (4 * h, h)), ("b2", (h,)),
        ]}
        params.append(p)
        s: dict[str, MetaVar] = {"x": x}
        s["ln1"] = g.layer_norm(x, p["ln1_w"], p["ln1_b"])
        for k in "qkv":
            s[f"{k}_lin"] = g.mm(s["ln1"], p[f"w{k}"])
            s[f"{k}_b"] = g.bias_add(s[f"{k}_lin"], p[f"b{k}"])
            s[k] = g.to_heads(s[f"{k}_b"], b, cfg.heads)
        s["kt"] = g.transpose4(s["k"])
        s["scores"] = g.matmul4(s["q"], s["kt"])
        s["scaled"] = g.unary("aten.mul.Scalar", s["scores"], linear=True)
        s["probs"] = g.softmax(s["scaled"])
        s["ctx"] = g.matmul4(s["probs"], s["v"])
        s["ctx2"] = g.from_heads(s["ctx"])
        s["proj"] = g.bias_add(g.mm(s["ctx2"], p["wo"]), p["bo"])
        s["h1"] = g.add(x, s["proj"])
        s["ln2"] = g.layer_norm(s["h1"], p["ln2_w"], p["ln2_b"])
        s["fc1"] = g.bias_add(g.mm(s["ln2"], p["w1"]), p["b1"])
        s["act"] = g.unary("aten.gelu.default", s["fc1"])
        s["fc2"] = g.bias_add(g.mm(s["act"], p["w2"]), p["b2"])
        x = g.add(s["h1"], s["fc2"])
        saved.append(s)
    outputs = [x]
    if cfg.backward:
        grads: list[tuple[str, str]] = []
        dx = g.input("dy", (t, h))
        for layer in reversed(range(cfg.layers)):
            s, p = saved[layer], params[layer]
            d: dict[str, MetaVar] = {}

            def linear_bwd(dout: MetaVar, inp: MetaVar, w: MetaVar, key: str) -> MetaVar:
                d[key] = g.mm(g.t(inp), dout)  # weight gradient
                return g.mm(dout, g.t(w))  # input gradient

            # MLP
            d["b2"] = g.sum0(dx)
            dact = linear_bwd(dx, s["act"], p["w2"], "w2")
            dfc1 = g.gelu_backward(dact, s["fc1"])
            d["b1"] = g.sum0(dfc1)
            dln2 = linear_bwd(dfc1, s["ln2"], p["w1"], "w1")
            dh1_ln, d["ln2_w"], d["ln2_b"] = g.layer_norm_backward(dln2, s["h1"], p["ln2_w"])
            dh1 = g.add(dx, dh1_ln)
            # attention
            d["bo"] = g.sum0(dh1)
            dctx2 = linear_bwd(dh1, s["ctx2"], p["wo"], "wo")
            dctx = g.to_heads(dctx2, b, cfg.heads)
            dprobs = g.matmul4(dctx, g.transpose4(s["v"]))
            dv = g.matmul4(g.transpose4(s["probs"]), dctx)
            dscaled = g.softmax_backward(dprobs, s["probs"])
            dscores = g.unary("aten.mul.Scalar", dscaled, linear=True)
            dq = g.matmul4(dscores, g.transpose4(s["kt"]))
            dkt = g.matmul4(g.transpose4(s["q"]), dscores)
            dk = g.transpose4(dkt)
            dln1 = None
            for k, dk_heads in (("q", dq), ("k", dk), ("v", dv)):
                dflat = g.from_heads(dk_heads)
                d[f"b{k}"] = g.sum0(dflat)
                part = linear_bwd(dflat, s["ln1"], p[f"w{k}"], f"w{k}")
                dln1 = part if dln1 is None else g.add(dln1, part)
            dx_ln, d["ln1_w"], d["ln1_b"] = g.layer_norm_backward(dln1, s["x"], p["ln1_w"])
            dx = g.add(dh1, dx_ln)
            for k, v in d.items():
                grads.append((p[k].name, v.name))
        outputs.append(dx)
        grad_vars = {v.name: v for op in g.ops for v in op.outputs}
        outputs += [grad_vars[gname] for _, gname in grads]
        ir, strategies = g.build(outputs)
        return ir, strategies, grads
    ir, strategies = g.build(outputs)
    return ir, strategies, []


__all__ = [
    "GPTConfig", "GraphBuilder", "bias_add_rules", "elementwise_rules", "from_heads_rules", "gpt",
    "layer_norm_backward_rules",
    "layer_norm_rules", "matmul4_rules", "mlp", "mm_rules", "rules", "sum0_rules", "to_heads_rules", "transpose_rules",
]
