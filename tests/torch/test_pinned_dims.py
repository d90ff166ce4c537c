"""Dims a kernel reads by an int argument, unchecked (catalog.PINNED_DIMS): pinned in the
signature, so the explorer never lengthens them into calls the op is not defined for,
which refuted true rules."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import catalog, hand_samples  # noqa: E402
from metaspmd.backends.torch.backend import torch_case  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402

DYN_QUANT = "aten._dyn_quant_matmul_4bit.default"


def _sample(seed: int = 0):
    func = catalog.resolve(DYN_QUANT)
    guess = hand_samples.guess_for(func)
    return func, guess, hand_samples.inputs(func, guess, seed)


def test_dyn_quant_matmul_reads_a_wider_inp_askew():
    # why its inp width is pinned: the kernel does not check it against in_features
    func, _, (args, kwargs) = _sample()
    named = dict(zip(catalog.positional_names(func), args), **kwargs)
    inp = named.pop("inp")
    wide = torch.cat([inp, torch.randn(inp.shape[0], 2)], 1)
    rows = func(wide, **named)
    assert rows.shape == (inp.shape[0], named["out_features"])
    assert not torch.allclose(rows[1], func(wide[1:2], **named)[0])  # row 1 read from the wrong place


def test_dyn_quant_matmul_gets_its_row_cut():
    func, guess, (args, kwargs) = _sample()
    assert catalog.exact_sizes(func) == {"inp": slice(-1, None)}
    case = torch_case(func, args, kwargs, func, lambda seed: hand_samples.inputs(func, guess, seed))
    entry = explore_case(case, TorchOps())
    assert entry.status == "ok", entry.reason
    assert entry.signature.startswith("inp:f[*,32] "), entry.signature  # the width keys the rule
    assert [(str(s.inputs[0]), str(s.outputs[0])) for s in entry.all_strategies()] == [("S(0)", "gather(dim=0)")]
