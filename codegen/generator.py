"""Render the registry into static rule tables with jinja2.

Nothing from a YAML file reaches the output as raw text: every ``{{ }}`` value passes
through ``_literal``, which renders plain data (str, int, bool, None, tuples of those) with
``repr`` and refuses anything else, and rule-model strings come from validated model
objects. A crafted registry file therefore cannot inject code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from metaspmd.registry_io import load_rules
from metaspmd.rules import VERIFIED
from metaspmd.table import Entry, entry_of

from .model import CodegenError, check_op_name, shardy_rule

TEMPLATES = Path(__file__).parent / "templates"
TARGETS = {"torch": "torch_rules.py", "jax": "jax_rules.py"}
TITLES = {"torch": "PyTorch (ATen)", "jax": "JAX", "tvm": "TVM TE"}
SHARDY_NOTE = """, and, where
the strategies fit one, ``shardy``: a Shardy factor rule for
jax.experimental.custom_partitioning (the rule, its reduction and need-replication factors)"""


@dataclass(frozen=True)
class Code:
    """Text the generator writes itself (a backend's name and title), never registry data."""

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


def _table_entry(op: str, e, backend: str) -> Entry:
    if backend != "jax":
        return entry_of(e)
    sr = shardy_rule(e)
    return entry_of(e, (sr.rule, sr.reduction_factors, sr.need_replication_factors) if sr else ())


def render(records, backend: str, source: str = "registry") -> str:
    """The table module of one backend: every verified entry, in the rule model's terms;
    ``source``: the registry root it was made from, as its header names it."""
    ops = []
    n_entries = 0
    for op in sorted(records):
        record = records[op]
        sigs = [(e.signature, _table_entry(op, e, backend)) for e in record.entries if e.status in VERIFIED]
        if sigs:
            n_entries += len(sigs)
            ops.append((check_op_name(op), sorted(sigs, key=lambda s: s[0])))
    return _env().get_template("rules.py.j2").render(
        ops=ops, n_ops=len(ops), n_entries=n_entries, backend=Code(backend), title=Code(TITLES[backend]),
        # one comment line of UTF-8, whatever the path holds (a newline, bytes that are not UTF-8)
        source=Code(" ".join(source.encode("utf-8", "backslashreplace").decode("utf-8").split())),
        shardy_note=Code(SHARDY_NOTE if backend == "jax" else ""),
    )


def generate(registry_root: str | Path, backend: str, source: str = "registry") -> str:
    """The generated module text for one backend (registry errors name file:line). A root
    that is not a registry, or a backend folder without rule files, is an error: its table
    would be empty and replace the real one. ``source``: the root as the header names it."""
    return render(load_rules(registry_root, backend), backend, source)
