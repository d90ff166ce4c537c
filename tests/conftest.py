import random

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
