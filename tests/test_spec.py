"""The rule model's string forms round-trip and reject what is not paper notation."""

import pytest

from metaspmd.spec import (
    CombineSpec, DimLabel, Gather, Identity, OffsetIn, OffsetSpec, OutputCombine, PartialIn, PartialSpec, Reduce, Replicate,
    Scan, ShardIn, ShardSpec, SpecError, parse_combine, strategies,
)


@pytest.mark.parametrize("text", [
    "gather(dim=0)", "gather(dim=3, halo=2)", "gather(dim=1, block=3)", "gather(dim=2, halo=1, block=2)",
    "gather(dim=1, halo=(1, 0))", "gather(dim=0, halo=(0, 2), block=2)",
    "reduce(sum)", "reduce(max)", "reduce(min)", "reduce(prod)", "reduce(avg)", "reduce(norm2)", "identity",
    "gather(dim=1, reverse=true)", "scan(dim=0, op=sum)", "scan(dim=2, op=logsumexp, reverse=true)",
    "reduce(xor)", "argreduce(max, input=0)", "argreduce(min, input=3)", "gather(dim=2, overlap=4)",
    "gather(dim=0, positions)", "gather(dim=1, positions=2)",
])
def test_combine_round_trip(text):
    c = parse_combine(text)
    assert str(c) == text
    assert parse_combine(str(c)) == c


@pytest.mark.parametrize("text", ["argreduce(sum, input=0)", "argreduce(max)", "argreduce(max, input=-1)",
                                  "gather(0)", "gather(dim=-1)", "reduce(mean)", "reduce()", "reduce(norm)", "reduce(2norm)", "Identity", "gather(dim=0, block=1)", "",
                                  "gather(dim=0, halo=(1, 1))", "gather(dim=0, halo=(0, 0))", "gather(dim=0, halo=(1,0))",
                                  "gather(dim=0, halo=1, reverse=true)", "gather(dim=0, reverse=false)", "gather(dim=0, reverse)",
                                  "gather(dim=0, overlap=0)", "gather(dim=0, halo=1, overlap=1)",
                                  "gather(dim=0, overlap=1, reverse=true)", "gather(dim=0, block=2, overlap=1)",
                                  "scan(dim=0)", "scan(dim=0, op=avg)", "scan(op=sum, dim=0)", "scan(dim=0, op=sum, reverse=false)",
                                  "gather(dim=0, positions=-1)", "gather(dim=0, positions=)", "gather(dim=0, positions, block=2)"])
def test_bad_combine_rejected(text):
    with pytest.raises(SpecError):
        parse_combine(text)


def test_tables_round_trip():
    shard = ShardSpec.parse("[[S1, S2], [S2, S3(halo=1)]]")
    assert shard.inputs[1][1] == DimLabel("S3", 1)
    assert ShardSpec.parse(str(shard)) == shard
    combine = CombineSpec.parse("{S1: gather(dim=0), S2: reduce(sum) | reduce(max), S3: gather(dim=1) | identity}")
    assert CombineSpec.parse(str(combine)) == combine
    partial = PartialSpec.parse("[[S2(sum)], []]")
    assert PartialSpec.parse(str(partial)) == partial
    offset = OffsetSpec.parse("[[], [S1, S2(1)]]")
    assert offset.inputs[1] == (OffsetIn("S1"), OffsetIn("S2", 1)) and OffsetSpec.parse(str(offset)) == offset
    dropped = OffsetSpec.parse("[[S1(drop)], [S2(0, drop)]]")
    assert dropped.inputs == ((OffsetIn("S1", None, True),), (OffsetIn("S2", 0, True),))
    assert OffsetSpec.parse(str(dropped)) == dropped
    for bad in ("[[S1(x)]]", "[[S1(-1)]]", "[[O1]]", "[[S1(drop, 0)]]", "[[S1(0,drop)]]", "[[S1()]]"):
        with pytest.raises(SpecError):
            OffsetSpec.parse(bad)
    assert str(OutputCombine.of([Reduce("sum"), Gather(0), Identity()])) == "gather(dim=0) | identity | reduce(sum)"
    ordered = OutputCombine.of([Scan(0, "max"), Gather(0, reverse=True), Reduce("sum"), Gather(0)])
    assert str(ordered) == "gather(dim=0) | gather(dim=0, reverse=true) | reduce(sum) | scan(dim=0, op=max)"
    assert not Gather(0, reverse=True).plain and not Gather(0, overlap=1).plain
    assert PartialIn.parse("S4(sum)") == PartialIn("S4", "sum")
    local = ShardSpec.parse("[[S1(local), S2]]")
    assert local.inputs[0][0] == DimLabel("S1", local=True) and not local.inputs[0][0].plain
    assert str(local) == "[[S1(local), S2]]"
    (s1, _) = strategies(local, PartialSpec(((),)), CombineSpec.parse("{S1: gather(dim=0), S2: gather(dim=1)}"))
    assert s1.inputs == (ShardIn(0, local=True),) and str(s1.inputs[0]) == "S(0, local)"


@pytest.mark.parametrize("text", ["[[S1, S1]]", "[[X1]]", "[[S0]]", "[S1]", "[[N(halo=1)]]", "[[N(local)]]",
                                  "[[S1(local, halo=1)]]", "[[S1(halo=1, local)]]", "[[S1(locals)]]"])
def test_bad_shard_rejected(text):
    with pytest.raises(SpecError):
        ShardSpec.parse(text)


def test_strategies_expand_labels():
    shard = ShardSpec.parse("[[S1, S2], [S2, S3], [N, N]]")
    partial = PartialSpec.parse("[[], [], [S2(sum)]]")
    combine = CombineSpec.parse("{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}")
    s = {x.label: x for x in strategies(shard, partial, combine)}
    assert s["S1"].inputs == (ShardIn(0), Replicate(), Replicate())
    assert s["S2"].inputs[0] == ShardIn(1) and s["S2"].inputs[1] == ShardIn(0)
    assert str(s["S2"].inputs[2]) == "P(sum)"
    assert s["S3"].outputs[0].first == Gather(1)


@pytest.mark.parametrize("text", ["S1(scale=2)", "S1(extend=1)", "S3(scale=2, extend=1)"])
def test_proportional_dim_labels_round_trip(text):
    label = DimLabel.parse(text)
    assert str(label) == text and label.follows and not label.plain


@pytest.mark.parametrize("text", ["S1()", "S1(scale=1)", "S1(extend=0)", "S1(extend=1, scale=2)", "S1(scale=2,extend=1)",
                                  "S1(halo=1, scale=2)", "N(scale=2)"])
def test_bad_proportional_labels_rejected(text):
    with pytest.raises(SpecError):
        DimLabel.parse(text)


def test_a_proportional_cut_needs_a_plain_one_to_follow():
    with pytest.raises(SpecError, match="none plainly"):
        ShardSpec.parse("[[S1(scale=2)], [S2]]")
    spec = ShardSpec.parse("[[S1(scale=2, extend=1), N], [S1, S2]]")
    placements = [s.inputs for s in strategies(spec, PartialSpec(((), ())), CombineSpec.parse("{S1: gather(dim=0), S2: gather(dim=1)}"))]
    assert placements[0] == (ShardIn(0, 0, 2, 1), ShardIn(0))
