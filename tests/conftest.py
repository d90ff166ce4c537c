import random
import time

import pytest


@pytest.fixture(autouse=True)
def _seeded():
    """Tests draw example data from the global generators: make every run the same."""
    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(0)
    except ImportError:
        pass


@pytest.fixture(scope="session")
def fake_world_of():
    """``fake_world_of(n)``: a fake process group of at least n ranks. One started smaller
    (the cross-check's real-DTensor replay starts one of 2) is replaced, so test modules
    that plan on different meshes run in any order."""
    def start(size: int) -> None:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() < size:
            dist.destroy_process_group()
        if not dist.is_initialized():
            dist.init_process_group("fake", rank=0, world_size=size)

    return start


def _stops_growing(path, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        before = path.stat().st_size
        time.sleep(0.5)
        if path.stat().st_size == before:
            return True
    return False


@pytest.fixture
def stops_growing():
    """``stops_growing(path, within=5.0)``: does a file its writer appends to every 0.1 s
    stop growing (the writer gone) within ``within`` seconds?"""
    return _stops_growing
