"""Sample programs for the primitives that jax's test harnesses never call.

Each sample is a small function and an argument maker, traced and captured exactly like
a harness, so inputs that must satisfy a constraint (valid pivots, positive arguments,
group sizes that add up) are built by the maker and stay valid for every seed.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lax import lax as lax_internal
from jax._src.lax import linalg as lax_linalg
from jax._src.lax import windowed_reductions
from jax._src.random import philox2x32, philox4x32, threefry2x32, threefry4x32

from .program import Program

Rng = np.random.RandomState


def _normal(*shape):
    return lambda r: r.standard_normal(shape)


def _positive(*shape, low=0.5, high=3.0):
    return lambda r: r.uniform(low, high, shape)


def _ints(*shape, dtype=np.int32, low=-50, high=50):
    return lambda r: r.randint(low, high, shape).astype(dtype)


def _uints(*shape):
    return lambda r: r.randint(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)


def _bools(*shape):
    return lambda r: r.randint(0, 2, shape).astype(bool)


def _spd(*shape):
    def make(r):
        a = r.standard_normal(shape)
        return a @ np.swapaxes(a, -1, -2) + shape[-1] * np.eye(shape[-1])
    return make


def _upper_cholesky(n):
    return lambda r: np.linalg.cholesky(_spd(n, n)(r)).T


def _group_sizes(groups, total):
    def make(r):
        cuts = np.sort(r.randint(0, total + 1, groups - 1))
        return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int32)
    return make


def _key_data(*batch):
    return lambda r: np.asarray(jax.random.key_data(jax.random.split(jax.random.key(int(r.randint(1 << 30))), batch)))


def _keys(*batch):
    return lambda r: jax.random.split(jax.random.key(int(r.randint(1 << 30))), batch)


def _f8(*shape):
    return lambda r: r.standard_normal(shape).astype(jnp.float8_e4m3fn)


def _scales(*shape):
    """Block scales of scaled_dot: powers of two, the values float8_e8m0fnu holds."""
    return lambda r: (2.0 ** r.randint(-2, 3, shape)).astype(jnp.float8_e8m0fnu)


def _scaled_dot(lhs, rhs, lhs_scale, rhs_scale):
    return lax.scaled_dot(lhs, rhs, lhs_scale=lhs_scale, rhs_scale=rhs_scale,
                          dimension_numbers=(((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _select_and_scatter(operand, source, init):
    return windowed_reductions._select_and_scatter(operand, lax.ge, (2, 2), (2, 2), ((0, 0), (0, 0)), source, init, lax.add)


# primitive -> list of (function, argument makers); each pair is one sample program.
_SAMPLES: dict[str, list[tuple[Callable[..., Any], tuple[Callable[[Rng], Any], ...]]]] = {
    "clz": [(lax.clz, (_ints(4, 6),))],
    "exp2": [(lax.exp2, (_normal(4, 6),))],
    "not": [(lax.bitwise_not, (_ints(4, 6),)), (lax.bitwise_not, (_bools(4, 6),))],
    "square": [(lax.square, (_normal(4, 6),))],
    "mulhi": [(lambda x, y: lax_internal.mulhi_p.bind(x, y), (_uints(4, 6), _uints(4, 6)))],
    "polygamma": [(lax.polygamma, (lambda r: r.randint(0, 3, (4, 6)).astype(np.float64), _positive(4, 6)))],
    "zeta": [(lax.zeta, (_positive(4, 6, low=1.5, high=4.0), _positive(4, 6)))],
    "igamma_grad_a": [(lax.igamma_grad_a, (_positive(4, 6), _positive(4, 6)))],
    "reduce_xor": [(lambda x: lax_internal.reduce_xor_p.bind(x, axes=(1,)), (_ints(4, 6),)),
                   (lambda x: lax_internal.reduce_xor_p.bind(x, axes=(0,)), (_bools(6, 8),))],
    # The harnesses reduce 2x3 bool arrays: too few elements for trials whose shards differ;
    # three rows keep any/all outputs varied.
    "reduce_and": [(lambda x: lax_internal.reduce_and_p.bind(x, axes=(0,)), (_bools(3, 12),))],
    "reduce_or": [(lambda x: lax_internal.reduce_or_p.bind(x, axes=(0,)), (_bools(3, 12),))],
    "scatter-sub": [(
        lambda x, i, u: lax.scatter_sub(x, i, u, lax.ScatterDimensionNumbers((1,), (0,), (0,))),
        (_normal(6, 4), lambda r: r.randint(0, 6, (5, 1)).astype(np.int32), _normal(5, 4)),
    )],
    "cholesky_update": [(lax_linalg.cholesky_update, (_upper_cholesky(5), _normal(5)))],
    "geqrf": [(lax_linalg.geqrf, (_normal(3, 5, 4),))],
    # jpvt: a nonzero entry pins that column to the front, zero leaves it free.
    "geqp3": [(lax_linalg.geqp3, (_normal(3, 5, 4), lambda r: r.randint(0, 2, (3, 4)).astype(np.int32)))],
    "householder_product": [(lambda x: lax_linalg.householder_product(*lax_linalg.geqrf(x)), (_normal(3, 5, 4),))],
    "hessenberg": [(lax_linalg.hessenberg, (_normal(3, 4, 4),))],
    "lu_pivots_to_permutation": [(lambda a: lax_linalg.lu_pivots_to_permutation(lax_linalg.lu(a)[1], 5),
                                  (_normal(3, 5, 5),))],
    "ormqr": [(lambda x, c: lax_linalg.ormqr(*lax_linalg.geqrf(x), c, left=True, transpose=False),
               (_normal(3, 5, 4), _normal(3, 5, 2)))],
    "schur": [(lax_linalg.schur, (_normal(3, 4, 4),))],
    "symmetric_product": [(lambda a, c: lax_linalg.symmetric_product(a, c, alpha=1.5, beta=0.5),
                           (_normal(3, 4, 5), _spd(3, 4, 4)))],
    "tridiagonal": [(lax_linalg.tridiagonal, (_spd(3, 4, 4),))],
    "ragged_dot_general": [(lambda x, w, g: lax.ragged_dot(x, w, g), (_normal(8, 6), _normal(3, 6, 5), _group_sizes(3, 8)))],
    "optimization_barrier": [(lambda x, y: lax.optimization_barrier((x, y)), (_normal(4, 6), _normal(6)))],
    "stack": [(lambda x, y: lax_internal.stack_p.bind(x, y, axis=1), (_normal(4, 6), _normal(4, 6)))],
    "unstack": [(lambda x: lax_internal.unstack_p.bind(x, axis=1), (_normal(4, 3, 6),))],
    "split": [(lambda x: lax.split(x, (2, 3, 1), axis=1), (_normal(4, 6),))],
    "scaled_dot": [(_scaled_dot, (_f8(4, 64), _f8(64, 5), _scales(4, 2), _scales(2, 5)))],
    "tile": [(lambda x: lax.tile(x, (2, 1)), (_normal(4, 6),)), (lambda x: lax.tile(x, (1, 3)), (_normal(4, 6),))],
    "select_and_scatter": [(_select_and_scatter, (_normal(8, 6), _normal(4, 3), lambda r: np.float64(0.0)))],
    "eq_to": [(lambda x, y: lax_internal.eq_to_p.bind(x, y), (_ints(4, 6, low=-3, high=3), _ints(4, 6, low=-3, high=3)))],
    "le_to": [(lambda x, y: lax_internal.le_to_p.bind(x, y), (_normal(4, 6), _normal(4, 6)))],
    "lt_to": [(lambda x, y: lax_internal.lt_to_p.bind(x, y), (_normal(4, 6), _normal(4, 6)))],
    "tie": [(lambda x, y: lax_internal.tie_p.bind(x, y), (_normal(4, 6), _normal(4, 6)))],
    "random_fold_in": [(jax.vmap(jax.vmap(jax.random.fold_in)), (_keys(4, 3), _uints(4, 3)))],
    # The harnesses only call these on one key; a batch of keys gives a dim to shard.
    "random_bits": [(jax.vmap(lambda k: jax.random.bits(k, (5,))), (_keys(6),))],
    "random_split": [(jax.vmap(lambda k: jax.random.split(k, 3)), (_keys(6),))],
    "random_gamma": [(jax.vmap(lambda k, a: jax.random.gamma(k, a)), (_keys(6), _positive(6)))],
    "random_seed": [(jax.vmap(jax.random.key), (_ints(6),))],
    "random_wrap": [(jax.random.wrap_key_data, (_key_data(4, 3),))],
    "random_clone": [(jax.random.clone, (_keys(4, 3),))],
    "random_unwrap": [(jax.random.key_data, (_keys(4, 3),))],
    "threefry2x32": [(lambda *a: threefry2x32.threefry2x32_p.bind(*a), (_uints(4, 6),) * 4)],
    "threefry4x32": [(lambda *a: threefry4x32.threefry4x32_p.bind(*a), (_uints(4, 6),) * 8)],
    "philox2x32": [(lambda *a: philox2x32.philox2x32_p.bind(*a), (_uints(4, 6),) * 3)],
    "philox4x32": [(lambda *a: philox4x32.philox4x32_p.bind(*a), (_uints(4, 6),) * 6)],
}


def _program(prim: str, k: int, fun, makers) -> Program:
    def make_args(seed: int) -> list:
        r = np.random.RandomState(seed)
        return [m(r) for m in makers]
    return Program(f"sample/{prim}/{k}", fun, make_args)


def sample_programs() -> list[Program]:
    return [_program(prim, k, fun, makers) for prim in sorted(_SAMPLES) for k, (fun, makers) in enumerate(_SAMPLES[prim])]


def sampled_primitives() -> frozenset[str]:
    return frozenset(_SAMPLES)
