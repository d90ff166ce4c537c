import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from metaspmd.backends.tvm.tensor_ops import TvmOps, to_tvm  # noqa: E402
from metaspmd.tensor_ops import BOOL, FLOAT, INT, TensorOps  # noqa: E402

ops = TvmOps()


def t(a):
    return to_tvm(np.asarray(a))


def test_satisfies_protocol_and_reports_dtypes():
    assert isinstance(ops, TensorOps)
    x = t(np.zeros((2, 3)))
    assert ops.is_tensor(x) and not ops.is_tensor(np.zeros(2))
    assert ops.shape(x) == (2, 3)
    assert (ops.dtype_name(x), ops.dtype_kind(x)) == ("float64", FLOAT)
    assert ops.dtype_kind(t(np.zeros(2, dtype=np.int64))) == INT
    assert ops.dtype_kind(t(np.zeros(2, dtype=bool))) == BOOL


def test_narrow_and_concat_round_trip():
    a = np.arange(24.0).reshape(2, 3, 4)
    x = t(a)
    parts = [ops.narrow(x, 2, 0, 1), ops.narrow(x, 2, 1, 3)]
    np.testing.assert_array_equal(parts[1].numpy(), a[:, :, 1:4])
    np.testing.assert_array_equal(ops.concat(parts, 2).numpy(), a)


def test_arithmetic_keeps_dtype_and_bool_add_is_or():
    a, b = t(np.array([1, -2, 3], dtype=np.int32)), t(np.array([4, 5, -6], dtype=np.int32))
    assert ops.add(a, b).numpy().tolist() == [5, 3, -3]
    assert ops.sub(a, b).numpy().tolist() == [-3, -7, 9]
    assert ops.maximum(a, b).numpy().tolist() == [4, 5, 3]
    assert ops.minimum(a, b).numpy().tolist() == [1, -2, -6]
    assert ops.dtype_name(ops.scale(a, 0.5)) == "int32"
    p, q = t(np.array([True, False, False])), t(np.array([True, True, False]))
    assert ops.add(p, q).numpy().tolist() == [True, True, False]
    assert ops.multiply(p, q).numpy().tolist() == [True, False, False]


def test_close_is_exact_for_ints_and_bools():
    a = t(np.array([1, 2, 3], dtype=np.int64))
    assert ops.close(a, ops.clone(a))
    assert not ops.close(a, t(np.array([1, 2, 4], dtype=np.int64)))
    assert not ops.close(t(np.array([True, False])), t(np.array([True, True])))


def test_close_scales_float_tolerance_and_matches_nans():
    e = np.array([1e6, 1.0, np.nan])
    assert ops.close(t(e + np.array([1e-4, 0.0, 0.0])), t(e))  # tiny relative to the largest value
    assert not ops.close(t(e + np.array([0.0, 1.0, 0.0])), t(e))
    assert not ops.close(t(np.array([1.0, 2.0])), t(np.array([1.0, 2.0, 3.0])))
    assert not ops.close(t(np.array([1.0, np.nan])), t(np.array([1.0, 2.0])))
    f32 = np.array([1.0, 2.0], dtype=np.float32)
    assert ops.close(t(f32 * (1 + 1e-6)), t(f32))
    assert not ops.close(t(f32 * (1 + 1e-3)), t(f32))


def test_random_like_is_signed_seeded_and_typed():
    x = t(np.zeros((50,)))
    r = ops.random_like(x, 1).numpy()
    assert (r < 0).any() and (r > 0).any() and len(set(r.tolist())) == 50
    np.testing.assert_array_equal(r, ops.random_like(x, 1).numpy())
    assert not np.array_equal(r, ops.random_like(x, 2).numpy())
    ints = ops.random_like(t(np.zeros(50, dtype=np.int32)), 0)
    assert ops.dtype_name(ints) == "int32" and (ints.numpy() < 0).any() and len(set(ints.numpy().tolist())) > 10
    bools = ops.random_like(t(np.zeros(50, dtype=bool)), 0).numpy()
    assert bools.any() and not bools.all()
    assert not ops.zeros_like(x).numpy().any()
