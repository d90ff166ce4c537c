"""In-place ops DTensor 2.13 has no rule for, nor a decomposition (``addr_``,
``masked_scatter_``, ``put_``, ...), and ops that return nothing and write the tensors they
are given (``_fused_sgd_``, ``_fused_adagrad_``, ``_foreach_copy_``): plain DTensor refuses
them at every placement; under register() they run on their verified rules, the written
tensors written where they lie (moved into a copy and written back where no rule keeps
them), and a Partial written tensor that would have to move is refused, naming the op."""

import itertools


import pytest

torch = pytest.importorskip("torch")
from torch.distributed._local_tensor import LocalTensor  # noqa: E402
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor  # noqa: E402

from metaspmd.backends.torch import dtensor_rules  # noqa: E402

WORLD = 4
_G = torch.Generator().manual_seed(3)
A, B = torch.randn(8, 4, generator=_G, dtype=torch.float64), torch.randn(4, 6, generator=_G, dtype=torch.float64)
X = A @ B
U, V = torch.randn(8, generator=_G, dtype=torch.float64), torch.randn(6, generator=_G, dtype=torch.float64)
OTHER = torch.randn(8, 6, generator=_G, dtype=torch.float64)
MASK = torch.rand(8, 6, generator=_G) > 0.5
SOURCE = torch.randn(48, generator=_G, dtype=torch.float64)
FLAT = torch.tensor([0, 7, 13, 47, 20, 7])
VALUES = torch.randn(6, generator=_G, dtype=torch.float64)
ROWS = torch.tensor([1, 3, 3, 6])
aten = torch.ops.aten
# name -> (the call on self and the other inputs, the other inputs (placed Replicate),
# whether a Partial self is right: the op is linear in self and its other inputs can be made Partial)
CALLS = {
    "_add_relu_.Tensor": (lambda s, o: aten._add_relu_.Tensor(s, o), [OTHER], False),
    "_add_relu_.Scalar": (lambda s: aten._add_relu_.Scalar(s, 0.3), [], False),
    "addr_": (lambda s, a, b: s.addr_(a, b, beta=0.5, alpha=2.0), [U, V], True),
    "embedding_renorm_": (lambda s, i: torch.embedding_renorm_(s, i, 1.0, 2.0), [ROWS], False),
    "masked_scatter_": (lambda s, m, src: s.masked_scatter_(m, src), [MASK, SOURCE], False),
    "put_": (lambda s, i, v: s.put_(i, v), [FLAT, VALUES], False),
    "put_ (accumulate)": (lambda s, i, v: s.put_(i, v, accumulate=True), [FLAT, VALUES], True),
}
PLACEMENTS = (Shard(0), Shard(1), Replicate(), Partial("sum"))


def _self(mesh, placement):
    if placement == Partial("sum"):  # each rank's product of its columns of A and rows of B
        return distribute_tensor(A, mesh, [Shard(1)]) @ distribute_tensor(B, mesh, [Shard(0)])
    if placement == Replicate():  # gathered: each simulated rank has storage of its own to write
        return distribute_tensor(X.clone(), mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
    return distribute_tensor(X.clone(), mesh, [placement])


def _run(mesh) -> dict:
    """(name, placement) -> (returned self, self's placements after, its value right on every
    rank), or the error's text."""
    found = {}
    for name, (fn, others, _) in CALLS.items():
        want = fn(X.clone(), *others)
        for placement in PLACEMENTS:
            s = _self(mesh, placement)
            try:
                out = fn(s, *[distribute_tensor(t, mesh, [Replicate()]) for t in others])
            except Exception as e:  # noqa: BLE001 -- the refusals, compared below
                found[name, placement] = f"{type(e).__name__}: {e}"
                continue
            full = s.full_tensor()
            ranks = list(full._local_tensors.values()) if isinstance(full, LocalTensor) else [full]
            found[name, placement] = (out is s, s.placements, all(torch.allclose(r, want) for r in ranks))
    return found


@pytest.fixture(scope="module")
def runs(plain_and_registered, tmp_path_factory):
    found, report = plain_and_registered(_run, tmp_path_factory.mktemp("rules"), WORLD)
    return found["plain"], found["register()"], report


@pytest.mark.parametrize("name", CALLS)
def test_an_in_place_op_dtensor_has_no_rule_for_runs_on_the_verified_rules(runs, name):
    plain, registered, report = runs
    op = f"aten.{name.split(' ')[0]}"
    op = op if "." in name else op + ".default"
    assert op in report.installed and op in report.handled
    for placement in PLACEMENTS:
        assert "does not have a sharding strategy registered" in plain[name, placement], plain[name, placement]
        got = registered[name, placement]
        if placement == Partial("sum") and not CALLS[name][2]:
            # nothing keeps a Partial self, and DTensor moves nothing into a Partial placement
            assert isinstance(got, str) and op in got and "moves a tensor the op writes in place" in got, got
            continue
        assert got == (True, (placement,), True), (placement, got)


def test_the_in_place_ops_installed_write_values_into_self_alone():
    """Random ops, in-place views, storage writes and the ops DTensor decomposes stay out."""
    installable = dtensor_rules._in_place_of_values
    for op in (aten.addr_.default, aten.masked_scatter_.default, aten.put_.default):
        assert installable(op)
    for op in (aten.uniform_.default, aten.bernoulli_.Tensor, aten.transpose_.default, aten.t_.default,
               aten.as_strided_.default, aten.resize_.default, aten.set_.source_Tensor, aten.index_add_.default,
               aten.scatter_add_.default, aten.add.out, aten._amp_update_scale_.default,
               aten._foreach_add.List_out, aten.set_data.default):
        assert not installable(op), op


def test_ops_that_return_nothing_and_write_values_are_installed_too():
    installable = dtensor_rules._in_place_of_values
    for op in (aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr, aten._fused_adagrad_.default,
               aten._foreach_copy_.default, aten._foreach_maximum_.Scalar, aten._cummax_helper.default):
        assert installable(op) and not dtensor_rules._supported_schema(op), op


def _placed(mesh, x, placement):
    """``x`` placed so that each simulated rank holds storage of its own (a Partial(sum) as
    the product of a column cut of x and a row cut of the identity)."""
    if placement == Partial("sum"):
        eye = torch.eye(x.shape[1], dtype=x.dtype)
        return distribute_tensor(x, mesh, [Shard(1)]) @ distribute_tensor(eye, mesh, [Shard(0)])
    return distribute_tensor(x.clone(), mesh, [Shard(0)]).redistribute(mesh, [placement])


P, G, M = (torch.randn(8, 4, generator=_G, dtype=torch.float64) for _ in range(3))
# name -> (a call on three tensors, the positions of those it writes)
VOID_CALLS = {
    "_fused_sgd_": (lambda p, g, m: aten._fused_sgd_.default(
        [p], [g], [m], weight_decay=0.1, momentum=0.9, lr=0.1, dampening=0.0, nesterov=True, maximize=False,
        is_first_step=False), (0, 2)),
    "_foreach_copy_": (lambda p, g, m: aten._foreach_copy_.default([p, m], [g, g]), (0, 2)),
    "_foreach_maximum_.Scalar": (lambda p, g, m: aten._foreach_maximum_.Scalar([p, g, m], 0.3), (0, 1, 2)),
}


def _run_void(mesh) -> dict:
    """(name, placements) -> whether every tensor is right and placed as before, or the error."""
    found = {}
    for name, (fn, _) in VOID_CALLS.items():
        want = [P.clone(), G.clone(), M.clone()]
        fn(*want)
        for placements in itertools.product([Shard(0), Shard(1), Replicate(), Partial("sum")], repeat=3):
            ts = [_placed(mesh, x, p) for x, p in zip((P, G, M), placements)]
            try:
                fn(*ts)
            except Exception as e:  # noqa: BLE001 -- the refusals, compared below
                found[name, placements] = f"{type(e).__name__}: {e}"
                continue
            fulls = [t.full_tensor() for t in ts]
            ranks = [list(f._local_tensors.values()) if isinstance(f, LocalTensor) else [f] for f in fulls]
            found[name, placements] = (tuple(t.placements[0] for t in ts) == placements
                                       and all(torch.allclose(r, w) for rs, w in zip(ranks, want) for r in rs))
    return found


@pytest.mark.slow  # every op that returns nothing, on real DTensor (~20 s)
def test_ops_that_return_nothing_run_on_the_verified_rules(plain_and_registered, tmp_path):
    """Every call whose written tensors are cut or replicated is right, whatever the other
    inputs' placements (a Partial(sum) gradient included), with each tensor where it lay: a
    fused SGD step with its momentum buffer placed unlike its parameter moves the buffer
    into a copy and writes it back. A Partial written tensor is right where nothing moves
    it; where something would, the call is refused, naming the op, never computed wrong:
    DTensor moves nothing written into a Partial placement, nor a cut into one."""
    found, report = plain_and_registered(_run_void, tmp_path, WORLD)
    for name in ("aten._fused_sgd_.default", "aten._foreach_copy_.default", "aten._foreach_maximum_.Scalar"):
        assert name in report.installed and name in report.handled
    plain, registered = found["plain"], found["register()"]
    assert all("does not have a sharding strategy registered" in str(v) for v in plain.values())
    for (name, placements), got in registered.items():
        if not any(placements[i] == Partial("sum") for i in VOID_CALLS[name][1]):
            assert got is True, (name, placements, got)
        else:
            refused = isinstance(got, str) and name in got and ("writes in place" in got or "into a Partial" in got)
            assert got is True or refused, (name, placements, got)
    assert registered["_fused_sgd_", (Partial("sum"),) * 3] is True  # linear: nothing moves


KEYS = {  # name -> (the key of s[key] = value, its tensor, the value)
    "s[m] = 0": (lambda m: m, P > 0.2, 0.0),
    "s[r] = 1": (lambda r: r, torch.tensor([True, False, False, True] * 2), 1.0),
    "s[:, c] = 2": (lambda c: (slice(None), c), torch.tensor([True, False, True, True]), 2.0),
    "s[i] = 3": (lambda i: i, torch.tensor([1, 6, 6, 2]), 3.0),
}


def _run_assignments(mesh) -> dict:
    """(name, self's placement, the key's) -> right and placed as before, or the error."""
    found = {}
    for name, (key, k, value) in KEYS.items():
        want = P.clone()
        want[key(k)] = value
        for mine, theirs in itertools.product([Shard(0), Shard(1), Replicate()], [Shard(0), Replicate()]):
            s = _placed(mesh, P, mine)
            try:
                s[key(distribute_tensor(k, mesh, [theirs]))] = value
            except Exception as e:  # noqa: BLE001 -- the refusals, compared below
                found[name, mine, theirs] = f"{type(e).__name__}: {e}"
                continue
            full = s.full_tensor()
            ranks = list(full._local_tensors.values()) if isinstance(full, LocalTensor) else [full]
            found[name, mine, theirs] = s.placements == (mine,) and all(torch.equal(r, want) for r in ranks)
    return found


def test_an_assignment_through_a_mask_or_positions_into_a_cut_tensor(plain_and_registered, tmp_path):
    """``s[mask] = v`` is index_put_, whose DTensor rule has no strategy that keeps a cut s:
    plain DTensor refuses it ("in-place operations that require placement changes"). Under
    register() DTensor's rule answers the calls it keeps s at, the verified rules the
    others where one keeps s, and where none does (a mask at a table miss, positions), s is
    moved into a copy and written back. Never wrong; the one error left is
    DTensor's own rule at a column-cut s with a whole mask of s's shape, which runs the
    kernel on a shard with the whole mask."""
    found, report = plain_and_registered(_run_assignments, tmp_path, WORLD)
    assert "aten.index_put_.default" in report.installed and dtensor_rules.IN_PLACE_FALLBACK in report.guarded
    plain, registered = found["plain"], found["register()"]
    refused = [k for k, v in plain.items() if isinstance(v, str) and "require placement changes" in v]
    mask_at_cut_columns = [k for k in plain if k[0] == "s[m] = 0" and k[1] == Shard(1)]
    assert len(refused) == 8 and all(v is True for k, v in plain.items() if k not in refused + mask_at_cut_columns)
    for k, got in registered.items():
        if k in mask_at_cut_columns:
            assert plain[k] == got and "shape of the mask" in got, (k, got)
        else:
            assert got is True, (k, got)


# Each rank's own storage, on real processes: a replicated self and a row-cut one, beside
# replicated and row-cut other inputs.
GLOO = """
g = torch.Generator().manual_seed(5)
x, u, v, o = (torch.randn(*shape, generator=g) for shape in ((6, 4), (6,), (4,), (6, 4)))
mask, src = torch.rand(6, 4, generator=g) > 0.5, torch.randn(24, generator=g)
flat, vals = torch.tensor([0, 5, 11, 23, 5]), torch.randn(5, generator=g)
calls = {"addr_": (lambda s, a, b: s.addr_(a, b, alpha=2.0), (u, v)),
         "masked_scatter_": (lambda s, m, t: s.masked_scatter_(m, t), (mask, src)),
         "put_": (lambda s, i, t: s.put_(i, t, accumulate=True), (flat, vals)),
         "_add_relu_": (lambda s, t: torch.ops.aten._add_relu_.Tensor(s, t), (o,))}
for name, (fn, others) in calls.items():
    want = fn(x.clone(), *others)
    for mine, theirs in ((Replicate(), Replicate()), (Shard(0), Replicate()), (Replicate(), Shard(0))):
        s = distribute_tensor(x.clone(), mesh, [mine])
        try:
            fn(s, *[distribute_tensor(t, mesh, [theirs]) for t in others])
            got[f"{name} {mine} {theirs}"] = bool(s.placements == (mine,) and torch.allclose(s.full_tensor(), want))
        except NotImplementedError:
            got[f"{name} {mine} {theirs}"] = "refused"
        del s
"""


@pytest.mark.slow  # two processes that import torch, twice
@pytest.mark.parametrize("registered", [False, True])
def test_in_place_ops_on_two_gloo_ranks(on_two_gloo_ranks, registered):
    for got in on_two_gloo_ranks(GLOO, registered):
        assert set(got.values()) == ({True} if registered else {"refused"}), got


def test_a_self_written_back_on_a_2d_mesh_is_never_moved_into_a_partial(fake_world_of, tmp_path):
    """put_ with accumulation has a rule that takes self Partial(sum): on a 2 × 2 mesh the
    write-back picked it for a (Replicate, Shard(1)) self, and DTensor refused to move self
    into Partial. The pick is now among strategies that move no written tensor into one."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from metaspmd.cache import RuleCache

    fake_world_of(WORLD)
    fn, others, _ = CALLS["put_ (accumulate)"]
    want = fn(X.clone(), *others)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", torch.arange(WORLD).reshape(2, 2))
        report = dtensor_rules.register(cache=RuleCache(tmp_path))
        try:
            s = distribute_tensor(X.clone(), mesh, [Shard(0), Shard(0)]).redistribute(mesh, [Replicate(), Shard(1)])
            fn(s, distribute_tensor(others[0], mesh, [Replicate(), Shard(0)]),
               distribute_tensor(others[1], mesh, [Shard(0), Replicate()]))
            placements, full = s.placements, s.full_tensor()
        finally:
            dtensor_rules.unregister(report)
    assert placements == (Replicate(), Shard(1))
    ranks = list(full._local_tensors.values()) if isinstance(full, LocalTensor) else [full]
    assert all(torch.allclose(r, want) for r in ranks)


# Fused optimizers DTensor 2.13 has no rule for, on real processes (each rank's own storage,
# and the steps' 0-d counters, which simulated ranks would share, each its own)
FUSED = """
g = torch.Generator().manual_seed(6)
w0, g0 = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
makes = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, fused=True),
         "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1, weight_decay=0.01, fused=True)}

def steps(w, grad, make):
    w = torch.nn.Parameter(w)
    opt = make([w])
    for i in range(2):
        w.grad = grad * (i + 1)
        opt.step()
    return w.detach()

for name, make in makes.items():
    want = steps(w0.clone(), g0, make)
    for placement in (Shard(0), Shard(1), Replicate()):
        try:
            w = steps(distribute_tensor(w0.clone(), mesh, [placement]), distribute_tensor(g0, mesh, [placement]), make)
            got[f"{name} {placement}"] = bool(w.placements == (placement,) and torch.allclose(w.full_tensor(), want))
        except NotImplementedError:
            got[f"{name} {placement}"] = "refused"
"""


@pytest.mark.slow  # two processes that import torch, twice
@pytest.mark.parametrize("registered", [False, True])
def test_fused_sgd_and_adagrad_steps_on_two_gloo_ranks(on_two_gloo_ranks, registered):
    for got in on_two_gloo_ranks(FUSED, registered):
        assert set(got.values()) == ({True} if registered else {"refused"}), got
