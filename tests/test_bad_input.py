"""Bad input to the command lines, the registry loader and parallelize: a clear error that
names the path or value, a usable exit status, and nothing overwritten or lost."""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from metaspmd import cli, rule_diff
from metaspmd.registry_io import RegistryError, load_registry, loads_record
from metaspmd.runtime import parallelize
from metaspmd.sweep import SweepConfig, SweepError, run_sweep

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

pytestmark = pytest.mark.timeout(60)

MM = """\
schema: 1
op: {op}
backend: {backend}
status: ok
entries:
- signature: {sig}
  status: ok
  shard: [[S1, S2], [S2, S3]]
  combine: {combine}
  example:
    self: {{shape: [6, 4], dtype: float64}}
    mat2: {{shape: [4, 5], dtype: float64}}
  results:
  - {{shape: [6, 5], dtype: float64}}
"""
COMBINE = "{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}"


def mm(op="aten.mm.default", backend="torch", sig="'self:f[*,*] mat2:f[*,*]'", combine=COMBINE) -> str:
    return MM.format(op=op, backend=backend, sig=sig, combine=combine)


def write(root: Path, backend: str, op: str, text: str | None = None) -> Path:
    path = root / backend / f"{op}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text is not None else mm(op=op, backend=backend))
    return path


# --------------------------------------------------------------------------- registry files


def test_duplicate_combine_key_is_an_error_not_the_last_value():
    text = mm(combine="{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1), S1: identity}")
    with pytest.raises(RegistryError, match=r"^f\.yaml:9: duplicate key 'S1' in combine"):
        loads_record(text, "f.yaml")


@pytest.mark.parametrize("old,new,where", [
    ("    mat2: {shape: [4, 5], dtype: float64}\n",
     "    mat2: {shape: [4, 5], dtype: float64}\n    self: {shape: [6, 4], dtype: float64}\n", "example"),
    ("status: ok\nentries", "status: ok\nstatus: failed\nentries", "rule file"),
    ("  - {shape: [6, 5], dtype: float64}", "  - {shape: [6, 5], dtype: float64, dtype: int64}", "tensor"),
])
def test_duplicate_keys_at_every_level(old, new, where):
    text = mm()
    assert old in text
    with pytest.raises(RegistryError, match=rf"duplicate key '\w+' in {where}"):
        loads_record(text.replace(old, new), "f.yaml")


def test_combine_dim_beyond_the_output_rank_is_refused():
    with pytest.raises(RegistryError,
                       match=r"f\.yaml:9: S1: gather\(dim=7\) names dim 7 of output 0, which has rank 2"):
        loads_record(mm(combine=COMBINE.replace("gather(dim=0)", "gather(dim=7)")), "f.yaml")
    loads_record(mm(), "f.yaml")  # dims 0 and 1 of a rank-2 output are fine


def test_combine_dims_need_the_results_that_give_the_output_ranks():
    text = mm(combine=COMBINE.replace("gather(dim=0)", "gather(dim=7)")).replace(
        "  results:\n  - {shape: [6, 5], dtype: float64}\n", "")
    with pytest.raises(RegistryError, match=r"f\.yaml:9: S1: gather\(dim=7\) names a dim of output 0, but the entry "
                                            r"lists no results to check it against"):
        loads_record(text, "f.yaml")


@pytest.mark.parametrize("old,new,message", [
    ("entries:\n", "entries: []\n", r"f\.yaml:4: status 'ok' with no entries: a verified rule is an entry"),
    ("status: ok\nentries", "status: failed\nentries", r"f\.yaml:4: status 'failed' disagrees with the entries, "
                                                         r"whose best is 'ok'"),
    ("  status: ok", "  status: failed", r"f\.yaml:4: status 'ok' disagrees with the entries, whose best is 'failed'"),
])
def test_the_op_status_is_its_entries_best(old, new, message):
    """coverage counts ops by it, codegen emits the entries: they must agree."""
    text = mm()
    assert old in text
    text = text.replace(old, new, 1)
    with pytest.raises(RegistryError, match=message):
        loads_record(text.split("entries: []")[0] + "entries: []\n" if "entries: []" in text else text, "f.yaml")


@pytest.mark.parametrize("old,new,line", [
    ("gather(dim=0)", "gather(dim=" + "9" * 5000 + ")", 9),
    ("S3: gather", "S" + "9" * 5000 + ": gather", 9),
    ("[[S1, S2], [S2, S3]]", "[[S1(halo=" + "9" * 5000 + "), S2], [S2, S3]]", 8),
    ("'self:f[*,*] mat2:f[*,*]'", "'self:f[" + "9" * 5000 + ",*] mat2:f[*,*]'", 6),
])
def test_a_number_too_long_for_a_spec_is_refused_at_its_line(old, new, line):
    """Not int()'s ValueError (over 4300 digits) from deep in the parser, with no file."""
    text = mm()
    assert old in text
    with pytest.raises(RegistryError, match=rf"^f\.yaml:{line}: "):
        loads_record(text.replace(old, new, 1), "f.yaml")


def test_combine_dim_of_a_further_layer_is_checked_too():
    more = "  more:\n  - shard: [[S4, N], [N, N]]\n    combine: {S4: 'scan(dim=2, op=sum)'}\n"
    text = mm().replace("  example:", more + "  example:")
    with pytest.raises(RegistryError, match=r"f\.yaml:12: S4: scan\(dim=2, op=sum\) names dim 2"):
        loads_record(text, "f.yaml")


def test_file_of_another_backend_in_a_folder_is_refused(tmp_path):
    path = write(tmp_path, "jax", "aten.mm.default", mm(backend="torch"))
    with pytest.raises(RegistryError, match=rf"^{path}:3: file holds a 'torch' rule but lies in the jax/ folder"):
        load_registry(tmp_path, "jax")


def test_registry_root_must_be_one(tmp_path):
    write(tmp_path, "torch", "aten.mm.default")
    with pytest.raises(RegistryError, match=rf"^{tmp_path / 'torch'}: holds rule files itself, so it is a backend "
                                            rf"folder, not a registry root \(pass {tmp_path} instead\)"):
        load_registry(tmp_path / "torch", "torch")
    with pytest.raises(RegistryError, match=rf"^{tmp_path / 'nope'}: no such registry folder"):
        load_registry(tmp_path / "nope", "torch")
    with pytest.raises(RegistryError, match=r"no jax/ folder of rule files \(backends there: torch\)"):
        load_registry(tmp_path, "jax")
    (tmp_path / "jax").write_text("x")  # said "no jax/ folder", as if nothing were there
    with pytest.raises(RegistryError, match=rf"^{tmp_path / 'jax'}: not a folder \(expected the folder of jax's rule"):
        load_registry(tmp_path, "jax")


# --------------------------------------------------------------------------- codegen, coverage


@pytest.mark.parametrize("registry", ["torch", "missing", "empty"])
def test_codegen_refuses_a_registry_that_is_not_one_and_keeps_the_table(tmp_path, capsys, registry):
    write(tmp_path / "reg", "torch", "aten.mm.default")
    (tmp_path / "empty" / "torch").mkdir(parents=True)
    out = tmp_path / "gen"
    out.mkdir()
    (out / "torch_rules.py").write_text("the real table\n")
    given = {"torch": tmp_path / "reg" / "torch", "missing": tmp_path / "missing",
             "empty": tmp_path / "empty"}[registry]
    assert cli.codegen(["--registry", str(given), "--backend", "torch", "--out", str(out)]) == 2
    assert str(given) in capsys.readouterr().err
    assert (out / "torch_rules.py").read_text() == "the real table\n"
    assert cli.codegen(["--registry", str(tmp_path / "reg"), "--backend", "torch", "--out", str(out)]) == 0


def test_codegen_refuses_rule_files_in_a_folder_named_after_no_backend(tmp_path, capsys):
    """A misspelt torch/ was skipped: jax's table written, and --check passed without torch's."""
    write(tmp_path / "reg", "jax", "jax.op0", mm(op="jax.op0", backend="jax"))
    write(tmp_path / "reg", "troch", "aten.mm.default")
    out = tmp_path / "gen"
    for check in ([], ["--check"]):
        assert cli.codegen(["--registry", str(tmp_path / "reg"), "--out", str(out), *check]) == 2
        assert (f"{tmp_path / 'reg' / 'troch'}: rule files in a folder named after no backend"
                in capsys.readouterr().err)
    assert not out.exists()


def test_codegen_writes_no_table_when_another_backend_fails(tmp_path, capsys):
    write(tmp_path / "reg", "torch", "aten.mm.default")
    (tmp_path / "reg" / "jax").mkdir()
    (tmp_path / "reg" / "jax" / "jax.add.yaml").write_text("schema: 1\nop: [\n")  # the jax table fails
    out = tmp_path / "gen"
    assert cli.codegen(["--registry", str(tmp_path / "reg"), "--out", str(out)]) == 2
    assert "jax.add.yaml:" in capsys.readouterr().err and not out.exists()


class _ClosedAfterOneLine(io.StringIO):
    """A stdout whose reader stops after the first line (``| head -1``); its descriptor,
    which the command points at /dev/null then, is a file of the test's own."""

    def __init__(self, fd: int):
        super().__init__()
        self.fd = fd

    def write(self, text: str) -> int:
        if "\n" in self.getvalue():
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)

    def fileno(self) -> int:
        return self.fd


def test_codegen_writes_every_table_when_its_reader_stops_early(tmp_path, monkeypatch):
    write(tmp_path / "reg", "torch", "aten.mm.default")
    write(tmp_path / "reg", "jax", "jax.mm")
    out = tmp_path / "gen"
    with open(tmp_path / "stdout", "w") as fd:
        monkeypatch.setattr(sys, "stdout", _ClosedAfterOneLine(fd.fileno()))
        assert cli.codegen(["--registry", str(tmp_path / "reg"), "--out", str(out)]) == 128 + 13  # as SIGPIPE
    assert sorted(p.name for p in out.iterdir()) == ["jax_rules.py", "torch_rules.py"]


def test_codegen_of_a_registry_of_ones_own_makes_the_tables_it_has_rules_for(tmp_path, capsys):
    """A sweep of one's own torch ops (``--kernels``) holds torch/ only: its table, not an
    error about jax/; the repository's registry still needs every table's folder."""
    write(tmp_path / "reg", "torch", "aten.mm.default")
    out = tmp_path / "gen"
    assert cli.codegen(["--registry", str(tmp_path / "reg"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["torch_rules.py"]
    assert (out / "torch_rules.py").read_text().startswith("# Generated by tools/codegen.py from ../reg/torch ")
    (tmp_path / "tvm" / "tvm").mkdir(parents=True)
    (tmp_path / "tvm" / "tvm" / "tvm.dense.yaml").write_text("")
    assert cli.codegen(["--registry", str(tmp_path / "tvm"), "--out", str(out)]) == 2
    assert "holds no jax/, torch/ folder: codegen makes the tables of jax, torch (folders there: tvm)" in capsys.readouterr().err


def test_coverage_of_a_missing_registry_is_an_error(tmp_path, capsys):
    assert cli.coverage(["--registry", str(tmp_path / "nope")]) == 2
    assert f"{tmp_path / 'nope'}: no such registry folder" in capsys.readouterr().err


def test_coverage_of_a_registry_without_rule_files_is_an_error_as_for_codegen(tmp_path, capsys):
    """Not 0% with exit 0: the same check as codegen's (registry_io.load_rules)."""
    (tmp_path / "reg" / "torch").mkdir(parents=True)
    message = f"{tmp_path / 'reg' / 'torch'}: no rule files"
    assert cli.coverage(["--registry", str(tmp_path / "reg")]) == 2
    assert message in capsys.readouterr().err
    assert cli.codegen(["--registry", str(tmp_path / "reg"), "--backend", "torch", "--out", str(tmp_path / "gen")]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("shard", ["[[S1, S1], [S2, S3]]", "[[S1(scale=2), S2], [S2, S3]]"])
def test_a_shard_table_the_model_refuses_is_named_by_every_command(tmp_path, capsys, shard):
    """A SpecError escaped the loader: a traceback from codegen and coverage, no file:line from diff."""
    bad = write(tmp_path / "reg", "torch", "aten.mm.default", mm().replace("[[S1, S2], [S2, S3]]", shard))
    write(tmp_path / "base", "torch", "aten.mm.default")
    for command, args in ((cli.codegen, ["--registry", str(tmp_path / "reg"), "--out", str(tmp_path / "gen"),
                                         "--backend", "torch"]),
                          (cli.coverage, ["--registry", str(tmp_path / "reg")]),
                          (cli.diff, [str(tmp_path / "base"), str(tmp_path / "reg")])):
        assert command(args) == 2
        assert f"{bad}:8: shard: " in capsys.readouterr().err
    assert not (tmp_path / "gen").exists()


def test_codegen_rewrites_a_table_that_is_not_utf8_and_check_calls_it_stale(tmp_path, capsys):
    """Chosen: stale (exit 1 with --check, rewritten without), not an error: the table is
    codegen's own output, and a refusal would leave no way to mend it but deleting it."""
    write(tmp_path / "reg", "torch", "aten.mm.default")
    table = tmp_path / "gen" / "torch_rules.py"
    table.parent.mkdir()
    table.write_bytes(b"\xff\xfe broken\n")
    args = ["--registry", str(tmp_path / "reg"), "--backend", "torch", "--out", str(table.parent)]
    assert cli.codegen(args + ["--check"]) == 1
    assert "torch_rules.py: STALE" in capsys.readouterr().out and table.read_bytes() == b"\xff\xfe broken\n"
    assert cli.codegen(args) == 0
    assert cli.codegen(args + ["--check"]) == 0 and "up to date" in capsys.readouterr().out


@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("odd", ["file", "loop", "folder at the table", "file on the way"])
def test_codegen_out_that_cannot_hold_tables_is_a_usage_error(tmp_path, capsys, check, odd):
    """--check said STALE (exit 1) for a file or a symlink loop as --out; a folder at the
    table's path failed with IsADirectoryError. A missing --out stays stale (see test_cli)."""
    write(tmp_path / "reg", "torch", "aten.mm.default")
    out = tmp_path / "gen"
    if odd == "file":
        out.write_text("x")
    elif odd == "loop":
        out.symlink_to(out)
    elif odd == "folder at the table":
        (out / "torch_rules.py").mkdir(parents=True)
    else:
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "gen"
    expected = {"file": f"--out {out} is not a folder", "loop": f"--out {out}: Too many levels of symbolic links",
                "folder at the table": f"--out {out / 'torch_rules.py'} is a folder",
                "file on the way": f"--out {out}: {tmp_path / 'f'} is not a folder"}[odd]
    assert cli.codegen(["--registry", str(tmp_path / "reg"), "--backend", "torch", "--out", str(out)]
                       + ["--check"] * check) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


# --------------------------------------------------------------------------- rule_diff


def test_diff_of_backend_folders_is_an_error_not_no_change(tmp_path, capsys):
    base, head = tmp_path / "base", tmp_path / "head"
    write(base, "torch", "aten.mm.default")
    write(head, "torch", "aten.addmm.default")
    assert cli.diff([str(base / "torch"), str(head / "torch"), "--fail-on-loss"]) == 2
    assert f"{base / 'torch'}: holds rule files itself" in capsys.readouterr().err
    assert cli.diff([str(base), str(head), "--fail-on-loss"]) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.diff([str(empty), str(head)]) == 2


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def two_revisions(tmp_path):
    """A repository whose second commit adds, removes, edits (a rule, a status, an example
    only) and leaves alone registry files; and both trees as folders."""
    repo = tmp_path / "repo"
    reg = repo / "registry"
    for op in ("aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.matmul.default"):
        write(reg, "torch", op)
    for i in range(20):
        write(reg, "jax", f"jax.op{i}", mm(op=f"jax.op{i}", backend="jax"))
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    (tmp_path / "base").mkdir()
    git(repo, "worktree", "add", "-q", str(tmp_path / "base" / "tree"), "HEAD")
    write(reg, "torch", "aten.mm.default", mm(combine="{S1: gather(dim=0), S2: reduce(max), S3: gather(dim=1)}"))
    write(reg, "torch", "aten.bmm.default",
          mm(op="aten.bmm.default").replace("status: ok\nentries", 'status: failed\nreason: "crashed:\\nx"\nentries')
          .replace("  status: ok", "  status: failed"))
    write(reg, "torch", "aten.addmm.default", mm(op="aten.addmm.default").replace("[6, 4]", "[8, 4]"))
    (reg / "torch" / "aten.matmul.default.yaml").unlink()
    write(reg, "torch", "aten.new.default",  # an object argument whose str holds a newline
          mm(op="aten.new.default", sig='"self:f[*,*] mat2:f[*,*] eq=\'a\\nb\'"').replace(
              "    mat2: {shape: [4, 5], dtype: float64}\n", "    mat2: {shape: [4, 5], dtype: float64}\n    eq: \"\'a\\nb\'\"\n"))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "head")
    return repo, tmp_path / "base" / "tree" / "registry", reg


def test_diff_of_two_revisions_reads_only_changed_files_and_says_the_same(two_revisions, monkeypatch):
    repo, base_folder, head_folder = two_revisions
    whole = rule_diff.diff(rule_diff.load_side(str(base_folder)), rule_diff.load_side(str(head_folder)))
    read = []
    real = rule_diff.loads_record
    monkeypatch.setattr(rule_diff, "loads_record", lambda text, name, *a: read.append(name) or real(text, name, *a))
    base, head = rule_diff.load_sides("HEAD~1", "HEAD", repo)
    # the 20 unchanged jax files and nothing else of either side are left unread
    assert sorted(read) == sorted(
        [f"HEAD~1:registry/torch/{op}.yaml" for op in ("aten.addmm.default", "aten.bmm.default", "aten.matmul.default",
                                                        "aten.mm.default")]
        + [f"HEAD:registry/torch/{op}.yaml" for op in ("aten.addmm.default", "aten.bmm.default", "aten.mm.default",
                                                        "aten.new.default")])
    changed = rule_diff.diff(base, head)
    assert rule_diff.to_markdown(changed, "a", "b") == rule_diff.to_markdown(whole, "a", "b")
    assert changed.removed == [("torch", "aten.matmul.default", "ok")] and changed.has_loss
    assert [x[1] for x in changed.lost] == ["aten.bmm.default"] * 3 + ["aten.matmul.default"] * 3 + ["aten.mm.default"]
    # two folders compare bytes first: the same diff again
    folders = rule_diff.diff(*rule_diff.load_sides(str(base_folder), str(head_folder)))
    assert rule_diff.to_markdown(folders, "a", "b") == rule_diff.to_markdown(whole, "a", "b")


def test_diff_of_revisions_reads_the_repository_you_are_in(two_revisions, monkeypatch, capsys):
    """It read the installed checkout's history: in another clone, a change that lost rules
    diffed as no change, and --fail-on-loss passed."""
    repo, _, _ = two_revisions
    monkeypatch.chdir(repo / "registry" / "torch")  # anywhere inside it
    assert cli.diff(["HEAD~1", "HEAD", "--fail-on-loss"]) == 1
    assert "`torch/aten.matmul.default` (was ok)" in capsys.readouterr().out


def test_diff_markdown_keeps_one_line_per_item(two_revisions):
    repo, _, _ = two_revisions
    md = rule_diff.to_markdown(rule_diff.diff(*rule_diff.load_sides("HEAD~1", "HEAD", repo)), "HEAD~1", "HEAD")
    items = md.split("### Ops added", 1)[1].splitlines()
    assert all(line == "" or line.startswith(("- ", "### ")) for line in items), md
    assert "eq='a\\nb'`" in md and "(crashed:\\nx)" in md


def test_diff_refuses_a_name_that_is_both_a_folder_and_a_revision(two_revisions, monkeypatch, capsys):
    """The folder won, unsaid, where a tag was meant as often."""
    repo, base_folder, _ = two_revisions
    git(repo, "tag", "v1", "HEAD~1")
    shutil.copytree(base_folder, repo / "v1")
    monkeypatch.chdir(repo)
    assert cli.diff(["v1", "HEAD"]) == 2
    assert "'v1' names both a folder and a git revision: write ./v1 for the folder or v1^{commit}" in capsys.readouterr().err
    for base in ("./v1", "v1^{commit}"):  # either, said so, gives the diff
        assert cli.diff([base, "HEAD", "--fail-on-loss"]) == 1
        assert "`torch/aten.matmul.default` (was ok)" in capsys.readouterr().out


def test_diff_of_a_missing_revision_names_it(tmp_path, capsys):
    assert cli.diff(["no-such-rev", "HEAD"]) == 2
    assert "'no-such-rev' is neither a folder nor a git revision" in capsys.readouterr().err


def test_diff_refuses_a_revision_with_no_registry(two_revisions):
    """One from before the registry read as an empty registry: every rule of the other side
    gained (exit 0) or lost."""
    repo, base_folder, _ = two_revisions
    git(repo, "checkout", "-q", "--orphan", "bare")
    git(repo, "rm", "-rq", "--cached", ".")
    (repo / "README").write_text("no registry yet")
    git(repo, "add", "README")
    git(repo, "commit", "-qm", "no registry")
    for base, head in (("bare", "HEAD@{1}"), ("HEAD@{1}", "bare"), (str(base_folder), "bare")):
        with pytest.raises(ValueError, match="'bare' has no registry/<backend>/<op>.yaml files, so it holds no "
                                             "registry to compare"):
            rule_diff.load_sides(base, head, repo)


def test_an_entry_codegen_leaves_out_loses_its_rules(tmp_path, capsys):
    """An entry turned failed leaves the table (codegen emits ok and derived entries only),
    though its rule text is unchanged: the diff said no change and exited 0."""
    from metaspmd import rules
    from metaspmd.codegen import generator

    assert rule_diff.VERIFIED is generator.VERIFIED is rules.VERIFIED  # one test for both
    base, head = tmp_path / "base", tmp_path / "head"
    write(base, "torch", "aten.mm.default")
    write(head, "torch", "aten.mm.default", mm().replace("status: ok", "status: failed"))  # the op's and the entry's
    write(head, "torch", "aten.new.default", mm(op="aten.new.default").replace("status: ok", "status: replicate-only"))
    assert cli.diff([str(base), str(head), "--fail-on-loss"]) == 1
    assert "| 1 | 0 | 1 | 0 | 3 |" in capsys.readouterr().out  # the new op's entry adds no rule either
    assert cli.diff([str(head), str(base), "--fail-on-loss"]) == 1  # its op is removed
    assert "| 0 | 1 | 1 | 3 | 0 |" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["HEAD", ""], ["", "HEAD"], ["HEAD", " "]])
def test_diff_refuses_an_empty_side_by_name(capsys, args):
    """'' read as the current folder."""
    assert cli.diff(args) == 2
    name, value = ("base", args[0]) if not args[0].strip() else ("head", args[1])
    assert f"error: {name} {value!r} is empty: expected a git revision or a registry folder" in capsys.readouterr().err


def test_a_closed_pipe_ends_a_command_quietly(tmp_path):
    base, head = tmp_path / "base", tmp_path / "head"
    write(base, "torch", "aten.mm.default")
    for i in range(300):
        write(head, "torch", f"aten.op{i}.default")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "rule_diff.py"), str(base), str(head)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # `| head -0`
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141 and b"Traceback" not in err, err


# --------------------------------------------------------------------------- sweep


@pytest.fixture
def fake_backend(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))  # spawned workers start with the parent's sys.path
    return "fake_backend"


@pytest.mark.parametrize("args,message", [
    (["--timeout", "inf"], "--timeout: expected a number of seconds: finite and > 0, got 'inf'"),
    (["--timeout", "nan"], "got 'nan'"),
    (["--timeout", "0"], "got '0'"),
    (["--jobs", "0"], "--jobs/-j: expected an integer >= 1, got 0"),
    (["--jobs", "-1"], "got -1"),
    (["--ops", ""], "--ops '' names no op pattern"),
    (["--ops", " , "], "names no op pattern"),
])
def test_sweep_usage_errors(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        cli.sweep(["--backend", "fake_backend", "--out", str(tmp_path), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), -1.0])
def test_sweep_config_refuses_timeouts_that_never_expire(tmp_path, timeout):
    with pytest.raises(SweepError, match="timeout must be a finite number of seconds > 0"):
        SweepConfig(backend="fake_backend", out_root=tmp_path, timeout=timeout)


def test_unwritable_out_fails_before_any_work(tmp_path, fake_backend, monkeypatch):
    (tmp_path / "file").write_text("")
    started = []
    monkeypatch.setattr("metaspmd.sweep.engine.WorkerPool.start", lambda self: started.append(1) or "fake")
    for check in (False, True):  # --check too: a file on the way is no registry to compare with
        with pytest.raises(SweepError, match=rf"--out {tmp_path / 'file' / 'reg'}: {tmp_path / 'file'} is not a folder"):
            run_sweep(SweepConfig(backend=fake_backend, out_root=tmp_path / "file" / "reg", check=check))
    assert not started


def test_a_slow_backend_start_says_why_once(tmp_path, fake_backend, monkeypatch, capsys):
    import time

    from metaspmd.sweep import engine

    def slow_start(self):
        time.sleep(0.5)
        raise SweepError("stop")

    monkeypatch.setattr(engine, "SLOW_START_S", 0.05)
    monkeypatch.setattr(engine.WorkerPool, "start", slow_start)
    with pytest.raises(SweepError, match="stop"):
        run_sweep(SweepConfig(backend=fake_backend, out_root=tmp_path))
    err = capsys.readouterr().err
    assert err.count("sweep: backend 'fake_backend' is still setting up in its worker") == 1


@pytest.mark.parametrize("check", [False, True])
def test_unwritable_timings_fail_before_any_work_with_2(tmp_path, fake_backend, capsys, monkeypatch, check):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr("metaspmd.sweep.run_sweep", lambda config: pytest.fail("the sweep ran"))
    timings = tmp_path / "file" / "t.json"
    assert cli.sweep(["--backend", fake_backend, "--out", str(tmp_path / "reg"), "--timings", str(timings)]
                     + ["--check"] * check) == 2
    assert f"--timings {timings}: {tmp_path / 'file'} is not a folder" in capsys.readouterr().err


def test_timings_that_fail_late_keep_the_summary_and_exit_2(tmp_path, fake_backend, capsys, monkeypatch):
    import metaspmd.registry_io

    def fail(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(metaspmd.registry_io, "write_text_atomic", fail)  # --check writes nothing else
    (tmp_path / "reg" / "fake").mkdir(parents=True)  # a registry to check
    rc = cli.sweep(["--backend", fake_backend, "--out", str(tmp_path / "reg"), "--ops", "fake.add", "--jobs", "1",
                    "--no-progress", "--check", "--timings", str(tmp_path / "t.json")])
    out = capsys.readouterr()
    assert rc == 2 and "cannot write --timings" in out.err
    assert "with rules (ok)" in out.out and "ops/s" in out.out


def test_kernels_replace_the_tvm_builtins(tmp_path, monkeypatch):
    seen = []

    def record(config):
        seen.append(config)
        raise SweepError("stop")

    monkeypatch.setattr("metaspmd.sweep.run_sweep", record)
    assert cli.sweep(["--backend", "tvm", "--kernels", "my_kernels", "--out", str(tmp_path)]) == 2
    assert seen[0].backend_options == (("kernels", ("my_kernels",)), ("builtins", False))
    # repeated, every module is swept (only the last was)
    assert cli.sweep(["--backend", "tvm", "--kernels", "a_kernels", "--kernels", "b.py", "--out", str(tmp_path)]) == 2
    assert seen[1].backend_options == (("kernels", ("a_kernels", "b.py")), ("builtins", False))
    assert seen[1].kernels == "a_kernels b.py"


def test_sweep_out_must_be_a_registry_root(tmp_path, fake_backend, capsys, monkeypatch):
    monkeypatch.setattr("metaspmd.sweep.engine.WorkerPool.start", lambda self: pytest.fail("the sweep ran"))
    folder = tmp_path / "reg" / "fake"
    folder.mkdir(parents=True)
    (folder / "fake.add.yaml").write_text("")
    assert cli.sweep(["--backend", fake_backend, "--out", str(folder)]) == 2
    assert "so it is a backend folder, not a registry root" in capsys.readouterr().err
    assert cli.sweep(["--backend", fake_backend, "--out", str(folder), "--check"]) == 2
    assert [p.name for p in folder.iterdir()] == ["fake.add.yaml"]


@pytest.mark.parametrize("args,message", [
    (["--kernels", ""], "--kernels '' names no module"),
    (["--kernels", " "], "--kernels ' ' names no module"),
    (["--kernels", "examples/custom_ops.py", "--check"], "--kernels sweeps ops of your own into a registry of "
                                                          "your own: pass --out DIR"),
])
def test_kernels_usage_errors(tmp_path, capsys, monkeypatch, args, message):
    """--kernels '' swept every built-in op; --kernels without --out wrote the custom op into
    the repository's registry (and --check called every built-in op's file removed)."""
    monkeypatch.setattr("metaspmd.sweep.run_sweep", lambda config: pytest.fail("the sweep ran"))
    out = [] if "--check" in args else ["--out", str(tmp_path)]
    with pytest.raises(SystemExit) as e:
        cli.sweep(["--backend", "torch", *args, *out])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("args", [
    ["--backend", "tvm", "--kernels", "examples/tvm_user_kernels.py", "--out", str(cli.REGISTRY)],
    ["--backend", "tvm", "--kernels", "examples/tvm_user_kernels.py", "--out", str(cli.REGISTRY / "tvm")],
    ["--backend", "fake_backend"],
    ["--backend", "fake_backend", "--out", str(cli.REGISTRY)],
])
def test_ops_of_your_own_never_go_into_the_repositorys_registry(capsys, monkeypatch, fake_backend, args):
    """A user's kernel named pad overwrote registry/tvm/tvm.pad.yaml; a backend module of
    your own wrote registry/<its name>/ beside the built-in ones."""
    monkeypatch.setattr("metaspmd.sweep.run_sweep", lambda config: pytest.fail("the sweep ran"))
    with pytest.raises(SystemExit) as e:
        cli.sweep(args + ["--no-progress"])
    assert e.value.code == 2
    assert "sweeps ops of your own into a registry of your own" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["sweep", "--backend", "tvm", "--ops", "tvm.sin", "--out", str(cli.REGISTRY / "tvm" / "sub")],
     "lies inside the repository's registry"),
    (["sweep", "--backend", "tvm", "--ops", "tvm.sin", "--out", str(cli.ROOT / "generated")],
     "where codegen writes its tables"),
    (["sweep", "--backend", "tvm", "--kernels", "examples/tvm_user_kernels.py", "--out", str(cli.ROOT / "generated" / "x")],
     "where codegen writes its tables"),
    (["codegen", "--out", str(cli.REGISTRY / "torch")], "lies in the registry"),
    (["codegen", "--registry", str(cli.REGISTRY), "--out", str(cli.REGISTRY)], "lies in the registry"),
], ids=["sweep into a backend folder", "sweep into generated", "kernels into generated", "codegen into a backend folder",
        "codegen into the registry"])
def test_outputs_never_go_where_another_command_reads(capsys, monkeypatch, args, message):
    """Tables written into registry/torch, or rule files into generated/, left files every
    later read of that folder took for strays."""
    monkeypatch.setattr("metaspmd.sweep.run_sweep", lambda config: pytest.fail("the sweep ran"))
    with pytest.raises(SystemExit) as e:
        cli.main(args + (["--no-progress"] if args[0] == "sweep" else []))
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_codegen_refuses_a_symlink_to_nothing_where_a_backend_folder_belongs(tmp_path, capsys):
    """It wrote the other backend's table and said nothing of this one."""
    shutil.copytree(ROOT / "registry" / "jax", tmp_path / "reg" / "jax")
    (tmp_path / "reg" / "torch").symlink_to(tmp_path / "nowhere")
    assert cli.codegen(["--registry", str(tmp_path / "reg"), "--out", str(tmp_path / "gen")]) == 2
    assert f"{tmp_path / 'reg' / 'torch'} is a symlink to {tmp_path / 'nowhere'}, which does not exist" in \
        capsys.readouterr().err
    assert not (tmp_path / "gen").exists()


def test_sweep_check_of_a_missing_registry_is_a_usage_error(tmp_path, fake_backend, capsys):
    """It said every op's file would change, exit 1: a misspelt --out looked stale."""
    missing = tmp_path / "typo"
    assert cli.sweep(["--backend", fake_backend, "--out", str(missing), "--check", "--no-progress"]) == 2
    assert f"--out {missing}: no such registry folder to check" in capsys.readouterr().err
    assert not missing.exists()


def test_codegen_of_a_registry_of_your_own_needs_an_out(tmp_path, capsys):
    """Its table replaced the repository's generated/ one (1,160 lines of jax rules became 33)."""
    write(tmp_path / "reg", "torch", "aten.mm.default")
    with pytest.raises(SystemExit) as e:
        cli.codegen(["--registry", str(tmp_path / "reg")])
    assert e.value.code == 2
    assert f"--registry {tmp_path / 'reg'} is not the repository's registry: pass --out DIR" in capsys.readouterr().err


@pytest.mark.parametrize("check", [False, True])
def test_codegen_of_a_registry_of_your_own_into_the_repositorys_generated_is_refused(tmp_path, capsys, check):
    """``--out generated`` beside a registry of your own overwrote the repository's tables
    (and --check's hint said to run just that)."""
    write(tmp_path / "reg", "torch", "aten.mm.default")
    before = {p.name: p.read_bytes() for p in (cli.ROOT / "generated").glob("*_rules.py")}
    with pytest.raises(SystemExit) as e:
        cli.codegen(["--registry", str(tmp_path / "reg"), "--out", str(cli.ROOT / "generated")] + ["--check"] * check)
    assert e.value.code == 2
    assert "is the repository's generated/ folder: a registry of your own's tables would replace" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (cli.ROOT / "generated").glob("*_rules.py")} == before


@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("odd", ["loop", "file"])
def test_sweep_out_a_symlink_loop_or_a_file_is_a_usage_error(tmp_path, fake_backend, capsys, monkeypatch, check, odd):
    out = tmp_path / "out"
    out.symlink_to(out) if odd == "loop" else out.write_text("x")
    monkeypatch.setattr("metaspmd.sweep.engine.WorkerPool.start", lambda self: pytest.fail("the sweep ran"))
    assert cli.sweep(["--backend", fake_backend, "--out", str(out), "--no-progress"] + ["--check"] * check) == 2
    err = capsys.readouterr().err
    assert (f"--out {out}: Too many levels of symbolic links" if odd == "loop" else f"--out {out} is not a folder") in err
    assert "Traceback" not in err


@pytest.mark.parametrize("check", [False, True])
def test_a_folder_at_a_rule_files_path_is_refused_before_any_op_runs(tmp_path, fake_backend, capsys, monkeypatch,
                                                                      check):
    """It failed the rename only after the op's work (IsADirectoryError); --check called it added."""
    folder = tmp_path / "reg" / "fake" / "fake.add.yaml"
    folder.mkdir(parents=True)
    monkeypatch.setattr("metaspmd.sweep.engine.WorkerPool.run", lambda *a, **k: pytest.fail("ops ran"))
    assert cli.sweep(["--backend", fake_backend, "--out", str(tmp_path / "reg"), "--ops", "fake.add", "--jobs", "1",
                      "--no-progress"] + ["--check"] * check) == 2
    assert f"1 rule file path(s) not usable: {folder} is a folder" in capsys.readouterr().err
    assert folder.is_dir() and not any(folder.iterdir())


def test_sweep_files_get_the_umask_mode_and_one_not_utf8_would_change(tmp_path, fake_backend, capsys):
    """Rule files and timings were 0600 (mkstemp's mode); --check of a file that is not UTF-8
    raised UnicodeDecodeError. Chosen: it would change (exit 1), shown with U+FFFD."""
    args = ["--backend", fake_backend, "--out", str(tmp_path / "reg"), "--ops", "fake.add", "--jobs", "1",
            "--no-progress"]
    umask = os.umask(0o027)
    try:
        assert cli.sweep(args + ["--timings", str(tmp_path / "t.json")]) == 0
    finally:
        os.umask(umask)
    path = tmp_path / "reg" / "fake" / "fake.add.yaml"
    assert [stat.S_IMODE(p.stat().st_mode) for p in (path, tmp_path / "t.json")] == [0o640, 0o640]
    path.write_bytes(path.read_bytes() + b"# \xff\n")
    before = path.read_bytes()
    capsys.readouterr()
    assert cli.sweep(args + ["--check"]) == 1
    out = capsys.readouterr().out
    assert "\ufffd" in out and "check: 1 file(s) would change" in out
    assert path.read_bytes() == before


def test_a_backend_that_cannot_load_is_named_with_its_whole_message(tmp_path, capsys, monkeypatch):
    """clean_reason, meant for the reasons records keep, cut a fatal error's paths down to
    file names ("kernel module file not found: nope.py")."""
    (tmp_path / "broken_backend.py").write_text(
        "def get_backend():\n    raise FileNotFoundError('kernel module file not found: /some/where/nope.py')\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers start with the parent's sys.path
    assert cli.sweep(["--backend", "broken_backend", "--out", str(tmp_path / "reg"), "--no-progress"]) == 2
    assert ("cannot load backend 'broken_backend': FileNotFoundError: kernel module file not found: "
            "/some/where/nope.py") in capsys.readouterr().err


def test_kernels_are_refused_for_jax(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("metaspmd.sweep.run_sweep", lambda config: pytest.fail("the sweep ran"))
    assert cli.sweep(["--backend", "jax", "--kernels", "my_kernels", "--out", str(tmp_path)]) == 2
    assert "--kernels takes torch custom ops or TVM TE kernels" in capsys.readouterr().err


def test_crosscheck_usage_errors_before_the_backend_runs(capsys):
    for args, message in ((["--jobs", "0"], "expected an integer >= 1, got 0"), (["-j", "-1"], "got -1"),
                          (["--ops", ""], "--ops '' names no op pattern"),
                          (["--timeout", "nan"], "got 'nan'"),
                          (["--registry", str(ROOT / "registry" / "jax")], "so it is a backend folder")):
        with pytest.raises(SystemExit) as e:
            cli.crosscheck(["--backend", "no_such_backend", *args])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_crosscheck_takes_no_shortened_option(capsys):
    """cli.crosscheck checks --registry and --ops by their full names: the backend took
    --reg DIR as --registry and read the repository's registry instead, unsaid."""
    with pytest.raises(SystemExit) as e:
        cli.crosscheck(["--backend", "torch", "--reg", "/some/registry", "--jobs", "1"])
    assert e.value.code == 2 and "unrecognized arguments: --reg /some/registry" in capsys.readouterr().err


def test_a_tool_stopped_by_ctrl_c_says_so_in_one_line(capsys):
    def coverage() -> int:
        raise KeyboardInterrupt

    assert cli.pipe_safe(coverage)() == 130
    assert capsys.readouterr().err == "coverage: interrupted\n"


def test_crosscheck_refuses_a_registry_without_the_backends_rules(tmp_path, capsys):
    """A registry root holding other backends' rules but not this one's would have every op
    explored live, unsaid; an empty one is how the backend explores every op live."""
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "jax.add.yaml").write_text("")
    with pytest.raises(SystemExit) as e:
        cli.crosscheck(["--backend", "torch", "--registry", str(tmp_path)])
    assert e.value.code == 2
    assert f"{tmp_path}: no torch/ folder of rule files (backends there: jax)" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    # past the registry check, to the dispatch: an unknown backend is the next refusal
    assert cli.crosscheck(["--backend", "no_such_backend", "--registry", str(empty)]) == 2
    assert "no cross-check for backend 'no_such_backend'" in capsys.readouterr().err


# --------------------------------------------------------------------------- parallelize


@pytest.mark.parametrize("kw,error,message", [
    ({"memory_budget": "big"}, TypeError, "memory_budget must be a number or None, got 'big'"),
    ({"memory_budget": float("nan")}, ValueError, "memory_budget must be a finite number > 0, got nan"),
    ({"memory_budget": 0}, ValueError, "got 0"),
    ({"memory_budget": True}, TypeError, "got True"),
    ({"time_limit": float("inf")}, ValueError, "time_limit must be a finite number > 0, got inf"),
    ({"time_limit": "10"}, TypeError, "time_limit must be a number or None, got '10'"),
])
def test_parallelize_refuses_bad_options_by_name(kw, error, message):
    with pytest.raises(error, match=message):
        parallelize(lambda x: x, object(), ((1.0,),), **kw)  # checked before the mesh is even looked at


def test_parallelize_refuses_a_bare_value_as_example_inputs():
    import numpy as np

    with pytest.raises(TypeError, match=r"example_inputs must be a tuple .* got a numpy\.ndarray \(for one input "
                                        r"write \(x,\)\)"):
        parallelize(lambda x: x, object(), np.zeros((4, 4)))


@pytest.mark.parametrize("make,message", [
    (lambda d: d, r"kernel module .* is a folder, not a \.py file"),
    (lambda d: (d / "boom.py").write_text("raise RuntimeError('boom at import')\n") and d / "boom.py",
     r"kernel module .*boom\.py failed on import: RuntimeError: boom at import"),
])
def test_a_kernel_module_that_cannot_load_is_named(tmp_path, make, message):
    """A folder was 'No module named /tmp/k'; a module raising on import named only the backend."""
    from metaspmd.sweep.user_modules import load_module

    with pytest.raises((FileNotFoundError, ImportError), match=message):
        load_module(str(make(tmp_path)))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_fifo_named_like_a_rule_file_is_refused_not_read(tmp_path, capsys):
    """Opening it blocked codegen, diff and coverage for good (a symlink to /dev/zero would
    have read until memory ran out)."""
    write(tmp_path / "reg", "torch", "aten.mm.default")
    fifo = tmp_path / "reg" / "torch" / "aten.zz.default.yaml"
    os.mkfifo(fifo)
    with pytest.raises(RegistryError, match=rf"^{fifo}: cannot read: not a regular file$"):
        load_registry(tmp_path / "reg", "torch")
    assert cli.codegen(["--registry", str(tmp_path / "reg"), "--backend", "torch", "--out", str(tmp_path / "gen")]) == 2
    assert f"{fifo}: cannot read: not a regular file" in capsys.readouterr().err
    assert not (tmp_path / "gen" / "torch_rules.py").exists()


def test_a_registry_root_that_is_a_symlink_loop_is_named(tmp_path, capsys):
    """codegen's check of --registry raised RuntimeError from Path.resolve(); the other
    commands called the loop 'no such registry folder'."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert cli.codegen(["--registry", str(loop), "--out", str(tmp_path / "gen")]) == 2
    assert cli.coverage(["--registry", str(loop)]) == 2
    err = capsys.readouterr().err
    assert err.count(f"{loop}: Too many levels of symbolic links") == 2 and "Traceback" not in err


@pytest.mark.parametrize("name", ["fake.acos.yaml", "t.YML"])
def test_timings_named_like_a_rule_file_are_refused_before_any_op_runs(tmp_path, fake_backend, capsys, monkeypatch,
                                                                       name):
    """--timings registry/fake/fake.acos.yaml replaced that rule file with JSON and exited 0."""
    monkeypatch.setattr("metaspmd.sweep.engine.WorkerPool.start", lambda self: pytest.fail("the sweep ran"))
    rule = tmp_path / "reg" / "fake" / name
    rule.parent.mkdir(parents=True)
    rule.write_text("kept")
    assert cli.sweep(["--backend", fake_backend, "--out", str(tmp_path / "reg"), "--no-progress",
                      "--timings", str(rule)]) == 2
    assert f"--timings {rule}: a .yaml name" in capsys.readouterr().err
    assert rule.read_text() == "kept"


def test_check_of_a_folder_with_no_backend_folder_is_a_usage_error(tmp_path, fake_backend, capsys):
    """A mistyped --out (an existing folder that holds no registry) read as a registry with
    every op to add: 'stale', exit 1."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text("x")
    assert cli.sweep(["--backend", fake_backend, "--out", str(tmp_path / "docs"), "--ops", "fake.add", "--jobs", "1",
                      "--no-progress", "--check"]) == 2
    assert f"--out {tmp_path / 'docs'}: no fake/ folder of rule files to check" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == ["notes.md"]


def test_a_rule_file_that_cannot_be_written_ends_the_sweep_naming_it(tmp_path, fake_backend, capsys, monkeypatch):
    """A full disk was a traceback from the sweep's engine; then exit 2 (a usage error) with
    no summary and no --timings: the ops finished before it went unreported."""
    import errno
    import json

    import metaspmd.registry_io

    write = metaspmd.registry_io.write_text_atomic
    written = []

    def fills_up(path, text):
        if path.suffix == ".yaml" and written:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written.append(path)
        write(path, text)

    monkeypatch.setattr(metaspmd.registry_io, "write_text_atomic", fills_up)
    timings = tmp_path / "t.json"
    assert cli.sweep(["--backend", fake_backend, "--out", str(tmp_path / "reg"), "--ops", "fake.add,fake.matmul,fake.sum",
                      "--jobs", "1", "--no-progress", "--timings", str(timings)]) == 4
    out, err = capsys.readouterr()
    assert "No space left on device" in err and "Traceback" not in err and "the sweep stopped (2 op(s) not swept" in err
    assert "ops/s" in out  # the summary of what it finished
    assert [p.name for p in (tmp_path / "reg" / "fake").iterdir()] == [written[0].name]
    assert len(json.loads(timings.read_text())["not_swept"]) == 2


def test_an_interrupt_while_the_backend_loads_still_reports(tmp_path, fake_backend, capsys, monkeypatch):
    """Ctrl-C before any op ran skipped the summary and --timings, which every stopped
    sweep writes."""
    import json

    def interrupted(pool, name):
        raise KeyboardInterrupt

    monkeypatch.setattr("metaspmd.sweep.engine._start", interrupted)
    timings = tmp_path / "t.json"
    assert cli.sweep(["--backend", fake_backend, "--out", str(tmp_path / "reg"), "--jobs", "1", "--no-progress",
                      "--timings", str(timings)]) == 130
    out, err = capsys.readouterr()
    assert "ops/s" in out and "interrupted; files written so far are complete" in err
    assert json.loads(timings.read_text()).get("not_swept", []) == []


PRINTS = "from metaspmd.cli import pipe_safe\nprint(pipe_safe(lambda: print('x' * 100000) or 7)())\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_output_that_cannot_be_written_is_one_line_and_status_2():
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-c", PRINTS + "raise SystemExit(0)"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert "error: cannot write the output: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


def test_a_closed_stdout_takes_the_output_as_dev_null():
    """The commands raised AttributeError ('NoneType' object has no attribute 'flush')."""
    done = subprocess.run([sys.executable, "-c", PRINTS.replace("print(pipe_safe", "import sys\nsys.exit(pipe_safe")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 7 and done.stderr == "", done.stderr


def test_a_table_header_names_a_registry_path_that_is_not_utf8():
    """A path with a byte that is not UTF-8 failed the table's write (UnicodeEncodeError)."""
    from codegen.generator import render

    text = render({}, "jax", "/tmp/r\udcff")
    assert "/tmp/r\\udcff/jax" in text.splitlines()[0]
    text.encode("utf-8")


@pytest.mark.parametrize("name", ["aten.mm.default.yml", "aten.mm.default.YAML"])
def test_a_rule_file_named_yml_is_named_not_passed_over(tmp_path, name):
    write(tmp_path / "reg", "torch", "aten.mm.default")
    (tmp_path / "reg" / "torch" / "aten.mm.default.yaml").rename(tmp_path / "reg" / "torch" / name)
    with pytest.raises(RegistryError, match=rf"{name}: a rule file's name ends .yaml"):
        load_registry(tmp_path / "reg", "torch")


def test_diff_refuses_a_rule_file_named_yml_on_either_kind_of_side(two_revisions, capsys):
    """codegen and coverage refuse such a file; rule_diff passed over it, and a head that
    codegen will not build reviewed as no change."""
    repo, base_folder, head_folder = two_revisions
    (head_folder / "torch" / "aten.mm.default.yaml").rename(head_folder / "torch" / "aten.zzz.default.yml")
    assert cli.diff([str(base_folder), str(head_folder), "--fail-on-loss"]) == 2
    assert "aten.zzz.default.yml: a rule file's name ends .yaml" in capsys.readouterr().err
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "misnamed")
    for base, head in (("HEAD~1", "HEAD"), (str(base_folder), "HEAD")):
        with pytest.raises(RegistryError, match=r"HEAD:registry/torch/aten.zzz.default.yml: a rule file's name ends"):
            rule_diff.load_sides(base, head, repo)
    rule_diff.load_sides("HEAD", "HEAD~1", repo)  # a base that held it, and a head that renamed it back: no error


def test_an_empty_backend_name_and_an_empty_op_list_name_nothing(capsys):
    assert cli.sweep(["--backend", "", "--no-progress"]) == 2
    assert "--backend '' names no backend" in capsys.readouterr().err
    dtensor_rules = pytest.importorskip("metaspmd.backends.torch.dtensor_rules")
    with pytest.raises(ValueError, match=r"ops=\[\] names no op"):
        dtensor_rules.register([])
    with pytest.raises(TypeError, match="got bytes"):
        dtensor_rules.register(b"aten.mm.default")


def test_a_kernel_module_that_exits_on_import_is_named(tmp_path):
    """'cannot load backend: SystemExit: 3' named no module."""
    from metaspmd.sweep.user_modules import load_module

    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ImportError, match=rf"kernel module {tmp_path / 'exits.py'} failed on import: SystemExit: 3"):
        load_module(str(tmp_path / "exits.py"))


def _committed(name: str) -> str:
    return (ROOT / "registry" / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name,old,new,message", [
    ("jax/jax.gather.yaml", "'S1(0, drop)'", "'S1(99, drop)'",
     r":12: offset S1\(99, drop\) of input 1: element 99 of its index vector, whose last dim has 2 elements"),
    ("jax/jax.gather.yaml", "offset: [[], ['S1(0, drop)']]", "offset: [['S2(0, drop)'], []]",
     r":12: offset S2\(0, drop\) of input 0: the input is float32, not integer positions"),
    ("torch/aten.nonzero.default.yaml", "positions=0)", "positions=99)",
     r":10: S1: gather\(dim=0, positions=99\) moves element 99 of the last dim of output 0, which has 3"),
    ("torch/aten._unsafe_view.default.yaml", "block=5)", "block=999)",
     r":10: S2: gather\(dim=0, block=999\) makes dim 0 of output 0 of 999 blocks, but it has"),
    ("torch/aten.nonzero.default.yaml", "  results:\n", "  more: []\n  results:\n", r":13: more lists no layer"),
    ("torch/aten.nonzero.default.yaml", "dtype: int64}", "dtype: bogus}", r":14: unknown tensor dtype 'bogus'"),
    ("torch/aten._slow_conv2d_forward.default.yaml", "'gather(dim=2, halo=1)'", "'gather(dim=2, halo=100)'",
     r":11: S3: gather\(dim=2, halo=100\) drops or overlaps 100 elements of a shard along dim 2 of output 0, which "
     r"has \d+"),
    ("torch/aten._slow_conv2d_forward.default.yaml", "S3(halo=1)", "S3(halo=100)",
     r":9: S3\(halo=100\): a halo of 100 along input 0 dim 2, which has \d+ elements in the example"),
], ids=["offset component", "offset of floats", "positions component", "block count", "empty more", "dtype",
        "output halo", "input halo"])
def test_indices_beyond_what_they_index_are_refused_at_their_line(name, old, new, message):
    """Codegen emitted the offset into the JAX table: a runtime would subtract a shard's start
    from an element no index vector has."""
    text = _committed(name)
    assert old in text
    loads_record(text, name)
    with pytest.raises(RegistryError, match=message):
        loads_record(text.replace(old, new, 1), name)


@pytest.mark.parametrize("value", ["hello", "true", "0.60000000001", "[0.6]"])
def test_an_example_value_other_than_the_signatures_is_refused_at_its_line(value):
    """Only tensors were compared: `alpha=0.6` keyed the rules of a call with alpha 'hello'."""
    text = mm(sig="'self:f[*,*] mat2:f[*,*] alpha=0.6'").replace(
        "    mat2: {shape: [4, 5], dtype: float64}\n", f"    mat2: {{shape: [4, 5], dtype: float64}}\n    alpha: {value}\n")
    with pytest.raises(RegistryError, match=r"^f\.yaml:6: .* argument 'alpha' is 0.6 in the signature"):
        loads_record(text, "f.yaml")
    loads_record(text.replace(f"alpha: {value}", "alpha: 0.6"), "f.yaml")


@pytest.mark.parametrize("sig,value", [("dtype=torch.float32", "torch.float32"), ("other=1j", "'1j'"),
                                       ("reduce='mean'", "mean"), ("p={a:1}", "\"{'a': 1}\"")])
def test_an_example_holds_an_object_the_call_had_as_its_text(sig, value):
    """A dtype, a complex number or a dict is text in an example (YAML has none of them)."""
    name = sig.split("=")[0]
    text = mm(sig=f'"self:f[*,*] mat2:f[*,*] {sig}"').replace(
        "    mat2: {shape: [4, 5], dtype: float64}\n", f"    mat2: {{shape: [4, 5], dtype: float64}}\n    {name}: {value}\n")
    loads_record(text, "f.yaml")


def test_a_label_cutting_dims_of_two_lengths_is_refused():
    """S2 cut self's 7 columns with mat2's 4 rows, and the table took it."""
    with pytest.raises(RegistryError, match=r"^f\.yaml:8: S2 cuts dims of different lengths in the example: "
                                            r"input 1 dim 0 of 4, input 0 dim 1 of 7"):
        loads_record(mm().replace("self: {shape: [6, 4]", "self: {shape: [6, 7]"), "f.yaml")


def test_rule_files_in_a_subfolder_of_a_backend_folder_are_refused_by_every_command(tmp_path, capsys):
    """codegen and coverage passed over them unsaid, a diff of two folders saw no change."""
    write(tmp_path / "base", "torch", "aten.mm.default")
    write(tmp_path / "reg", "torch", "aten.mm.default")
    write(tmp_path / "reg" / "torch", "extra", "aten.bmm.default", mm(op="aten.bmm.default"))
    for run in (lambda: cli.codegen(["--registry", str(tmp_path / "reg"), "--out", str(tmp_path / "gen")]),
                lambda: cli.coverage(["--registry", str(tmp_path / "reg")]),
                lambda: cli.diff([str(tmp_path / "base"), str(tmp_path / "reg")])):
        assert run() == 2
        assert f"{tmp_path / 'reg' / 'torch' / 'extra'}: rule files in a subfolder" in capsys.readouterr().err
    assert not (tmp_path / "gen").exists()


def test_codegen_of_the_repositorys_registry_refuses_a_misspelt_backend_folder(tmp_path, capsys, monkeypatch):
    """Checked for --registry only: `codegen --check` passed beside registry/troch/."""
    for backend in ("torch", "jax"):
        write(tmp_path / "registry", backend, "aten.mm.default" if backend == "torch" else "jax.op",
              mm() if backend == "torch" else mm(op="jax.op", backend="jax"))
    write(tmp_path / "registry", "troch", "aten.bmm.default", mm(op="aten.bmm.default"))
    monkeypatch.setattr(cli, "REGISTRY", tmp_path / "registry")
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    assert cli.codegen(["--check"]) == 2
    assert f"{tmp_path / 'registry' / 'troch'}: rule files in a folder named after no backend" in capsys.readouterr().err


def test_codegen_check_of_a_registry_of_ones_own_does_not_depend_on_its_spelling(tmp_path, capsys, monkeypatch):
    """The header held --registry as typed: the same folder spelled otherwise was STALE."""
    write(tmp_path / "base", "torch", "aten.mm.default")
    monkeypatch.chdir(tmp_path)
    assert cli.codegen(["--registry", "base", "--out", "gen"]) == 0
    for spelling in (str(tmp_path / "base") + "/", "./base", "gen/../base"):
        assert cli.codegen(["--registry", spelling, "--out", "gen", "--check"]) == 0, spelling
    monkeypatch.chdir(tmp_path / "gen")
    assert cli.codegen(["--registry", "../base", "--out", ".", "--check"]) == 0


def test_codegen_check_of_a_registry_of_ones_own_names_its_own_command(tmp_path, capsys, monkeypatch):
    """A stale table of one's own registry said "run metaspmd codegen", which rewrites the
    repository's generated/ from its registry, not these tables."""
    write(tmp_path / "my reg", "torch", "aten.mm.default")
    monkeypatch.chdir(tmp_path)
    assert cli.codegen(["--registry", "my reg", "--out", "gen", "--check"]) == 1
    said = capsys.readouterr().out
    assert "torch_rules.py: STALE (run metaspmd codegen --registry 'my reg' --out gen)" in said, said


def test_a_path_too_long_to_name_is_a_usage_error_for_every_command(capsys):
    """Path.is_dir raised OSError (File name too long): a traceback and status 1."""
    long = "/tmp/" + "a" * 300
    for run in (lambda: cli.codegen(["--registry", long, "--out", "/tmp/gen"]),
                lambda: cli.coverage(["--registry", long])):
        with pytest.raises(SystemExit) as e:
            run()
        assert e.value.code == 2 and "(305 characters): File name too long" in capsys.readouterr().err
    assert cli.diff(["a" * 300, "HEAD"]) == 2
    assert "is neither a folder nor a git revision" in capsys.readouterr().err


def test_diff_refuses_a_changed_file_whose_name_holds_a_line_break(two_revisions, capsys):
    """git cat-file reads a name a line: the file came back missing on both sides, and the
    diff saw no change."""
    repo, _, head_folder = two_revisions
    (head_folder / "torch" / "a\nb.yaml").write_text("x")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "newline")
    with pytest.raises(RegistryError, match=r"'registry/torch/a\\nb.yaml': a file name holding a line break"):
        rule_diff.load_sides("HEAD~1", "HEAD", repo)


def test_diff_refuses_a_rule_file_committed_as_a_symlink(two_revisions):
    """git stores a link's target path as its blob: read as rules, it said "rule file must be a
    mapping", naming nothing about the link."""
    repo, base_folder, head_folder = two_revisions
    link = head_folder / "torch" / "aten.mm.default.yaml"
    (repo / "kept.yaml").write_text(link.read_text())
    link.unlink()
    link.symlink_to(Path("..", "..", "kept.yaml"))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "linked")
    expected = r"HEAD:registry/torch/aten.mm.default.yaml: a symbolic link in git, whose content is the path it points to"
    for base, head in (("HEAD~1", "HEAD"), (str(base_folder), "HEAD")):
        with pytest.raises(RegistryError, match=expected):
            rule_diff.load_sides(base, head, repo)
    _unreadable_in_the_base("HEAD", "HEAD~1", repo, expected)
    rule_diff.load_sides(str(base_folder), str(head_folder))  # a folder reads the file it links to


def _unreadable_in_the_base(base: str, head: str, repo: Path, why: str) -> None:
    """A diff whose base holds, at a changed path, what the head fixes: listed with why,
    its rules neither gained nor lost."""
    d = rule_diff.diff(*rule_diff.load_sides(base, head, repo))
    assert [(b, op) for b, op, _, _ in d.unreadable] == [("torch", "aten.mm.default")]
    assert re.search(why, d.unreadable[0][2]) and d.unreadable[0][3] == "ok"
    assert not any(op == "aten.mm.default" for _, op, *_ in d.gained + d.lost + d.added + d.removed)
    assert "### Unreadable in the base (rules not compared)" in rule_diff.to_markdown(d, base, head)


@pytest.mark.parametrize("broken", ["reduce(foo)", "\xff"])
def test_a_diff_that_fixes_a_broken_rule_file_lists_it_and_diffs_the_rest(two_revisions, broken, capsys):
    """A pull request that repairs a rule file got no diff (exit 2), and a --fail-on-loss
    gate failed it."""
    repo, base_folder, head_folder = two_revisions
    path = head_folder / "torch" / "aten.mm.default.yaml"
    good = path.read_bytes()
    path.write_bytes(good.replace(b"reduce(max)", broken.encode("latin-1")))
    _commit_after(repo, lambda: None)
    path.write_bytes(good)
    (head_folder / "torch" / "aten.bmm.default.yaml").unlink()
    _commit_after(repo, lambda: None)
    why = r"HEAD~1:registry/torch/aten.mm.default.yaml:\d+: " + ("combine of S2: bad reduce op 'foo'" if "foo" in broken
                                                                   else "not valid UTF-8")
    _unreadable_in_the_base("HEAD~1", "HEAD", repo, why)
    d = rule_diff.diff(*rule_diff.load_sides("HEAD~1", "HEAD", repo))
    assert [op for _, op, _ in d.removed] == ["aten.bmm.default"]  # the rest is diffed
    broken_folder = head_folder.parent / "broken"  # two folders: the same
    shutil.copytree(head_folder, broken_folder)
    (broken_folder / "torch" / "aten.mm.default.yaml").write_bytes(good.replace(b"reduce(max)", broken.encode("latin-1")))
    d = rule_diff.diff(*rule_diff.load_sides(str(broken_folder), str(head_folder)))
    assert [(op, new) for _, op, _, new in d.unreadable] == [("aten.mm.default", "ok")] and not d.has_loss
    with pytest.raises(RegistryError, match=r"broken/torch/aten.mm.default.yaml"):  # the head as codegen reads it
        rule_diff.load_sides(str(head_folder), str(broken_folder))
    # a revision against a folder (``metaspmd diff main registry``) reads the base alike
    d = rule_diff.diff(*rule_diff.load_sides("HEAD~1", str(head_folder), repo))
    assert [(op, new) for _, op, _, new in d.unreadable] == [("aten.mm.default", "ok")]
    assert [op for _, op, _ in d.removed] == ["aten.bmm.default"]
    # a base file that cannot be opened at all: a symlink to nothing
    (broken_folder / "torch" / "aten.mm.default.yaml").unlink()
    (broken_folder / "torch" / "aten.mm.default.yaml").symlink_to(broken_folder / "nowhere.yaml")
    d = rule_diff.diff(*rule_diff.load_sides(str(broken_folder), str(head_folder)))
    assert [(op, new) for _, op, _, new in d.unreadable] == [("aten.mm.default", "ok")]
    assert "a symlink to" in d.unreadable[0][2]


def _commit_after(repo: Path, change) -> None:
    change()
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "odd")


@pytest.mark.parametrize("odd,message", [
    # read as the real op's file, it replaced it, or was reported added
    (lambda reg: shutil.copy(reg / "torch" / "aten.mm.default.yaml", (reg / "torch" / "torch").mkdir() or reg / "torch" / "torch"),
     r"HEAD:registry/torch/torch: rule files in a subfolder of registry/torch"),
    (lambda reg: shutil.copytree(reg / "torch", reg / "troch"),
     r"HEAD:registry/troch: rule files in a folder named after no backend \(backends: .*torch"),
    (lambda reg: shutil.copy(reg / "torch" / "aten.mm.default.yaml", reg / "aten.mm.default.yaml"),
     r"HEAD:registry/aten.mm.default.yaml: a rule file outside a backend folder"),
    # read as every rule of the backend removed
    (lambda reg: (shutil.move(reg / "jax", reg.parent / "jax"), (reg / "jax").symlink_to(Path("..", "jax"))),
     r"HEAD:registry/jax: a backend folder stored as a symbolic link in git"),
    (lambda reg: (shutil.rmtree(reg / "jax"), (reg / "jax").write_text("x\n")),
     r"HEAD:registry/jax: a file where the jax/ folder of rule files belongs"),
    # the tree object read as the file: "not valid UTF-8"
    (lambda reg: ((reg / "torch" / "aten.mm.default.yaml").unlink(), (reg / "torch" / "aten.mm.default.yaml").mkdir(),
                  (reg / "torch" / "aten.mm.default.yaml" / "x").write_text("x")),
     r"HEAD:registry/torch/aten.mm.default.yaml: a folder, not a rule file"),
], ids=["subfolder", "no backend", "outside a backend folder", "backend folder link", "backend folder file",
        "folder"])
def test_diff_refuses_what_a_revision_holds_that_a_folder_would_be_refused_for(two_revisions, odd, message):
    repo, base_folder, head_folder = two_revisions
    _commit_after(repo, lambda: odd(head_folder))
    for base, head in (("HEAD~1", "HEAD"), (str(base_folder), "HEAD")):
        with pytest.raises(RegistryError, match=message):
            rule_diff.load_sides(base, head, repo)


def test_diff_refuses_a_submodule_and_a_blob_past_a_rule_files_size(two_revisions, monkeypatch):
    """A submodule entry read as its commit object ("not valid YAML"), or was reported removed
    where the commit is not in the repository; a 512 MB blob was read whole."""
    repo, base_folder, _ = two_revisions
    commit = git(repo, "rev-parse", "HEAD~1").strip()
    git(repo, "rm", "-q", "registry/torch/aten.mm.default.yaml")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{commit},registry/torch/aten.mm.default.yaml")
    git(repo, "commit", "-qm", "submodule")
    for base, head in (("HEAD~1", "HEAD"), (str(base_folder), "HEAD")):
        with pytest.raises(RegistryError, match=r"HEAD:registry/torch/aten.mm.default.yaml: a submodule"):
            rule_diff.load_sides(base, head, repo)
    _unreadable_in_the_base("HEAD", "HEAD~1", repo, r"HEAD:registry/torch/aten.mm.default.yaml: a submodule")
    monkeypatch.setattr(rule_diff, "MOST_FILE_BYTES", 100)
    with pytest.raises(RegistryError, match=r"HEAD~1:registry/jax/jax.op0.yaml: cannot read: [\d,]+ bytes, "
                                            r"more than a rule file holds \(at most 100\)"):
        rule_diff.load_sides("HEAD~2", "HEAD~1", repo)


def test_diff_of_folders_refuses_a_file_where_a_backend_folder_belongs(two_revisions):
    """Read as every rule of that backend removed, exit 0, and a merge gate passed."""
    repo, base_folder, head_folder = two_revisions
    shutil.rmtree(head_folder / "jax")
    (head_folder / "jax").write_text("x\n")
    with pytest.raises(RegistryError, match=r"registry/jax: not a folder \(expected the folder of jax's rule files"):
        rule_diff.load_sides(str(base_folder), str(head_folder))
    # as a base (what the head fixes): each of the head's jax ops listed as unreadable there
    for base in (str(head_folder), "HEAD"):
        if base == "HEAD":
            _commit_after(repo, lambda: None)
        d = rule_diff.diff(*rule_diff.load_sides(base, str(base_folder), repo))
        assert len(d.unreadable) == 20 and {b for b, *_ in d.unreadable} == {"jax"}, d.unreadable
        assert "a file where the jax/ folder" in d.unreadable[0][2] or "not a folder" in d.unreadable[0][2]
        assert not any(b == "jax" for b, *_ in d.added + d.removed + d.gained + d.lost)


def test_diff_of_folders_refuses_a_folder_named_after_no_backend(two_revisions):
    _, base_folder, head_folder = two_revisions
    shutil.copytree(head_folder / "torch", head_folder / "troch")
    with pytest.raises(RegistryError, match=r"troch: rule files in a folder named after no backend"):
        rule_diff.load_sides(str(base_folder), str(head_folder))


def test_a_kernel_module_that_hangs_on_import_is_named_when_loading_times_out(tmp_path, capsys, monkeypatch):
    """Only "still setting up (loading the framework and its sample index)" was said, for the
    whole of the load's limit, and the limit's error named no module."""
    monkeypatch.setattr("metaspmd.sweep.workers.STARTUP_TIMEOUT", 4.0)
    monkeypatch.setattr("metaspmd.sweep.engine.STARTUP_TIMEOUT", 4.0)
    monkeypatch.setattr("metaspmd.sweep.engine.SLOW_START_S", 0.5)
    hangs = tmp_path / "hangs.py"
    hangs.write_text("import time\ntime.sleep(10 ** 6)\n")
    assert cli.sweep(["--backend", "tvm", "--kernels", str(hangs), "--out", str(tmp_path / "reg"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"and importing --kernels {hangs}; at most 4 s)" in err
    assert f"did not load within 4s (loading imports --kernels {hangs})" in err
    assert not (tmp_path / "reg").exists() or not any((tmp_path / "reg").rglob("*.yaml"))
