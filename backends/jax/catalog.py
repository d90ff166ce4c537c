"""The jax primitive catalog: every primitive jax defines, and how each one is handled.

The universe is every ``core.Primitive`` defined in ``jax.lax`` and ``jax._src.lax.*``, the
PRNG primitives of ``jax._src.random.*``, the few that ``ad_util``, ``dispatch`` and ``pjit``
define, and any other primitive a program's jaxpr contains. Ops are named
``jax.<primitive name>`` (``jax.dot_general``, ``jax.scatter-add``).

A primitive is explored when some program (a jax test harness or a sample) calls it;
collectives, control flow, sharding annotations and the like are listed with the reason
they are not.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass

from jax._src import core

from . import program_index

PREFIX = "jax."

_MODULES = ("jax.lax", "jax.lax.linalg", "jax._src.ad_util", "jax._src.dispatch", "jax._src.pjit")
_PACKAGES = ("jax._src.lax", "jax._src.random")
_COLLECTIVE_MODULE = "jax._src.lax.parallel"

# Not explorable by running the primitive on shards, and why. The op status comes first.
_NOT_EXPLORED: dict[str, tuple[str, str]] = {}
for _names, _status, _reason in (
    (("scan",), "composite",
     "control flow, planned through its body: the body's ops keep their own rules (each charged once per "
     "iteration), a carry keeps one placement across iterations, a scanned-over operand cut along dim d "
     "gives slices cut along d - 1 (the iteration dim stays whole), a stacked result the other way"),
    (("while",), "composite",
     "control flow, planned through its body: the body's ops keep their own rules (charged per iteration, "
     "the trip count read off static bounds, else a stated estimate), a carry keeps one placement across "
     "iterations; the condition runs on the carries where they are"),
    (("cond",), "composite",
     "control flow, planned through its branches: each branch's ops keep their own rules, and every "
     "branch delivers each output in the one placement the plan gives it"),
    (("custom_linear_solve",), "composite",
     "a linear solve, planned through its solve jaxpr, which is all its impl and lowering run (the matvec "
     "and transpose jaxprs serve its derivative rules, applied when the program was traced)"),
    (("eval_jaxpr", "composite", "platform_index"), "skipped",
     "control flow: its bodies are jaxprs traced at fixed shapes, so it cannot run on shards; the "
     "primitives inside harness bodies are explored one by one"),
    (("jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "checkpoint", "remat2"), "skipped",
     "call: inlined when programs are traced; the primitives of its body are explored"),
    (("sharding_constraint", "layout_constraint", "reshard"), "skipped",
     "sharding annotation: needs a mesh; it is what a plan emits, not an op to shard"),
    (("after_all", "create_token"), "skipped", "token for effect ordering: carries no array data"),
    (("empty", "empty2"), "skipped", "uninitialized output: results cannot be compared"),
    (("dce_sink",), "skipped", "has no outputs (keeps a value alive for dead-code elimination)"),
    (("stage",), "skipped", "staging marker: an identity that tracing folds away, never left in a jaxpr"),
    (("to_edtype", "from_edtype"), "skipped",
     "internal extended-dtype cast; random_wrap and random_unwrap are its explored public forms"),
    (("zeros_like",), "skipped", "autodiff's symbolic zero: has no abstract evaluation, never in a traced program"),
    (("rng_uniform",), "nondeterministic", "stateful RNG: two identical calls differ"),
):
    for _name in _names:
        _NOT_EXPLORED[_name] = (_status, _reason)

_COLLECTIVE_REASON = ("collective over a named mesh axis: it is the communication a rule's combine "
                      "stands for, not a local op to shard")


@dataclass(frozen=True)
class CatalogEntry:
    primitive: str
    status: str  # 'explore', or the op status it gets without exploring (skipped, ...)
    reason: str = ""
    sources: tuple[str, ...] = ()  # harness groups and samples that call it

    @property
    def op(self) -> str:
        return PREFIX + self.primitive


def _module_names() -> list[str]:
    names = list(_MODULES)
    for package in _PACKAGES:
        mod = importlib.import_module(package)
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(mod.__path__, package + ".")]
    return names


@functools.lru_cache(maxsize=1)
def defined_primitives() -> dict[str, core.Primitive]:
    """Every primitive the scanned jax modules define, by name."""
    found: dict[str, core.Primitive] = {}
    for name in _module_names():
        try:
            mod = importlib.import_module(name)
        except Exception:  # an optional module (a GPU plugin) that does not import here
            continue
        for value in vars(mod).values():
            if isinstance(value, core.Primitive):
                found.setdefault(value.name, value)
    return found


@functools.lru_cache(maxsize=1)
def collectives() -> frozenset[str]:
    mod = importlib.import_module(_COLLECTIVE_MODULE)
    return frozenset(v.name for v in vars(mod).values() if isinstance(v, core.Primitive))


@functools.lru_cache(maxsize=1)
def catalog() -> dict[str, CatalogEntry]:
    """Op name -> entry, for every defined or called primitive."""
    index = program_index.index()
    names = set(defined_primitives()) | set(index)
    out = {}
    for name in sorted(names):
        sources = tuple(program_index.sources_of(name))
        if name in collectives():
            entry = CatalogEntry(name, "skipped", _COLLECTIVE_REASON, sources)
        elif name in _NOT_EXPLORED:
            status, reason = _NOT_EXPLORED[name]
            entry = CatalogEntry(name, status, reason, sources)
        elif name in index:
            entry = CatalogEntry(name, "explore", "", sources)
        else:
            entry = CatalogEntry(name, "no-sample", "no harness or sample calls it")
        out[entry.op] = entry
    return out


def primitive_of(op: str) -> str:
    if not op.startswith(PREFIX):
        raise KeyError(f"not a jax op: {op}")
    return op[len(PREFIX):]
