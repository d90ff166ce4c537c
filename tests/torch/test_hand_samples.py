"""Hand-written samples for dense CPU ops that OpInfo and schema guessing miss, and the
dense CPU predicate the coverage report counts their misses in."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import catalog, dense_cpu, hand_samples, schema_samples  # noqa: E402
from metaspmd.backends.torch.backend import TorchBackend, make_runner, torch_case  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.explorer.common import cuts_a_dim  # noqa: E402


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in torch.utils._pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


# one functional overload per builder: the op the builder was written for
BUILT = [
    "aten._int_mm.default", "aten._weight_int8pack_mm.default", "aten._convert_weight_to_int4pack_for_cpu.default",
    "aten._weight_int4pack_mm_for_cpu.default", "aten._scaled_mm.default", "aten._scaled_mm_v2.default", "aten._slow_conv2d_forward.default",
    "aten._slow_conv2d_backward.output_mask", "aten.slow_conv_dilated2d.default", "aten.slow_conv_dilated3d.default",
    "aten.slow_conv_transpose2d.default", "aten.slow_conv_transpose3d.default", "aten.conv_tbc.default",
    "aten.affine_grid_generator.default", "aten.affine_grid_generator_backward.default",
    "aten._grid_sampler_2d_cpu_fallback.default", "aten._grid_sampler_2d_cpu_fallback_backward.default",
    "aten._embedding_bag_dense_backward.default", "aten._ctc_loss_backward.Tensor",
    "aten._dyn_quant_pack_4bit_weight.default", "aten._dyn_quant_matmul_4bit.default",
    "aten._transform_bias_rescale_qkv.default", "aten._native_multi_head_attention.default", "aten._upsample_bicubic2d_aa_backward.default",
    "aten._upsample_lanczos2d_aa_backward.default", "aten.glu_jvp.default", "aten.glu_backward_jvp.default",
    "aten.nuclear_norm.dim", "aten.orgqr.default", "aten._cholesky_solve_helper.default", "aten.linalg_cond.p_str",
    "aten._conj_copy.default",
    "aten.view_as_real_copy.default", "aten.view_as_complex_copy.default", "aten.istft.default",
    "aten.gradient.tensorarrayint", "aten._pack_padded_sequence_backward.default", "aten.gru.data",
    "aten.rnn_tanh.data", "aten.rnn_relu.data", "aten._reshape_from_tensor.default", "aten._rowwise_prune.default",
    "aten._jagged_to_padded_dense_forward.default", "aten._padded_dense_to_jagged_forward.default",
    "aten.unflatten_dense_tensors.default", "aten._amp_update_scale.default", "aten._amp_update_scale_.default",
    "aten._test_check_tensor.default", "aten._wrapped_linear_prepack.default", "aten.bernoulli.Tensor",
    "aten.bernoulli_.Tensor", "aten.normal.float_Tensor", "aten.randint.low_generator",
    "aten.randint_like.low_generator_dtype", "aten.empty_permuted.default",
    "aten._batch_norm_no_update.default", "aten._batch_norm_impl_index_backward.default",
    "aten._compute_linear_combination.default", "aten._thnn_differentiable_gru_cell_backward.default",
    "aten._thnn_differentiable_lstm_cell_backward.default", "aten._convolution_double_backward.default",
    "aten._remove_batch_dim.default",
    *(f"aten.{prefix}sparse_{layout}_tensor{suffix}" for layout in ("csr", "csc", "bsr", "bsc")
      for prefix, suffix in (("", ".crow_col_value_size" if layout in ("csr", "bsr") else ".ccol_row_value_size"),
                             ("_", "_unsafe.default"))),
]
# builders keyed by one overload's full name (the others by their op's base name)
OVERLOAD_KEYS = {"aten._slow_conv2d_backward.grad_input", "aten.sparse_csr_tensor.crow_col_value",
                 "aten.sparse_csc_tensor.ccol_row_value", "aten.sparse_bsr_tensor.crow_col_value",
                 "aten.sparse_bsc_tensor.ccol_row_value",
                 # a Storage (no tensor) or a window of a tensor's storage as self's new data
                 "aten.set.source_Storage", "aten.set_.source_Storage", "aten.set.source_Storage_out",
                 "aten.set.source_Storage_storage_offset", "aten.set_.source_Storage_storage_offset",
                 "aten.set.source_Storage_storage_offset_out", "aten.set_.source_Tensor_storage_offset"}
BUILT += sorted(OVERLOAD_KEYS - {"aten._slow_conv2d_backward.grad_input"})


def test_every_builder_is_tested():
    keys = {catalog.aten_base(catalog.resolve(n)) for n in BUILT if n not in OVERLOAD_KEYS} | OVERLOAD_KEYS
    assert keys == set(hand_samples.BUILDERS)


@pytest.mark.parametrize("name", BUILT)
def test_a_builder_runs_on_every_seed_with_its_shapes(name):
    """The explorer's fresh trials rebuild the sample on other seeds (one per trial, a dozen
    or more): same shapes and dtypes, and other values wherever the sample draws any."""
    func = catalog.resolve(name)
    guess = hand_samples.guess_for(func)
    assert guess is not None, name
    run = make_runner(func)
    first = hand_samples.inputs(func, guess, 0)
    run(*first[0], **first[1])
    again = hand_samples.inputs(func, guess, 0)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(first), _tensors(again)))  # deterministic
    drawn = [x.is_floating_point() or x.is_complex() for x in _tensors(first)]
    for seed in range(1, 17):
        args, kwargs = hand_samples.inputs(func, guess, seed)
        run(*args, **kwargs)
        fresh = _tensors((args, kwargs))
        assert [(x.shape, x.dtype) for x in fresh] == [(x.shape, x.dtype) for x in _tensors(first)]
        if any(drawn):
            assert any(not torch.equal(a, b) for a, b in zip(_tensors(first), fresh))


def test_a_builder_serves_only_overloads_that_take_its_arguments():
    # bernoulli.p takes a float p, randint.default no low: their own samples stay theirs
    for name in ("aten.bernoulli.p", "aten.randint.default", "aten.gru.input", "aten.linalg_cond.default"):
        assert hand_samples.guess_for(catalog.resolve(name)) is None, name
    # an out= overload takes its functional op's builder, its out arguments left out
    func = catalog.resolve("aten.orgqr.out")
    args, kwargs = hand_samples.inputs(func, hand_samples.guess_for(func), 0)
    assert len(args) == 2 and "out" not in kwargs


def test_int_mm_gets_exact_rules_from_its_hand_sample():
    """int8 matrices: M and N cut as gathers, K as a Partial sum of exact int32 products."""
    func = catalog.resolve("aten._int_mm.default")
    guess = hand_samples.guess_for(func)
    args, kwargs = hand_samples.inputs(func, guess, 0)
    assert [x.dtype for x in args] == [torch.int8, torch.int8]
    case = torch_case(func, args, kwargs, func, lambda seed: hand_samples.inputs(func, guess, seed))
    entry = explore_case(case, TorchOps())
    assert entry.status == "ok"
    assert str(entry.shard) == "[[S1, S2], [S2, S3]]", entry.shard


@pytest.mark.parametrize("name", ["aten._int_mm.out", "aten.split_copy.Tensor_out"])
def test_an_out_kernel_that_does_not_resize_gets_outs_shaped_by_its_functional_op(name):
    """Their kernels refuse an empty out (``_int_mm.out``: "Expected result.size(0) to be 8",
    ``split_copy``: an out of the wrong size), so no sample ran: no-sample, though the op
    runs on dense CPU tensors. Shaped on each shard by the functional op, they get rules."""
    case = TorchBackend().cases(name)[0]
    entry = explore_case(case, TorchOps())
    assert entry.status in ("ok", "derived") and cuts_a_dim(entry), (entry.status, entry.reason)


def test_a_hand_sample_comes_before_schema_guesses():
    func = catalog.resolve("aten.conv_tbc.default")
    guess, error = schema_samples.find_schema_sample(lambda a, k: func(*a, **k), func)
    assert isinstance(guess, hand_samples.HandGuess) and not error


@pytest.mark.parametrize("name", [
    "aten._int_mm.default", "aten._scaled_mm.out", "aten.fake_quantize_per_tensor_affine.default",
    "aten._sparse_mm.default", "aten.mkldnn_convolution.default", "aten.slow_conv_transpose2d.out", "aten.mm.default",
])
def test_dense_cpu_ops(name):
    assert dense_cpu.reason(name) is None


@pytest.mark.parametrize("name, words", [
    ("aten.mm.dtype", "no kernel for CPU tensors"),  # CUDA only: a Meta kernel alone in this build
    ("aten._thnn_fused_lstm_cell.default", "no kernel for CPU tensors"),
    ("aten._indices.default", "SparseCPU"),
    ("aten.values.default", "sparse"),  # a composite kernel that refuses strided tensors
    ("aten.batch_norm_stats.out", "computes aten.batch_norm_stats.default"),  # autogenerated out= of a CUDA op
    ("aten._thnn_fused_lstm_cell.out", "computes aten._thnn_fused_lstm_cell.default"),
    ("aten.quantize_per_tensor.default", "quantized"),
    ("aten._cufft_get_plan_cache_size.default", "cuFFT"),
    ("aten._thnn_fused_lstm_cell_backward.default", "no CPU version"),
    ("aten.retain_grad.default", "autograd"),
])
def test_ops_that_do_not_run_on_dense_cpu_tensors(name, words):
    assert words in (dense_cpu.reason(name) or ""), dense_cpu.reason(name)


def test_a_sample_failure_of_an_op_without_a_dense_kernel_says_so():
    func = catalog.resolve("aten._thnn_fused_lstm_cell.default")
    guess, error = schema_samples.find_schema_sample(lambda a, k: func(*a, **k), func)
    assert guess is None and "does not run on dense CPU tensors" in error and "no kernel for CPU tensors" in error


def test_coverage_counts_and_lists_the_dense_cpu_overloads_without_a_sample(tmp_path, capsys):
    """On a registry of the committed no-sample files and three with rules: loading all
    3,110 files, twice, took most of this test's time."""
    import re
    import shutil

    from metaspmd import cli
    from metaspmd.registry_io import load_registry

    folder = cli.REGISTRY / "torch"
    no_sample = [p for p in sorted(folder.glob("*.yaml"))
                 if re.search(r"^status: no-sample$", p.read_text(), re.MULTILINE)]
    with_rules = [folder / f"{op}.yaml" for op in ("aten.mm.default", "aten.add.Tensor", "aten.relu.default")]
    (tmp_path / "torch").mkdir()
    for path in no_sample + with_rules:
        shutil.copy(path, tmp_path / "torch" / path.name)
    records = load_registry(tmp_path, "torch")
    want = sorted(n for n, r in records.items() if r.status == "no-sample" and dense_cpu.is_dense_cpu(n))
    assert want and len(records) == len(no_sample) + 3
    assert cli.coverage(["--registry", str(tmp_path), "--list-no-sample"]) == 0
    out = capsys.readouterr().out
    assert f"dense CPU overloads with no sample: {len(want)}" in out
    listed = [line.split()[0] for line in out.splitlines() if " no-sample " in line]
    assert listed == want
    dense = next(line.split() for line in out.splitlines() if line.startswith("dense CPU "))
    assert int(dense[3]) == 3  # covered: the three with rules


def test_coverage_names_a_threshold_not_met_and_refuses_a_registry_without_aten_rules(tmp_path, capsys):
    """--min-core below its threshold exited 1 with nothing said; a registry of custom ops
    alone read 0.0% everywhere and exited 0."""
    import re
    import shutil

    from metaspmd import cli

    (tmp_path / "torch").mkdir()
    for op in ("aten.mm.default", "aten.relu.default"):
        shutil.copy(cli.REGISTRY / "torch" / f"{op}.yaml", tmp_path / "torch" / f"{op}.yaml")
    assert cli.coverage(["--registry", str(tmp_path), "--min-core", "50", "--min-reached", "0.1"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"coverage: below --min-core 50: core ops is \d+\.\d%", err)
    assert "--min-reached" not in err  # met
    own = tmp_path / "own"
    (own / "torch").mkdir(parents=True)
    (own / "torch" / "mine.scale.default.yaml").write_text(
        (cli.REGISTRY / "torch" / "aten.relu.default.yaml").read_text().replace("aten.relu.default", "mine.scale.default"))
    assert cli.coverage(["--registry", str(own)]) == 2
    assert "holds no ATen overload's rule file" in capsys.readouterr().err
