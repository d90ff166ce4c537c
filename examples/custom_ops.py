"""A custom op of the kind users write (``torch.library.custom_op``): a fused RMSNorm, with
its fake kernel for tracing and its backward. DTensor has no rule for it and no table
holds one: ``parallelize`` explores it live, and ``dtensor_rules.register_op`` installs
its rules into DTensor. Swept offline, its rules go into a registry of their own:

    python tools/sweep.py --backend torch --kernels examples/custom_ops.py --out my_registry

``METASPMD_EXAMPLES`` gives calls whose signatures the sweep explores (a sequence of
hidden vectors and a weight per feature); ``METASPMD_MODELS`` gives models, which the sweep
runs forward and backward to record every call they make of the module's ops. An op
without either gets one schema-built call.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("metaspmd_examples::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


def _save(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
    scaled = grad * weight
    grad_x = r * scaled - x * r.pow(3) * (scaled * x).mean(-1, keepdim=True)
    return grad_x, (grad * x * r).sum(dim=tuple(range(x.dim() - 1))), None


rms_norm.register_autograd(_backward, setup_context=_save)


class RMSNormed(torch.nn.Module):
    """A linear layer normalized by the custom op."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(self.fc(x), self.weight, 1e-6)


# The signatures a model calls the op with: batch x sequence x hidden, and tokens x hidden
METASPMD_EXAMPLES = {
    "metaspmd_examples::rms_norm": [
        ((torch.randn(4, 6, 8), torch.randn(8), 1e-6), {}),
        ((torch.randn(6, 8), torch.randn(8), 1e-6), {}),
    ],
}

# Models that call it, each built by a function returning (model, inputs): the sweep
# records their calls (here a batch of 4-D activations: batch x heads x sequence x hidden)
METASPMD_MODELS = [
    lambda: (RMSNormed(8), (torch.randn(2, 3, 4, 8),)),
]
