"""Independent parts: the elements of a ``_foreach`` list get labels of their own, and one
label per part may share a mesh axis (joint strategies), each joint verified."""

import pytest

from metaspmd.registry_io import RegistryError, dump_record, loads_record
from metaspmd.rules import make_record
from metaspmd.spec import (
    Gather, Identity, IndependentSpec, OutputCombine, PartialInput, Reduce, Replicate, ShardIn, SpecError, Strategy,
    joint, joint_strategies,
)

torch = pytest.importorskip("torch")
from metaspmd.case import OpCase  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402

torch_ops = pytest.importorskip("metaspmd.backends.torch.tensor_ops")
OPS = torch_ops.TorchOps()
aten = torch.ops.aten
F64 = torch.float64


def randn(*shape):
    return torch.randn(*shape, dtype=F64)


def explore(fn, args, names):
    return explore_case(OpCase("test", fn, tuple(args), {}, tuple(names)), OPS)


def oc(*combines):
    return OutputCombine(tuple(combines))


# --------------------------------------------------------------------------- model


def test_independent_spec_round_trips_and_rejects_bad_parts():
    spec = IndependentSpec.parse("[[S1, S2], [S3]]")
    assert spec.parts == (("S1", "S2"), ("S3",)) and str(spec) == "[[S1, S2], [S3]]"
    for bad in ("[[S1, S2]]", "[[S1], [S1]]", "[[S1], []]", "[[S1], [X2]]"):
        with pytest.raises(SpecError):
            IndependentSpec.parse(bad)


def test_joint_takes_each_output_from_its_own_part():
    a = Strategy("S1", (ShardIn(0), Replicate()), (oc(Gather(0)), oc(Identity(), Reduce("avg"))))
    b = Strategy("S3", (Replicate(), PartialInput()), (oc(Identity()), oc(Reduce("sum"))))
    s = joint([a, b])
    assert s.label == "S1+S3"
    assert s.inputs == (ShardIn(0), PartialInput())
    assert s.outputs == (oc(Gather(0)), oc(Reduce("sum")))


def test_joint_refuses_labels_that_share_an_input_or_an_output():
    a = Strategy("S1", (ShardIn(0), Replicate()), (oc(Gather(0)),))
    b = Strategy("S2", (ShardIn(1), Replicate()), (oc(Gather(1)),))
    c = Strategy("S3", (Replicate(), ShardIn(0)), (oc(Gather(0)),))
    assert joint([a, b]) is None  # both place input 0
    assert joint([a, c]) is None  # both need output 0


def test_joint_strategies_pick_one_label_per_part_up_to_a_limit():
    singles = [Strategy(f"S{k}", tuple(ShardIn(0) if i == k - 1 else Replicate() for i in range(4)),
                        tuple(oc(Gather(0)) if j == k - 1 else oc(Identity()) for j in range(4))) for k in range(1, 5)]
    spec = IndependentSpec((("S1",), ("S2",), ("S3",), ("S4",)))
    labels = [s.label for s in joint_strategies(singles, spec, 100)]
    assert len(labels) == 2 ** 4 - 1 - 4 and "S1+S2+S3+S4" in labels
    assert [s.label for s in joint_strategies(singles, spec, 3)] == labels[:3]
    assert joint_strategies(singles, None, 100) == []


# --------------------------------------------------------------------------- explorer


def test_foreach_elements_are_independent_parts():
    e = explore(aten._foreach_abs.default, [[randn(4, 6), randn(4, 6)]], ("self",))
    assert str(e.shard) == "[[S1, S2], [S3, S4]]"
    assert str(e.independent) == "[[S1, S2], [S3, S4]]"
    rules = {s.inputs: [o.first for o in s.outputs] for s in e.all_strategies()}
    # every combination DTensor's foreach strategy allows: element 0 on dim 0, element 1 on dim 1 ...
    assert rules[(ShardIn(0), ShardIn(1))] == [Gather(0), Gather(1)]
    # ... or one element sharded and the other whole
    assert rules[(Replicate(), ShardIn(0))] == [Identity(), Gather(0)]
    assert len(rules) == 4 + 4


def test_foreach_binary_pairs_elements_and_partial_inputs():
    x, y = [randn(4, 6), randn(4, 6)], [randn(4, 6), randn(4, 6)]
    e = explore(aten._foreach_add.List, [x, y], ("self", "other"))
    rules = {s.inputs: [o.first for o in s.outputs] for s in e.all_strategies()}
    assert rules[(ShardIn(0), PartialInput(), ShardIn(0), PartialInput())] == [Gather(0), Reduce("sum")]
    assert rules[(ShardIn(1), ShardIn(0), ShardIn(1), ShardIn(0))] == [Gather(1), Gather(0)]


def test_an_input_every_part_reads_is_shared():
    """Every output reads the one scalar tensor (grad clipping's coefficient): replicated, it
    leaves the list's elements independent, so each element takes its own cut (DTensor's
    (S(0), S(1), R) -> (S(0), S(1))); the label that makes it Partial is in no part."""
    e = explore(aten._foreach_mul.Tensor, [[randn(4, 6), randn(4, 6)], randn(())], ("self", "other"))
    assert str(e.independent) == "[[S1, S2, S5], [S3, S4, S6]]", e.independent
    rules = {s.inputs: [o.first for o in s.outputs] for s in e.all_strategies()}
    assert rules[(ShardIn(0), ShardIn(1), Replicate())] == [Gather(0), Gather(1)]
    assert rules[(ShardIn(0), PartialInput(), Replicate())] == [Gather(0), Reduce("sum")]
    assert rules[(Replicate(), Replicate(), PartialInput())] == [Reduce("sum"), Reduce("sum")]
    assert not any(p == PartialInput() for s in e.all_strategies() if "+" in s.label for p in s.inputs[2:])
    assert loads_record(dump_record(make_record("aten._foreach_mul.Tensor", "torch", [e]))).entries == (e,)


def test_outputs_shaped_by_another_part_are_not_independent():
    # out1's values come from b alone, but its shape from a: sharding a changes out1
    e = explore(aten.broadcast_tensors.default, [[randn(4, 1), randn(1, 6)]], ("tensors",))
    assert e.independent is None
    for s in e.all_strategies():
        assert "+" not in s.label


def test_a_rule_only_the_whole_list_has_keeps_the_search_across_parts():
    # same shapes: sharding both on dim 0 works, one alone cannot broadcast against the other
    e = explore(aten.broadcast_tensors.default, [[randn(4, 6), randn(4, 6)]], ("tensors",))
    assert e.independent is None
    rules = {s.inputs: [o.first for o in s.outputs] for s in e.all_strategies()}
    assert rules[(ShardIn(0), ShardIn(0))] == [Gather(0), Gather(0)]


def test_dependence_through_values_merges_parts():
    def fn(a, b):
        return a * 2, b + a.sum()

    e = explore(fn, [randn(4, 6), randn(4, 6)], ("a", "b"))
    assert e.independent is None


def test_an_input_read_for_its_dtype_only_is_a_part_without_outputs():
    """type_as reads other's dtype, never its values or shape: other is a part of its own,
    whose labels leave the output whole, so (R, S(0)) -> R and the joint (S(0), S(1)) ->
    S(0) hold along with (S(0), S(0)) -> S(0)."""
    e = explore(aten.type_as.default, [randn(4, 6), randn(4, 6)], ("self", "other"))
    assert e.independent is not None and len(e.independent.parts) == 2
    rules = {s.inputs: [o.first for o in s.outputs] for s in e.all_strategies()}
    assert rules[(Replicate(), ShardIn(0))] == [Identity()]
    assert rules[(ShardIn(0), ShardIn(1))] == [Gather(0)] and rules[(ShardIn(0), ShardIn(0))] == [Gather(0)]


def test_joints_of_parts_are_verified_on_dims_of_different_lengths():
    """A joint cuts self's dim of 3 and other's dim of 2 on one axis: every trial's split
    must fit the shorter (three shards do not fit a dim of 2), or no joint verifies."""
    e = explore(aten.type_as.default, [randn(2, 2, 3), randn(2, 2, 3)], ("self", "other"))
    assert e.independent is not None and len(e.independent.parts) == 2
    rules = {s.inputs: [o.first for o in s.outputs] for s in e.all_strategies()}
    assert rules[(ShardIn(2), ShardIn(0))] == [Gather(2)] and rules[(ShardIn(0), ShardIn(2))] == [Gather(0)]


def test_an_unread_input_beside_fixed_indices_is_a_free_part():
    """Index inputs keep their example values, so their effect is unseen: they join every
    output. An input no output reads still forms a part of its own beside them."""
    def fn(x, index, unused):
        return x.index_select(0, index) * 2

    case = OpCase("test", fn, (randn(6, 4), torch.tensor([4, 0, 2]), randn(6, 4)), {}, ("self", "index", "unused"),
                  fixed=frozenset({"index"}))
    e = explore_case(case, OPS)
    assert e.independent is not None and len(e.independent.parts) == 2
    rules = {s.inputs: [str(o.first) for o in s.outputs] for s in e.all_strategies()}
    assert rules[(Replicate(), Replicate(), ShardIn(0))] == ["identity"]
    assert rules[(ShardIn(1), Replicate(), ShardIn(0))] == ["gather(dim=1)"]


def test_an_input_read_for_its_shape_is_no_free_part():
    # view_as needs other's global shape; a shard of other makes the local view fail
    e = explore(aten.view_as.default, [randn(4, 6), randn(4, 6)], ("self", "other"))
    assert e.independent is None
    assert all(not (isinstance(s.inputs[0], Replicate) and isinstance(s.inputs[1], ShardIn)) for s in e.all_strategies())


# --------------------------------------------------------------------------- registry


def _record():
    e = explore(aten._foreach_abs.default, [[randn(4, 6), randn(4, 6)]], ("self",))
    return make_record("aten._foreach_abs.default", "torch", [e])


def test_independent_parts_round_trip_through_yaml():
    record = _record()
    text = dump_record(record)
    assert "independent: [[S1, S2], [S3, S4]]" in text
    assert loads_record(text) == record


@pytest.mark.parametrize("bad, message", [
    ("independent: [[S1, S2], [S3, S9]]", "label S9 is unknown"),
    ("independent: [[S1, S2, S3, S4]]", "two or more"),
])
def test_bad_independent_parts_name_file_and_line(bad, message):
    text = dump_record(_record()).replace("independent: [[S1, S2], [S3, S4]]", bad)
    with pytest.raises(RegistryError, match=rf"foreach\.yaml:\d+: .*{message}"):
        loads_record(text, "foreach.yaml")
