"""What the registry loader refused nowhere, or somewhere only: tags on collections, an `ok`
entry with no strategy, alternatives and strategies in orders the writer never writes,
control characters, text the writer could not read back, line numbers past a Unicode line
break, misnamed files beside the backend folders, unknown dtypes and Partial kinds."""

import dataclasses
import sys
from pathlib import Path

import pytest

from metaspmd import cli, rule_diff
from metaspmd.registry_io import RegistryError, dump_record, load_registry, loads_record
from metaspmd.rules import Example
from metaspmd.spec import PartialIn, SpecError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry_samples import MM  # noqa: E402


def refused(text: str, line: int, message: str) -> None:
    with pytest.raises(RegistryError) as err:
        loads_record(text, "mm.yaml")
    assert str(err.value).startswith(f"mm.yaml:{line}: "), str(err.value)
    assert message in str(err.value), str(err.value)


# --------------------------------------------------------------------------- tags


@pytest.mark.parametrize("old,new,line", [
    ("  example:\n", "  example: !foo\n", 10),
    ("  example:\n", "  example: !!python/object:os.system\n", 10),
    ("  combine: {", "  combine: !!set {", 9),
    ("S1: gather(dim=0)", "S1: !foo [gather(dim=0)]", 9),
    ("    mat2: {shape: [4, 5], dtype: float64}\n",
     "    mat2: {shape: [4, 5], dtype: float64}\n    dims: !!python/tuple [1, 2]\n", 13),
    ("  verified: {", "  verified: !!omap {", 13),
    ("    self: {shape", "    !foo self: {shape", 11),
], ids=["example", "example python/object", "combine set", "combine of S1", "example tuple", "verified omap", "key"])
def test_a_tag_on_a_mapping_or_list_is_refused_at_its_line(old, new, line):
    """Tags on scalars were refused; on a mapping or a list the reader read the value it tags."""
    assert old in MM
    refused(MM.replace(old, new, 1), line, "is not allowed in a registry file")



def test_plain_text_that_looks_like_a_timestamp_or_a_merge_key_is_text():
    """YAML 1.1 reads ``2001-12-14`` as a date and ``<<`` as a merge: no registry field is
    either, so they are the text they look like (a reason keeps its date; a merge key is an
    unknown key), and a tag not spelt with '!' cannot reach the reader."""
    dated = MM.replace("status: ok\nentries:", "status: ok\nreason: 2001-12-14\nentries:", 1)
    assert "reason: 2001-12-14" in dated
    assert loads_record(dated.replace("status: ok\nreason", "status: failed\nreason", 1).split("entries:")[0]
                        + "entries: []\n", "mm.yaml").reason == "2001-12-14"
    merged = MM.replace("  verified: {", "  <<: {note: x}\n  verified: {", 1)
    refused(merged, 13, "<<")

def test_standard_tags_stay_allowed():
    text = MM.replace("trials: 3", "trials: !!int 3").replace("  results:", "  results: !!seq")
    assert loads_record(text, "mm.yaml").entries[0].verified.trials == 3


# --------------------------------------------------------------------------- statuses and strategies

NO_STRATEGY = MM.replace("[[S1, S2], [S2, S3]]", "[[N, N], [N, N]]").replace(
    "{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}", "{}")


def test_an_ok_entry_with_no_strategy_is_refused_at_its_status_line():
    """It was emitted by codegen as a rule and counted as covered."""
    refused(NO_STRATEGY, 7, "entry status 'ok' with no strategy")


@pytest.mark.parametrize("status", ["derived", "replicate-only"])
def test_other_entries_with_no_strategy_still_load(status):
    """The committed registry holds both: a derived factory, an op no strategy holds for."""
    entry = loads_record(NO_STRATEGY.replace("status: ok", f"status: {status}"), "mm.yaml").entries[0]
    assert entry.status == status and not list(entry.strategies())


HALOS = "'gather(dim=0, halo=(0, 1)) | gather(dim=0, halo=(1, 0))'"


def test_alternatives_in_the_writers_order_load():
    combine = loads_record(MM.replace("S1: gather(dim=0)", f"S1: {HALOS}"), "mm.yaml").entries[0].combine
    assert str(combine.as_dict()["S1"][0]) == HALOS.strip("'")


@pytest.mark.parametrize("alternatives,message", [
    ("'gather(dim=0, halo=(1, 0)) | gather(dim=0, halo=(0, 1))'",
     "combine of S1: alternatives must be sorted: 'gather(dim=0, halo=(0, 1))' comes after "
     f"'gather(dim=0, halo=(1, 0))' (write {HALOS})"),
    ("'identity | gather(dim=0)'",
     "combine of S1: alternatives must be sorted: 'gather(dim=0)' comes after 'identity' "
     "(write 'gather(dim=0) | identity')"),
])
def test_alternatives_out_of_the_writers_order_are_refused_at_their_line(alternatives, message):
    """They were kept in the file's order, and a rule diff reported the rule lost and gained."""
    refused(MM.replace("S1: gather(dim=0)", f"S1: {alternatives}"), 9, message)


def _more(layer: str) -> str:
    return MM.replace("  example:", "  more:\n" + layer + "  example:")


def test_a_layer_of_more_placing_the_inputs_as_an_earlier_label_is_refused_at_its_shard_line():
    """A rule diff keys strategies by their inputs: S4 read as S1 with another combine."""
    refused(_more("  - shard: [[S4, N], [N, N]]\n    combine: {S4: reduce(sum)}\n"), 11,
            "S4 places the inputs as S1 does")


def test_two_labels_of_one_layer_placing_the_inputs_alike_are_refused():
    text = MM.replace("  combine: {S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}",
                      "  partial: [[S4(sum), S5(sum)], []]\n"
                      "  combine: {S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1), S4: reduce(sum), "
                      "S5: reduce(sum)}")
    refused(text, 8, "S5 places the inputs as S4 does")


def test_a_layer_of_more_placing_the_inputs_anew_loads():
    text = _more("  - shard: [[N, N], [N, N]]\n    partial: [[S4(sum)], []]\n    combine: {S4: reduce(sum)}\n")
    assert [s.label for s in loads_record(text, "mm.yaml").entries[0].strategies()] == ["S1", "S2", "S3", "S4"]


# --------------------------------------------------------------------------- characters


@pytest.mark.parametrize("escape,code", [
    ("\\e[2J", "001B"), ("\\a", "0007"), ("\\0", "0000"), ("\\r", "000D"), ("\\x7f", "007F"), ("\\x9b", "009B"),
    ("\\N", "0085"),
])
@pytest.mark.parametrize("old,new", [
    ("  verified:", '  reason: "boom{}tail"\n  verified:'),
    ("  verified:", '  notes: ["a{}b"]\n  verified:'),
    ("    mat2: {shape: [4, 5], dtype: float64}\n", '    mat2: {{shape: [4, 5], dtype: float64}}\n    "s{}": x\n'),
], ids=["reason", "note", "example key"])
def test_a_control_character_written_as_an_escape_is_refused_at_its_line(escape, code, old, new):
    """The reader refused raw control characters only: an escape reached the terminal from a
    reason in a diff or a coverage report (a screen cleared, a title set)."""
    assert old in MM
    refused(MM.replace(old, new.format(escape), 1), 13, f"control character U+{code} in ")


def test_tabs_and_newlines_stay_allowed():
    """The committed registry holds newlines in example strings (a storage's text)."""
    text = MM.replace("  verified:", "  notes: [\"a\\tb\", \"c\\nd\"]\n  verified:")
    assert loads_record(text, "mm.yaml").entries[0].notes == ("a\tb", "c\nd")


@pytest.mark.parametrize("text", ["a\x85b", "a\ud800b", "a\x1bb"], ids=["NEL", "lone surrogate", "ESC"])
@pytest.mark.parametrize("field", ["op reason", "entry reason", "note", "example"])
def test_the_writer_refuses_text_its_reader_refuses_or_changes(text, field):
    """NEL was written raw and read back as a space; a lone surrogate was written as an
    escape the reader refused: the sweep wrote files its own codegen refused or changed."""
    record = loads_record(MM, "mm.yaml")
    e = record.entries[0]
    if field == "op reason":
        record = dataclasses.replace(record, reason=text)
    else:
        e = {"entry reason": dataclasses.replace(e, reason=text), "note": dataclasses.replace(e, notes=(text,)),
             "example": dataclasses.replace(e, signature=e.signature + f" s={text!r}",
                                            example=Example(e.example.args + (("s", text),)))}[field]
        record = dataclasses.replace(record, entries=(e,))
    with pytest.raises(ValueError, match=r"^torch/aten\.mm\.default: cannot write the .*(reason|note|example argument "
                                         r"'s'): (control character|lone surrogate) U\+"):
        dump_record(record)


@pytest.mark.parametrize("text", ["a\tb", "a\nb", "a\n\nb", "a\u2028b", "a\u2029b", "a\ufeffb", "écrit ✓ 😀"])
def test_what_the_writer_writes_reads_back_unchanged(text):
    record = loads_record(MM, "mm.yaml")
    e = dataclasses.replace(record.entries[0], notes=(text,), reason=text)
    record = dataclasses.replace(record, entries=(e,), reason=text)
    written = dump_record(record)
    assert loads_record(written, "mm.yaml") == record
    assert dump_record(loads_record(written, "mm.yaml")) == written


# --------------------------------------------------------------------------- line numbers


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"])
def test_a_unicode_line_break_in_a_string_does_not_shift_later_lines(char):
    """libyaml counts NEL, U+2028 and U+2029 as line breaks; an editor and grep -n do not."""
    text = MM.replace("status: ok\nentries", f"status: ok\nreason: 'a{char}b'\nentries").replace("uneven: true", "uneven: 1")
    assert text.count("\n", 0, text.index("uneven")) + 1 == 14
    refused(text, 14, "verified uneven must be true or false")


def test_a_character_yaml_refuses_is_named_at_its_line_in_an_old_mac_file():
    """Line ends of \\r alone, as libyaml reads them: the offset of a refused character was
    counted in \\n only, line 1 for every line."""
    text = MM.replace("status: ok\nentries", "status: ok\0\nentries").replace("\n", "\r")
    refused(text, 4, "not valid YAML: character U+0000")
    refused(MM.replace("status: ok\nentries", "status: ok\0\nentries").replace("\n", "\r\n"), 4,
            "not valid YAML: character U+0000")


# --------------------------------------------------------------------------- files beside the backend folders


def _root(tmp_path):
    root = tmp_path / "reg"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "aten.mm.default.yaml").write_text(MM)
    return root


@pytest.mark.parametrize("name,message", [
    ("aten.mm.default.yml", "a rule file's name ends .yaml"),
    ("aten.mm.default.YAML", "a rule file's name ends .yaml"),
    (".yamllint.yaml", r"a rule file outside a backend folder \(<backend>/<op>.yaml\)"),
    ("aten.mm.default.yaml", r"a rule file outside a backend folder \(<backend>/<op>.yaml\)"),
])
def test_a_yaml_file_beside_the_backend_folders_is_refused_as_in_a_revision(tmp_path, capsys, name, message):
    """Folder commands passed over a misnamed rule file at the root (a revision's tree was
    refused for it), and told of a .yamllint.yaml that the root was a backend folder."""
    root = _root(tmp_path)
    (root / name).write_text(MM)
    expected = rf"^{root / name}: {message}"
    for read in (lambda: load_registry(root, "torch"), lambda: rule_diff.load_side(str(root))):
        with pytest.raises(RegistryError, match=expected):
            read()
    assert cli.codegen(["--registry", str(root), "--backend", "torch", "--out", str(tmp_path / "gen")]) == 2
    assert f"error: {root / name}: " in capsys.readouterr().err


def test_a_backend_folder_passed_as_the_root_is_still_named_so(tmp_path):
    root = _root(tmp_path)
    with pytest.raises(RegistryError, match=rf"^{root / 'torch'}: holds rule files itself, so it is a backend folder"):
        load_registry(root / "torch", "torch")
    (root / "README.md").write_text("not yaml")  # other files beside the backend folders are no rule files
    assert list(load_registry(root, "torch")) == ["aten.mm.default"]
    (tmp_path / "linked").symlink_to(root / "torch")  # the root to pass is the one the link leads into
    with pytest.raises(RegistryError, match=rf"^{tmp_path / 'linked'}: holds rule files .*\(pass {root} instead\)"):
        load_registry(tmp_path / "linked", "torch")


# --------------------------------------------------------------------------- dtypes, Partial kinds


@pytest.mark.parametrize("dtype", ["float32_typo", "float8_zzz", "float8", "float99", "complex512"])
def test_an_unknown_dtype_is_refused(dtype):
    refused(MM.replace("dtype: float64}\n    mat2", f"dtype: {dtype}}}\n    mat2"), 11, f"unknown tensor dtype {dtype!r}")


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
                                   "float6_e3m2fn", "bfloat16", "float16", "uint4", "int2"])
def test_dtypes_torch_or_ml_dtypes_name_load(dtype):
    text = MM.replace("dtype: float64}\n    mat2", f"dtype: {dtype}}}\n    mat2")
    assert loads_record(text, "mm.yaml").entries[0].example.args[0][1].dtype == dtype


def test_a_partial_input_of_a_kind_the_explorer_never_writes_is_refused():
    text = MM.replace("  combine: {S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}",
                      "  partial: [[S4(avg)], []]\n"
                      "  combine: {S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1), S4: reduce(avg)}")
    refused(text, 9, "bad partial input 'S4(avg)'")
    assert loads_record(text.replace("(avg)", "(prod)"), "mm.yaml").entries[0].partial.inputs[0][0].op == "prod"
    with pytest.raises(SpecError, match="op one of sum, prod"):
        PartialIn.parse("S1(max)")
