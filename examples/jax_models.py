"""Small JAX models used by the examples, tests and benchmarks: ``fn(params, x)``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * g + b


def gpt_block(p, x, heads=4):
    """Pre-norm transformer block: causal self-attention and a GELU MLP."""
    b, t, d = x.shape
    h = layer_norm(x, p["ln1_g"], p["ln1_b"])
    q, k, v = jnp.split(h @ p["w_qkv"] + p["b_qkv"], 3, axis=-1)
    q, k, v = (y.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for y in (q, k, v))
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(d // heads)
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
    att = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + att @ p["w_o"] + p["b_o"]
    h = layer_norm(x, p["ln2_g"], p["ln2_b"])
    return x + jax.nn.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def gpt_params(d=32, hidden=128, seed=0):
    k = jax.random.split(jax.random.key(seed), 8)

    def n(i, shape):
        # Matrices scaled by 1/sqrt(fan_in) as nn.Linear's init does, so activations stay O(1)
        # at any width and float32 rounding stays small next to the one-device comparison.
        scale = 0.2 if len(shape) == 1 else 1 / math.sqrt(shape[0])
        return scale * jax.random.normal(k[i], shape, jnp.float32)

    zeros = lambda n_: jnp.zeros((n_,), jnp.float32)  # noqa: E731
    return dict(ln1_g=1 + n(0, (d,)), ln1_b=n(1, (d,)), w_qkv=n(2, (d, 3 * d)), b_qkv=zeros(3 * d),
                w_o=n(3, (d, d)), b_o=zeros(d), ln2_g=1 + n(4, (d,)), ln2_b=n(5, (d,)),
                w1=n(6, (d, hidden)), b1=zeros(hidden), w2=n(7, (hidden, d)), b2=zeros(d))


def lm(p, ids, vocab=256):
    """An embedding, a GPT block and cross-entropy against the next token, the output
    projection tied to the embedding."""
    h = gpt_block(p["block"], p["emb"][ids])
    logits = layer_norm(h, p["ln_g"], p["ln_b"]) @ p["emb"].T
    targets = jnp.roll(ids, -1, axis=1)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1).mean()


def lm_params(vocab=256, d=32, seed=0):
    k = jax.random.split(jax.random.key(seed), 2)
    return dict(emb=0.1 * jax.random.normal(k[0], (vocab, d), jnp.float32), block=gpt_params(d, 4 * d, seed + 1),
                ln_g=jnp.ones((d,), jnp.float32), ln_b=jnp.zeros((d,), jnp.float32))
