"""Render the registry into static rule tables with jinja2.

Nothing from a YAML file reaches the output as raw text: every ``{{ }}`` value passes
through ``_literal``, which renders plain data (str, int, bool, None, tuples of those) with
``repr`` and refuses anything else, and placement code comes only from validated
``Placement`` objects (``Code``). A crafted registry file therefore cannot inject code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from metaspmd.registry_io import load_registry

from .model import DTENSOR_MASKS, CodegenError, check_op_name, jax_strategies, placement_rules, shardy_rule

TEMPLATES = Path(__file__).parent / "templates"
TARGETS = {"torch": "torch_rules.py", "jax": "jax_rules.py"}


@dataclass(frozen=True)
class Code:
    """Source text built by the generator itself from validated values."""

    text: str


def _literal(value) -> str:
    if isinstance(value, Code):
        return value.text
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, tuple):
        if len(value) == 1:
            return "(" + _literal(value[0]) + ",)"
        return "(" + ", ".join(_literal(v) for v in value) + ")"
    raise CodegenError(f"refusing to render {type(value).__name__} {value!r} into generated code")


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined, finalize=_literal,
        keep_trailing_newline=True, autoescape=False,
    )


def _placements(ps) -> Code:
    return Code(", ".join(p.code() for p in ps) + ("," if len(ps) == 1 else ""))


def render_torch(records) -> str:
    ops = []
    n_entries = 0
    for op in sorted(records):
        rules = placement_rules(records[op])
        if not rules:
            continue
        sigs = [(sig, [dict(inputs=_placements(r.inputs), outputs=_placements(r.outputs)) for r in rules[sig]]) for sig in sorted(rules)]
        n_entries += len(sigs)
        ops.append((check_op_name(op), sigs))
    masks = ", ".join(sorted(DTENSOR_MASKS))
    return _env().get_template("torch_rules.py.j2").render(ops=ops, n_ops=len(ops), n_entries=n_entries, masks=masks)


def render_jax(records) -> str:
    ops = []
    n_entries = 0
    for op in sorted(records):
        record = records[op]
        check_op_name(op)
        sigs = []
        for e in record.entries:
            if e.status not in ("ok", "derived"):
                continue
            strategies = jax_strategies(e)
            if not strategies:
                continue
            sr = shardy_rule(e)
            sigs.append((e.signature, dict(
                strategies=strategies,
                sharding_rule=sr.rule if sr else None,
                reduction_factors=sr.reduction_factors if sr else (),
                need_replication_factors=sr.need_replication_factors if sr else (),
            )))
        if sigs:
            n_entries += len(sigs)
            ops.append((op, sorted(sigs, key=lambda s: s[0])))
    return _env().get_template("jax_rules.py.j2").render(ops=ops, n_ops=len(ops), n_entries=n_entries)


RENDERERS = {"torch": render_torch, "jax": render_jax}


def generate(registry_root: str | Path, backend: str) -> str:
    """The generated module text for one backend (registry errors name file:line)."""
    records = load_registry(registry_root, backend)
    return RENDERERS[backend](records)
