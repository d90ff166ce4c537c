"""A torch call the table misses is explored on small stand-in tensors of its signature,
and its rules are kept only where they also hold at the call's own sizes: a position the
call names (tril's diagonal) or a kernel that branches on a size can make the stand-in
another op, whose rules are wrong for the call."""

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch.rules_at_runtime import call_of
from metaspmd.backends.torch.tensor_ops import TorchOps
from metaspmd.explorer import explore_case
from metaspmd.resolve import explore_call
from metaspmd.spec import ShardIn

aten = torch.ops.aten
OPS = TorchOps()


def cut_dims(entry) -> set[int]:
    return {p.dim for s in entry.all_strategies() for p in s.inputs if isinstance(p, ShardIn)}


def test_a_diagonal_past_the_stand_ins_sizes_keeps_no_cut():
    """At 8x6, tril(8) keeps every element: a cut of either dim held there (the columns'
    fails once they alone are long, past twice their length). At 32x16 each shard would
    mask with its own row and column numbers."""
    call = call_of(aten.tril.default, (torch.randn(32, 16), 8), {})
    stand_in = call.case()
    assert stand_in.stand_in_for is not None and tuple(stand_in.args[0].shape) == (8, 6)
    assert cut_dims(explore_case(stand_in, OPS)) == {0}  # what the stand-in alone claims
    entry = explore_call(call, OPS)
    assert cut_dims(entry) == set() and entry.example.args[0][1].shape == (32, 16)


def test_a_call_whose_rules_hold_at_its_sizes_keeps_the_stand_ins():
    x = torch.randn(12, 32, 16)
    entry = explore_call(call_of(aten.cumsum.default, (x, 1), {}), OPS)
    assert entry.example.args[0][1].shape == (6, 10, 8)  # explored on the stand-in alone
    assert cut_dims(entry) >= {0, 2}


@torch.library.custom_op("metaspmd_test::centred_when_long", mutates_args=())
def centred_when_long(x: torch.Tensor) -> torch.Tensor:
    # a kernel choosing its math by length: long inputs are centred over their rows
    return x - x.mean(0, keepdim=True) if x.shape[0] > 16 else x * 2


@centred_when_long.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("metaspmd_test::block_centred", mutates_args=())
def block_centred(x: torch.Tensor) -> torch.Tensor:
    # a fast path for short inputs; longer ones centred in aligned blocks of 8 rows
    if x.shape[0] <= 16:
        return x * 2
    blocks = torch.nn.functional.pad(x, (0, 0, 0, -x.shape[0] % 8)).view(-1, 8, x.shape[1])
    return (blocks - blocks.mean(1, keepdim=True)).view(-1, x.shape[1])[: x.shape[0]]


@block_centred.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.mark.parametrize("op,shape", [(torch.ops.metaspmd_test.centred_when_long.default, (32, 16)),
                                      (torch.ops.metaspmd_test.block_centred.default, (96, 12))])
def test_a_users_op_is_explored_at_the_calls_own_sizes(op, shape):
    """A kernel may branch on a size: on an 8x6 stand-in both took their fast path, every
    cut held there, and the block op's row cut passed the check at the call's sizes too
    (its cuts there fell on multiples of 8)."""
    call = call_of(op, (torch.randn(*shape),), {})
    assert tuple(call.case().args[0].shape) == shape
    assert cut_dims(explore_call(call, OPS)) == {1}  # the columns, each on its own; not the rows


@pytest.mark.parametrize("args,pieces", [((torch.randn(30, 8), 7), 5), ((torch.randn(30, 8), 7, 1), 2)])
def test_a_split_into_another_number_of_pieces_on_a_stand_in_is_explored_at_its_sizes(args, pieces):
    """split(x, 7) of 30 rows gives 5 pieces, of a stand-in's 8 rows 2: the stand-in's rules
    had two output combines for a call of five."""
    entry = explore_call(call_of(aten.split.Tensor, args, {}), OPS)
    assert entry.example.args[0][1].shape == (30, 8)
    assert entry.strategies() and all(len(s.outputs) == pieces for s in entry.strategies())


def test_table_rules_for_another_number_of_pieces_are_not_the_calls():
    """The table's unbind of rank 3 along dim 0 has two output combines (the sweep's example
    had two rows); a call of three rows took them, and the planner, finding no rule of
    three outputs, replicated it."""
    from metaspmd.backends.torch import table

    x = torch.randn(3, 4, 8)
    assert {len(s.outputs) for s in table.lookup(aten.unbind.int, (x, 0), {})} == {2}
    call = call_of(aten.unbind.int, (x, 0), {})
    assert call.table_rules is None and call.pieces == 3
    entry = explore_call(call, OPS)
    assert cut_dims(entry) >= {1, 2} and call.takes(entry)
    assert not call_of(aten.unbind.int, (torch.randn(4, 4, 8), 0), {}).takes(entry)  # a cached entry of 3


@torch.library.custom_op("metaspmd_test::first_rows", mutates_args=())
def first_rows(x: torch.Tensor) -> torch.Tensor:
    return x[:32] * 2  # a row count held inside the kernel, past any size a sweep tries


@first_rows.register_fake
def _(x):
    return torch.empty(min(x.shape[0], 32), x.shape[1])


def test_a_users_op_takes_its_table_and_cached_rules_only_as_verified_at_its_sizes(monkeypatch, tmp_path):
    """A sweep of first_rows at 12 rows keeps the row gather (true below 32 rows, and at
    every length its checks reach); a table made from it served a call of 64 rows, whose
    plan then died in DTensor. Such rules are candidates verified at the call's own sizes,
    and a cached entry serves calls of its example's sizes only."""
    from metaspmd.backends.torch import table
    from metaspmd.cache import RuleCache
    from metaspmd.resolve import NEIGHBOUR_NOTE, resolve_call
    from metaspmd.spec import Gather, OutputCombine, Strategy

    op = torch.ops.metaspmd_test.first_rows.default
    row_gather = Strategy("S1", (ShardIn(0),), (OutputCombine((Gather(0),)),))
    monkeypatch.setattr(table, "lookup", lambda fn, args, kwargs: (row_gather,) if fn is op else None)
    short, long = call_of(op, (torch.randn(12, 4),), {}), call_of(op, (torch.randn(64, 4),), {})
    assert short.table_rules is None and short.neighbours() == ((row_gather.inputs, row_gather.outputs),)
    assert short.sizes == ((12, 4),) and long.sizes == ((64, 4),) and short.key != long.key
    at_short = explore_call(short, OPS)
    assert NEIGHBOUR_NOTE in at_short.notes and 0 in cut_dims(at_short)  # the swept rule holds here
    cache = RuleCache(tmp_path)
    assert 0 in cut_dims(resolve_call(str(op), short, OPS, "torch", cache))
    entry = resolve_call(str(op), long, OPS, "torch", cache)  # not the short call's cached entry
    assert 0 not in cut_dims(entry) and entry.example.args[0][1].shape == (64, 4)
