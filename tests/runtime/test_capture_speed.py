"""The fast capture (fake-tensor trace, real values recorded on first use, signatures from
the traced shapes) plans exactly as the real-valued capture did: same rules per node, same
plan cost and strategies."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from metaspmd import planner  # noqa: E402
from metaspmd.backends.torch import capture as capture_mod  # noqa: E402
from metaspmd.backends.torch.capture import RecordedValues, capture  # noqa: E402
from metaspmd.backends.torch.rules_at_runtime import call_of, node_call  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.models import GPT  # noqa: E402


def real_capture(model, x, monkeypatch):
    """The capture as it was: traced on real values, every value recorded at once."""
    with monkeypatch.context() as m:
        m.setattr(capture_mod, "_make_fx", lambda fn, args, **kw: capture_mod.make_fx(fn, **kw)(*args))
        return capture(model, (x,))


def test_fast_capture_plans_the_same(monkeypatch):
    torch.manual_seed(0)
    model, x = GPT(2, 32, 4), torch.randn(2, 8, 32)
    before, after = real_capture(model, x, monkeypatch), capture(model, (x,))
    assert before.gm.code == after.gm.code
    assert isinstance(after.values, RecordedValues) and after.values._values is None  # nothing run yet

    # per node: the signature and table rules from the traced shapes are those of the real values
    old_calls = {op.name: call_of(op.fn, *before.values[op.name]) for op in before.ir.op_list}
    new_calls = {op.name: node_call(after, op) for op in after.ir.op_list}
    assert {n: (c.signature, c.table_rules) for n, c in new_calls.items()} == \
        {n: (c.signature, c.table_rules) for n, c in old_calls.items()}
    assert after.values._values is None  # looking rules up needs no real value
    # planned on the table's rules (a miss replicated: exploring it live is what a cache holds)
    old_rules = {n: c.table_rules or () for n, c in old_calls.items()}
    new_rules = {n: c.table_rules or () for n, c in new_calls.items()}

    mesh = planner.Mesh.of((2, 4), ("dp", "tp"))
    plans = [planner.plan(c.ir, rules, mesh, ties=c.parameter_gradient_ties())
             for c, rules in ((before, old_rules), (after, new_rules))]
    assert plans[0].total_cost == pytest.approx(plans[1].total_cost)
    assert {n.name: n.strategy for n in plans[0].nodes} == {n.name: n.strategy for n in plans[1].nodes}


def test_recorded_values_match_the_real_capture(monkeypatch):
    torch.manual_seed(0)
    model, x = GPT(1, 16, 2), torch.randn(2, 4, 16)
    before, after = real_capture(model, x, monkeypatch), capture(model, (x,))
    assert set(after.values) == set(before.values)
    for name, (args, kwargs) in before.values.items():
        got = torch.utils._pytree.tree_leaves(after.values[name])
        want = torch.utils._pytree.tree_leaves((args, kwargs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
            else:
                assert g == w
