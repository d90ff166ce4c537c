"""The ``metaspmd`` command: subcommands listed, their own help, exit codes passed through,
and no framework imported to dispatch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metaspmd import cli

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metaspmd.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_help_lists_every_subcommand_and_imports_no_framework():
    code = ("import sys; from metaspmd.cli import main; rc = main(['--help']); "
            "print('FRAMEWORKS', [m for m in ('torch', 'jax', 'tvm') if m in sys.modules]); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name in ("sweep", "codegen", "diff", "coverage", "crosscheck"):
        assert f"\n  {name} " in out.stdout
    assert "FRAMEWORKS []" in out.stdout


def test_subcommand_help_is_its_own(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: metaspmd sweep") and "--backend" in text and "--resume" in text


def test_usage_errors_exit_2(capsys):
    assert cli.main([]) == 2
    assert cli.main(["no-such-command"]) == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["diff"])  # missing BASE and HEAD: argparse's own exit status
    assert e.value.code == 2


def test_codegen_check_exit_code_passes_through(tmp_path):
    # the jax table: the smaller of the two (tools/codegen.py --check covers both in CI)
    assert run("codegen", "--check", "--backend", "jax").returncode == 0
    stale = run("codegen", "--check", "--backend", "jax", "--out", str(tmp_path))
    assert stale.returncode == 1 and "STALE" in stale.stdout
    assert not any(tmp_path.iterdir())  # --check writes nothing


def test_tools_wrappers_call_the_same_commands():
    for script, name in (("sweep", "sweep"), ("codegen", "codegen"), ("rule_diff", "diff"),
                         ("coverage", "coverage"), ("crosscheck", "crosscheck")):
        text = (ROOT / "tools" / f"{script}.py").read_text(encoding="utf-8")
        assert f"from metaspmd.cli import {name}\n" in text and f"sys.exit({name}())" in text


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A copy of the checkout's code: tools/ and the folders the package is made of."""
    to = tmp_path_factory.mktemp("clone")
    for folder in ("metaspmd", "backends", "codegen", "generated", "tools"):
        shutil.copytree(ROOT / folder, to / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return to


@pytest.mark.parametrize("tool", ["sweep", "codegen", "rule_diff", "coverage"])
def test_a_tool_run_from_a_clone_uses_the_clones_code(clone, tool, tmp_path):
    """The tools imported the metaspmd installed editable, another checkout's, and wrote its
    registry/ and generated/; its backends and codegen come through the install's finder."""
    code = ("import runpy, sys; runpy.run_path(sys.argv[1])\n"  # the tool's imports, not its main
            "import metaspmd.backends.torch, metaspmd.cli, metaspmd.codegen.generator, metaspmd.generated\n"
            "for m in (metaspmd.cli, metaspmd.backends.torch, metaspmd.codegen.generator, metaspmd.generated):\n"
            "    print(m.__file__)\n"
            "print(metaspmd.cli.REGISTRY)\n")
    done = subprocess.run([sys.executable, "-c", code, str(clone / "tools" / f"{tool}.py")], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(clone / p) for p in (
        "metaspmd/cli.py", "backends/torch/__init__.py", "codegen/generator.py", "generated/__init__.py", "registry")]


def test_crosscheck_exit_status_tells_a_failed_rule_from_an_unchecked_op(capsys):
    """An op whose check timed out exited 1, as a rule that fails re-verification does, and
    no --help gave the statuses."""
    assert [cli.crosscheck_status(f, u) for f, u in ((False, False), (True, False), (False, True), (True, True))] \
        == [0, 1, 3, 1]
    assert cli.crosscheck(["--help"]) == 0
    assert "exit status: 0 done, 1 a rule of ours failed re-verification" in " ".join(capsys.readouterr().out.split())
