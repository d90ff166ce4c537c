"""parallelize() on JAX: jit over a mesh of 4 of 8 simulated CPU devices. Planned models
match single-device outputs and gradients, and the compiled program holds the
collectives the plan asks for.

XLA fixes its CPU device count when jax first starts a backend, so this module asks for 8
devices before that; if another module started jax first, the tests re-run in a fresh
process instead.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from metaspmd.backends.jax import FAST_COMPILE_FLAGS

# Live exploration compiles a small executable per op and shard shape: XLA's cheaper CPU
# pipeline halves that time (same IEEE arithmetic).
_DEVICES = "--xla_force_host_platform_device_count=8"
_FLAGS = " ".join((_DEVICES, *FAST_COMPILE_FLAGS))
if _DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAGS}".strip()

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from metaspmd.backends.jax.capture import capture  # noqa: E402
from metaspmd.backends.jax.parallelize import parallelize  # noqa: E402
from metaspmd.backends.jax.shardings import partition_spec  # noqa: E402
from metaspmd.backends.jax.rules_at_runtime import node_call, without_literals  # noqa: E402
from metaspmd.table import Entry as E, RuleTable  # noqa: E402
import metaspmd  # noqa: E402
from metaspmd import planner, spec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.jax_models import gpt_block, gpt_params  # noqa: E402

ENOUGH_DEVICES = jax.device_count() >= 8
needs_devices = pytest.mark.skipif(not ENOUGH_DEVICES, reason="jax started with too few devices (fresh process)")
DEVICE_TESTS = "matches_single_device or cache_second_time or control_flow"  # the needs_devices tests
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# How XLA may spell a planned step: a reduce-scatter can compile to an all-reduce and a slice.
SPELLINGS = {"all-reduce": ("all-reduce",), "reduce-scatter": ("reduce-scatter", "all-reduce"),
             "all-gather": ("all-gather",), "all-to-all": ("all-to-all", "all-gather"),
             "collective-permute": ("collective-permute",)}


@pytest.mark.skipif(ENOUGH_DEVICES, reason="runs in this process")
def test_in_a_fresh_process():
    env = dict(os.environ, XLA_FLAGS=_FLAGS)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", __file__, "-k", DEVICE_TESTS]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


# --------------------------------------------------------------------------- models


def mlp(p, x):
    return jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def mlp_params(dim=64, hidden=256, seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    return dict(w1=0.1 * jax.random.normal(k[0], (dim, hidden), jnp.float32),
                b1=0.1 * jax.random.normal(k[1], (hidden,), jnp.float32),
                w2=0.1 * jax.random.normal(k[2], (hidden, dim), jnp.float32),
                b2=jnp.zeros((dim,), jnp.float32))


# --------------------------------------------------------------------------- helpers


def combines(*options):
    """One output with these combine options."""
    return (spec.OutputCombine(options),)


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:4]), ("tp",))


def run_planned(fn, params, x, mesh, cache, **kw):
    par = parallelize(fn, mesh, (x,), params=params, cache=cache, **kw)
    out, grads = par(x)
    ref = fn(params, x)
    ref_grads = jax.grad(lambda p: fn(p, x).sum())(params)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    for name in params:
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5, err_msg=name)
    return par


def compiled_collectives(par, x) -> set[str]:
    text = par.lower(x).compile().as_text()
    return {c for c in COLLECTIVES if c in text}


def planned_kinds(plan) -> set[str]:
    return {c.split("@")[0] for c in plan.collectives()}


def assert_collectives_follow_the_plan(par, x):
    found = compiled_collectives(par, x)
    for kind in planned_kinds(par.plan):
        assert found & set(SPELLINGS[kind]), f"plan needs {kind}, compiled program has {sorted(found)}"
    return found


# --------------------------------------------------------------------------- end to end


@needs_devices
@pytest.mark.parametrize("budget", [None, pytest.param(200_000, marks=pytest.mark.slow)])  # budgeted: 5 s, slow job
def test_mlp_matches_single_device(mesh, cache, budget):
    params, x = mlp_params(), jax.random.normal(jax.random.key(1), (8, 64), jnp.float32)
    par = run_planned(mlp, params, x, mesh, cache, memory_budget=budget)
    found = assert_collectives_follow_the_plan(par, x)
    if budget is None:
        assert not par.plan.collectives() and not found  # replicated plan: nothing to communicate
    else:
        assert par.plan.memory <= budget
        assert any(n.strategy.label != "R" for n in par.plan.nodes)  # the budget forces sharding
        # Gradients tied to sharded parameters cannot come free: the plan communicates.
        assert par.plan.collectives() and found
        # A planned sum (Partial, Megatron's row-parallel matmul) compiles to a reduction.
        partial = any(isinstance(p, planner.Partial) for n in par.plan.nodes for ps in n.strategy.outputs for p in ps)
        assert not partial or found & {"all-reduce", "reduce-scatter"}


@needs_devices
def test_vocab_parallel_argmax_matches_single_device(mesh, cache):
    # greedy decoding with a vocab-sharded head: the budget keeps w off every device whole;
    # argmax over the cut vocab dim finishes with one (value, position) pair per device
    # (argreduce), where gathering the logits or summing them would move 128 KiB
    def head(p, x):
        return jnp.argmax(x @ p["w"], axis=-1)

    params = {"w": jax.random.normal(jax.random.key(0), (64, 4096), jnp.float32)}
    x = jax.random.normal(jax.random.key(1), (8, 64), jnp.float32)
    par = parallelize(head, mesh, (x,), params=params, backward=False, cache=cache, memory_budget=600_000)
    np.testing.assert_array_equal(np.asarray(par(x)), np.asarray(head(params, x)))
    picks = [p for n in par.plan.nodes for ps in n.strategy.outputs for p in ps if isinstance(p, planner.Partial)]
    assert planner.Partial("argmax") in picks, par.explain()
    gathers = [l for l in par.lower(x).compile().as_text().splitlines() if "all-gather(" in l]
    assert gathers and not any("[8,4096]" in l or "[4096" in l for l in gathers), gathers


@needs_devices
def test_vocab_parallel_lookup_and_its_gradient_match_single_device(mesh, cache):
    # table[ids] binds a PROMISE_IN_BOUNDS gather, its gradient a scatter-add. The budget keeps
    # the table off every device whole, and 3 columns do not split over 4 devices: each shard
    # reads zero for the ids it does not hold (the rule's dropping form) and the shards sum,
    # and each adds only the gradient rows it holds. 8 looked-up rows move, never the table.
    def lookup(p, ids):
        return p["table"][ids] * 2.0

    params = {"table": jax.random.normal(jax.random.key(0), (4096, 3), jnp.float32)}
    ids = jnp.array([3, 17, 4000, 1025, 2048, 9, 77, 4095], jnp.int32)
    par = parallelize(lookup, mesh, (ids,), params=params, cache=cache, memory_budget=80_000)
    out, grads = par(ids)
    np.testing.assert_allclose(out, lookup(params, ids))
    np.testing.assert_allclose(grads["table"], jax.grad(lambda p: lookup(p, ids).sum())(params)["table"])
    strategy = {n.op: n.strategy for n in par.plan.nodes}
    assert strategy["jax.gather"].inputs[0] == (planner.Shard(0),), par.explain()
    assert strategy["jax.gather"].outputs == ((planner.Partial("sum"),),)
    assert strategy["jax.scatter-add"].outputs == ((planner.Shard(0),),)
    text = par.lower(ids).compile().as_text()
    assert "all-gather(" not in text and ("all-reduce(" in text or "reduce-scatter(" in text), par.explain()


@needs_devices
def test_fills_are_created_cut_where_the_budget_wants_them_and_match_single_device(mesh, cache):
    # the gradient starts from zeros the size of the table (a broadcast of 0.0), the weights
    # are an iota: given only scalars, the compiler computes each device's part where it
    # lives, so they are created cut, with no communication. Without that, the tensors left
    # with one placement alone need 114,796 bytes of the 100,000-byte budget
    def lookup(p, ids):  # the rows weighted by their position, as a regulariser
        return p["table"][ids] * 2.0 + (p["table"] * jnp.arange(4096, dtype=jnp.float32)[:, None]).mean()

    params = {"table": jax.random.normal(jax.random.key(0), (4096, 3), jnp.float32)}
    ids = jnp.array([3, 17, 4000, 1025, 2048, 9, 77, 4095], jnp.int32)
    par = parallelize(lookup, mesh, (ids,), params=params, cache=cache, memory_budget=100_000)
    out, grads = par(ids)
    np.testing.assert_allclose(out, lookup(params, ids), rtol=1e-5)
    np.testing.assert_allclose(grads["table"], jax.grad(lambda p: lookup(p, ids).sum())(params)["table"], rtol=1e-5)
    assert par.plan.memory <= 100_000
    strategy = {n.op: n.strategy for n in par.plan.nodes}
    assert strategy["jax.iota"].outputs == ((planner.Shard(0),),), par.explain()
    zeros = [n for n in par.plan.nodes if n.op == "jax.broadcast_in_dim" and n.strategy.label.startswith("fill")]
    assert any(n.strategy.outputs == ((planner.Shard(0),),) for n in zeros), par.explain()


@needs_devices
def test_a_slice_of_a_cut_dim_keeps_it_cut_and_matches_single_device(mesh, cache):
    # half of w's columns, w too big for the budget whole: its columns stay cut through the
    # slice, each shard slicing its own part (local params) and the compiler evening the
    # pieces out with collective permutes. Without local params the plan cuts w's rows, and
    # the matmul's partial sums then move (a reduce-scatter, planned at over twice the cost)
    def half(p, x):
        return x @ p["w"][:, 1024:3072]

    params = {"w": jax.random.normal(jax.random.key(0), (64, 4096), jnp.float32)}
    x = jax.random.normal(jax.random.key(1), (8, 64), jnp.float32)
    par = parallelize(half, mesh, (x,), params=params, backward=False, cache=cache, memory_budget=600_000)
    np.testing.assert_allclose(np.asarray(par(x)), np.asarray(half(params, x)), rtol=1e-5, atol=1e-5)
    strategy = {n.op: n.strategy for n in par.plan.nodes}
    assert strategy["jax.slice"].inputs[0] == (planner.Shard(1),), par.explain()
    assert strategy["jax.slice"].outputs == ((planner.Shard(1),),) and strategy["jax.slice"].exchanges == (0,)
    text = par.lower(x).compile().as_text()
    assert "collective-permute(" in text and not any("all-gather(" in line and "4096" in line
                                                     for line in text.splitlines()), par.explain()


@needs_devices
def test_a_pad_of_a_cut_dim_keeps_it_cut_and_matches_single_device(mesh, cache):
    # the columns of x @ w stay cut through the pad: only the outer shards pad, and the
    # compiler evens the pieces out with two collective permutes of one column each. Each
    # shard padding both ends, the gather dropping the copies (an output halo), is a rule
    # too; while planners skipped halos, the plan all-to-alled the pad's input first, at 2.5x the cost
    def padded(p, x):
        return jnp.pad(x @ p["w"], ((0, 0), (2, 2)))

    params = {"w": jax.random.normal(jax.random.key(0), (64, 4096), jnp.float32)}
    x = jax.random.normal(jax.random.key(1), (8, 64), jnp.float32)
    par = parallelize(padded, mesh, (x,), params=params, backward=False, cache=cache, memory_budget=600_000)
    np.testing.assert_allclose(np.asarray(par(x)), np.asarray(padded(params, x)), rtol=1e-4, atol=1e-4)
    pad = next(n.strategy for n in par.plan.nodes if n.op == "jax.pad")
    assert pad.inputs[0] == (planner.Shard(1),) and pad.outputs == ((planner.Shard(1),),), par.explain()
    text = par.lower(x).compile().as_text()
    assert "collective-permute(" in text and "all-to-all(" not in text and "all-gather(" not in text, par.explain()


@needs_devices
def test_mlp_on_a_2d_mesh_matches_single_device(cache):
    mesh_2d = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
    params, x = mlp_params(), jax.random.normal(jax.random.key(1), (8, 64), jnp.float32)
    par = run_planned(mlp, params, x, mesh_2d, cache, memory_budget=100_000)
    assert par.plan.memory <= 100_000 and par.plan.collectives()
    assert_collectives_follow_the_plan(par, x)


@pytest.mark.slow  # ~20 s: explores a GPT block's ops live; the MLP and the smaller programs stay in the default run
@needs_devices
def test_gpt_block_matches_single_device(mesh, cache):
    params, x = gpt_params(), jax.random.normal(jax.random.key(1), (2, 8, 32), jnp.float32)
    par = run_planned(gpt_block, params, x, mesh, cache, memory_budget=100_000)  # replicated: a 155,008-byte peak
    assert par.stats.table + par.stats.cache + par.stats.live == len(par.captured.ir)
    assert par.plan.memory <= 100_000
    assert par.plan.collectives() and assert_collectives_follow_the_plan(par, x)


def test_node_signatures_are_the_backend_sweep_signatures():
    from metaspmd.backends.jax.backend import abstract_signature
    from metaspmd.backends.jax.programs import Occurrence

    # The GPT test's shapes, so its compiled ops are reused.
    c = capture(gpt_block, (jnp.ones((2, 8, 32), jnp.float32),), params=gpt_params())
    for op in c.ir:
        e = c.eqn(op.name)
        occ = Occurrence(0, (), e.prim.name, e.prim, e.params, tuple(v.aval for v in c.values[op.name]))
        assert node_call(c, op, RuleTable({})).signature == abstract_signature(occ), op.name


@needs_devices
def test_rules_come_from_the_cache_second_time(mesh, cache):
    params, x = mlp_params(), jax.random.normal(jax.random.key(2), (8, 64), jnp.float32)
    run_planned(mlp, params, x, mesh, cache)  # the first time (on whichever worker runs this test)
    par = run_planned(mlp, params, x, mesh, cache)
    assert par.stats.live == 0 and par.stats.table + par.stats.cache == len(par.captured.ir)
    # A training step: new parameter values run the same plan.
    new = mlp_params(seed=5)
    out, grads = par(x, params=new)
    np.testing.assert_allclose(out, mlp(new, x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads["w1"], jax.grad(lambda p: mlp(p, x).sum())(new)["w1"], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="plan is for"):
        par(jnp.ones((4, 64), jnp.float32))


@needs_devices
def test_control_flow_is_planned_through_its_body(mesh, cache):
    def f(x):
        return lax.fori_loop(0, 3, lambda i, y: jnp.sin(y) * 2.0, x * 3.0).sum(axis=0)

    x = jax.random.normal(jax.random.key(3), (8, 16), jnp.float32)
    par = parallelize(f, mesh, (x,), cache=cache)
    ops = {op.op for op in par.captured.ir}
    assert "jax.sin" in ops and not ops & {"jax.scan", "jax.while"}  # tests/runtime/test_jax_control_flow.py
    np.testing.assert_allclose(par(x), f(x), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- pieces


def test_capture_inlines_calls_and_records_values():
    @jax.checkpoint
    def body(y):
        return jnp.sin(y)

    def f(p, x):
        return body(jax.nn.relu(jax.jit(lambda a: a @ p["w"])(x)))  # relu is a custom_jvp

    params, x = {"w": jnp.ones((4, 3), jnp.float32)}, jnp.arange(8.0, dtype=jnp.float32).reshape(2, 4)
    c = capture(f, (x,), params=params)
    ops = {op.op for op in c.ir}
    assert "jax.dot_general" in ops and "jax.max" in ops and "jax.sin" in ops
    assert not ops & {"jax.jit", "jax.custom_jvp_call", "jax.checkpoint", "jax.remat2"}
    assert c.input_names == ("params.w", "in0") and c.param_names == ("params.w",)
    assert c.n_outputs == 1 and len(c.outputs) == 2  # out, then d out.sum() / d w
    dot = next(op for op in c.ir if op.op == "jax.dot_general")
    lhs, rhs = c.values[dot.name]
    np.testing.assert_array_equal(lhs, x)
    np.testing.assert_array_equal(rhs, params["w"])


def test_signature_matches_the_backend_and_table_rules_come_back():
    params, x = mlp_params(16, 32), jnp.ones((4, 16), jnp.float32)
    c = capture(mlp, (x,), params=params, backward=False)
    sig = "lhs:f[*,*] rhs:f[*,*] dimension_numbers=[[[1],[0]],[[],[]]]"
    # S1: column-parallel (rhs cut by columns), S2: row-parallel (contraction cut, summed)
    table = RuleTable({"jax.dot_general": {sig: E("[[N, S2], [S2, S1]]", "{S1: gather(dim=1), S2: reduce(sum)}")}})
    dots = [op for op in c.ir if op.op == "jax.dot_general"]
    assert len(dots) == 2
    for op in dots:
        call = node_call(c, op, table)
        assert call.signature == sig
        s1, s2 = call.table_rules
        assert s1.inputs == (spec.Replicate(), spec.ShardIn(1)) and s1.outputs == combines(spec.Gather(1))
        assert s2.inputs == (spec.ShardIn(1), spec.ShardIn(0)) and s2.outputs == combines(spec.Reduce("sum"))


def test_literal_operands_are_replicated_constants():
    def f(x):
        return jnp.maximum(x * 0.5, 0.0)

    c = capture(f, (jnp.ones((4, 6), jnp.float32),))
    mul = next(op for op in c.ir if op.op == "jax.mul")
    eqn = c.eqn(mul.name)
    assert len(mul.input_vars) == 1 and eqn.literal_positions == (1,)  # x * 0.5
    rules = (
        spec.Strategy("S1", (spec.ShardIn(0), spec.Replicate()), combines(spec.Gather(0))),
        spec.Strategy("S2", (spec.PartialInput("sum"), spec.PartialInput("sum")), combines(spec.Reduce("sum"))),
    )
    kept = without_literals(rules, eqn.literal_positions)
    assert [s.label for s in kept] == ["S1"] and kept[0].inputs == (spec.ShardIn(0),)


def test_partition_spec_of_placements():
    P = jax.sharding.PartitionSpec
    assert partition_spec((planner.Shard(1),), ("tp",), 2) == P(None, "tp")
    assert partition_spec((planner.Shard(0), planner.Shard(0)), ("dp", "tp"), 2) == P(("dp", "tp"), None)
    assert partition_spec((planner.Replicate(), planner.Shard(0)), ("dp", "tp"), 1) == P("tp")
    assert partition_spec((planner.Partial("sum"),), ("tp",), 2) is None


# Live exploration of the convolutions (tens of seconds): the slow job. Halo cuts exchanged by
# collective permutes stay in the default run (the slice and pad tests above), as does their
# planning (tests/planner/test_planner_strategies.py).
@pytest.mark.slow
@needs_devices
def test_a_convolution_of_one_image_is_cut_along_its_height(mesh, cache):
    """One image: no batch to cut. Under a tight budget the first convolution's input is
    cut along its height, read one row past each shard (the rule's halo): XLA exchanges
    the edge rows with collective permutes, where a plan without halos all-to-alls the
    activations into a channel cut first, at a higher planned cost."""
    def conv(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def net(p, x):
        return jax.nn.relu(conv(jax.nn.relu(conv(x, p["w1"])), p["w2"])).mean()

    k = jax.random.split(jax.random.key(0), 3)
    params = {"w1": 0.2 * jax.random.normal(k[0], (8, 3, 3, 3), jnp.float32),
              "w2": 0.2 * jax.random.normal(k[1], (8, 8, 3, 3), jnp.float32)}
    x = jax.random.normal(k[2], (1, 3, 64, 64), jnp.float32)
    par = run_planned(net, params, x, mesh, cache, memory_budget=180_000)  # replicated peaks at 642,148
    first = par.plan.nodes[[n.op for n in par.plan.nodes].index("jax.conv_general_dilated")].strategy
    assert first.inputs[0] == (planner.Shard(2),) and first.exchanges == (0,), par.explain()
    assert "collective-permute(" in par.lower(x).compile().as_text()


@pytest.mark.slow  # explores a grouped convolution and its gradients live (~1 min on 2 cores)
@needs_devices
def test_a_grouped_convolution_on_a_2x2_mesh_under_a_budget_matches_single_device(cache):
    """XLA sums a Partial weight gradient of a grouped convolution (batch_group_count > 1)
    over every device of a 2-D mesh: that gradient came back 2x. Such strategies are
    dropped on meshes of several axes (``_sums_wrongly_on_meshes_of_axes``)."""
    def net(p, x):
        y = lax.conv_general_dilated(x, p["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     feature_group_count=4)
        return jnp.tanh(y).mean(axis=(1, 2)) @ p["head"]

    k = jax.random.split(jax.random.key(0), 3)
    params = {"w": jax.random.normal(k[0], (3, 3, 8, 32), jnp.float32) / 10,
              "head": jax.random.normal(k[1], (32, 10), jnp.float32)}
    x = jax.random.normal(k[2], (2, 16, 16, 32), jnp.float32)
    mesh_2d = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp"))
    whole = metaspmd.parallelize(net, mesh_2d, (x,), params=params, cache=cache)
    par = run_planned(net, params, x, mesh_2d, cache, memory_budget=0.5 * whole.plan.memory)
    assert par.plan.memory <= 0.5 * whole.plan.memory


@needs_devices
def test_constraints_and_annotations_are_kept_and_the_plan_matches_single_device(mesh, cache):
    """A batch cut given by the caller (a PartitionSpec on an input leaf) and a hidden cut
    the function itself asks for (with_sharding_constraint): the plan keeps both."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    def annotated(p, x):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(None, "tp")))
        return h @ p["w2"] + p["b2"]

    params, x = mlp_params(16, 32), jax.random.normal(jax.random.key(1), (8, 16), jnp.float32)
    par = run_planned(annotated, params, x, mesh, cache, constraints={"in0": P("tp", None)})
    assert par.plan.placement("in0") == (planner.Shard(0),)
    (pin,) = [e for e in par.captured.eqns if e.prim.name == "sharding_constraint"][:1]
    assert par.plan.placement(pin.outputs[0]) == (planner.Shard(1),), par.plan.table()
    with pytest.raises(KeyError, match="constraint on 'in7'"):
        parallelize(annotated, mesh, (x,), params=params, cache=cache, constraints={"in7": P("tp")})


@needs_devices
@pytest.mark.slow  # explores the MLP's ops live at a batch of 8,192 (~2 min on 2 cores)
def test_a_large_batch_mlp_with_dp_across_nodes_is_data_parallel_on_dp_and_megatron_on_tp(cache):
    """The JAX twin of the torch 2x2 case: the batch cut on the slow axis, Megatron on the fast."""
    mesh_2d = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp"))
    params = mlp_params(256, 1024)
    x = jax.random.normal(jax.random.key(1), (8192, 256), jnp.float32)
    par = metaspmd.parallelize(mlp, mesh_2d, (x,), params=params, cache=cache, links={"dp": (10e-6, 25e9)})
    out, grads = par(x)
    np.testing.assert_allclose(out, mlp(params, x), rtol=1e-4, atol=1e-5)
    ref_grads = jax.grad(lambda p: mlp(p, x).sum())(params)
    for name in params:
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-4, atol=1e-4, err_msg=name)
    R, S0, S1 = planner.Replicate(), planner.Shard(0), planner.Shard(1)
    assert par.plan.placement("in0") == (S0, R)
    megatron = {"w1": (R, S1), "b1": (R, S0), "w2": (R, S0)}
    assert {n: par.plan.placement(f"params.{n}") for n in megatron} == megatron


def test_a_reshard_of_several_axes_goes_one_axis_at_a_time():
    from metaspmd.backends.jax.parallelize import one_axis_at_a_time

    R, S = planner.Replicate(), planner.Shard
    assert one_axis_at_a_time((S(0), S(0)), (S(2), R)) == [(S(0), R), (S(2), R)]  # gather first, minor axis first
    assert one_axis_at_a_time((R, S(1)), (S(0), S(0))) == [(R, S(0)), (S(0), S(0))]
    assert one_axis_at_a_time((S(0), R), (S(0), R)) == [(S(0), R)]
    assert one_axis_at_a_time((planner.Partial("sum"), R), (S(0), S(1))) == [(S(0), S(1))]


@needs_devices
def test_xla_moves_a_dim_cut_over_two_axes_without_replicating_when_told_one_axis_at_a_time(capfd):
    """(S(0), S(0)) -> (S(2), R) in one constraint: XLA replicates the tensor ("involuntary full
    rematerialization"); through (S(0), R) it all-gathers on tp, then all-to-alls on dp."""
    from metaspmd.backends.jax.parallelize import one_axis_at_a_time
    from metaspmd.backends.jax.shardings import named_sharding

    mesh_2d = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp"))
    R, S = planner.Replicate(), planner.Shard
    src, dst = (S(0), S(0)), (S(2), R)

    def moved(path):
        def f(x):
            x = jax.lax.with_sharding_constraint(x * 2.0, named_sharding(mesh_2d, src, 3))
            for p in path:
                x = jax.lax.with_sharding_constraint(x, named_sharding(mesh_2d, p, 3))
            return x + 1.0
        jax.jit(f).lower(jnp.ones((4, 16, 64), jnp.float32)).compile()
        return capfd.readouterr().err

    assert "Involuntary full rematerialization" in moved([dst])  # the check can fail
    assert "Involuntary full rematerialization" not in moved(one_axis_at_a_time(src, dst))


def test_a_programs_elementwise_product_of_matrices_finds_the_tables_rules():
    """``a * b`` binds ``mul`` with ``out_dtype=None``; the table's rank-2 entry came from a
    harness that binds none, and was keyed without it (tests/jax/test_program_index.py)."""
    c = capture(lambda a, b: a * b, (jnp.ones((4, 6)), jnp.ones((4, 6))))
    calls = [node_call(c, op) for op in c.ir.op_list if op.op == "jax.mul"]
    assert calls and all(call.table_rules for call in calls), [call.signature for call in calls]


def test_flax_style_attention_projections_and_layer_norm_find_the_tables_rules():
    """Flax's LinearGeneral keeps heads as a dim of their own ([D, H, d] kernels, two dims
    contracted by the output projection) and its LayerNorm broadcasts [B, L, 1] statistics
    against [1, 1, D] parameters: with their gradients, every contraction, transpose and
    pointwise op of these is a table hit (``model_programs._flax_block``), at sizes other
    than the sweep's."""
    def loss(scale, wq, wo, x):
        mu, mu2 = x.mean(-1), lax.square(x).mean(-1)
        var = jnp.maximum(0.0, mu2 - lax.square(mu))
        h = (x - mu[..., None]) * (lax.rsqrt(var[..., None] + 1e-6) * scale.reshape(1, 1, -1))
        q = lax.dot_general(h, wq, (((2,), (0,)), ((), ())))
        return lax.dot_general(q, wo, (((2, 3), (0, 1)), ((), ()))).mean()

    d, heads = 12, 3
    args = (jnp.ones(d), jnp.ones((d, heads, d // heads)), jnp.ones((heads, d // heads, d)), jnp.ones((3, 5, d)))
    c = capture(lambda *a: jax.value_and_grad(loss, argnums=(0, 1, 2))(*a), args)
    ops = ("jax.dot_general", "jax.transpose", "jax.mul", "jax.div", "jax.square", "jax.select_n")
    calls = [(op.op, node_call(c, op)) for op in c.ir.op_list if op.op in ops]
    assert {op for op, _ in calls} >= {"jax.dot_general", "jax.transpose", "jax.square"}
    missed = [f"{op} {call.signature}" for op, call in calls if not call.table_rules]
    assert not missed, missed


@pytest.mark.parametrize("kv_heads,causal", [(4, "mask"), (2, "is_causal")], ids=["heads", "grouped"])
def test_jax_nn_dot_product_attention_finds_the_tables_rules(kv_heads, causal):
    """``jax.nn.dot_product_attention`` (what nnx.MultiHeadAttention runs by default) regroups
    heads as [B, L, kv heads, group, d] and vmaps its score math over the group: rank-5
    contractions, transposes, a masked softmax and their gradients, with a group of 1 for
    plain multi-head attention and of 2 for grouped-query attention (Llama's). Every one of
    them is a table hit (``model_programs._sdpa_block``, ``_gqa_block``), at sizes other
    than the sweep's."""
    def loss(q, k, v):
        t = q.shape[1]
        if causal == "is_causal":
            out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
        else:
            positions = jnp.arange(t)
            mask = jnp.broadcast_to(positions[:, None] >= positions[None, :], (q.shape[0], 1, t, t))
            out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
        return out.mean()

    q = jax.random.normal(jax.random.key(0), (3, 5, 4, 6))
    k, v = (jax.random.normal(jax.random.key(i), (3, 5, kv_heads, 6)) for i in (1, 2))
    c = capture(lambda *a: jax.value_and_grad(loss, argnums=(0, 1, 2))(*a), (q, k, v))
    ops = ("jax.dot_general", "jax.transpose", "jax.exp", "jax.reduce_max", "jax.reduce_sum", "jax.select_n",
           "jax.sub", "jax.div", "jax.mul")
    calls = [(op.op, node_call(c, op)) for op in c.ir.op_list if op.op in ops]
    assert {op for op, _ in calls} >= {"jax.dot_general", "jax.transpose", "jax.exp", "jax.select_n"}
    lhs_ranks = {len(call.signature.split("lhs:f[")[1].split("]")[0].split(",")) for op, call in calls
                 if op == "jax.dot_general"}
    assert 5 in lhs_ranks  # the rank-5 form is what is tested
    loss_sum = ("jax.reduce_sum", "x:f[*,*,*,*] axes=[0,1,2,3]")  # this test's own loss, not attention's
    missed = [f"{op} {call.signature}" for op, call in calls if not call.table_rules and (op, call.signature) != loss_sum]
    assert not missed, missed


@pytest.mark.parametrize("halves", [False, True], ids=["interleaved", "halves"])
def test_rotary_embeddings_find_the_tables_rules(halves):
    """Rotary position embeddings, as Llama-style models apply them to queries and keys
    (pairs interleaved or the head's two halves rotated; ``model_programs._rope``): the
    position arithmetic, the rotation's products, stacks, concatenations and the pads of
    its slices' gradients are table hits at sizes other than the sweep's. Slices, reshapes
    and pads that name the model's sizes (the halves' pads by half the head's width) are
    the runtime's to derive or explore, not the table's."""
    from metaspmd.backends.jax.model_programs import _rope

    def loss(q, k):
        return jax.nn.dot_product_attention(_rope(q, halves), _rope(k, halves), k, is_causal=True,
                                            implementation="xla").mean()

    with jax.enable_x64(False):  # a model's default widths: a module before may have turned x64 on
        q, k = (jax.random.normal(jax.random.key(i), (3, 5, 3, 6)) for i in (0, 1))
        c = capture(lambda *a: jax.value_and_grad(loss, argnums=(0, 1))(*a), (q, k))
    ops = ("jax.mul", "jax.sub", "jax.add", "jax.neg", "jax.cos", "jax.sin", "jax.pow", "jax.div", "jax.stack",
           "jax.unstack", "jax.concatenate", "jax.convert_element_type") + (() if halves else ("jax.pad",))
    calls = [(op.op, node_call(c, op)) for op in c.ir.op_list if op.op in ops]
    rotation = {"jax.concatenate", "jax.neg"} if halves else {"jax.stack", "jax.unstack", "jax.pad"}
    assert {op for op, _ in calls} >= rotation | {"jax.mul", "jax.cos", "jax.sin"}
    missed = [f"{op} {call.signature}" for op, call in calls if not call.table_rules]
    assert not missed, missed


def _times_three(a):
    return np.asarray(a) * 3


def _squared(a):
    return np.asarray(a) ** 2


def test_a_host_callbacks_rules_are_keyed_by_its_function_and_a_primitives_by_jaxs_version():
    """Two programs whose pure_callback differ only in the Python function have one
    signature: the cache served x*3's rules (S1 summed) to x**2. Each callback's entry is
    keyed by its code, as a torch custom op's is; a function metaspmd cannot read (a numpy
    ufunc) is cached in memory only, and JAX's own primitives by JAX's version alone."""
    def program(callback):
        def fn(x):
            return jax.pure_callback(callback, jax.ShapeDtypeStruct(x.shape, x.dtype), jnp.sin(x))
        c = capture(fn, (jnp.ones((4, 6)),), backward=False)
        return {op.op: node_call(c, op, RuleTable({})) for op in c.ir.op_list}

    three, squared, again, ufunc = (program(f) for f in (_times_three, _squared, _times_three, np.negative))
    assert three["jax.pure_callback"].signature == squared["jax.pure_callback"].signature
    keys = [p["jax.pure_callback"].implementation for p in (three, squared, again)]
    assert keys[0] and keys[1] and keys[0] != keys[1] and keys[0] == keys[2], keys
    assert ufunc["jax.pure_callback"].implementation is None
    assert three["jax.sin"].implementation == ""
