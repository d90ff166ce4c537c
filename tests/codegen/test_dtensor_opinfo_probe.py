"""The DTensor OpInfo benchmark's nondeterminism probe (benchmarks/dtensor_opinfo_bench.py):
a reference that reads memory no input holds is caught, a deterministic one is not, and an
op's own NaN is an answer."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dtensor_opinfo_bench as bench

# OpInfo's _segment_reduce.offsets sample: the last segment, [3, 5), runs past 4 elements.
# Its storage runs on with 7.0, so the reference reads 7.0 there, never a NaN the allocator
# may have left (which would look like the probe's padding).
DATA = torch.tensor([-8.5, -1.8, -4.3, -2.4, 7.0, 7.0])[:4]
OFFSETS = {"axis": 0, "unsafe": False, "initial": 1, "offsets": torch.tensor([0, 0, 1, 3, 5])}


def test_a_read_past_the_input_differs_under_the_probe():
    ref = torch.segment_reduce(DATA, "max", **OFFSETS)
    again = bench._probe(torch.segment_reduce, [DATA, "max"], OFFSETS)
    assert not bench._same(ref, again)
    assert torch.isnan(again[-1]) and not torch.isnan(again[:-1]).any()  # only the segment past the end


def test_two_fills_tell_a_read_past_the_input_whatever_lies_past_the_reference():
    """The reference may read, past its input, the very NaN the probe pads with (left there
    by an earlier probe): two probes with different fills differ all the same."""
    nan_past = torch.tensor([-8.5, -1.8, -4.3, -2.4, float("nan"), float("nan")])[:4]
    ref = torch.segment_reduce(nan_past, "max", **OFFSETS)
    nan_fill = bench._probe(torch.segment_reduce, [nan_past, "max"], OFFSETS)
    assert bench._same(ref, nan_fill)  # one fill alone is fooled
    assert not bench._same(nan_fill, bench._probe(torch.segment_reduce, [nan_past, "max"], OFFSETS, 7.0))
    x = torch.tensor([-1.0, 0.0, 2.0])
    assert bench._same(bench._probe(torch.cumsum, [x, 0], {}), bench._probe(torch.cumsum, [x, 0], {}, 7.0))


def test_the_probe_fills_uninitialized_allocations_and_restores_the_modes():
    fill, det = torch.utils.deterministic.fill_uninitialized_memory, torch.are_deterministic_algorithms_enabled()
    assert torch.isnan(bench._probe(torch.empty_like, [DATA], {})).all()  # NaN: no allocator leftovers
    assert torch.are_deterministic_algorithms_enabled() == det
    assert torch.utils.deterministic.fill_uninitialized_memory == fill


def test_a_deterministic_op_and_its_own_nan_agree_under_the_probe():
    x = torch.tensor([-1.0, 0.0, 2.0])
    for fn in (torch.sqrt, torch.cumsum):
        args = [x] if fn is torch.sqrt else [x, 0]
        ref = fn(*args)
        assert bench._same(ref, bench._probe(fn, args, {}))
    assert torch.isnan(torch.sqrt(x)).any()


def test_a_call_that_samples_counts_as_random_whatever_argument_asks_for_it():
    q = torch.randn(2, 4, 3)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert bench._reference(sdpa, [q, q, q], {"dropout_p": 0.5})[1]
    assert not bench._reference(sdpa, [q, q, q], {"dropout_p": 0.0})[1]
    # multi_head_attention_forward takes its dropout_p positionally
    w, b = torch.randn(9, 3), torch.randn(9)
    mha = torch.nn.functional.multi_head_attention_forward
    x = torch.randn(4, 2, 3)
    args = [x, x, x, 3, 1, w, b, None, None, False]
    out, drew = bench._reference(mha, args + [0.5, torch.randn(3, 3), torch.randn(3)], {"training": True})
    assert drew and out[0].shape == (4, 2, 3)
    assert not bench._reference(mha, args + [0.0, torch.randn(3, 3), torch.randn(3)], {"training": True})[1]
    assert not bench._reference(torch.sqrt, [DATA.abs()], {})[1]
