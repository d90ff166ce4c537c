"""Registry files: deterministic dump, lossless round trip, strict validation with file:line."""

import dataclasses
import enum
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from metaspmd import cli, rule_diff
from metaspmd.registry_io import (
    MOST_FILE_BYTES, RegistryError, dump_record, load_record, load_registry, loads_record, write_record, write_text_atomic,
)
from metaspmd.rules import Example, OpRecord, RuleEntry, TensorArg, Verification, make_record
from metaspmd.signature import signature, signature_error, split_signature
from metaspmd.spec import CombineSpec, OffsetSpec, PartialSpec, ShardSpec

np = pytest.importorskip("numpy")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_backend.numpy_ops import NumpyOps  # noqa: E402
from registry_samples import MM  # noqa: E402

X = np.zeros((3, 1, 4), dtype=np.float32)


def entry(**kw):
    base = dict(
        signature="self:f[*,*] mat2:f[*,*] alpha=0.5 dims=[1,2]", status="ok",
        shard=ShardSpec.parse("[[S1, S2], [S2, S3]]"), partial=PartialSpec.parse("[[S4(sum)], []]"),
        combine=CombineSpec.parse("{S1: gather(dim=0), S2: reduce(sum), S3: 'gather(dim=1, halo=1)', S4: reduce(sum)}".replace("'", "")),
        example=Example((("self", TensorArg((6, 4), "float64")), ("mat2", TensorArg((4, 5), "float64")), ("alpha", 0.5), ("dims", (1, 2)))),
        verified=Verification(3, (2, 3), True), notes=("a note",), results=(TensorArg((6, 5), "float64"),),
    )
    base.update(kw)
    return RuleEntry(**base)


def test_round_trip_is_lossless_and_deterministic(tmp_path):
    record = make_record("aten.mm.default", "torch", [entry(), entry(signature="self:f[*,*] mat2:f[*,*] alpha=1 dims=[1,2]", status="replicate-only", reason="r",
                example=Example((("self", TensorArg((6, 4), "float64")), ("mat2", TensorArg((4, 5), "float64")),
                                 ("alpha", 1), ("dims", (1, 2))))),
    ])
    text = dump_record(record)
    assert loads_record(text) == record
    assert dump_record(loads_record(text)) == text
    path = write_record(tmp_path, record)
    assert path == tmp_path / "torch" / "aten.mm.default.yaml"
    assert load_record(path) == record
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_index_offsets_round_trip_and_expand():
    e = entry(signature="weight:f[*,*] indices:i[*]", shard=ShardSpec.parse("[[S1, N], [N]]"), partial=PartialSpec.parse("[[], []]"),
              combine=CombineSpec.parse("{S1: reduce(sum)}"), offset=OffsetSpec.parse("[[], [S1(0)]]"),
              example=Example((("weight", TensorArg((6, 4), "float64")), ("indices", TensorArg((3,), "int64")))))
    text = dump_record(make_record("aten.embedding.default", "torch", [e]))
    assert "  offset: [[], [S1(0)]]\n" in text and loads_record(text).entries[0] == e
    assert [str(s) for s in e.strategies()] == ["S1: (S(0), O(0)) -> (reduce(sum))"]
    with pytest.raises(RegistryError, match=r"x.yaml:10: offset label S2 cuts no dim"):
        loads_record(text.replace("[[], [S1(0)]]", "[[], [S2]]"), "x.yaml")
    dropping = dataclasses.replace(e, offset=OffsetSpec.parse("[[], [S1(0, drop)]]"))
    text = dump_record(make_record("jax.gather", "jax", [dropping]))
    assert "  offset: [[], ['S1(0, drop)']]\n" in text and loads_record(text).entries[0] == dropping
    assert [str(s) for s in dropping.strategies()] == ["S1: (S(0), O(0, drop)) -> (reduce(sum))"]


def test_argreduce_must_read_an_input_its_label_cuts():
    text = MM.replace("S2: reduce(sum)", "S2: 'argreduce(max, input=1)'")
    assert "argreduce(max, input=1)" in str(loads_record(text, "mm.yaml").entries[0].combine)
    for old, new in (("S1: gather(dim=0)", "S1: 'argreduce(min, input=1)'"),  # S1 cuts self only
                     ("S2: reduce(sum)", "S2: 'argreduce(max, input=2)'")):  # there is no input 2
        with pytest.raises(RegistryError, match=r"mm.yaml:9: S[12]: argreduce\((min|max), input=[12]\) reads input"):
            loads_record(MM.replace(old, new), "mm.yaml")


def test_positions_must_move_by_the_start_of_a_cut():
    text = MM.replace("S1: gather(dim=0)", "S1: 'gather(dim=0, positions=1)'")
    assert "gather(dim=0, positions=1)" in str(loads_record(text, "mm.yaml").entries[0].combine)
    partial_only = MM.replace("  combine: {S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}",
                              "  partial: [[S4(sum)], []]\n"
                              "  combine: {S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1), S4: 'gather(dim=0, positions)'}")
    with pytest.raises(RegistryError, match=r"mm.yaml:10: S4: gather\(dim=0, positions\) moves positions .* cuts no dim"):
        loads_record(partial_only, "mm.yaml")


def test_loads_hand_written_file():
    r = loads_record(MM, "mm.yaml")
    assert str(r.entries[0].shard) == "[[S1, S2], [S2, S3]]"
    assert [str(s) for s in r.entries[0].strategies()][1] == "S2: (S(1), S(0)) -> (reduce(sum))"


@pytest.mark.parametrize("old,new,line,message", [
    ("S2: reduce(sum)", "S2: reduce(total)", 9, "bad reduce op"),
    ("S2: reduce(sum)", "S2: gather(dim=x)", 9, "bad combine"),
    ("S3: gather(dim=1)}", "S3: gather(dim=1), S7: identity}", 9, "unknown label S7"),
    ("[[S1, S2], [S2, S3]]", "[[S1, S2], [S2, S3], [N]]", 8, "example has 2 tensor inputs"),
    ("[[S1, S2], [S2, S3]]", "[[S1, S2], [S2, Q3]]", 8, "bad dim label"),
    ("status: ok\nentries", "status: great\nentries", 4, "unknown status"),
    ("  verified", "  colour: red\n  verified", 13, "unknown key 'colour'"),
    ("shard: [[S1", "shard: [[S1 [", 8, "not valid YAML"),
    ("shard_counts: [2, 3]", "shard_counts: [3, 2, 2]", 13, "shard_counts must be increasing, each count once"),
    # past 9 digits: no count or size a sweep writes
    ("shard_counts: [2, 3]", "shard_counts: [2, 3, 99999999999999999999999]", 13, "of at most 9 digits"),
    ("trials: 3", "trials: 1000000000", 13, "verified trials must be a whole number >= 0 of at most 9 digits"),
    ("shape: [4, 5]", "shape: [4, 99999999999999999999999]", 12, "bad tensor shape [4, 99999999999999999999999] (sizes"),
    ("dtype: float64", "dtype: float99", 11, "unknown tensor dtype 'float99'"),
])
def test_malformed_file_names_file_and_line(old, new, line, message):
    assert old in MM
    with pytest.raises(RegistryError) as err:
        loads_record(MM.replace(old, new, 1), "registry/torch/aten.mm.default.yaml")
    assert str(err.value).startswith(f"registry/torch/aten.mm.default.yaml:{line}:"), str(err.value)
    assert message in str(err.value)


def _entries(*signatures: str) -> str:
    """MM with one entry per signature, in this order (the same rule each)."""
    head, body = MM.split("- signature: self:f[*,*] mat2:f[*,*]\n")
    return head + "".join(f"- signature: {sig}\n{body}" for sig in signatures)


def test_a_repeated_signature_is_named_at_its_second_entry():
    text = _entries("self:f[*,*] mat2:f[*,*]", "self:f[6,*] mat2:f[*,*]", "self:f[*,*] mat2:f[*,*]")
    loads_record(_entries("self:f[*,*] mat2:f[*,*]", "self:f[6,*] mat2:f[*,*]"), "f.yaml")  # the two alone load
    with pytest.raises(RegistryError) as err:
        loads_record(text, "f.yaml")
    assert str(err.value) == ("f.yaml:26: entry 'self:f[*,*] mat2:f[*,*]' repeats the signature of the entry at "
                              "line 6"), str(err.value)


def test_an_entry_out_of_order_is_named_with_its_neighbour():
    with pytest.raises(RegistryError) as err:
        loads_record(_entries("self:f[6,*] mat2:f[*,*]", "self:f[*,*] mat2:f[*,*]"), "f.yaml")
    assert str(err.value) == ("f.yaml:16: entries must be sorted by signature: 'self:f[*,*] mat2:f[*,*]' comes "
                              "after 'self:f[6,*] mat2:f[*,*]'"), str(err.value)


def test_python_object_tag_rejected():
    text = MM.replace("dtype: float64}\n    mat2", "dtype: !!python/object/apply:os.system [echo hi]}\n    mat2", 1)
    with pytest.raises(RegistryError, match=r"f.yaml:11: tag .*python/object"):
        loads_record(text, "f.yaml")


def test_empty_and_unsafe_names():
    with pytest.raises(RegistryError, match="f.yaml:1: empty"):
        loads_record("", "f.yaml")
    with pytest.raises(RegistryError, match="characters"):
        loads_record(MM.replace("op: aten.mm.default", "op: ../../etc/passwd"), "f.yaml")
    with pytest.raises(RegistryError):
        write_record("/nonexistent", OpRecord("../x", "torch", "ok"))


def test_a_recursive_alias_is_refused_with_file_and_line():
    """``&e`` on the example and ``*e`` inside it: composing gives a cycle, which the reader
    would follow until the stack ran out."""
    text = MM.replace("  example:\n", "  example: &e\n").replace("    mat2: {shape: [4, 5], dtype: float64}\n",
                                                               "    mat2: {shape: [4, 5], dtype: float64}\n    loop: *e\n")
    with pytest.raises(RegistryError, match=r"^mm.yaml:10: anchor &e is not allowed"):
        loads_record(text, "mm.yaml")


def test_an_alias_bomb_is_refused_before_it_expands():
    """Nine levels of ten aliases each: 10**9 notes if the reader expanded them."""
    levels = ["    - &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"    - &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = MM.replace("  verified:", "  notes:\n" + "\n".join(levels) + "\n  verified:")
    with pytest.raises(RegistryError, match=r"^bomb.yaml:14: anchor &a0 is not allowed"):
        loads_record(text, "bomb.yaml")


def test_an_alias_is_refused_by_its_line():
    """The anchor hides in a comment, so the first thing refused is the alias itself."""
    text = MM.replace("status: ok\nentries", "status: *s  # &s\nentries")
    with pytest.raises(RegistryError, match=r"^a.yaml:4: alias \*s is not allowed"):
        loads_record(text, "a.yaml")


def test_an_ampersand_in_text_is_not_an_anchor():
    text = MM.replace("  verified:", "  reason: 'gather & reduce'\n  notes: [a & b, '&c']\n  verified:")
    assert loads_record(text, "mm.yaml").entries[0].notes == ("a & b", "&c")


@pytest.mark.parametrize("field,depth", [("notes", 5000), ("results", 3000)])
def test_deep_nesting_is_an_error_at_its_line_not_a_crash(field, depth):
    """Too deep for the reader's recursion: named by the line of the value, not line 1."""
    text = MM.replace("  verified:", f"  {field}:\n  - " + "[" * depth + "]" * depth + "\n  verified:")
    with pytest.raises(RegistryError, match=r"^deep.yaml:14: values nest too deeply"):
        loads_record(text, "deep.yaml")


def test_nesting_too_deep_for_libyaml_is_an_error_not_a_segfault():
    """libyaml composes in C, recursively: 30,000 levels overflowed the C stack (exit 139)
    before the reader's own check could run. Run in a child, which a crash would not take
    the test run down with."""
    code = (
        "import sys\n"
        "from metaspmd.registry_io import RegistryError, loads_record\n"
        "text, n = sys.stdin.read(), 30000\n"
        "for value in ('[' * n + ']' * n, '{a: ' * n + 'x' + '}' * n, '\\n  ' + '- ' * n + 'x'):\n"
        "    try:\n"
        "        loads_record(text.replace('status: ok\\nentries', 'status: ok\\nreason: ' + value + '\\nentries'), 'd.yaml')\n"
        "    except RegistryError as e:\n"
        "        print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], input=MM, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    deep = "values nest too deeply for a registry file (more than 1000 levels)"
    assert done.stdout.splitlines() == [f"d.yaml:5: {deep}", f"d.yaml:5: {deep}", f"d.yaml:6: {deep}"]


def test_a_big_shallow_file_passes_the_nesting_scan():
    """Past 1000 indicators ([ { - : ?) the nesting is measured on the parser's events: a
    long list of short values is not deep."""
    notes = "".join(f"  - 'a-b: [c-d] {i}'\n" for i in range(400))
    text = MM.replace("  verified:", "  notes:\n" + notes + "  verified:")
    assert len(loads_record(text, "big.yaml").entries[0].notes) == 400


@pytest.mark.parametrize("shard,message", [
    ("[[S1, S1], [S2, S3]]", "input 0 uses one label on two dims"),
    ("[[S1(scale=2), S2], [S2, S3]]", "S1 cuts dims in proportion but none plainly"),
])
def test_a_shard_table_the_model_refuses_names_file_and_line(shard, message):
    """Each label parses, but the table as a whole is refused: a SpecError escaped the
    loader with a traceback (codegen, coverage) or without file:line (diff)."""
    with pytest.raises(RegistryError, match=rf"^mm.yaml:8: shard: {message}"):
        loads_record(MM.replace("[[S1, S2], [S2, S3]]", shard), "mm.yaml")


@pytest.mark.parametrize("schema", ["true", "1.0", "'1'"])
def test_schema_must_be_the_integer_not_a_value_equal_to_it(schema):
    with pytest.raises(RegistryError, match=r"^mm.yaml:1: schema .* is not supported"):
        loads_record(MM.replace("schema: 1", f"schema: {schema}"), "mm.yaml")


@pytest.mark.parametrize("table,line", [
    ("  partial: [[S4(sum), S4(prod)], []]", "partial input 0 lists S4 twice"),
    ("  offset: [[], [S1, S1(drop)]]", "offset input 1 lists S1 twice"),
    # S1 cuts self's rows: Partial under it too was dropped without a word
    ("  partial: [[S1(sum)], []]", "partial input 0: S1 cuts that input too"),
    ("  offset: [[S1], []]", "offset input 0: S1 cuts that input too"),
    ("  offset: [[], [S1]]\n  partial: [[], [S1(sum)]]", "offset input 1: S1 makes that input Partial too"),
])
def test_one_label_twice_on_one_input_is_refused(table, line):
    """An input takes one placement per label: the table kept the first and dropped the other."""
    text = MM.replace("  combine: {S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}",
                      table + "\n  combine: {S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1), S4: reduce(sum)}")
    with pytest.raises(RegistryError, match=rf"^mm.yaml:9: {line}"):
        loads_record(text, "mm.yaml")


def test_verified_on_no_shard_count_is_refused():
    with pytest.raises(RegistryError, match=r"^mm.yaml:13: verified shard_counts must be a non-empty list"):
        loads_record(MM.replace("shard_counts: [2, 3]", "shard_counts: []"), "mm.yaml")


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_written_files_get_the_mode_of_a_plain_write(tmp_path, umask, mode):
    """Not mkstemp's 0600: sweeps wrote rule files and timings a group could not read."""
    old = os.umask(umask)
    try:
        path = write_record(tmp_path, loads_record(MM, "mm.yaml"))
        write_text_atomic(tmp_path / "t.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "t.json").stat().st_mode) == mode


def test_bad_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "aten.mm.default.yaml"
    path.write_bytes(MM.encode().replace(b"uneven: true", b"uneven: \xff\xfe"))
    with pytest.raises(RegistryError, match=rf"^{path}:13: not valid UTF-8 \(byte 0xff"):
        load_record(path)


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\ufffe"])
def test_a_character_yaml_refuses_is_named_at_its_line(char):
    """libyaml names it by a byte offset (reported as line 1, on two lines, before)."""
    text = "# écrit à la main\n" + MM.replace("uneven: true", f"uneven: tr{char}ue")  # bytes are not characters
    line = text[: text.index(char)].count("\n") + 1
    with pytest.raises(RegistryError, match=rf"^f\.yaml:{line}: not valid YAML: character U\+{ord(char):04X}: "
                                            r"control characters are not allowed$"):
        loads_record(text, "f.yaml")


# --------------------------------------------------------------------------- unreadable entries


def _registry_with(tmp_path, make):
    """A registry root whose torch/ holds aten.mm.default.yaml and, made by ``make``, one bad entry."""
    folder = tmp_path / "reg" / "torch"
    folder.mkdir(parents=True)
    (folder / "aten.mm.default.yaml").write_text(MM)
    bad = folder / "aten.zz.default.yaml"
    make(bad)
    return tmp_path / "reg", bad


@pytest.mark.parametrize("make,reason", [
    (lambda p: p.mkdir(), "Is a directory"),
    (lambda p: os.symlink(p.parent / "gone.yaml", p), "a symlink to .*gone.yaml, which does not exist"),
    (lambda p: os.truncate(p.write_bytes(b"") or p, MOST_FILE_BYTES + 1),  # sparse: no disk used
     r"16,777,217 bytes, more than a rule file holds \(at most 16,777,216\)"),
], ids=["folder", "dangling symlink", "too large"])
def test_an_unreadable_entry_is_a_registry_error_naming_it(tmp_path, capsys, make, reason):
    root, bad = _registry_with(tmp_path, make)
    for read in (lambda: load_record(bad), lambda: load_registry(root, "torch"),
                 lambda: rule_diff.load_side(str(root))):
        with pytest.raises(RegistryError, match=rf"^{bad}: cannot read: {reason}"):
            read()
    assert cli.codegen(["--registry", str(root), "--backend", "torch", "--out", str(tmp_path / "gen")]) == 2
    err = capsys.readouterr().err
    assert f"error: {bad}: cannot read" in err and "Traceback" not in err


def test_a_missing_file_stays_file_not_found(tmp_path):
    """The rule cache reads a FileNotFoundError as a miss, not as a broken entry."""
    with pytest.raises(FileNotFoundError):
        load_record(tmp_path / "aten.mm.default.yaml")


# --------------------------------------------------------------------------- signatures


@pytest.mark.parametrize("sig", [
    "self::[[f[*,*,*,*]", "self:f[*,*]]", "self:f[*,*", "self:f[*,x]", "self:g[*,*]", "self:f[*,*]  mat2:f[*,*]",
    "self:f[*,*] ", "self:f[*,*]mat2:f[*,*]", "self:3", "dim=f[*]", "dim=[1,2", "dim=1]", "dim=", "=1",
    "pad={a:[1}", "x='open", pytest.param("x:" + "[" * 3000 + "f[*]" + "]" * 3000, id="x:[[[...]]] 3000 deep"),
])
def test_a_malformed_signature_is_refused_at_its_line(sig):
    text = MM.replace("- signature: self:f[*,*] mat2:f[*,*]", f"- signature: {sig!r}")
    assert text != MM
    with pytest.raises(RegistryError, match=r"^mm.yaml:6: malformed signature"):
        loads_record(text, "mm.yaml")


@pytest.mark.parametrize("sig", [  # as signature.signature writes them (forms of the committed registries)
    "", "self:f[*,*] mat2:f[*,*]", "self:f[] other:f[1,*,3] alpha=-0.5 out=None keepdim=True dim=[-1]",
    "tensors:[f[*,*],i[*]] dim=0", "self:[f[*,*],f[*,*]] scalar=2", "t:[f[*],None]", "x=[[0,0],[0,0]] y=[]",
    "equation='ij,Ab->ijAb' tensors:[f[*,*],f[*,*]]", "operands:[c[*,*]] init_values:[c[]] jaxpr='{add}'",
    "dtype=torch.float32 device=cpu layout=torch.strided", "device=cuda:0", "x=(1+2j) y=1j z=-inf w=nan v=1e-05",
    "s='a b' t=\"it's\"", "p={a:1,b:[f[*]]}", "a",
])
def test_a_well_formed_signature_is_accepted(sig):
    assert signature_error(sig) is None


class _Color(enum.Enum):
    RED = 1


@pytest.mark.parametrize("args,kwargs", [
    ((), {}), ((X, X), {}), ((X,), {"dim": [-1, 0], "keepdim": True}), (([X, np.zeros(2, dtype=np.int64)], 0), {}),
    ((X,), {"s": "a 'b' c", "t": 'x"y', "n": None, "f": float("nan"), "i": float("-inf"), "c": 1 + 2j, "e": 1e-5}),
    ((X,), {"d": {"b": [1, 2], "a": X}}), ((X,), {"tup": (1, (2, (3, ())))}),
    ((X,), {"dtype": np.float32, "color": _Color.RED, "sl": slice(1, 2), "o": object(), "q": "O'Brien"}),
    (([X, np.float32, slice(1, 2), "it's"],), {}),
])
def test_every_signature_the_sweep_writes_is_read_back(args, kwargs):
    """The loader must take whatever ``signature`` writes, objects' ``str`` included: else a
    sweep would write files its own codegen refuses."""
    sig = signature(NumpyOps(), ("self", "other"), args, kwargs)
    assert signature_error(sig) is None, sig


# --------------------------------------------------------------------------- verified, backend


@pytest.mark.parametrize("old,new", [
    ("trials: 3", "trials: -4"), ("trials: 3", "trials: 2.5"), ("trials: 3", "trials: true"),
    ("trials: 3", "trials: '3'"), ("shard_counts: [2, 3]", "shard_counts: [2, -3]"),
    ("shard_counts: [2, 3]", "shard_counts: [2, 0]"), ("shard_counts: [2, 3]", "shard_counts: [2, x]"),
    ("shard_counts: [2, 3]", "shard_counts: 2"), ("uneven: true", "uneven: 1"),
])
def test_bad_verified_counts_are_refused_at_their_line(old, new):
    with pytest.raises(RegistryError, match=r"^mm.yaml:13: verified (trials|shard_counts|uneven) must be"):
        loads_record(MM.replace(old, new), "mm.yaml")


def test_a_rule_of_another_backend_is_refused_at_its_backend_line(tmp_path):
    assert loads_record(MM, "mm.yaml", "torch").backend == "torch"
    with pytest.raises(RegistryError, match=r"^jax/mm.yaml:3: file holds a 'torch' rule but lies in the jax/ folder"):
        loads_record(MM, "jax/mm.yaml", "jax")
    path = tmp_path / "aten.mm.default.yaml"
    path.write_text(MM)
    with pytest.raises(RegistryError, match=rf"^{path}:3: file holds a 'torch' rule"):
        load_record(path, "jax")


@pytest.mark.parametrize("sig,why", [
    ("self:f[*,*,*] mat2:f[*,*]", r"argument 'self' has rank 3 in the signature, 2 in the example"),
    ("self:f[7,*] mat2:f[*,*]", r"argument 'self' has dim 0 7 in the signature, 6 in the example"),
    ("a:f[*,*] b:f[*,*]", r"the signature names the arguments \['a', 'b'\], the example \['self', 'mat2'\]"),
    ("self:f[*,*]", r"the signature names the arguments \['self'\], the example \['self', 'mat2'\]"),
    ("self:b[*,*] mat2:f[*,*]", r"argument 'self' is of kind 'b' in the signature but float64 in the example"),
    ("self:c[*,*] mat2:f[*,*]", r"argument 'self' is of kind 'c' in the signature but float64 in the example"),
    ("self:i[*,*] mat2:f[*,*]", r"argument 'self' is of kind 'i' in the signature but float64 in the example"),
    ("self:[f[*,*],f[*]] mat2:f[*,*]", r"argument 'self' holds 2 tensors in the signature, 1 in the example"),
])
def test_a_signature_that_disagrees_with_its_example_is_refused_at_its_line(sig, why):
    """Codegen put such a file's rules into the table under a key of calls they were never
    verified on (a rank-3 key for rank-2 shard rows)."""
    with pytest.raises(RegistryError, match=rf"^mm.yaml:6: signature .* disagrees with the example: {why}"):
        loads_record(MM.replace("- signature: self:f[*,*] mat2:f[*,*]", f"- signature: {sig!r}"), "mm.yaml")


def test_a_string_argument_holding_a_space_is_one_argument():
    """split_signature split at every space: s='a b' read as two arguments."""
    assert split_signature("self:f[*,1] s='a b' t=\"it's\" flag") == [
        ("self", ":", "f[*,1]"), ("s", "=", "'a b'"), ("t", "=", "\"it's\""), ("flag", "=", "")]
    text = MM.replace("- signature: self:f[*,*] mat2:f[*,*]", "- signature: \"self:f[*,*] mat2:f[*,*] s='a b'\"")
    text = text.replace("    mat2: {shape: [4, 5], dtype: float64}\n", "    mat2: {shape: [4, 5], dtype: float64}\n"
                        "    s: a b\n")
    assert loads_record(text, "mm.yaml").entries[0].example.args[2] == ("s", "a b")


def test_an_int_too_long_to_read_is_refused_at_its_line():
    """An int past Python's 4,300 digits was a traceback in codegen, coverage and crosscheck."""
    with pytest.raises(RegistryError, match=r"^mm.yaml:1: cannot read the value 1{40}\.\.\. \(5000 characters\): "
                                            r"Exceeds the limit"):
        loads_record(MM.replace("schema: 1", "schema: " + "1" * 5000), "mm.yaml")


@pytest.mark.parametrize("text", ["0", "7", "42", "017", "0x1f", "0o17", "1_000", "-5", "+5", "00", "1.5", "true",
                                  "null", "abc", "'017'", "!!int 12", "!!str 12", "٣"])
def test_scalars_read_as_the_safe_loader_reads_them(text):
    """The reader takes text and plain decimal integers itself (most scalars), the rest
    through PyYAML's constructors: each value, and its type, as yaml.safe_load gives it."""
    from metaspmd.registry_io import _construct

    node = yaml.compose(f"v: {text}", Loader=yaml.SafeLoader).value[0][1]
    value, expected = _construct(node), yaml.safe_load(f"v: {text}")["v"]
    assert (value, type(value)) == (expected, type(expected))
