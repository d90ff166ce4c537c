"""TorchOps.close's shortcut for plain CPU tensors gives close_tensors' verdict on every
kind of pair, the ones it hands on included (grad, conj and neg bits, sparse, bfloat16)."""

import torch

from backends.torch.tensor_ops import TorchOps
from metaspmd.tensor_ops import close_tensors

OPS = TorchOps()


def pairs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64)
    near = x * (1 + 1e-9)
    far = x + 1e-3
    yield x, x.clone()
    yield x, near
    yield x, far
    yield x, x.T.contiguous()  # another shape
    yield x, x.float()  # another dtype, the same kind
    yield x.float(), x.float() + 1e-6
    yield x.requires_grad_(False).clone().requires_grad_(True), x  # grad: numpy() refuses it
    c = torch.complex(x, far)
    yield c, c.clone()
    yield c.conj(), c.conj().resolve_conj()  # a conj bit
    yield torch.neg(c.conj()).imag, (-c.conj().resolve_conj()).imag  # a neg bit
    yield x.to_sparse(), x.to_sparse()  # sparse: compared through its dense values
    yield x.to_sparse(), far.to_sparse()
    yield x.bfloat16(), x.bfloat16()
    yield x.bfloat16(), (x + 1).bfloat16()
    i = torch.randint(-5, 5, (3, 3), generator=g)
    yield i, i.clone()
    yield i, i + 1
    b = i > 0
    yield b, b.clone()
    yield b, ~b
    yield torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0])
    yield torch.tensor([float("inf"), 1.0], dtype=torch.float32), torch.tensor([3.3e38, 1.0], dtype=torch.float32)
    yield torch.zeros(0, 3), torch.zeros(0, 3)


def test_torch_close_gives_close_tensors_verdict():
    verdicts = []
    for a, e in pairs():
        expected = close_tensors(OPS, a, e)
        assert OPS.close(a, e) == expected, (a, e)
        verdicts.append(expected)
    assert any(verdicts) and not all(verdicts)
