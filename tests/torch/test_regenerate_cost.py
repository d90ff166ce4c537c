"""Regenerating a sample stays cheap without changing it: the CPU generator alone is seeded
(torch.manual_seed queued a seeding of each lazy device, with a formatted stack, per draw),
and composite_kernels reinstalls one recording kernel per overload and restores torch's own."""

import random

import numpy
import torch

from metaspmd.backends.torch import composite_calls, samples


def _inputs(seed: int) -> list[torch.Tensor]:
    info = samples._opinfo("mm", "")
    return [s.input for _, s in samples._samples_of(info, "forward", torch.float32, seed, 3)]


def test_samples_are_those_torch_manual_seed_gave_and_queue_nothing():
    queued = [len(m._queued_calls) for m in (torch.cuda, torch.xpu)]
    got = _inputs(5)
    assert [len(m._queued_calls) for m in (torch.cuda, torch.xpu)] == queued
    # the former seeding by hand: every generator, then the OpInfo's samples
    info = samples._opinfo("mm", "")
    torch.manual_seed(5)
    random.seed(5)
    numpy.random.seed(5)
    it = samples._sample_iter(info, "forward", torch.float32)
    want = [next(it).input for _ in range(3)]
    assert len(got) == 3 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert not torch.equal(got[0], _inputs(6)[0])


def test_composite_kernels_reinstall_one_kernel_and_restore_torchs():
    einsum, upsample = torch.ops.aten.einsum.default, torch.ops.aten.upsample_nearest2d.default
    cia = torch._C.DispatchKey.CompositeImplicitAutograd
    before = {f: dict(f.py_kernels) for f in (einsum, upsample)}
    kernels = []
    for _ in range(2):
        with composite_calls.composite_kernels():
            kernels.append(einsum.py_kernels[cia])
            # torch's Python kernels at the autograd keys set aside (upsample has both)
            assert not any(k in upsample.py_kernels for k in composite_calls._AUTOGRAD_KEYS)
            seen = []
            with composite_calls.CompositeRecorder(lambda f, a, k: seen.append(f)):
                torch.einsum("ij,jk->ik", torch.ones(2, 3), torch.ones(3, 4))
            assert einsum in seen
        assert {f: dict(f.py_kernels) for f in (einsum, upsample)} == before
    assert kernels[0] is kernels[1]


def test_shapes_of_walks_arguments_as_torchs_pytree_did():
    import collections

    from torch.utils._pytree import tree_map

    def by_torch(args, kwargs):
        out = []
        tree_map(lambda x: out.append(tuple(x.shape)) if isinstance(x, torch.Tensor) else None, (list(args), dict(kwargs)))
        return out

    pair = collections.namedtuple("Pair", "a b")
    calls = [
        ((torch.ones(2, 3), [torch.ones(1), 3, (torch.ones(4, 5),)], torch.Size([2, 2])),
         {"w": torch.ones(7), "z": None, "q": {"r": torch.ones(1, 1)}}),
        ((pair(torch.ones(2), 1),), {}),
        ((), {"b": torch.ones(3), "a": torch.ones(0, 2)}),
    ]
    for args, kwargs in calls:
        assert samples.shapes_of(args, kwargs) == by_torch(args, kwargs)
    assert samples.shapes_of(*calls[0]) == [(2, 3), (1,), (4, 5), (7,), (1, 1)]


def test_a_regenerated_call_is_kept_and_handed_out_as_copies(monkeypatch):
    from metaspmd.backends.torch import get_backend

    call = next(c for c in get_backend(opinfos=("mm",)).index["aten.mm.default"] if c.regenerable)
    samples._REGENERATED.clear()
    runs = []
    rebuild = samples._regenerated_calls

    def counted(*a):
        runs.append(a)
        return rebuild(*a)

    monkeypatch.setattr(samples, "_regenerated_calls", counted)
    first, again = samples.regenerate(call, 7), samples.regenerate(call, 7)
    assert len(runs) == 1  # the sample ran once
    assert all(torch.equal(a, b) and a is not b for a, b in zip(first[0], again[0]))
    first[0][0].fill_(0)  # a caller's own copy: writing it changes no later call
    assert torch.equal(samples.regenerate(call, 7)[0][0], again[0][0]) and len(runs) == 1
    other = samples.regenerate(call, 8)
    assert len(runs) == 2 and not torch.equal(other[0][0], again[0][0])
    samples._REGENERATED.clear()  # nothing from the counted runs outlives the test
    assert [a.shape for a in samples.regenerate(call, 7)[0]] == [a.shape for a in call.args]
