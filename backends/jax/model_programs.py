"""Programs shaped like the models users bring to ``parallelize``: each one a small model's
loss and its gradients (``jax.value_and_grad``), so both passes' equations are in it.

jax's harnesses call each primitive on one or two ranks, mostly without broadcasting; a
model's graph holds rank-3 and rank-4 activations, biases and statistics broadcast against
them (``x:f[*,*,*] y:f[*,*,1]``), reductions over the last axis, attention's batched
matmuls and a loss over a vocabulary; Flax's layers keep attention heads as a dim of their
own and contract two dims at once (``_flax_block``); ``jax.nn.dot_product_attention``, which
nnx's attention runs, contracts rank-5 groups of heads (``_sdpa_block``; grouped-query
attention in a Llama-style block, ``_gqa_block``), around rotary position embeddings in
Llama-style models (``_rope_attention``). The sweep explores these signatures
as well (``backend.MODEL_CASES`` per primitive, beyond the harnesses' own), so the table
holds them and ``parallelize`` looks them up instead of exploring them live. Arguments are
flat arrays: a program's jaxpr takes them as its inputs.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .program import Program

PREFIX = "model/"


def _layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


def _mlp_block(g, b, w1, b1, w2, b2, x):
    """Pre-norm GELU MLP with a residual: (batch, seq, dim) activations."""
    return (x + jax.nn.gelu(_layer_norm(x, g, b) @ w1 + b1) @ w2 + b2).sum()


def _norm_by_division(g, b, w1, b1, w2, b2, x):
    """The MLP block with its layer norm written as hand-written models often write it,
    dividing by a square root (``x:f[*,*,*] y:f[*,*,1]`` division, ``sqrt`` of the
    statistics) rather than multiplying by ``rsqrt``; applied twice, as stacked blocks
    are, so that the second norm's input depends on the parameters and the gradient runs
    through its statistics too (``x:f[*,*,1]`` products, ``neg``, ``integer_pow -2``)."""
    def block(x):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        h = (x - mu) / jnp.sqrt(var + 1e-5) * g + b
        return x + jax.nn.gelu(h @ w1 + b1) @ w2 + b2

    return block(block(x)).sum()


def _attention(g, b, wqkv, wo, x, heads=2):
    """Pre-norm causal self-attention: (batch, heads, seq, seq) scores, a masked softmax."""
    n, t, d = x.shape
    q, k, v = jnp.split(_layer_norm(x, g, b) @ wqkv, 3, axis=-1)
    q, k, v = (y.reshape(n, t, heads, d // heads).transpose(0, 2, 1, 3) for y in (q, k, v))
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(d // heads)
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
    out = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(n, t, d)
    return (x + out @ wo).sum()


def _lm_loss(emb, w, ids, targets):
    """Embedding lookup, a projection to the vocabulary, and cross-entropy."""
    logits = jnp.tanh(emb[ids] @ w) @ emb.T
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)
    return -picked.mean()


def _cnn(w1, w2, wd, x):
    """Two 3x3 convolutions (NCHW), max pooling and a classifier over the mean."""
    conv = lambda h, w: lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)),  # noqa: E731
                                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.relu(conv(x, w1))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    h = jax.nn.relu(conv(h, w2))
    return jax.nn.logsumexp(h.mean(axis=(2, 3)) @ wd, axis=-1).sum()


def _flax_layer_norm(x, scale, bias, eps=1e-6):
    """Flax's LayerNorm (nnx and linen): E[x^2] - E[x]^2 clipped at 0 (its fast variance),
    then rsqrt(var + eps) times the scale, the statistics and parameters reshaped to
    broadcast (``x:f[*,*,1]`` beside ``y:f[1,1,*]``)."""
    mu, mu2 = x.mean(-1), lax.square(x).mean(-1)
    var = jnp.maximum(0.0, mu2 - lax.square(mu))
    stats, feature = x.shape[:-1] + (1,), (1,) * (x.ndim - 1) + (x.shape[-1],)
    mul = lax.rsqrt(var.reshape(stats) + eps) * scale.reshape(feature)
    return (x - mu.reshape(stats)) * mul + bias.reshape(feature)


def _dense_general(x, kernel, bias, axes):
    """Flax's Linear / LinearGeneral / DenseGeneral: ``axes`` of x contracted with the
    kernel's leading dims (a [D, heads, head_dim] kernel for attention's projections), the
    bias reshaped to broadcast over the batch dims."""
    out = lax.dot_general(x, kernel, ((axes, tuple(range(len(axes)))), ((), ())))
    return out + bias.reshape((1,) * (x.ndim - len(axes)) + bias.shape)


def _flax_block(s1, b1, wq, bq, wk, bk, wv, bv, wo, bo, s2, b2, w1, c1, w2, c2, x):
    """A pre-norm transformer block as Flax's layers compute it (nnx.MultiHeadAttention,
    linen.MultiHeadDotProductAttention): heads kept as a dim of their own ([B, L, H, d]
    projections, einsum attention, no transposes in the forward), a causal mask as
    ``make_causal_mask`` builds it, a mean loss."""
    n, t, _ = x.shape
    q, k, v = (_dense_general(_flax_layer_norm(x, s1, b1), w, b, (2,)) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    scores = jnp.einsum("...qhd,...khd->...hqk", q, k)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (n, t))
    mask = jnp.expand_dims(positions[..., :, None] >= positions[..., None, :], -3).astype(jnp.float32)
    scores = jnp.where(mask.astype(bool), scores, jnp.finfo(scores.dtype).min)
    out = jnp.einsum("...hqk,...khd->...qhd", jax.nn.softmax(scores), v)
    x = x + _dense_general(out, wo, bo, (2, 3))
    h = jax.nn.gelu(_dense_general(_flax_layer_norm(x, s2, b2), w1, c1, (2,)))
    return (x + _dense_general(h, w2, c2, (2,))).mean()


def _sdpa_block(s1, b1, wq, bq, wk, bk, wv, bv, wo, bo, x):
    """Attention by ``jax.nn.dot_product_attention`` (XLA's form, which nnx.MultiHeadAttention
    takes when it keeps no weights and drops none, its default): heads regrouped as
    [B, L, heads per group, group, d] and the score math vmapped over the group, so its
    equations are rank 5 with a dim of 1 (``lhs:f[*,*,*,1,*]``); a causal mask as
    ``make_causal_mask`` builds it ([B, 1, L, L])."""
    n, t, _ = x.shape
    h = _flax_layer_norm(x, s1, b1)
    q, k, v = (_dense_general(h, w, b, (2,)) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (n, t))
    mask = jnp.expand_dims(positions[..., :, None] >= positions[..., None, :], -3)
    out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    return (x + _dense_general(out, wo, bo, (2, 3))).mean()


def _gqa_block(s1, wq, wk, wv, wo, s2, wg, wu, wd, x):
    """A Llama-style block: RMSNorm, grouped-query attention by ``jax.nn.dot_product_attention``
    (two query heads per key/value head: the rank-5 groups have no dim of 1) with its own
    causal mask (``is_causal``), and a SwiGLU MLP; no biases."""
    def rms(h, scale):
        return h * lax.rsqrt(jnp.mean(lax.square(h), -1, keepdims=True) + 1e-6) * scale

    h = rms(x, s1)
    q, k, v = (lax.dot_general(h, w, (((2,), (0,)), ((), ()))) for w in (wq, wk, wv))
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    x = x + lax.dot_general(out, wo, (((2, 3), (0, 1)), ((), ())))
    h = rms(x, s2)
    return (x + (jax.nn.silu(h @ wg) * (h @ wu)) @ wd).mean()


def _rope(x, halves: bool):
    """Rotary position embedding of [B, L, heads, d] queries or keys: each pair of a head's
    features rotated by its position times a frequency, computed in the program. Pairs
    interleaved (``x[..., ::2]`` beside ``x[..., 1::2]``, stacked back: Meta's reference
    Llama, most hand-written jax) or the two halves of the head (``rotate_half``, as in
    Hugging Face's Flax Llama: a negated half concatenated before the other)."""
    t, d = x.shape[1], x.shape[-1]
    # float32 written out: the sweep traces with x64 on, and a model's default float32
    # converts its integer positions to float32 (a dtype its signatures name)
    inv = 1.0 / (10000 ** (jnp.arange(0, d, 2).astype(jnp.float32) / d))
    angles = jnp.arange(t)[:, None] * inv[None]
    if halves:
        angles = jnp.concatenate([angles, angles], -1)
    cos, sin = jnp.cos(angles)[None, :, None], jnp.sin(angles)[None, :, None]
    if halves:
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + jnp.concatenate([-x2, x1], -1) * sin
    x1, x2 = x[..., ::2], x[..., 1::2]
    return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).reshape(x.shape)


def _rope_attention(wq, wk, wv, wo, x, halves=False):
    """Causal attention by ``jax.nn.dot_product_attention`` on rotary-embedded queries and
    keys (``_rope``), as Llama-style models compute it: the rotation's strided slices,
    stacks, pads (their gradients) and position arithmetic around the attention."""
    q, k, v = (lax.dot_general(x, w, (((2,), (0,)), ((), ()))) for w in (wq, wk, wv))
    out = jax.nn.dot_product_attention(_rope(q, halves), _rope(k, halves), v, is_causal=True, implementation="xla")
    return (x + lax.dot_general(out, wo, (((2, 3), (0, 1)), ((), ())))).mean()


def _rope_attention_halves(wq, wk, wv, wo, x):
    return _rope_attention(wq, wk, wv, wo, x, halves=True)


def _normal(*shape):
    return lambda r: (0.3 * r.standard_normal(shape)).astype(np.float32)


def _ones_plus(*shape):
    return lambda r: (1 + 0.1 * r.standard_normal(shape)).astype(np.float32)


def _ids(*shape, vocab):
    return lambda r: r.randint(0, vocab, shape).astype(np.int32)


D, HIDDEN, VOCAB = 8, 16, 12
_ROPE_PARAMS = (_normal(D, 2, D // 2), _normal(D, 2, D // 2), _normal(D, 2, D // 2), _normal(2, D // 2, D))
# name -> (loss, its parameters' makers, the data's makers); the gradients are the parameters'
_MODELS = {
    "mlp_block": (_mlp_block, (_ones_plus(D), _normal(D), _normal(D, HIDDEN), _normal(HIDDEN), _normal(HIDDEN, D),
                               _normal(D)), (_normal(2, 6, D),)),
    "attention": (_attention, (_ones_plus(D), _normal(D), _normal(D, 3 * D), _normal(D, D)), (_normal(2, 6, D),)),
    "lm_loss": (_lm_loss, (_normal(VOCAB, D), _normal(D, D)), (_ids(2, 6, vocab=VOCAB), _ids(2, 6, vocab=VOCAB))),
    "cnn": (_cnn, (_normal(4, 3, 3, 3), _normal(6, 4, 3, 3), _normal(6, 5)), (_normal(2, 3, 8, 8),)),
    "flax_block": (_flax_block, (_ones_plus(D), _normal(D), _normal(D, 2, D // 2), _normal(2, D // 2),
                                 _normal(D, 2, D // 2), _normal(2, D // 2), _normal(D, 2, D // 2), _normal(2, D // 2),
                                 _normal(2, D // 2, D), _normal(D), _ones_plus(D), _normal(D), _normal(D, HIDDEN),
                                 _normal(HIDDEN), _normal(HIDDEN, D), _normal(D)), (_normal(2, 6, D),)),
    "gqa_block": (_gqa_block, (_ones_plus(D), _normal(D, 4, D // 4), _normal(D, 2, D // 4), _normal(D, 2, D // 4),
                               _normal(4, D // 4, D), _ones_plus(D), _normal(D, HIDDEN), _normal(D, HIDDEN),
                               _normal(HIDDEN, D)), (_normal(2, 6, D),)),
    "sdpa_block": (_sdpa_block, (_ones_plus(D), _normal(D), _normal(D, 2, D // 2), _normal(2, D // 2),
                                 _normal(D, 2, D // 2), _normal(2, D // 2), _normal(D, 2, D // 2), _normal(2, D // 2),
                                 _normal(2, D // 2, D), _normal(D)), (_normal(2, 6, D),)),
    # named to sort after the programs before them: a signature another program makes too
    # keeps that program's call as its example where the calls tie (backend._preference)
    "sdpa_rope": (_rope_attention, _ROPE_PARAMS, (_normal(2, 6, D),)),
    "sdpa_rope_halves": (_rope_attention_halves, _ROPE_PARAMS, (_normal(2, 6, D),)),
    "norm_by_division": (_norm_by_division, (_ones_plus(D), _normal(D), _normal(D, HIDDEN), _normal(HIDDEN),
                                             _normal(HIDDEN, D), _normal(D)), (_normal(2, 6, D),)),
}


def _program(name: str) -> Program:
    loss, params, data = _MODELS[name]
    grad = jax.value_and_grad(loss, argnums=tuple(range(len(params))))

    def make_args(seed: int) -> list:
        r = np.random.RandomState(seed)
        return [m(r) for m in params + data]

    return Program(PREFIX + name, grad, make_args)


def model_programs() -> list[Program]:
    return [_program(name) for name in sorted(_MODELS)]


def is_model(program: Program) -> bool:
    return program.name.startswith(PREFIX)
