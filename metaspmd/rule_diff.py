"""What changed between two registries, as markdown for a pull request.

Registries come from a folder (a registry root holding ``<backend>/*.yaml``) or a git
revision (its ``registry/`` tree). A rule is one strategy of one signature, identified by
its input placements; it is shown in paper notation with its own label ``S1``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .registry_io import load_registry, loads_record
from .rules import OpRecord
from .spec import (
    CombineSpec, DimLabel, IndexOffset, N, OffsetIn, OffsetSpec, OutputCombine, PartialIn, PartialInput, PartialSpec,
    ShardIn, ShardSpec, Strategy,
)

Registry = dict[tuple[str, str], OpRecord]  # (backend, op) -> record


def load_side(where: str, repo: Path | None = None, subdir: str = "registry") -> Registry:
    """A registry from a folder, or from a git revision of ``repo``."""
    path = Path(where)
    if path.is_dir():
        return _from_folder(path)
    return _from_git(where, repo or Path.cwd(), subdir)


def _from_folder(root: Path) -> Registry:
    out: Registry = {}
    for backend_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for op, record in load_registry(root, backend_dir.name).items():
            out[(backend_dir.name, op)] = record
    return out


def _from_git(rev: str, repo: Path, subdir: str) -> Registry:
    def git(*args: str) -> str:
        result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        if result.returncode != 0:
            raise ValueError(f"{rev!r} is neither a folder nor a git revision: {result.stderr.strip()}")
        return result.stdout

    out: Registry = {}
    for name in git("ls-tree", "-r", "--name-only", rev, "--", subdir).splitlines():
        if name.endswith(".yaml"):
            record = loads_record(git("show", f"{rev}:{name}"), f"{rev}:{name}")
            out[(Path(name).parent.name, record.op)] = record
    return out


def rule_text(s: Strategy, ranks: tuple[int, ...]) -> str:
    """One strategy in paper notation, labelled S1."""
    dims = [[N] * r for r in ranks]
    partial: list[list[PartialIn]] = [[] for _ in ranks]
    offset: list[list[OffsetIn]] = [[] for _ in ranks]
    for i, p in enumerate(s.inputs):
        if isinstance(p, ShardIn):
            dims[i][p.dim] = DimLabel("S1", p.halo, p.scale, p.extend)
        elif isinstance(p, PartialInput):
            partial[i].append(PartialIn("S1", p.op))
        elif isinstance(p, IndexOffset):
            offset[i].append(OffsetIn("S1", p.component, p.drop))
    text = f"shard {ShardSpec(tuple(map(tuple, dims)))}"
    if any(partial):
        text += f" partial {PartialSpec(tuple(map(tuple, partial)))}"
    if any(offset):
        text += f" offset {OffsetSpec(tuple(map(tuple, offset)))}"
    return text + f" combine {CombineSpec.of({'S1': s.outputs})}"


def _rules(record: OpRecord) -> dict[str, dict[tuple, tuple[str, tuple[OutputCombine, ...]]]]:
    out = {}
    for e in record.entries:
        ranks = tuple(len(row) for row in e.shard.inputs)
        out[e.signature] = {s.inputs: (rule_text(s, ranks), s.outputs) for s in e.all_strategies()}
    return out


@dataclass
class Diff:
    added: list[tuple[str, str, str]] = field(default_factory=list)  # (backend, op, status)
    removed: list[tuple[str, str, str]] = field(default_factory=list)
    status: list[tuple[str, str, str, str, str]] = field(default_factory=list)  # + old, new, reason
    gained: list[tuple[str, str, str, str]] = field(default_factory=list)  # backend, op, signature, rule
    lost: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def has_loss(self) -> bool:
        return bool(self.lost or self.removed)


def diff(base: Registry, head: Registry) -> Diff:
    d = Diff()
    for key in sorted(set(base) | set(head)):
        backend, op = key
        if key not in base:
            d.added.append((backend, op, head[key].status))
            d.gained += [(backend, op, sig, text) for sig, rules in sorted(_rules(head[key]).items()) for text in sorted(t for t, _ in rules.values())]
            continue
        if key not in head:
            d.removed.append((backend, op, base[key].status))
            d.lost += [(backend, op, sig, text) for sig, rules in sorted(_rules(base[key]).items()) for text in sorted(t for t, _ in rules.values())]
            continue
        old, new = base[key], head[key]
        if old.status != new.status:
            d.status.append((backend, op, old.status, new.status, new.reason))
        old_rules, new_rules = _rules(old), _rules(new)
        for sig in sorted(set(old_rules) | set(new_rules)):
            o, n = old_rules.get(sig, {}), new_rules.get(sig, {})
            lost = sorted(text for k, (text, _) in o.items() if k not in n or n[k][1] != o[k][1])
            gained = sorted(text for k, (text, _) in n.items() if k not in o or n[k][1] != o[k][1])
            d.lost += [(backend, op, sig, t) for t in lost]
            d.gained += [(backend, op, sig, t) for t in gained]
    return d


def to_markdown(d: Diff, base_name: str, head_name: str) -> str:
    lines = [
        f"## Rule changes: `{base_name}` → `{head_name}`", "",
        "| ops added | ops removed | status changes | rules gained | rules lost |", "|---|---|---|---|---|",
        f"| {len(d.added)} | {len(d.removed)} | {len(d.status)} | {len(d.gained)} | {len(d.lost)} |",
    ]

    def section(title: str, rows: list[str]) -> None:
        if rows:
            lines.extend(["", f"### {title}", "", *rows])

    section("Ops added", [f"- `{b}/{op}` ({s})" for b, op, s in d.added])
    section("Ops removed", [f"- `{b}/{op}` (was {s})" for b, op, s in d.removed])
    section("Status changes", [f"- `{b}/{op}`: {o} → {n}" + (f" ({r})" if r else "") for b, op, o, n, r in d.status])
    section("Rules lost", [f"- `{b}/{op}` `{sig}`: `{t}`" for b, op, sig, t in d.lost])
    section("Rules gained", [f"- `{b}/{op}` `{sig}`: `{t}`" for b, op, sig, t in d.gained])
    return "\n".join(lines) + "\n"
