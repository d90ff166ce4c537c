"""The JAX capture records no value until live exploration needs one: signatures (and so
table rules and plans) come from the traced shapes, and are those of the real operands, for
scan, while and cond bodies and remat too; a capture with every rule at hand runs nothing."""

import functools
import os
import sys
from pathlib import Path

import pytest

from metaspmd.backends.jax import FAST_COMPILE_FLAGS

_DEVICES = "--xla_force_host_platform_device_count=8"
if _DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {' '.join((_DEVICES, *FAST_COMPILE_FLAGS))}".strip()

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from metaspmd import planner  # noqa: E402
from metaspmd.backends.jax.capture import Captured, RecordedValues, capture  # noqa: E402
from metaspmd.backends.jax.rules_at_runtime import node_call  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.jax_models import gpt_block, gpt_params  # noqa: E402


def mlp_layer(p, h):
    return jax.nn.softmax(h @ p["w1"], axis=-1) @ p["w2"] + h


LAYERS = {  # a layer and its parameters (one tree per layer)
    "mlp": (mlp_layer, lambda seed: {"w1": jax.random.normal(jax.random.key(seed), (16, 32), jnp.float32) / 4,
                                     "w2": jax.random.normal(jax.random.key(seed + 9), (32, 16), jnp.float32) / 6}),
    "gpt": (gpt_block, lambda seed: gpt_params(16, 32, seed=seed)),
}


def model(layer, params, x, n):
    """Layers over stacked params, rematerialized; then while loops (not differentiable: on
    a value without gradient), one with a traced bound, one with constant bounds; then a
    cond: every kind of region and body."""
    block = jax.checkpoint(lambda h, p: (layer(p, h), None), policy=jax.checkpoint_policies.nothing_saveable)
    h = lax.scan(block, x, params)[0]
    g = lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.tanh(c[1])), (0, lax.stop_gradient(h)))[1]
    g = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 0.5 + jnp.sin(c[1])), (0, g))[1]
    return lax.cond(n > 2, lambda: jnp.cos(h + g), lambda: h * 2.0)


# the GPT block covers more primitives; recording its real values compiles each of them
@pytest.fixture(scope="module", params=["mlp", pytest.param("gpt", marks=pytest.mark.slow)])
def captured(request):
    layer, make = LAYERS[request.param]
    params = jax.tree.map(lambda *a: jnp.stack(a), *[make(s) for s in range(2)])
    x = jax.random.normal(jax.random.key(1), (2, 4, 16), jnp.float32)
    return capture(functools.partial(model, layer), (x, jnp.int32(3)), params=params)


def real_calls(c, monkeypatch):
    """Every node's signature and table rules from its real operands, as capture had them."""
    with monkeypatch.context() as m:
        m.setattr(Captured, "abstract", lambda self, name: None)
        calls = {op.name: node_call(c, op) for op in c.ir}
    return {n: (call.signature, call.table_rules) for n, call in calls.items()}


def test_signatures_from_traced_shapes_are_those_of_the_real_operands(captured, monkeypatch):
    c = captured
    assert isinstance(c.values, RecordedValues) and c.values._values is None  # nothing run at capture
    calls = {op.name: node_call(c, op) for op in c.ir}
    assert c.values._values is None  # signatures and table rules need no value
    assert {op.op for op in c.ir} >= {"jax.carry", "jax.scan_slice", "jax.scan_stack", "jax.cond_merge",
                                     "jax.optimization_barrier", "jax.dot_general", "jax.tanh"}
    real = real_calls(c, monkeypatch)
    assert c.values._values is not None
    assert {n: (call.signature, call.table_rules) for n, call in calls.items()} == real
    # planned on the table's rules (a miss replicated), the same plan either way
    mesh = planner.Mesh.of((4,), ("tp",))
    plans = [planner.plan(c.ir, {n: rules or () for n, rules in found.items()}, mesh, repeats=c.repeats,
                          same_placement=c.same_placement)
             for found in ({n: call.table_rules for n, call in calls.items()}, {n: r for n, (_, r) in real.items()})]
    assert plans[0].total_cost == pytest.approx(plans[1].total_cost)
    assert {n.name: n.strategy for n in plans[0].nodes} == {n.name: n.strategy for n in plans[1].nodes}


def test_loops_are_counted_by_their_bounds(captured):
    c = captured
    trips = {e.region.kind + ":" + c.trip_sources[e.name]: c.trips[e.name] for e in c.regions if e.name in c.trips}
    assert trips == {"scan:the scan's length": 2, "while:static bounds": 3,
                     "while:an estimate: no static bounds; parallelize(while_trips=...) sets it": 10}
    assert len(c.trips) == 4  # the scan forward and backward, the two whiles


def test_values_are_recorded_once_on_first_use(captured):
    c = captured
    c.values.record()
    tanh = next(op for op in c.ir if op.op == "jax.tanh" and c.repeats.get(op.name, 1) > 1)
    (x,) = c.values[tanh.name]
    assert isinstance(x, jax.Array) and x.shape == tanh.input_vars[0].shape
    recorded = c.values._values
    assert recorded is not None and c.values[tanh.name] is recorded[tanh.name]
    assert set(c.values) >= {op.name for op in c.ir}  # and the region equations' own operands
