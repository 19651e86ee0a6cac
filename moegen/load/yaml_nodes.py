"""YAML text to plain values with locations, the YAML 1.2 core schema and nothing unsafe.

No 1.1 surprises (yes/on as booleans, 010 as octal, 1:30 as sexagesimal, dates as
timestamps), no aliases (reported where written, never expanded), no custom tags, no merge
keys; control characters and parser errors become located diagnostics.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from moegen.diagnostics import Diagnostic, SpecError
from moegen.load.source import FieldPath, Locations, SpecSource, dotted

_SCALAR_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}
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


def parse_yaml(source: SpecSource) -> tuple[dict[str, Any], Locations]:
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
