"""Primitives run for exploration (eager.bind): jax's values within rounding, one
executable per primitive, params and operand types, and jax's own errors."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax._src import core  # noqa: E402

from metaspmd.backends.jax import eager  # noqa: E402


def _rand(*shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


_CALLS = [  # (primitive, operands, params): elementwise, reductions, contractions, scans, sorts, arg-reductions
    (lax.tanh_p, [_rand(7, 5)], {"accuracy": None}),
    (lax.rsqrt_p, [np.abs(_rand(9, dtype=np.float32)) - 0.2], {"accuracy": None}),  # NaN where negative
    (lax.reduce_sum_p, [_rand(6, 11)], {"axes": (1,), "out_sharding": None}),
    (lax.dot_general_p, [_rand(3, 4, 5), _rand(3, 5, 2, seed=1)],
     {"dimension_numbers": (((2,), (1,)), ((0,), (0,))), "precision": None, "preferred_element_type": jnp.float64,
      "out_sharding": None}),
    (lax.cumsum_p, [_rand(10, 3)], {"axis": 0, "reverse": False}),
    (lax.sort_p, [_rand(8), np.arange(8)], {"dimension": 0, "is_stable": True, "num_keys": 1}),
    (lax.argmax_p, [_rand(4, 6)], {"axes": (1,), "index_dtype": jnp.int32}),
]


@pytest.mark.parametrize("prim, operands, params", _CALLS, ids=[c[0].name for c in _CALLS])
def test_values_are_jaxs_own_within_rounding(prim, operands, params):
    light = eager.bind(prim, operands, params)
    plain = prim.bind(*operands, **params)
    for a, b in zip(jax.tree.leaves(light), jax.tree.leaves(plain)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype.kind in "fc":
            ulp = np.finfo(a.dtype).eps
            np.testing.assert_allclose(a, b, rtol=4 * ulp, atol=0, equal_nan=True)
            assert np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(np.isinf(a), np.isinf(b))
        else:
            assert np.array_equal(a, b)


def test_one_executable_per_primitive_params_and_types():
    x = _rand(5, 4)
    before = eager._compiled.cache_info()
    eager.bind(lax.exp_p, [x], {"accuracy": None})
    eager.bind(lax.exp_p, [x + 1], {"accuracy": None})  # same types: the same jitted call
    eager.bind(lax.exp2_p, [x], {"accuracy": None})
    after = eager._compiled.cache_info()
    assert after.hits - before.hits >= 1 and after.misses - before.misses <= 2
    cut = eager.bind(lax.exp_p, [x[:2]], {"accuracy": None})  # another shape: compiled anew, right values
    cut = np.asarray(cut)
    np.testing.assert_allclose(cut, np.exp(x[:2]), rtol=4 * np.finfo(cut.dtype).eps)


def test_params_that_key_no_cache_run_as_jax_runs_them():
    twice = core.Primitive("metaspmd_test_twice")
    twice.def_impl(lambda x, *, table: x * len(table))
    out = eager.bind(twice, [np.ones(3)], {"table": [1, 2]})  # a list param: unhashable
    assert np.array_equal(np.asarray(out), [2.0, 2.0, 2.0])


def test_a_shape_refusal_is_jaxs_own_error():
    params = {"dimension_numbers": (((1,), (0,)), ((), ())), "precision": None, "preferred_element_type": None,
              "out_sharding": None}
    with pytest.raises(TypeError) as plain:
        lax.dot_general_p.bind(_rand(3, 4), _rand(5, 2), **params)
    with pytest.raises(TypeError) as light:
        eager.bind(lax.dot_general_p, [_rand(3, 4), _rand(5, 2)], params)
    assert str(light.value) == str(plain.value)


def test_under_a_callers_trace_the_op_binds_into_it():
    """Under a caller's jit (a cross-check's shard_map), the op is part of the caller's
    program: jit takes compiler options at its top level only."""
    x = _rand(4, 6)
    out = jax.jit(lambda a: eager.bind(lax.exp_p, [a], {"accuracy": None}))(x)
    np.testing.assert_allclose(np.asarray(out), np.exp(x).astype(np.asarray(out).dtype), rtol=1e-6)
    grad = jax.grad(lambda a: eager.bind(lax.reduce_sum_p, [a], {"axes": (0, 1), "out_sharding": None}))(x)
    assert np.array_equal(np.asarray(grad), np.ones_like(x))
    iota = jax.jit(lambda: eager.bind(lax.iota_p, [], {"dtype": jnp.int32, "shape": (3,), "dimension": 0,
                                                       "sharding": None}))()  # no operand to be traced
    assert np.array_equal(np.asarray(iota), [0, 1, 2])
