#!/usr/bin/env python
"""DTensor's rules at the edges of their arguments: plain DTensor against ``register()``.

    python benchmarks/dtensor_edge_bench.py                  # every family
    python benchmarks/dtensor_edge_bench.py --family uneven --only-failing

Families: ``empty-dims`` (``dim=[]``), ``from-end`` (dims -1 and -2, the gradients of
``select`` and ``narrow`` among them), ``uneven`` (10 rows and 7 columns over 4 ranks),
``edge-values``, ``arguments`` (losses and gradients with an argument that changes what
they sum: ignored targets, class weights, ``scale_grad_by_freq``), ``partial`` (ops on a
Partial input they are not linear, or not non-decreasing, in: the Partial(sum) of ``a @ b``
with a's columns and b's rows cut, the Partial(max) of ``m.amax(0)`` with m's rows cut),
``masked`` (a row-cut table's lookup, which DTensor gives as a masked Partial, then a
transpose, reshape, slice or sum that moves the positions its mask names), ``in-place``
(in-place ops DTensor has neither a rule nor a decomposition for, or whose decomposition
finds no strategy: ``addr_``, ``masked_scatter_``, ``put_``, ``tril_``, ...; and ops that return
nothing and write the tensors given, ``_fused_sgd_``, ``_foreach_copy_``; and ``s[mask] = v``, which
DTensor's ``index_put_`` rule refuses on a cut s).

PyTorch's DTensor OpInfo test (``dtensor_opinfo_bench.py``) runs OpInfo's samples, whose
sizes it sets to split evenly, with the dims they name. These calls take what users write
and that test does not: ``dim=[]`` (every dim, in ATen: ``torch.amax(x)``'s default), a dim
counted from the end (``cumsum(x, -1)``), sizes that do not split evenly over the mesh (10
rows over 4 ranks, which DTensor cuts as ``torch.chunk`` does), and edge values of
``tril``, ``roll``, ``flip`` and the like. Each call runs with every placement of its inputs
on a mesh of 4 (Replicate or Shard along each dim; fake process group and
``LocalTensorMode``) and is compared, on every simulated rank, with one device.

Per call and column: placements right / wrong (another value or shape, silently) / error
(an exception, DTensor's refusal included). ``regressions``: placements right on plain
DTensor and not after ``register()``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metaspmd.cli import pipe_safe

WORLD = 4
FAMILIES = ("empty-dims", "from-end", "uneven", "edge-values", "arguments", "partial", "masked", "in-place")


def cases(torch) -> list[tuple[str, str, object, list]]:
    """(family, call, fn, inputs); inputs drawn here, outside LocalTensorMode."""
    F, A = torch.nn.functional, torch.ops.aten
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    x, y = rand(8, 12).abs() + 0.5, rand(8, 12)
    ux, uy, pix = rand(10, 7), rand(10, 7), rand(2, 12, 3, 5)
    out = []
    for name, fn in {
        "amax(x, keepdim=True)": lambda t: torch.amax(t, keepdim=True),
        "amin(x, [], True)": lambda t: A.amin.default(t, [], True),
        "sum(x, [], True)": lambda t: A.sum.dim_IntList(t, [], True),
        "sum(x, [])": lambda t: A.sum.dim_IntList(t, []),
        "mean(x, [], True)": lambda t: A.mean.dim(t, [], True),
        "nansum(x, [], True)": lambda t: A.nansum.default(t, [], True),
        "logsumexp(x, [], True)": lambda t: A.logsumexp.default(t, [], True),
        "vector_norm(x, 2, [], True)": lambda t: A.linalg_vector_norm.default(t, 2, [], True),
        "var(x, [], keepdim=True)": lambda t: A.var.correction(t, [], correction=1, keepdim=True),
        "std(x, [], keepdim=True)": lambda t: A.std.correction(t, [], correction=1, keepdim=True),
        "var_mean(x, [], keepdim=True)": lambda t: A.var_mean.correction(t, [], correction=1, keepdim=True)[1],
        "grad of norm(x, inf)": lambda t: _grad(torch, lambda v: torch.linalg.vector_norm(v, float("inf")), t),
        "any(x > 1, [], True)": lambda t: A.any.dims(t > 1, [], True),
    }.items():
        out.append(("empty-dims", name, fn, [x]))
    for d in (-1, -2):
        for name, fn in {
            "cumsum": lambda t, d=d: torch.cumsum(t, d), "cumprod": lambda t, d=d: torch.cumprod(t, d),
            "logcumsumexp": lambda t, d=d: torch.logcumsumexp(t, d), "argmax": lambda t, d=d: torch.argmax(t, d),
            "argmin": lambda t, d=d: torch.argmin(t, d, keepdim=True), "cummax": lambda t, d=d: torch.cummax(t, d)[0],
            "softmax": lambda t, d=d: torch.softmax(t, d), "sort": lambda t, d=d: torch.sort(t, d)[0],
            "topk": lambda t, d=d: torch.topk(t, 2, d)[0],
        }.items():
            out.append(("from-end", f"{name}(x, {d})", fn, [y]))
    w = rand(4, 6)
    for name, (fn, ins) in {
        "grad of select(x, -1, 1)": (lambda a: _grad(torch, lambda v: v.select(-1, 1).pow(2).sum(), a), [y]),
        "grad of narrow(x, -1, 2, 4) @ w": (
            lambda a, b: _grad(torch, lambda v: (v.narrow(-1, 2, 4) @ b).pow(2).sum(), a), [y, w]),
    }.items():
        out.append(("from-end", name, fn, ins))
    for name, (fn, ins) in {
        "mse_loss": (F.mse_loss, [ux, uy]), "smooth_l1_loss": (F.smooth_l1_loss, [ux, uy]),
        "soft_margin_loss": (lambda a, b: F.soft_margin_loss(a, b.sign()), [ux, uy]),
        "bce_with_logits": (lambda a, b: F.binary_cross_entropy_with_logits(a, b.sigmoid()), [ux, uy]),
        "huber_loss": (F.huber_loss, [ux, uy]), "l1_loss": (F.l1_loss, [ux, uy]),
        "kl_div(batchmean)": (lambda a, b: F.kl_div(a.log_softmax(1), b.softmax(1), reduction="batchmean"), [ux, uy]),
        "mean(x)": (lambda a: a.mean(), [ux]), "var(x, 0)": (lambda a: a.var(0), [ux]),
        "pixel_shuffle(x, 2)": (lambda a: F.pixel_shuffle(a, 2), [pix]),
        "layer_norm": (lambda a: F.layer_norm(a, (7,)), [ux]),
        "cat([x, y], 1)": (lambda a, b: torch.cat([a, b], 1), [ux, uy]), "x @ y.T": (lambda a, b: a @ b.T, [ux, uy]),
        "repeat_interleave(x, 2, 0)": (lambda a: a.repeat_interleave(2, 0), [ux]),
        "flip(x, [0])": (lambda a: a.flip(0), [ux]),
    }.items():
        out.append(("uneven", name, fn, ins))
    for name, (fn, ins) in {
        "tril(x)": (torch.tril, [y]), "triu(x, 1)": (lambda a: torch.triu(a, 1), [y]),
        "flip(x, [])": (lambda a: a.flip([]), [y]),
        "roll(x, 3, 0)": (lambda a: a.roll(3, 0), [y]), "roll(x, 5)": (lambda a: a.roll(5), [y]),
        "diagonal(x, 1)": (lambda a: a.diagonal(1), [y]), "narrow(x, 1, -5, 3)": (lambda a: a.narrow(1, -5, 3), [y]),
        "x[1::3]": (lambda a: a[1::3], [y]), "pad(x, (-1, -2))": (lambda a: F.pad(a, (-1, -2)), [y]),
        "vector_norm(x, 0)": (lambda a: torch.linalg.vector_norm(a, 0), [y]), "prod(x)": (lambda a: a.prod(), [x]),
    }.items():
        out.append(("edge-values", name, fn, ins))
    logits, logits2d, classes = rand(8, 5), rand(4, 5, 3, 3), torch.tensor([0.2, 1.0, 3.0, 0.5, 2.0])
    targets = torch.tensor([0, 1, -100, -100, -100, 2, 3, 4])  # -100: ignore_index's default
    targets2d = torch.randint(0, 5, (4, 3, 3), generator=g)
    targets2d[:1] = -100
    ids, table = torch.tensor([[1, 1, 1, 2], [3, 1, 4, 4], [0, 2, 2, 2], [5, 1, 1, 3]] * 2), rand(8, 6)
    for name, (fn, ins) in {
        "cross_entropy(x, t)": (F.cross_entropy, [logits, targets]),
        "cross_entropy(x, t, weight=w)": (lambda a, b, c: F.cross_entropy(a, b, weight=c),
                                          [logits, targets.clamp(min=0), classes]),
        "cross_entropy(x, t, ls=0.1)": (lambda a, b: F.cross_entropy(a, b, label_smoothing=0.1), [logits, targets]),
        "cross_entropy 2-d (x, t)": (F.cross_entropy, [logits2d, targets2d]),
        "nll_loss(x, t, reduction=sum)": (lambda a, b: F.nll_loss(a, b, reduction="sum"), [logits, targets]),
        "grad of cross_entropy(x, t)": (lambda a, b: _grad(torch, lambda v: F.cross_entropy(v, b), a),
                                        [logits, targets]),
        "grad of embedding, by freq": (lambda e, i: _grad(
            torch, lambda v: F.embedding(i, v, scale_grad_by_freq=True).pow(2).sum(), e), [table, ids]),
        "grad of embedding, padding": (lambda e, i: _grad(
            torch, lambda v: F.embedding(i, v, padding_idx=1).pow(2).sum(), e), [table, ids]),
    }.items():
        out.append(("arguments", name, fn, ins))
    ones, fractions = torch.ones(2, 4), torch.full((4, 3), 0.6)
    cancel = torch.tensor([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0], [2.0, 0.5, 1.0], [-2.0, -0.5, -1.0]])  # a @ b = 0
    parts = rand(4, 8, 5)
    parts[0, 0, 0] = -50.0
    with_inf = parts.clone()
    with_inf[1, 0, 1] = float("inf")
    for name, (fn, ins) in {
        "_powsum(a @ b, 2)": (lambda a, b: torch.linalg._powsum(a @ b, 2), [ones, cancel]),
        "any(a @ b)": (lambda a, b: torch.any(a @ b), [ones, cancel]),
        "sum(a @ b, dtype=int64)": (lambda a, b: torch.sum(a @ b, dtype=torch.int64), [ones, fractions]),
        "vector_norm(m.amax(0), inf)": (lambda m: torch.linalg.vector_norm(m.amax(0), float("inf")), [parts]),
        "threshold(m.amax(0), 0, 5)": (lambda m: F.threshold(m.amax(0), 0.0, 5.0), [parts]),
        "nan_to_num(amax, posinf=-5)": (lambda m: torch.nan_to_num(m.amax(0), posinf=-5.0), [with_inf]),
        "vector_norm(x, 2, 0).sum()": (lambda m: torch.linalg.vector_norm(m[0], 2, dim=0).sum(), [parts]),
        "fft(m.amax(0), dim=0).real": (lambda m: torch.fft.fft(m.amax(0), dim=0).real, [parts]),
        "m.amax(0).to(int8)": (lambda i: i.amax(0).to(torch.int8), [torch.randint(-300, 300, (4, 8, 5), generator=g)]),
        "m.amax(0).view(int32)": (lambda m: m.amax(0).view(torch.int32), [parts]),
        "neg(m.amax(0)), uint8": (lambda u: torch.neg(u.amax(0)),
                                  [torch.randint(0, 10, (4, 8, 5), generator=g).to(torch.uint8)]),
    }.items():
        out.append(("partial", name, fn, ins))
    square, picks = torch.randint(0, 8, (4, 4), generator=g), torch.randint(0, 12, (8, 1), generator=g)
    lookup = {  # a row-cut table's lookup, masked Partial on plain DTensor, then an op that moves positions
        "embedding(i, w).transpose(0, 1)": lambda w, i: F.embedding(i, w).transpose(0, 1),
        "embedding(i, w).reshape(-1, 6)": lambda w, i: F.embedding(i, w).reshape(-1, 6),
        "embedding(i, w).sum(0)": lambda w, i: F.embedding(i, w).sum(0),
        "embedding(i, w)[:, 1:]": lambda w, i: F.embedding(i, w)[:, 1:],
        "embedding(i, w).permute(2, 0, 1)": lambda w, i: F.embedding(i, w).permute(2, 0, 1),
        "embedding(i, w).sum(-1)": lambda w, i: F.embedding(i, w).sum(-1),
    }
    for name, fn in lookup.items():
        out.append(("masked", name, fn, [table, square]))
    out.append(("masked", "gather(x, 1, i).transpose(0, 1)", lambda a, i: torch.gather(a, 1, i).transpose(0, 1),
                [x, picks]))
    rows, flat, vals = torch.tensor([1, 3, 3, 6]), torch.tensor([0, 7, 13, 95, 20, 7]), rand(6)
    mask, source, u, v = torch.rand(8, 12, generator=g) > 0.5, rand(96), rand(8), rand(12)
    def own(s):
        """A copy of self that each simulated rank holds apart: LocalTensorMode keeps a
        replicated DTensor's local tensor as one storage, which an in-place op would write
        once per rank (real ranks each write their own)."""
        from torch.distributed.tensor import DTensor, Shard

        if not isinstance(s, DTensor):
            return s.clone()
        return s.redistribute(s.device_mesh, [Shard(0)] * s.device_mesh.ndim).redistribute(s.device_mesh, s.placements)

    def written(call, *selves):
        """An op that returns nothing (``_fused_sgd_``) on own copies of the tensors it
        writes: the copies, each as it is after the call, side by side."""
        selves = [own(t) for t in selves]
        call(*selves)
        return torch.cat(selves, 1) if len(selves) > 1 else selves[0]

    def assigned(s, key, value):
        """``s[key] = value`` (``index_put_``) on an own copy of s, the copy returned."""
        s = own(s)
        s[key] = value
        return s

    in_place = {
        "addr_(s, u, v, alpha=2)": (lambda s, a, b: own(s).addr_(a, b, alpha=2.0), [y, u, v]),
        "masked_scatter_(s, m, src)": (lambda s, m, t: own(s).masked_scatter_(m, t), [y, mask, source]),
        "put_(s, i, v)": (lambda s, i, t: own(s).put_(i, t), [y, flat, vals]),
        "put_(s, i, v, accumulate)": (lambda s, i, t: own(s).put_(i, t, accumulate=True), [y, flat, vals]),
        "embedding_renorm_(w, i, 1, 2)": (lambda w, i: torch.embedding_renorm_(own(w), i, 1.0, 2.0), [y, rows]),
        "_add_relu_(s, o)": (lambda s, o: A._add_relu_.Tensor(own(s), o), [y, x]),
        "floor_divide_(s, o)": (lambda s, o: own(s).floor_divide_(o), [y, x]),
        "tril_(s, -1)": (lambda s: own(s).tril_(-1), [y]),
        "cumsum_(s, -1)": (lambda s: own(s).cumsum_(-1), [y]),
        "_fused_sgd_([p], [g], [m])": (lambda p, gr, m: written(lambda p, m: A._fused_sgd_(
            [p], [gr], [m], weight_decay=0.1, momentum=0.9, lr=0.1, dampening=0.0, nesterov=True, maximize=False,
            is_first_step=False), p, m), [y, x, u.outer(v)]),
        "_foreach_copy_([s], [o])": (lambda s, o: written(lambda s: A._foreach_copy_([s], [o]), s), [y, x]),
        "s[m] = 0 (m: bool, s's shape)": (lambda s, m: assigned(s, m, 0.0), [y, mask]),
        "s[r] = 1 (r: bool rows)": (lambda s, r: assigned(s, r, 1.0), [y, torch.rand(8, generator=g) > 0.5]),
        "s[:, c] = v (c: bool columns)": (lambda s, c, t: assigned(s, (slice(None), c), t),
                                         [y, torch.arange(12) % 3 == 0, rand(8, 4)]),
        "s[i] = 2 (i: rows)": (lambda s, i: assigned(s, i, 2.0), [y, rows]),
        "_foreach_maximum_([s], 0.3)": (lambda s: written(lambda s: A._foreach_maximum_.Scalar([s], 0.3), s), [y]),
    }
    for name, (fn, ins) in in_place.items():
        out.append(("in-place", name, fn, ins))
    return out


def _grad(torch, f, t):
    t = t.detach().requires_grad_()
    f(t).backward()
    return t.grad


def run(torch, fn, ins, mesh) -> tuple[int, int, int]:
    """(right, wrong, error) over every placement of the inputs."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    want = fn(*ins)
    counts = [0, 0, 0]
    for placements in itertools.product(*[[Replicate()] + [Shard(d) for d in range(t.dim())] for t in ins]):
        try:
            got = fn(*[distribute_tensor(t, mesh, [p]) for t, p in zip(ins, placements)])
            full = got.full_tensor() if isinstance(got, DTensor) else got
            ranks = list(full._local_tensors.values()) if hasattr(full, "_local_tensors") else [full]
            right = all(r.shape == want.shape and torch.allclose(r.double(), want.double(), rtol=1e-4, atol=1e-5,
                                                                  equal_nan=True) for r in ranks)
            counts[0 if right else 1] += 1
        except Exception:  # noqa: BLE001 -- DTensor's refusal counts as an error, not a wrong answer
            counts[2] += 1
    return tuple(counts)


@pipe_safe
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--family", choices=FAMILIES, action="append", help="only these families (default: all)")
    ap.add_argument("--only-failing", action="store_true", help="print only calls not right on every placement")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.backends.torch.dtensor_rules import register

    warnings.filterwarnings("ignore")
    dist.init_process_group("fake", rank=0, world_size=WORLD)
    chosen = [c for c in cases(torch) if not args.family or c[0] in args.family]
    results, times = {}, {}
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        for column in ("plain", "register()"):
            t = time.perf_counter()
            if column != "plain":
                report = register()
            for family, name, fn, ins in chosen:
                results.setdefault((family, name), {})[column] = run(torch, fn, ins, mesh)
            times[column] = time.perf_counter() - t

    print(f"{'family':13} {'call':30} {'plain right/wrong/error':>24} {'register() right/wrong/error':>29}")
    totals = {c: [0, 0, 0] for c in ("plain", "register()")}
    regressions = 0
    for (family, name), by in results.items():
        for c, counts in by.items():
            totals[c] = [a + b for a, b in zip(totals[c], counts)]
        regressions += max(0, by["plain"][0] - by["register()"][0])
        if args.only_failing and not (by["plain"][1] or by["plain"][2] or by["register()"][1] or by["register()"][2]):
            continue
        print(f"{family:13} {name:30} {'/'.join(map(str, by['plain'])):>24} {'/'.join(map(str, by['register()'])):>29}")
    print(f"\n{'totals':44} {'/'.join(map(str, totals['plain'])):>24} {'/'.join(map(str, totals['register()'])):>29}")
    print(f"calls: {len(results)}; calls wrong anywhere: plain {sum(1 for b in results.values() if b['plain'][1])}, "
          f"register() {sum(1 for b in results.values() if b['register()'][1])}; placements right on plain and not "
          f"after register() (regressions): {regressions}")
    print(f"register(): {report}")
    print("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
