"""The DTensor OpInfo benchmark's nondeterminism probe (benchmarks/dtensor_opinfo_bench.py):
a reference that reads memory no input holds is caught, a deterministic one is not, and an
op's own NaN is an answer."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dtensor_opinfo_bench as bench

# OpInfo's _segment_reduce.offsets sample: the last segment, [3, 5), runs past 4 elements
DATA = torch.tensor([-8.5, -1.8, -4.3, -2.4])
OFFSETS = {"axis": 0, "unsafe": False, "initial": 1, "offsets": torch.tensor([0, 0, 1, 3, 5])}


def test_a_read_past_the_input_differs_under_the_probe():
    ref = torch.segment_reduce(DATA, "max", **OFFSETS)
    again = bench._probe(torch.segment_reduce, [DATA, "max"], OFFSETS)
    assert not bench._same(ref, again)
    assert torch.isnan(again[-1]) and not torch.isnan(again[:-1]).any()  # only the segment past the end


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


def test_an_attention_call_with_dropout_counts_as_random():
    assert bench._draws({"dropout_p": 0.5}) and not bench._draws({"dropout_p": 0.0}) and not bench._draws({})
