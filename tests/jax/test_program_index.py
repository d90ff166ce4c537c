"""The program index is kept on disk: a second process reads it instead of tracing every
program, an entry's equations are the ones tracing gives, and a corrupt or stale file is
rebuilt."""

import gzip
import json
import subprocess
import sys

import pytest

pytest.importorskip("jax")


_REPORT = """
calls = [[programs.programs()[o.program].name, list(o.path), repr(o.params), repr(o.in_avals)] for o in index["tile"]]
where = {p: [[name, list(path)] for name, path in index.where(p)] for p in sorted(index)}
print(json.dumps({"where": where, "tile": calls}))
"""
_START = """
import json, sys
from pathlib import Path
from metaspmd.backends.jax import enable_x64
enable_x64()
from metaspmd.backends.jax import program_index, programs
"""
# the first process: the index as any process has it (read from the user's cache, or
# traced there once), written into the test's folder
_WRITE = _START + """
index = program_index.index()
program_index.write(program_index.cache_path(Path(sys.argv[1])), {p: index.where(p) for p in index})
""" + _REPORT
# the second: reads that folder's file, and may not trace every program
_READ = _START + """
def build():
    raise AssertionError("traced every program instead of reading the file")

program_index.build = build
index = program_index.load(Path(sys.argv[1]))
""" + _REPORT


@pytest.mark.slow  # two processes that import jax
def test_a_second_process_reads_the_file_and_traces_only_what_it_reads(tmp_path):
    """Both in processes of their own, float64 enabled before jax's harnesses are imported:
    the harnesses of 64-bit dtypes exist only where it was, so a process that imported them
    without it (a test worker) has other programs, and rightly calls such a file stale."""
    said = []
    for script in (_WRITE, _READ):
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        said.append(json.loads(done.stdout))
    ours, theirs = said
    assert theirs["where"] == ours["where"]
    assert theirs["tile"] == ours["tile"] and theirs["tile"]  # same equations, same params


@pytest.fixture
def few_programs(monkeypatch):
    """Only the sample programs (a second to trace, not every harness)."""
    from metaspmd.backends.jax import programs

    few = tuple(p for p in programs.programs() if p.name.startswith("sample/"))
    monkeypatch.setattr(programs, "programs", lambda: few)
    return few


def test_a_missing_corrupt_or_stale_file_is_rebuilt(backend, tmp_path, few_programs):
    from metaspmd.backends.jax import program_index

    path = program_index.cache_path(tmp_path)
    built = []

    def load():
        built.clear()
        return program_index.load(tmp_path, log=built.append)

    first = load()
    assert built and program_index.read(path) == {p: first.where(p) for p in first}
    assert load().where("tile") == first.where("tile") and not built  # read, not traced
    good = path.read_bytes()
    for bad in (b"not gzip", good[: len(good) // 2], gzip.compress(b"[1, 2]"), gzip.compress(b'{"format": 0}')):
        path.write_bytes(bad)
        again = load()
        assert built, bad[:20]
        assert {p: again.where(p) for p in again} == {p: first.where(p) for p in first}
        assert path.read_bytes() == good  # the same file, written again

    # a path the programs no longer have at that primitive: found when the entry is read,
    # and the file is traced again (its name records the sources, so only a jax change
    # that keeps the version could do this)
    other = next(p for p in sorted(first) if p != "tile" and first.where(p) != first.where("tile"))
    body = json.loads(gzip.decompress(good))
    body["where"]["tile"], body["where"][other] = body["where"][other], body["where"]["tile"]
    path.write_bytes(gzip.compress(json.dumps(body).encode()))
    swapped = load()
    assert not built and swapped.where("tile") == first.where(other)
    assert [o.path for o in swapped["tile"]] == [o.path for o in first["tile"]]
    assert path.read_bytes() == good

    # every entry read from the file, traced again, is what tracing everything gave
    read = load()
    read.trace_all()
    assert not built
    assert {p: [(o.program, o.path, repr(o.params)) for o in read[p]] for p in read} == {
        p: [(o.program, o.path, repr(o.params)) for o in first[p]] for p in first}


def test_the_file_name_changes_with_the_program_sources_and_float64(backend, tmp_path, monkeypatch):
    import jax

    from metaspmd.backends.jax import program_index

    path = program_index.cache_path(tmp_path)
    monkeypatch.setattr(program_index, "_digest", lambda: "another")
    assert program_index.cache_path(tmp_path) != path
    monkeypatch.undo()
    jax.config.update("jax_enable_x64", False)
    try:
        assert program_index.cache_path(tmp_path) != path
    finally:
        jax.config.update("jax_enable_x64", True)


def test_the_file_does_not_depend_on_the_order_the_programs_were_found_in(tmp_path, few_programs):
    """The programs' order follows the building process's string hashes: two builds gave
    files with the same locations in other orders."""
    from metaspmd.backends.jax import program_index

    where = program_index.build()[0]
    shuffled = {p: tuple(reversed(v)) for p, v in reversed(list(where.items()))}
    program_index.write(tmp_path / "a.json.gz", where)
    program_index.write(tmp_path / "b.json.gz", shuffled)
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
    assert program_index.read(tmp_path / "b.json.gz") == where


@pytest.mark.slow  # replays every program's equations (~15 s)
def test_every_program_calls_a_primitive_with_the_params_jaxs_functions_bind(backend):
    """jax's mul harness binds no ``out_dtype``, which ``lax.mul`` always binds (None): its
    calls keyed the table's ``mul x:f[*,*] y:f[*,*]``, which no program's mul looks up. The
    index fills such params in (``programs.BOUND_DEFAULTS``), so a primitive's calls carry
    one set of param names. conj's harness binds ``_input_dtype``, a name no program's
    conj has (jax's own binds ``input_dtype``): a call of its own, left as the harness has it."""
    from metaspmd.backends.jax import program_index, programs

    index = program_index.index()
    names = {p: {frozenset(o.params) for o in index[p]} for p in sorted(index)}
    assert {p for p, found in names.items() if len(found) > 1} <= {"conj"}
    harness = [o for o in index["mul"] if programs.programs()[o.program].name.startswith("harness/mul/")]
    assert harness and all(o.params == {"out_dtype": None} for o in harness)


def test_a_call_after_a_custom_jvp_function_is_captured(backend):
    """The CNN program's loss is a logsumexp, a ``custom_jvp_call`` in its jaxpr: bound
    with its jaxpr's params, it raised KeyError('subfuns'), so every call after it (the
    whole backward: the convolutions' gradients, the pooling's select_and_scatter_add)
    could not be captured, and the sweep left their signatures out. Bound as
    ``core.eval_jaxpr`` binds, each runs."""
    from metaspmd.backends.jax import program_index, programs

    index = program_index.index()
    cnn = [o for o in index["select_and_scatter_add"] if programs.programs()[o.program].name == "model/cnn"]
    assert cnn
    for occ in cnn:
        operands = programs.capture(occ, 0)
        assert [tuple(x.shape) for x in operands] == [tuple(a.shape) for a in occ.in_avals]
