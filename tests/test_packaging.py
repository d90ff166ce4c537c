"""A wheel built from the repo holds every module at its import name (the top-level
folders mapped under ``metaspmd``), the generated tables and the codegen templates, and
works installed on its own, away from a checkout."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Top-level folder -> the package it installs as (pyproject's package-dir).
MAPPED = {"metaspmd": "metaspmd", "backends": "metaspmd/backends", "codegen": "metaspmd/codegen",
          "generated": "metaspmd/generated"}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs a git checkout")
    return [p for p in out.decode().split("\0") if p and (REPO / p).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the tracked files, so the build leaves nothing in the checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for rel in _tracked():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist")], check=True)
    (found,) = (tmp / "dist").glob("metaspmd-*.whl")
    return found


def _expected(rel: str) -> str | None:
    top, _, rest = rel.partition("/")
    if top not in MAPPED or not rest:
        return None
    if rel.endswith(".py") or (top == "codegen" and rest.startswith("templates/")):
        return f"{MAPPED[top]}/{rest}"
    return None


@pytest.mark.slow
def test_the_wheel_holds_every_module_table_and_template(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {e for e in map(_expected, _tracked()) if e is not None}
    assert "metaspmd/generated/torch_rules.py" in expected and any("/templates/" in e for e in expected)
    assert sorted(expected - names) == []
    assert {n.split("/")[0] for n in names} == {"metaspmd", wheel.name.split("-py3")[0] + ".dist-info"}


@pytest.mark.slow
def test_the_installed_wheel_imports_away_from_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall", str(wheel)],
                   check=True)
    code = ("import metaspmd, metaspmd.codegen, metaspmd.codegen.generator\n"
            "from metaspmd.generated.torch_rules import RULES\n"
            "from metaspmd.generated.jax_rules import RULES as JAX_RULES\n"
            "import metaspmd.backends.torch.dtensor_rules, metaspmd.backends.torch.parallelize\n"
            "assert RULES and JAX_RULES\n"
            "print(metaspmd.__file__, metaspmd.codegen.generator.__file__)\n")
    out = subprocess.run([str(python), "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert all(Path(f).is_relative_to(venv) for f in out.stdout.split()), out.stdout
