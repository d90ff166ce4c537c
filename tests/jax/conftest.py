import pytest


@pytest.fixture(scope="session")
def backend():
    from metaspmd.backends.jax import get_backend

    return get_backend()


@pytest.fixture(scope="session")
def ops(backend):
    return backend.tensor_ops()
