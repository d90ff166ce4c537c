"""Hand-written samples for the dense CPU ops that neither OpInfo nor schema guessing reach:
kernels whose inputs must agree in ways a schema does not say (int8 matrices for
``_int_mm``, an int4 weight packed by ``_convert_weight_to_int4pack_for_cpu``, a packed
sequence's batch sizes, an embedding bag's forward results for its backward).

A builder takes a ``Draw`` (a seeded generator and the dtype of float data) and returns the
op's arguments by name; ``inputs`` places them as the schema wants (positional up to the
first keyword-only or omitted one). Shapes are fixed and values come from the seed, so a
builder run on the explorer's fresh seeds gives the same call with other values. ``out=``
arguments are left to the caller, which allocates them (``backend.make_runner``): an
``out=`` or in-place overload takes its functional op's builder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import catalog, random_ops

Named = dict[str, Any]


@dataclass(frozen=True)
class HandGuess:
    """A hand-built sample of ``op`` (a key of ``BUILDERS``) with float data in ``dtype``: what
    ``schema_samples`` hands the backend in place of a schema guess. ``dtype`` float32 is
    retried in float64 by the backend; builders whose op computes in no float dtype say
    another (``int8``)."""

    op: str
    dtype: str = "float32"


class Draw:
    """Seeded values for one build."""

    def __init__(self, seed: int, dtype: str):
        self.gen = torch.Generator().manual_seed(seed)
        self.float = getattr(torch, dtype)

    def randn(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen, dtype=dtype or self.float)

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=self.gen, dtype=self.float)

    def ints(self, low: int, high: int, *shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=self.gen, dtype=dtype)

    def complex(self, *shape: int) -> torch.Tensor:
        cdtype = torch.complex128 if self.float == torch.float64 else torch.complex64
        return torch.randn(shape, generator=self.gen, dtype=cdtype)


# --------------------------------------------------------------------------- builders
# Sizes: each cuttable dim > 2 where the op allows, and unlike the others, so that a rule
# found on one dim is not mistaken for another's.


def _int_mm(d: Draw) -> Named:
    # CPU int8 x int8 -> int32, exact: any cut of M, N or (as a Partial sum) K is verifiable
    return {"self": d.ints(-8, 8, 8, 16, dtype=torch.int8), "mat2": d.ints(-8, 8, 16, 12, dtype=torch.int8)}


def _weight_int8pack_mm(d: Draw) -> Named:
    # activations (M, K) times an int8 weight (N, K), scaled per output channel
    return {"self": d.randn(4, 16), "mat2": d.ints(-128, 128, 8, 16, dtype=torch.int8), "scales": d.rand(8) + 0.5}


def _int4_values(d: Draw, n: int, k: int) -> torch.Tensor:
    return d.ints(0, 16, n, k, dtype=torch.int32)


def _convert_weight_to_int4pack_for_cpu(d: Draw) -> Named:
    # (N, K) int32 values in [0, 16), N a multiple of 16 and K of 16 * innerKTiles. The CPU
    # kernel packs blocks of 64 rows together, so only cuts of N at multiples of 64 hold,
    # which no rule can promise: the op is replicate-only, whatever N
    return {"self": _int4_values(d, 32, 64), "innerKTiles": 2}


def _weight_int4pack_mm_for_cpu(d: Draw) -> Named:
    # the packed weight of the op above, quantized in groups of 32 along K with a scale and a
    # zero point per group and output channel
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(_int4_values(d, 32, 64), 2)
    return {"self": d.randn(4, 64), "mat2": packed, "qGroupSize": 32, "qScaleAndZeros": d.rand(2, 32, 2) + 0.5}


def _scaled_mm(d: Draw) -> Named:
    # float8 matrices scaled per tensor (the CPU kernel's one recipe), out in float32
    fp8 = torch.float8_e4m3fn
    return {"self": d.randn(8, 16, dtype=torch.float32).to(fp8), "mat2": d.randn(16, 12, dtype=torch.float32).to(fp8),
            "scale_a": d.rand(), "scale_b": d.rand(), "out_dtype": torch.float32}


def _scaled_mm_v2(d: Draw) -> Named:
    # the same call in the recipe-list form: one scale per operand, recipe 0 (per tensor),
    # no swizzle
    named = _scaled_mm(d)
    return {"self": named["self"], "mat2": named["mat2"], "scale_a": [named["scale_a"]], "recipe_a": [0],
            "swizzle_a": [0], "scale_b": [named["scale_b"]], "recipe_b": [0], "swizzle_b": [0], "bias": None,
            "out_dtype": torch.float32}


def _conv2d_sizes(d: Draw) -> Named:
    return {"self": d.randn(2, 3, 6, 7), "weight": d.randn(4, 3, 3, 3), "kernel_size": [3, 3], "bias": d.randn(4),
            "stride": [1, 1], "padding": [1, 1]}


def _slow_conv2d_grads(d: Draw) -> Named:
    named = _conv2d_sizes(d)
    del named["bias"]
    return {**named, "grad_output": d.randn(2, 4, 6, 7)}


def _slow_conv2d_backward(d: Draw) -> Named:
    return {**_slow_conv2d_grads(d), "output_mask": [True, True, True]}


def _slow_conv_dilated(spatial: int) -> Callable[[Draw], Named]:
    def build(d: Draw) -> Named:
        size = (7, 8, 6)[:spatial]
        return {"self": d.randn(2, 3, *size), "weight": d.randn(4, 3, *[2] * spatial), "kernel_size": [2] * spatial,
                "bias": d.randn(4), "stride": [1] * spatial, "padding": [1] * spatial, "dilation": [2] * spatial}

    return build


def _slow_conv_transpose(spatial: int) -> Callable[[Draw], Named]:
    def build(d: Draw) -> Named:
        size = (4, 5, 3)[:spatial]
        return {"self": d.randn(2, 3, *size), "weight": d.randn(3, 4, *[2] * spatial), "kernel_size": [2] * spatial,
                "bias": d.randn(4), "stride": [2] * spatial, "padding": [1] * spatial,
                "output_padding": [1] * spatial, "dilation": [1] * spatial}

    return build


def _conv_tbc(d: Draw) -> Named:
    # time, batch, channels; weight (kernel width, in, out)
    return {"self": d.randn(6, 2, 3), "weight": d.randn(3, 3, 4), "bias": d.randn(4), "pad": 1}


def _affine_grid_generator(d: Draw) -> Named:
    return {"theta": d.randn(2, 2, 3), "size": [2, 3, 4, 5], "align_corners": False}


def _affine_grid_generator_backward(d: Draw) -> Named:
    return {"grad": d.randn(2, 4, 5, 2), "size": [2, 3, 4, 5], "align_corners": False}


def _grid(d: Draw) -> torch.Tensor:
    return d.rand(2, 4, 5, 2) * 1.8 - 0.9  # sampling points inside [-1, 1]


def _grid_sampler_2d_cpu_fallback(d: Draw) -> Named:
    return {"input": d.randn(2, 3, 5, 6), "grid": _grid(d), "interpolation_mode": 0, "padding_mode": 0,
            "align_corners": False}


def _grid_sampler_2d_cpu_fallback_backward(d: Draw) -> Named:
    return {"grad_output": d.randn(2, 3, 4, 5), **_grid_sampler_2d_cpu_fallback(d)}


def _embedding_bag_dense_backward(d: Draw) -> Named:
    # 3 bags (of 3, 4 and 3 of 10 indices into 7 rows) summed: the forward's bookkeeping
    # (each index's bag, each bag's size) as the CPU forward computes it for autograd
    sizes = torch.tensor([3, 4, 3])
    return {"grad": d.randn(3, 5), "indices": d.ints(0, 7, 10), "offset2bag": torch.repeat_interleave(torch.arange(3), sizes),
            "bag_size": sizes, "maximum_indices": torch.zeros(3, dtype=torch.int64), "num_weights": 7,
            "scale_grad_by_freq": False, "mode": 0, "per_sample_weights": None}


def _ctc_loss_backward(d: Draw) -> Named:
    # the forward's results for 2 sequences of 6 and 5 steps over 4 classes (0 blank) with
    # targets of 3 and 2 labels; log_alpha past each sequence's steps and 2 * labels + 1
    # states is memory the forward leaves unset, here -inf (log 0)
    log_probs = d.randn(6, 2, 4).log_softmax(2)
    targets, input_lengths, target_lengths = d.ints(1, 4, 2, 3), torch.tensor([6, 5]), torch.tensor([3, 2])
    nll, log_alpha = torch.ops.aten._ctc_loss.Tensor(log_probs, targets, input_lengths, target_lengths, 0, False)
    steps = torch.arange(log_alpha.shape[1]).view(1, -1, 1) < input_lengths.view(-1, 1, 1)
    states = torch.arange(log_alpha.shape[2]).view(1, 1, -1) < (2 * target_lengths + 1).view(-1, 1, 1)
    log_alpha = torch.where(steps & states, log_alpha, torch.tensor(float("-inf"), dtype=log_alpha.dtype))
    return {"grad": d.randn(2), "log_probs": log_probs, "targets": targets, "input_lengths": input_lengths,
            "target_lengths": target_lengths, "neg_log_likelihood": nll, "log_alpha": log_alpha, "blank": 0}


def _ctc_loss(**options: Any) -> Callable[[Draw], Named]:
    # 6 sequences of 9 to 12 steps over 5 classes (0 blank), with targets of 1 to 4 labels:
    # every sequence's lengths its own, redrawn per seed. OpInfo's samples give every
    # sequence all the steps, so a cut of input_lengths has equal shards, which prove nothing
    def build(d: Draw) -> Named:
        steps, batch, classes, labels = 12, 6, 5, 4
        return {"log_probs": d.randn(steps, batch, classes).log_softmax(2), "targets": d.ints(1, classes, batch, labels),
                "input_lengths": d.ints(2 * labels + 1, steps + 1, batch), "target_lengths": d.ints(1, labels + 1, batch),
                **options}
    return build


def _compressed(layout: str, size: bool = True) -> Callable[[Draw], Named]:
    # a valid 4 x 6 compressed tensor: 2 elements (or one 2 x 3 block) per compressed row or
    # column at columns (rows) drawn per seed, so every seed gives the same shapes. A guessed
    # sample's indices broke the layout's invariants, which leaves nothing to compare
    blocked = layout in ("bsr", "bsc")
    by_row = layout in ("csr", "bsr")

    def build(d: Draw) -> Named:
        block = (2, 3) if blocked else (1, 1)
        rows, cols = 4 // block[0], 6 // block[1]
        compressed, plain, per = (rows, cols, 1 if blocked else 2) if by_row else (cols, rows, 1)
        # the last compressed row holds the last plain index, so a size inferred from the
        # indices is 4 x 6 on every seed
        last = torch.cat([torch.randperm(plain - 1, generator=d.gen)[:per - 1].sort().values, torch.tensor([plain - 1])])
        picked = torch.stack([torch.randperm(plain, generator=d.gen)[:per].sort().values
                              for _ in range(compressed - 1)] + [last])
        names = ("crow_indices", "col_indices") if by_row else ("ccol_indices", "row_indices")
        values = d.randn(compressed * per, *block) if blocked else d.randn(compressed * per)
        return {names[0]: torch.arange(0, compressed * per + 1, per), names[1]: picked.flatten(), "values": values,
                **({"size": [4, 6]} if size else {})}
    return build


def _repeat_interleave_counts(d: Draw) -> Named:
    # 7 counts of 0 to 3, redrawn per seed: OpInfo's are the same on every trial, so the
    # output never varied and no combine could be verified
    return {"repeats": d.ints(0, 4, 7)}


def _dyn_quant_pack_4bit_weight(d: Draw) -> Named:
    # 8 output channels of 32 int4 values, two to a byte, in one group of 32 (block_size)
    return {"weights": d.ints(0, 256, 8, 16, dtype=torch.uint8), "scales_zeros": d.rand(8, 1) + 0.5, "bias": d.randn(8),
            "block_size": 32, "in_features": 32, "out_features": 8}


def _dyn_quant_matmul_4bit(d: Draw) -> Named:
    packed = torch.ops.aten._dyn_quant_pack_4bit_weight(**_dyn_quant_pack_4bit_weight(d))
    return {"inp": d.randn(4, 32), "packed_weights": packed, "block_size": 32, "in_features": 32, "out_features": 8}


def _transform_bias_rescale_qkv(d: Draw) -> Named:
    # (batch, tokens, 3 * embedding) split into 2 heads of 4
    return {"qkv": d.randn(2, 5, 24), "qkv_bias": d.randn(24), "num_heads": 2}


def _native_multi_head_attention(d: Draw) -> Named:
    # 2 sequences of 5 tokens of 8 features, 2 heads, self-attention weights and biases
    return {"query": d.randn(2, 5, 8), "key": d.randn(2, 5, 8), "value": d.randn(2, 5, 8), "embed_dim": 8,
            "num_head": 2, "qkv_weight": d.randn(24, 8), "qkv_bias": d.randn(24), "proj_weight": d.randn(8, 8),
            "proj_bias": d.randn(8)}


def _upsample_aa_backward(d: Draw) -> Named:
    return {"grad_output": d.randn(2, 3, 4, 5), "output_size": [4, 5], "input_size": [2, 3, 7, 9], "align_corners": False}


def _glu_jvp(d: Draw) -> Named:
    x = d.randn(4, 6)
    return {"glu": torch.nn.functional.glu(x, 1), "x": x, "dx": d.randn(4, 6), "dim": 1}


def _glu_backward_jvp(d: Draw) -> Named:
    return {"grad_x": d.randn(4, 6), "grad_glu": d.randn(4, 3), "x": d.randn(4, 6), "dgrad_glu": d.randn(4, 3),
            "dx": d.randn(4, 6), "dim": 1}


def _nuclear_norm(d: Draw) -> Named:
    return {"self": d.randn(3, 4, 5), "dim": [1, 2]}


def _orgqr(d: Draw) -> Named:
    # Householder reflectors (m x n, m >= n) and their scales, as geqrf gives them
    return {"self": d.randn(2, 5, 3), "input2": d.randn(2, 3)}


def _cholesky_solve_helper(d: Draw) -> Named:
    # a batch of right-hand sides and the lower Cholesky factors of well-conditioned matrices
    m = d.randn(2, 4, 4)
    return {"self": d.randn(2, 4, 3), "A": torch.linalg.cholesky(m @ m.mT + 4 * torch.eye(4, dtype=m.dtype)),
            "upper": False}


def _linalg_cond(d: Draw) -> Named:
    return {"self": d.randn(3, 4, 4), "p": "fro"}


def _complex_self(d: Draw) -> Named:
    return {"self": d.complex(4, 3)}


def _view_as_complex_copy(d: Draw) -> Named:
    return {"self": d.randn(4, 3, 2)}


def _istft(d: Draw) -> Named:
    # a batch of 2 spectrograms of 8-point frames (5 one-sided bins, 6 frames), hop 2
    return {"self": d.complex(2, 5, 6), "n_fft": 8, "hop_length": 2, "window": torch.hann_window(8, dtype=d.float)}


def _gradient(d: Draw) -> Named:
    # coordinates along each dim, strictly increasing
    return {"self": d.randn(4, 6), "spacing": [torch.cumsum(d.rand(4) + 0.5, 0), torch.cumsum(d.rand(6) + 0.5, 0)]}


_BATCH_SIZES = (3, 3, 2, 1)  # a packed batch of 3 sequences of lengths 4, 3, 2


def _pack_padded_sequence_backward(d: Draw) -> Named:
    return {"grad": d.randn(sum(_BATCH_SIZES), 5), "input_size": [len(_BATCH_SIZES), _BATCH_SIZES[0], 5],
            "batch_sizes": torch.tensor(_BATCH_SIZES), "batch_first": False}


def _rnn_data(gates: int) -> Callable[[Draw], Named]:
    def build(d: Draw) -> Named:
        hidden, features = 6, 5
        params = [d.randn(gates * hidden, features), d.randn(gates * hidden, hidden), d.randn(gates * hidden),
                  d.randn(gates * hidden)]
        return {"data": d.randn(sum(_BATCH_SIZES), features), "batch_sizes": torch.tensor(_BATCH_SIZES),
                "hx": d.randn(1, _BATCH_SIZES[0], hidden), "params": params, "has_biases": True, "num_layers": 1,
                "dropout": 0.0, "train": False, "bidirectional": False}

    return build


def _reshape_from_tensor(d: Draw) -> Named:
    return {"self": d.randn(4, 6), "shape": torch.tensor([3, 8])}


def _rowwise_prune(d: Draw) -> Named:
    mask = d.ints(0, 2, 6).to(torch.bool)
    mask[0], mask[1] = True, False  # both kept and pruned rows, whatever the draw
    return {"weight": d.randn(6, 4), "mask": mask, "compressed_indices_dtype": torch.int32}


_OFFSETS = (0, 3, 5, 9)  # 3 sequences of lengths 3, 2, 4


def _jagged_to_padded_dense_forward(d: Draw) -> Named:
    return {"values": d.randn(_OFFSETS[-1], 4), "offsets": [torch.tensor(_OFFSETS)], "max_lengths": [4]}


def _padded_dense_to_jagged_forward(d: Draw) -> Named:
    return {"dense": d.randn(len(_OFFSETS) - 1, 4, 5), "offsets": [torch.tensor(_OFFSETS)], "total_L": _OFFSETS[-1]}


def _unflatten_dense_tensors(d: Draw) -> Named:
    return {"flat": d.randn(24), "tensors": [d.randn(4, 3), d.randn(3, 4)]}


def _amp_update_scale(d: Draw) -> Named:
    # AMP's loss scale, its growth counter and the found_inf flag: one element each
    return {"self": d.rand(1) + 1.0, "growth_tracker": d.ints(0, 3, 1, dtype=torch.int32),
            "found_inf": d.ints(0, 2, 1).to(d.float), "scale_growth_factor": 2.0, "scale_backoff_factor": 0.5,
            "growth_interval": 3}


def _test_check_tensor(d: Draw) -> Named:
    return {"self": torch.ones(4, 6, dtype=torch.bool)}  # it checks that every element is True


def _wrapped_linear_prepack(d: Draw) -> Named:
    return {"weight": d.randn(4, 6), "weight_scale": d.rand(1) + 0.1, "weight_zero_point": d.ints(0, 3, 1),
            "bias": d.randn(4)}


def _bernoulli(d: Draw) -> Named:
    return {"self": d.randn(4, 6), "p": d.rand(4, 6)}


def _feature_dropout(self_name: str) -> Callable[[Draw], Named]:
    # in training, half dropped: the mask is drawn per (batch, channel), so the cuts of the
    # spatial dims are refused, which OpInfo's p = 0 calls (drawing nothing) cannot show
    return lambda d: {self_name: d.randn(4, 6, 5, 3), "p": 0.5, "train": True}


def _normal(d: Draw) -> Named:
    return {"mean": 0.5, "std": d.rand(4, 6) + 0.1}


def _randint(d: Draw) -> Named:
    return {"low": 2, "high": 9, "size": [4, 6]}


def _randint_like(d: Draw) -> Named:
    return {"self": d.randn(4, 6), "low": 2, "high": 9}


# Ops whose schema-guessed inputs crash the process (they left catalog.CRASH_ON_GUESSED_INPUTS
# for these builders, which come before any guess): each was explored in a process of its own
# without a crash and got verified rules. _sobol_engine_initialize_state_ corrupts memory on
# the explorer's cuts even from valid inputs: it stays on the list, with no builder (NNPACK's
# convolution, which runs on some CPUs only, is catalog.MACHINE_DEPENDENT).
# _cholesky_solve_helper's cuts of A alone are refused by its exact guard
# (catalog.EXACT_GUARDS), and its builder leads.


def _batch_norm_no_update(d: Draw) -> Named:
    # evaluation-mode batch norm: (batch, channels, length) and per-channel statistics
    return {"input": d.randn(4, 3, 5), "weight": d.randn(3), "bias": d.randn(3), "running_mean": d.randn(3),
            "running_var": d.rand(3) + 0.5, "momentum": 0.1, "eps": 1e-5}


def _batch_norm_impl_index_backward(d: Draw) -> Named:
    # the native (impl_index 0) training backward, with the forward's saved mean and invstd
    x = d.randn(4, 3, 5)
    mean, invstd = x.mean((0, 2)), 1 / (x.var((0, 2), unbiased=False) + 1e-5).sqrt()
    return {"impl_index": 0, "input": x, "grad_output": d.randn(4, 3, 5), "weight": d.randn(3),
            "running_mean": d.randn(3), "running_var": d.rand(3) + 0.5, "save_mean": mean,
            "save_var_transform": invstd, "train": True, "eps": 1e-5, "output_mask": [True, True, True],
            "reservedSpace": torch.empty(0)}


def _compute_linear_combination(d: Draw) -> Named:
    # 2 combinations of 3 inputs of shape (4, 5): coefficients (combinations, inputs)
    return {"input": d.randn(3, 4, 5), "coefficients": d.randn(2, 3)}


def _thnn_differentiable_gru_cell_backward(d: Draw) -> Named:
    # a GRU cell of hidden size 6 over a batch of 4: gates are 3 x 6 wide
    return {"grad_hy": d.randn(4, 6), "input_gates": d.randn(4, 18), "hidden_gates": d.randn(4, 18),
            "hx": d.randn(4, 6), "input_bias": d.randn(18), "hidden_bias": d.randn(18)}


def _thnn_differentiable_lstm_cell_backward(d: Draw) -> Named:
    # an LSTM cell of hidden size 6 over a batch of 4: gates are 4 x 6 wide; both output
    # grads given (a guess left them None, and the op then returns no tensor)
    return {"grad_hy": d.randn(4, 6), "grad_cy": d.randn(4, 6), "input_gates": d.randn(4, 24),
            "hidden_gates": d.randn(4, 24), "input_bias": d.randn(24), "hidden_bias": d.randn(24),
            "cx": d.randn(4, 6), "cy": d.randn(4, 6)}


def _convolution_double_backward(d: Draw) -> Named:
    # a 2-D convolution of 6 to 4 channels with a 3x3 kernel over 5 images of 9x10, every
    # second-order grad given (a guess left them None: no tensor output)
    return {"ggI": d.randn(5, 6, 9, 10), "ggW": d.randn(4, 6, 3, 3), "ggb": d.randn(4), "gO": d.randn(5, 4, 7, 8),
            "weight": d.randn(4, 6, 3, 3), "self": d.randn(5, 6, 9, 10), "stride": [1, 1], "padding": [0, 0],
            "dilation": [1, 1], "transposed": False, "output_padding": [0, 0], "groups": 1,
            "output_mask": [True, True, True]}


def _remove_batch_dim(d: Draw) -> Named:
    # a plain tensor given a batch dim of 5 in front (a guessed 0-d one with batch_size 1
    # at out_dim 1 asked for 32 GiB)
    return {"self": d.randn(3, 4), "level": 1, "batch_size": 5, "out_dim": 0}


def _matrix_rank_batched(d: Draw) -> Named:
    # OpInfo's calls are of one matrix: a batch of 4 has rules of its own
    return {"self": d.randn(4, 5, 6), "tol": 0.5}


def _lstsq_tall(d: Draw) -> Named:
    # OpInfo's matrices are wide (2 x 3), where gels leaves the residuals empty and every
    # combine of them passes; a tall one has residuals, which a cut of b's columns gathers
    # (and which stay a gather of empties where a call of this signature is wide)
    return {"self": d.randn(6, 3), "b": d.randn(6, 4), "driver": "gels"}


def _nuclear_norm_batched(d: Draw) -> Named:
    return {"self": d.randn(4, 5, 6)}


def _vander_columns(d: Draw) -> Named:
    # N given: the output's width no longer follows len(x), so a cut of x is a cut of rows
    return {"x": d.randn(6), "N": 4}


def _bincount_weighted(d: Draw) -> Named:
    # float weights (OpInfo's are integers, which a Partial does not split where the output
    # is a float): split into parts beside the whole self, their counts add up
    return {"self": d.ints(0, 5, 13), "weights": d.randn(13)}


def _histogramdd_range(d: Draw) -> Named:
    # a fixed range: every shard's bins are the whole input's, so their counts add up
    return {"self": d.randn(40, 2), "bins": 3, "range": [-3.0, 3.0, -3.0, 3.0]}


def _set_storage(d: Draw) -> Named:
    # self re-pointed at another tensor's storage: a Storage is no tensor, so nothing but
    # self (whose values the op drops) can be cut
    return {"self": d.randn(4, 6), "source": d.randn(24).untyped_storage()}


def _set_storage_offset(source: str):
    def build(d: Draw) -> Named:
        # a [4, 6] window 2 elements into 30 (a Storage, or a tensor's storage)
        data = d.randn(30)
        return {"self": d.randn(4, 6), "source": data.untyped_storage() if source == "storage" else data,
                "storage_offset": 2, "size": [4, 6], "stride": [6, 1]}
    return build


def _empty_permuted(d: Draw) -> Named:
    return {"size": [4, 6], "physical_layout": [1, 0]}


# base name (or one overload's full name) -> builder, and the dtype of its float data
BUILDERS: dict[str, tuple[Callable[[Draw], Named], str]] = {
    "_int_mm": (_int_mm, "int8"),
    "_weight_int8pack_mm": (_weight_int8pack_mm, "float32"),
    "_convert_weight_to_int4pack_for_cpu": (_convert_weight_to_int4pack_for_cpu, "int32"),
    "_weight_int4pack_mm_for_cpu": (_weight_int4pack_mm_for_cpu, "float32"),
    "_scaled_mm": (_scaled_mm, "float32"),
    "_scaled_mm_v2": (_scaled_mm_v2, "float32"),
    "_slow_conv2d_forward": (_conv2d_sizes, "float32"),
    "_slow_conv2d_backward": (_slow_conv2d_backward, "float32"),
    "aten._slow_conv2d_backward.grad_input": (_slow_conv2d_grads, "float32"),  # every grad, no mask
    "slow_conv_dilated2d": (_slow_conv_dilated(2), "float32"),
    "slow_conv_dilated3d": (_slow_conv_dilated(3), "float32"),
    "slow_conv_transpose2d": (_slow_conv_transpose(2), "float32"),
    "slow_conv_transpose3d": (_slow_conv_transpose(3), "float32"),
    "conv_tbc": (_conv_tbc, "float32"),
    "affine_grid_generator": (_affine_grid_generator, "float32"),
    "affine_grid_generator_backward": (_affine_grid_generator_backward, "float32"),
    "_grid_sampler_2d_cpu_fallback": (_grid_sampler_2d_cpu_fallback, "float32"),
    "_grid_sampler_2d_cpu_fallback_backward": (_grid_sampler_2d_cpu_fallback_backward, "float32"),
    "_embedding_bag_dense_backward": (_embedding_bag_dense_backward, "float32"),
    "_ctc_loss_backward": (_ctc_loss_backward, "float32"),
    "_dyn_quant_pack_4bit_weight": (_dyn_quant_pack_4bit_weight, "float32"),
    "_dyn_quant_matmul_4bit": (_dyn_quant_matmul_4bit, "float32"),
    "_transform_bias_rescale_qkv": (_transform_bias_rescale_qkv, "float32"),
    "_native_multi_head_attention": (_native_multi_head_attention, "float32"),
    "_upsample_bicubic2d_aa_backward": (_upsample_aa_backward, "float32"),
    "_upsample_lanczos2d_aa_backward": (_upsample_aa_backward, "float32"),
    "glu_jvp": (_glu_jvp, "float32"),
    "glu_backward_jvp": (_glu_backward_jvp, "float32"),
    "nuclear_norm": (_nuclear_norm, "float32"),
    "orgqr": (_orgqr, "float32"),
    "_cholesky_solve_helper": (_cholesky_solve_helper, "float64"),
    "linalg_cond": (_linalg_cond, "float32"),
    "_conj_copy": (_complex_self, "float32"),
    "view_as_real_copy": (_complex_self, "float32"),
    "view_as_complex_copy": (_view_as_complex_copy, "float32"),
    "istft": (_istft, "float32"),
    "gradient": (_gradient, "float32"),
    "_pack_padded_sequence_backward": (_pack_padded_sequence_backward, "float32"),
    "gru": (_rnn_data(3), "float32"),
    "rnn_tanh": (_rnn_data(1), "float32"),
    "rnn_relu": (_rnn_data(1), "float32"),
    "_reshape_from_tensor": (_reshape_from_tensor, "float32"),
    "_rowwise_prune": (_rowwise_prune, "float32"),
    "_jagged_to_padded_dense_forward": (_jagged_to_padded_dense_forward, "float32"),
    "_padded_dense_to_jagged_forward": (_padded_dense_to_jagged_forward, "float32"),
    "unflatten_dense_tensors": (_unflatten_dense_tensors, "float32"),
    "_amp_update_scale": (_amp_update_scale, "float32"),
    "_amp_update_scale_": (_amp_update_scale, "float32"),
    "_test_check_tensor": (_test_check_tensor, "bool"),
    "_wrapped_linear_prepack": (_wrapped_linear_prepack, "float32"),
    "bernoulli": (_bernoulli, "float32"),
    "bernoulli_": (_bernoulli, "float32"),
    "normal": (_normal, "float32"),
    "randint": (_randint, "int64"),
    "randint_like": (_randint_like, "float32"),
    "empty_permuted": (_empty_permuted, "float32"),
    "_batch_norm_no_update": (_batch_norm_no_update, "float32"),
    "_batch_norm_impl_index_backward": (_batch_norm_impl_index_backward, "float32"),
    "_compute_linear_combination": (_compute_linear_combination, "float32"),
    "_thnn_differentiable_gru_cell_backward": (_thnn_differentiable_gru_cell_backward, "float32"),
    "_thnn_differentiable_lstm_cell_backward": (_thnn_differentiable_lstm_cell_backward, "float32"),
    "_convolution_double_backward": (_convolution_double_backward, "float32"),
    "_remove_batch_dim": (_remove_batch_dim, "float32"),
    # by overload: set's others take no Storage (an out= overload's key names it, as the base would every set)
    **dict.fromkeys(("aten.set.source_Storage", "aten.set.source_Storage_out", "aten.set_.source_Storage"),
                    (_set_storage, "float32")),
    **dict.fromkeys(("aten.set.source_Storage_storage_offset", "aten.set.source_Storage_storage_offset_out",
                     "aten.set_.source_Storage_storage_offset"), (_set_storage_offset("storage"), "float32")),
    "aten.set_.source_Tensor_storage_offset": (_set_storage_offset("tensor"), "float32"),
    **{f"{prefix}sparse_{layout}_tensor{suffix}": (_compressed(layout), "float32")
       for layout in ("csr", "csc", "bsr", "bsc") for prefix, suffix in (("", ""), ("_", "_unsafe"))},
    **{f"aten.sparse_{layout}_tensor.{names}": (_compressed(layout, size=False), "float32")
       for layout, names in (("csr", "crow_col_value"), ("csc", "ccol_row_value"), ("bsr", "crow_col_value"),
                             ("bsc", "ccol_row_value"))},
}

# Ops whose OpInfo samples cannot tell their rules apart, or reach only calls that have none
# (one matrix where a batch of them has a cut, a width that follows the input's length):
# these hand samples are explored in place of OpInfo's at the signatures they share (the
# backend puts them first and drops OpInfo's calls of those signatures), beside the others,
# in float64 as OpInfo's are. Keyed by op, then by a
# name of the call, which ``HandGuess.op`` holds (``inputs`` finds the builder by it).
LEADING: dict[str, dict[str, tuple[Callable[[Draw], Named], str]]] = {
    "aten.ctc_loss.Tensor": {
        "ctc_loss:mean": (_ctc_loss(), "float64"),
        "ctc_loss:none": (_ctc_loss(blank=0, reduction=0), "float64"),
        "ctc_loss:none, zero_infinity": (_ctc_loss(blank=0, reduction=0, zero_infinity=True), "float64"),
        "ctc_loss:mean, zero_infinity": (_ctc_loss(blank=0, reduction=1, zero_infinity=True), "float64"),
    },
    "aten.repeat_interleave.Tensor": {"repeat_interleave:counts": (_repeat_interleave_counts, "int64")},
    "aten.linalg_matrix_rank.default": {"linalg_matrix_rank:batched": (_matrix_rank_batched, "float64")},
    "aten.nuclear_norm.default": {"nuclear_norm:batched": (_nuclear_norm_batched, "float64")},
    "aten.linalg_lstsq.default": {"linalg_lstsq:tall": (_lstsq_tall, "float64")},
    "aten.vander.default": {"vander:N": (_vander_columns, "float64")},
    "aten.bincount.default": {"bincount:float weights": (_bincount_weighted, "float64")},
    "aten.histogramdd.int_bins": {"histogramdd:range": (_histogramdd_range, "float64")},
    **{f"aten.{op}.default": {f"{op}:train": (_feature_dropout("self" if op.endswith("_") else "input"), "float64")}
       for op in sorted(random_ops.FEATURE_MASKS)},
}
_LEAD_BUILDERS = {key: built for calls in LEADING.values() for key, built in calls.items()}


def leading(func) -> list[HandGuess]:
    """The hand samples explored in place of OpInfo's for ``func`` (``LEADING``)."""
    return [HandGuess(key, dtype) for key, (_, dtype) in LEADING.get(catalog.op_name(func), {}).items()]


def guess_for(func) -> HandGuess | None:
    """The hand-built sample of ``func``'s base op, if one is written and takes the
    overload's arguments (``bernoulli.p`` takes a float p, not the builder's tensor)."""
    key = next((k for k in (catalog.op_name(func), catalog.aten_base(func)) if k in BUILDERS), None)
    if key is None:
        return None
    guess = HandGuess(key, BUILDERS[key][1])
    try:
        inputs(func, guess, 0)
    except (KeyError, TypeError):
        return None
    return guess


def _fits(arg, value: Any) -> bool:
    """Does ``value`` have the kind of the schema argument ``arg`` (a tensor for a Tensor, a
    list of tensors for a Tensor[], a float for a float)? Builders are shared by a base op's
    overloads, and ``bernoulli.p`` takes a float where ``bernoulli.Tensor`` takes a tensor."""
    full = str(arg.real_type)
    if value is None:
        return full.startswith("Optional[")
    t = full.removeprefix("Optional[").removesuffix("]") if full.startswith("Optional[") else full
    if t.startswith("List["):
        if not isinstance(value, (list, tuple)):
            return False
        tensors = "Tensor" in t
        return all(isinstance(v, torch.Tensor) == tensors or (v is None and tensors) for v in value)
    if isinstance(value, torch.Tensor):
        return t == "Tensor"
    kinds = {"int": int, "SymInt": int, "float": (int, float), "number": (int, float, complex), "bool": bool,
             "str": str, "ScalarType": torch.dtype, "Tensor": torch.Tensor}
    if t in kinds:
        return isinstance(value, kinds[t]) and (t == "bool" or not isinstance(value, bool))
    return True


def inputs(func, guess: HandGuess, seed: int) -> tuple[tuple, dict]:
    """The builder's arguments for ``func`` under ``seed``: positional up to the first
    keyword-only or omitted argument, the rest by keyword; out arguments omitted. KeyError
    when a required argument is not built, TypeError when one has the wrong kind."""
    build, _ = BUILDERS[guess.op] if guess.op in BUILDERS else _LEAD_BUILDERS[guess.op]
    named = build(Draw(seed, guess.dtype if guess.dtype in ("float32", "float64") else "float32"))
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True
    used = set()
    for arg in func._schema.arguments:
        if arg.is_out:
            continue
        if arg.name not in named and arg.has_default_value():
            positional = False
            continue
        if arg.name not in named and not str(arg.real_type).startswith("Optional["):
            raise KeyError(f"{catalog.op_name(func)}: the hand-written sample builds no {arg.name!r}")
        value = named.get(arg.name)  # a required Optional argument left out is None
        if not _fits(arg, value):
            raise TypeError(f"{catalog.op_name(func)}: {arg.name} is a {arg.real_type}, the sample has {type(value).__name__}")
        used.add(arg.name)
        if positional and not arg.kwarg_only:
            args.append(value)
        else:
            positional = False
            kwargs[arg.name] = value
    extra = set(named) - used
    if extra:  # built for another overload (randint.low's low, absent from randint.default)
        raise KeyError(f"{catalog.op_name(func)} takes no {', '.join(sorted(extra))}")
    return tuple(args), kwargs


__all__ = ["BUILDERS", "Draw", "HandGuess", "LEADING", "guess_for", "inputs", "leading"]
