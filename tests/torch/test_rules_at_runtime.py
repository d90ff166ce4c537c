"""Live exploration of captured nodes finds the same rules the sweep does: derived view
rules (with Partial passed through) and special-value trials."""

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch.capture import capture  # noqa: E402
from metaspmd.backends.torch.rules_at_runtime import call_case, node_call  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402


def live_rules(fn, *inputs) -> dict[str, tuple[str, set[str]]]:
    c = capture(fn, inputs)
    out = {}
    for node in c.ir.op_list:
        entry = explore_case(node_call(c, node).case(), TorchOps())
        out[node.op] = (entry.status, {str(s).split(": ", 1)[1] for s in entry.strategies()})
    return out


def test_view_with_sizes_in_arguments_is_derived_and_passes_partial():
    rules = live_rules(lambda x: x.view(64) * 2, torch.randn(1, 64))
    status, strategies = rules["aten.view.default"]
    assert status == "derived"
    assert strategies == {"(S(1)) -> (gather(dim=0))", "(P(sum)) -> (reduce(sum))"}


def test_a_view_whose_sizes_the_call_pins_is_explored_at_its_own_sizes():
    """Shrunk to small tensors with its size argument kept, x[8, 16].view(-1, 8) would be
    another call ([6, 8] viewed as itself, where a column cut is gathered by columns):
    false for this one, and filed under another signature, so never found in the cache."""
    from metaspmd.backends.torch.rules_at_runtime import call_of
    from metaspmd.resolve import explore_call

    call = call_of(torch.ops.aten.view.default, (torch.randn(8, 16), [-1, 8]), {})
    entry = explore_call(call, TorchOps())
    assert entry.signature == call.signature == "self:f[8,16] size=[-1,8]"
    rules = {str(s).split(": ", 1)[1] for s in entry.strategies()}
    assert rules == {"(S(0)) -> (gather(dim=0, even=true))", "(P(sum)) -> (reduce(sum))"}


def test_predicate_gets_rules_from_special_values():
    rules = live_rules(lambda x: (x * 2).isnan(), torch.randn(8, 4))
    status, strategies = rules["aten.isnan.default"]
    assert status == "ok"
    assert {"(S(0)) -> (gather(dim=0))", "(S(1)) -> (gather(dim=1))"} <= strategies
    assert not any("P(" in s for s in strategies)


def test_a_mask_traced_all_false_is_drawn_anew_before_live_exploration():
    """With the example's mask False everywhere, masked_fill returns self, and a Partial
    self passes for a sum; where the mask holds, each shard would add its fill."""
    rules = live_rules(lambda x, m: x.masked_fill(m, 1.5), torch.randn(8, 4), torch.zeros(8, 4, dtype=torch.bool))
    status, strategies = rules["aten.masked_fill.Scalar"]
    assert status == "ok"
    assert {"(S(0), S(0)) -> (gather(dim=0))", "(S(1), S(1)) -> (gather(dim=1))"} <= strategies
    assert not any("P(" in s for s in strategies)


def test_norm_partials_reach_dtensor_through_register_only():
    """A reduce(norm2) output is DTensor's _NormPartial(2): register() installs it, while
    the planner, whose cost model has no 2-norm reduction, leaves such a strategy out."""
    from torch.distributed.tensor._ops._math_ops import _NormPartial

    from metaspmd.backends.torch.dtensor import to_dtensor_placements
    from metaspmd.spec import OutputCombine, ShardIn, Strategy
    from metaspmd.target import DTENSOR_PLAN, DTENSOR_REGISTER, project

    s = Strategy("S1", (ShardIn(1),), (OutputCombine.parse("reduce(norm2)"),))
    assert to_dtensor_placements(project(s, DTENSOR_REGISTER).outputs) == (_NormPartial(2),)
    assert not project(s, DTENSOR_PLAN)


def test_a_shrunk_live_case_is_the_same_in_any_process_and_leaves_the_callers_generator():
    """A large float call is explored on small random stand-ins: drawn from a generator of
    their own, so the case (and its rules) does not depend on what the program drew
    before, and a training run's next dropout mask is the one it would have been."""
    big = (torch.randn(64, 96), torch.randn(96, 80))
    cases = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        state = torch.get_rng_state()
        cases.append(call_case(torch.ops.aten.mm.default, big, {}))
        assert torch.equal(torch.get_rng_state(), state)
    first, second = cases
    assert [tuple(x.shape) for x in first.args] == [(6, 10), (10, 8)]  # shrunk, equal sizes kept equal
    assert all(torch.equal(a, b) for a, b in zip(first.args, second.args))


def test_a_mean_over_labels_that_skip_ignore_index_is_not_a_mean_of_shard_means():
    """cross_entropy's mean is over the labels it keeps (not ``ignore_index``, -100): a
    shard of a padded batch divides by its own count. Random labels are never -100, so
    the explorer's labels hold it at one position, and a batch cut keeps no reduce(avg)."""
    labels = torch.randint(0, 5, (8,))
    rules = live_rules(lambda x, t: torch.nn.functional.cross_entropy(x * 2, t), torch.randn(8, 5), labels)
    _, strategies = rules["aten.nll_loss_forward.default"]
    assert not any("avg" in s for s in strategies), strategies
    assert "(P(sum), R) -> (reduce(sum), identity)" in strategies  # the loss is linear in the log-probabilities


def test_the_registry_keeps_no_mean_of_shard_means_for_losses_that_skip_labels():
    """The sweep's entries of the same losses, at reduction mean, with class labels."""
    from pathlib import Path

    from metaspmd.registry_io import load_record

    root = Path(__file__).resolve().parents[2] / "registry" / "torch"
    for name in ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default", "aten.cross_entropy_loss.default",
                 "aten.nll_loss_nd.default"):
        record = load_record(root / f"{name}.yaml")
        for e in record.entries:
            labels = "target:i" in e.signature  # class probabilities (float targets) skip nothing
            if labels and ("reduction=1" in e.signature or "reduction" not in e.signature):  # mean (the default)
                assert "avg" not in str(e.combine), (name, e.signature)


def _live_call_rules(op, args, kwargs) -> dict[str, set[str]]:
    """The live case's strategies for one call, by the input placements they take."""
    entry = explore_case(call_case(op, args, kwargs), TorchOps())
    out: dict[str, set[str]] = {}
    for s in entry.strategies():
        ins, outs = str(s).split(": ", 1)[1].split(" -> ")
        out.setdefault(ins, set()).add(outs)
    return out


def test_a_live_out_call_writes_a_fresh_out_on_every_run():
    """An out= call's tensor is allocated afresh for each run, as the sweep's runner does.
    Passed through, every shard's run wrote the one out tensor, every output was then the
    last run's, and a cut self passed as identity: mean.out over every dim (dim=[]) was
    called the mean of any one shard, and var.correction_out's the same."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    mean = _live_call_rules(torch.ops.aten.mean.out, (x, [], True), {"out": torch.empty(1, 1)})
    assert mean["(S(0), R)"] == {"(reduce(avg))"} and mean["(S(1), R)"] == {"(reduce(avg))"}, mean
    var = _live_call_rules(torch.ops.aten.var.correction_out, (x, []),
                           {"correction": 1, "keepdim": True, "out": torch.empty(1, 1)})
    assert not any("S(" in ins.split(",")[0] for ins in var), var  # a variance is no combine of shards' ones


def test_a_live_in_place_call_runs_on_a_copy_of_self():
    """An in-place call writes a clone of self on each run: the trial's own data stays as
    drawn for the runs after it."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    before = x.clone()
    rules = _live_call_rules(torch.ops.aten.add_.Tensor, (x, torch.randn(1, 4)), {})
    assert torch.equal(x, before)
    assert rules["(S(0), R)"] == {"(gather(dim=0))"}, rules
