"""What changed between two registries, as markdown for a pull request.

Registries come from a folder (a registry root holding ``<backend>/*.yaml``) or a git
revision (its ``registry/`` tree). A rule is one strategy of one signature, identified by
its input placements; it is shown in paper notation with its own label ``S1``.

A rule counts as present only where codegen puts it in a table (``VERIFIED``: an entry whose
status is ok or derived), so an entry turned failed loses its rules, though their text stays.

Only files that differ are read: between two revisions, the files whose git object or
mode differs (those ``git diff --name-only`` lists); between two folders, the files whose
bytes differ. An unchanged file adds nothing to the diff, and a registry holds thousands.
A changed base file that does not read (what the head fixes) is listed as unreadable, its
rules not compared; the head is read as codegen reads it.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .registry_io import (
    MOST_FILE_BYTES, RegistryError, backend_folder_problem, backend_names, check_backend_folder, check_registry_root,
    load_record, load_registry, loads_record, read_file, refuse_misnamed,
)
from .rules import VERIFIED, OpRecord, RuleEntry
from .spec import (
    CombineSpec, DimLabel, IndexOffset, N, OffsetIn, OffsetSpec, OutputCombine, PartialIn, PartialInput, PartialSpec,
    ShardIn, ShardSpec, Strategy,
)


@dataclass(frozen=True)
class Unreadable:
    """A changed file of the base that cannot be read (a broken file the head fixes): its
    rules are unknown, and no table held them (codegen refuses such a registry)."""

    where: str
    reason: str


Registry = dict[tuple[str, str], "OpRecord | Unreadable"]  # (backend, op) -> record


def _is_folder(where: str) -> bool:
    """``where`` names a folder; a name no path can have (too long) is taken for a revision,
    which git then refuses by name."""
    try:
        return Path(where).is_dir()
    except OSError:
        return False


def load_side(where: str, repo: Path | None = None, subdir: str = "registry") -> Registry:
    """A whole registry from a folder, or from a git revision of ``repo``."""
    if _is_folder(where):
        return _from_folder(Path(where))
    git = _Git(repo or Path.cwd())
    rev = git.commit(where)
    tree = git.tree(rev, subdir)
    _refuse_empty(where, tree, subdir)
    _check_tree(where, tree, subdir, whole=True)
    names = _rule_files(tree, subdir)
    return _records(names, git.blobs(rev, names), where)


def load_sides(base: str, head: str, repo: Path | None = None, subdir: str = "registry") -> tuple[Registry, Registry]:
    """The two sides of a diff, reading only the files that differ between them (see the
    module's doc); a folder against a revision reads both whole."""
    for name, where in (("base", base), ("head", head)):
        if not where.strip():  # Path('') is the current folder
            raise ValueError(f"{name} {where!r} is empty: expected a git revision or a registry folder")
        # a folder named like a tag (v1/ beside tag v1) would win unsaid: the other was meant as often
        if _is_folder(where) and _Git(repo or Path.cwd()).is_commit(where):
            raise ValueError(f"{name} {where!r} names both a folder and a git revision: write ./{where} for the "
                             f"folder or {where}^{{commit}} for the revision")
    if _is_folder(base) and _is_folder(head):
        return _spread_backends(*_changed_folders(Path(base), Path(head)))
    if _is_folder(base) or _is_folder(head):
        # the revision first: it is checked in a fraction of a second, the folder read in seconds
        if _is_folder(head):
            base_side = _base_side(base, repo, subdir)
            return _spread_backends(base_side, load_side(head, repo, subdir))
        head_side = load_side(head, repo, subdir)
        return _spread_backends(_base_side(base, repo, subdir), head_side)
    git = _Git(repo or Path.cwd())
    old, new = git.commit(base), git.commit(head)
    trees = git.tree(old, subdir), git.tree(new, subdir)
    for where, tree in zip((base, head), trees):
        _refuse_empty(where, tree, subdir)
    # the head checked as a folder's loader checks one; the base read file by file (it may
    # hold what the head fixes)
    _check_tree(head, trees[1], subdir, whole=True)
    files = [set(_rule_files(t, subdir)) for t in trees]
    # a file differs where its object or mode does (git diff --no-renames: a moved file is
    # a removal and an addition, as the full comparison sees it)
    changed = sorted(n for n in files[0] | files[1]
                     if n not in files[0] or n not in files[1] or trees[0][n] != trees[1][n])
    base_side = _tree_records(git, old, base, trees[0], [n for n in changed if n in files[0]], subdir)
    return _spread_backends(base_side, _records(changed, git.blobs(new, [n for n in changed if n in files[1]]), head))


def _base_side(where: str, repo: Path | None, subdir: str) -> Registry:
    """A whole base registry, read file by file: a rule file or a backend folder that does
    not read is Unreadable (``_spread_backends`` gives a backend's to its ops), the rest
    read; only what is no registry at all (no such folder or revision, a backend folder
    given as the root, a revision before the registry) is an error."""
    if _is_folder(where):
        root = _base_root(Path(where))
        out = _unreadable_backends(root)
        for backend in sorted(backend_names()):
            if (backend, "") not in out and (root / backend).is_dir():
                out.update(_read_base(path, backend) for path in sorted((root / backend).glob("*.yaml")))
        return out
    git = _Git(repo or Path.cwd())
    rev = git.commit(where)
    tree = git.tree(rev, subdir)
    _refuse_empty(where, tree, subdir)
    return _tree_records(git, rev, where, tree, _rule_files(tree, subdir), subdir)


def _unreadable_backends(root: Path) -> Registry:
    """A base folder's backend folders that are none (a file, a symlink to nothing), each
    as Unreadable under ``(backend, "")`` (``_spread_backends`` gives it to the head's ops)."""
    return {(b, ""): Unreadable(str(root / b), problem) for b in sorted(backend_names())
            if (problem := backend_folder_problem(root / b))}


def _base_root(root: Path) -> Path:
    """A base folder as a registry root: RegistryError where it is none at all (missing, a
    backend folder, nothing where backend folders belong), not for what lies wrong in it."""
    check_registry_root(root, layout=False)
    if not any(backend_folder_problem(root / b) or next((root / b).glob("*.yaml"), None) is not None
               for b in backend_names() if os.path.lexists(root / b)):
        raise RegistryError(f"{root}: no rule files (<backend>/<op>.yaml) under it, so it is not a registry root")
    return root


def _tree_records(git: "_Git", rev: str, where: str, tree: dict[str, "_TreeEntry"], names: list[str],
                  subdir: str) -> Registry:
    """The base's records of the rule files ``names`` of ``tree`` and its backend folders
    stored as files, each that does not read Unreadable."""
    readable, broken = [], {}
    for n in names:
        try:
            _check_tree(where, {n: tree[n]}, subdir, whole=False)
            readable.append(n)
        except RegistryError as e:
            broken[n] = e
    out = _records(names, git.blobs(rev, readable), where, broken)
    depth = subdir.count("/") + 3
    for name, e in tree.items():  # a blob, or a link, where a backend's folder belongs
        parts = name.split("/")
        if len(parts) == depth - 1 and parts[-1] in backend_names():
            what = "a symbolic link" if e.mode == _LINK else "a file"
            out[(parts[-1], "")] = Unreadable(f"{where}:{name}", f"{where}:{name}: {what} where the {parts[-1]}/ "
                                                                   "folder of rule files belongs")
    return out


def _read_base(path: Path, backend: str) -> tuple[tuple[str, str], "OpRecord | Unreadable"]:
    """(key, record) of a base file, or its key by its place and why it does not read."""
    name = f"{backend}/{path.name}"
    try:
        record = load_record(path, backend)
        return _key(name, record, str(path)), record
    except RegistryError as e:
        return _file_key(name), Unreadable(str(path), str(e))


def _spread_backends(base: Registry, head: Registry) -> tuple[Registry, Registry]:
    """``base`` with each backend folder that does not read (key ``(backend, "")``) given to
    the head's ops of that backend it has no record of, as their own Unreadable; where the
    head has none, kept as ``(backend, "*")``."""
    base = dict(base)
    for backend, op in [k for k in base if k[1] == ""]:
        unreadable = base.pop((backend, op))
        ops = [k for k in head if k[0] == backend and k not in base]
        for key in ops or [(backend, "*")]:
            base[key] = unreadable
    return base, head


@dataclass(frozen=True)
class _TreeEntry:
    """One path of a git tree, as ``git ls-tree -r -l`` lists it."""

    mode: str  # 100644 a file, 120000 a symbolic link, 160000 a submodule
    kind: str  # blob, or commit for a submodule
    obj: str
    size: int | None  # a blob's bytes


_LINK = "120000"


def _rule_files(tree: dict[str, _TreeEntry], subdir: str) -> list[str]:
    """The paths ``<subdir>/<backend>/<op>.yaml`` of ``tree``: the files a folder's loader reads."""
    depth = subdir.count("/") + 3
    return sorted(n for n in tree if n.count("/") + 1 == depth and n.endswith(".yaml"))


def _refuse_empty(where: str, tree: dict[str, _TreeEntry], subdir: str) -> None:
    """A revision from before the registry would read as an empty one, every rule of the
    other side gained or lost."""
    if not _rule_files(tree, subdir):
        raise ValueError(f"{where!r} has no {subdir}/<backend>/<op>.yaml files, so it holds no registry to compare")


def _check_tree(where: str, tree: dict[str, _TreeEntry], subdir: str, whole: bool) -> None:
    """RegistryError for what ``tree``, of revision ``where``, holds that git stores as no
    rule file or a folder's loader refuses: a rule file stored as a symbolic link (git holds
    the path it points to, which would read as a malformed file) or as a submodule, or past
    the size of a rule file (read into memory whole); with ``whole``, besides, a misnamed
    rule file, one beside the backend folders, in a subfolder of one or in a folder named
    after no backend, and a backend folder stored as a symbolic link or as a file (its rules
    would read as all removed)."""
    depth = subdir.count("/") + 3  # the parts of <subdir>/<backend>/<op>.yaml
    backends = backend_names()
    if whole:
        refuse_misnamed(f"{where}:{n}" for n in tree)
    for name in sorted(tree):
        e, parts, at = tree[name], name.split("/"), f"{where}:{name}"
        if e.kind == "commit":
            raise RegistryError(f"{at}: a submodule (a commit of another repository), not a rule file")
        if e.mode == _LINK and name.endswith(".yaml"):
            raise RegistryError(f"{at}: a symbolic link in git, whose content is the path it points to, not "
                                "rules: commit the rule file itself")
        if e.size is not None and e.size > MOST_FILE_BYTES and len(parts) == depth and name.endswith(".yaml"):
            raise RegistryError(f"{at}: cannot read: {e.size:,} bytes, more than a rule file holds "
                                f"(at most {MOST_FILE_BYTES:,})")
        if not whole:
            continue
        rule_like = Path(name).suffix.lower() in (".yaml", ".yml")
        if e.mode == _LINK and len(parts) == depth - 1:
            raise RegistryError(f"{at}: a backend folder stored as a symbolic link in git, whose content is the "
                                "path it points to: commit the folder itself")
        if len(parts) == depth - 1 and parts[-1] in backends:  # its rules would read as all removed
            raise RegistryError(f"{at}: a file where the {parts[-1]}/ folder of rule files belongs")
        if len(parts) > depth and parts[depth - 1].endswith(".yaml"):
            raise RegistryError(f"{where}:{'/'.join(parts[:depth])}: a folder, not a rule file")
        if len(parts) > depth and rule_like:
            raise RegistryError(f"{where}:{'/'.join(parts[:depth])}: rule files in a subfolder of "
                                f"{'/'.join(parts[:depth - 1])}; rule files lie in the backend folder itself "
                                "(<backend>/<op>.yaml)")
        if len(parts) == depth - 1 and rule_like:
            raise RegistryError(f"{at}: a rule file outside a backend folder (<backend>/<op>.yaml)")
        if len(parts) == depth and rule_like and parts[depth - 2] not in backends:
            raise RegistryError(f"{where}:{'/'.join(parts[:depth - 1])}: rule files in a folder named after no "
                                f"backend (backends: {', '.join(sorted(backends))})")


def _key(path: str, record: OpRecord, where: str) -> tuple[str, str]:
    """(backend, op) of a file at ``<backend>/<op>.yaml``, refusing one whose content disagrees
    with its place (the loader of a folder refuses the same)."""
    folder, name = Path(path).parent.name, Path(path).name
    if name != f"{record.op}.yaml":
        raise RegistryError(f"{where}:1: file holds op {record.op!r}; expected {Path(name).stem!r}")
    if record.backend != folder:
        raise RegistryError(f"{where}:1: file holds a {record.backend!r} rule but lies in the {folder}/ folder")
    return folder, record.op


def _records(names: list[str], blobs: dict[str, bytes], rev: str,
             broken: dict[str, RegistryError] | None = None) -> Registry:
    """The records of the files ``names`` that ``blobs`` holds. ``broken``: the base side's
    files refused before they were read; with it, a file that does not read is Unreadable
    too (a base may hold what the head fixes), not an error."""
    out: Registry = {}
    for name in names:
        if broken is not None and name in broken:
            out[_file_key(name)] = Unreadable(f"{rev}:{name}", str(broken[name]))
            continue
        data = blobs.get(name)
        if data is None:  # absent on this side: added or removed
            continue
        where = f"{rev}:{name}"
        try:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as e:
                line = data.count(b"\n", 0, e.start) + 1
                raise RegistryError(f"{where}:{line}: not valid UTF-8") from None
            record = loads_record(text, where, Path(name).parent.name)
            out[_key(name, record, where)] = record
        except RegistryError as e:
            if broken is None:
                raise
            out[_file_key(name)] = Unreadable(where, str(e))
    return out


def _file_key(path: str) -> tuple[str, str]:
    """(backend, op) as a file's place names them, its content unread."""
    return Path(path).parent.name, Path(path).name.removesuffix(".yaml")


def _check_root(root: Path) -> list[Path]:
    """The backend folders of a registry root; RegistryError for anything else (a backend
    folder passed as the root would otherwise read as an empty registry, hiding every loss)."""
    check_registry_root(root)
    backends = sorted(p for p in root.iterdir() if p.is_dir() and next(p.glob("*.yaml"), None) is not None)
    if not backends:
        raise RegistryError(f"{root}: no rule files (<backend>/<op>.yaml) under it, so it is not a registry root")
    strays = [str(d) for d in backends if d.name not in backend_names()]
    if strays:  # as codegen refuses them (a misspelt troch/ would read as every rule removed)
        raise RegistryError(f"{strays[0]}: rule files in a folder named after no backend "
                            f"(backends: {', '.join(sorted(backend_names()))})")
    return backends


def _from_folder(root: Path) -> Registry:
    out: Registry = {}
    for backend_dir in _check_root(root):
        for op, record in load_registry(root, backend_dir.name).items():
            out[(backend_dir.name, op)] = record
    return out


def _changed_folders(base: Path, head: Path) -> tuple[Registry, Registry]:
    """The records of the files whose bytes differ; the head checked as codegen reads it,
    the base read file by file (``_base_side``)."""
    root = _base_root(base)
    backends = _check_root(head)
    for d in head.iterdir():
        if d.is_dir():
            check_backend_folder(d)
    new = {f"{d.name}/{p.name}": p for d in backends for p in d.glob("*.yaml")}
    old = {f"{b}/{p.name}": p for b in sorted(backend_names()) if (root / b).is_dir()
           for p in (root / b).glob("*.yaml")}
    sides: tuple[Registry, Registry] = (_unreadable_backends(root), {})
    for name in sorted(old.keys() | new.keys()):
        paths = (old.get(name), new.get(name))
        if None not in paths:
            try:
                if read_file(paths[0]) == read_file(paths[1]):
                    continue
            except RegistryError:
                pass  # said below: the base's file as Unreadable, the head's as an error
        if paths[0] is not None:
            sides[0].update([_read_base(paths[0], Path(name).parent.name)])
        if paths[1] is not None:  # the head as codegen reads it
            record = load_record(paths[1], Path(name).parent.name)
            sides[1][_key(name, record, str(paths[1]))] = record
    return sides


class _Git:
    def __init__(self, repo: Path):
        self.repo = repo

    def run(self, *args: str, stdin: bytes | None = None) -> bytes:
        result = subprocess.run(["git", "-C", str(self.repo), *args], input=stdin, capture_output=True)
        if result.returncode != 0:
            raise ValueError(f"git {' '.join(args[:2])} failed: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout

    def lines(self, *args: str) -> list[str]:
        return [n for n in self.run(*args).decode("utf-8", "surrogateescape").split("\0") if n]

    def is_commit(self, rev: str) -> bool:
        """Does ``rev`` name a commit of the repository (False outside one)?"""
        try:
            return bool(self.commit(rev))
        except ValueError:
            return False

    def commit(self, rev: str) -> str:
        try:
            if rev.startswith("-"):  # an option to git, not a revision
                raise ValueError(rev)
            return self.run("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").decode().strip()
        except ValueError:
            raise ValueError(f"{rev!r} is neither a folder nor a git revision of {self.repo}") from None

    def tree(self, rev: str, subdir: str) -> dict[str, _TreeEntry]:
        """The paths under ``subdir`` of ``rev``, each with its mode, kind, object and size."""
        out = {}
        for entry in self.lines("ls-tree", "-r", "-l", "-z", rev, "--", subdir):
            meta, name = entry.split("\t", 1)  # "<mode> <kind> <object> <size, or - for no blob>\t<path>"
            mode, kind, obj, size = meta.split()
            out[name] = _TreeEntry(mode, kind, obj, None if size == "-" else int(size))
        return out

    def blobs(self, rev: str, names: list[str]) -> dict[str, bytes]:
        """The files ``names`` of ``rev`` that exist there, read by one ``git cat-file``."""
        if not names:
            return {}
        odd = next((n for n in names if "\n" in n or "\r" in n), None)
        if odd is not None:  # cat-file reads one name a line: the file would be skipped unsaid
            raise RegistryError(f"{rev}:{odd!r}: a file name holding a line break (no op is named so): rename or remove it")
        query = "".join(f"{rev}:{n}\n" for n in names).encode("utf-8", "surrogateescape")
        data = self.run("cat-file", "--batch", stdin=query)
        out, pos = {}, 0
        for name in names:
            end = data.index(b"\n", pos)
            header = data[pos:end].split()
            pos = end + 1
            if header[-1] == b"missing":
                continue
            size = int(header[2])
            out[name] = data[pos:pos + size]
            pos += size + 1  # the blob, then a newline
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
    for e in _emitted(record):
        ranks = tuple(len(row) for row in e.shard.inputs)
        out[e.signature] = {s.inputs: (rule_text(s, ranks), s.outputs) for s in e.all_strategies()}
    return out


def _emitted(record: OpRecord) -> list[RuleEntry]:
    """The entries a table holds (codegen's test too)."""
    return [e for e in record.entries if e.status in VERIFIED]


def _strategies(e: RuleEntry | None) -> dict[tuple, tuple[Strategy, tuple[int, ...]]]:
    if e is None:
        return {}
    ranks = tuple(len(row) for row in e.shard.inputs)
    return {s.inputs: (s, ranks) for s in e.all_strategies()}


def _same_rules(a: RuleEntry | None, b: RuleEntry | None) -> bool:
    """Both entries hold the same strategies: what ``all_strategies`` is made from is equal."""
    fields = ("shard", "partial", "combine", "offset", "more", "independent")
    return a is not None and b is not None and all(getattr(a, f) == getattr(b, f) for f in fields)


@dataclass
class Diff:
    added: list[tuple[str, str, str]] = field(default_factory=list)  # (backend, op, status)
    removed: list[tuple[str, str, str]] = field(default_factory=list)
    status: list[tuple[str, str, str, str, str]] = field(default_factory=list)  # + old, new, reason
    gained: list[tuple[str, str, str, str]] = field(default_factory=list)  # backend, op, signature, rule
    lost: list[tuple[str, str, str, str]] = field(default_factory=list)
    unreadable: list[tuple[str, str, str, str]] = field(default_factory=list)  # + why, the head's status

    @property
    def has_loss(self) -> bool:
        return bool(self.lost or self.removed)


def diff(base: Registry, head: Registry) -> Diff:
    d = Diff()
    for key in sorted(set(base) | set(head)):
        backend, op = key
        if isinstance(base.get(key), Unreadable):  # its rules unknown: neither gained nor lost
            d.unreadable.append((backend, op, base[key].reason, head[key].status if key in head else "removed"))
            continue
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
        old_entries, new_entries = {e.signature: e for e in _emitted(old)}, {e.signature: e for e in _emitted(new)}
        for sig in sorted(set(old_entries) | set(new_entries)):
            if _same_rules(old_entries.get(sig), new_entries.get(sig)):
                continue  # an example or note changed: no rule did (rule texts are costly to write)
            o, n = _strategies(old_entries.get(sig)), _strategies(new_entries.get(sig))
            lost = sorted(rule_text(*o[k]) for k in o if k not in n or n[k][0].outputs != o[k][0].outputs)
            gained = sorted(rule_text(*n[k]) for k in n if k not in o or n[k][0].outputs != o[k][0].outputs)
            d.lost += [(backend, op, sig, t) for t in lost]
            d.gained += [(backend, op, sig, t) for t in gained]
    return d


def _code(text: str) -> str:
    """``text`` as one inline code span: line breaks shown as \\n (a raw one ends the list
    item), fenced by more backticks than it holds."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    runs = re.findall(r"`+", text)
    fence = "`" * (max(map(len, runs), default=0) + 1)
    pad = " " if runs else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _plain(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def to_markdown(d: Diff, base_name: str, head_name: str) -> str:
    lines = [
        f"## Rule changes: {_code(base_name)} → {_code(head_name)}", "",
        "| ops added | ops removed | status changes | rules gained | rules lost |", "|---|---|---|---|---|",
        f"| {len(d.added)} | {len(d.removed)} | {len(d.status)} | {len(d.gained)} | {len(d.lost)} |",
    ]

    def section(title: str, rows: list[str]) -> None:
        if rows:
            lines.extend(["", f"### {title}", "", *rows])

    section("Ops added", [f"- {_code(f'{b}/{op}')} ({s})" for b, op, s in d.added])
    section("Ops removed", [f"- {_code(f'{b}/{op}')} (was {s})" for b, op, s in d.removed])
    section("Status changes", [f"- {_code(f'{b}/{op}')}: {o} → {n}" + (f" ({_plain(r)})" if r else "")
                               for b, op, o, n, r in d.status])
    section("Rules lost", [f"- {_code(f'{b}/{op}')} {_code(sig)}: {_code(t)}" for b, op, sig, t in d.lost])
    section("Rules gained", [f"- {_code(f'{b}/{op}')} {_code(sig)}: {_code(t)}" for b, op, sig, t in d.gained])
    section("Unreadable in the base (rules not compared)",
            [f"- {_code(f'{b}/{op}')}: {_plain(why)}; in the head: {new}" for b, op, why, new in d.unreadable])
    return "\n".join(lines) + "\n"
