"""Registry files: one YAML file per op, deterministic to write, strict to read.

Writing is deterministic (fixed key order, entries sorted by signature, no timestamps or
paths) and atomic (temp file + rename). Reading composes the YAML with a safe loader
(libyaml's when available), refuses any non-standard tag (``!!python/object`` and
friends) and any anchor or alias, validates every field against the rule model, and
reports ``file:line``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pkgutil
import re
import reprlib
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from .rules import (
    ENTRY_STATUSES, OP_STATUSES, SCHEMA_VERSION, VERIFIED, Example, OpRecord, RuleEntry, TensorArg, Verification,
    summarize_status,
)
from .signature import example_disagreement, signature_error
from .spec import (
    ArgReduce, CombineSpec, DimLabel, Gather, GatherPositions, IndependentSpec, Layer, OffsetIn, OffsetSpec,
    OutputCombine, PartialIn, PartialSpec, Scan, ShardSpec, SpecError, check_label, combine_order, label_number,
    layer_problem,
)

_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OP_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z")  # \Z: "$" lets a final newline through
_STANDARD_TAGS = {
    "tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "seq", "map")
}


class _Loader(_SafeLoader):
    """The safe loader, reading a plain scalar as one of the standard types only: one that
    looks like a timestamp, a merge key (``<<``) or a value key (``=``) is that text, so a
    tag that is not standard is one the file spells out, with ``!`` (``_MAY_HIDE``)."""

    yaml_implicit_resolvers = {first: [(tag, regexp) for tag, regexp in resolvers if tag in _STANDARD_TAGS]
                               for first, resolvers in _SafeLoader.yaml_implicit_resolvers.items()}


# What only ``_Reader.checked``'s walk of the nodes finds: a tag (spelt with '!') and a
# control character a double-quoted escape makes ('\\'); YAML refuses raw control
# characters itself, but CR and NEL, which it reads as line breaks. A file with none of
# these (nearly every file) skips the walk: a tenth of the load.
_MAY_HIDE = re.compile("[!\\\\\r\x85]")
_NESTING = "values nest too deeply for a registry file"
# The dtype names torch, numpy and ml_dtypes (JAX's) give (float32, uint4, float8_e4m3fn,
# float4_e2m1fn_x2, complex32, quint4x2, bits16, jax's key<fry>): the core imports none of
# them to ask. float99 and float32_typo are typos; the small floats are named one by one.
_SMALL_FLOATS = ("float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                 "float8_e5m2fnuz", "float8_e5m3fnu", "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
                 "float4_e2m1fn_x2")
_DTYPE_RE = re.compile(r"(bool|bfloat16|bcomplex32|u?int([1-8]|16|32|64)|float(16|32|64|128)|complex(32|64|128|256)"
                       r"|q(u)?int(8|32|4x2|2x4)|bits(8|16|1x8|2x4|4x2)|key<[a-z0-9_]+>|"
                       + "|".join(_SMALL_FLOATS) + r")\Z")
# What a registry string may not hold: C0 controls but tab and newline, DEL, C1 (NEL among
# them), which would reach a terminal from a reason or a note (an escape sequence, a bell),
# and lone surrogates, which no UTF-8 file holds. The writer refuses them too (dump_record).
_BAD_CHARACTER = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _bad_character(c: str) -> str:
    return f"{'lone surrogate' if 0xD800 <= ord(c) <= 0xDFFF else 'control character'} U+{ord(c):04X}"


def escape_unwritable(text: str) -> str:
    """``text`` with each character a registry file may not hold written as Python escapes
    it (``\\x1b``): for text from elsewhere (an op's error message) that a record keeps."""
    return _BAD_CHARACTER.sub(lambda m: m[0].encode("unicode_escape", "backslashreplace").decode("ascii"), text)


# Collections nested deeper than this are refused before composing: libyaml's composer
# recurses in C, so a file nested some 30,000 deep overflows the C stack (a segfault, not
# an error). The reader's own recursion stops values about 500 deep already.
MAX_NESTING = 1000


class RegistryError(ValueError):
    """A registry file that does not hold a valid record; the message starts with file:line."""


# --------------------------------------------------------------------------- writing


class _Flow(list):
    pass


class _FlowMap(dict):
    pass


class _Dumper(yaml.SafeDumper):
    """Pure-Python dumper: byte-identical output whether or not libyaml is installed."""


_Dumper.add_representer(_Flow, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
_Dumper.add_representer(_FlowMap, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v.items(), flow_style=True))


def _flow_nested(rows) -> _Flow:
    return _Flow(_Flow(str(x) for x in row) for row in rows)


def _example_value(v: Any) -> Any:
    if isinstance(v, TensorArg):
        return _FlowMap(shape=_Flow(v.shape), dtype=v.dtype)
    if isinstance(v, tuple):
        items = [_example_value(x) for x in v]
        return _Flow(items) if all(not isinstance(x, dict) for x in items) else items
    return v


def _layer_data(layer: Layer) -> dict:
    data: dict[str, Any] = {"shard": _flow_nested(layer.shard.inputs)}
    if not layer.partial.is_empty():
        data["partial"] = _flow_nested(layer.partial.inputs)
    if layer.offset is not None:
        data["offset"] = _flow_nested(layer.offset.inputs)
    combine = _FlowMap()
    for label, outs in layer.combine.by_label:
        combine[label] = str(outs[0]) if len(outs) == 1 else _Flow(str(o) for o in outs)
    data["combine"] = combine
    return data


def _entry_data(e: RuleEntry) -> dict:
    data: dict[str, Any] = {"signature": e.signature, "status": e.status}
    if e.reason:
        data["reason"] = e.reason
    data.update(_layer_data(e.layers()[0]))
    if e.more:
        data["more"] = [_layer_data(layer) for layer in e.more]
    if e.independent is not None:
        data["independent"] = _flow_nested(e.independent.parts)
    data["example"] = {name: _example_value(v) for name, v in e.example.args}
    if e.results:
        data["results"] = [_example_value(r) for r in e.results]
    if e.verified is not None:
        data["verified"] = _FlowMap(
            trials=e.verified.trials, shard_counts=_Flow(e.verified.shard_counts), uneven=e.verified.uneven
        )
    if e.notes:
        data["notes"] = list(e.notes)
    return data


def _texts(v: Any) -> Iterable[str]:
    """The strings of an example value."""
    if isinstance(v, str):
        yield v
    elif isinstance(v, tuple):
        for x in v:
            yield from _texts(x)


def refuse_unwritable(record: OpRecord) -> None:
    """ValueError naming the op and the field of text its reader would refuse or change:
    a control character (YAML writes NEL raw, to be read back as a space) or a lone
    surrogate (written as an escape no reader decodes)."""
    fields = [("reason", record.reason)]
    for e in record.entries:
        at = f"entry {e.signature!r},"
        fields += [(f"{at} signature", e.signature), (f"{at} reason", e.reason)]
        fields += [(f"{at} note", n) for n in e.notes]
        fields += [(f"{at} example argument {name!r}", t) for name, v in e.example.args for t in (name, *_texts(v))]
    for field, text in fields:
        bad = _BAD_CHARACTER.search(text)
        if bad:
            raise ValueError(f"{record.backend}/{record.op}: cannot write the {field}: {_bad_character(bad[0])} in "
                             f"{reprlib.repr(text)}, which a registry file may not hold (its reader refuses it)")


def dump_record(record: OpRecord) -> str:
    """The text of ``record``'s file; ValueError for text a registry file may not hold."""
    refuse_unwritable(record)
    data: dict[str, Any] = {"schema": SCHEMA_VERSION, "op": record.op, "backend": record.backend, "status": record.status}
    if record.reason:
        data["reason"] = record.reason
    data["entries"] = [_entry_data(e) for e in sorted(record.entries, key=lambda e: e.signature)]
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)
    return f"# metaspmd rules for {record.op} ({record.backend}); regenerate with tools/sweep.py\n" + body


# A file name holds 255 bytes, and a rule file is written through ".<name>.yaml.<8>.tmp"
MOST_NAME_CHARS = 200


def usable_name(name: str) -> bool:
    """Whether ``name`` may name an op or a backend in a rule file (and its file's name)."""
    return len(name) <= MOST_NAME_CHARS and bool(_OP_NAME_RE.match(name))


def record_path(root: str | os.PathLike, backend: str, op: str) -> Path:
    if not usable_name(op) or not usable_name(backend):
        raise RegistryError(f"op name {op!r} / backend {backend!r} is not usable as a file name")
    return Path(root) / backend / f"{op}.yaml"


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same folder and rename: readers never see half a file.
    The file gets the mode a plain ``open(path, "w")`` would give it (an existing file's
    own; else 0666 less the umask), not mkstemp's 0600, which would hide it from a group or
    a CI user reading the checkout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:  # nothing there yet (or a link to nothing, which the rename replaces)
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def same_text(path: Path, text: str) -> bool:
    """Does the file at ``path`` hold ``text``, line ends aside (a checkout may turn \\n into
    \\r\\n)? No when nothing is there, and no when its bytes are not UTF-8: such a file is
    stale, to be rewritten, not an error."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False
    return data.replace(b"\r\n", b"\n") == text.encode("utf-8")


def path_problem(path: str | os.PathLike, folder: bool) -> str:
    """Why ``path`` cannot be used as a folder (``folder``) or as a regular file to read and
    replace, or '' when it is one or nothing is there (it would be created). Names what a
    later open or mkdir would fail on only after the work: a symlink loop, a symlink to
    nothing, a file on the way, a folder where a file belongs and the reverse."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # to be created, unless the way to it ends at a symlink to nothing
        link = next((p for p in (path, *path.parents) if os.path.islink(p) and not os.path.exists(p)), None)
        return f"{link} is a symlink to {os.readlink(link)}, which does not exist" if link else ""
    except NotADirectoryError:
        return f"{path}: {next(p for p in path.parents if p.exists())} is not a folder"
    except OSError as e:  # a symlink loop, no permission
        return f"{path}: {e.strerror or e}"
    if folder and not stat.S_ISDIR(mode):
        return f"{path} is not a folder"
    if not folder and stat.S_ISDIR(mode):
        return f"{path} is a folder"
    if not folder and not stat.S_ISREG(mode):
        return f"{path} is not a regular file"
    if not folder and not os.access(path, os.R_OK):  # it is compared before it is replaced
        return f"{path} is not readable"
    return ""


def write_record(root: str | os.PathLike, record: OpRecord) -> Path:
    """Write ``record``'s file, unless it holds those bytes already: a sweep that changes
    nothing leaves every file as it was, its time stamp too."""
    path = record_path(root, record.backend, record.op)
    text = dump_record(record)
    try:
        if path.read_bytes() == text.encode("utf-8"):
            return path
    except OSError:  # nothing there yet; anything else, the write below names
        pass
    try:
        write_text_atomic(path, text)
    except OSError as e:  # a full disk names no file: say which one was being written
        if e.filename is None:
            e.filename = str(path)
        raise
    return path


# --------------------------------------------------------------------------- reading


class _Reader:
    """Turns composed YAML nodes into model objects, failing with file:line."""

    def __init__(self, filename: str, folder: str | None = None, text: str = ""):
        self.filename = filename
        self.folder = folder  # the backend folder the file lies in, when known
        self.text = text  # for line numbers (see line_at)

    def fail(self, node: yaml.Node | None, message: str):
        line = line_at(self.text, node.start_mark.index) if node is not None else 1
        raise RegistryError(f"{self.filename}:{line}: {message}")

    def checked(self, root: yaml.Node) -> yaml.Node:
        """``root``, every node of which has a standard tag and every scalar text without
        control characters: one walk, so that no field's reader can forget either (a tag on
        an example or a combine was read as the plain value it tags). Iterative: a document
        nests up to MAX_NESTING deep."""
        stack = [root]
        while stack:
            node = stack.pop()
            if node.tag not in _STANDARD_TAGS:
                self.fail(node, f"tag {node.tag!r} is not allowed in a registry file")
            if isinstance(node, yaml.ScalarNode):
                bad = _BAD_CHARACTER.search(node.value)
                if bad:
                    self.fail(node, f"{_bad_character(bad[0])} in {reprlib.repr(node.value)}: not allowed in a "
                                    "registry file")
            elif isinstance(node, yaml.SequenceNode):
                stack.extend(reversed(node.value))
            else:
                stack.extend(n for pair in reversed(node.value) for n in reversed(pair))
        return root

    def value(self, node: yaml.Node) -> Any:
        """Plain Python value of a node (its tag checked already)."""
        if isinstance(node, yaml.ScalarNode):
            try:
                return _construct(node)
            except ValueError as e:  # an int past the 4,300 digits Python converts
                shown = node.value if len(node.value) <= 40 else f"{node.value[:40]}... ({len(node.value)} characters)"
                self.fail(node, f"cannot read the value {shown}: {e}")
        try:  # the reader recurses once per level: a too-deep value fails at its own line
            if isinstance(node, yaml.SequenceNode):
                return [self.value(n) for n in node.value]
            out: dict[str, Any] = {}
            for k, v in node.value:
                key = self.unique_key(k, out, "mapping")
                out[key] = self.value(v)
            return out
        except RecursionError:
            self.fail(node, _NESTING)

    def unique_key(self, node: yaml.Node, seen, what: str) -> str:
        """A mapping key not yet in ``seen``: YAML keeps the last of two equal keys, which
        would silently drop the first value."""
        key = self.scalar_key(node)
        if key in seen:
            self.fail(node, f"duplicate key {key!r} in {what}")
        return key

    def scalar_key(self, node: yaml.Node) -> str:
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, "mapping keys must be plain strings")
        return str(node.value)

    def mapping(self, node: yaml.Node, required: tuple[str, ...], optional: tuple[str, ...], what: str) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping")
        fields: dict[str, yaml.Node] = {}
        for k, v in node.value:
            key = self.unique_key(k, fields, what)
            if key not in required and key not in optional:
                self.fail(k, f"unknown key {key!r} in {what} (expected {', '.join(required + optional)})")
            fields[key] = v
        for key in required:
            if key not in fields:
                self.fail(node, f"{what} lacks {key!r}")
        return fields

    def string(self, node: yaml.Node, what: str) -> str:
        v = self.value(node)
        if not isinstance(v, str):
            self.fail(node, f"{what} must be a string, got {v!r}")
        return v

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, f"{what} must be a list")
        return node.value

    def built(self, node: yaml.Node, what: str, make, *args):
        """``make(*args)``, a spec the model validates as a whole (a label on two dims of one
        input), failing at ``node``'s line."""
        try:
            return make(*args)
        except SpecError as e:
            self.fail(node, f"{what}: {e}")

    def parsed(self, node: yaml.Node, parse, what: str):
        try:
            return parse(self.string(node, what))
        except SpecError as e:
            self.fail(node, f"{what}: {e}")

    # ---------------------------------------------------------------- model

    def record(self, root: yaml.Node) -> OpRecord:
        f = self.mapping(root, ("schema", "op", "backend", "status", "entries"), ("reason",), "rule file")
        schema = self.value(f["schema"])
        if not _is_count(schema, 0) or schema != SCHEMA_VERSION:  # true and 1.0 equal 1 too
            self.fail(f["schema"], f"schema {schema!r} is not supported (expected {SCHEMA_VERSION})")
        op = self.string(f["op"], "op")
        backend = self.string(f["backend"], "backend")
        for key, name in (("op", op), ("backend", backend)):
            if not usable_name(name):
                self.fail(f[key], f"{key} {name!r} has characters a rule file may not use")
        if self.folder is not None and backend != self.folder:  # it would go into the wrong backend's table
            self.fail(f["backend"], f"file holds a {backend!r} rule but lies in the {self.folder}/ folder")
        status = self.string(f["status"], "status")
        if status not in OP_STATUSES:
            self.fail(f["status"], f"unknown status {status!r} (expected one of {', '.join(OP_STATUSES)})")
        reason = self.string(f["reason"], "reason") if "reason" in f else ""
        nodes = self.sequence(f["entries"], "entries")
        entries = tuple(self.entry(n) for n in nodes)
        # the op's status is its entries' best (what coverage counts), and verified rules need entries
        if entries and status != summarize_status(entries)[0]:
            self.fail(f["status"], f"status {status!r} disagrees with the entries, whose best is "
                                   f"{summarize_status(entries)[0]!r}")
        if not entries and status in VERIFIED:
            self.fail(f["status"], f"status {status!r} with no entries: a verified rule is an entry")
        # at the entry at fault, naming the signatures (a file holds dozens of entries)
        first: dict[str, yaml.Node] = {}
        for node, e in zip(nodes, entries):
            if e.signature in first:  # (its line counted here only: a count per entry costs a scan of the text)
                self.fail(node, f"entry {e.signature!r} repeats the signature of the entry at line "
                                f"{line_at(self.text, first[e.signature].start_mark.index)}")
            first[e.signature] = node
        for k in range(1, len(entries)):
            if entries[k].signature < entries[k - 1].signature:
                self.fail(nodes[k], f"entries must be sorted by signature: {entries[k].signature!r} comes after "
                                    f"{entries[k - 1].signature!r}")
        return OpRecord(op, backend, status, entries, reason)

    def entry(self, node: yaml.Node) -> RuleEntry:
        f = self.mapping(
            node, ("signature", "status", "shard", "combine", "example"),
            ("reason", "partial", "offset", "more", "independent", "results", "verified", "notes"), "entry",
        )
        signature = self.string(f["signature"], "signature")
        why = signature_error(signature)
        if why is not None:  # codegen would emit it into the table as a key no call ever has
            self.fail(f["signature"], f"malformed signature {signature!r}: {why}")
        status = self.string(f["status"], "entry status")
        if status not in ENTRY_STATUSES:
            self.fail(f["status"], f"unknown entry status {status!r} (expected one of {', '.join(ENTRY_STATUSES)})")
        tables = [f]  # each layer's fields, for the line of its combine
        layers = [self.layer(f)]
        if "more" in f and not self.sequence(f["more"], "more"):
            self.fail(f["more"], "more lists no layer: leave it out")
        for n in self.sequence(f["more"], "more") if "more" in f else ():
            tables.append(self.mapping(n, ("shard", "combine"), ("partial", "offset"), "layer of more"))
            layers.append(self.layer(tables[-1], layers))
        first, more = layers[0], tuple(layers[1:])
        shard, combine = first.shard, first.combine
        used = set().union(*(layer.labels() for layer in layers))
        independent = self.independent(f["independent"], used) if "independent" in f else None
        example = self.example(f["example"])
        why = example_disagreement(signature, example.args)
        if why is not None:  # codegen would key the example's rules by a call they were not verified on
            self.fail(f["signature"], f"signature {signature!r} disagrees with the example: {why}")
        n_tensors = sum(_count_tensors(v) for _, v in example.args)
        if n_tensors != len(shard.inputs):
            self.fail(f["shard"], f"shard lists {len(shard.inputs)} inputs but the example has {n_tensors} tensor inputs")
        tensors = [t for _, v in example.args for t in _tensors(v)]
        ranks = [len(t.shape) for t in tensors]
        for fields, layer in zip(tables, layers):
            if layer.offset is not None:
                self.offsets(fields["offset"], layer.offset, tensors)
        for i, (row, rank) in enumerate(zip(shard.inputs, ranks)):
            if len(row) != rank:
                self.fail(f["shard"], f"input {i} has rank {rank} in the example but {len(row)} shard labels")
        for fields, layer in zip(tables, layers):
            self.cut_lengths(fields["shard"], layer.shard, tensors)
        verified = self.verified(f["verified"]) if "verified" in f else None
        notes = tuple(self.string(n, "note") for n in self.sequence(f["notes"], "notes")) if "notes" in f else ()
        reason = self.string(f["reason"], "reason") if "reason" in f else ""
        results = ()
        if "results" in f:
            results = tuple(self.example_value(n) for n in self.sequence(f["results"], "results"))
            if not all(isinstance(r, TensorArg) for r in results):
                self.fail(f["results"], "results must be tensors ({shape, dtype})")
        n_out = {len(outs) for _, outs in combine.by_label}
        if results and n_out and n_out != {len(results)}:
            self.fail(f["combine"], f"combine has {n_out.pop()} outputs but results lists {len(results)}")
        for fields, layer in zip(tables, layers):
            self.output_dims(fields["combine"], layer.combine, results)
        self.strategies_of(f["status"], status, tables, layers)
        return RuleEntry(signature, status, shard, first.partial, combine, example, verified, reason, notes, results,
                         independent, first.offset, more)

    def strategies_of(self, node: yaml.Node, status: str, tables: list[dict[str, yaml.Node]],
                      layers: Sequence[Layer]) -> None:
        """Strategies as the explorer writes them: some under ``ok`` (where none holds, the
        entry is ``replicate-only``; ``derived`` may have none, a factory replicated by rule),
        and no two placing the inputs alike (a rule diff keys strategies by their inputs:
        the second would read as the first changed)."""
        if status == "ok" and not any(layer.labels() for layer in layers):
            self.fail(node, "entry status 'ok' with no strategy: an entry no strategy holds for is 'replicate-only'")
        if len(layers) == 1:  # a dim holds one label: only labels that cut no dim (Partial ones) may place alike
            layer = layers[0]
            cutting = {d.label for dims in layer.shard.inputs for d in dims}
            uncut = tuple(kv for kv in layer.combine.by_label if kv[0] not in cutting)
            if len(uncut) < 2:
                return
            layers = [Layer(layer.shard, layer.partial, CombineSpec(uncut), layer.offset)]
        seen: dict[tuple, str] = {}
        for fields, layer in zip(tables, layers):
            for s in layer.strategies():
                if s.inputs in seen:
                    self.fail(fields["shard"], f"{s.label} places the inputs as {seen[s.inputs]} does")
                seen[s.inputs] = s.label

    def cut_lengths(self, node: yaml.Node, shard: ShardSpec, tensors: Sequence[TensorArg]) -> None:
        """The dims one label cuts plainly (not in proportion, not re-based) are of one length:
        the explorer joins no others, and a rule joining others holds nowhere it was verified."""
        lengths: dict[str, dict[int, tuple[int, int]]] = {}
        for i, (row, t) in enumerate(zip(shard.inputs, tensors)):
            for d, cut in enumerate(row):
                if cut.halo and t.shape[d] and cut.halo > t.shape[d]:  # each shard reads past the whole dim
                    self.fail(node, f"{cut}: a halo of {cut.halo} along input {i} dim {d}, which has {t.shape[d]} "
                                    f"elements in the example (shape {list(t.shape)})")
                if cut.label is not None and cut.scale == 1 and not cut.extend and not cut.local:
                    lengths.setdefault(cut.label, {}).setdefault(t.shape[d], (i, d))
        for label, where in lengths.items():
            if len(where) > 1:
                (n, (i, d)), (m, (j, e)) = sorted(where.items())[:2]
                self.fail(node, f"{label} cuts dims of different lengths in the example: input {i} dim {d} of "
                                f"{n}, input {j} dim {e} of {m} (a label's plain cuts are of one length)")

    def layer(self, f: dict[str, yaml.Node], before: Sequence[Layer] = ()) -> Layer:
        """One layer of tables (``shard``, ``partial``, ``offset``, ``combine``); a further one
        (after the layers ``before``) matches the first's inputs and ranks and adds labels of its own."""
        first = before[0] if before else None
        shard = self.built(f["shard"], "shard", ShardSpec, tuple(
            tuple(self.parsed(d, DimLabel.parse, "shard label") for d in self.sequence(row, "shard row"))
            for row in self.sequence(f["shard"], "shard")
        ))
        if first is not None and [len(r) for r in shard.inputs] != [len(r) for r in first.shard.inputs]:
            self.fail(f["shard"], "a layer of more must list the inputs and ranks of the entry's shard")
        partial = PartialSpec(tuple(() for _ in shard.inputs))
        if "partial" in f:
            partial = PartialSpec(self.per_input(f["partial"], "partial", PartialIn.parse, len(shard.inputs)))
        offset = None
        if "offset" in f:
            offset = OffsetSpec(self.per_input(f["offset"], "offset", OffsetIn.parse, len(shard.inputs)))
            for label in sorted(offset.labels() - shard.labels(), key=label_number):
                self.fail(f["offset"], f"offset label {label} cuts no dim: there is no shard start to subtract")
        combine = self.combine(f["combine"])
        for label, outs in combine.by_label:
            for c in (c for o in outs for c in o.options if isinstance(c, ArgReduce)):
                row = shard.inputs[c.input] if c.input < len(shard.inputs) else ()
                if not any(d.label == label and d.plain for d in row):
                    self.fail(f["combine"],
                              f"{label}: {c} reads input {c.input}, which {label} does not cut plainly "
                              "(without a halo or proportion)")
            positions = [c for o in outs for c in o.options if isinstance(c, GatherPositions)]
            if positions and not any(d.label == label and d.plain for row in shard.inputs for d in row):
                self.fail(f["combine"], f"{label}: {positions[0]} moves positions by each shard's start, "
                                        f"and {label} cuts no dim plainly")
            evens = [c for o in outs for c in o.options if isinstance(c, Gather) and c.even]
            cut = [d for row in shard.inputs for d in row if d.label == label]
            if evens and (not cut or not all(d.plain for d in cut)):
                # "every dim the strategy cuts divides by the shard count" speaks of plain cuts
                self.fail(f["combine"], f"{label}: {evens[0]} holds on even cuts, and {label} cuts "
                                        f"{'a dim not plainly' if cut else 'no dim'}")
        # one placement per label and input, a combine for each label placing inputs
        problem = layer_problem(Layer(shard, partial, combine, offset))
        if problem:
            self.fail(f[problem[0]], problem[1])
        used = shard.labels() | partial.labels()
        if first is not None:
            for label in sorted(used & set().union(*(b.labels() for b in before)), key=label_number):
                self.fail(f["combine"], f"label {label} is already used by an earlier layer")
            n_out = {len(outs) for _, outs in first.combine.by_label + combine.by_label}
            if len(n_out) > 1:
                self.fail(f["combine"], "a layer of more gives a different number of outputs than the entry's combine")
        return Layer(shard, partial, combine, offset)

    def output_dims(self, node: yaml.Node, combine: CombineSpec, results: Sequence[TensorArg]) -> None:
        """Every combine dim names a dim of its output: codegen would otherwise emit a
        Shard(dim) that does not exist (``gather(dim=7)`` of a rank-3 output). The outputs'
        ranks are the entry's ``results``, which an entry with such a combine must list."""
        for label, outs in combine.by_label:
            for k, out in enumerate(outs):
                for c in out.options:
                    if not isinstance(c, (Gather, Scan, GatherPositions)):
                        continue
                    if not results:
                        self.fail(node, f"{label}: {c} names a dim of output {k}, but the entry lists no results "
                                        "to check it against")
                    shape = results[k].shape
                    if c.dim >= len(shape):
                        self.fail(node, f"{label}: {c} names dim {c.dim} of output {k}, which has rank {len(shape)} "
                                        f"(shape {list(shape)})")
                    if isinstance(c, Gather) and shape[c.dim] and max(c.halo, c.halo_end, c.overlap) > shape[c.dim]:
                        self.fail(node, f"{label}: {c} drops or overlaps {max(c.halo, c.halo_end, c.overlap)} "
                                        f"elements of a shard along dim {c.dim} of output {k}, which has "
                                        f"{shape[c.dim]} (shape {list(shape)})")
                    if isinstance(c, Gather) and shape[c.dim] and c.block > shape[c.dim]:
                        self.fail(node, f"{label}: {c} makes dim {c.dim} of output {k} of {c.block} blocks, but it "
                                        f"has {shape[c.dim]} elements (shape {list(shape)})")
                    if isinstance(c, GatherPositions) and c.component is not None and c.component >= shape[-1]:
                        self.fail(node, f"{label}: {c} moves element {c.component} of the last dim of output {k}, "
                                        f"which has {shape[-1]} (shape {list(shape)})")

    def offsets(self, node: yaml.Node, offset: OffsetSpec, tensors: Sequence[TensorArg]) -> None:
        """Every offset names an integer input of positions, and a component of its last
        dim (the index vector) that exists: a runtime would subtract a shard's start from
        an element no index has, or from values that are no positions."""
        for i, (items, t) in enumerate(zip(offset.inputs, tensors)):
            for item in items:
                if not t.dtype.startswith(("int", "uint")):
                    self.fail(node, f"offset {item} of input {i}: the input is {t.dtype}, not integer positions")
                if item.component is not None and (not t.shape or item.component >= t.shape[-1]):
                    last = f"whose last dim has {t.shape[-1]} elements" if t.shape else "which has no dims"
                    self.fail(node, f"offset {item} of input {i}: element {item.component} of its index vector, "
                                    f"{last} (shape {list(t.shape)})")

    def per_input(self, node: yaml.Node, what: str, parse, n_inputs: int) -> tuple[tuple, ...]:
        """A table of labelled items per tensor input (``partial``, ``offset``)."""
        rows = self.sequence(node, what)
        if len(rows) != n_inputs:
            self.fail(node, f"{what} lists {len(rows)} inputs, shard lists {n_inputs}")
        table = tuple(tuple(self.parsed(x, parse, f"{what} input") for x in self.sequence(row, f"{what} row"))
                      for row in rows)
        for i, items in enumerate(table):
            labels = [x.label for x in items]
            for label in sorted({x for x in labels if labels.count(x) > 1}, key=label_number):
                # an input takes one placement per label: the strategy would keep the first
                self.fail(node, f"{what} input {i} lists {label} twice")
        return table

    def independent(self, node: yaml.Node, used: set[str]) -> IndependentSpec:
        rows = self.sequence(node, "independent")
        try:
            spec = IndependentSpec(tuple(tuple(check_label(self.string(x, "independent label"))
                                               for x in self.sequence(row, "independent part")) for row in rows))
        except SpecError as e:
            self.fail(node, f"independent: {e}")
        for label in sorted(spec.labels() - used, key=label_number):
            self.fail(node, f"independent: label {label} is unknown")
        return spec  # a label in no part couples the parts (it places an input they share)

    def combine(self, node: yaml.Node) -> CombineSpec:
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, "combine must be a mapping from S<j> to a combine")
        mapping = {}
        for k, v in node.value:
            label = self.unique_key(k, mapping, "combine")
            try:
                label_number(label)
            except SpecError as e:
                self.fail(k, str(e))
            outs = v.value if isinstance(v, yaml.SequenceNode) else (v,)
            mapping[label] = tuple(self.alternatives(x, label) for x in outs)
        try:
            return CombineSpec.of(mapping)
        except SpecError as e:
            self.fail(node, str(e))

    def alternatives(self, node: yaml.Node, label: str) -> OutputCombine:
        """One output's combines, in the writer's order (OutputCombine.of): the same
        alternatives in another order would read as another rule to a diff."""
        out = self.parsed(node, OutputCombine.parse, f"combine of {label}")
        options = out.options
        for k in range(1, len(options)):
            if combine_order(options[k]) < combine_order(options[k - 1]):
                self.fail(node, f"combine of {label}: alternatives must be sorted: {str(options[k])!r} comes after "
                                f"{str(options[k - 1])!r} (write {str(OutputCombine.of(options))!r})")
        return out

    def example(self, node: yaml.Node) -> Example:
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, "example must be a mapping from argument name to value")
        args: dict[str, Any] = {}
        for k, v in node.value:
            args[self.unique_key(k, args, "example")] = self.example_value(v)
        return Example(tuple(args.items()))

    def example_value(self, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            f = self.mapping(node, ("shape", "dtype"), (), "tensor")
            shape = self.value(f["shape"])
            if not isinstance(shape, list) or not all(_is_count(s, 0) for s in shape):
                self.fail(f["shape"], f"bad tensor shape {reprlib.repr(shape)} (sizes of at most {MOST_DIGITS} digits)")
            dtype = self.string(f["dtype"], "dtype")
            if not _DTYPE_RE.match(dtype):
                self.fail(f["dtype"], f"unknown tensor dtype {dtype!r}")
            return TensorArg(tuple(shape), dtype)
        if isinstance(node, yaml.SequenceNode):
            try:  # as in value: a too-deep value fails at its own line
                return tuple(self.example_value(n) for n in node.value)
            except RecursionError:
                self.fail(node, _NESTING)
        return self.value(node)

    def verified(self, node: yaml.Node) -> Verification:
        f = self.mapping(node, ("trials", "shard_counts", "uneven"), (), "verified")
        trials, counts, uneven = self.value(f["trials"]), self.value(f["shard_counts"]), self.value(f["uneven"])
        if not _is_count(trials, 0):
            self.fail(f["trials"], f"verified trials must be a whole number >= 0 of at most {MOST_DIGITS} digits, "
                                   f"got {reprlib.repr(trials)}")
        if not isinstance(counts, list) or not counts or not all(_is_count(c, 1) for c in counts):
            self.fail(f["shard_counts"], f"verified shard_counts must be a non-empty list of whole numbers >= 1 "
                                         f"of at most {MOST_DIGITS} digits, got {reprlib.repr(counts)}")
        if counts != sorted(set(counts)):  # as the explorer writes them: each count tried, once
            self.fail(f["shard_counts"], f"verified shard_counts must be increasing, each count once, got {counts!r}")
        if not isinstance(uneven, bool):
            self.fail(f["uneven"], f"verified uneven must be true or false, got {uneven!r}")
        return Verification(trials, tuple(counts), uneven)


_scalar_loader = yaml.SafeLoader("")


_STR, _INT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int"


def _construct(node: yaml.ScalarNode) -> Any:
    """A scalar's value, as the safe loader constructs it. Text and plain decimal integers
    (most of a file's 100,000 scalars) are read here; the rest (0x1f, 017 in octal, 1_000,
    floats, booleans, null) by the loader's own constructors."""
    value = node.value
    if node.tag == _STR:
        return value
    if node.tag == _INT and (value.isdigit() and (value[0] != "0" or value == "0")):
        return int(value)
    return _scalar_loader.construct_object(node, deep=True)


MOST_DIGITS = 9  # of a number in a rule file: a size, a count (docs/rule-format.md)


def _is_count(v: Any, least: int) -> bool:
    """A whole number >= ``least`` of at most ``MOST_DIGITS`` digits; YAML's true and false
    are ints to Python."""
    return isinstance(v, int) and not isinstance(v, bool) and least <= v < 10 ** MOST_DIGITS


def _tensors(v: Any) -> list[TensorArg]:
    if isinstance(v, TensorArg):
        return [v]
    if isinstance(v, tuple):
        return [t for x in v for t in _tensors(x)]
    return []


def _count_tensors(v: Any) -> int:
    return len(_tensors(v))


def line_at(text: str | bytes, offset: int) -> int:
    """The line of ``text`` (or of its UTF-8 bytes) that ``offset`` lies on, as an editor
    and grep -n number them: libyaml's marks count NEL, U+2028 and U+2029 as line breaks
    too, so a reason holding one would put every later error a line off."""
    nl, cr = ("\n", "\r") if isinstance(text, str) else (b"\n", b"\r")
    # \r\n is one break, a lone \r one (as libyaml and editors read an old Mac file)
    return text.count(nl, 0, offset) + text.count(cr, 0, offset) - text.count(cr + nl, 0, offset) + 1


def _may_nest_deeply(text: str) -> bool:
    """Could ``text`` nest collections more than MAX_NESTING deep? Every collection on a path
    opens with an indicator of its own (``[``, ``{``, ``-``, ``:``, ``?``), so a text with
    fewer of them in all cannot: a few counts, where parsing is needed for a big file only."""
    return sum(map(text.count, "[{-:?")) > MAX_NESTING


def _refuse_events(text: str, filename: str) -> None:
    """Fail on the first anchor or alias, and on collections nested past MAX_NESTING, from the
    parser's events (libyaml's parser keeps its own stack: no recursion) before composing.

    An alias makes the composed document a graph: a recursive one (``&a [*a]``) sends the
    reader into endless recursion, and nested ones (a "billion laughs") expand
    exponentially. The dumper writes none, so a rule file never needs one."""
    # no anchor, so no alias either (an undefined one fails composing)
    if "&" not in text and not _may_nest_deeply(text):
        return
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        line = line_at(text, event.start_mark.index)
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                raise RegistryError(f"{filename}:{line}: {_NESTING} (more than {MAX_NESTING} levels)")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if isinstance(event, yaml.AliasEvent):
            raise RegistryError(f"{filename}:{line}: alias *{event.anchor} is not allowed "
                                "in a registry file (write the value out)")
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            raise RegistryError(f"{filename}:{line}: anchor &{event.anchor} is not allowed "
                                "in a registry file (write the value out)")


def loads_record(text: str, filename: str = "<string>", backend: str | None = None) -> OpRecord:
    """``backend``: the backend folder the file lies in, if any; a rule of another backend is
    refused at its ``backend:`` line."""
    reader = _Reader(filename, backend, text)
    try:
        _refuse_events(text, filename)
        root = yaml.compose(text, Loader=_Loader)
    except yaml.reader.ReaderError as e:  # a character YAML refuses: named by its offset, not a line
        code = ord(e.character) if isinstance(e.character, str) else e.character
        # libyaml counts the offset in UTF-8 bytes, PyYAML's own reader in characters
        line = line_at(text.encode("utf-8") if _SafeLoader is not yaml.SafeLoader else text, e.position)
        raise RegistryError(f"{filename}:{line}: not valid YAML: character U+{code:04X}: {e.reason}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = line_at(text, mark.index) if mark is not None else 1
        raise RegistryError(f"{filename}:{line}: not valid YAML: {getattr(e, 'problem', e)}") from None
    except RecursionError:  # PyYAML's pure-Python composer, where libyaml is missing
        raise RegistryError(f"{filename}:1: {_NESTING}") from None
    if root is None:
        raise RegistryError(f"{filename}:1: empty file")
    try:
        return reader.record(reader.checked(root) if _MAY_HIDE.search(text) else root)
    except RecursionError:  # the reader names the line of a too-deep value; this is a last resort
        raise RegistryError(f"{filename}:1: {_NESTING}") from None
    except SpecError as e:  # likewise: the reader names the line of a spec it builds
        raise RegistryError(f"{filename}:1: {e}") from None


# A rule file holds one op's entries (the largest committed ones are kilobytes, a cache
# entry one signature's): a file past this is damaged or no rule file, and is not read.
MOST_FILE_BYTES = 16 * 2 ** 20


def read_file(path: str | os.PathLike) -> bytes:
    """The bytes of a registry file; RegistryError naming the path and the reason when it
    is there but cannot be read (a folder, a dangling symlink, no permission). A path with
    nothing at it raises FileNotFoundError as it is: the rule cache reads that as a miss. A
    FIFO or a device named ``*.yaml`` is refused before it is opened: reading one would
    block, or never end (``/dev/zero``)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):  # (a folder fails to open, and says so)
            raise RegistryError(f"{path}: cannot read: not a regular file")
        if st.st_size > MOST_FILE_BYTES:  # not read into memory to be refused
            raise RegistryError(f"{path}: cannot read: {st.st_size:,} bytes, more than a rule file holds "
                                f"(at most {MOST_FILE_BYTES:,})")
        return Path(path).read_bytes()
    except FileNotFoundError:
        if not os.path.islink(path):
            raise
        raise RegistryError(f"{path}: cannot read: a symlink to {os.readlink(path)}, which does not exist") from None
    except OSError as e:
        raise RegistryError(f"{path}: cannot read: {e.strerror or e}") from None


def load_record(path: str | os.PathLike, backend: str | None = None) -> OpRecord:
    """``backend``: as for loads_record."""
    path = Path(path)
    data = read_file(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise RegistryError(f"{path}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    return loads_record(text, str(path), backend)


def check_registry_root(root: str | os.PathLike, backend: str | None = None, layout: bool = True) -> Path:
    """``root`` as a registry root (``<root>/<backend>/<op>.yaml``), or RegistryError naming
    the path. A missing folder or a backend folder given as the root would otherwise read
    as an empty registry: codegen would write an empty table, a diff would see no change.
    ``layout``: also what lies in it (a file beside or instead of the backend folders);
    without it, only whether it is a registry root at all (a diff's base, read file by file)."""
    root = Path(root)
    if not root.exists():  # or a symlink loop, a symlink to nothing, a file on the way: named
        raise RegistryError(path_problem(root, folder=True) or f"{root}: no such registry folder")
    if not root.is_dir():
        raise RegistryError(f"{root}: not a folder (expected a registry root holding <backend>/<op>.yaml)")
    files = sorted(p for p in root.iterdir() if not p.is_dir())
    backends = [p for p in root.iterdir() if p.is_dir() and next(p.glob("*.yaml"), None) is not None]
    if not backends and any(p.suffix == ".yaml" and usable_name(p.stem) for p in files):
        raise RegistryError(f"{root}: holds rule files itself, so it is a backend folder, not a registry root "
                            f"(pass {Path(os.path.realpath(root)).parent} instead)")
    if not layout:
        return root
    # a file beside the backend folders, refused as in a git revision's tree (rule_diff's
    # _check_tree): a misnamed rule file, then any other (.yamllint.yaml too)
    refuse_misnamed(str(p) for p in files)
    stray = next((p for p in files if p.suffix.lower() in (".yaml", ".yml")), None)
    if stray is not None:
        raise RegistryError(f"{stray}: a rule file outside a backend folder (<backend>/<op>.yaml)")
    # a file where a backend's folder belongs: that backend's rules would read as all removed
    for name in sorted((backend,) if backend is not None else backend_names()):
        problem = backend_folder_problem(root / name)
        if problem:
            raise RegistryError(problem)
    if backend is not None and not (root / backend).is_dir():
        found = sorted(p.name for p in root.iterdir() if p.is_dir() and next(p.glob("*.yaml"), None) is not None)
        raise RegistryError(f"{root}: no {backend}/ folder of rule files "
                            f"(backends there: {', '.join(found) or 'none'})")
    return root


def backend_folder_problem(folder: Path) -> str:
    """Why ``folder``, where a backend's rule files belong, holds something else (a file, a
    symlink to nothing, a loop), or '' (a folder, or nothing there)."""
    if not os.path.lexists(folder) or folder.is_dir():
        return ""
    if folder.exists():
        return f"{folder}: not a folder (expected the folder of {folder.name}'s rule files, {folder.name}/<op>.yaml)"
    return path_problem(folder, folder=True) or f"{folder}: cannot be read"  # a symlink to nothing, a loop


def load_rules(root: str | os.PathLike, backend: str) -> dict[str, OpRecord]:
    """load_registry for a command that reports on a backend's rules (codegen, coverage): a
    backend folder without rule files is an error, not an empty table or a 0% coverage."""
    records = load_registry(root, backend)
    if not records:
        raise RegistryError(f"{Path(root) / backend}: no rule files (<op>.yaml) in it")
    return records


def load_registry(root: str | os.PathLike, backend: str) -> dict[str, OpRecord]:
    """Every record of one backend, by op name. Raises RegistryError on the first bad file,
    and when ``root`` is not a registry root holding a ``backend`` folder."""
    folder = check_registry_root(root, backend) / backend
    check_backend_folder(folder)
    records = {}
    for path in sorted(folder.glob("*.yaml")):
        record = load_op_file(path, backend)
        records[record.op] = record
    return records


@functools.lru_cache(maxsize=None)
def backend_names() -> frozenset[str]:
    """The backends there are (``metaspmd.backends``' packages, found without importing them
    or their frameworks): a registry folder named after none is a misspelling (``troch/``)."""
    found = importlib.util.find_spec("metaspmd.backends").submodule_search_locations
    return frozenset(m.name for m in pkgutil.iter_modules(found) if m.ispkg)


def check_backend_folder(folder: Path) -> None:
    """RegistryError for what every command would pass over unsaid in a backend folder, which
    they read as ``<op>.yaml`` files only: a misnamed rule file, rule files in a subfolder."""
    entries = list(folder.iterdir())
    refuse_misnamed(str(p) for p in entries)
    nested = sorted(str(p) for p in entries if p.is_dir() and next(p.rglob("*.y*ml"), None) is not None)
    if nested:
        raise RegistryError(f"{nested[0]}: rule files in a subfolder of {folder}; rule files lie in the backend "
                            f"folder itself (<backend>/<op>.yaml): move them up, or out of the registry")


def refuse_misnamed(names: Iterable[str]) -> None:
    """RegistryError naming the first of ``names`` that reads as a rule file but does not end
    ``.yaml`` (``op.yml``, ``op.YAML``): every command would pass over it unsaid, its rules with it."""
    misnamed = sorted(n for n in names if Path(n).suffix.lower() in (".yaml", ".yml") and Path(n).suffix != ".yaml")
    if misnamed:
        raise RegistryError(f"{misnamed[0]}: a rule file's name ends .yaml (<op>.yaml): rename it, or move it out")


def load_op_file(path: str | os.PathLike, backend: str) -> OpRecord:
    """One file of a ``backend`` folder: a rule of another backend, or of another op than
    the file's name says, is refused, naming the file."""
    path = Path(path)
    record = load_record(path, backend)
    if path.name != f"{record.op}.yaml":
        raise RegistryError(f"{path}:1: file holds op {record.op!r}; expected {path.stem!r}")
    return record
