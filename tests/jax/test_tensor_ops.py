"""JaxOps: the tensor protocol on jax arrays."""

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from metaspmd.tensor_ops import BOOL, COMPLEX, FLOAT, INT, OTHER, TensorOps  # noqa: E402


def test_protocol_and_kinds(ops):
    assert isinstance(ops, TensorOps)
    assert ops.dtype_kind(jnp.ones(2, jnp.float64)) == FLOAT
    assert ops.dtype_kind(jnp.ones(2, jnp.complex128)) == COMPLEX
    assert ops.dtype_kind(jnp.ones(2, jnp.uint8)) == INT
    assert ops.dtype_kind(jnp.ones(2, bool)) == BOOL
    assert ops.dtype_kind(jax.random.split(jax.random.key(0), 2)) == OTHER
    assert ops.dtype_name(jnp.ones(2, jnp.float64)) == "float64"
    assert not ops.is_tensor(np.ones(2)) and ops.is_tensor(jnp.ones(2))


def test_narrow_concat_round_trip_keeps_dtype(ops):
    x = ops.random_like(jnp.zeros((5, 4), jnp.float64), seed=1)
    parts = [ops.narrow(x, 0, 0, 2), ops.narrow(x, 0, 2, 3)]
    assert [ops.shape(p) for p in parts] == [(2, 4), (3, 4)]
    back = ops.concat(parts, 0)
    assert back.dtype == jnp.float64 and ops.close(back, x)


def test_elementwise_and_bool_semantics(ops):
    a, b = jnp.array([1.0, -2.0]), jnp.array([3.0, 5.0])
    assert np.array_equal(np.asarray(ops.add(a, b)), [4.0, 3.0])
    assert np.array_equal(np.asarray(ops.sub(a, b)), [-2.0, -7.0])
    assert np.array_equal(np.asarray(ops.maximum(a, b)), [3.0, 5.0])
    assert np.array_equal(np.asarray(ops.scale(a, 0.5)), [0.5, -1.0])
    t, f = jnp.array([True, False]), jnp.array([False, False])
    assert ops.add(t, f).dtype == bool and np.array_equal(np.asarray(ops.add(t, f)), [True, False])
    assert np.array_equal(np.asarray(ops.multiply(t, f)), [False, False])


def test_close_tolerances(ops):
    x = jnp.array([1.0, 2.0, np.nan], jnp.float64)
    assert ops.close(x, x + 1e-12)  # float64: tight, NaN matches NaN
    assert not ops.close(x, x + 1e-5)
    y = jnp.array([1.0, 2.0], jnp.float32)
    assert ops.close(y, y + 1e-6) and not ops.close(y, y + 1e-2)
    assert not ops.close(jnp.array([1, 2]), jnp.array([1, 3]))  # integers: exact
    assert not ops.close(jnp.ones((2, 1)), jnp.ones((1, 2)))  # shapes must match
    keys = jax.random.split(jax.random.key(0), 3)
    assert ops.close(keys, ops.concat([ops.narrow(keys, 0, 0, 1), ops.narrow(keys, 0, 1, 2)], 0))


def test_random_like_is_signed_and_seeded(ops):
    f = ops.random_like(jnp.zeros((50,), jnp.float64), seed=3)
    assert (np.asarray(f) < 0).any() and (np.asarray(f) > 0).any()
    assert ops.close(f, ops.random_like(jnp.zeros((50,), jnp.float64), seed=3))
    assert not ops.close(f, ops.random_like(jnp.zeros((50,), jnp.float64), seed=4))
    i = np.asarray(ops.random_like(jnp.zeros((200,), jnp.int8), seed=0))
    assert i.dtype == np.int8 and i.min() < 0 < i.max()
    u = np.asarray(ops.random_like(jnp.zeros((200,), jnp.uint8), seed=0))
    assert u.dtype == np.uint8 and len(np.unique(u)) > 50
    b = np.asarray(ops.random_like(jnp.zeros((50,), bool), seed=0))
    assert b.any() and not b.all()


def test_a_worker_with_the_reproducible_environment_caps_xla_at_avx2():
    """Sweep workers start with metaspmd.reproducible.ENV; there the backend caps XLA's CPU
    code at AVX2 before jax starts, as torch's kernels are. A user's process keeps its own."""
    from metaspmd import reproducible
    from metaspmd.backends.jax import get_backend

    code = ("import os; from metaspmd.backends.jax import get_backend; get_backend(); import jax.numpy as jnp; "
            "assert float(jnp.sinh(jnp.arange(4.0)).sum()) > 0; print(os.environ.get('XLA_FLAGS', ''))")

    worker = subprocess.run([sys.executable, "-c", code], env=reproducible.child_env(), capture_output=True, text=True,
                            check=True).stdout
    assert "--xla_cpu_max_isa=AVX2" in worker
    assert not reproducible.in_effect()  # this test process: a user's
    get_backend()
    assert "--xla_cpu_max_isa" not in os.environ.get("XLA_FLAGS", "")
