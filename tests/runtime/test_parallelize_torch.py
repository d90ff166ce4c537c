"""parallelize() on DTensor (fake process group + LocalTensorMode, mesh of 4): planned
models match single-device outputs and gradients."""

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

from metaspmd import planner  # noqa: E402

from metaspmd.backends.torch import dtensor_rules  # noqa: E402
from metaspmd.backends.torch.parallelize import parallelize  # noqa: E402
from metaspmd.cache import RuleCache  # noqa: E402
from metaspmd.placement import replicated  # noqa: E402
from metaspmd.resolve import NEIGHBOUR_NOTE, LiveExplorationWarning  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.custom_ops import RMSNormed  # noqa: E402
from examples.models import MLP, ConvNet, FusedAttention, GPTBlock  # noqa: E402

WORLD = 4


def run_planned(model, x, cache, **kw):
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        p = parallelize(model, mesh, (x,), cache=cache, **kw)
        out, grads = p(x)
    ref = model(x)
    loss = kw.get("loss_fn") or (lambda out: out.sum())
    ref_grads = torch.autograd.grad(loss(ref), list(model.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    return p


@pytest.mark.parametrize("budget", [None, 300_000])
def test_mlp_matches_single_device(fake_world, cache, budget):
    torch.manual_seed(0)
    p = run_planned(MLP(64, 256), torch.randn(8, 64), cache, memory_budget=budget)
    print(f"MLP(64, 256), budget {budget}: {p.stats}")
    if budget is not None:
        assert p.plan.memory <= budget
        assert any(n.strategy.label != "R" for n in p.plan.nodes)  # the budget forces sharding


def test_gpt_block_matches_single_device(fake_world, cache):
    torch.manual_seed(0)
    p = run_planned(GPTBlock(32, 4, 128), torch.randn(2, 8, 32), cache, memory_budget=None)
    print(f"GPTBlock(32, 4, 128): {p.stats}")
    assert p.stats.table + p.stats.cache + p.stats.live == len(p.captured.ir)
    assert p.stats.derived <= p.stats.cache + p.stats.live


def test_rules_come_from_cache_second_time(fake_world, cache):
    torch.manual_seed(0)
    run_planned(MLP(64, 256), torch.randn(8, 64), cache)  # the first time (on whichever worker runs this test)
    p = run_planned(MLP(64, 256), torch.randn(8, 64), cache)
    assert p.stats.live == 0


class TwoUnbinds(torch.nn.Module):
    """Two unbinds of one signature (rank 3, dim 0) into 4 pieces and into 3."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(5))

    def forward(self, x):
        h = x * self.w
        rows = sum(p * (i + 1) for i, p in enumerate(h.unbind(0)))
        cols = sum(q * (j + 1) for j, q in enumerate(h.transpose(0, 1).unbind(0)))
        return torch.cat([rows, cols])


def test_unbinds_into_other_numbers_of_pieces_are_each_cached(fake_world, tmp_path):
    torch.manual_seed(0)
    model, x = TwoUnbinds(), torch.randn(4, 3, 5)
    run_planned(model, x, RuleCache(tmp_path))
    p = run_planned(model, x, RuleCache(tmp_path))  # a new process's cache, read from disk
    assert p.stats.live == 0, p.stats


def test_memory_budget_gives_megatron_mlp(fake_world, cache):
    """Column-parallel first linear, row-parallel second (bias Partial), one collective
    on the block's forward output."""
    torch.manual_seed(0)
    p = run_planned(MLP(512, 2048), torch.randn(8, 512), cache, memory_budget=6e6)
    first, second = p.plan.strategy("addmm"), p.plan.strategy("addmm_1")
    assert [str(x[0]) for x in first.inputs[1:]] == ["R", "S(1)"] and str(first.outputs[0][0]) == "S(1)"
    assert [str(x[0]) for x in second.inputs] == ["P(sum)", "S(1)", "S(0)"] and str(second.outputs[0][0]) == "P(sum)"
    forward_output = [r for r in p.plan.reshards if r.var == "addmm_1"]
    assert len(forward_output) == 1 and forward_output[0].cost > 0


def test_large_batch_without_budget_gives_data_parallel_mlp(fake_world, cache):
    """Batch-sharded input, replicated weights, every weight gradient all-reduced (no weight
    all-gather or reduce-scatter: neither FSDP nor Megatron), and the same numbers as one device."""
    torch.manual_seed(0)
    model = MLP(64, 256)
    p = run_planned(model, torch.randn(65536, 64), cache, memory_budget=None)
    ir, plan = p.captured.ir, p.plan
    n_params = len(p.captured.param_names)
    params, x = ir.input_list[:n_params], ir.input_list[n_params]
    grads = ir.output_list[p.captured.n_outputs:]
    print(f"MLP(64, 256), batch 65536: {p.stats}")
    print(plan.table())
    assert plan.placement(x.name) == (planner.Shard(0),)
    assert all(plan.placement(w.name) == (planner.Replicate(),) for w in params)
    delivered = {r.var: r.dst for r in plan.reshards if r.consumer.startswith("(tie")}  # all-reduced there
    assert all(delivered.get(g.name, plan.placement(g.name)) == (planner.Replicate(),) for g in grads)
    for name in ("addmm", "addmm_1"):  # both linears run on batch shards against whole weights
        s = plan.strategy(name)
        assert s.inputs[1] == (planner.Shard(0),) and s.inputs[2] == (planner.Replicate(),)
        assert s.outputs[0] == (planner.Shard(0),)
    kinds = plan.collectives()
    assert kinds and set(kinds) == {"all-reduce@axis0"} and len(kinds) <= n_params
    assert plan.strategy("addmm_1").outputs[0] == (planner.Shard(0),)  # the output stays batch-sharded
    assert not any(op.op == "aten.ones_like.default" for op in ir.op_list)  # the seed gradient reads no loss
    # the trace's input names (arg0_1) shown and taken beside the user's
    names = [name for name, _ in model.named_parameters()]
    assert plan.placement(names[0]) == plan.placement(params[0].name) and plan.placement("input 0") == (planner.Shard(0),)
    assert f"{params[0].name} ({names[0]})" in plan.table() and f"{x.name} (input 0)" in plan.table()
    assert plan.placement(0) == plan.placement("input 0")  # the position, as constraints take it
    with pytest.raises(planner.PlannerError, match=r"no var named 'fc9.weight' in the plan \(inputs are 'fc1.weight'"):
        plan.placement("fc9.weight")


class Lookup(torch.nn.Module):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)

    def forward(self, ids):
        return self.emb(ids) * 2.0


def test_vocab_parallel_embedding_keeps_the_table_cut_and_matches_single_device(fake_world, cache):
    """The budget keeps the (4096, 3) table off every device whole, and 3 columns do not
    split over 4 devices: DTensor's own row-cut embedding (the positions enter Replicate and
    DTensor masks them, as the verified drop-offset rule says) serves the lookup, and the
    looked-up rows, zero where a shard does not hold them, sum once."""
    torch.manual_seed(0)
    model, ids = Lookup(4096, 3), torch.tensor([[3, 17, 4000, 1025], [2048, 9, 77, 4095]])
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        p = parallelize(model, mesh, (ids,), cache=cache, backward=False, memory_budget=30_000)
        out = p(ids)
    torch.testing.assert_close(out, model(ids))
    lookup = p.plan.strategy("embedding")
    assert lookup.inputs == ((planner.Shard(0),), (planner.Replicate(),)), p.explain()
    assert lookup.outputs == ((planner.Partial("sum"),),)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_batch_normalized_convnet_matches_single_device_and_keeps_its_running_statistics(fake_world, cache, mode):
    """The budget cuts the convolutions; BatchNorm's buffers are graph inputs, and in training
    its running statistics come out of the plan and are written back into the module as
    one step on one device would leave them."""
    import copy

    torch.manual_seed(0)
    model, x = getattr(ConvNet(), mode)(), torch.randn(8, 3, 16, 16)
    reference = copy.deepcopy(model)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        p = parallelize(model, mesh, (x,), cache=cache, memory_budget=500_000)
        out, grads = p(x)
    ref = reference(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, torch.autograd.grad(ref.sum(), list(reference.parameters()))):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
    assert p.plan.memory <= 500_000  # replicated, the plan needs 623 kB: the budget binds
    assert any(n.op == "aten.convolution.default" and p.plan.strategy(n.name).label != "R"
               for n in p.captured.ir.op_list), p.explain()
    assert p.captured.buffer_names == ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")
    assert p.captured.updated_buffers == (p.captured.buffer_names if mode == "train" else ())
    for (name, b), (_, r) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(b, r, msg=name)
    assert int(model.bn.num_batches_tracked) == (1 if mode == "train" else 0)


def test_capture_leaves_the_module_buffers_alone():
    from metaspmd.backends.torch.capture import capture

    model = ConvNet().train()
    before = {n: b.clone() for n, b in model.named_buffers()}
    capture(model, (torch.randn(4, 3, 16, 16),))
    for name, b in model.named_buffers():
        torch.testing.assert_close(b, before[name], msg=name)


def test_dtensor_rule_that_misnames_a_cut_output_is_not_trusted(fake_world):
    """DTensor's convolution rule follows the input's placements only: a weight cut by
    output channels gives a channel-cut output that it calls Replicate. The runtime then
    runs the verified rule locally instead; mm's rule agrees and is DTensor's to run."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from metaspmd.backends.torch.parallelize import _dtensor_agrees

    aten = torch.ops.aten
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        x = distribute_tensor(torch.randn(2, 3, 8, 8), mesh, (Replicate(),))
        w = distribute_tensor(torch.randn(8, 3, 3, 3), mesh, (Shard(0),))
        b = distribute_tensor(torch.randn(8), mesh, (Shard(0),))
        conv = (x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        assert not _dtensor_agrees(aten.convolution.default, conv, {}, [(Shard(1),)])
        a = distribute_tensor(torch.randn(8, 4), mesh, (Shard(0),))
        m = distribute_tensor(torch.randn(4, 5), mesh, (Replicate(),))
        assert _dtensor_agrees(aten.mm.default, (a, m), {}, [(Shard(0),)])
        assert not _dtensor_agrees(aten.mm.default, (a, m), {}, [(Replicate(),)])


def test_fused_attention_is_cut_by_batch_or_head_and_matches_single_device(fake_world, cache):
    """torch's CPU flash attention crashes its process (SIGFPE) on a query with fewer heads
    than the key, a shard live exploration tries: explored in a forked child, the crash
    costs only that candidate, and the batch and head cuts are found and used."""
    torch.manual_seed(0)
    p = run_planned(FusedAttention(), torch.randn(4, 16, 32), cache, memory_budget=30_000)
    attention = next(n for n in p.captured.ir.op_list if "flash_attention" in n.op and "backward" not in n.op)
    assert not p.stats.unexplorable
    assert p.plan.strategy(attention.name).label != "R", p.explain()


def test_a_plain_tensor_attribute_is_a_planned_constant(fake_world, cache):
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.scale = torch.linspace(0, 1, 16)  # neither parameter nor buffer

        def forward(self, x):
            return self.fc(x) * self.scale

    torch.manual_seed(0)
    p = run_planned(Scaled(), torch.randn(8, 16), cache)
    assert p.captured.ir.input_list[-1].shape == (16,)  # after the graph's own inputs


def test_a_kernel_that_checks_its_values_traces_beside_a_constant(fake_world, cache):
    """one_hot checks its indices' range, which a trace on the real values reads as a value
    taken into Python; with a tensor constant beside it (a plain attribute, a loss_fn's
    labels) the model was refused so. It is traced on fake tensors, constant kept."""
    class OneHot(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(10, 3)
            self.scale = torch.linspace(0.5, 1, 3)  # neither parameter nor buffer

        def forward(self, ids):
            return self.fc(torch.nn.functional.one_hot(ids, 10).to(torch.float32)) * self.scale

    torch.manual_seed(0)
    weights = torch.randn(8, 5, 3)
    run_planned(OneHot(), torch.randint(0, 10, (8, 5)), cache, loss_fn=lambda out: (out * weights).sum())


def test_value_checks_run_with_the_plan(fake_world, cache):
    """Bad values raise as they do on one device. The trace for forward and backward dropped
    ``torch._assert_async`` (it returns nothing, so nothing reads it), and a fake trace of
    ``one_hot`` skips the range check its kernel makes: both passed bad values unsaid
    (``one_hot``'s as rows of zeros)."""
    class Checked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(10, 4))

        def forward(self, ids, x):
            torch._assert_async((x > -100).all())
            return torch.nn.functional.one_hot(ids, num_classes=10).to(x.dtype) @ self.w * x

    torch.manual_seed(0)
    model, ids, x = Checked(), torch.randint(0, 10, (8,)), torch.randn(8, 4)
    with LocalTensorMode(frozenset(range(WORLD))):
        p = parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (ids, x), cache=cache)
        out, _ = p(ids, x)
        torch.testing.assert_close(out, model(ids, x))
        for bad_ids, bad_x, error in ((ids, x * -1e6, "aten._assert_async.default"),
                                      (ids - 10, x, r"one_hot: class values must be in \[0, 10\)"),
                                      (ids + 10, x, r"one_hot: class values must be in \[0, 10\)")):
            with pytest.raises(RuntimeError, match=error):
                p(bad_ids, bad_x)


def test_inputs_of_other_shapes_than_planned_are_refused(fake_world, cache):
    torch.manual_seed(0)
    model, x, longer = MLP(16, 32), torch.randn(8, 16), torch.randn(12, 16)  # made outside the mode: plain tensors
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        p = parallelize(model, mesh, (x,), cache=cache)
        with pytest.raises(ValueError, match=r"shape \(12, 16\), but the plan is for \(8, 16\)"):
            p(longer)
        with pytest.raises(TypeError, match="takes 1 inputs, got 2"):
            p(x, x)


def test_a_custom_op_keeps_its_namespace_and_is_cut_where_its_rows_are_independent(fake_world, cache):
    """A torch.library custom op is not the ATen op it shares a name with (aten::rms_norm):
    its node keeps its own namespace, so no ATen rule stands in for it; live exploration
    finds its cuts (batch and sequence, never the normalized dim), which the budget uses,
    and the plan runs it on each shard."""
    torch.manual_seed(0)
    p = run_planned(RMSNormed(), torch.randn(8, 16, 32), cache, memory_budget=90_000)
    [node] = [n for n in p.captured.ir.op_list if "rms_norm" in n.op]
    assert node.op == "metaspmd_examples.rms_norm.default"
    [cut] = p.plan.strategy(node.name).inputs[0]
    assert isinstance(cut, planner.Shard) and cut.dim in (0, 1), p.plan.table()


@pytest.mark.slow  # a sweep in worker processes, then a plan: 8 s; the table hit itself is the same lookup as any op's
def test_a_custom_op_swept_offline_gives_its_rules_verified_at_the_call(fake_world, tmp_path):
    """``tools/sweep.py --kernels`` sweeps a module's custom ops into a registry of one's
    own, on the calls the module gives; the table generated from it, once added, serves
    parallelize: its rules are the custom op's, verified at the call's own sizes (a user's
    kernel may branch on any size), not searched for."""
    root = Path(__file__).resolve().parents[2]
    registry, generated = tmp_path / "registry", tmp_path / "generated"
    subprocess.run([sys.executable, str(root / "tools" / "sweep.py"), "--backend", "torch", "--kernels",
                    str(root / "examples" / "custom_ops.py"), "--out", str(registry), "--jobs", "1", "--no-progress"],
                   check=True, capture_output=True)
    assert [f.name for f in (registry / "torch").iterdir()] == ["metaspmd_examples.rms_norm.default.yaml"]
    subprocess.run([sys.executable, str(root / "tools" / "codegen.py"), "--backend", "torch", "--registry", str(registry),
                    "--out", str(generated)], check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location("custom_torch_rules", generated / "torch_rules.py")
    rules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rules)
    op, call = torch.ops.metaspmd_examples.rms_norm.default, (torch.randn(8, 16, 32), torch.randn(32), 1e-6)
    assert dtensor_rules.lookup(op, call, {}) is None  # a miss, which the lookup memoizes
    dtensor_rules.add_table(rules.RULES)
    assert dtensor_rules.lookup(op, call, {}) is not None  # adding a table forgets it
    cache = RuleCache(tmp_path / "cache")
    try:
        torch.manual_seed(0)
        p = run_planned(RMSNormed(), torch.randn(8, 16, 32), cache, memory_budget=90_000)
    finally:
        dtensor_rules.remove_table(rules.RULES)
    # the custom op's entry: the table's rules, each verified at the call
    [entry] = [path for path in cache.root.rglob("*.yaml") if "rms_norm" in path.parent.name]
    assert NEIGHBOUR_NOTE in entry.read_text() and p.stats.neighbour >= 1, p.stats
    [node] = [n for n in p.captured.ir.op_list if "rms_norm" in n.op]
    [cut] = p.plan.strategy(node.name).inputs[0]
    assert isinstance(cut, planner.Shard) and cut.dim in (0, 1), p.plan.table()


class Recurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(16, 32, batch_first=True)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.lstm(x)[0]).relu_()


# the budgeted one end to end (~14 s) in the slow run; an LSTM under a budget is planned in
# the default run too (test_an_lstm_model_under_a_budget_shards_and_matches_one_device)
@pytest.mark.parametrize("budget", [None, pytest.param(60_000, marks=pytest.mark.slow)])
def test_an_lstm_with_in_place_ops_matches_single_device(fake_world, cache, budget):
    """oneDNN's fused LSTM layer cannot be traced and run again (its backward's workspace
    is recorded as None): traced without oneDNN, it is matmuls and pointwise ops. Those
    write in place (sigmoid_, add_, the model's relu_), and a value resharded before its
    write would leave the write on a copy: the graph is functionalized first."""
    torch.manual_seed(0)
    p = run_planned(Recurrent(), torch.randn(8, 6, 16), cache, memory_budget=budget)
    assert not any(op.op.endswith("_.default") for op in p.captured.ir.op_list)
    if budget is not None:
        assert any(n.strategy.label != "R" for n in p.plan.nodes)


class SelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


def test_multihead_attention_views_a_shard_laid_out_unlike_the_trace(fake_world, cache):
    """nn.MultiheadAttention views a transpose whose traced input was stored transposed:
    contiguous in the trace, not on a shard. Under a tight budget such a view meets a
    cut shard, which is made contiguous first (the graph is functional: no value changes)."""
    torch.manual_seed(0)
    p = run_planned(SelfAttention(), torch.randn(4, 10, 32), cache, memory_budget=25_000)
    assert sum(n.strategy.label != "R" for n in p.plan.nodes) > len(p.plan.nodes) // 2


def test_a_view_whose_shards_rewrite_sizes_runs_its_derived_function(fake_world, cache):
    """DTensor has no rule for as_strided; the plan keeps it cut by rows (a derived rule),
    and each shard must run it with the sizes of its own rows, as the rule was verified:
    with the traced sizes it read past its shard's storage."""
    class Strided(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            return torch.as_strided(self.fc(x), (64, 16), (16, 1)).relu()

    torch.manual_seed(0)
    p = run_planned(Strided(), torch.randn(64, 16), cache, memory_budget=15_000)
    strided = next(n for n in p.captured.ir.op_list if n.op == "aten.as_strided.default")
    assert p.plan.strategy(strided.name).label != "R", p.explain()


def test_group_norm_cut_by_the_batch_runs_with_each_shards_own_sizes(fake_world, cache):
    """native_group_norm and its backward restate the input's sizes (N, C, HxW) and check
    them; under a budget both are cut by the batch, and each shard runs them with its own N
    (DTensor adjusts the forward's itself, not the backward's)."""
    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
            self.norm = torch.nn.GroupNorm(2, 8)

        def forward(self, x):
            return self.norm(self.conv(x)).relu()

    torch.manual_seed(0)
    p = run_planned(Normed(), torch.randn(8, 4, 8, 8), cache, memory_budget=22_000)
    norms = [n for n in p.captured.ir.op_list if "group_norm" in n.op]
    assert len(norms) == 2 and all(p.plan.strategy(n.name).label != "R" for n in norms), p.explain()


@pytest.mark.slow  # a budgeted ILP over an LSTM's unrolled steps
def test_an_lstm_model_under_a_budget_shards_and_matches_one_device(fake_world, cache):
    """A two-layer LSTM under a linear head: the captured graph runs the LSTM step by step
    (linear, sigmoid, tanh, cat and stack of each step). Its parameters and their gradients
    alone (118 kB) exceed the budget, and the head's are 1 kB: the plan must cut the LSTM's
    weights and the step nodes that read them, with outputs and gradients as on one device.
    Which weights is the solver's choice: optimal plans tie, and one stopped by its time
    limit on a loaded machine differs, so no count of cut nodes is asserted."""
    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.head = torch.nn.LSTM(16, 32, num_layers=2), torch.nn.Linear(32, 8)

        def forward(self, x):
            return self.head(self.lstm(x)[0]).relu()

    torch.manual_seed(0)
    p = run_planned(Tagger(), torch.randn(5, 8, 16), cache, memory_budget=100_000)
    assert p.plan.memory <= 100_000
    inputs = dict(zip(p.captured.param_names, (v.name for v in p.captured.ir.input_list)))
    cut = [name for name, var in inputs.items()
           if name.startswith("lstm.") and p.plan.placement(var) != replicated(1)]
    assert cut, p.explain()
    steps = {n.name for n in p.captured.ir.op_list if n.op in ("aten.mm.default", "aten.addmm.default")}
    assert any(n.name in steps and n.strategy.label != "R" for n in p.plan.nodes), p.explain()


def test_an_integer_becomes_partial_by_its_first_device_not_by_division(fake_world):
    """Replicate -> Partial(sum) divides a float by the axis size; an integer does not
    divide, so the first device of the axis keeps it and the others hold zeros."""
    from torch.distributed.tensor import Partial, Replicate, distribute_tensor

    from metaspmd.backends.torch.parallelize import redistribute

    x = torch.arange(-6, 6).reshape(3, 4)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        partial = redistribute(distribute_tensor(x, mesh, [Replicate()]), mesh, (Partial("sum"),))
        ranks = partial.to_local()._local_tensors
        summed = partial.full_tensor()._local_tensors
    assert torch.equal(ranks[0], x) and all(not ranks[r].any() for r in range(1, WORLD))
    assert all(torch.equal(summed[r], x) for r in range(WORLD))


def test_a_layer_norm_of_a_width_the_table_lacks_runs_on_its_neighbours_verified_rules(fake_world, cache):
    """The table has native_layer_norm and its backward at the sweep's widths, not at 40:
    the neighbouring signature's rules are verified at the call, and under a budget of a
    third of the replicated plan's peak (0.97 MiB) the plan cuts the norm, with outputs
    and gradients as on one device."""
    model = torch.nn.Sequential(torch.nn.Linear(40, 40), torch.nn.LayerNorm(40), torch.nn.Linear(40, 8))
    torch.manual_seed(0)
    p = run_planned(model, torch.randn(256, 6, 40), cache, memory_budget=340_000)
    assert p.stats.neighbour >= 2, p.stats  # the norm and its backward
    norm = next(n for n in p.captured.ir.op_list if n.op == "aten.native_layer_norm.default")
    assert p.plan.strategy(norm.name).label != "R", p.explain()


def test_a_users_constraints_are_kept(fake_world, cache):
    """The batch pinned on the mesh and one weight pinned to a column cut, as a user who
    already decided both would write them: the plan keeps both and still matches."""
    from torch.distributed.tensor import Shard

    torch.manual_seed(0)
    model = MLP(64, 256)
    name = next(n for n, q in model.named_parameters() if q.dim() == 2)
    p = run_planned(model, torch.randn(8, 64), cache, constraints={0: (Shard(0),), name: (Shard(0),)})
    graph_input = dict(zip(p.captured.param_names, p.captured.ir.input_list))[name].name
    assert p.plan.placement(graph_input) == (planner.Shard(0),)
    batch = p.captured.ir.input_list[len(p.captured.param_names) + len(p.captured.buffer_names)].name
    assert p.plan.placement(batch) == (planner.Shard(0),)
    x = torch.randn(8, 64)
    with pytest.raises(KeyError, match="no such value"), LocalTensorMode(frozenset(range(WORLD))):
        parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (x,), cache=cache,
                    constraints={"fc9.weight": (Shard(0),)})


class SharedLayer(torch.nn.Module):
    """One layer registered under two names (a weight-shared recurrence), and a head tied to
    an embedding's weight."""

    def __init__(self):
        super().__init__()
        self.a = self.b = torch.nn.Linear(16, 16)
        self.emb = torch.nn.Linear(16, 16, bias=False)
        self.head = torch.nn.Linear(16, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(self.emb(self.b(self.a(x))))


def test_a_layer_registered_under_two_names_keeps_its_parameters(fake_world, cache):
    torch.manual_seed(0)
    model = SharedLayer()
    before = dict(model.named_parameters(remove_duplicate=False))
    run_planned(model, torch.randn(8, 16), cache)
    after = dict(model.named_parameters(remove_duplicate=False))
    assert after.keys() == before.keys()
    for name, p in after.items():
        assert p is before[name] and type(p) is torch.nn.Parameter, name
    assert model.a.weight is model.b.weight and model.head.weight is model.emb.weight


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x, scale, mask=None):
        y = self.fc(x) * scale
        return y if mask is None else y * mask


def test_a_call_unlike_the_example_is_refused_by_input(fake_world, cache):
    """A number or None in the example is a constant of the traced graph: another value
    would silently compute with the traced one."""
    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(8, 16)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        p = parallelize(model, mesh, (x, 2.0, None), cache=cache)
        out, _ = p(x, 2.0, None)
        torch.testing.assert_close(out, model(x, 2.0), rtol=1e-4, atol=1e-5)
        with pytest.raises(ValueError, match=r"input 1 is 3\.0, but the plan was traced with 2\.0, which the graph "
                                             r"holds as a constant"):
            p(x, 3.0, None)
        with pytest.raises(ValueError, match=r"input 1 is 2, but the plan was traced with 2\.0"):
            p(x, 2, None)
        with pytest.raises(ValueError, match=r"input 2 is a tensor of shape \(8, 16\), but the plan was traced "
                                             r"with None"):
            p(x, 2.0, torch.ones(8, 16))
        with pytest.raises(TypeError, match=r"input 0: dtype torch.float64, but the plan is for torch.float32"):
            p(x.double(), 2.0, None)
        with pytest.raises(TypeError, match=r"input 0 is None, but the plan was traced with a tensor there"):
            p(None, 2.0, None)


@torch.library.custom_op("metaspmd_test::fails_off_shape", mutates_args=())
def fails_off_shape(x: torch.Tensor, how: str) -> torch.Tensor:
    """A kernel with a bug on every shape but the model's own: it kills or hangs its process."""
    if tuple(x.shape) != (8, 16):
        if how == "crash":
            import os
            import signal

            os.kill(os.getpid(), signal.SIGSEGV)
        while True:
            import time

            time.sleep(1)
    return x * 2


fails_off_shape.register_fake(lambda x, how: torch.empty_like(x))


class FailsOffShape(torch.nn.Module):
    def __init__(self, how):
        super().__init__()
        self.fc, self.how = torch.nn.Linear(16, 16), how

    def forward(self, x):
        return fails_off_shape(self.fc(x), self.how)


@pytest.mark.slow  # live exploration in a fresh child per crashing or hanging shard: 15 s
@pytest.mark.parametrize("how", ["crash", "hang"])
def test_an_op_that_crashes_or_hangs_off_its_shape_costs_its_rules_not_the_caller(fake_world, tmp_path, monkeypatch,
                                                                                   how):
    """Live exploration tries the op on other shapes in forked children; after a child
    dies or hangs, the op must not run in this process again (it did, to rebuild its case)."""
    from metaspmd.backends.torch import rules_at_runtime
    from metaspmd.isolation import Isolation

    monkeypatch.setattr(rules_at_runtime, "LIVE_EXPLORATION",
                        Isolation(timeout=5.0, setup=rules_at_runtime.LIVE_EXPLORATION.setup, wall_timeout=5.0))
    torch.manual_seed(0)
    model, x = FailsOffShape(how), torch.randn(8, 16)
    with LocalTensorMode(frozenset(range(WORLD))), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (x,), backward=False,
                        cache=RuleCache(tmp_path))
        out = p(x)
    torch.testing.assert_close(out, model(x))
    op = next(n.name for n in p.captured.ir.op_list if "fails_off_shape" in n.op)
    assert p.plan.strategy(op).label == "R"
    if how == "hang":
        assert "timed out" in p.stats.unexplorable[op]
        assert any(issubclass(w.category, LiveExplorationWarning) and "timed out" in str(w.message)
                   and op in str(w.message) for w in caught)


@torch.library.custom_op("metaspmd_test::column_sums", mutates_args=())
def column_sums(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


column_sums.register_fake(lambda x: torch.empty_like(x))  # wrong: the op drops dim 0


class ColumnSums(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return column_sums(self.fc(x))


def test_a_custom_op_whose_fake_kernel_disagrees_with_its_real_one_is_named(fake_world, cache):
    """The plan reads the fake kernel's shapes, the rules the real ones: the call failed
    later, deep inside DTensor ("narrow unexpectedly changed concrete size")."""
    model, x = ColumnSums(), torch.randn(8, 16)
    with LocalTensorMode(frozenset(range(WORLD))):
        with pytest.raises(TypeError, match=r"metaspmd_test.column_sums.default \(node column_sums\): its fake kernel "
                                            r"gives \['torch.float32 \[8, 16\]'\] but the op returns "
                                            r"\['torch.float32 \[16\]'\]"):
            parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (x,), backward=False, cache=cache)


class HalfFrozen(torch.nn.Module):
    """A frozen layer, a trained one, and one the forward never uses."""

    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Linear(16, 16).requires_grad_(False)
        self.fc = torch.nn.Linear(16, 16)
        self.spare = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(self.frozen(x))


def test_frozen_parameters_get_no_gradient_and_unused_ones_zeros(fake_world, cache):
    torch.manual_seed(0)
    model, x = HalfFrozen(), torch.randn(8, 16)
    with LocalTensorMode(frozenset(range(WORLD))):
        p = parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (x,), cache=cache)
        out, grads = p(x)
    names = [n for n, _ in model.named_parameters()]
    assert len(grads) == len(names)
    ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    trained = [t for t in model.parameters() if t.requires_grad and all(t is not s for s in model.spare.parameters())]
    ref_grads = dict(zip([id(t) for t in trained], torch.autograd.grad(ref.sum(), trained)))
    for name, param, g in zip(names, model.parameters(), grads):
        if name.startswith("frozen."):
            assert g is None, name
        elif name.startswith("spare."):
            assert torch.count_nonzero(g) == 0, name
        else:
            torch.testing.assert_close(g, ref_grads[id(param)], rtol=1e-4, atol=1e-5, msg=name)
    # the frozen layer's weight has no gradient to plan: only the trained ones are tied to one
    assert len(p.captured.parameter_gradient_ties()) == len(names) - 2


def test_a_model_or_input_placed_already_is_refused_by_name(fake_world, cache):
    from torch.distributed.tensor import Replicate, distribute_module, distribute_tensor

    model, placed, x = MLP(16, 32), MLP(16, 32), torch.randn(8, 16)
    with LocalTensorMode(frozenset(range(WORLD))):
        mesh = DeviceMesh("cpu", list(range(WORLD)))
        with pytest.raises(TypeError, match=r"example input 0 is a DTensor \(placed already\)"):
            parallelize(model, mesh, (distribute_tensor(x, mesh, (Replicate(),)),), cache=cache)
        with pytest.raises(TypeError, match=r"parameter '.*weight' is a DTensor \(placed already\)"):
            parallelize(distribute_module(placed, mesh), mesh, (x,), cache=cache)


def test_a_batch_whose_simulated_ranks_differ_is_refused_and_one_they_share_runs(fake_world, cache):
    """A batch made inside LocalTensorMode holds one tensor per simulated rank: the plan
    places one global tensor, so ranks that differ (a batch drawn once per rank) are
    refused, where rank 0's had silently been used; ranks that agree run as a plain tensor."""
    from torch.distributed._local_tensor import LocalTensor

    torch.manual_seed(0)
    model, x = MLP(16, 32), torch.randn(8, 16)
    with LocalTensorMode(frozenset(range(WORLD))):
        p = parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (x,), cache=cache)
        shared = LocalTensor({r: x.clone() for r in range(WORLD)})
        out, _ = p(shared)
        drawn = LocalTensor({r: x + r for r in range(WORLD)})
        with pytest.raises(ValueError, match="input 0 holds other values on simulated rank 1 than on rank 0"):
            p(drawn)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
