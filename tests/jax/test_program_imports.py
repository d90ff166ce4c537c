"""The modules that define jax programs import only the leaf ``program`` module, not the
``programs`` module that lists them (which imports them): no import cycle."""

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
