"""A random factory runs under a fixed seed of the CPU generator alone: the same draws as
torch.manual_seed gave, the caller's generator state kept, and no lazy device seeded."""

import torch

from metaspmd.backends.torch import random_ops

RANDN = torch.ops.aten.randn.default


def _seeded_randn() -> torch.Tensor:
    fn, note = random_ops.checked_form(RANDN, RANDN, ([4, 3],), {"dtype": torch.float32, "device": "cpu"})
    assert note == random_ops.FACTORY_NOTE
    return fn([4, 3], dtype=torch.float32, device="cpu")


def test_a_factory_draws_what_torch_manual_seed_gave_and_keeps_the_callers_state(monkeypatch):
    seeded_devices = []
    for module in (torch.cuda, torch.xpu, torch.mtia):
        monkeypatch.setattr(module, "manual_seed_all", lambda seed, m=module.__name__: seeded_devices.append(m))
    torch.default_generator.manual_seed(123)
    state = torch.get_rng_state()
    got = _seeded_randn()
    assert torch.equal(torch.get_rng_state(), state)  # the caller's draws go on as before
    assert seeded_devices == []
    monkeypatch.undo()
    # the former seeding: every device's generator, then the draw
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(random_ops.FACTORY_SEED)
        want = RANDN([4, 3], dtype=torch.float32, device="cpu")
    assert torch.equal(got, want) and torch.equal(_seeded_randn(), want)
    assert not torch.equal(got, torch.randn(4, 3))
