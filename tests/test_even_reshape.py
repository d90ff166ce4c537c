"""Even gathers: a reshape that splits a cut dim ([8, 16] as [8, 4, 4] along the 16) keeps
the cut where the shard count divides every dim it cuts, and nowhere else: in the rule
model, the verifier, the projection onto each target and the planner."""

import dataclasses

import pytest

from metaspmd import reshape, spec
from metaspmd.placement import REPLICATE, Shard
from metaspmd.planner.mesh import Mesh
from metaspmd.planner.strategies import axis_strategies, compose
from metaspmd.registry_io import RegistryError, dump_record, loads_record
from metaspmd.rules import make_record
from metaspmd.spec import Gather, OutputCombine, ShardIn, SpecError, Strategy
from metaspmd.target import DTENSOR_PLAN, DTENSOR_REGISTER, JAX_PARTITION, JAX_PLAN, project

torch = pytest.importorskip("torch")
from metaspmd.backends.torch.backend import torch_case  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402

aten = torch.ops.aten
EVEN = "gather(dim=1, even=true)"


def test_even_gather_round_trips_and_is_no_plain_gather():
    c = spec.parse_combine(EVEN)
    assert c == Gather(1, even=True) and str(c) == EVEN and not c.plain
    assert str(spec.OutputCombine.parse(f"{EVEN} | identity")) == f"{EVEN} | identity"
    for bad in ("gather(dim=1, block=2, even=true)", "gather(dim=1, even=false)", "gather(dim=1, even)"):
        with pytest.raises(SpecError):
            spec.parse_combine(bad)


def _view(shape, size):
    x = torch.randn(*shape, dtype=torch.float64)
    return explore_case(torch_case(aten.view.default, (x, size), {}, aten.view.default), TorchOps())


def _cuts(entry):
    return {s.inputs[0].dim: str(s.outputs[0]) for s in entry.strategies() if isinstance(s.inputs[0], ShardIn)}


def test_a_split_dim_keeps_its_cut_on_even_splits_and_the_entry_round_trips():
    entry = _view((8, 16), [8, 4, 4])
    assert _cuts(entry) == {0: "gather(dim=0)", 1: EVEN}
    assert {2, 4} <= set(entry.verified.shard_counts)
    text = dump_record(make_record("aten.view.default", "torch", [entry]))
    assert EVEN in text and dump_record(loads_record(text)) == text
    # a label cut with a halo (or cutting nothing) cannot claim an even gather
    with pytest.raises(RegistryError, match="even cuts"):
        loads_record(text.replace("shard: [[S1, S2]]", "shard: [[S1, S2(halo=1)]]"))


def test_a_merge_keeps_its_plain_gather_and_a_split_onto_a_coprime_dim_has_no_cut():
    assert _cuts(_view((8, 4, 4), [8, 16])) == {0: "gather(dim=0)", 1: "gather(dim=1)",
                                                2: "gather(dim=1, block=4)"}
    # [4, 6] as [3, 8]: no count divides both 4 and 3
    assert reshape.reshape_even_mapping((4, 6), (3, 8)) == {}
    assert 0 not in _cuts(_view((4, 6), [3, 8]))


def _with_candidates(shape, size, combine):
    x = torch.randn(*shape, dtype=torch.float64)
    case = torch_case(aten.view.default, (x, size), {}, aten.view.default)
    return dataclasses.replace(case, candidates=(((ShardIn(1),), (OutputCombine((combine,)),)),))


def test_the_verifier_refuses_the_split_as_a_plain_gather_and_an_even_gather_of_the_wrong_dim():
    ops = TorchOps()
    # claimed on any split, the cut fails on uneven ones (3 shards of 16: no whole rows)
    assert not _cuts(explore_case(_with_candidates((8, 16), [8, 4, 4], Gather(1)), ops))
    assert not _cuts(explore_case(_with_candidates((8, 16), [8, 4, 4], Gather(2, even=True)), ops))
    assert _cuts(explore_case(_with_candidates((8, 16), [8, 4, 4], Gather(1, even=True)), ops)) == {1: EVEN}


def test_the_finest_even_cut_is_verified_too():
    """[8, 12] as [8, 6, 2] along the 12: counts 2, 3 and 6 divide both 12 and 6, and each
    is tried; a rule that broke at 6 shards would be caught there."""
    entry = _view((8, 12), [8, 6, 2])
    assert _cuts(entry)[1] == EVEN and {2, 3, 6} <= set(entry.verified.shard_counts)


def test_only_targets_that_plan_every_shape_run_an_even_gather():
    s = Strategy("S1", (ShardIn(1),), (OutputCombine((Gather(1, even=True),)),))
    for target in (DTENSOR_PLAN, JAX_PLAN):
        a = project(s, target)
        assert a and a.even and a.inputs == (Shard(1),) and a.outputs == (Shard(1),)
    for target in (DTENSOR_REGISTER, JAX_PARTITION):
        refused = project(s, target)
        assert not refused and "even cuts only" in refused.reason
    # a gather on any split stands for an even one of the same placements
    both = Strategy("S1", (ShardIn(1),), (OutputCombine((Gather(1), Gather(1, even=True))),))
    assert not project(both, DTENSOR_PLAN).even


@pytest.mark.parametrize("strict", [True, False])
def test_the_planner_keeps_an_even_strategy_only_where_every_cut_dim_divides(strict):
    """[8, 256] viewed as [8, 4, 64]: the 256 cut by 4 keeps whole heads; by 8 (which
    divides 256, not 4) it would not, and the strategy is dropped in either mode."""
    rules = [Strategy("S1", (ShardIn(0),), (OutputCombine((Gather(0),)),)),
             Strategy("S2", (ShardIn(1),), (OutputCombine((Gather(1, even=True),)),))]
    per_axis = axis_strategies(rules, 1, 1)

    def labels(n, shape=(8, 256), out=(8, 4, 64)):
        return {s.label for s in compose(per_axis, Mesh.of((n,)), [shape], [out], strict)}

    assert labels(4) == {"R", "S1", "S2"}
    assert labels(8) == {"R", "S1"}
    # rows of 6 cut by 4 are uneven: a plain gather is kept there where the planner is not strict
    assert labels(4, (6, 256), (6, 4, 64)) == ({"R", "S2"} if strict else {"R", "S1", "S2"})
    assert [s.outputs for s in compose(per_axis, Mesh.of((4,)), [(8, 256)], [(8, 4, 64)], strict)
            if s.label == "S2"] == [((Shard(1),),)]
    assert REPLICATE not in [s.inputs[0][0] for s in compose(per_axis, Mesh.of((4,)), [(8, 256)], [(8, 4, 64)])
                             if s.label != "R"]


def test_jax_reshape_explored_live_finds_the_even_cut_that_torch_derives():
    """jax's reshape has no derived rules: its plain cut of a split dim fails on uneven
    splits, and the explorer then tries it as an even gather, which its pinned sizes allow."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from metaspmd.backends.jax.capture import capture
    from metaspmd.backends.jax.rules_at_runtime import node_call
    from metaspmd.backends.jax.tensor_ops import JaxOps

    c = capture(lambda x: jnp.reshape(x, (8, 4, 4)) * 2.0, (jnp.ones((8, 16), jnp.float32),), backward=False)
    node = next(n for n in c.ir.op_list if n.op == "jax.reshape")
    call = node_call(c, node)
    assert call.signature.startswith("x:f[8,16] ")  # every operand size keys a reshape's rules
    entry = explore_case(call.case(), JaxOps())
    assert _cuts(entry) == _cuts(_view((8, 16), [8, 4, 4])) == {0: "gather(dim=0)", 1: EVEN}


def test_a_split_explored_live_keeps_the_tables_even_cut_for_plans_only():
    """aten.view_copy of [25, 5] as [5, 5, 5] along its 25: the table's entry and a live
    exploration of the call give the same rules; plans run the even cut, register() not."""
    from metaspmd.backends.torch.rules_at_runtime import call_of
    from metaspmd.resolve import explore_call
    from metaspmd.target import projections

    call = call_of(aten.view_copy.default, (torch.randn(25, 5), [5, 5, 5]), {})
    assert call.signature == "self:f[25,5] size=[5,5,5]" and call.table_rules is not None
    live = tuple(explore_call(call, TorchOps()).all_strategies())
    name = "aten.view_copy.default"

    def placed(rules, target):
        return sorted(str((a.inputs, a.outputs, a.even)) for a in projections(rules, target, name))

    assert placed(call.table_rules, DTENSOR_PLAN) == placed(live, DTENSOR_PLAN)
    assert ((Shard(0),), (Shard(0),)) in [(a.inputs, a.outputs) for a in projections(live, DTENSOR_PLAN, name)]
    assert ((Shard(0),), (Shard(0),)) not in [(a.inputs, a.outputs) for a in projections(live, DTENSOR_REGISTER, name)]
