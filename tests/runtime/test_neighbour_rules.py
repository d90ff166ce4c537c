"""A call the table misses only by a non-tensor argument (a layer norm of another width)
verifies its neighbouring signature's table rules first, and is explored from scratch
where one of them fails there."""

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import dtensor_rules
from metaspmd.backends.torch.rules_at_runtime import call_of
from metaspmd.backends.torch.tensor_ops import TorchOps

from metaspmd.registry_io import dump_record, loads_record
from metaspmd.resolve import NEIGHBOUR_NOTE, NodeCall, explore_call
from metaspmd.rules import make_record
from metaspmd.spec import Gather, OutputCombine, Replicate, ShardIn

aten = torch.ops.aten
OPS = TorchOps()


def layer_norm_call(width: int):
    x, w, b = torch.randn(2, 6, width), torch.randn(width), torch.randn(width)
    return aten.native_layer_norm.default, (x, [width], w, b, 1e-5), {}


def test_a_layer_norm_of_a_width_the_table_lacks_takes_its_neighbours_rules_verified():
    fn, args, kwargs = layer_norm_call(40)
    call = call_of(fn, args, kwargs)
    assert call.table_rules is None and "normalized_shape=[40]" in call.signature
    neighbours = call.neighbours()
    # the sweep's normalized_shape=[8] rules: the batch and sequence cuts, and more
    assert {p for p, _ in neighbours} >= {(ShardIn(0), Replicate(), Replicate()), (ShardIn(1), Replicate(), Replicate())}
    entry = explore_call(call, OPS)
    assert entry.status == "ok" and NEIGHBOUR_NOTE in entry.notes
    assert {s.inputs for s in entry.all_strategies()} >= {p for p, _ in neighbours}


def test_a_neighbour_rule_that_fails_at_the_call_sends_it_to_exploration():
    fn, args, kwargs = layer_norm_call(40)
    call = call_of(fn, args, kwargs)
    # a cut of the normalized dim is no rule of a layer norm: the neighbours are not trusted
    wrong = ((ShardIn(2), Replicate(), Replicate()), (OutputCombine((Gather(2),)),) * 3)
    seeded = NodeCall(call.signature, None, call.case, lambda: call.neighbours() + (wrong,))
    entry = explore_call(seeded, OPS)
    assert entry.status == "ok" and NEIGHBOUR_NOTE not in entry.notes
    assert (ShardIn(0), Replicate(), Replicate()) in {s.inputs for s in entry.all_strategies()}
    assert wrong[0] not in {s.inputs for s in entry.all_strategies()}


@pytest.mark.parametrize("fn, args", [
    (aten.div.Tensor, (torch.randn(4, 4, 6, 6), 2.8284271247461903)),  # the table's is other=2.0
    (aten.add.Tensor, (torch.randn(4, 6, 5), 0.125)),
    (aten.native_layer_norm.default, layer_norm_call(40)[1]),
])
def test_a_neighbour_verified_entry_places_the_inputs_one_way_once_and_reads_back(fn, args):
    # the neighbour's Partial(sum) rule and the search's own Partial inputs with nothing cut
    # found the same placement twice: the rule cache wrote it and then refused to read it
    call = call_of(fn, args, {})
    assert call.table_rules is None and call.neighbours()
    entry = explore_call(call, OPS)
    placements = [s.inputs for s in entry.all_strategies()]
    assert NEIGHBOUR_NOTE in entry.notes and len(placements) == len(set(placements))
    record = make_record(str(fn), "torch", [entry])
    assert loads_record(dump_record(record)) == record


def test_no_neighbour_across_flags_or_tensor_patterns():
    # output_mask decides which outputs exist: [True, False, True] takes no rules of the
    # table's [True, True, True] or [False, True, True]
    sig = ("grad_out:f[*,*,*] input:f[*,*,*] normalized_shape=[40] mean:f[*,*,1] rstd:f[*,*,1] weight:f[*] "
           "bias:f[*] output_mask=[True,False,True]")
    assert dtensor_rules.neighbour_rules(aten.native_layer_norm_backward.default, sig) == ()
    for mask in ("[True,True,True]", "[False,True,True]"):
        rules = dtensor_rules.neighbour_rules(aten.native_layer_norm_backward.default, sig.replace("[True,False,True]", mask))
        assert rules and all(len(s.outputs) == mask.count("True") for s in rules)
    assert dtensor_rules.neighbour_rules(aten.native_layer_norm.default, "input:f[*,*,*,*,*,*,*] normalized_shape=[3]") == ()
