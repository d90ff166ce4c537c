"""The jax backend package: no import cycle between the program modules, and a rule cache
keyed by the jax and jaxlib versions, read without importing jax."""

import importlib.metadata
import subprocess
import sys

import pytest

pytest.importorskip("jax")


def test_program_definitions_do_not_import_the_program_list():
    code = ("import sys, metaspmd.backends.jax.samples, metaspmd.backends.jax.model_programs;"
            "print(sorted(m for m in sys.modules if m.startswith('metaspmd.backends.jax.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = eval(out)
    assert "metaspmd.backends.jax.program" in loaded
    assert "metaspmd.backends.jax.programs" not in loaded


def test_programs_reexports_the_leaf_program():
    from metaspmd.backends.jax import program, programs

    assert programs.Program is program.Program


def test_the_rule_cache_is_keyed_by_jax_and_jaxlib_without_importing_jax(tmp_path):
    code = ("import sys, metaspmd.backends.jax; from metaspmd.cache import RuleCache;"
            f"print('jax' in sys.modules, RuleCache({str(tmp_path)!r}).path('jax', 'add', 's').parent.parent.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    jax_version, jaxlib_version = (importlib.metadata.version(d) for d in ("jax", "jaxlib"))
    assert out == ["False", f"jax-{jax_version}-jaxlib-{jaxlib_version}"]
