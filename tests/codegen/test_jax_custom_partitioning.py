"""A JAX op wrapped with custom_partitioning and its generated sharding_rule runs on 8 CPU
devices with sharded inputs and matches the unsharded result."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax")

SCRIPT = textwrap.dedent('''
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from metaspmd.backends.jax.partitioner import partitioned
    from metaspmd.generated.jax_rules import RULES

    assert len(jax.devices()) == 8
    mesh = Mesh(np.array(jax.devices()), ("x",))
    rule = RULES["jax.dot_general"]["lhs:f[*,*] rhs:f[*,*] dimension_numbers=[[[1],[0]],[[],[]]]"]
    assert rule.shardy[:2] == ("s1 s2, s2 s3 -> s1 s3", ("s2",))
    matmul = partitioned(lambda a, b: jnp.matmul(a, b), rule)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.standard_normal((32, 24)).astype(np.float32)
    expected = a @ b
    for sa, sb in [(P("x", None), P()), (P(None, "x"), P("x", None)), (P(), P(None, "x")), (P("x", None), P("x", None))]:
        fa = jax.device_put(a, NamedSharding(mesh, sa))
        fb = jax.device_put(b, NamedSharding(mesh, sb))
        f = jax.jit(matmul)
        out = f(fa, fb)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-4)
        hlo = f.lower(fa, fb).compile().as_text()
        print(sa, sb, out.sharding.spec, "all-reduce" in hlo)
    reduce_rule = RULES["jax.reduce_sum"]["x:f[*,*] axes=[0]"]
    colsum = partitioned(lambda x: jnp.sum(x, axis=0), reduce_rule)
    x = jax.device_put(a, NamedSharding(mesh, P("x", None)))
    np.testing.assert_allclose(np.asarray(jax.jit(colsum)(x)), a.sum(0), rtol=1e-4, atol=1e-4)
    # argmax over the sharded dim: each device shares its (value, position) pair; ties and
    # a NaN across devices give the first position, as jnp.argmax does unsharded
    arg_rule = RULES["jax.argmax"]["x:f[*,*] axes=[0] index_dtype='int64'"]
    assert arg_rule.shardy[1] == ("s1",), arg_rule
    argmax = partitioned(lambda x: jnp.argmax(x, axis=0), arg_rule)
    t = np.round(a)
    t[9, 3] = np.nan
    xt = jax.device_put(t, NamedSharding(mesh, P("x", None)))
    f = jax.jit(argmax)
    np.testing.assert_array_equal(np.asarray(f(xt)), np.argmax(t, axis=0))
    gathers = [l for l in f.lower(xt).compile().as_text().splitlines() if "all-gather(" in l]
    assert gathers and all("[8,32]" in l for l in gathers), gathers  # one pair per device, never x itself
    print("ok")
''')


def test_custom_partitioning_with_generated_rule():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "ok"
    # Contraction dim sharded on both operands: the verified rule's psum shows up as an all-reduce.
    assert lines[1].endswith("True"), lines


def test_uneven_shards_are_replicated_first():
    """XLA pads an uneven shard: padding would join a psum or win an argmax, so the
    partition takes a strategy only where the axis splits its dims evenly."""
    from metaspmd.backends.jax.partitioner import _divides, _plain
    from metaspmd.generated.jax_rules import RULES

    # argmax along the cut dim 0: its positions finish with a (value, position) all-gather
    (cut,) = [s for s in _plain(RULES["jax.argmax"]["x:f[*,*] axes=[0] index_dtype='int64'"]) if s[0] == (0,)]
    assert cut[1] is None and cut[2].op == "max"
    assert _divides(("x", cut), [(16, 6)], {"x": 4})
    assert not _divides(("x", cut), [(10, 6)], {"x": 4})
