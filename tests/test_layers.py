"""Further layers of tables (``more``): strategies that cut a dim an earlier label already
cuts keep labels of their own instead of being dropped."""

import pytest

from metaspmd.registry_io import RegistryError, dump_record, loads_record
from metaspmd.rules import Example, RuleEntry, TensorArg, make_record
from metaspmd.spec import Gather, Identity, OutputCombine, PartialInput, Reduce, Replicate, ShardIn, tables_from_strategies

torch = pytest.importorskip("torch")
from metaspmd.case import OpCase  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402

torch_ops = pytest.importorskip("metaspmd.backends.torch.tensor_ops")
OPS = torch_ops.TorchOps()
aten = torch.ops.aten
F64 = torch.float64
R = Replicate()


def oc(*combines):
    return OutputCombine(tuple(combines))


def randn(*shape):
    return torch.randn(*shape, dtype=F64)


def explore(fn, args, names):
    return explore_case(OpCase("test", fn, tuple(args), {}, tuple(names)), OPS)


# one list element cut alone, beside both cut together: dim 0 of input 0 is cut twice
FOUND = [
    ((ShardIn(0), ShardIn(0)), (oc(Gather(0)), oc(Gather(0)))),
    ((ShardIn(0), R), (oc(Gather(0)), oc(Identity()))),
    ((R, ShardIn(0)), (oc(Identity()), oc(Gather(0)))),
    ((ShardIn(1), ShardIn(1)), (oc(Gather(1)), oc(Gather(1)))),
    ((R, PartialInput()), (oc(Identity()), oc(Reduce("sum")))),
]


def test_a_strategy_on_a_labelled_dim_takes_a_further_layer():
    tables = tables_from_strategies((2, 2), FOUND)
    # the first layer is what one label per dim can hold, labelled in reading order
    assert str(tables.shard) == "[[S1, S2], [S1, S2]]"
    assert str(tables.partial) == "[[], [S3(sum)]]"
    # the rest continue the numbering, as many layers as the clashes need
    assert [str(layer.shard) for layer in tables.more] == ["[[S4, N], [S5, N]]"]
    assert {s.inputs for s in tables.strategies()} == {p for p, _ in FOUND}
    assert len(list(tables.strategies())) == len(FOUND)


def _entry():
    tables = tables_from_strategies((2, 2), FOUND)
    tensors = (("a", TensorArg((4, 6), "float64")), ("b", TensorArg((4, 6), "float64")))
    return RuleEntry("a:f[*,*] b:f[*,*]", "ok", tables.shard, tables.partial, tables.combine, Example(tensors),
                     results=(TensorArg((4, 6), "float64"),) * 2, more=tables.more)


def test_further_layers_round_trip_through_yaml():
    record = make_record("test.layers", "torch", [_entry()])
    text = dump_record(record)
    assert "  more:\n  - shard: [[S4, N], [S5, N]]\n" in text
    back = loads_record(text)
    assert back == record
    assert [s.label for s in back.entries[0].strategies()] == ["S1", "S2", "S3", "S4", "S5"]


@pytest.mark.parametrize("old, new, message", [
    ("S4", "S2", "label S2 is already used by an earlier layer"),  # S4 is in the further layer only
    ("- shard: [[S4, N], [S5, N]]", "- shard: [[S4, N], [S5]]", "inputs and ranks of the entry's shard"),
    ("    combine: {S4:", "    combin: {S4:", "unknown key 'combin' in layer of more"),
])
def test_a_bad_layer_names_file_and_line(old, new, message):
    text = dump_record(make_record("test.layers", "torch", [_entry()]))
    assert old in text
    text = text.replace(old, new)  # every occurrence
    with pytest.raises(RegistryError, match=rf"layers\.yaml:\d+: .*{message}"):
        loads_record(text, "layers.yaml")


def test_one_element_of_a_coupled_list_keeps_its_own_cut():
    # the scalar feeds every output, one of them alone, so the tensors have no independent
    # parts; both cut along dim 0 hold, and so does a cut alone (the other tensor whole)
    def scaled(a, b, s):
        return a * s, b * s, s * 2

    e = explore(scaled, [randn(4, 6), randn(4, 6), randn(())], ("a", "b", "s"))
    assert e.independent is None and e.more
    rules = {s.inputs: [o.first for o in s.outputs] for s in e.strategies()}
    assert rules[(ShardIn(0), ShardIn(0), R)] == [Gather(0), Gather(0), Identity()]
    assert rules[(ShardIn(0), R, R)] == [Gather(0), Identity(), Identity()]
    assert rules[(R, ShardIn(1), R)] == [Identity(), Gather(1), Identity()]
    assert not any(n.startswith("dropped") for n in e.notes)


def test_parts_with_more_joints_than_offered_are_still_independent():
    # four tensors of ranks 4, 3, 2, 1 have 5*4*3*2 - 1 label choices, more than JOINT_LIMIT:
    # the search across parts is checked part by part, not against the capped joints
    e = explore(aten.atleast_3d.Sequence, [[randn(2, 3, 4, 5), randn(2, 3, 4), randn(2, 3), randn(4)]], ("tensors",))
    assert e.independent is not None and len(e.independent.parts) == 4
    assert not e.more and not any(n.startswith("dropped") for n in e.notes)
