"""The DTensor OpInfo benchmark's cuts beyond the test's (benchmarks/dtensor_opinfo_bench.py
--uneven, --mesh 2x2): which placements each input gets, every combination in product order
or a fixed draw of them, and inputs that really come out placed so."""

import itertools
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dtensor_opinfo_bench as bench  # noqa: E402
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402

WORLD = 4


@pytest.fixture
def meshes(fake_world_of):
    fake_world_of(WORLD)
    with LocalTensorMode(frozenset(range(WORLD))):
        yield {shape: init_device_mesh("cpu", shape) for shape in ((4,), (2, 2))}


def _placed(converter) -> list[tuple]:
    return [tuple(t.placements for t in args if isinstance(t, DTensor)) for args, _ in converter]


def test_uneven_cuts_every_dim_of_size_over_one_and_even_ones_only_those_that_divide(meshes):
    x = torch.randn(5, 4, 1)
    uneven = _placed(bench.every_cut_converter(uneven=True)(meshes[(4,)], [x], {}, seed="x"))
    assert uneven == [((Replicate(),),), ((Shard(0),),), ((Shard(1),),)]
    even = _placed(bench.every_cut_converter(uneven=False)(meshes[(4,)], [x], {}, seed="x"))
    assert even == [((Replicate(),),), ((Shard(1),),)]


def test_a_2x2_mesh_places_over_both_dims_the_same_dim_twice_included(meshes):
    x, flags = torch.randn(5, 3), torch.ones(5, 3, dtype=torch.bool)
    got = _placed(bench.every_cut_converter(uneven=True)(meshes[(2, 2)], [x, flags], {}, seed="x"))
    per_dim = [Replicate(), Shard(0), Shard(1)]
    assert got == [(p, (Replicate(), Replicate())) for p in itertools.product(per_dim, per_dim)]
    assert ((Shard(0), Shard(0)), (Replicate(), Replicate())) in got  # a bool tensor stays replicated


@pytest.mark.slow  # 9 s
def test_past_the_cap_a_fixed_draw_of_the_combinations_in_product_order(meshes):
    ins = [torch.randn(3, 3, 3) for _ in range(3)]  # 16 placements each over 2x2: 4,096 combinations
    make = bench.every_cut_converter(uneven=True)
    first = _placed(make(meshes[(2, 2)], ins, {}, seed="op"))
    assert len(first) == bench.MAX_COMBINATIONS == len(set(first))
    assert first == _placed(make(meshes[(2, 2)], ins, {}, seed="op"))
    assert first != _placed(make(meshes[(2, 2)], ins, {}, seed="another op"))
    choices = [list(itertools.product(*[[Replicate()] + [Shard(d) for d in range(3)]] * 2))] * 3
    every = list(itertools.product(*choices))
    assert all(bench._nth_combination(choices, i) == c for i, c in enumerate(every))
    assert first == sorted(first, key=every.index)


def test_the_cut_inputs_hold_the_sample_on_every_rank(meshes):
    x = torch.arange(10.0).reshape(5, 2)
    for args, _ in bench.every_cut_converter(uneven=True)(meshes[(2, 2)], [x], {}, seed="x"):
        full = args[0].full_tensor()
        assert all(torch.equal(t, x) for t in full._local_tensors.values()), args[0].placements


def test_an_error_is_explained_by_its_refusal_and_a_wrong_answer_never():
    flatten = "RuntimeError: Cannot flatten unevenly sharded tensor: dimension 0 (size 5)"
    empty = "RuntimeError: input tensor must have at least one element, but got input_sizes = [5, 0, 5]"
    both = bench.Outcome(bench.ERROR, flatten, bwd=bench.ERROR, bwd_detail=empty)
    assert bench.reason("some.op", both).startswith("refused: ")
    assert "flatten" in bench.reason("some.op", both) and "empty shard" in bench.reason("some.op", both)
    assert bench.reason("some.op", bench.Outcome(bench.ERROR, flatten, bwd=bench.ERROR, bwd_detail="KeyError: 3")) == ""
    wrong = bench.Outcome(bench.ERROR, flatten, wrong_anywhere=True)
    assert bench.reason("some.op", wrong) == ""
    assert bench.reason("zeros", bench.Outcome(bench.ERROR, "anything")) == bench.WHY["zeros"]
