"""select_n's ``which`` redrawn on every fresh trial, every case picked over a few.

Kept as the program captured it, a ``jnp.where`` on a scalar flag that was False picked the
second case on every trial: ``(R, R, P(sum)) -> identity`` and ``(R, P(sum), R) ->
reduce(sum)`` passed, wrong once the flag is True (the entry is keyed by shapes alone, so
the next call's flag reads it too). So did an int ``which`` that never held some case."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from metaspmd.backends.jax.capture import capture  # noqa: E402
from metaspmd.backends.jax.indices import fresh_indices  # noqa: E402
from metaspmd.backends.jax.rules_at_runtime import node_call  # noqa: E402
from metaspmd.backends.jax.tensor_ops import JaxOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.table import RuleTable  # noqa: E402


@pytest.mark.parametrize("which", [np.asarray(False), np.asarray(0, np.int32), np.zeros((4,), np.int32),
                                   np.ones((2, 3), bool)])
def test_picks_cover_every_case_over_consecutive_seeds(which):
    cases = 2 if which.dtype == bool else 3
    operands = [jnp.asarray(which)] + [jnp.zeros(which.shape)] * cases
    seen = set()
    for seed in range(cases):
        picks = fresh_indices("select_n", {}, operands, seed)[0]
        assert picks.shape == which.shape and picks.dtype == which.dtype
        assert np.array_equal(picks, fresh_indices("select_n", {}, operands, seed)[0])  # repeatable
        seen |= set(np.asarray(picks, dtype=np.int64).ravel().tolist())
    assert seen == set(range(cases))


def _strategies(fn, *args) -> set[str]:
    c = capture(fn, tuple(args), backward=False)
    c.values.record()
    node = next(n for n in c.ir.op_list if n.op == "jax.select_n")
    entry = explore_case(node_call(c, node, RuleTable({})).case(), JaxOps())
    assert entry.status == "ok", entry.reason
    return {str(s).split(": ", 1)[1] for s in entry.strategies()}


def _floats(*shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


@pytest.mark.parametrize("fn, which, cases", [
    (lambda f, a, b: jnp.where(f, a, b), jnp.asarray(False), 2),
    (lambda f, a, b: jnp.where(f, a, b), jnp.asarray(True), 2),
    (lambda w, a, b: lax.select_n(w, a, b), jnp.asarray(0, jnp.int32), 2),
    (lambda w, a, b, c: lax.select_n(w, a, b, c), jnp.asarray([0, 2, 2, 0, 2, 0], jnp.int32), 3),
])
def test_a_case_the_example_never_picks_is_no_partial_of_its_own(fn, which, cases):
    shape = (3, 5) if which.ndim == 0 else which.shape
    found = _strategies(fn, which, *[_floats(*shape, seed=i) for i in range(cases)])
    partial = [s for s in found if "P(" in s]
    # only every case Partial together (the picks of sums are the sums of the picks)
    assert all(s.count("P(sum)") == cases for s in partial), found
