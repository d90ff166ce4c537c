"""Tensors an op writes in place stay where they are under register(): DTensor 2.13 moved
them into copies (its decomposition rules for in-place ops; its batch norm rule for the
running statistics), wrote the copies, and left the tensors as they were."""

import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor  # noqa: E402

from metaspmd.backends.torch import dtensor_rules  # noqa: E402

F = torch.nn.functional
WORLD = 4
_G = torch.Generator().manual_seed(0)
A, B = torch.randn(8, 4, generator=_G, dtype=torch.float64), torch.randn(4, 6, generator=_G, dtype=torch.float64)
X = A @ B
SRC = torch.randn(4, 6, generator=_G, dtype=torch.float64)
ROWS = torch.tensor([0, 3, 3, 7])
SCATTER = torch.randint(0, 8, (4, 6), generator=_G)
MASK = torch.rand(8, 6, generator=_G) > 0.5
FILL = torch.tensor(2.5, dtype=torch.float64)
# In-place ops DTensor runs through its decomposition rules: (fn of self and the other
# inputs, the other inputs, each placed Replicate).
IN_PLACE = {
    "index_add_": (lambda s, i, v: s.index_add_(0, i, v), [ROWS, SRC]),
    "scatter_add_": (lambda s, i, v: s.scatter_add_(0, i, v), [SCATTER, SRC]),
    "index_copy_": (lambda s, i, v: s.index_copy_(0, i, v), [torch.tensor([0, 3, 5, 7]), SRC]),
    "masked_fill_": (lambda s, m, v: s.masked_fill_(m, v), [MASK, FILL]),
}


def _full(x):
    """A DTensor's global value as a plain tensor, checking every simulated rank agrees."""
    full = x.full_tensor()
    ranks = list(full._local_tensors.values()) if isinstance(full, LocalTensor) else [full]
    for r in ranks[1:]:
        torch.testing.assert_close(r, ranks[0])
    return ranks[0]


def _self(mesh, placement):
    if placement == Partial("sum"):  # each rank's product of its columns of A and rows of B
        return distribute_tensor(A, mesh, [Shard(1)]) @ distribute_tensor(B, mesh, [Shard(0)])
    return distribute_tensor(X.clone(), mesh, [placement])


def _in_place(mesh, name, placement):
    """(self's placements after the call, its full value or None where the ranks
    disagree), or the error the call raised."""
    fn, others = IN_PLACE[name]
    s = _self(mesh, placement)
    try:
        fn(s, *[distribute_tensor(t, mesh, [Replicate()]) for t in others])
    except Exception as e:  # noqa: BLE001 -- the refusal under register()
        return e
    try:
        return s.placements, _full(s)
    except AssertionError:  # called replicated, each rank holding its own rows
        return s.placements, None


def _wrong(found, name) -> bool:
    return isinstance(found, Exception) or found[1] is None or found[1].shape != X.shape \
        or not torch.allclose(found[1], _want(name))


@pytest.fixture(scope="module")
def runs(fake_world_of, tmp_path_factory):
    """Each in-place call on a row-cut self (and masked_fill_ on a Partial self), plain
    DTensor then under register(); the batch norm calls under register()."""
    from metaspmd.cache import RuleCache

    warnings.filterwarnings("ignore")
    fake_world_of(WORLD)
    calls = [(name, Shard(0)) for name in IN_PLACE] + [("masked_fill_", Partial("sum")), ("index_add_", Shard(1))]
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        plain = {c: _in_place(mesh, *c) for c in calls}
        report = dtensor_rules.register(cache=RuleCache(tmp_path_factory.mktemp("rules")))
        try:
            registered = {c: _in_place(mesh, *c) for c in calls}
            norms = _batch_norms(mesh)
        finally:
            dtensor_rules.unregister(report)
    return plain, registered, norms, report


def _want(name):
    fn, others = IN_PLACE[name]
    return fn(X.clone(), *others)


@pytest.mark.parametrize("name", ["index_add_", "index_copy_", "scatter_add_"])
def test_an_in_place_op_on_a_cut_self_is_written_back_not_into_a_copy(runs, name):
    """Plain DTensor moved a row-cut self into a replicated copy, wrote the copy and called
    self replicated with its rows unchanged (ranks that disagree, or a wrong shape). Under
    register() the decomposition guard refuses that strategy and the write-back handler runs
    it on the copy, then writes the copy back into self: self keeps its row cut, updated."""
    plain, registered, _, report = runs
    assert _wrong(plain[(name, Shard(0))], name)
    placements, got = registered[(name, Shard(0))]
    assert placements == (Shard(0),)
    torch.testing.assert_close(got, _want(name))
    assert dtensor_rules.DECOMPOSED_WRITES in report.guarded and f"aten.{name}.default" in report.handled


@pytest.mark.parametrize(("name", "placement"), [("index_add_", Shard(1)), ("masked_fill_", Shard(0)),
                                                  ("masked_fill_", Partial("sum"))])
def test_in_place_ops_whose_strategies_keep_self_run_right(runs, name, placement):
    """A column-cut self of index_add_ along dim 0 keeps its cut, as does a row-cut self of
    masked_fill_; masked_fill_ of a Partial self (the fill made Partial too) stays Partial and
    is right, where plain DTensor called it replicated, each rank holding its own part."""
    plain, registered, _, _ = runs
    if placement == Partial("sum"):
        assert _wrong(plain[(name, placement)], name)
    placements, got = registered[(name, placement)]
    assert placements == (placement,)
    torch.testing.assert_close(got, _want(name))


BN_X = torch.randn(4, 8, 6, generator=_G, dtype=torch.float64)
BN_MEAN, BN_VAR = torch.randn(8, generator=_G, dtype=torch.float64), torch.rand(8, generator=_G, dtype=torch.float64) + 0.5


def _batch_norms(mesh) -> dict:
    """The output placement and value of a training batch norm of a channel-cut input, with
    the running statistics replicated (training) or not given or not updated."""
    out = {}
    for training in (True, False):
        mean, var = (distribute_tensor(t, mesh, [Replicate()]) for t in (BN_MEAN, BN_VAR))
        got = F.batch_norm(distribute_tensor(BN_X, mesh, [Shard(1)]), mean, var, training=training, momentum=0.3)
        out[training] = (got.placements, _full(got))
    return out


def test_a_batch_norm_that_updates_replicated_running_statistics_does_not_cut_them(runs):
    """DTensor's rule cut the replicated running statistics to match a channel-cut input,
    so the update went into the cut copies (tests below, on gloo: the statistics were never
    updated). Under register() the strategy keeps them replicated (so the input is gathered);
    in eval mode, where nothing is written, DTensor's channel cut stays."""
    _, _, norms, report = runs
    assert "aten.native_batch_norm.default" in report.installed and dtensor_rules.RULES_WRITES in report.guarded
    for training, (placements, got) in norms.items():
        want = F.batch_norm(BN_X, BN_MEAN.clone(), BN_VAR.clone(), training=training, momentum=0.3)
        assert placements == ((Replicate(),) if training else (Shard(1),))
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("placements", [(Replicate(), Replicate(), Shard(0)), (Shard(1), Replicate(), Shard(0)),
                                        (Shard(0), Shard(0), Replicate())])
def test_running_statistics_placed_apart_are_written_back(plain_and_registered, tmp_path, placements):
    """No strategy of DTensor's batch norm rule keeps a replicated mean beside a cut var (or
    the other way round): plain DTensor moved one into a copy, which took the update, and
    register()'s write guard refused the call. Its write-back handler runs the op on the copy
    DTensor's pick wants and writes the copy back: both statistics are updated, each kept
    where it was."""
    px, pm, pv = placements
    want_mean, want_var = BN_MEAN.clone(), BN_VAR.clone()
    want = F.batch_norm(BN_X, want_mean, want_var, training=True, momentum=0.3)

    def run(mesh):
        m, v = distribute_tensor(BN_MEAN.clone(), mesh, [pm]), distribute_tensor(BN_VAR.clone(), mesh, [pv])
        out = F.batch_norm(distribute_tensor(BN_X, mesh, [px]), m, v, training=True, momentum=0.3)
        return (torch.allclose(_full(out), want), torch.allclose(_full(m), want_mean),
                torch.allclose(_full(v), want_var), m.placements, v.placements)

    found, report = plain_and_registered(run, tmp_path, WORLD)
    assert "aten.native_batch_norm.default" in report.handled
    assert found["plain"][0] and not all(found["plain"][1:3])  # a statistic lost its update
    assert found["register()"] == (True, True, True, (pm,), (pv,))


# One fused Adam step on one device: its tensors and the step as a function of them.
ADAM_STEP = textwrap.dedent("""
    g = torch.Generator().manual_seed(0)
    p, grad, m, v = (torch.randn(8, 3, generator=g, dtype=torch.float64) for _ in range(4))
    v = v.abs()
    step = torch.tensor(1.0, dtype=torch.float64)

    def adam(*t):
        torch.ops.aten._fused_adam_([t[0]], [t[1]], [t[2]], [t[3]], [], [t[4]], lr=0.1, beta1=0.9, beta2=0.99,
                                    weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)

    want = [t.clone() for t in (p, grad, m, v, step)]
    adam(*want)
""")


@pytest.mark.parametrize("moments", [Replicate(), Shard(1)])
def test_a_fused_adam_step_updates_moments_placed_unlike_the_parameters(plain_and_registered, tmp_path, moments):
    """Row-cut parameters and gradients, moments replicated or column-cut: plain DTensor
    updated moved copies of the moments (and, column-cut, computed into strided copies,
    which the CPU kernel gets wrong); under register() every tensor is right and in place.
    (Replicated parameters are checked on gloo: here a replicated tensor is one storage that
    each simulated rank updates.)"""
    ns = {"torch": torch}
    exec(ADAM_STEP, ns)  # the gloo test's step, on one device
    p, grad, m, v, step, adam, want = (ns[k] for k in ("p", "grad", "m", "v", "step", "adam", "want"))

    def run(mesh):
        ts = [distribute_tensor(t.clone(), mesh, [pl]) for t, pl in zip((p, grad, m, v), (Shard(0), Shard(0), moments, moments))]
        ts.append(distribute_tensor(step.clone(), mesh, [Replicate()]))
        adam(*ts)
        return [torch.allclose(_full(t), w) for t, w in zip(ts, want)], [t.placements for t in ts]

    found, _ = plain_and_registered(run, tmp_path, WORLD)
    assert not all(found["plain"][0])
    assert all(found["register()"][0]) and found["register()"][1][2:4] == [(moments,), (moments,)]


@pytest.mark.parametrize("fused", ["adam", "adamw"])
def test_a_fused_step_with_a_partial_gradient_reads_it_unwritten(plain_and_registered, tmp_path, fused):
    """A replicated weight fed a batch-cut input gets a Partial(sum) gradient, which DTensor's
    rule reduces into a replicated copy. The schema marks the grads written, but the kernel
    writes them only to unscale them by a grad_scale: with none, register() refused the
    step (every strategy moved a written tensor); now it runs as plain DTensor does."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    want = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    (x * want).sum().backward()
    make = getattr(torch.optim, fused.capitalize() if fused == "adam" else "AdamW")
    make([want], lr=0.1, fused=True).step()

    def run(mesh):
        w = torch.nn.Parameter(distribute_tensor(torch.ones(4, dtype=torch.float64), mesh, [Shard(0)])
                               .redistribute(mesh, [Replicate()]))  # each simulated rank's own storage
        (distribute_tensor(x, mesh, [Shard(0)]) * w).sum().backward()
        partial = w.grad.placements == (Partial("sum"),)
        make([w], lr=0.1, fused=True).step()
        return partial, w.placements, torch.allclose(_full(w), want.detach())

    found, _ = plain_and_registered(run, tmp_path, WORLD)
    assert found["plain"] == found["register()"] == (True, (Replicate(),), True), found


def test_the_guarded_ops_are_those_that_write_a_tensor_dtensor_may_move():
    from torch.distributed.tensor import DTensor as DT

    p = DT._op_dispatcher.sharding_propagator
    found = {dtensor_rules.op_name(op) for op in set(p.op_strategy_funcs) | set(p.op_single_dim_strategy_funcs)
             if dtensor_rules._writes_dtensor_may_move(op)}
    assert {"aten.native_batch_norm.default", "aten._native_batch_norm_legit.default",
            "aten._batch_norm_with_update.default", "aten.rrelu_with_noise.default",
            "aten._fused_adam_.default", "aten._fused_adamw_.tensor_lr"} <= found
    assert "aten.add_.Tensor" not in found  # an in-place op's self: DTensor's own check keeps it


# The running statistics across real processes (gloo), where a moved copy is a real copy.
RANK = """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, 6, generator=g, dtype=torch.float64)
    mean, var = torch.randn(8, generator=g, dtype=torch.float64), torch.rand(8, generator=g, dtype=torch.float64) + 0.5
    want_mean, want_var = mean.clone(), var.clone()
    F.batch_norm(x, want_mean, want_var, training=True, momentum=0.3)
    for name, (pm, pv) in (("replicated", (Replicate(), Replicate())), ("channel-cut", (Shard(0), Shard(0))),
                           ("placed apart", (Replicate(), Shard(0)))):
        m, v = distribute_tensor(mean.clone(), mesh, [pm]), distribute_tensor(var.clone(), mesh, [pv])
        F.batch_norm(distribute_tensor(x, mesh, [Shard(1)]), m, v, training=True, momentum=0.3)
        got[name] = bool(torch.allclose(m.full_tensor(), want_mean) and torch.allclose(v.full_tensor(), want_var))
        del m, v
"""



@pytest.mark.slow  # two processes that import torch, twice
@pytest.mark.parametrize("registered", [False, True])
def test_running_statistics_of_a_channel_cut_batch_norm_on_two_gloo_ranks(on_two_gloo_ranks, registered):
    for got in on_two_gloo_ranks(RANK, registered):
        # plain DTensor: the replicated statistics are never updated, nor the replicated mean
        # beside a cut var; the cut ones are. register() writes the moved copy back.
        assert got == {"replicated": registered, "channel-cut": True, "placed apart": registered}, got


# A fused Adam step across real processes: the moment lists placed unlike the parameters.
ADAM = ADAM_STEP + textwrap.dedent("""
    for name, placements in (("cut parameters, replicated moments", (Shard(0), Shard(0), Replicate(), Replicate())),
                             ("replicated parameters, cut moments", (Replicate(), Replicate(), Shard(0), Shard(0))),
                             ("moments cut another way", (Shard(0), Shard(0), Shard(1), Shard(0)))):
        ts = [distribute_tensor(t.clone(), mesh, [pl]) for t, pl in zip((p, grad, m, v), placements)]
        ts.append(distribute_tensor(step.clone(), mesh, [Replicate()]))
        adam(*ts)
        got[name] = all(bool(torch.allclose(t.full_tensor(), w)) for t, w in zip(ts, want))
        del ts
""")



@pytest.mark.slow  # two processes that import torch, twice
@pytest.mark.parametrize("registered", [False, True])
def test_a_fused_adam_step_with_moments_placed_unlike_the_parameters_on_two_gloo_ranks(on_two_gloo_ranks, registered):
    """DTensor's rule for _fused_adam_ places every list's elements as the parameters: a
    moment placed otherwise was moved into a copy, which took the update. Under register()
    the moved copies are written back (and made contiguous: the CPU kernel computes wrong
    values into a strided exp_avg)."""
    for got in on_two_gloo_ranks(ADAM, registered):
        assert all(got.values()) if registered else not any(got.values()), got


# A kernel that crashes on an empty input: native_batch_norm_backward of a rank with no
# channels dies of SIGFPE (CPU). 5 channels over 4 ranks leave one none; run apart, so a
# crash fails this test only.
EMPTY_CHANNELS = textwrap.dedent("""
    import sys, warnings
    import torch, torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from metaspmd.backends.torch import dtensor_empty, dtensor_rules
    warnings.filterwarnings("ignore")
    dist.init_process_group("fake", rank=0, world_size=4)
    report = dtensor_rules.register()
    g = torch.Generator().manual_seed(0)
    grad, x = (torch.randn(3, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))
    w, mean, invstd = (torch.rand(5, generator=g, dtype=torch.float64) + 0.5 for _ in range(3))
    call = lambda *t: torch.ops.aten.native_batch_norm_backward(*t[:3], None, None, *t[3:], True, 1e-5,
                                                                [True, True, True])
    want = call(grad, x, w, mean, invstd)
    with LocalTensorMode(frozenset(range(4))):
        mesh = DeviceMesh("cpu", list(range(4)))
        got = call(*[distribute_tensor(t, mesh, [Shard(1) if t.dim() == 3 else Shard(0)])
                     for t in (grad, x, w, mean, invstd)])
        full = [t.full_tensor() for t in got]
        full = [list(t._local_tensors.values())[0] if hasattr(t, "_local_tensors") else t for t in full]
    assert dtensor_empty.EMPTY_SHARDS_TRIED in report.guarded, report
    print(all(torch.allclose(a, b) for a, b in zip(full, want)))
""")


@pytest.mark.slow  # a child process that imports torch, registers and runs over 4 ranks: 7 s
def test_a_kernel_that_crashes_on_an_empty_shard_is_given_none():
    """DTensor's rule cuts the batch norm gradient along the channels as its inputs are cut;
    with 5 channels over 4 ranks one rank held none and the process died (SIGFPE). Under
    register() no rank gets an empty shard of it (the channels are gathered), and the
    gradients match one device."""
    done = subprocess.run([sys.executable, "-c", EMPTY_CHANNELS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert done.stdout.strip().splitlines()[-1] == "True", done.stdout


@pytest.mark.parametrize("name, fn", [("tril_.default", lambda x: x.tril_()), ("triu_.default", lambda x: x.triu_(1)),
                                      ("floor_divide_.Tensor", lambda x: x.floor_divide_(torch.full_like(x, 0.7)))])
def test_an_in_place_op_dtensor_has_no_strategy_for_runs_as_its_twin(plain_and_registered, tmp_path, name, fn):
    """DTensor has no rule for tril_ and its decomposition path finds none (householder_product's
    and ormqr's backward call it): plain DTensor raises at every placement. Under register()
    it runs as tril, whose rule DTensor has, written into self where self lies; a Partial
    self, which nothing can be moved into, is refused as DTensor refuses it. The twin of
    floor_divide_.Tensor is floor_divide.default, an overload of another name."""
    x = torch.randn(6, 5, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = fn(x.clone())

    def run(mesh):
        found = {}
        for placement in (Shard(0), Shard(1), Shard(2), Replicate(), Partial("sum")):
            if placement == Partial("sum"):  # each rank's product of its columns of a and rows of b
                a, b = torch.randn(6, 5, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
                self, want_here = distribute_tensor(a, mesh, [Shard(2)]) @ distribute_tensor(b, mesh, [Shard(0)]), fn(a @ b)
            else:
                self, want_here = distribute_tensor(x.clone(), mesh, [placement]), want
            try:
                out = fn(self)
            except NotImplementedError as e:
                found[str(placement)] = f"aten.{name}" in str(e)
                continue
            found[str(placement)] = (out is self, self.placements, torch.allclose(_full(self), want_here))
        return found

    found, _ = plain_and_registered(run, tmp_path, WORLD)
    assert all(v is True for v in found["plain"].values())  # refused, naming the op, everywhere
    registered = found["register()"]
    assert registered.pop(str(Partial("sum"))) is True
    assert registered == {str(p): (True, (p,), True) for p in (Shard(0), Shard(1), Shard(2), Replicate())}
