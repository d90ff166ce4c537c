"""Small models whose ATen calls, forward and backward, are extra samples for the sweep.

OpInfo samples exercise each op's corners (broadcasting, 0-d and empty tensors, odd
arguments), rarely the shapes models call it with: rank-3 activations added to rank-3
activations, a transposed 2-D weight, ``addmm`` with a 1-D bias and default scales, a
softmax over the last dim of rank-4 attention scores. A runtime looks rules up by
signature, so those calls missed the table and were explored live. Each program here is
built under a fixed seed and run forward and backward under the recorder that also serves
``--kernels`` models (``model_calls``); its calls of a signature no OpInfo sample has are
explored beside the OpInfo ones. A composite overload's calls are explored only where no
OpInfo sample reaches it: DTensor and a captured graph see its decomposition, never the
op itself, so a model's signature of it serves no lookup. Sizes are small and distinct,
so every dim is ``*`` and no two dims are the same size by accident.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._pytree import tree_leaves

from . import catalog
from .capture import capture
from .model_calls import Calls, built, model_calls, unique_calls
from .samples import BASE_SEED

B, T, D, H, V = 2, 6, 8, 2, 10  # batch, sequence, width, heads, vocabulary
MAX_MODEL_SIGNATURES = 4  # explored per overload beyond its OpInfo ones


class _Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and a GELU MLP."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, 3 * D), nn.Linear(3 * D, D)

    def forward(self, x):
        q, k, v = self.qkv(self.norm1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (D // H) ** 0.5
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        attn = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def _transformer() -> tuple[nn.Module, tuple]:
    # its input needs no gradient, as a first block's features do: the first norm's
    # backward leaves out its input's (output_mask [False, True, True]), the second's not
    return _Block(), (torch.randn(B, T, D),)


def _mlp() -> tuple[nn.Module, tuple]:
    return nn.Sequential(nn.Linear(D, 3 * D), nn.ReLU(), nn.Linear(3 * D, D)), (torch.randn(B, D, requires_grad=True),)


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(4 * 3 * 3, V)

    def forward(self, x, target):
        y = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return F.cross_entropy(self.fc(y.flatten(1)), target)


def _convnet() -> tuple[nn.Module, tuple]:
    return _ConvNet(), (torch.randn(B, 3, 6, 6), torch.randint(0, V, (B,)))


class _LanguageModel(nn.Module):
    """An embedding, a norm and a tied output layer under cross-entropy."""

    def __init__(self):
        super().__init__()
        self.embed, self.norm = nn.Embedding(V, D), nn.LayerNorm(D)

    def forward(self, tokens, target):
        logits = self.norm(self.embed(tokens)) @ self.embed.weight.t()
        return F.cross_entropy(logits.view(-1, V), target.view(-1))


def _language_model() -> tuple[nn.Module, tuple]:
    return _LanguageModel(), (torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T)))


RB, RH = 3, 5  # the recurrent program's batch and hidden width: unlike its layer counts (1, 2)


class _Recurrent(nn.Module):
    """LSTM, GRU and Elman layers and cells, which no OpInfo sample calls: a 2-layer LSTM,
    a bidirectional batch-first GRU, tanh and ReLU RNNs, then one step of each cell. No
    dropout between layers, so no call draws random numbers."""

    def __init__(self):
        super().__init__()
        self.lstm, self.gru = nn.LSTM(D, RH, num_layers=2), nn.GRU(RH, RH, bidirectional=True, batch_first=True)
        self.tanh_rnn, self.relu_rnn = nn.RNN(2 * RH, RH), nn.RNN(RH, RH, nonlinearity="relu")
        self.lstm_cell, self.gru_cell = nn.LSTMCell(RH, RH), nn.GRUCell(RH, RH)
        self.tanh_cell, self.relu_cell = nn.RNNCell(RH, RH), nn.RNNCell(RH, RH, nonlinearity="relu")

    def forward(self, x):  # x: [T, RB, D]
        y, _ = self.lstm(x)
        y, _ = self.gru(y.transpose(0, 1))
        y, _ = self.tanh_rnn(y.transpose(0, 1))
        y, h = self.relu_rnn(y)
        h, c = self.lstm_cell(y[-1], (h[0], y[0]))
        h = self.gru_cell(h, c)
        return self.relu_cell(self.tanh_cell(h), h)


def _recurrent() -> tuple[nn.Module, tuple]:
    return _Recurrent(), (torch.randn(T, RB, D, requires_grad=True),)


class _Layers(nn.Module):
    """Layers whose CPU kernels no OpInfo sample calls: a weight-normed linear layer
    (``_weight_norm_interface``) and an LSTM over a packed batch of sequences of lengths 6,
    6 and 4 (``_pack_padded_sequence``, ``lstm.data``, ``_pad_packed_sequence``): every step
    has two sequences or more, so no call is one row by accident."""

    def __init__(self):
        super().__init__()
        self.linear = nn.utils.parametrizations.weight_norm(nn.Linear(D, V))
        self.lstm = nn.LSTM(V, RH)

    def forward(self, x):  # x: [T, RB, D]
        packed = nn.utils.rnn.pack_padded_sequence(self.linear(x), torch.tensor([T, T, 4]))
        return nn.utils.rnn.pad_packed_sequence(self.lstm(packed)[0])[0]


def _layers() -> tuple[nn.Module, tuple]:
    return _Layers(), (torch.randn(T, RB, D, requires_grad=True),)


def _inference() -> tuple[Callable, tuple]:
    """The inference fast paths of a transformer encoder layer and of multi-head attention
    (``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``): taken in eval
    mode with nothing requiring grad, so this program runs forward only."""
    layer = nn.TransformerEncoderLayer(D, H, 3 * D, batch_first=True).eval().requires_grad_(False)
    attention = nn.MultiheadAttention(D, H, batch_first=True).eval().requires_grad_(False)

    def run(x):
        y = layer(x)
        return attention(y, y, y, need_weights=False)[0]

    return run, (torch.randn(B, T, D),)


MODEL_PROGRAMS: dict[str, Callable[[], tuple[Callable, tuple]]] = {
    "transformer": _transformer, "mlp": _mlp, "convnet": _convnet, "language_model": _language_model,
    "recurrent": _recurrent, "layers": _layers, "inference": _inference,
}


# Arguments that name the programs' own sizes (view's, expand's, split's): no other model
# would call an op with them, so such calls are left out, as are factories (no tensor input).
SIZE_ARGS = frozenset({"size", "shape", "sizes", "split_size", "split_sizes"})


# Programs whose captured graphs are left out, and why
UNCAPTURED = {
    "layers": "pad_packed_sequence reads batch_sizes' values, which a trace has none of",
    "recurrent": "three seconds of tracing per sweep and test run for one signature (sigmoid of a [batch, hidden] gate)",
}


def captured_calls() -> dict[str, list[tuple[tuple, dict]]]:
    """The calls of each program's graph as the runtime captures it (``capture``: forward
    and backward, functionalized, without oneDNN), by overload name, in program order:
    a graph calls some ops eager code never does (``_native_batch_norm_legit_functional``
    where eager BatchNorm calls ``native_batch_norm``; an LSTM's per-step ``sigmoid``)."""
    calls: dict[str, list[tuple[tuple, dict]]] = {}
    for k, (name, make) in enumerate(MODEL_PROGRAMS.items()):
        if name in UNCAPTURED:
            continue
        with built(make, BASE_SEED + k) as (model, inputs):  # as model_calls builds program k
            captured = capture(model, tuple(inputs), backward=isinstance(model, nn.Module))
        found = Calls(frozenset({catalog.NAMESPACE}))
        for node in captured.ir.op_list:
            found.record(node.fn, *captured.values[node.name])
        for func, call in found.calls:
            calls.setdefault(catalog.op_name(func), []).append(call)
    return calls


def program_calls() -> dict[str, list[tuple[tuple, dict]]]:
    """The programs' ATen calls, forward and backward, composite overloads' included, then
    those of their captured graphs, by overload name: the first call of each signature, in
    that order, those of size-naming ops and factories left out."""
    calls = model_calls(list(MODEL_PROGRAMS.values()), frozenset({catalog.NAMESPACE}), __name__, composite=True)
    for op, found in captured_calls().items():
        calls[op] = unique_calls(catalog.resolve(op), calls.get(op, []) + found)
    return {
        op: found for op, found in calls.items()
        if not SIZE_ARGS & {a.name for a in catalog.resolve(op)._schema.arguments}
        and any(isinstance(x, torch.Tensor) for x in tree_leaves(found[0]))
    }


__all__ = ["MAX_MODEL_SIGNATURES", "MODEL_PROGRAMS", "SIZE_ARGS", "UNCAPTURED", "captured_calls", "program_calls"]

