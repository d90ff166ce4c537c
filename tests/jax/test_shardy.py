"""Reading Shardy's factor rules, and the cross-check built on them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from metaspmd.backends.jax.shardy import function_factors, parse_rule  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_parse_rule():
    r = parse_rule("#sdy.op_sharding_rule<([i, k], [k, j])->([i, j]) {i=4, j=5, k=6} reduction={k}>")
    assert r.operands == ((("i",), ("k",)), (("k",), ("j",))) and r.results == ((("i",), ("j",)),)
    assert r.sizes == {"i": 4, "j": 5, "k": 6} and r.sets["reduction"] == {"k"}
    merged = parse_rule("#sdy.op_sharding_rule<([i, j])->([ij]) {i=4, j=6}>")
    assert merged.results == ((("i", "j"),),)


def test_function_factors_of_matmul_and_cumsum():
    import jax.numpy as jnp
    from jax import lax

    mm = function_factors(lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ()))), [jnp.ones((4, 6)), jnp.ones((6, 5))])
    assert [(f.kind, f.inputs, f.outputs) for f in mm] == [
        ("pass-through", ((0, 0),), ((0, 0),)),
        ("reduction", ((0, 1), (1, 0)), ()),
        ("pass-through", ((1, 1),), ((0, 1),)),
    ]
    # cumsum lowers to a private function holding a reduce_window: followed through the call.
    cs = function_factors(lambda a: lax.cumsum(a, 0), [jnp.ones((4, 6))])
    assert [f.kind for f in cs] == ["permutation", "pass-through"]


def _crosscheck(ops: str, registry) -> str:
    """The jax cross-check's output on ``ops``, run as a fresh process (it asks XLA for
    several CPU devices, which only works before jax starts)."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "crosscheck.py"), "--backend", "jax", "--ops", ops, "--registry", str(registry)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_crosscheck_cli_on_a_subset(tmp_path):
    out = _crosscheck("jax.dot_general", tmp_path)
    assert "agree  reduction[" in out  # matmul's contracted dim
    assert "Shardy shardable factors found:" in out
    summary = out[out.index("Shardy shardable factors found:"):]
    found, total = summary.split(":", 1)[1].split("(")[0].strip().split("/")
    assert int(found) == int(total) > 0  # matmul: every factor agrees
    assert "re-verified:" in out and ", 0 failed" in out
    assert "jit on CPU devices:" in out and "0 ok," not in out.split("jit on CPU devices:")[1].split("\n")[0]


def test_reverify_cuts_each_input_by_its_own_size():
    """A joint of independent parts shards dims of different sizes (optimization_barrier's
    x on a dim of 4, y on one of 6): each is cut by its own size, as the explorer does."""
    from metaspmd.backends.jax import get_backend
    from metaspmd.backends.jax.crosscheck import reverify
    from metaspmd.registry_io import load_record

    backend = get_backend()
    case = next(iter(backend.cases("jax.optimization_barrier")))
    entry = load_record(ROOT / "registry" / "jax" / "jax.optimization_barrier.yaml").entries[0]
    joints = entry.joint_strategies()
    mixed = [s for s in joints if s.label == "S1+S3"]
    assert mixed and str(mixed[0]).startswith("S1+S3: (S(0), S(0))")
    for s in joints:
        assert reverify(case, backend.tensor_ops(), s) is None, s


def test_scans_and_reversed_gathers_realise_permutation_factors_only():
    """cumsum's and rev's cut dims are Shardy permutation factors (data moves between
    shards): a scan or a reversed gather realises one; a pass-through factor needs a plain
    gather."""
    from metaspmd.backends.jax.crosscheck import match
    from metaspmd.backends.jax.shardy import Factor
    from metaspmd.spec import OutputCombine, ShardIn, Strategy

    def strategy(text):
        return Strategy("S1", (ShardIn(0),), (OutputCombine.parse(text),))

    for text in ("scan(dim=0, op=sum)", "gather(dim=0, reverse=true)", "gather(dim=0)"):
        permutation = Factor("permutation", 6, ((0, 0),), ((0, 0),), ("reduce_window",))
        assert match(permutation, [strategy(text)]) is not None, text
    passing = Factor("pass-through", 6, ((0, 0),), ((0, 0),), ("add",))
    assert match(passing, [strategy("scan(dim=0, op=sum)")]) is None
    assert match(passing, [strategy("gather(dim=0, reverse=true)")]) is None
    assert match(passing, [strategy("gather(dim=0)")]) is not None
    # the wrong dim matches nothing
    assert match(Factor("permutation", 6, ((0, 0),), ((0, 1),), ("rev",)), [strategy("scan(dim=0, op=sum)")]) is None


def test_scans_and_reversed_gathers_run_as_collectives_on_cpu_devices(tmp_path):
    """cumsum over a cut axis runs as local scans plus a carry of edge slices, rev as one
    collective permute: their strategies agree with Shardy's permutation factors and give
    the unsharded result under jit + shard_map."""
    out = _crosscheck("jax.cumsum,jax.cumlogsumexp,jax.rev", tmp_path)
    assert "agree  permutation[" in out and "MISS" not in out, out[-3000:]
    jit = out.split("jit on CPU devices:")[1].split("\n")[0]
    assert " 0 failed" in jit and int(jit.split(" ok")[0]) >= 6, jit


def test_index_offsets_and_widened_halos_realise_shardy_factors(tmp_path):
    """scatter along an indexed operand dim: each shard offsets the positions by its start
    and the op drops the rest, so the operand gathers (run for real under jit + shard_map);
    reduce_window along dims too short for three shards: halos proven on lengthened dims."""
    out = _crosscheck("jax.scatter-add,jax.reduce_window_max", tmp_path)
    summary = out[out.index("Shardy shardable factors found:"):]
    assert "MISS   pass-through" not in out and "MISS   permutation" not in out, out[-3000:]
    scatter = out[out.index("jax.scatter-add"):]
    assert "agree  pass-through[" in scatter and "agree  permutation[" in out[:out.index("jax.scatter-add")]
    assert "re-verified:" in summary and ", 0 failed" in summary
    jit = summary.split("jit on CPU devices:")[1].split("\n")[0]
    assert " 0 failed" in jit, jit
