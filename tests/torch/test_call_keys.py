"""A live entry is cached under what its rules were verified at: a call whose rules hold at
its own sizes and dtypes only (a user's op, torch's op reading a position) gets an entry of
its own per shape and dtype, and an entry file moved under another key is not read there."""

import shutil

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch.rules_at_runtime import call_of  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.cache import RuleCache, RuleCacheWarning  # noqa: E402
from metaspmd.resolve import resolve_call  # noqa: E402
from metaspmd.spec import ShardIn  # noqa: E402

OPS = TorchOps()


@torch.library.custom_op("metaspmd_test::centred_if_32_bits", mutates_args=())
def centred_if_32_bits(x: torch.Tensor) -> torch.Tensor:
    # a dtype-branching kernel: float32 and int32 take each column's first row away, others scale
    return x - x[:1] if x.dtype in (torch.float32, torch.int32) else x * 2


centred_if_32_bits.register_fake(lambda x: torch.empty_like(x))


def _cuts(op, call, cache) -> set[int]:
    """The dims of the first input the call's rules cut plainly."""
    entry = resolve_call(op, call, OPS, "torch", cache)
    return {s.inputs[0].dim for s in entry.strategies() if isinstance(s.inputs[0], ShardIn) and not s.inputs[0].halo}


def test_tril_by_a_position_is_cached_per_size(tmp_path):
    # tril(x, 8) keeps every element of 8 columns, so rows cut freely there, and not of 16:
    # the entry of [4, 8] must not stand for [4, 16], whose signature is the same
    cache, op, fn = RuleCache(tmp_path), "aten.tril.default", torch.ops.aten.tril.default
    narrow = call_of(fn, (torch.randn(4, 8), 8), {})
    wide = call_of(fn, (torch.randn(4, 16), 8), {})
    assert narrow.signature == wide.signature and narrow.at != wide.at
    assert 0 in _cuts(op, narrow, cache)
    assert 0 not in _cuts(op, wide, cache)
    assert len(list(tmp_path.rglob("*.yaml"))) == 2
    assert 0 not in _cuts(op, wide, RuleCache(tmp_path))  # read back from its own file


@pytest.mark.parametrize("kept, other", [(torch.float64, torch.float32), (torch.int64, torch.int32)])
def test_a_users_op_is_explored_at_its_calls_own_dtype(tmp_path, kept, other):
    # rows cut only where the kernel scales: never at float32 (it was explored on float64
    # copies) nor int32 (it shared int64's entry)
    cache, op = RuleCache(tmp_path), "metaspmd_test.centred_if_32_bits.default"
    fn = torch.ops.metaspmd_test.centred_if_32_bits.default

    def call(dtype):
        return call_of(fn, ((torch.randn(6, 4) * 10).to(dtype),), {})

    assert 0 in _cuts(op, call(kept), cache)
    assert _cuts(op, call(other), cache) == {1}
    assert 0 in _cuts(op, call(kept), RuleCache(tmp_path))  # each dtype keeps its file


def test_an_entry_moved_under_another_key_is_explored_again(tmp_path):
    fn, op = torch.ops.aten.tril.default, "aten.tril.default"
    narrow = call_of(fn, (torch.randn(4, 8), 8), {})
    wide = call_of(fn, (torch.randn(4, 16), 8), {})
    _cuts(op, narrow, RuleCache(tmp_path))
    cache = RuleCache(tmp_path)
    src = cache.path("torch", op, narrow.signature, narrow.implementation, narrow.pieces, narrow.at)
    dst = cache.path("torch", op, wide.signature, wide.implementation, wide.pieces, wide.at)
    shutil.copy(src, dst)  # the narrow call's rules where the wide call's belong
    with pytest.warns(RuleCacheWarning, match=f"{dst}.*moved from another entry"):
        assert 0 not in _cuts(op, wide, cache)


def test_an_added_tables_rules_of_torchs_op_are_verified_at_the_call(tmp_path):
    # a table of one's own that lists torch's softmax with a row cut (wrong: rows are what
    # it normalizes) was used as it stood: the added table's rules are candidates verified
    # at each call, as a user's op's are
    from metaspmd.backends.torch import table
    from metaspmd.backends.torch.samples import call_signature
    from metaspmd.table import Entry

    fn, op = torch.ops.aten._softmax.default, "aten._softmax.default"
    args = (torch.randn(6, 4), 0, False)
    added = {op: {call_signature(fn, args, {}): Entry("[[S1, S2]]", "{S1: gather(dim=0), S2: gather(dim=1)}")}}
    assert 0 not in _cuts(op, call_of(fn, args, {}), RuleCache(tmp_path / "before"))
    table.add_table(added)
    try:
        call = call_of(fn, args, {})
        assert call.table_rules is None and table.verified_per_call(fn)
        assert _cuts(op, call, RuleCache(tmp_path)) == {1}
    finally:
        table.remove_table(added)
    assert not table.verified_per_call(fn)


def test_a_bound_on_values_is_checked_at_the_calls_own_data(tmp_path):
    # renorm(x, 2, 0, maxnorm=5) scales each row whose norm passes 5: rows of 256 do, the
    # small stand-in's rows of 8 do not, so a column cut passed there and served the call
    fn, op = torch.ops.aten.renorm.default, "aten.renorm.default"
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    assert 1 not in _cuts(op, call_of(fn, (x, 2.0, 0, 5.0), {}), RuleCache(tmp_path))


def test_a_partial_input_read_only_inside_the_calls_own_range_is_not_unread(tmp_path):
    # histc(x, 4, 100, 200) reads values inside [100, 200] only: random data never holds one,
    # special values planted 100 and 200 by chance alone, and a Partial self passed as identity
    from metaspmd.spec import Identity, PartialInput

    entry = resolve_call("aten.histc.default", call_of(torch.ops.aten.histc.default, (torch.randn(64), 4, 100.0, 200.0), {}),
                         OPS, "torch", RuleCache(tmp_path))
    assert not any(isinstance(p, PartialInput) and Identity() in s.outputs[0].options
                   for s in entry.all_strategies() for p in s.inputs), entry.combine


@pytest.mark.parametrize("columns", [6, 64])
def test_a_norm_under_a_bound_is_explored_with_the_bound_planted(columns):
    # rows of random data stay under renorm's maxnorm, where it changes nothing and a column
    # cut passed, planned by any call's shapes and wrong at data past the bound
    from metaspmd.backends.torch.backend import make_runner, torch_case
    from metaspmd.explorer import explore_case

    fn = torch.ops.aten.renorm.default
    x = torch.randn(8, columns, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    entry = explore_case(torch_case(fn, (x, 2.0, 0, 20.0), {}, make_runner(fn)), OPS)
    assert {s.inputs[0].dim for s in entry.strategies() if isinstance(s.inputs[0], ShardIn)} == {0}
