"""Bad input to JAX's parallelize: an error that names the function, what it returned and
what to pass instead, instead of one from deep inside jax.grad."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from metaspmd.backends.jax.capture import capture  # noqa: E402

pytestmark = pytest.mark.timeout(120)

# numpy, not jnp: an array made while pytest collects would start jax with one device before
# tests/runtime asks XLA for eight
PARAMS = {"w": np.ones((4, 4), np.float32)}
X = np.ones((8, 4), np.float32)


def linear(p, x):
    return x @ p["w"]


def no_output(p, x):
    x @ p["w"]


def argmax(p, x):
    return (x @ p["w"]).argmax(-1)


@pytest.mark.parametrize("fn,kw,message", [
    (no_output, {}, (r"no_output returns None, so the default loss \(the sum of its outputs\) has nothing to "
                     r"differentiate: .* pass backward=False")),
    (argmax, {}, r"argmax returns an integer array \(int32\[8\]\), which carries no gradient, .* pass backward=False"),
    (lambda p, x: (x.argmax(), x > 0), {}, r"<lambda> returns only integer arrays \(int32\[\], bool\[8,4\]\)"),
    (lambda p, x: (), {}, "<lambda> returns a tuple with no arrays"),
    (linear, {"loss_fn": lambda out: out.argmax()}, (r"loss_fn returned int32\[\], not a float scalar: return one "
                                                     r"computed from linear's float outputs, or pass backward=False")),
    (linear, {"loss_fn": lambda out: out}, r"loss_fn returned float32\[8,4\], not a float scalar"),
    (linear, {"loss_fn": lambda out: None}, "loss_fn returned a NoneType, not a float scalar"),
    (linear, {"loss_fn": "mse"}, (r"loss_fn must be callable \(a function of the function's output, returning a "
                                  r"scalar array\), got 'mse'")),
])
def test_capture_names_what_is_wrong(fn, kw, message):
    with pytest.raises(TypeError, match=message):
        capture(fn, (X,), params=PARAMS, **kw)


def test_capture_works_where_the_checks_allow():
    assert capture(argmax, (X,), params=PARAMS, backward=False).n_outputs == 1
    assert capture(no_output, (X,), params=PARAMS, backward=False).n_outputs == 0
    assert capture(lambda p, x: (linear(p, x), x.argmax()), (X,), params=PARAMS).n_outputs == 2  # one float output
    assert capture(linear, (X,), params=PARAMS, loss_fn=lambda out: 3.0).n_outputs == 1  # a constant loss: zero grads


def test_parallelize_reports_a_bad_output_before_planning(monkeypatch):
    from metaspmd import runtime
    from metaspmd.backends.jax.parallelize import parallelize

    monkeypatch.setattr(runtime, "resolve", lambda *a, **k: pytest.fail("rules were looked up"))
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    with pytest.raises(TypeError, match="no_output returns None"):
        parallelize(no_output, mesh, (X,), params=PARAMS)
    with pytest.raises(TypeError, match="loss_fn must be callable .* got 'mse'"):
        parallelize(linear, mesh, (X,), params=PARAMS, loss_fn="mse")
