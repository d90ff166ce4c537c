"""Programs that call primitives: jax's own test harnesses, and this backend's samples.

``jax._src.internal_test_util.test_harnesses`` holds thousands of harnesses in 132 groups,
each a function plus an argument maker; ``samples`` adds programs for the primitives the
harnesses miss, and ``model_programs`` small models' gradients, for the signatures models
have. Tracing a program gives a jaxpr; every equation in it (with ``jit`` bodies inlined)
is a concrete call of one primitive with real params. The index (``program_index``) records
each equation abstractly (tracing every program takes seconds); ``capture`` runs one
program eagerly up to an equation and returns the arrays that flow into it, so inputs
keep whatever constraints the program built (in-range indices, positive-definite
matrices, valid keys).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core

from .program import Program  # re-exported: defined in a leaf module, see there

# Call-like primitives whose body runs as it is: traced through, not cataloged as calls.
INLINED = {"jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
           "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "checkpoint": "jaxpr",
           "remat2": "jaxpr"}


# Params jax's own functions always bind and a harness may leave out, at the value those
# functions bind: ``lax.mul`` binds ``out_dtype=None``, jax's mul harness no out_dtype.
# Filled in, so that a harness call keys the rules a program's call looks up (a table
# entry ``x:f[*,*] y:f[*,*]`` matched no model's mul).
BOUND_DEFAULTS = {"mul": {"out_dtype": None}}


@dataclass(frozen=True)
class Occurrence:
    """One primitive equation inside one program."""

    program: int  # index into programs()
    path: tuple[int, ...]  # equation indices, through inlined calls
    primitive: str
    prim: core.Primitive = field(compare=False, hash=False)
    params: dict = field(compare=False, hash=False)
    in_avals: tuple = field(compare=False, hash=False)  # core.ShapedArray per operand

    @classmethod
    def of(cls, program: int, path: tuple[int, ...], eqn: core.JaxprEqn) -> "Occurrence":
        """The equation ``eqn`` at ``path`` of program ``program``, its params as jax's own
        functions bind them."""
        name = eqn.primitive.name
        return cls(program, path, name, eqn.primitive, {**BOUND_DEFAULTS.get(name, {}), **eqn.params},
                   tuple(v.aval for v in eqn.invars))


@functools.lru_cache(maxsize=1)
def harnesses() -> tuple:
    """Every harness that runs on the CPU, in jax's own order."""
    from jax._src.internal_test_util import test_harnesses

    return tuple(h for h in test_harnesses.all_harnesses if h.filter("cpu"))


def harness_groups() -> list[str]:
    return sorted({h.group_name for h in harnesses()})


def _harness_program(h) -> Program:
    return Program(f"harness/{h.group_name}/{h.name}", h.dyn_fun,
                   lambda seed: h.dyn_args_maker(np.random.RandomState(seed)))


@functools.lru_cache(maxsize=1)
def programs() -> tuple[Program, ...]:
    """Harness programs first (jax's order), then the samples, then the model programs."""
    from .model_programs import model_programs
    from .samples import sample_programs

    return tuple(_harness_program(h) for h in harnesses()) + tuple(sample_programs()) + tuple(model_programs())


def _body(eqn) -> core.Jaxpr | None:
    key = INLINED.get(eqn.primitive.name)
    if key is None:
        return None
    body = eqn.params.get(key)
    return body.jaxpr if isinstance(body, core.ClosedJaxpr) else body


def _walk(jaxpr: core.Jaxpr, path: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], Any]]:
    for k, eqn in enumerate(jaxpr.eqns):
        body = _body(eqn)
        if body is not None:
            yield from _walk(body, path + (k,))
        else:
            yield path + (k,), eqn


def _trace(p: Program, seed: int) -> tuple[core.ClosedJaxpr, list]:
    args = list(p.make_args(seed))
    return jax.make_jaxpr(p.fun)(*args), args


# --------------------------------------------------------------------------- capture


def _read(env: dict, v) -> Any:
    if isinstance(v, core.Literal):
        return jnp.asarray(v.val, dtype=v.aval.dtype)
    return env[v]


def _run_to(jaxpr: core.Jaxpr, consts, args, path: tuple[int, ...]) -> list[Any]:
    """Evaluate ``jaxpr`` eagerly until the equation at ``path``; its operands."""
    env: dict = {}
    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for k, eqn in enumerate(jaxpr.eqns):
        invals = [_read(env, v) for v in eqn.invars]
        if k == path[0]:
            if len(path) == 1:
                return invals
            body = eqn.params[INLINED[eqn.primitive.name]]
            inner, inner_consts = (body.jaxpr, body.consts) if isinstance(body, core.ClosedJaxpr) else (body, ())
            return _run_to(inner, inner_consts, invals, path[1:])
        # bound as core.eval_jaxpr binds: a custom_jvp call's params become its functions
        outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
        outs = outs if eqn.primitive.multiple_results else [outs]
        for v, x in zip(eqn.outvars, outs):
            if not isinstance(v, core.DropVar):
                env[v] = x
    raise LookupError(f"no equation at {path}")


def capture(occ: Occurrence, seed: int) -> list[jax.Array]:
    """The operands of ``occ`` when its program runs on inputs drawn with ``seed``."""
    closed, args = _trace(programs()[occ.program], seed)
    args = [jnp.asarray(a) if isinstance(a, (np.ndarray, np.generic)) else a for a in args]
    consts = [jnp.asarray(c) if isinstance(c, (np.ndarray, np.generic)) else c for c in closed.consts]
    operands = _run_to(closed.jaxpr, consts, args, occ.path)
    return [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in operands]
