"""Float8 tensors in the explorer: the CPU has no arithmetic or random draws in float8
(only conversions, copies and _scaled_mm), so TorchOps draws and computes in float32 and
rounds back, and _scaled_mm's rules are found and verified like any matmul's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import catalog, hand_samples  # noqa: E402
from metaspmd.backends.torch.backend import torch_case  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402

ops = TorchOps()
FP8 = torch.float8_e4m3fn


def test_the_cpu_does_no_float8_arithmetic():
    # why TorchOps upcasts: should torch gain these kernels, the detour can go
    x = torch.ones(3, dtype=FP8)
    for f in (lambda: x + x, lambda: torch.maximum(x, x), lambda: torch.randn(3, dtype=FP8)):
        with pytest.raises((NotImplementedError, RuntimeError)):
            f()


def test_float8_draws_and_arithmetic_round_back():
    x = torch.zeros(4, 5, dtype=FP8)
    a, b = ops.random_like(x, 1), ops.random_like(x, 2)
    assert a.dtype == FP8 and a.shape == x.shape and not torch.equal(a.float(), b.float())
    assert torch.equal(ops.random_like(x, 1).float(), a.float())  # one seed, one draw
    for got, want in [(ops.add(a, b), a.float() + b.float()), (ops.sub(a, b), a.float() - b.float()),
                      (ops.maximum(a, b), torch.maximum(a.float(), b.float())), (ops.scale(a, 0.5), a.float() * 0.5),
                      (ops.concat([a, b], 0), torch.cat([a.float(), b.float()])), (ops.narrow(a, 1, 1, 3), a.float()[:, 1:4])]:
        assert got.dtype == FP8 and torch.equal(got.float(), want.to(FP8).float())
    assert ops.close(ops.add(a, b), ops.add(b, a)) and not ops.close(a, b)


@pytest.mark.parametrize("name", ["aten._scaled_mm.default", "aten._scaled_mm_v2.default"])
def test_scaled_mm_gets_matmul_rules(name):
    func = catalog.resolve(name)
    guess = hand_samples.guess_for(func)
    args, kwargs = hand_samples.inputs(func, guess, 0)
    case = torch_case(func, args, kwargs, func, lambda seed: hand_samples.inputs(func, guess, seed))
    entry = explore_case(case, ops)
    assert entry.status == "ok", entry.reason
    # M and N cut as gathers, K as a sum of partial products, each scale a Partial sum
    assert str(entry.shard).startswith("[[S1, S2], [S2, S3]"), entry.shard
    assert {str(c) for s in entry.all_strategies() for o in s.outputs for c in o.options} == {
        "gather(dim=0)", "gather(dim=1)", "reduce(sum)"}
