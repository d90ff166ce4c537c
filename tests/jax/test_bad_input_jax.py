"""Bad input to JAX's parallelize: an error that names the function, what it returned and
what to pass instead, instead of one from deep inside jax.grad.

XLA fixes its CPU device count when jax first starts a backend: this module asks for 8
before that, as tests/runtime does; if another module started jax first, the tests on
several devices re-run in a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial

import pytest

from metaspmd.backends.jax import FAST_COMPILE_FLAGS

_DEVICES = "--xla_force_host_platform_device_count=8"
_FLAGS = " ".join((_DEVICES, *FAST_COMPILE_FLAGS))
if _DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAGS}".strip()

jax = pytest.importorskip("jax")
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from metaspmd import runtime  # noqa: E402
from metaspmd.backends.jax.capture import capture  # noqa: E402
from metaspmd.backends.jax.parallelize import JaxRuntime, parallelize  # noqa: E402
from metaspmd.cache import RuleCache  # noqa: E402
from metaspmd.placement import Shard  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _jax_default_widths():
    """The messages name jax's default dtypes (int32[8]), as a user sees them; a module of
    the same worker that got the sweep's backend (``get_backend`` turns x64 on) must not
    change them, which made these tests depend on the order xdist ran them in."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", before)


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


@pytest.mark.parametrize("params", [{}, (), {"w": None}], ids=["dict", "tuple", "none"])
def test_params_without_arrays_are_refused_for_a_backward(params):
    """An empty tree gave empty gradients, where torch refuses a module without parameters."""
    with pytest.raises(ValueError, match=r"params \(PyTreeDef.*\) holds no arrays, so there are no gradients to "
                                         r"compute: pass the parameters, or backward=False"):
        capture(lambda p, x: x * 2, (X,), params=params)
    assert capture(lambda p, x: x * 2, (X,), params=params, backward=False).n_outputs == 1


def test_capture_works_where_the_checks_allow():
    assert capture(argmax, (X,), params=PARAMS, backward=False).n_outputs == 1
    assert capture(no_output, (X,), params=PARAMS, backward=False).n_outputs == 0
    assert capture(lambda p, x: (linear(p, x), x.argmax()), (X,), params=PARAMS).n_outputs == 2  # one float output


@pytest.mark.parametrize("fn,kw,loss", [
    (linear, {"loss_fn": lambda out: 3.0}, "loss_fn's loss"),
    (linear, {"loss_fn": lambda out: jax.lax.stop_gradient(out).sum()}, "loss_fn's loss"),
    (lambda p, x: x * 2, {}, r"the sum of <lambda>'s outputs"),
], ids=["constant", "stop_gradient", "params unread"])
def test_a_loss_with_no_path_from_params_is_refused(fn, kw, loss):
    """Every gradient came back zero, where torch refuses the same loss (it requires no grad)."""
    with pytest.raises(ValueError, match=rf"{loss} does not depend on params .* every gradient is zero"):
        capture(fn, (X,), params=PARAMS, **kw)


def test_parallelize_reports_a_bad_output_before_planning(monkeypatch):
    from metaspmd import runtime
    from metaspmd.backends.jax.parallelize import parallelize

    monkeypatch.setattr(runtime, "resolve", lambda *a, **k: pytest.fail("rules were looked up"))
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    with pytest.raises(TypeError, match="no_output returns None"):
        parallelize(no_output, mesh, (X,), params=PARAMS)
    with pytest.raises(TypeError, match="loss_fn must be callable .* got 'mse'"):
        parallelize(linear, mesh, (X,), params=PARAMS, loss_fn="mse")


# --------------------------------------------------------------------------- meshes and constraints


def mesh_of(n: int, names=("tp",), **kw) -> Mesh:
    """A mesh of the first ``n`` devices; skipped where jax started with fewer (they run in
    a fresh process then: test_in_a_fresh_process)."""
    if jax.device_count() < n:
        pytest.skip(f"needs {n} devices, jax started with {jax.device_count()}")
    return Mesh(np.array(jax.devices()[:n]), names, **kw)


@pytest.fixture
def no_capture(monkeypatch):
    """Fail a test whose parallelize gets as far as tracing the function."""
    monkeypatch.setattr(JaxRuntime, "capture", lambda *a, **k: pytest.fail("the function was traced"))
    monkeypatch.setattr(runtime, "resolve", lambda *a, **k: pytest.fail("rules were looked up"))


def test_in_a_fresh_process():
    if jax.device_count() >= 4:
        pytest.skip("runs in this process")
    env = dict(os.environ, XLA_FLAGS=_FLAGS)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", __file__, "-k", "on_devices"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def mlp(p, x):
    return jax.numpy.tanh(x @ p["w1"]) @ p["w2"]


def test_explicit_mesh_runs_on_devices(tmp_path):
    """jax.make_mesh makes Explicit axes, which with_sharding_constraint refuses: the plan
    runs on the Auto twin, and its outputs come back on the caller's mesh."""
    mesh_of(4)
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((4, 16), np.float32), "w2": rng.standard_normal((16, 4), np.float32)}
    mesh = jax.make_mesh((4,), ("tp",), devices=jax.devices()[:4])
    assert mesh.axis_types == (AxisType.Explicit,)
    par = parallelize(mlp, mesh, (X,), params=params, cache=RuleCache(tmp_path),
                      constraints={"params.w1": NamedSharding(mesh, P(None, "tp"))})
    out, grads = par(X)
    np.testing.assert_allclose(out, mlp(params, X), rtol=1e-5, atol=1e-5)
    assert out.sharding.mesh == mesh
    ref = jax.grad(lambda p: mlp(p, X).sum())(params)
    for k in params:
        np.testing.assert_allclose(grads[k], ref[k], rtol=1e-5, atol=1e-5)
        assert grads[k].sharding.mesh == mesh  # so they mix with the caller's arrays
    assert par.plan.placement("params.w1") == (Shard(1),)  # a NamedSharding on the caller's mesh: kept
    stepped = jax.tree.map(lambda w, g: jax.device_put(w, g.sharding) - 0.1 * g, params, grads)
    out2, _ = par(X, params=stepped)
    np.testing.assert_allclose(out2, mlp(jax.tree.map(np.asarray, stepped), X), rtol=1e-5, atol=1e-5)


def test_a_call_of_another_structure_names_the_leaves_that_differ(tmp_path):
    mesh = mesh_of(4)
    params = {"w1": np.ones((4, 16), np.float32), "w2": np.ones((16, 4), np.float32)}
    par = parallelize(mlp, mesh, (X,), params=params, cache=RuleCache(tmp_path))
    with pytest.raises(ValueError, match=r"inputs do not match the captured structure: missing params\.w2$"):
        par(X, params={"w1": params["w1"]})
    with pytest.raises(ValueError, match=r"structure: missing params\.w2; not in the captured call params\.w3$"):
        par(X, params={"w1": params["w1"], "w3": params["w2"]})
    with pytest.raises(ValueError, match=r"structure: not in the captured call in1$"):
        par(X, X)
    with pytest.raises(ValueError, match=r"structure: missing params\.w1, params\.w2; not in the captured call "
                                         r"params\.0, params\.1$"):
        par(X, params=[params["w1"], params["w2"]])
    with pytest.raises(TypeError, match=r"the plan takes its inputs by position, in example_inputs' order; got "
                                        r"keyword arguments 'x', 'y'$"):
        par(x=X, y=X, params=params)


@pytest.mark.parametrize("names,types,error,message", [
    ((0,), None, TypeError, r"mesh axis names must be strings, got 0 \(axis names \(0,\)\)"),
    (("tp",), (AxisType.Manual,), ValueError, r"mesh axes \('tp',\) are Manual .* axis_types=\(AxisType.Auto,\)"),
])
def test_mesh_refused_before_the_trace(no_capture, names, types, error, message):
    mesh = mesh_of(1, names, **({} if types is None else {"axis_types": types}))
    with pytest.raises(error, match=message):
        parallelize(linear, mesh, (X,), params=PARAMS)


def test_a_device_twice_in_the_mesh_is_refused_before_the_trace(no_capture):
    d = jax.devices()[0]
    with pytest.raises(ValueError, match=rf"device {d} appears 2 times in the mesh"):
        parallelize(linear, Mesh(np.array([d, d]), ("tp",)), (X,), params=PARAMS)


def test_what_is_no_jax_function_is_named():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"Linear is a torch.nn.Module: plan it on a torch DeviceMesh"):
        capture(torch.nn.Linear(4, 4), (X,))
    with pytest.raises(TypeError, match=r"parallelize takes a function of the example inputs .* got 3"):
        capture(3, (X,))
    # a function of params and inputs, called without params=
    with pytest.raises(TypeError, match=r"linear\(\) missing 1 required positional argument: 'x': parallelize "
                                        r"calls linear\(\*example_inputs\), or linear\(params, \*example_inputs\) "
                                        r"when the parameters are passed as params="):
        capture(linear, (X,))
    # params= passed to a function that takes the inputs alone, or takes more than are given
    def inputs_only(x):
        return x.sum()

    def three(p, x, y):
        return (x @ p["w"]).sum()

    for fn, error in ((inputs_only, r"inputs_only\(\) takes 1 positional argument but 2 were given"),
                      (jax.jit(inputs_only), r"inputs_only\(\) takes 1 positional argument but 2 were given"),
                      (three, r"three\(\) missing 1 required positional argument: 'y'")):
        with pytest.raises(TypeError, match=error + r": parallelize calls \w+\(\*example_inputs\), or"):
            capture(fn, (X,), params=PARAMS)


@pytest.mark.parametrize("given,error,message", [
    (P("dp", None), ValueError, (r"constraint on 'params.w': P\('dp', None\) names axis 'dp', which the mesh lacks "
                                 r"\(its axes: \('tp',\)\)")),
    (P("tp", "tp"), ValueError, r"constraint on 'params.w': P\('tp', 'tp'\) uses axis 'tp' twice"),
    ("tp", TypeError, r"constraint on 'params.w': got 'tp' \(of type str\); pass a PartitionSpec .* a NamedSharding"),
    (P(P.UNCONSTRAINED), TypeError, r"constraint on 'params.w': .* each entry of a PartitionSpec is a mesh axis name"),
])
def test_constraint_refused_naming_its_key(no_capture, given, error, message):
    with pytest.raises(error, match=message):
        parallelize(linear, mesh_of(1), (X,), params=PARAMS, constraints={"params.w": given})


def test_constraint_cutting_a_dim_against_the_mesh_order(no_capture):
    """A dim cut over several axes is planned in mesh order: another order is refused, not
    changed."""
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("dp", "tp"))
    with pytest.raises(ValueError, match=(r"constraint on 'in0': P\(\('tp', 'dp'\), None\) cuts a dim over \('tp', "
                                          r"'dp'\), out of the mesh's axis order \('dp', 'tp'\): write \('dp', 'tp'\)")):
        parallelize(linear, mesh, (X,), params=PARAMS, constraints={"in0": P(("tp", "dp"), None)})


def test_constraint_on_another_mesh_refused_on_devices(no_capture):
    mesh = mesh_of(4)
    devices = np.array(jax.devices()[:4])
    for other in (Mesh(devices[:2], ("tp",)), Mesh(devices[::-1], ("tp",)), Mesh(devices, ("dp",))):
        with pytest.raises(ValueError, match=(r"constraint on 'params.w': a NamedSharding on another mesh, .* than "
                                              r"parallelize's Mesh\('tp': 4\) on devices \[0, 1, 2, 3\]")):
            given = NamedSharding(other, P(other.axis_names[0]))
            parallelize(linear, mesh, (X,), params=PARAMS, constraints={"params.w": given})


def test_constraint_longer_than_its_value():
    rt = JaxRuntime(mesh_of(1), params=PARAMS)
    captured = rt.capture(linear, (X,))
    with pytest.raises(ValueError, match=r"constraint on 'params.w': P\('tp', None, None\) has 3 entries, but the "
                                         r"value has 2 dims"):
        rt.constraints(captured, {"params.w": P("tp", None, None)})
    assert rt.constraints(captured, {"params.w": P(None, "tp")})["params.w"] == (Shard(1),)


# --------------------------------------------------------------------------- arguments jax.grad or jit refuse


@pytest.mark.parametrize("leaf,what", [(3, r"int32\[\]"), (np.ones((2, 2), np.int32), r"int32\[2,2\]"),
                                       (np.array([True]), r"bool\[1\]")])
def test_integer_param_named(leaf, what):
    with pytest.raises(TypeError, match=(rf"params\.n is {what}, not a float array, so jax.grad cannot differentiate "
                                         r"it: pass it as an input .* or close over it")):
        capture(lambda p, x: linear(p, x) * 2, (X,), params={**PARAMS, "n": leaf})
    capture(lambda p, x: linear(p, x), (X,), params={**PARAMS, "n": leaf}, backward=False)  # forward: fine


def test_static_arguments_explained():
    sliced = jax.jit(lambda p, x, n: linear(p, x)[:, :n], static_argnums=2)
    with pytest.raises(TypeError, match=r"jitted with static arguments .* traces every example input as an array: "
                                        r"fix the static ones beforehand, functools.partial"):
        capture(sliced, (X, 2), params=PARAMS)
    assert capture(partial(sliced, n=2), (X,), params=PARAMS).n_outputs == 1  # as the message says
    with pytest.raises(TypeError, match=r"repeat needs a concrete value .* functools.partial"):
        def repeat(p, x, n):
            for _ in range(n):
                x = linear(p, x)
            return x
        capture(repeat, (X, 2), params=PARAMS)


def test_table_that_is_no_mapping(no_capture):
    with pytest.raises(TypeError, match=r"table must be the RULES of a rule table, a dict op -> signature -> entry .* "
                                        r"got 'x'"):
        parallelize(linear, mesh_of(1), (X,), params=PARAMS, table="x")


def test_a_number_used_as_a_shape_explained():
    def heads(p, x, n):
        return linear(p, x).reshape(x.shape[0], n, -1)

    with pytest.raises(TypeError, match=r"heads needs a concrete value .* functools.partial"):
        capture(heads, (X, 2), params=PARAMS)


def test_a_number_used_as_a_slice_bound_explained():
    with pytest.raises(TypeError, match=r"<lambda> needs a concrete value .* functools.partial"):
        capture(lambda p, x, n: linear(p, x)[:n], (X, 2), params=PARAMS)


def test_a_torch_tensor_or_a_string_is_named_at_capture_and_at_call(tmp_path):
    """jax's own errors named neither the input nor parallelize's way: a dtype it cannot
    interpret, jax.jit's advice on static_argnums."""
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"in0 is a torch\.Tensor: a jax Mesh plans and runs functions of jax arrays"):
        capture(lambda a: a * 2, (torch.ones(8, 4),))
    with pytest.raises(TypeError, match=r"in1 is a str \('train'\), and parallelize traces every input as an array: "
                                        r"bind it beforehand, functools.partial"):
        capture(lambda p, x, mode: linear(p, x), (X, "train"), params=PARAMS)
    par = parallelize(linear, mesh_of(1), (X,), params=PARAMS, cache=RuleCache(tmp_path))
    with pytest.raises(TypeError, match=r"in0 is a torch\.Tensor"):
        par(torch.ones(8, 4))


def test_shapes_without_values_are_named_at_capture():
    """numpy's float() of a ShapeDtypeStruct was all jax said."""
    sds = jax.ShapeDtypeStruct((8, 4), np.float32)
    with pytest.raises(TypeError, match=r"in0 is a jax.ShapeDtypeStruct \(a shape without values\), .* pass arrays"):
        capture(linear, (sds,), params=PARAMS)
    with pytest.raises(TypeError, match=r"params\.w is a jax.ShapeDtypeStruct"):
        capture(linear, (X,), params={"w": jax.ShapeDtypeStruct((4, 4), np.float32)})


def test_params_at_a_call_planned_without_them_are_refused(tmp_path):
    """They were dropped without a word."""
    par = parallelize(lambda a: a * 2, mesh_of(1), (X,), cache=RuleCache(tmp_path))
    with pytest.raises(TypeError, match="params= given, but the plan was made without params"):
        par(X, params=PARAMS)


def test_a_planned_function_is_a_callable_jax_jit_takes(tmp_path):
    """jax.jit hashes its callable: a plain dataclass has no hash (unhashable type: 'Parallelized')."""
    par = parallelize(linear, mesh_of(1), (X,), params=PARAMS, cache=RuleCache(tmp_path))
    out, grads = jax.jit(par)(X)
    np.testing.assert_allclose(out, linear(PARAMS, X))


def test_another_dtype_at_call_is_refused_by_input(tmp_path):
    par = parallelize(linear, mesh_of(1), (X,), params=PARAMS, cache=RuleCache(tmp_path))
    for dtype in (np.int32, jax.numpy.bfloat16):
        with pytest.raises(TypeError, match=rf"in0: dtype {jax.numpy.dtype(dtype)}, but the plan is for float32: "
                                            "parallelize again for this dtype"):
            par(X.astype(dtype))
    out, _ = par(X)
    np.testing.assert_allclose(out, linear(PARAMS, X))


def test_a_constraint_that_cannot_place_its_value_names_the_key_on_devices():
    rt = JaxRuntime(mesh_of(4), params=PARAMS)
    captured = rt.capture(linear, (np.ones((6, 4), np.float32),))
    with pytest.raises(ValueError, match=r"constraint on 'in0': \[S\(0\)\] cannot place its shape \(6, 4\) on a mesh of "
                                         r"shape \(4,\): dim 0 of size 6 does not split evenly in 4"):
        rt.constraints(captured, {"in0": P("tp", None)})


def grouped_conv(p, x):
    y = jax.lax.conv_general_dilated(x, p["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     feature_group_count=2)
    return jax.numpy.tanh(y).sum()


def test_grouped_convolution_weight_gradient_never_summed_on_a_mesh_of_axes_on_devices():
    """XLA sums a Partial output of a convolution with batch_group_count > 1 (the weight
    gradient of a grouped one) over every device of a mesh of several axes, not over the
    axis that cut it (2x on 2x2): those strategies are dropped there, and kept on 1-D meshes."""
    from metaspmd.spec import Identity, OutputCombine, Reduce, Replicate, ShardIn, Strategy

    params = {"w": np.ones((3, 3, 2, 4), np.float32)}
    x = np.ones((2, 4, 4, 4), np.float32)
    summed = Strategy("S1", (ShardIn(0), ShardIn(0)), (OutputCombine.of([Reduce("sum")]),))
    whole = Strategy("R", (Replicate(), Replicate()), (OutputCombine.of([Identity()]),))
    for mesh, kept in ((mesh_of(4), 2), (Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp")), 1),
                       (Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ("dp", "tp")), 2)):
        rt = JaxRuntime(mesh, params=params)
        captured = rt.capture(grouped_conv, (x,))
        convs = [e.name for e in captured.eqns if e.prim.name == "conv_general_dilated"]
        weight_grads = [n for n in convs if captured.eqn(n).params["batch_group_count"] > 1]
        assert weight_grads and len(convs) > len(weight_grads)
        found = {n: (summed, whole) for n in convs}
        got = rt.strategies(captured, found)
        assert all(len(got[n]) == kept for n in weight_grads), mesh
        assert all(len(got[n]) == 2 for n in convs if n not in weight_grads)  # the forward one keeps both


@pytest.mark.parametrize("padding,aborting", [
    (((-1, 2, 1), (0, 0, 0)), {0}), (((-1, 0, 2), (1, -2, 0)), {0}),
    (((-2, -1, 1), (0, 0, 0)), set()), (((-1, 2, 0), (1, 2, 1)), set()),
])
def test_pad_cuts_xla_aborts_the_process_on_are_dropped(padding, aborting):
    """jax 0.10.2's SPMD partitioner aborts the process (a failed CHECK, no exception) on a
    pad cut along a dim whose negative low padding is not a multiple of the interior padding
    + 1; a budgeted plan cut it so. Strategies cutting such a dim are dropped, on any mesh."""
    from metaspmd.spec import Gather, Identity, OutputCombine, Replicate, ShardIn, Strategy

    def padded(x):
        return jax.lax.pad(x * 2, 0.0, padding)

    cuts = [Strategy(f"S{d + 1}", (ShardIn(d), Replicate()), (OutputCombine.of([Gather(d)]),)) for d in (0, 1)]
    whole = Strategy("R", (Replicate(), Replicate()), (OutputCombine.of([Identity()]),))
    rt = JaxRuntime(mesh_of(1))
    captured = rt.capture(padded, (np.ones((8, 6), np.float32),))
    pads = [e.name for e in captured.eqns if e.prim.name == "pad"]
    got = rt.strategies(captured, {n: (*cuts, whole) for n in pads})
    assert pads and {s.inputs[0].dim for s in got[pads[0]] if isinstance(s.inputs[0], ShardIn)} == {0, 1} - aborting


def test_a_while_loop_with_gradients_suggests_the_forward_only():
    def loop(p, x):
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jax.numpy.tanh(c[1] @ p["w"])), (0, x))[1]

    with pytest.raises(ValueError, match=r"loop has a while_loop, which jax.grad cannot differentiate: pass "
                                         r"backward=False to plan the forward only"):
        capture(loop, (X,), params=PARAMS)
    assert capture(loop, (X,), params=PARAMS, backward=False).n_outputs == 1


def test_a_loop_carry_that_changes_dtype_stays_a_type_error():
    """jax's own error for it is a TypeError; the advice names the dtype too."""
    from metaspmd.backends.jax.capture import CarryTypeError, ControlFlowError

    def loop(x):
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1].astype(np.float16)), (0, x))[1]

    with pytest.raises(TypeError, match=r"changes type \(shape or dtype\) .* give it its final dtype before the loop"
                       ) as raised:
        capture(loop, (X,))
    assert isinstance(raised.value, CarryTypeError) and isinstance(raised.value, ControlFlowError)


@pytest.mark.parametrize("kw,error,message", [
    ({"while_trips": "x"}, TypeError, r"while_trips must be a number of trips per call .* got 'x'"),
    ({"while_trips": True}, TypeError, r"while_trips must be a number of trips per call .* got True"),
    ({"while_trips": -1}, ValueError, r"while_trips must be a finite number >= 0, got -1"),
    ({"while_trips": {"while_3": float("inf")}}, ValueError, r"while_trips\['while_3'\] must be a finite number"),
    ({"while_trips": {3: 4}}, TypeError, r"while_trips names loops by str .* got the key 3"),
    ({"while_trips": 10 ** 400}, ValueError, r"while_trips must be a finite number >= 0, got 1000"),
    ({"links": {"tp": (True, True)}}, ValueError, r"links\['tp'\]: expected \(seconds per message, bytes per second\), "
                                                 r"got \(True, True\)"),
    ({"links": {"tp": (1e-5, 1e-308)}}, ValueError, r"links\['tp'\]: .* is so slow that moving a tensor's bytes takes "
                                                   r"more seconds than a float holds"),
    ({"table": {"aten.mm.default": {}}}, ValueError, r"table holds 'aten.mm.default', which is no JAX primitive"),
    ({"loss_fn": lambda out: out.sum(), "params": None}, ValueError,
     r"loss_fn is the loss whose gradients the backward computes, which needs params= and backward=True"),
    ({"loss_fn": lambda out: out.sum(), "backward": False}, ValueError, r"loss_fn is the loss whose gradients"),
    ({"links": "fast"}, TypeError, r"links must be a dict of \(seconds per message, bytes per second\) by mesh axis "
                                   r"name, got 'fast'"),
    ({"links": {"dp": (1e-5, 1e9)}}, ValueError, r"links: no mesh axis named 'dp' \(axes are \['tp'\]\)"),
])
def test_options_refused_before_the_trace(no_capture, kw, error, message):
    """Each was read only when a loop without static bounds was traced, or never."""
    kw = {"params": PARAMS, **kw}
    fn = linear if kw["params"] is not None else (lambda x: x * 2)
    with pytest.raises(error, match=message):
        parallelize(fn, mesh_of(1), (X,), **kw)


def test_a_cost_model_of_another_mesh_is_refused_before_the_trace(no_capture):
    from metaspmd import planner

    other = planner.CostModel(planner.Mesh.of((4,), ("x",)))
    with pytest.raises(ValueError, match=r"cost_model was built for Mesh\(x=4\), but the plan's mesh is "
                                         r"Mesh\(tp=1\): build the cost model on planner.Mesh.of\(\(1,\), \('tp',\)\)"):
        parallelize(linear, mesh_of(1), (X,), params=PARAMS, cost_model=other)
    same = planner.CostModel(planner.Mesh.of((1,), ("tp",)))
    with pytest.raises(ValueError, match=r"but the plan's mesh is Mesh\(tp=1 \(1e-05 s per message, 1e\+09 bytes/s\)\)"
                                         r": build the cost model on .*\.with_links\(links\)"):
        parallelize(linear, mesh_of(1), (X,), params=PARAMS, cost_model=same, links={"tp": (1e-5, 1e9)})


@pytest.mark.parametrize("edit,message", [
    (lambda text: text, r"jax\.add\.yaml:1: file holds op 'jax\.sub'; expected 'jax\.add'"),  # jax.sub's file
    (lambda text: text.replace("backend: jax", "backend: torch"), r"file holds a 'torch' rule but lies in the jax/ folder"),
])
def test_crosscheck_refuses_a_file_of_another_op_or_backend(tmp_path, edit, message):
    """It checked jax.sub's rules (or a torch file's) as jax.add's, and reported success."""
    from pathlib import Path

    from metaspmd.backends.jax.crosscheck import _load_records
    from metaspmd.registry_io import RegistryError

    registry = Path(__file__).resolve().parents[2] / "registry" / "jax"
    (tmp_path / "jax").mkdir()
    source = "jax.sub.yaml" if "op 'jax" in message else "jax.add.yaml"
    (tmp_path / "jax" / "jax.add.yaml").write_text(edit((registry / source).read_text()))
    with pytest.raises(RegistryError, match=message):
        _load_records(tmp_path, "jax", ["jax.add"])


def test_an_if_on_a_computed_array_is_named_at_its_line():
    def branchy(p, x):
        h = linear(p, x)
        if h.sum() > 0:
            return h
        return -h

    with pytest.raises(TypeError, match=r"branchy needs a concrete value where it got a traced one, at \S+"
                                        r"test_bad_input_jax\.py:\d+ in branchy: if h\.sum\(\) > 0:\. .* keep the "
                                        r"choice in arrays: jnp\.where, lax\.cond"):
        capture(branchy, (X,), params=PARAMS)


def test_a_key_with_a_dot_and_the_path_it_spells_get_two_names():
    from metaspmd.backends.jax.capture import leaf_names

    params = {"a.b": X, "a": {"b": X}, "l": [X], "l.0": X}
    assert leaf_names((params, X), with_params=True) == [
        "params.a.b", "params['a.b']", "params.l.0", "params['l.0']", "in0"]


def test_a_misspelt_key_lists_the_names_as_they_are_written(tmp_path):
    """A KeyError shows its message's repr: every bracketed name came out with escaped quotes."""
    params = {"fc1.weight": PARAMS["w"]}
    with pytest.raises(KeyError) as e:
        parallelize(lambda p, x: x @ p["fc1.weight"], mesh_of(1), (X,), params=params, cache=RuleCache(tmp_path),
                    constraints={"params.fc1.weight": P()})
    assert str(e.value) == ("constraint on 'params.fc1.weight': no such value (inputs are \"params['fc1.weight']\", "
                            "'in0', or name a graph var)")


def test_a_flat_checkpoint_key_beside_the_path_it_spells_is_planned_and_pinned_on_devices(tmp_path):
    mesh = mesh_of(4)
    rng = np.random.default_rng(0)
    params = {"a.b": rng.standard_normal((16, 4), np.float32), "a": {"b": rng.standard_normal((4, 16), np.float32)}}

    def fn(p, x):
        return jax.numpy.tanh(x @ p["a"]["b"]) @ p["a.b"]

    par = parallelize(fn, mesh, (X,), params=params, cache=RuleCache(tmp_path),
                      constraints={"params['a.b']": P("tp", None)})
    out, grads = par(X)
    np.testing.assert_allclose(out, fn(params, X), rtol=1e-5, atol=1e-5)
    ref = jax.grad(lambda p: fn(p, X).sum())(params)
    np.testing.assert_allclose(grads["a.b"], ref["a.b"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["a"]["b"], ref["a"]["b"], rtol=1e-5, atol=1e-5)
    assert par.plan.placement("params['a.b']") == (Shard(0),)
    assert list(par.captured.param_names) == ["params.a.b", "params['a.b']"]  # both parameters, their gradients tied


def test_crosscheck_refuses_an_ops_pattern_that_matches_nothing_beside_a_good_one(capsys):
    """A typo beside a good name checked the good one alone, and passed."""
    from metaspmd.backends.jax import crosscheck

    assert crosscheck.main(["--ops", "jax.add,jax.ad_typo"]) == 2
    assert "--ops: no op matches jax.ad_typo" in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--no-reverify"], ["--quiet"]])
def test_crosscheck_refuses_an_option_other_calls_ignores(option, capsys):
    from metaspmd.backends.jax import crosscheck

    with pytest.raises(SystemExit) as e:
        crosscheck.main(["--ops", "jax.add", "--other-calls", "2", *option])
    assert e.value.code == 2 and f"{option[0]} does not apply to --other-calls" in capsys.readouterr().err
