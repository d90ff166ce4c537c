"""The core's close() gives np.isclose's verdict (with the overflow rule) on every kind of
pair: its spelled-out arithmetic and its shortcuts change speed only."""

import numpy as np
import pytest

from metaspmd.tensor_ops import TOLERANCES, LOW_TOLERANCE, close, largest_finite


def reference_close(a, e, dtype: str, floor: float = 0.0) -> bool:
    """close() as np.isclose states it, no shortcut (``floor``: close's ``scale``)."""
    a, e = np.asarray(a), np.asarray(e)
    if a.shape != e.shape:
        return False
    if not dtype.startswith(("float", "bfloat", "complex")):
        return bool(np.array_equal(a, e.astype(a.dtype)))
    if a.size == 0:
        return True
    rtol, atol_rel = TOLERANCES.get(dtype, LOW_TOLERANCE)
    wide = np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(e) else np.float64
    a64, e64 = a.astype(wide), e.astype(wide)
    finite = np.isfinite(e64)
    scale = float(np.abs(e64[finite]).max()) if finite.any() else 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        near = np.isclose(a64, e64, rtol=rtol, atol=atol_rel * max(scale, floor, 1e-30), equal_nan=True)
    if near.all():
        return True
    largest = None if wide is np.complex128 else largest_finite(dtype)
    if largest is None:
        return False
    edge = largest / 2
    overflow = ((np.isinf(a64) & (np.abs(e64) >= edge)) | (np.isinf(e64) & (np.abs(a64) >= edge))) & (
        np.sign(a64) == np.sign(e64))
    return bool((near | overflow).all())


def pairs(rng):
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e308, -1e308, 3.3e38, -3.3e38, 1e-300])
    for dtype, np_dtype in (("float64", np.float64), ("float32", np.float32), ("float16", np.float32),
                            ("complex128", np.complex128)):
        for _ in range(60):
            shape = tuple(rng.integers(0, 4, rng.integers(0, 3)))
            e = rng.standard_normal(shape)
            if np_dtype is np.complex128:
                e = e + 1j * rng.standard_normal(shape)
            if e.size and rng.random() < 0.5:
                e.flat[rng.integers(0, e.size)] = rng.choice(specials)
            kind = rng.integers(0, 5)
            a = (e.copy() if kind == 0 else e * (1 + 1e-9) if kind == 1 else e + 1e-3 if kind == 2
                 else rng.standard_normal(shape) if kind == 3 else np.where(np.isfinite(e), e, np.inf))
            if a.size and rng.random() < 0.3:
                a.flat[rng.integers(0, a.size)] = rng.choice(specials)
            with np.errstate(over="ignore", invalid="ignore"):
                yield np.asarray(a).astype(np_dtype), np.asarray(e).astype(np_dtype), dtype
    for _ in range(40):
        x = rng.integers(-3, 3, (3, 2))
        yield x, x if rng.random() < 0.5 else rng.integers(-3, 3, (3, 2)), "int64"
        b = rng.random((4,)) < 0.5
        yield b, b if rng.random() < 0.5 else ~b, "bool"


def test_close_gives_the_reference_verdict_everywhere():
    rng = np.random.default_rng(0)
    verdicts = []
    for a, e, dtype in pairs(rng):
        expected = reference_close(a, e, dtype)
        assert close(a, e, dtype) == expected, (a, e, dtype)
        verdicts.append(expected)
        floor = float(rng.choice([0.0, 1e-3, 1e4]))  # summands' size, as holds() passes it
        assert close(a, e, dtype, floor) == reference_close(a, e, dtype, floor), (a, e, dtype, floor)
    assert any(verdicts) and not all(verdicts)  # both verdicts were exercised


@pytest.mark.parametrize("a, e, dtype, expected", [
    (np.array([np.inf, 1.0]), np.array([1.7e308, 1.0]), "float64", True),  # within 2x of the largest: inf
    (np.array([-np.inf, 1.0]), np.array([1.7e308, 1.0]), "float64", False),  # of the other sign
    (np.array([np.nan, 2.0]), np.array([np.nan, 2.0]), "float64", True),  # NaN matches NaN
    (np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-3]), "float64", False),
    # the first element alone decides a mismatch, unless an expected value is near overflow
    (np.array([5.0, 2.0]), np.array([1.0, 2.0]), "float64", False),
    (np.array([np.inf, 2.0]), np.array([1.0, 1e308]), "float64", False),
    (np.array([np.inf, np.inf]), np.array([1.0e308, 1.7e308]), "float64", True),
    (np.array([np.nan, 2.0]), np.array([1.0, 2.0]), "float64", False),
    (np.array([1.0 + 1e-12, 3.0]), np.array([1.0, 3.0]), "float64", True),  # near there: the rest decides
    (np.array([1j, 2.0]), np.array([0.0, 2.0]), "complex128", False),
])
def test_close_edge_cases(a, e, dtype, expected):
    assert close(a, e, dtype) is expected
    assert reference_close(a, e, dtype) is expected
