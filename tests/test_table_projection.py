"""One rule, one form: the generated table and the live/cache path hand the planner the
same strategies, and every target projects them the same way.

The table path renders registry files with codegen and reads them back through
``RuleTable``; the cache path writes the same entries through ``RuleCache`` (the YAML a
live exploration is kept in) and reads them back. The two examples the runtime used to
disagree on are explored live as well.
"""

from pathlib import Path

import pytest

from metaspmd.cache import RuleCache
from metaspmd.codegen.generator import render
from metaspmd.registry_io import load_record
from metaspmd.table import RuleTable
from metaspmd.target import DTENSOR_PLAN, DTENSOR_REGISTER, JAX_PARTITION, JAX_PLAN, projections

ROOT = Path(__file__).resolve().parents[1]
TARGETS = (DTENSOR_REGISTER, DTENSOR_PLAN, JAX_PLAN, JAX_PARTITION)
# every op of a backend would take a minute to load: a spread of each, plus the ops whose
# entries use every part of the rule model (layers, independent parts, offsets, halos)
NAMED = {
    "torch": ["aten.mean.dim", "aten._foreach_add.Tensor", "aten._amp_foreach_non_finite_check_and_unscale_.default",
              "aten.embedding.default", "aten.convolution.default", "aten.gather.default", "aten.view.default",
              "aten.native_layer_norm_backward.default", "aten._pdist_forward.default", "aten.cumsum.default"],
    "jax": ["jax.reduce_max", "jax.argmax", "jax.dot_general", "jax.gather", "jax.conv_general_dilated",
            "jax.dynamic_slice", "jax.cumsum", "jax.scatter-add"],
    "tvm": [],
}
EVERY = {"torch": 40, "jax": 6, "tvm": 3}


def _records(backend: str) -> dict:
    files = sorted((ROOT / "registry" / backend).glob("*.yaml"))
    chosen = set(files[::EVERY[backend]]) | {f for f in files if f.stem in NAMED[backend]}
    return {r.op: r for r in map(load_record, sorted(chosen))}


def _table(records: dict, backend: str) -> RuleTable:
    ns: dict = {}
    exec(compile(render(records, backend), f"<{backend}_rules>", "exec"), ns)
    return RuleTable(ns["RULES"])


def _placed(strategies, op):
    return {t.name: [(a.label, a.inputs, a.outputs) for a in projections(strategies, t, op)] for t in TARGETS}


@pytest.mark.parametrize("backend", ["torch", "jax", "tvm"])
def test_table_and_cache_give_the_planner_the_same_strategies(backend, tmp_path):
    records = _records(backend)
    table = _table(records, backend)
    written, read = RuleCache(tmp_path), RuleCache(tmp_path)
    compared = 0
    for op, record in records.items():
        for e in record.entries:
            if e.status not in ("ok", "derived"):
                assert table.strategies(op, e.signature) is None, (op, e.signature)
                continue
            written.put(backend, op, e)
            cached = tuple(read.get(backend, op, e.signature).all_strategies())
            from_table = table.strategies(op, e.signature)
            assert from_table == cached, (op, e.signature)
            assert _placed(from_table, op) == _placed(cached, op), (op, e.signature)
            compared += 1
    assert compared > {"torch": 100, "jax": 40, "tvm": 10}[backend]


def test_a_mean_explored_live_keeps_the_tables_even_cut_of_an_average():
    """aten.mean.dim over a cut dim: Shard(0) -> Partial(avg). A plan knows its shapes and
    cuts evenly, so it keeps avg from the table as from a live exploration; register(),
    whose rules DTensor applies to any shape, leaves avg out on both paths alike."""
    torch = pytest.importorskip("torch")
    from metaspmd.backends.torch.rules_at_runtime import call_of
    from metaspmd.backends.torch.tensor_ops import TorchOps
    from metaspmd.placement import Partial, Shard
    from metaspmd.resolve import explore_call

    fn, args = torch.ops.aten.mean.dim, (torch.randn(8, 6), [0], True)
    call = call_of(fn, args, {})
    assert call.signature == "self:f[*,*] dim=[0] keepdim=True" and call.table_rules is not None
    live = tuple(explore_call(call, TorchOps()).all_strategies())  # a table hit has no neighbours to try first
    name = "aten.mean.dim"
    assert _placed(call.table_rules, name) == _placed(live, name)
    planned = [(a.inputs, a.outputs) for a in projections(call.table_rules, DTENSOR_PLAN, name)]
    assert ((Shard(0),), (Partial("avg"),)) in planned
    assert all(Partial("avg") not in a.outputs for a in projections(live, DTENSOR_REGISTER, name))


def test_a_max_explored_live_matches_the_jax_table():
    """jax.reduce_max over a cut reduced dim gives Partial(max), from the table as live."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from metaspmd.backends.jax.capture import capture
    from metaspmd.backends.jax.rules_at_runtime import node_call
    from metaspmd.backends.jax.tensor_ops import JaxOps
    from metaspmd.placement import Partial, Shard
    from metaspmd.resolve import explore_call

    c = capture(lambda x: jnp.max(x, axis=2), (jnp.ones((4, 6, 8), jnp.float32),))
    (op,) = [o for o in c.ir if o.op == "jax.reduce_max"]
    from_table = node_call(c, op)
    assert from_table.signature == "x:f[*,*,*] axes=[2]" and from_table.table_rules is not None
    live = tuple(explore_call(node_call(c, op, RuleTable({})), JaxOps()).all_strategies())
    assert _placed(from_table.table_rules, op.op) == _placed(live, op.op)
    assert ((Shard(2),), (Partial("max"),)) in [(a.inputs, a.outputs) for a in projections(live, JAX_PLAN)]
