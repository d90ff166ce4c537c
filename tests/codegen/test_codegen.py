"""Codegen: deterministic tables, no code injection from crafted YAML, readable rule diffs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from metaspmd.codegen.generator import generate
from metaspmd.codegen.model import shardy_rule
from metaspmd.registry_io import RegistryError, loads_record
from metaspmd.rule_diff import diff, load_side, to_markdown
from metaspmd.table import RuleTable
from metaspmd.target import DTENSOR_REGISTER, JAX_PLAN, projections

ROOT = Path(__file__).resolve().parents[2]

MM = """\
schema: 1
op: {op}
backend: {backend}
status: ok
entries:
- signature: {sig}
  status: ok
  shard: [[S1, S2], [S2, S3]]
  combine: {{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}}
  example:
    self: {{shape: [6, 4], dtype: float64}}
    mat2: {{shape: [4, 5], dtype: float64}}
  results:
  - {{shape: [6, 5], dtype: float64}}
  verified: {{trials: 3, shard_counts: [2, 3], uneven: true}}
"""


def write(root, backend, op, sig="'self:f[*,*] mat2:f[*,*]'", text=MM):
    path = root / backend / f"{op}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.format(op=op, backend=backend, sig=sig))
    return path


def load_module(text):
    ns = {}
    exec(compile(text, "<generated>", "exec"), ns)
    return ns


def placed(rules, op, sig, target=DTENSOR_REGISTER):
    """The table's strategies at ``sig`` as the target runs them, in paper-ish strings."""
    projected = projections(RuleTable(rules).strategies(op, sig), target, op)
    return [tuple(map(str, a.inputs)) + ("->",) + tuple(map(str, a.outputs)) for a in projected]


def test_torch_table_is_deterministic_and_loadable(tmp_path):
    write(tmp_path, "torch", "aten.mm.default")
    text = generate(tmp_path, "torch")
    assert "do not edit" in text.splitlines()[0]
    assert text == generate(tmp_path, "torch")
    assert "import torch" not in text  # the tables keep the rule model: no framework
    rules = load_module(text)["RULES"]
    assert placed(rules, "aten.mm.default", "self:f[*,*] mat2:f[*,*]") == [
        ("S(0)", "R", "->", "S(0)"), ("S(1)", "S(0)", "->", "P(sum)"), ("R", "S(1)", "->", "S(1)")]


FOREACH = """\
schema: 1
op: aten._foreach_add.Tensor
backend: torch
status: ok
entries:
- signature: self:[f[*],f[*]] other:f[]
  status: ok
  shard: [[S1], [S1], []]
  combine: {S1: [gather(dim=0), gather(dim=0)]}
  more:
  - shard: [[S2], [N], []]
    combine: {S2: [gather(dim=0), identity]}
  example:
    self:
    - {shape: [4], dtype: float64}
    - {shape: [4], dtype: float64}
    other: {shape: [], dtype: float64}
  results:
  - {shape: [4], dtype: float64}
  - {shape: [4], dtype: float64}
"""


def test_torch_table_reads_further_layers(tmp_path):
    # the list's first tensor cut alone cuts a dim S1 labels: a further layer holds it
    path = tmp_path / "torch" / "aten._foreach_add.Tensor.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(FOREACH)
    rules = load_module(generate(tmp_path, "torch"))["RULES"]
    assert placed(rules, "aten._foreach_add.Tensor", "self:[f[*],f[*]] other:f[]") == [
        ("S(0)", "S(0)", "R", "->", "S(0)", "S(0)"), ("S(0)", "R", "R", "->", "S(0)", "R")]


def test_jax_table_has_shardy_rule(tmp_path):
    write(tmp_path, "jax", "jax.dot_general")
    rules = load_module(generate(tmp_path, "jax"))["RULES"]
    assert rules["jax.dot_general"]["self:f[*,*] mat2:f[*,*]"].shardy == ("s1 s2, s2 s3 -> s1 s3", ("s2",), ())
    assert placed(rules, "jax.dot_general", "self:f[*,*] mat2:f[*,*]", JAX_PLAN)[:2] == [
        ("S(0)", "R", "->", "S(0)"), ("S(1)", "S(0)", "->", "P(sum)")]


def test_crafted_signature_cannot_inject_code(tmp_path):
    evil = "'x\": 1}}\\nimport os; os.system(\"echo pwned\")\\n#'"
    write(tmp_path, "torch", "aten.mm.default", sig=evil.replace("\\n", " "))
    with pytest.raises(RegistryError, match="malformed signature"):  # no signature looks like that
        generate(tmp_path, "torch")
    # one that does: a string argument holding quotes, braces and a newline
    value = 'x": 1}}\nimport os; os.system("echo pwned")\n#'
    crafted = f"self:f[*,*] mat2:f[*,*] equation={value!r}"
    path = write(tmp_path, "torch", "aten.mm.default", sig=json.dumps(crafted))  # a YAML double-quoted scalar
    path.write_text(path.read_text().replace("  results:", f"    equation: {json.dumps(value)}\n  results:"))
    text = generate(tmp_path, "torch")
    assert "\nimport os" not in text
    assert list(load_module(text)["RULES"]["aten.mm.default"]) == [crafted]


@pytest.mark.parametrize("field,value,error", [
    ("op: aten.mm.default", "op: 'aten.mm\"]; import os; x = [\"'", "characters a rule file may not use"),
    ("S3: gather(dim=1)", "S3: gather(dim=1); import os", "bad combine"),
    ("[[S1, S2], [S2, S3]]", "[[S1, S2], [S2, S3, os.system]]", "bad dim label"),
])
def test_crafted_fields_are_rejected(tmp_path, field, value, error):
    path = write(tmp_path, "torch", "aten.mm.default")
    path.write_text(path.read_text().replace(field, value))
    with pytest.raises(RegistryError, match=error):
        generate(tmp_path, "torch")


def test_shardy_rule_marks_unshardable_dims_need_replication():
    text = MM.format(op="x", backend="jax", sig="'self:f[*,*] mat2:f[*,*]'").replace(
        "[[S1, S2], [S2, S3]]", "[[S1, N], [N, S3]]").replace("S2: reduce(sum), ", "")
    rule = shardy_rule(loads_record(text).entries[0])
    assert rule.rule == "s1 r1, r2 s3 -> s1 s3" and rule.need_replication_factors == ("r1", "r2")


def test_rule_diff_one_lost_one_gained(tmp_path):
    base, head = tmp_path / "base", tmp_path / "head"
    write(base, "torch", "aten.mm.default")
    write(head, "torch", "aten.mm.default", text=MM.replace(
        "[[S1, S2], [S2, S3]]", "[[S1, N], [N, S2]]").replace(
        "{{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}}", "{{S1: gather(dim=0) | identity, S2: gather(dim=1)}}"))
    d = diff(load_side(str(base)), load_side(str(head)))
    assert [x[3] for x in d.lost] == ["shard [[N, S1], [S1, N]] combine {S1: reduce(sum)}",
                                      "shard [[S1, N], [N, N]] combine {S1: gather(dim=0)}"]
    assert [x[3] for x in d.gained] == ["shard [[S1, N], [N, N]] combine {S1: gather(dim=0) | identity}"]
    md = to_markdown(d, "base", "head")
    assert "| 0 | 0 | 0 | 1 | 2 |" in md
    out = subprocess.run([sys.executable, str(ROOT / "tools/rule_diff.py"), str(base), str(head), "--fail-on-loss"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "### Rules lost" in out.stdout
    out = subprocess.run([sys.executable, str(ROOT / "tools/rule_diff.py"), str(base), str(base), "--fail-on-loss"],
                         capture_output=True, text=True)
    assert out.returncode == 0


def test_codegen_check_detects_stale_table(tmp_path):
    write(tmp_path / "reg", "torch", "aten.mm.default")
    cmd = [sys.executable, str(ROOT / "tools/codegen.py"), "--backend", "torch", "--registry", str(tmp_path / "reg"),
           "--out", str(tmp_path / "gen")]
    assert subprocess.run(cmd + ["--check"], capture_output=True).returncode == 1
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    assert subprocess.run(cmd + ["--check"], capture_output=True).returncode == 0
