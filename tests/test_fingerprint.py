"""The fingerprint of a user's op code (the rule cache's key for it): it changes with the
op's code, a helper's, a constant it reads and its defaults, not with anything else, and
is the same in every process."""

import functools
import os
import subprocess
import sys
import textwrap

from metaspmd.fingerprint import code_fingerprint

MODULE = """
SCALE = {scale}

def helper(x):
    return x + SCALE

def op(x, k={default}, mode="a"):
    if mode in {{"a", "b", "c", "d"}}:  # a frozenset constant, ordered by the salted string hashes
        return helper({body})
    return x
"""


def _fingerprint(tmp_path, name, scale=1.0, default=2, body="x * k"):
    namespace = {}
    source = MODULE.format(scale=scale, default=default, body=body)
    exec(compile(source, str(tmp_path / f"{name}.py"), "exec"), namespace)
    return code_fingerprint([namespace["op"]])


def test_the_fingerprint_changes_with_the_code_a_helper_a_constant_and_a_default(tmp_path):
    base = _fingerprint(tmp_path, "m")
    assert _fingerprint(tmp_path, "m") == base
    changed = [_fingerprint(tmp_path, "m", body="x * k + 1"), _fingerprint(tmp_path, "m", scale=2.0),
               _fingerprint(tmp_path, "m", default=3)]
    assert len({base, *changed}) == 4


def test_a_partial_counts_its_arguments_and_a_builtin_has_no_fingerprint():
    def scale(x, k):
        return x * k

    assert code_fingerprint([functools.partial(scale, k=2)]) != code_fingerprint([functools.partial(scale, k=3)])
    assert code_fingerprint([len]) is None  # C code: nothing to read
    assert code_fingerprint([scale, len]) is None


def test_the_fingerprint_is_the_same_in_another_process(tmp_path):
    script = tmp_path / "m.py"
    script.write_text(textwrap.dedent(MODULE.format(scale=1.0, default=2, body="x * k")) + textwrap.dedent("""
        from metaspmd.fingerprint import code_fingerprint
        print(code_fingerprint([op]))
    """))
    runs = {subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(1, 5)}
    assert len(runs) == 1 and len(runs.pop().strip()) == 24


def test_a_table_the_op_reads_counts_by_its_contents_and_an_object_leaves_no_fingerprint():
    """A dict read by name was hashed by its type: a process with another config read
    back the rules explored for the first one."""
    def op_reading(config):
        namespace = {"CFG": config}
        exec("def op(x):\n    return x - x.mean(CFG['dim'])", namespace)
        return code_fingerprint([namespace["op"]])

    assert op_reading({"dim": 0}) != op_reading({"dim": 1})
    assert op_reading({"dim": 0, "k": [1, {2, 3}]}) == op_reading({"k": [1, {3, 2}], "dim": 0})
    assert op_reading(object()) is None  # its state is not read: cached in memory only
    assert op_reading({"dim": object()}) is None
    assert op_reading(functools) is not None and op_reading(os.sep) is not None  # a module, a str
