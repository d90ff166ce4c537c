"""Programs shaped like the models users bring to ``parallelize``: each one a small model's
loss and its gradients (``jax.value_and_grad``), so both passes' equations are in it.

jax's harnesses call each primitive on one or two ranks, mostly without broadcasting; a
model's graph holds rank-3 and rank-4 activations, biases and statistics broadcast against
them (``x:f[*,*,*] y:f[*,*,1]``), reductions over the last axis, attention's batched
matmuls and a loss over a vocabulary. The sweep explores these signatures as well
(``backend.MODEL_CASES`` per primitive, beyond the harnesses' own), so the table holds them
and ``parallelize`` looks them up instead of exploring them live. Arguments are flat
arrays: a program's jaxpr takes them as its inputs.
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


def _normal(*shape):
    return lambda r: (0.3 * r.standard_normal(shape)).astype(np.float32)


def _ones_plus(*shape):
    return lambda r: (1 + 0.1 * r.standard_normal(shape)).astype(np.float32)


def _ids(*shape, vocab):
    return lambda r: r.randint(0, vocab, shape).astype(np.int32)


D, HIDDEN, VOCAB = 8, 16, 12
# name -> (loss, its parameters' makers, the data's makers); the gradients are the parameters'
_MODELS = {
    "mlp_block": (_mlp_block, (_ones_plus(D), _normal(D), _normal(D, HIDDEN), _normal(HIDDEN), _normal(HIDDEN, D),
                               _normal(D)), (_normal(2, 6, D),)),
    "attention": (_attention, (_ones_plus(D), _normal(D), _normal(D, 3 * D), _normal(D, D)), (_normal(2, 6, D),)),
    "lm_loss": (_lm_loss, (_normal(VOCAB, D), _normal(D, D)), (_ids(2, 6, vocab=VOCAB), _ids(2, 6, vocab=VOCAB))),
    "cnn": (_cnn, (_normal(4, 3, 3, 3), _normal(6, 4, 3, 3), _normal(6, 5)), (_normal(2, 3, 8, 8),)),
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
