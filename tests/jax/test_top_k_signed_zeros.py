"""argreduce beside a kernel that orders signed zeros.

argreduce compares as IEEE does (-0.0 == +0.0, the lowest shard wins on a tie), as jax's
argmax and argmin do; ``lax.top_k`` orders floats totally, +0.0 above -0.0, so its index
of ``[[-0.0, 0.0]]`` is 1 where the shards' argreduce gives 0. A trial with each line's
extreme a zero of each sign on two shards refutes top_k's argreduce, and leaves argmax's."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from metaspmd.backends.jax.capture import capture  # noqa: E402
from metaspmd.backends.jax.rules_at_runtime import node_call  # noqa: E402
from metaspmd.backends.jax.tensor_ops import JaxOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.table import RuleTable  # noqa: E402


def _strategies(fn, x, prim) -> set[str]:
    c = capture(fn, (x,), backward=False)
    c.values.record()
    node = next(n for n in c.ir.op_list if n.op == "jax." + prim)
    entry = explore_case(node_call(c, node, RuleTable({})).case(), JaxOps())
    assert entry.status == "ok", entry.reason
    return {str(s).split(": ", 1)[1] for s in entry.strategies()}


def _floats(*shape):
    return jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32)


def test_the_counterexample():
    x = jnp.array([[-0.0, 0.0]], jnp.float32)
    assert int(lax.top_k(x, 1)[1][0, 0]) == 1 and int(jnp.argmax(x, axis=1)[0]) == 0


@pytest.mark.parametrize("shape", [(5, 3), (2, 7), (4, 6)])
def test_top_k_along_its_axis_keeps_no_argreduce(shape):
    found = _strategies(lambda x: lax.top_k(x, 1), _floats(*shape), "top_k")
    assert not any("argreduce" in s for s in found), found
    assert "(S(0)) -> (gather(dim=0), gather(dim=0))" in found


@pytest.mark.parametrize("fn, prim, kept", [
    (lambda x: jnp.argmax(x, axis=1), "argmax", "(S(1)) -> (argreduce(max, input=0))"),
    (lambda x: jnp.argmin(x, axis=0), "argmin", "(S(0)) -> (argreduce(min, input=0))"),
])
def test_argmax_and_argmin_keep_theirs(fn, prim, kept):
    assert kept in _strategies(fn, _floats(6, 5), prim)
