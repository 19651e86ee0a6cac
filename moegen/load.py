"""Stage 1, load: a YAML file to a frozen, schema-checked `Spec`, with source locations.

The YAML is parsed node by node (safe loader, no anchors, no custom tags) so that every
key and value keeps its line and column; schema violations become located diagnostics,
all of them at once.
"""

from __future__ import annotations

import difflib
import hashlib
import keyword
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from moegen.diagnostics import Diagnostic, SpecError
from moegen.spec import Spec

MAX_SPEC_BYTES = 64 * 1024
FieldPath = tuple[str | int, ...]

_SCALAR_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}
_DID_YOU_MEAN_CUTOFF = 0.8  # close enough to be a typo, not a different (unsupported) choice
# Spellings other tools use for the values moegen names differently.
_COMMON_SPELLINGS = {
    "bf16": "bfloat16", "fp32": "float32", "f32": "float32", "float": "float32",
    "v5e": "tpu-v5e", "tpu-v5lite": "tpu-v5e", "v5litepod": "tpu-v5e", "v5p": "tpu-v5p",
    "v6e": "tpu-v6e", "trillium": "tpu-v6e", "v7x": "tpu7x", "tpu-v7x": "tpu7x",
    "tpu-v7": "tpu7x", "ironwood": "tpu7x", "megablox": "pallas", "ragged_dot": "xla",
}  # fmt: skip


@dataclass(frozen=True)
class SpecSource:
    """The spec file as read: its text, its hash and how it is named in messages."""

    display: str  # path as shown in messages and in the generated header
    name: str  # module name: the file stem
    text: str
    sha256: str


@dataclass(frozen=True)
class Locations:
    """Where each key and value of the YAML document sits (1-based line, column)."""

    values: dict[FieldPath, tuple[int, int]]
    keys: dict[FieldPath, tuple[int, int]]

    def of_value(self, path: FieldPath) -> tuple[int, int]:
        """Location of the value at `path`, or of its nearest existing parent."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.values:
                return self.values[path[:end]]
        return (1, 1)

    def of_key(self, path: FieldPath) -> tuple[int, int]:
        return self.keys.get(path) or self.of_value(path)


@dataclass(frozen=True)
class LoadedSpec:
    """A schema-valid spec together with its source, for located messages downstream."""

    source: SpecSource
    spec: Spec
    locations: Locations

    def diagnostic(self, path: FieldPath, message: str, *, at_key: bool = False) -> Diagnostic:
        line, col = self.locations.of_key(path) if at_key else self.locations.of_value(path)
        return Diagnostic(self.source.display, line, col, dotted(path), message)


def dotted(path: FieldPath) -> str:
    """('mesh', 'batch_axes', 1) -> 'mesh.batch_axes[1]'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.isidentifier():  # a user's key: shown escaped, never raw
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else part
    return out


def display_path(path: Path) -> str:
    """The spec path as shown to users: relative to the working directory when inside it."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def load_spec(path: Path) -> LoadedSpec:
    """Read, parse and schema-check one spec file. Raises SpecError with every problem."""
    display = display_path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        problem = Diagnostic(display, 1, 1, "", f"cannot read spec: {err.strerror}")
        raise SpecError([problem]) from None
    return load_spec_bytes(raw, display, path.stem)


def load_spec_bytes(raw: bytes, display: str, name: str) -> LoadedSpec:
    """Parse spec bytes named `display`; `name` is the module name the spec will produce."""

    def fail(message: str, line: int = 1, col: int = 1) -> SpecError:
        return SpecError([Diagnostic(display, line, col, "", message)])

    if not display.isprintable():
        # The path is echoed into a comment of the generated code: one clean line only.
        display = ascii(display)
        raise fail("file path must be printable")
    if len(raw) > MAX_SPEC_BYTES:
        raise fail(f"spec is {len(raw)} bytes; at most {MAX_SPEC_BYTES} are accepted")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        col = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise fail(f"spec is not UTF-8 text (byte 0x{raw[err.start]:02x})", line, col) from None
    problem = module_name_problem(name)
    if problem:
        raise fail(problem)
    source = SpecSource(display, name, text, hashlib.sha256(raw).hexdigest())
    data, locations = _parse_yaml(source)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_schema_diagnostics(err, source, locations)) from None
    return LoadedSpec(source, spec, locations)


# Generated modules sit beside user code: their names must not shadow what they import.
# A fixed set, so that a file name's verdict does not depend on the Python version.
_RESERVED_NAMES = {
    "jax", "jaxlib", "numpy", "moegen", "generated", "typing", "collections", "functools",
    "math", "os", "sys", "types", "abc", "dataclasses", "enum", "re", "json", "io",
}  # fmt: skip


def module_name_problem(name: str) -> str | None:
    """Why the spec file stem `name` cannot name a generated module, or None."""
    example = "e.g. 'mixtral_8x7b.yaml'"
    if not name.isidentifier() or name.startswith("_"):
        return (
            f"file name {name!r} must be a Python identifier not starting with '_' "
            f"(it names the generated module), {example}"
        )
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"file name {name!r} is a Python keyword and cannot name a module, {example}"
    if name in _RESERVED_NAMES:
        return f"file name {name!r} would shadow the Python module of that name, {example}"
    return None


# ---------------------------------------------------------------------------------------
# YAML with locations. The YAML 1.2 core schema: no 1.1 surprises (yes/on as booleans,
# 010 as octal, 1:30 as sexagesimal, dates as timestamps), no aliases, no custom tags.

_STR, _INT, _FLOAT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_BOOL, _NULL = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"
_MAP, _SEQ = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"


class _CoreSchemaResolver(yaml.resolver.BaseResolver):
    pass


for _tag, _pattern, _first in [
    (_BOOL, r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    (_INT, r"^[-+]?[0-9]+$", "-+0123456789"),
    (
        _FLOAT,
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
    (_NULL, r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
]:
    _CoreSchemaResolver.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


class _AliasNode(yaml.Node):
    """Stands where a '*alias' was written, so it is reported there and never expanded."""

    id = "alias"


class _SpecLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    _CoreSchemaResolver,
):
    def __init__(self, text: str):
        yaml.reader.Reader.__init__(self, text)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _CoreSchemaResolver.__init__(self)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            return _AliasNode("alias", None, event.start_mark, event.end_mark)
        return super().compose_node(parent, index)


def _yaml_problem(err: yaml.MarkedYAMLError) -> str:
    """PyYAML's parser vocabulary, translated for people who write specs."""
    problem = err.problem or err.context or "malformed document"
    if "'\\t'" in problem or "\t" in problem:
        return "tabs cannot indent YAML; use spaces"
    if "but found another document" in problem:
        return "a spec is one YAML document; remove the '---' line and what follows it"
    if problem.startswith("expected <block end>"):
        return "this line's indentation does not match the keys above it"
    mark, context_mark = err.problem_mark, err.context_mark
    if err.context and context_mark and mark and context_mark.line != mark.line:
        problem += f" ({err.context} at {context_mark.line + 1}:{context_mark.column + 1})"
    return problem


def _parse_yaml(source: SpecSource) -> tuple[dict[str, Any], Locations]:
    def fail(message: str, line: int = 1, col: int = 1) -> SpecError:
        return SpecError([Diagnostic(source.display, line, col, "", message)])

    try:
        loader = _SpecLoader(source.text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as err:
        line = source.text.count("\n", 0, err.position) + 1
        col = err.position - (source.text.rfind("\n", 0, err.position) + 1) + 1
        char = f"U+{ord(err.character):04X}" if isinstance(err.character, str) else "a byte"
        raise fail(
            f"invalid YAML: control character {char} is not allowed; "
            "write it as an escape inside double quotes",
            line,
            col,
        ) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise fail(f"invalid YAML: {_yaml_problem(err)}", line, col) from None
    except yaml.YAMLError as err:
        raise fail(f"invalid YAML: {err}") from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _NULL):
        raise fail("spec is empty")
    builder = _NodeConverter(source.display)
    data = builder.convert(root, ())
    if builder.diagnostics:
        raise SpecError(builder.diagnostics)
    if not isinstance(data, dict):
        raise fail(
            "spec must be a mapping of sections (version, layer, router, ...)", *_start(root)
        )
    return data, Locations(builder.values, builder.keys)


def _start(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _scalar(node: yaml.ScalarNode) -> Any:
    text = node.value
    if node.tag == _STR:
        return text
    if node.tag == _INT:
        return int(text)
    if node.tag == _FLOAT:
        return float(text.lower().replace(".inf", "inf").replace(".nan", "nan"))
    if node.tag == _BOOL:
        return text.lower() == "true"
    return None  # _NULL


class _NodeConverter:
    """YAML nodes to plain Python values, recording locations and refusing unsafe forms."""

    def __init__(self, display: str):
        self.display = display
        self.values: dict[FieldPath, tuple[int, int]] = {}
        self.keys: dict[FieldPath, tuple[int, int]] = {}
        self.diagnostics: list[Diagnostic] = []

    def _error(self, node: yaml.Node, path: FieldPath, message: str) -> None:
        line, col = _start(node)
        self.diagnostics.append(Diagnostic(self.display, line, col, dotted(path), message))

    def convert(self, node: yaml.Node, path: FieldPath) -> Any:
        self.values[path] = _start(node)
        if isinstance(node, _AliasNode):
            self._error(node, path, "YAML aliases are not supported; write the value out")
            return None
        expected = {yaml.MappingNode: _MAP, yaml.SequenceNode: _SEQ}.get(type(node))
        if expected and node.tag != expected or not expected and node.tag not in _SCALAR_TAGS:
            self._error(node, path, f"unsupported YAML tag {node.tag!r}")
            return None
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, (*path, i)) for i, item in enumerate(node.value)]
        return _scalar(node)

    def _mapping(self, node: yaml.MappingNode, path: FieldPath) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or getattr(key_node, "value", "") == "<<":
                self._error(key_node, path, "merge keys '<<' are not supported; write the keys out")
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "a collection"
                self._error(key_node, path, f"keys must be strings, got {shown!s}; quote it")
                continue
            key = key_node.value
            if key in out:
                first = self.keys[(*path, key)]
                self._error(
                    key_node, (*path, key), f"duplicate key (first at {first[0]}:{first[1]})"
                )
                continue
            self.keys[(*path, key)] = _start(key_node)
            out[key] = self.convert(value_node, (*path, key))
        return out


# ---------------------------------------------------------------------------------------
# Schema errors (pydantic) to located, human messages.


def _schema_diagnostics(
    err: ValidationError, source: SpecSource, locations: Locations
) -> list[Diagnostic]:
    out = []
    for error in err.errors(include_url=False):
        loc: FieldPath = tuple(error["loc"])
        at_key = False
        if loc and loc[-1] == "[key]":  # a bad key of a free-form mapping (mesh.axes)
            loc, at_key = (*loc[:-2], loc[-2]), True
        kind = error["type"]
        if kind == "missing":
            field, (line, col) = loc[:-1], locations.of_value(loc[:-1])
            message = f"required key '{loc[-1]}' is missing"
        elif kind == "extra_forbidden":
            field, (line, col) = loc[:-1], locations.of_key(loc)
            written = {k[-1] for k in locations.keys if k[:-1] == loc[:-1]}
            message = _unknown_key_message(str(loc[-1]), _model_at(loc[:-1]), written)
        else:
            field = loc
            line, col = locations.of_key(loc) if at_key else locations.of_value(loc)
            message = _value_message(error)
        out.append(Diagnostic(source.display, line, col, dotted(field), message))
    return out


def _model_at(path: FieldPath) -> type[BaseModel] | None:
    model: Any = Spec
    for part in path:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _unknown_key_message(key: str, model: type[BaseModel] | None, written: set) -> str:
    # A key the mapping already has is no fix: suggesting it would make a duplicate.
    fields = list(model.model_fields) if model else []
    message = f"unknown key {key!r}"
    close = _suggest(key, [name for name in fields if name not in written])
    if close:
        return f"{message}; did you mean '{close[0]}'?"
    if fields:
        return f"{message}; expected one of: {', '.join(fields)}"
    return message


def _suggest(written: str, options: list[str]) -> list[str]:
    """The option `written` was probably meant to be: a known other spelling, a close typo,
    the same letters swapped, or a longer name that contains it ('experts' -> 'num_experts')."""
    if _COMMON_SPELLINGS.get(written) in options:
        return [_COMMON_SPELLINGS[written]]
    close = difflib.get_close_matches(written, options, n=1, cutoff=_DID_YOU_MEAN_CUTOFF)
    if close:
        return close
    swapped = [o for o in options if sorted(o) == sorted(written)]
    containing = [o for o in options if len(written) >= 4 and written in o]
    return (swapped or containing)[:1]


def describe(value: Any) -> str:
    """A YAML-flavoured description of a user value for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _value_message(error: Any) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    got = describe(value)
    simple = {
        "greater_than": lambda: f"must be > {ctx.get('gt')}, got {got}",
        "less_than_equal": lambda: f"must be <= {ctx.get('le')}, got {got}",
        "int_type": lambda: f"must be an integer, got {got}",
        "bool_type": lambda: f"must be true or false, got {got}",
        "string_type": lambda: f"must be a string, got {got}",
        "dict_type": lambda: f"must be a mapping, got {got}",
        "model_type": lambda: f"must be a mapping, got {got}",
        "list_type": lambda: f"must be a list, got {got}",
        "too_short": lambda: (
            "must not be empty"
            if ctx.get("min_length") == 1
            else f"must have at least {ctx.get('min_length')} entries"
        ),
        "string_too_long": lambda: f"must be at most {ctx.get('max_length')} characters",
    }
    if kind in simple:
        return simple[kind]()
    if kind == "value_error":
        return f"{ctx.get('error', error['msg'])!s}, got {got}"
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        options = [part.strip(" '") for part in expected.replace(" or ", ",").split(",")]
        message = f"must be {expected}, got {got}"
        close = _suggest(value, options) if isinstance(value, str) else []
        return f"{message}; did you mean '{close[0]}'?" if close and close[0] != value else message
    return f"{error['msg'][0].lower()}{error['msg'][1:]}, got {got}"
