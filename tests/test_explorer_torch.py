"""ShardCombine on real torch ops: the paper's figures, appendix A.3, Partial inputs, and
the reference implementation's known false positives."""

import pytest
import torch

from metaspmd.case import OpCase
from metaspmd.combine import Split, apply_combine, shard_with_halo
from metaspmd.explorer import explore_case
from metaspmd.explorer import ExploreConfig
from metaspmd.signature import ALL_DIMS
from metaspmd.spec import ArgReduce, Gather, Group, Identity, OutputCombine, PartialInput, Reduce, Replicate, ShardIn

torch_ops = pytest.importorskip("metaspmd.backends.torch.tensor_ops")
OPS = torch_ops.TorchOps()
aten = torch.ops.aten
F64 = torch.float64


def randn(*shape):
    return torch.randn(*shape, dtype=F64)


def explore(fn, args, names=(), kwargs=None, **kw):
    return explore_case(OpCase("test", fn, tuple(args), kwargs or {}, tuple(names), **kw), OPS)


def combines(entry):
    return {label: [str(o) for o in outs] for label, outs in entry.combine.by_label}


def test_figure3_mm():
    e = explore(aten.mm.default, [randn(6, 4), randn(4, 5)], ("self", "mat2"))
    assert str(e.shard) == "[[S1, S2], [S2, S3]]"
    c = combines(e)
    assert (c["S1"], c["S2"], c["S3"]) == (["gather(dim=0)"], ["reduce(sum)"], ["gather(dim=1)"])
    assert e.verified.trials >= 3 and e.verified.shard_counts == (2, 3, 4) and e.verified.uneven


def test_figure3_add():
    e = explore(aten.add.Tensor, [randn(6, 4), randn(6, 4)], ("self", "other"))
    assert str(e.shard) == "[[S1, S2], [S1, S2]]"
    assert combines(e)["S1"] == ["gather(dim=0)"] and combines(e)["S2"] == ["gather(dim=1)"]


def test_figure3_layer_norm_last_dim():
    e = explore(aten.native_layer_norm.default, [randn(6, 8), [8], randn(8), randn(8), 1e-5],
                ("input", "normalized_shape", "weight", "bias", "eps"))
    x_labels = [str(d) for d in e.shard.inputs[0]]
    assert x_labels == ["S1", "N"]  # batch dim gathers; no rule on the normalized dim
    assert combines(e)["S1"] == ["gather(dim=0)"] * 3


def _conv1d(x, w, padding):
    return aten.convolution.default(x, w, None, [1], [padding], [1], False, [0], 1)


@pytest.mark.parametrize("padding,out_halo", [(0, 0), (1, 1)])
def test_appendix_a3_conv1d_halo(padding, out_halo):
    e = explore(_conv1d, [randn(2, 3, 12), randn(4, 3, 3), padding], ("input", "weight", "padding"),
                exact_sizes={"weight": slice(2, None)})
    assert e.signature == f"input:f[*,*,*] weight:f[*,*,3] padding={padding}"
    halo_dims = [(label, d) for d, label in enumerate(e.shard.inputs[0]) if label.halo]
    assert len(halo_dims) == 1 and halo_dims[0][1] == 2 and halo_dims[0][0].halo == 1
    combine = e.combine.as_dict()[halo_dims[0][0].label][0]
    assert combine.first == Gather(2, out_halo)
    # The rule reproduces the global output on new data with 4 uneven shards.
    x, w = randn(2, 3, 23), randn(4, 3, 3)
    bounds = Split(4).bounds(23)
    shards = shard_with_halo(OPS, x, 2, bounds, 1)
    rebuilt = apply_combine(OPS, combine.first, [_conv1d(s, w, padding) for s in shards])
    assert torch.allclose(rebuilt, _conv1d(x, w, padding))


def test_appendix_a3_cat_block():
    # at the call's own sizes, as the paper explores it: three equal inputs, three blocks
    e = explore(aten.cat.default, [[randn(6, 4), randn(6, 4), randn(6, 4)], 0], ("tensors", "dim"), exact_sizes={"tensors": ALL_DIMS})
    assert e.signature == "tensors:[f[6,4],f[6,4],f[6,4]] dim=0"
    assert str(e.shard.inputs[0][0]) == "S1" and all(str(row[0]) == "S1" for row in e.shard.inputs)
    assert combines(e)["S1"] == ["gather(dim=0, block=3)"]


def test_a_block_count_the_signature_does_not_pin_is_dropped():
    # cat's blocks need inputs of equal length, which tensors:[f[*,*],...] does not say
    e = explore(aten.cat.default, [[randn(6, 4), randn(6, 4), randn(6, 4)], 0], ("tensors", "dim"))
    assert e.signature == "tensors:[f[*,*],f[*,*],f[*,*]] dim=0"
    assert all("block" not in c for cs in combines(e).values() for c in cs)
    assert [str(label) for label in e.shard.inputs[0]] == ["N", "S1"]  # the plain cut of dim 1 stays
    # flatten's count is the length of the dims in front of the cut
    flat = explore(aten.flatten.using_ints, [randn(5, 5, 5), 0, 1], ("self", "start_dim", "end_dim"))
    assert combines(flat)["S1"] == ["gather(dim=0)"] and all(
        "block" not in c for cs in combines(flat).values() for c in cs)


def test_a_block_count_an_argument_pins_is_kept():
    # repeat's count is its repeats, whatever the input's length
    e = explore(aten.repeat.default, [randn(4, 6), [1, 3]], ("self", "repeats"))
    assert "gather(dim=1, block=3)" in combines(e)["S2"]


def test_partial_input_mm():
    e = explore(aten.mm.default, [randn(6, 4), randn(4, 5)], ("self", "mat2"))
    first_partial = e.partial.inputs[0]
    assert len(first_partial) == 1
    label = first_partial[0].label
    assert [s for s in e.strategies() if s.label == label][0].inputs == (
        PartialInput("sum"), Replicate())
    assert combines(e)[label] == ["reduce(sum)"]


def test_relu_has_no_partial_rule():
    e = explore(aten.relu.default, [randn(6, 4)], ("self",))
    assert e.partial.is_empty()
    assert combines(e) == {"S1": ["gather(dim=0)"], "S2": ["gather(dim=1)"]}


def test_addmm_bias_partial_on_contraction():
    e = explore(aten.addmm.default, [randn(6, 5), randn(6, 4), randn(4, 5)], ("self", "mat1", "mat2"))
    k_label = e.shard.inputs[1][1].label
    assert k_label and e.shard.inputs[2][0].label == k_label  # contraction dim sharded in both mats
    assert k_label in {p.label for p in e.partial.inputs[0]}  # ... with the bias as a Partial input
    assert combines(e)[k_label] == ["reduce(sum)"]


def test_addmm_plain_search_misses_contraction_rule():
    e = explore_case(OpCase("t", aten.addmm.default, (randn(6, 5), randn(6, 4), randn(4, 5)), {}, ("self", "mat1", "mat2")),
                     OPS, config=ExploreConfig(partial=False))
    assert e.shard.inputs[1][1].label is None


def test_mean_reduce_avg_on_equal_shards():
    e = explore(aten.mean.dim, [randn(6, 12), [1]], ("self", "dim"))
    assert combines(e)[e.shard.inputs[0][1].label] == ["reduce(avg)"]


def test_mean_over_large_positive_dim_is_not_max():
    x = torch.rand(4, 1000, dtype=F64) + 5.0  # all positive, tightly clustered: the reference's trap
    e = explore(aten.mean.dim, [x, [1]], ("self", "dim"))
    options = [str(c) for outs in e.combine.as_dict().values() for o in outs for c in o.options]
    assert "reduce(max)" not in options and "reduce(min)" not in options


def test_amin_is_reduce_min_with_negative_values():
    x = randn(6, 8) - 3.0
    e = explore(aten.amin.default, [x, [1]], ("self", "dim"))
    assert combines(e)[e.shard.inputs[0][1].label] == ["reduce(min)"]


def test_unique_on_binary_ints_is_not_identity():
    x = torch.randint(0, 2, (16,))
    e = explore(lambda t: torch.unique(t), [x], ("self",))
    options = [c for outs in e.combine.as_dict().values() for o in outs for c in o.options]
    assert Identity() not in options


def test_wrong_derived_candidate_is_rejected():
    x = randn(6, 4)
    wrong = ((ShardIn(0),), (OutputCombine((Gather(0),)),))  # transpose moves dim 0 to 1
    right = ((ShardIn(0),), (OutputCombine((Gather(1),)),))
    e = explore(aten.t.default, [x], ("self",), candidates=(wrong, right))
    assert e.status == "derived"
    assert combines(e) == {"S1": ["gather(dim=1)"], "S2": ["reduce(sum)"]}  # S2: Partial passes through
    e = explore(aten.t.default, [x], ("self",), candidates=(wrong,))
    assert e.status == "derived" and combines(e) == {"S1": ["reduce(sum)"]}
    e = explore_case(OpCase("test", aten.t.default, (x,), {}, ("self",), candidates=(wrong,)), OPS,
                     config=ExploreConfig(partial=False))
    assert e.status == "replicate-only"


def test_nondeterministic_op_is_flagged():
    e = explore(lambda t: t + torch.rand(t.shape, dtype=F64), [randn(6, 4)], ("self",))
    assert e.status == "failed" and e.reason.startswith("nondeterministic")


def test_constant_output_gives_no_rule():
    e = explore(lambda t: torch.isnan(t).any(), [randn(6, 4)], ("self",))  # always False on random data
    assert e.status == "replicate-only" and "does not vary" in e.reason


def test_crashing_op_is_a_failed_entry():
    def boom(t):
        raise RuntimeError("kaboom at /home/someone/file.py")
    e = explore(boom, [randn(6, 4)], ("self",))
    assert e.status == "failed" and "kaboom" in e.reason and "/home" not in e.reason


def test_integer_index_inputs_stay_valid_with_fresh():
    x = randn(8, 5)

    def fresh(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(8, 5, generator=g, dtype=F64), 0, torch.randint(0, 8, (6,), generator=g)), {}

    e = explore(aten.index_select.default, [x, 0, torch.randint(0, 8, (6,))], ("self", "dim", "index"), fresh=fresh)
    assert e.status == "ok"
    assert combines(e)[e.shard.inputs[0][1].label] == ["gather(dim=1)"]
    assert combines(e)[e.shard.inputs[1][0].label] == ["gather(dim=0)"]
    assert e.shard.inputs[0][0].label is None  # sharding the indexed dim needs masking: no rule


def test_reduce_kinds_on_bool_and_int():
    e = explore(aten.any.dim, [torch.randn(6, 8) > 0.9, 1], ("self", "dim"))
    assert combines(e)[e.shard.inputs[0][1].label] == ["reduce(max)"]
    e = explore(aten.sum.dim_IntList, [torch.randint(-9, 9, (6, 8)), [1]], ("self", "dim"))
    assert combines(e)[e.shard.inputs[0][1].label] == ["reduce(sum)"]


def test_special_values_make_predicates_vary():
    from metaspmd.backends.torch.sample_data import with_special_values

    e = explore(aten.isnan.default, [randn(6, 4)], ("self",), special=with_special_values)
    assert e.status == "ok"
    assert combines(e)[e.shard.inputs[0][0].label] == ["gather(dim=0)"]
    e = explore(aten.eq.Scalar, [randn(6, 4), 0.5], ("self", "other"), special=with_special_values)
    assert e.status == "ok" and combines(e)[e.shard.inputs[0][1].label] == ["gather(dim=1)"]


def test_special_values_propose_where_blind_data_leaves_one_value():
    # an all-zero sample of integers (its generator repeats it) against 1: ne is all True
    # there and on blind random integers too, which never hold a 1; only special values,
    # which plant the call's scalar, show the row and column cuts
    from metaspmd.backends.torch.sample_data import with_special_values

    zeros = torch.zeros(5, 4, dtype=torch.int64)
    case = OpCase("test", aten.ne.Scalar, (zeros, 1), {}, ("self", "other"),
                  fresh=lambda seed: ((zeros.clone(), 1), {}), special=with_special_values)
    e = explore_case(case, OPS)
    assert e.status == "ok" and sorted(combines(e).values()) == [["gather(dim=0)"], ["gather(dim=1)"]]
    assert e.verified.trials > 6  # the special-value trials verify too
    # they prove nothing where every shard is equal: all zero gives no rule
    e = explore_case(OpCase("test", aten.ne.Scalar, (zeros, 1), {}, ("self", "other"),
                            fresh=lambda seed: ((zeros.clone(), 1), {})), OPS)
    assert e.status == "replicate-only"


def test_special_values_propose_where_blind_data_is_out_of_domain():
    # ndtri's domain is [0, 1]: its integer sample is all zero (-inf throughout), and blind
    # random integers give NaN nearly everywhere; special values (0, 1 and more) show the cut
    from metaspmd.backends.torch.sample_data import with_special_values

    zeros = torch.zeros(20, dtype=torch.int64)
    case = OpCase("test", aten.special_ndtri.default, (zeros,), {}, ("self",),
                  fresh=lambda seed: ((zeros.clone(),), {}), special=with_special_values)
    e = explore_case(case, OPS)
    assert e.status == "ok" and list(combines(e).values()) == [["gather(dim=0)"]]


def test_special_values_are_checked_on_every_split():
    # isin(2, x) of random x is all False; the special values plant 2s, and a column cut is
    # reduce(max): identity holds wherever every shard holds a 2, and fails only on a split
    # that leaves one without. Each special trial used to run on one split, by its position
    # among the trials, and identity passed where none did
    from metaspmd.backends.torch.sample_data import with_special_values

    x = torch.randn(4, 6, dtype=F64, generator=torch.Generator().manual_seed(0))
    e = explore_case(OpCase("test", aten.isin.Scalar_Tensor, (2, x), {}, ("element", "test_elements"),
                            special=with_special_values), OPS)
    assert combines(e) == {"S1": ["reduce(max)"], "S2": ["reduce(max)"]}


def test_positive_samples_are_checked_on_signed_data_too():
    # max_unpool2d scatters each shard's values into zeros; where the windows overlap two
    # shards write one position. On positive values a max of the local outputs rebuilds it,
    # on signed ones the zeros win: blind signed data refutes reduce(max)
    indices = torch.tensor([[[[7, 16, 17]], [[8, 8, 5]]]])

    def positive(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.rand(1, 2, 1, 3, generator=g, dtype=F64) + 1, indices.clone(), [3, 6]), {}

    case = OpCase("test", aten.max_unpool2d.default, positive(0)[0], {}, ("self", "indices", "output_size"),
                  fresh=positive, fixed=frozenset({"indices"}))
    e = explore_case(case, OPS)
    assert "reduce(max)" not in str(e.combine) and "S1: gather(dim=1)" in str(e.combine)


def test_overflow_on_one_code_path_is_not_a_mismatch():
    # AVX2 lanes and the scalar tail overflow sinh(89) in float32 apart: where a shard
    # boundary falls decides which; a value within a factor 2 of the largest is its infinity
    big = torch.finfo(torch.float32).max
    assert OPS.close(torch.tensor([1.0, float("inf")]), torch.tensor([1.0, 0.7 * big]))
    assert OPS.close(torch.tensor([-0.7 * big]), torch.tensor([-float("inf")]))
    assert not OPS.close(torch.tensor([float("inf")]), torch.tensor([-0.7 * big]))  # the sign counts
    assert not OPS.close(torch.tensor([float("inf")]), torch.tensor([0.3 * big]))  # far from overflow
    assert not OPS.close(torch.tensor([float("inf")], dtype=F64), torch.tensor([0.7 * big], dtype=F64))
    # and sinh of integers keeps its cuts under either kernel
    e = explore(aten.sinh.default, [torch.arange(80, 100).repeat(3, 1)], ("self",))
    assert e.status == "ok" and sorted(combines(e).values()) == [["gather(dim=0)"], ["gather(dim=1)"]]


def test_special_values_find_any_reduce_max():
    from metaspmd.backends.torch.sample_data import with_special_values

    e = explore(aten.any.default, [randn(6, 4)], ("self",), special=with_special_values)
    assert e.status == "ok" and combines(e)[e.shard.inputs[0][0].label] == ["reduce(max)"]


def test_factory_op_without_tensor_input_is_replicated():
    e = explore(aten.full.default, [[4, 3], 2.0], ("size", "fill_value"), kwargs={"dtype": F64})
    assert e.status == "derived" and "no tensor input" in e.reason


def test_special_values_refute_identity_for_all():
    from metaspmd.backends.torch.sample_data import with_special_values

    e = explore(aten.all.default, [randn(6, 4)], ("self",), special=with_special_values)
    assert e.status == "ok" and combines(e)[e.shard.inputs[0][0].label] == ["reduce(min)"]


def test_any_on_nonzero_data_is_not_shape_determined():
    from metaspmd.backends.torch.sample_data import with_special_values

    e = explore(aten.any.default, [randn(3, 5)], ("self",), special=with_special_values)
    assert not any("shape-determined" in n for n in e.notes)
    assert "identity" not in {str(o) for outs in combines(e).values() for o in outs}


def test_full_like_is_shape_determined():
    from metaspmd.backends.torch.sample_data import with_special_values

    e = explore(aten.full_like.default, [randn(6, 4), 2.5], ("self", "fill_value"), special=with_special_values)
    assert e.status == "ok" and any("shape-determined" in n for n in e.notes)
    assert combines(e)[e.shard.inputs[0][0].label] == ["gather(dim=0)"]


def test_integer_only_inputs_are_refilled_although_index_like():
    """bitwise_and on bools: every input is 'index-like' (bool), so keeping them all fixed
    would leave the output constant; they are the data and get refilled."""
    a, b = torch.rand(10, 6) < 0.5, torch.rand(10, 6) < 0.5
    e = explore(torch.ops.aten.bitwise_and.Tensor, [a, b], ("self", "other"), fixed=frozenset({"self", "other"}))
    assert e.status == "ok"
    assert {"gather(dim=0)", "gather(dim=1)"} <= {o for outs in combines(e).values() for o in outs}


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int64, torch.float32, torch.complex64])
def test_special_values_fill_every_dtype(dtype):
    from metaspmd.backends.torch.sample_data import PATTERNS, with_special_values
    x = torch.zeros(4, 5, dtype=dtype)
    for k in range(1, len(PATTERNS) + 1):
        (y,), _ = with_special_values((x,), {}, k, seed=k)
        assert y.dtype == dtype and y.shape == x.shape


def test_twin_special_values_differ_from_the_first_tensor_of_their_shape_in_one_element():
    from metaspmd.backends.torch.sample_data import PATTERNS, with_special_values

    x, y, z = torch.zeros(4, 5), torch.zeros(4, 5), torch.zeros(3)
    (a, b, c), _ = with_special_values((x, y, z), {}, PATTERNS.index("twin") + 1, seed=3)
    assert (a != 0).all() and int((a != b).sum()) == 1 and c.shape == (3,)


def test_partial_summands_cross_thresholds_the_data_never_reaches():
    """threshold_backward(grad, self, 5): self ~ N(0, 1) never exceeds 5, so the special
    values (5 and its neighbours) are what make the output vary; summands of unit spread
    still never cross 5, wide ones do and refute Partial(sum) on self."""
    from metaspmd.backends.torch.sample_data import with_special_values

    e = explore(lambda g, s: torch.ops.aten.threshold_backward(g, s, 5.0), [randn(8, 6), randn(8, 6)],
                ("grad_output", "self"), special=with_special_values)
    assert e.status == "ok"
    assert not e.partial.inputs[1], e.partial


def test_blind_trials_refute_rules_that_hold_on_a_narrow_sample_range():
    """min of integers drawn from [-9, 9]: every shard of 25+ elements likely holds -9, so
    identity passes on the sample's own inputs; blind trials in [-100, 100) refute it."""
    def fresh(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(-9, 10, (5, 5, 5), generator=g),), {}

    (x,), _ = fresh(0)
    e = explore(torch.ops.aten.min.default, [x], ("self",), fresh=fresh)
    assert e.status == "ok"
    assert all(c == ["reduce(min)"] for c in combines(e).values()), combines(e)


def test_all_nan_outputs_prove_nothing():
    """mean(log(x)) on signed data is NaN (or -inf) on every trial, special values included:
    every reduce 'rebuilds' a NaN, so no rule may come of it."""
    from metaspmd.backends.torch.sample_data import with_special_values

    e = explore(lambda t: torch.log(t).mean(), [randn(8, 6)], ("self",), special=with_special_values)
    assert e.status == "replicate-only", (e.status, combines(e))


def test_mean_over_an_odd_dim_is_checked_on_equal_shards():
    """mean of 5 rows is the avg of per-shard means only for equal shards, which no cut in
    2, 3 or 4 gives: exploring and verifying cut the rows into 5. var is no avg of shards."""
    e = explore(aten.mse_loss.default, [randn(5, 3), randn(5, 3)], ("self", "target"))
    assert e.status == "ok" and 5 in e.verified.shard_counts
    assert {c for outs in combines(e).values() for c in outs} == {"reduce(avg)"}
    assert explore(aten.var.correction, [randn(5, 3)], ("self",)).status == "replicate-only"


def test_integer_partial_inputs_where_every_output_is_an_integer():
    def ints(*shape):
        return torch.randint(-50, 50, shape)

    e = explore(aten.mm.default, [ints(4, 6), ints(6, 5)], ("self", "mat2"))
    assert str(e.partial) == "[[S4(sum)], [S5(sum)]]"  # integer matmul is exactly linear
    for fn, args in ((aten.bitwise_and.Tensor, [ints(4, 6), ints(4, 6)]), (aten.remainder.Scalar, [ints(4, 6), 3])):
        assert explore(fn, args, ("self", "other")).partial.is_empty()  # exact sums refute them
    # true division of ints gives floats: parts that wrap around would not sum as floats,
    # so no integer Partial is tried there
    assert explore(aten.div.Tensor, [ints(4, 6), ints(4, 6) + 100], ("self", "other")).partial.is_empty()


def test_an_integer_input_no_output_reads_may_be_partial_beside_float_outputs():
    from metaspmd.backends.torch.sample_data import with_special_values

    # expand_as reads other's shape only: no sum of its parts can show, wrap-around included
    e = explore(aten.expand_as.default, [randn(4, 1), torch.randint(-50, 50, (4, 6))], ("self", "other"),
                special=with_special_values)
    rules = {s.inputs: [str(o.first) for o in s.outputs] for s in e.strategies()}
    assert rules[Replicate(), PartialInput()] == ["identity"]
    assert rules[PartialInput(), PartialInput()] == ["reduce(sum)"]
    # mul reads it: no integer Partial beside a float output
    e = explore(aten.mul.Tensor, [randn(4, 6), torch.randint(-50, 50, (4, 6))], ("self", "other"),
                special=with_special_values)
    assert e.strategies() and not any(s.inputs[1] == PartialInput() for s in e.strategies())


def test_a_degenerate_example_lets_a_later_trial_propose():
    # all False: every shard of the example is equal, so the example proves nothing and
    # proposes nothing; a blind bool trial whose shards differ proposes, the others verify
    e = explore(aten.asin.default, [torch.zeros(8, 6, dtype=torch.bool)], ("self",))
    assert e.status == "ok" and combines(e) == {"S1": ["gather(dim=0)"], "S2": ["gather(dim=1)"]}


def test_one_sided_halos_padding_and_windows():
    # every shard is padded on both sides: the (1, 2) padding is dropped inside, kept outside
    e = explore(aten.constant_pad_nd.default, [randn(4, 9), [1, 2]], ("self", "pad"))
    assert combines(e)["S2"] == ["gather(dim=1, halo=(1, 2))"]
    # a window of 2 reads one element past its shard: with an input halo of 1, neighbours
    # compute one output twice, which one side drops
    e = explore(aten.max_pool1d.default, [randn(2, 3, 9), [2], [1]], ("self", "kernel_size", "stride"))
    assert str(e.shard) == "[[S1, S2, S3(halo=1)]]"
    assert combines(e)["S3"] == ["gather(dim=2, halo=(0, 1)) | gather(dim=2, halo=(1, 0))"]


def test_transposed_conv_overlaps_its_neighbours():
    # each input element spreads over a kernel's width of outputs: a shard's outputs run
    # kernel - 1 past the next shard's start, and the shared ones add up
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups")
    x, w = randn(2, 3, 10), randn(3, 2, 3)
    kernel = {"weight": slice(2, None)}
    e = explore(aten.convolution.default, [x, w, None, [1], [0], [1], True, [0], 1], names, exact_sizes=kernel)
    label = e.shard.inputs[0][2].label
    assert combines(e)[label] == ["gather(dim=2, overlap=2)"]
    # a bias would be added twice where they overlap: the length is cut with an input halo
    # then, and the outputs it computes twice are dropped
    e = explore(aten.convolution.default, [x, w, randn(2), [1], [0], [1], True, [0], 1], names, exact_sizes=kernel)
    label = e.shard.inputs[0][2]
    assert label.halo == 1 and combines(e)[label.label] == ["gather(dim=2, halo=2)"]


def test_a_halo_the_signature_does_not_pin_is_dropped():
    """A convolution's halo is its kernel's extent: keyed as weight:f[*,*,*], the rule read
    off a kernel of 3 would be given to a kernel of 5, where it is false. Unpinned, the
    halos and overlaps go (the cut of the batch and of the channels stays); pinned, the
    key names the kernel and the halo stays."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups")
    for transposed, combine in ((False, "gather(dim=2, halo=1)"), (True, "gather(dim=2, overlap=2)")):
        w = randn(3, 2, 3) if transposed else randn(2, 3, 3)
        args = [randn(2, 3, 10), w, None, [1], [1 - transposed], [1], transposed, [0], 1]
        free = explore(aten.convolution.default, args, names)
        assert free.signature.startswith("input:f[*,*,*] weight:f[*,*,*] ")
        assert not any(label.halo for label in free.shard.inputs[0])
        assert all(c.halo == 0 and not c.overlap for _, outs in free.combine.by_label for o in outs for c in o.options
                   if isinstance(c, Gather))
        assert str(free.shard.inputs[0][0]) == "S1"  # the batch still cuts
        pinned = explore(aten.convolution.default, args, names, exact_sizes={"weight": slice(2, None)})
        assert pinned.signature.startswith("input:f[*,*,*] weight:f[*,*,3] ")
        assert combine in [str(o) for _, outs in pinned.combine.by_label for o in outs]


def test_an_integer_convolution_keeps_its_halo_and_its_channel_cut():
    """An integer weight is data, not an index: kept fixed like one, it was never
    lengthened by the check that a halo holds at other lengths (the halo went), nor refilled
    (the channel cut, a sum over a weight that never changed, went too)."""
    from metaspmd.backends.torch.backend import torch_case

    g = torch.Generator().manual_seed(0)
    x, w = torch.randint(-5, 5, (2, 3, 10), generator=g), torch.randint(-5, 5, (2, 3, 3), generator=g)
    op = aten.convolution.default
    case = torch_case(op, (x, w, None, [1], [1], [1], False, [0], 1), {}, op)
    assert not case.fixed
    e = explore_case(case, OPS)
    assert e.signature.startswith("input:i[*,*,*] weight:i[*,*,3] ")  # the kernel's extent pins the halo
    length, channels = e.shard.inputs[0][2], e.shard.inputs[0][1]
    assert length.halo == 1 and combines(e)[length.label] == ["gather(dim=2, halo=1)"]
    assert e.shard.inputs[1][1].label == channels.label and combines(e)[channels.label] == ["reduce(sum)"]


def test_pooling_backward_cuts_its_input_in_proportion():
    # windows of 2 at stride 2: self's rows are cut at twice grad_output's boundaries (the
    # kernel trusts the two shapes to agree: the backend's guard refuses shards that do not)
    from metaspmd.backends.torch.backend import consistent_shards_only

    def pool_backward(*args):
        return explore(consistent_shards_only(aten.avg_pool2d_backward.default, args, {}), args, names)

    names = ("grad_output", "self", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
    e = pool_backward(randn(2, 3, 4, 5), randn(2, 3, 8, 10), [2, 2], [2, 2], [0, 0], False, True, None)
    rows = e.shard.inputs[1][2]
    assert (rows.scale, rows.extend) == (2, 0) and e.shard.inputs[0][2].label == rows.label
    assert combines(e)[rows.label] == ["gather(dim=2)"]
    # stride 1: neighbouring windows share a row, whose gradient both shards add to
    e = pool_backward(randn(2, 3, 6, 5), randn(2, 3, 7, 5), [2, 1], [1, 1], [0, 0], False, True, None)
    rows = e.shard.inputs[1][2]
    assert (rows.scale, rows.extend) == (1, 1) and combines(e)[rows.label] == ["gather(dim=2, overlap=1)"]


def test_an_overlap_read_off_unpinned_sizes_is_dropped():
    """Adaptive pooling's windows follow the ratio of its input and output lengths: from 8
    columns to 7 neighbouring windows share a column, from 9 to 7 not all do. Keyed without
    the lengths, the example's overlap is no rule; keyed by them, it is."""
    from metaspmd.backends.torch.backend import consistent_shards_only

    args = (randn(2, 3, 8, 7), randn(2, 3, 8, 8))
    op = consistent_shards_only(aten._adaptive_avg_pool2d_backward.default, args, {})
    names = ("grad_output", "self")

    def overlaps(entry):
        return [str(o) for _, outs in entry.combine.by_label for o in outs if "overlap" in str(o)]

    # the kernel sizes grad_output by self unchecked, as the sweep's case says (trusts_shapes)
    free = explore(op, args, names, trusts_shapes=True)
    assert not overlaps(free) and combines(free)[free.shard.inputs[0][0].label] == ["gather(dim=0)"]
    pinned = explore(op, args, names, exact_sizes={"grad_output": ALL_DIMS, "self": ALL_DIMS}, trusts_shapes=True)
    assert overlaps(pinned) == ["gather(dim=3, overlap=1)"]


def test_a_scatter_multiply_takes_its_self_as_partial_prod():
    # index and src cut along the scattered dim: each shard multiplies its own src into self,
    # which must count once in the product (Partial(prod)); no Partial(sum) self holds there
    index = torch.randint(0, 5, (6, 4))
    e = explore(aten.scatter.reduce, [randn(5, 4), 0, index, randn(6, 4)], ("self", "dim", "index", "src"),
                kwargs={"reduce": "multiply"}, fixed=frozenset({"index"}))
    label = e.shard.inputs[1][0].label
    assert label and e.shard.inputs[2][0].label == label
    assert [str(p) for p in e.partial.inputs[0] if p.label == label] == [f"{label}(prod)"]
    assert combines(e)[label] == ["reduce(prod)"]


def test_an_expanded_sample_lets_blind_data_propose_its_flat_dim():
    # the generator's self is the same along dim 1 (expanded from a column) on every trial:
    # its halves there are equal, so no trial proposes a cut; blind data joins in and does
    def fresh(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(4, 1, generator=g, dtype=F64).expand(4, 6).clone(), torch.randn(4, 6, dtype=F64)), {}

    args, _ = fresh(0)
    e = explore(aten.mul.Tensor, list(args), ("self", "other"), fresh=fresh)
    assert combines(e)[e.shard.inputs[0][1].label] == ["gather(dim=1)"]


def test_blind_data_that_leaves_every_output_one_value_proves_nothing():
    # the generator's self repeats its row (its shards along dim 0 alike: those trials tell
    # nothing there) and its small integers tie, so eq varies; blind random floats never
    # tie, so eq is all False on the whole and on every shard, where any cut "holds"
    def fresh(seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randint(0, 3, (1, 6), generator=g).to(F64).expand(4, 6).clone()
        return (x, torch.randint(0, 3, (4, 1), generator=g).to(F64)), {}

    args, _ = fresh(0)
    e = explore(aten.eq.Tensor, list(args), ("self", "other"), fresh=fresh)
    assert [str(s) for s in e.strategies()] == ["S1: (S(1), R) -> (gather(dim=1))"]  # dim 1 varies on the generator's data


def test_an_input_read_only_where_another_is_zero_is_read():
    from metaspmd.backends.torch.sample_data import with_special_values

    # heaviside reads values only where self is 0, which random data never is: the special
    # values (all zero) show it, so values never turns Partial beside a cut of self
    e = explore(aten.heaviside.default, [randn(4, 3), randn(3)], ("self", "values"), special=with_special_values)
    assert e.status == "ok"
    assert not any(s.inputs[0] != Replicate() and s.inputs[1] == PartialInput() for s in e.strategies())


def test_shards_of_data_the_same_along_the_cut_prove_nothing():
    # flip along a dim whose rows are all equal: an uneven split gives shards that differ in
    # length only, on which a plain gather passed for the flip (unsound on any other data)
    from metaspmd.explorer.common import Context
    from metaspmd.explorer.core import Explorer
    from metaspmd.explorer.trials import Trials

    def rows(k):
        return torch.randn(1, 3, dtype=F64, generator=torch.Generator().manual_seed(k)).expand(5, 3).clone()

    context = Context.of(OpCase("test", aten.flip.default, (rows(0), [0]), {}, ("self", "dims")), OPS)
    e = Explorer(context, [Trials(context)._trial((rows(k), [0]), {}, index=k) for k in range(4)])
    assert e._verify(Group(((0, 0, 0),)), [[Gather(0)]]) is None


def test_two_bools_draw_more_trials_until_two_differ():
    # a pair of random bools is equal on most draws: the verification saw one trial with
    # distinct halves and refused mul's row cut until reserve trials found a second
    x = torch.tensor([[True, False], [False, True]])
    e = explore(aten.mul.Tensor, [x, x.clone()], ("self", "other"))
    assert sorted(combines(e).values()) == [["gather(dim=0)"], ["gather(dim=1)"]]
    assert e.verified.trials > 6


def test_a_halo_that_reaches_both_ends_proves_nothing():
    # with a halo of 2 on a dim of 6, some of four shards see the whole tensor: argmax of the
    # flattened input passed as reduce(max) of the local ones until such trials stopped counting
    x = randn(6, 6)
    assert explore(aten.argmax.default, [x], ("self",)).status == "replicate-only"
    assert explore(aten.median.default, [randn(4, 5)], ("self",)).status == "replicate-only"


def test_two_one_element_shards_prove_no_max_or_min():
    # the median (the lower middle) of a pair is its min: on two elements, cut in two, it
    # passed as reduce(min); min itself is then unproven too, until a longer dim shows it
    assert explore(aten.median.default, [randn(2)], ("self",)).status == "replicate-only"
    assert combines(explore(aten.min.default, [randn(2, 3)], ("self",))) == {"S1": ["reduce(min)"], "S2": ["reduce(min)"]}


def test_halo_gathers_need_three_shards():
    # lerp's weight cut along a dim of 2 and broadcast against the whole inputs: each shard
    # computes both columns, and halo=1 keeps the right one of each; no rule on 2 shards alone
    e = explore(aten.lerp.Tensor, [randn(1, 2), randn(1, 2), randn(1, 2)], ("self", "end", "weight"))
    assert all(not (isinstance(c, Gather) and (c.halo or c.halo_end))
               for s in e.strategies() for o in s.outputs for c in o.options)


def _pool(x):
    return aten.max_pool1d.default(x, [2], [1])


def test_a_dim_too_short_for_three_shards_is_widened_where_the_op_allows():
    # a window of 2 along a dim of 4: three shards of 4 leave the first one nothing no halo
    # reaches, so the halo is tried on that dim lengthened to 6 by random data, and said so
    x = randn(2, 3, 4)
    assert not any(d.halo for d in explore(_pool, [x], ("self",)).shard.inputs[0])
    e = explore(_pool, [x], ("self",), widen=True)
    assert str(e.shard) == "[[S1, S2, S3(halo=1)]]"
    assert combines(e)["S3"][0].startswith("gather(dim=2, halo=(0, 1))")
    assert e.verified.shard_counts == (2, 3, 4)
    assert e.notes == ("halo=1 on self dim 2: verified with that dim lengthened from 4 to 6 by random data",)
    # an integer input beside the group may index the dim: no widening then
    e = explore(lambda x, k: _pool(x) * k, [x, torch.tensor([2])], ("self", "k"), widen=True)
    assert not any(d.halo for d in e.shard.inputs[0]) and not e.notes


def _flat_rows(seed: int):
    """x and y the same along dim 1 in every draw (a row's max broadcast over it), equal in
    some rows: blind random data would make eq all False, which shows nothing either."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 1, generator=g).expand(4, 5).contiguous()
    y = x.clone()
    y[seed % 2::2] += 1
    return (x, y), {}


def test_a_plain_cut_the_samples_cannot_show_goes_first_on_lengthened_data():
    """Every draw of x and y is flat along dim 1, so no trial at the sample's size shows the
    plain cut there: it was skipped and a halo cut found on the lengthened trials instead (an
    elementwise eq with halo=1). The plain cut goes first on those trials now."""
    (x, y), _ = _flat_rows(0)
    e = explore(aten.eq.Tensor, [x, y], ("self", "other"), fresh=_flat_rows, widen=True)
    assert str(e.shard) == "[[S1, S2], [S1, S2]]", str(e.shard)
    assert "plain cut of self dim 1: verified with that dim lengthened from 5 to 6 by random data" in e.notes


def test_inputs_cut_together_share_a_halo():
    # both factors of a product feed one window: each needs the same halo
    e = explore(lambda x, y: _pool(x * y), [randn(2, 3, 9), randn(2, 3, 9)], ("self", "other"))
    assert str(e.shard) == "[[S1, S2, S3(halo=1)], [S1, S2, S3(halo=1)]]"
    assert combines(e)["S3"] == ["gather(dim=2, halo=(0, 1)) | gather(dim=2, halo=(1, 0))"]


def _lookup(weight, indices):
    # an embedding that gives zero rows for positions outside the table (jax's FILL_OR_DROP)
    valid = (indices >= 0) & (indices < weight.shape[0])
    return weight[indices.clamp(0, weight.shape[0] - 1)] * valid.unsqueeze(-1)


def _lookup_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(9, 4, dtype=F64, generator=g), torch.randint(0, 9, (5,), generator=g)), {}


def test_positions_offset_by_the_shard_start_give_a_vocab_parallel_lookup():
    # the table cut along its rows: each shard looks up positions less its first row, the
    # others fall outside and give zeros, so the outputs sum (DTensor's _MaskPartial)
    args, _ = _lookup_inputs(0)
    e = explore(_lookup, args, ("weight", "indices"), fresh=lambda seed: _lookup_inputs(seed + 1), bounds_checked=True)
    assert str(e.shard) == "[[S1, S2], [S3]]" and str(e.offset) == "[[], [S1]]"
    assert combines(e)["S1"] == ["reduce(sum)"]
    # only where the op says positions out of range are safe (torch kernels may read past)
    assert explore(_lookup, args, ("weight", "indices"), fresh=lambda seed: _lookup_inputs(seed + 1)).offset is None
    # aten.embedding rejects positions outside the table: no rule for its rows
    e = explore(aten.embedding.default, args, ("weight", "indices"), fresh=lambda seed: _lookup_inputs(seed + 1),
                bounds_checked=True)
    assert e.offset is None and str(e.shard) == "[[N, S1], [S2]]"


def test_a_shard_with_an_empty_output_still_gathers():
    # a boolean mask cut with the rows it selects: a shard may select nothing
    mask = torch.tensor([True, True, False, False, False, False])
    e = explore(aten.index.Tensor, [randn(6, 4), [mask]], ("self", "indices"))
    assert str(e.shard) == "[[S1, S2], [S1]]" and combines(e)["S1"] == ["gather(dim=0)"]


def test_an_empty_input_cut_beside_a_full_one_still_counts():
    """addmm with mat1 [4, 0] @ mat2 [0, 6]: the product is zero, and cutting self with the
    empty mat2 along dim 1 gathers; mat2's shards are empty, self's differ. An output made of
    empty inputs alone would prove nothing."""
    e = explore(aten.addmm.default, [randn(4, 6), randn(4, 0), randn(0, 6)], ("self", "mat1", "mat2"))
    rules = {s.inputs: [str(o.first) for o in s.outputs] for s in e.strategies()}
    assert rules[(ShardIn(1), Replicate(), ShardIn(1))] == ["gather(dim=1)"]
    e = explore(aten.neg.default, [randn(0, 6)], ("self",))
    assert not any(isinstance(p, ShardIn) for s in e.strategies() for p in s.inputs)


def test_norms_reduce_by_norm2():
    """The 2-norm over a cut dim is the 2-norm of the shards' norms (DTensor's
    _NormPartial(2)); a sum of squares is not, nor is the 1-norm (a plain sum)."""
    e = explore(aten.linalg_vector_norm.default, [randn(6, 4)], ("self",))
    assert all(c == ["reduce(norm2)"] for c in combines(e).values()), combines(e)
    e = explore(aten.cdist.default, [randn(4, 6), randn(5, 6)], ("x1", "x2"))
    assert str(e.shard) == "[[S1, S2], [S3, S2]]" and combines(e)["S2"] == ["reduce(norm2)"]
    e = explore(lambda t: (t * t).sum(), [randn(6, 4)], ("self",))
    assert all(c == ["reduce(sum)"] for c in combines(e).values()), combines(e)
    e = explore(aten.linalg_vector_norm.default, [randn(6, 4), 1], ("self", "ord"))
    assert all(c == ["reduce(sum)"] for c in combines(e).values()), combines(e)


def test_a_partial_input_must_hold_where_its_parts_cancel():
    """Random parts never cancel: unique_consecutive of distinct values passes as linear,
    and xlogy(x, y) as linear in x, until x is zero (a single 0; xlogy(0, y) = 0 even where
    log(y) is NaN). Parts r and -r of a zero input show it; linear ops still pass."""
    e = explore(aten.unique_consecutive.default, [randn(4, 6)], ("self",))
    assert e.partial.inputs == ((),), e.partial
    e = explore(aten.special_xlogy.default, [randn(4, 6), randn(4, 6)], ("self", "other"))
    assert not any(isinstance(p, PartialInput) for s in e.strategies() for p in s.inputs)
    e = explore(aten.mm.default, [randn(6, 4), randn(4, 5)], ("self", "mat2"))
    assert str(e.partial) == "[[S4(sum)], [S5(sum)]]"


@pytest.mark.parametrize("fn,combine", [
    (aten.cumsum.default, "scan(dim=1, op=sum)"),
    (aten.cumprod.default, "scan(dim=1, op=prod)"),
    (aten.logcumsumexp.default, "scan(dim=1, op=logsumexp)"),
    (lambda x, dim: aten.cumsum.default(x.flip(dim), dim).flip(dim), "scan(dim=1, op=sum, reverse=true)"),
    (lambda x, dim: aten.cummax.default(x, dim)[0], "scan(dim=1, op=max)"),
    (lambda x, dim: aten.flip.default(x, [dim]), "gather(dim=1, reverse=true)"),
])
def test_a_cut_scan_dim_carries_across_shards(fn, combine):
    """cumsum over a cut dim is each shard's cumsum plus the totals of the shards before
    it; flip's shards come back in reverse order."""
    e = explore(fn, [randn(4, 7), 1], ("self", "dim"))
    assert str(e.shard) == "[[S1, S2]]"
    assert combines(e)["S1"] == ["gather(dim=0)"] and combines(e)["S2"] == [combine], combines(e)


def test_order_combines_only_where_no_plain_gather_holds():
    """A scan or reversed gather beside the plain gather of its dim says only that the data
    does not vary along it (zeros_like: every combine of its shape holds)."""
    e = explore(aten.cumsum.default, [torch.randint(0, 2, (6, 5)).bool(), 0], ("self", "dim"))
    assert combines(e)["S1"] == ["scan(dim=0, op=sum)"]
    e = explore(lambda x: x.abs().cumsum(0) * 0, [randn(6, 5)], ("self",))
    assert all("scan" not in c and "reverse" not in c for cs in combines(e).values() for c in cs), combines(e)
    # cummax's indices output has no combine: no rule cuts the scanned dim
    e = explore(aten.cummax.default, [randn(6, 5), 0], ("self", "dim"))
    assert [str(d) for d in e.shard.inputs[0]] == ["N", "S1"]


@pytest.fixture(scope="module")
def torch_backend():
    """One backend for the module: each new one reads the whole sample index again."""
    from metaspmd.backends.torch import get_backend

    return get_backend()


def test_a_generator_that_ignores_its_seed_gets_blind_trials(torch_backend):
    """OpInfo's bool sample for mul_ is one 2x2 pair whatever the seed: its trials repeat
    the example, whose row shards are equal, and the two blind trials happen to be no
    better. Trials that repeat the example are drawn blind instead."""
    from metaspmd.signature import signature

    case = next(c for c in torch_backend.cases("aten.mul_.Tensor")
                if signature(OPS, c.arg_names, c.args, c.kwargs) == "self:b[*,*] other:b[*,*]")
    e = explore_case(case, OPS)
    assert e.status == "ok", (e.status, e.reason)


def test_non_finite_outputs_of_mixed_kinds_still_compare():
    """logit of bools is -inf or +inf everywhere: no finite value, but a pattern that a
    wrong gather breaks. Only outputs of one non-finite value throughout prove nothing."""
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0)) > 0
    e = explore(aten.logit.default, [x], ("self",))
    assert e.status == "ok" and combines(e) == {"S1": ["gather(dim=0)"], "S2": ["gather(dim=1)"]}, combines(e)
    assert OPS.one_nonfinite_value(torch.full((3,), float("nan")))
    assert not OPS.one_nonfinite_value(torch.tensor([float("inf"), float("-inf")]))


def test_fills_pass_a_partial_input_as_replicated(torch_backend):
    """randn_like reads only its input's shape: a Partial input is as good as a replicated
    one, and the output is replicated (ranks draw it alike). An in-place fill keeps self's
    placement, so uniform_ of a Partial self gets no rule."""
    e = explore_case(torch_backend.cases("aten.randn_like.default")[0], OPS)
    assert any(str(c) == "identity" for label, outs in e.combine.by_label if label in {p.label for p in e.partial.inputs[0]}
               for c in outs), (e.partial, e.combine)
    assert explore_case(torch_backend.cases("aten.uniform_.default")[0], OPS).partial.is_empty()


@pytest.mark.slow  # a whole exploration of the op, verification included: 9 s
def test_integer_operands_named_other_than_self_are_data(torch_backend):
    """addmv's mat is an operand, not an index: on integers it is refilled and tried
    Partial like self, so self and mat Partial together give a Partial output."""
    from metaspmd.signature import signature

    case = next(c for c in torch_backend.cases("aten.addmv.default")
                if signature(OPS, c.arg_names, c.args, c.kwargs).startswith("self:i[*] mat:i"))
    assert "mat" not in case.fixed
    e = explore_case(case, OPS)
    rules = {s.inputs: [str(c) for c in s.outputs[0].options] for s in e.all_strategies()}
    assert rules[(PartialInput("sum"), PartialInput("sum"), Replicate())] == ["reduce(sum)"], rules


def test_an_input_random_data_never_reads_is_checked_on_special_values():
    """heaviside(self, values) reads values only where self is 0, which random floats never
    are: Partial values leave the output whole on every random trial. Special values
    (zeros among them) refute that."""
    from metaspmd.backends.torch.sample_data import with_special_values

    e = explore(aten.heaviside.default, [randn(6, 4), randn(6, 4)], ("self", "values"), special=with_special_values)
    rules = {s.inputs: [str(c) for c in s.outputs[0].options] for s in e.all_strategies()}
    assert (Replicate(), PartialInput("sum")) not in rules, rules
    assert rules[(ShardIn(0), ShardIn(0))] == ["gather(dim=0)"]


def test_positions_of_a_cut_reduced_dim_take_the_winning_shard():
    # max.dim's values reduce by max; its indices by argreduce: the local position plus the
    # shard's start, from the shard whose value wins (the first on ties: integers repeat)
    for x in (randn(5, 6), torch.randint(-2, 3, (5, 6))):
        c = combines(explore(aten.max.dim, [x, 1], ("self", "dim")))
        assert ["reduce(max)", "argreduce(max, input=0)"] in c.values(), c
    c = combines(explore(aten.argmin.default, [randn(4, 6), 1], ("self", "dim")))
    assert ["argreduce(min, input=0)"] in c.values(), c


def test_order_picks_fail_where_values_repeat():
    # the mode of distinct floats is their min, at argmin's position: rounded data repeats
    # values and shows the mode is neither
    e = explore(aten.mode.default, [randn(4, 6)], ("self",))
    assert all(d == "N" for d in str(e.shard).strip("[]").split(", ")[-1:]), e.shard
    # on a dim of two, the lower median's position is argmin's: two shards prove nothing
    e = explore(aten.median.dim, [randn(4, 2), 1], ("self", "dim"))
    assert not any(isinstance(c, ArgReduce) for s in e.strategies() for o in s.outputs for c in o.options)


def test_xor_folds_where_no_sum_or_max_does():
    def xor_rows(x):
        out = x[0]
        for row in x[1:]:
            out = out ^ row
        return out

    c = combines(explore(xor_rows, [torch.randint(0, 64, (6, 3))], ("self",)))
    assert c == {"S1": ["reduce(xor)"], "S2": ["gather(dim=0)"]}
    # zeros: identity says it, xor is not listed beside it
    c = combines(explore(lambda x: torch.zeros_like(x), [torch.randint(0, 64, (6, 3))], ("self",)))
    assert all("reduce(xor)" not in " ".join(v) for v in c.values()), c


def _lower_median(x):
    return torch.sort(x, dim=1).values[:, (x.shape[1] - 1) // 2]


def test_order_picks_on_a_dim_of_two_need_a_longer_one():
    # along a dim of two, the lower median is the min: two shards cannot tell them apart, so
    # the dim is lengthened to three by random data, where the median is neither
    e = explore(_lower_median, [randn(4, 2)], ("self",))
    assert all(c not in (Reduce("min"), Reduce("max")) for s in e.strategies() for o in s.outputs for c in o.options)
    # amax keeps reduce(max) there, and says how it was proven
    e = explore(aten.amax.default, [randn(4, 2), [1]], ("self", "dim"))
    assert ["reduce(max)"] in combines(e).values()
    assert "reduce(max) along self dim 1: verified on three shards too, with that dim lengthened from 2 to 3 by random data" in e.notes


def test_a_reduce_of_two_one_element_shards_needs_a_longer_dim():
    # the mean of a pair is its median: quantile(q=0.5) of two elements passed reduce(avg)
    # on their two shards, for a signature of any length
    e = explore(aten.quantile.scalar, [randn(2), 0.5], ("self", "q"))
    assert e.status == "replicate-only"
    e = explore(aten.mean.default, [randn(2)], ("self",))
    assert combines(e)[e.shard.inputs[0][0].label] == ["reduce(avg)"]
    assert "reduce(avg) along self dim 0: verified on three shards too, with that dim lengthened from 2 to 3 by random data" in e.notes


def test_a_contraction_of_two_integers_is_lengthened_too():
    # integer inputs beside the cut ones are data, not indices, where every input is one
    a, b, c = (torch.randint(-9, 9, s) for s in ((2, 3), (2, 2), (2, 3)))
    e = explore(aten.addmm.default, [a, b, c], ("self", "mat1", "mat2"))
    k = e.shard.inputs[1][1].label
    assert k is not None and e.shard.inputs[2][0].label == k and combines(e)[k] == ["reduce(sum)"]
    assert "reduce(sum) along mat1 dim 1: verified on three shards too, with that dim lengthened from 2 to 3 by random data" in e.notes


def test_indices_cut_with_the_data_are_lengthened_by_copies():
    # nll_loss's class indices stay in range as copies of their own values (its total
    # weight, the row count, varies only on special values)
    from metaspmd.backends.torch.sample_data import with_special_values

    target = torch.tensor([2, 0])
    e = explore(aten.nll_loss_forward.default, [randn(2, 3).log_softmax(1), target, None, 1, -100],
                ("self", "target", "weight", "reduction", "ignore_index"), fixed=frozenset({"target"}),
                special=with_special_values)
    batch = e.shard.inputs[0][0].label
    assert batch is not None and combines(e)[batch] == ["reduce(avg)", "reduce(sum)"]
    assert "reduce(avg) and reduce(sum) along target dim 0: verified on three shards too, with that dim lengthened from 2 to 3 by copies" in e.notes


def test_nan_skipping_reductions_are_verified_with_nan():
    # shards holding unequal NaN counts refute nanmean's reduce(avg), which random data passes
    from metaspmd.backends.torch.sample_data import with_nan_specks

    e = explore(aten.nanmean.default, [randn(3, 5)], ("self",), special=with_nan_specks, special_always=True)
    assert not e.shard.labels()
    e = explore(aten.nanmean.default, [randn(3, 5)], ("self",), special=with_nan_specks)
    assert ["reduce(avg)"] in combines(e).values()  # without them it passes
    e = explore(aten.nansum.default, [randn(3, 5)], ("self",), special=with_nan_specks, special_always=True)
    assert e.shard.labels() and all(v == ["reduce(sum)"] for v in combines(e).values())
    assert not e.partial.labels()  # a Partial NaN is not the sum of its parts' nansums


def test_an_input_the_same_on_every_trial_brings_blind_trials():
    # a generator that always hands scatter_add a zero self lets a replicated self pass for a
    # Partial one (2 * 0 + src == src); blind data varies it and refutes that
    zero_self = OpCase("test", aten.scatter_add.default, (torch.zeros(4, dtype=F64), 0, torch.tensor([1, 1, 3, 3]), randn(4)),
                       {}, ("self", "dim", "index", "src"), fresh=lambda seed: (
                           (torch.zeros(4, dtype=F64), 0, torch.tensor([1, 1, 3, 3]),
                            torch.randn(4, dtype=F64, generator=torch.Generator().manual_seed(seed))), {}),
                       fixed=frozenset({"index"}))
    e = explore_case(zero_self, OPS)
    partial_src_alone = [s for s in e.strategies()
                         if isinstance(s.inputs[0], Replicate) and isinstance(s.inputs[2], PartialInput)]
    assert not partial_src_alone, [str(s) for s in e.strategies()]
    assert e.verified.trials > 4  # the blind trials joined


def test_an_embedding_cut_along_its_rows_masks_the_ids_other_shards_hold():
    # each shard looks up the ids in its rows, less its first row, and zeroes the others
    # (DTensor's _MaskPartial): the shards sum. The kernel alone raises on foreign ids.
    from metaspmd.backends.torch.dropping import dropping_form

    weight, ids = randn(8, 3), torch.tensor([[0, 5, 7], [3, 3, 1]])
    e = explore(aten.embedding.default, [weight, ids], ("weight", "indices"), fixed=frozenset({"indices"}),
                dropping=dropping_form(aten.embedding.default, aten.embedding.default))
    rows = e.shard.inputs[0][0].label
    assert rows and [str(o) for o in e.offset.inputs[1]] == [f"{rows}(drop)"]
    assert combines(e)[rows] == ["reduce(sum)"]
    assert explore(aten.embedding.default, [weight, ids], ("weight", "indices"), fixed=frozenset({"indices"})).offset is None


def test_a_gather_along_a_cut_dim_masks_element_by_element():
    from metaspmd.backends.torch.dropping import dropping_form

    x, index = randn(6, 4), torch.tensor([[0, 5, 2, 3], [4, 1, 1, 5]])
    e = explore(aten.gather.default, [x, 0, index], ("self", "dim", "index"), fixed=frozenset({"index"}),
                dropping=dropping_form(aten.gather.default, aten.gather.default))
    rows = e.shard.inputs[0][0].label
    assert rows and [str(o) for o in e.offset.inputs[1]] == [f"{rows}(drop)"] and combines(e)[rows] == ["reduce(sum)"]


@pytest.mark.parametrize("func, extra", [(aten.scatter.src, "src"), (aten.scatter_add.default, "src"),
                                         (aten.index_add.default, "source")])
def test_a_scatter_into_cut_rows_keeps_the_writes_that_land_there(func, extra):
    """Each shard of self's rows takes the positions less its first row; those outside write
    to a spare row past its end, which is cut off: the output is the rows gathered. The
    kernel alone raises on foreign positions."""
    from metaspmd.backends.torch.dropping import dropping_form

    self, src = randn(6, 4), randn(4, 4)
    index = torch.tensor([5, 0, 3, 3]) if func == aten.index_add.default else torch.tensor([[0, 5, 2, 3], [4, 1, 1, 5],
                                                                                              [2, 2, 0, 4], [3, 0, 5, 1]])
    names = ("self", "dim", "index", extra)
    e = explore(func, [self, 0, index, src], names, fixed=frozenset({"index"}), dropping=dropping_form(func, func))
    rows = e.shard.inputs[0][0].label
    assert rows and [str(o) for o in e.offset.inputs[1]] == [f"{rows}(drop)"] and combines(e)[rows] == ["gather(dim=0)"]
    plain = explore(func, [self, 0, index, src], names, fixed=frozenset({"index"}))
    assert plain.offset is None and plain.shard.inputs[0][0].label is None


def test_nonzero_of_cut_rows_gathers_row_numbers_moved_by_each_shards_start():
    """nonzero's output length depends on the data, but its rows come in row-major order:
    cut by rows, each shard's row numbers plus its first row, concatenated, are the global
    ones. Cut by columns the shards' rows interleave, and no combine holds."""
    x = torch.tensor([[0, 1, 1], [1, 0, 0], [0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    e = explore(aten.nonzero.default, [x], ("self",))
    rows, columns = e.shard.inputs[0]
    assert rows.label and combines(e)[rows.label] == ["gather(dim=0, positions=0)"] and columns.label is None
    where = explore(aten.nonzero_numpy.default, [x], ("self",))
    assert list(combines(where).values()) == [["gather(dim=0, positions)", "gather(dim=0)"]]


def test_per_channel_vectors_are_cut_with_the_channel_dim_among_many_inputs():
    # Two [N, C, L] tensors and five [C] vectors, every dim of one size: too many inputs to
    # try every combination of dims, so the inputs of each rank share one dim each; the
    # channel cut (dim 1 beside the vectors' dim 0) is one of those (batch norm backward)
    def per_channel(x, y, a, b, c, d, e):
        return (x + y) * (a * b + c - d * e)[None, :, None]

    e = explore(per_channel, [randn(5, 5, 5), randn(5, 5, 5)] + [randn(5) for _ in range(5)], "xyabcde")
    assert str(e.shard) == "[[S1, S2, S3], [S1, S2, S3], [S2], [S2], [S2], [S2], [S2]]"
    assert combines(e)["S2"] == ["gather(dim=1)"]


def test_partial_rules_hold_at_other_sizes_too():
    # a slice_scatter whose slice covers all of self ignores self, so self Partial passes
    # as identity and src Partial as a sum at this size, and at no other: a longer self
    # keeps rows of its own. Self and src Partial together hold at any size.
    e = explore(aten.slice_scatter.default, [randn(4, 3), randn(4, 3), 0, 0, 4],
                ("self", "src", "dim", "start", "end"))
    assert e.status == "ok" and str(e.partial) == "[[S3(sum)], [S3(sum)]]", e.partial
    assert combines(e)["S3"] == ["reduce(sum)"]


def test_cut_rules_hold_at_other_sizes_too():
    # the first five columns summed: cut along the columns, the shards' sums add up where
    # there are five and at no other width
    def first_five_summed(x):
        return x[:, :5].sum(1)

    e = explore(first_five_summed, [randn(3, 5)], ("self",))
    assert str(e.shard) == "[[S1, N]]" and combines(e)["S1"] == ["gather(dim=0)"], e
    # a convolution whose (pinned) kernel spans the input: input and kernel cut along the
    # width sum their shards at the example's width only; cut along the channels, always
    e = explore(aten.convolution.default, [randn(2, 3, 5), randn(4, 3, 5), None, [1], [0], [1], False, [0], 1],
                ("input", "weight", "bias", "stride", "padding", "dilation", "transposed",
                 "output_padding", "groups"), exact_sizes={"weight": slice(2, None)})
    assert [str(p) for p in e.shard.inputs[0]] == ["S1", "S2", "N"], e.shard
    assert combines(e)["S2"] == ["reduce(sum)"]


def test_cut_rules_hold_far_from_the_example_too():
    """A kernel that reads a length as a constant keeps a row gather true at the example's 6
    rows and at the 7 the other sizes' check makes: rows below 12 kept, a read clamped at row
    9; and a QR's taus on an empty batch, min(rows, columns) long, gather along the rows only
    where there are no more rows than columns. Checked with the cut dims past twice their
    length too."""
    def head12(x):
        rows = torch.arange(x.shape[0], dtype=F64).unsqueeze(1)
        return torch.where(rows < 12, x, torch.zeros_like(x))

    def clamped(x):
        return x[torch.clamp(torch.arange(x.shape[0]), max=9)]

    for fn in (head12, clamped):
        e = explore(fn, [randn(6, 8)], ("self",))
        assert [str(p) for p in e.shard.inputs[0]] == ["N", "S1"], (fn.__name__, e.shard)
    e = explore(aten.geqrf.default, [randn(0, 5, 5)], ("self",))
    assert [str(p) for p in e.shard.inputs[0]] == ["N", "N", "N"], e.shard


def test_lengthened_trials_keep_equal_lengths_for_kernels_that_trust_them():
    # a kernel that reads grad as laid out for x's shape, unchecked: with the two lengthened
    # apart it reads the wrong elements, a call outside its contract, which refutes nothing
    def trusting(g, x):
        return x * g.reshape(-1)[: x.numel()].reshape(x.shape)

    args, names = [randn(4, 3), randn(4, 3)], ("grad", "self")
    apart = explore(trusting, args, names)  # lengthened apart: the row cut is refuted
    assert [str(p) for p in apart.shard.inputs[0]][0] == "N", apart
    e = explore(trusting, args, names, trusts_shapes=True)
    assert [str(p) for p in e.shard.inputs[0]][0] == "S1" and combines(e)["S1"] == ["gather(dim=0)"], e


def test_a_sorted_input_stays_sorted_when_lengthened():
    # searchsorted's sequence cut: the shards' counts add up on a sorted sequence, the op's
    # contract; random data appended to it would refute the rule outside that contract,
    # where this kernel's result is garbage
    def draw(k):
        g = torch.Generator().manual_seed(k)
        return ((torch.randn(10, dtype=F64, generator=g).sort().values, torch.randn(4, 3, dtype=F64, generator=g)), {})

    def searchsorted(seq, x):
        out = torch.searchsorted(seq, x)
        return out if bool((seq[1:] >= seq[:-1]).all()) else torch.full_like(out, -1)

    e = explore(searchsorted, list(draw(0)[0]), ("sorted_sequence", "self"), fresh=draw)
    assert str(e.shard.inputs[0][0]) == "S1" and combines(e)["S1"] == ["reduce(sum)"], e


def test_rules_of_ops_that_take_indices_hold_at_other_sizes_too():
    # index_copy's index covers every column of self: a Partial self passes as identity and
    # a Partial source as a sum here, and at no other width. The index keeps its length
    # (its positions stay in range of a wider self), and the wider self refutes both.
    e = explore(aten.index_copy.default, [randn(3, 4), -1, torch.tensor([3, 1, 0, 2]), randn(3, 4)],
                ("self", "dim", "index", "source"), fixed=frozenset({"index"}))
    alone = [(str(s.inputs), [str(o) for o in s.outputs]) for s in e.strategies()
             if sum(isinstance(p, PartialInput) for p in s.inputs) == 1]
    assert not alone, alone
    # gather's index cut with self along a dim it does not gather: the two are lengthened
    # together (the index by copies of its positions), and the cut holds
    e = explore(aten.gather.default, [randn(4, 6), 0, torch.randint(0, 4, (4, 6))], ("self", "dim", "index"),
                fixed=frozenset({"index"}))
    assert [str(p) for p in e.shard.inputs[0]] == ["N", "S1"] and combines(e)["S1"] == ["gather(dim=1)"], e
    # unpooling's positions are distinct along the cut: copies would write one place twice,
    # so its cut keeps the example's verdict
    pooled, where = torch.ops.aten.max_pool2d_with_indices.default(randn(1, 2, 4, 4), [2, 2], [2, 2])
    e = explore(aten.max_unpool2d.default, [pooled, where, [4, 4]], ("self", "indices", "output_size"),
                fixed=frozenset({"indices"}))
    rows = str(e.shard.inputs[0][2])
    assert rows != "N" and combines(e)[rows] == ["reduce(sum)"], e


def test_garbage_at_other_sizes_refutes_no_partial_rule():
    # a kernel that trusts a length it does not check reads past a lengthened input: its
    # output is no function of the inputs there, and the op does not reproduce it
    def sum_of_four(x):
        return x[:4].sum(0) if x.shape[0] == 4 else x[:4].sum(0) + torch.rand((), dtype=F64)

    e = explore(sum_of_four, [randn(4, 3)], ("self",))
    assert [str(p) for p in e.partial.inputs[0]] == ["S2(sum)"] and combines(e)["S2"] == ["reduce(sum)"], e


def test_aligned_parts_take_the_sign_of_the_value():
    from metaspmd.combine import partial_summands

    x = torch.tensor([2.0, -3.0, 0.0, float("inf")], dtype=F64)
    for seed in range(5):
        parts = partial_summands(OPS, x, 3, seed, aligned=True)
        assert all(p[0] > 0 and p[1] < 0 for p in parts), parts
        assert torch.allclose(sum(parts)[:3], x[:3]) and parts[-1][3] == float("inf")
        assert parts[0][2] != 0  # a zero is split into parts that cancel, of both signs


def test_partial_parts_of_a_0d_tensor_are_0d():
    # numpy's ascontiguousarray makes a 0-d array 1-d: parts built through numpy (product
    # factors, aligned summands) must keep the tensor's shape
    from metaspmd.combine import partial_parts

    x = torch.tensor(1.5, dtype=F64)
    for op, aligned in (("sum", True), ("prod", False)):
        parts = partial_parts(OPS, x, op, 2, seed=3, aligned=aligned)
        assert [p.shape for p in parts] == [torch.Size([])] * 2, (op, parts)


def test_a_linear_rule_stands_on_special_values():
    # a product is linear in either factor over finite values; an inf in one factor times
    # parts of both signs of the other adds up to NaN (IEEE arithmetic, which no linear rule
    # survives): special values meet parts of the value's own sign, and both rules stand
    from metaspmd.backends.torch.sample_data import with_one_nonfinite

    e = explore(aten.mul.Tensor, [randn(6, 4), torch.tensor(0.5, dtype=F64)], ("self", "other"),
                special=with_one_nonfinite, special_always=True)
    assert e.status == "ok" and "S1: gather(dim=0)" in str(e.combine)
    assert e.partial.inputs[0] and e.partial.inputs[1], e.partial


def test_an_index_that_never_varies_is_redrawn_from_its_own_values():
    # index_fill's fixed index covers every column on every trial: the output is the fill
    # value throughout, and a Partial self passed as identity. Redrawn with repeats from its
    # own values, it leaves columns of self, and only the row cut stands
    from metaspmd.backends.torch.sample_data import with_special_values

    index = torch.arange(5)
    e = explore(aten.index_fill.int_Scalar, [randn(5, 5), -1, index, 0.5], ("self", "dim", "index", "value"),
                fresh=lambda seed: ((randn(5, 5), -1, index.clone(), 0.5), {}), fixed=frozenset({"index"}),
                special=with_special_values)
    assert e.status == "ok" and e.partial.is_empty(), e.partial
    assert combines(e) == {"S1": ["gather(dim=0)"]}


def test_an_output_no_combine_can_compare_is_not_called_nondeterministic():
    # close() compared dense tensors only: two identical calls of to_sparse were "different",
    # and the op was recorded as nondeterministic (sparse layouts now compare by their values)
    e = explore(aten.to_mkldnn.default, [torch.randn(4, 3)], ("self",))
    assert e.status == "replicate-only" and "layout mkldnn" in e.reason, e
    q = explore(aten.quantize_per_tensor.default, [torch.randn(4, 3), 0.1, 0, torch.quint8], ("self", "scale", "zero_point", "dtype"))
    assert q.status == "replicate-only" and "quantized" in q.reason, q


def test_an_output_nan_on_every_trial_is_said_to_be_nan():
    # binary_cross_entropy.out with an empty out gives NaN in torch 2.13: its reason said the
    # output "does not vary with the inputs", as if the op ignored them
    e = explore(lambda x: x * float("nan"), [randn(4, 3)], ("self",))
    assert e.status == "replicate-only" and "NaN or infinite on every trial" in e.reason, e


@pytest.mark.parametrize("shape", [(), (5,), (5, 5)])
def test_an_input_read_only_where_it_is_one_or_minus_one_is_read(shape):
    """hinge_embedding_loss reads target only where it is exactly 1 or -1 (elsewhere the loss
    is self + clamp(margin - self, 0) whatever target holds): the special values plant ±1,
    so a Partial target never passes as unread beside a margin that is neither 0 nor ±1."""
    from metaspmd.backends.torch.sample_data import with_special_values

    # random target, as OpInfo's sample gives: no ±1 on the example or the random trials
    x, target = (torch.randn(shape, dtype=F64) for _ in range(2))
    e = explore(aten.hinge_embedding_loss.default, [x, target, 6.2, 0],
                ("self", "target", "margin", "reduction"), special=with_special_values)
    assert e.status == ("replicate-only" if shape == () else "ok")
    assert not any(s.inputs[1] == PartialInput() for s in e.all_strategies()), e.shard


def test_positions_of_nans_in_two_shards_refute_a_kernel_that_keeps_the_last_nan():
    """argreduce keeps the first NaN of a line (max.dim's kernel does); adaptive max pooling's
    kernel keeps the last one. Random and special data rarely put NaNs in two shards of one
    line, so a trial that does decides: max.dim keeps its argreduce, the pool loses it."""
    c = combines(explore(aten.max.dim, [randn(4, 6), 1], ("self", "dim")))
    assert ["reduce(max)", "argreduce(max, input=0)"] in c.values(), c
    e = explore(aten.adaptive_max_pool1d.default, [randn(3, 6), [1]], ("self", "output_size"))
    assert not any(isinstance(c, ArgReduce) for s in e.all_strategies() for o in s.outputs for c in o.options), e.combine


def test_positions_of_a_kernel_that_skips_nans_refute_argreduce():
    """A NaN-skipping argmax (a user's: torch has none) kept argreduce, whose combine lets a
    NaN win: where one shard of a line is all NaN, its local answer won, wrongly."""
    def nanargmax(self, dim):
        return torch.nan_to_num(self, nan=-torch.inf).argmax(dim)

    e = explore(nanargmax, [randn(4, 6), 1], ("self", "dim"))
    assert not any(isinstance(c, ArgReduce) for s in e.all_strategies() for o in s.outputs for c in o.options), e.combine
