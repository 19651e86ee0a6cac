"""YAML text to plain values with locations, the YAML 1.2 core schema and nothing unsafe.

No 1.1 surprises (yes/on as booleans, 010 as octal, 1:30 as sexagesimal, dates as
timestamps), no aliases (reported where written, never expanded), no explicit tags, no merge
keys, and the limits of `yaml_limits` (characters, depth, digits); every refusal and parser
error becomes a located diagnostic, with lines and columns as editors count them. libyaml
parses where it reads a text as PyYAML does (`yaml_fast`), PyYAML's Python parser elsewhere,
and every error is PyYAML's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml

from moegen.diagnostics import Diagnostic, SpecError
from moegen.load.source import FieldPath, Locations, SpecSource, dotted
from moegen.load.yaml_fast import LIBYAML, CParser, reads_as_pyyaml
from moegen.load.yaml_limits import (
    MAX_DEPTH,
    NestingTooDeep,
    Positions,
    digits_problem,
    refused_character,
    shown,
    tag_problem,
)

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


# ASCII digits only ([0-9], never \d), and \Z, not $ (which also matches before a final
# newline): a scalar is a number only if it is written as one.
for _tag, _pattern, _first in [
    (_BOOL, r"^(?:true|True|TRUE|false|False|FALSE)\Z", "tTfF"),
    (_INT, r"^[-+]?[0-9]+\Z", "-+0123456789"),
    (
        _FLOAT,
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z",
        "-+0123456789.",
    ),
    (_NULL, r"^(?:~|null|Null|NULL|)\Z", ["~", "n", "N", ""]),
]:
    _CoreSchemaResolver.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


class _AliasNode(yaml.Node):
    """Stands where a '*alias' was written, so it is reported there and never expanded."""

    id = "alias"


class _DepthComposer(yaml.composer.Composer):
    """PyYAML's composer, counting depth and keeping aliases and written tags: shared by the
    pure-Python loader and the libyaml one, so both build the same nodes from the same events."""

    depth = 0  # collections open around the node being composed

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            return _AliasNode("alias", None, event.start_mark, event.end_mark)
        # The composer recurses once a level: count the levels here, before Python's
        # recursion limit does (the parser and scanner before it are not recursive).
        event = self.peek_event()
        opens = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if opens:
            if self.depth >= MAX_DEPTH:
                raise NestingTooDeep(event.start_mark.index)
            self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            if opens:
                self.depth -= 1
        # Explicit tags are refused, every one (the converter reports them). Resolving the
        # core-schema tags strictly would be sound too, but each has its own traps (int()
        # takes '٨' and ' 8 ', !!bool "yes" read false, !!null "2048" read null) for no gain:
        # a spec's values are plain scalars, their type is how they are written. The event
        # says whether a tag was written (a '!' alone too), whatever it resolves to.
        node.written_tag = event.tag
        return node


class _SpecLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    _DepthComposer,
    _CoreSchemaResolver,
):
    """The reference loader: every refusal and its message come from here."""

    def __init__(self, text: str):
        yaml.reader.Reader.__init__(self, text)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        _DepthComposer.__init__(self)
        _CoreSchemaResolver.__init__(self)


class _FastSpecLoader(_DepthComposer, _CoreSchemaResolver, CParser):
    """libyaml scans and parses (see yaml_fast); the composer above builds the nodes, so depth,
    aliases and written tags are handled by the very same code as in _SpecLoader."""

    def __init__(self, text: str):
        CParser.__init__(self, text)
        _DepthComposer.__init__(self)
        _CoreSchemaResolver.__init__(self)


def _compose_fast(text: str) -> tuple[yaml.Node | None, Positions] | None:
    """The root node from libyaml's events and the Positions its marks count from; None where
    libyaml may not read the text as PyYAML does, or refuses it: the caller then runs the
    Python loader, whose result (and every error message) is the reference."""
    # libyaml reads a byte-order mark at the start without counting it in mark indices, and
    # skips one at the start of any line, where PyYAML reads it as text. Parsing past the first
    # one keeps the indices PyYAML's minus one, and Positions of the rest maps them to the
    # same lines and columns (the first line's columns already leave the mark out).
    body = text[1:] if text.startswith("\ufeff") else text
    if not LIBYAML or "\ufeff" in body:
        return None
    try:
        if not reads_as_pyyaml(body):
            return None
        loader = _FastSpecLoader(body)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except Exception:  # noqa: BLE001 - any refusal is reported by the Python loader instead
        return None
    return root, Positions(body)


def _yaml_problem(err: yaml.MarkedYAMLError, positions: Positions) -> str:
    """PyYAML's parser vocabulary, translated for people who write specs."""
    problem = err.problem or err.context or "malformed document"
    if "'\\t'" in problem or "\t" in problem:
        return "tabs cannot indent YAML; use spaces"
    if "but found another document" in problem:
        return "a spec is one YAML document; remove the '---' line and what follows it"
    if problem.startswith("expected <block end>"):
        return "this line's indentation does not match the keys above it"
    mark, context_mark = err.problem_mark, err.context_mark
    if err.context and context_mark and mark:
        (line, col), (mark_line, _) = positions.of(context_mark.index), positions.of(mark.index)
        if line != mark_line:
            problem += f" ({err.context} at {line}:{col})"
    return problem


def parse_yaml(source: SpecSource, *, fast: bool = True) -> tuple[dict[str, Any], Locations]:
    """The spec's mapping and where each key and value sits; SpecError with every problem.
    `fast=False` composes with the pure-Python loader only (the reference the fast path is
    tested against)."""
    positions = Positions(source.text)

    def fail(message: str, index: int = 0) -> SpecError:
        line, col = positions.of(index)
        return SpecError([Diagnostic(source.display, line, col, "", message)])

    refused = refused_character(source.text)
    if refused:
        raise fail(f"invalid YAML: {refused[1]}", refused[0])
    composed = _compose_fast(source.text) if fast else None
    if composed is None:
        root = _compose_python(source.text, fail, positions)
    else:
        root, positions = composed
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _NULL):
        if _written_tag(root) is None:
            raise fail("spec is empty")
    builder = _NodeConverter(source.display, positions)
    data = builder.convert(root, ())
    if builder.diagnostics:
        raise SpecError(builder.diagnostics)
    if not isinstance(data, dict):
        raise fail(
            "spec must be a mapping of sections (version, layer, router, ...)",
            root.start_mark.index,
        )
    return data, Locations(builder.values, builder.keys)


def _compose_python(
    text: str, fail: Callable[[str, int], SpecError], positions: Positions
) -> yaml.Node | None:
    """The root node, by the pure-Python loader; its refusals raised as located SpecErrors."""
    try:
        loader = _SpecLoader(text)
        try:
            return loader.get_single_node()
        finally:
            loader.dispose()
    except NestingTooDeep as err:
        message = f"nesting is deeper than {MAX_DEPTH} levels; a spec needs about 4"
        raise fail(f"invalid YAML: {message}", err.index) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = _yaml_problem(err, positions)
        raise fail(f"invalid YAML: {problem}", mark.index if mark else 0) from None
    except yaml.YAMLError as err:  # the reader's: refused_character found them all first
        raise fail(f"invalid YAML: {err}", 0) from None
    except ValueError:  # PyYAML's chr() of an escape past U+10FFFF, in a quoted scalar
        escape = next((m for m in _LONG_ESCAPE.finditer(text) if int(m[1], 16) > 0x10FFFF), None)
        if escape is None:
            raise fail("invalid YAML: an escape names no Unicode character", 0) from None
        message = f"the escape {escape[0]} names no Unicode character (the last is U+10FFFF)"
        raise fail(f"invalid YAML: {message}", escape.start()) from None


_LONG_ESCAPE = re.compile(r"\\U([0-9A-Fa-f]{8})")  # a quoted scalar's 32-bit escape


def _written_tag(node: yaml.Node | None) -> str | None:
    """The tag written on `node` ('!' alone included), or None: see _DepthComposer."""
    return getattr(node, "written_tag", None)


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

    def __init__(self, display: str, positions: Positions):
        self.display = display
        self.positions = positions
        self.values: dict[FieldPath, tuple[int, int]] = {}
        self.keys: dict[FieldPath, tuple[int, int]] = {}
        self.diagnostics: list[Diagnostic] = []

    def _start(self, node: yaml.Node) -> tuple[int, int]:
        return self.positions.of(node.start_mark.index)

    def _error(self, node: yaml.Node, path: FieldPath, message: str) -> None:
        line, col = self._start(node)
        self.diagnostics.append(Diagnostic(self.display, line, col, dotted(path), message))

    def _refused(self, node: yaml.Node, path: FieldPath) -> bool:
        """Report a node no spec may hold (an alias, a tag, an overlong number); True if so."""
        if isinstance(node, _AliasNode):
            self._error(node, path, "YAML aliases are not supported; write the value out")
            return True
        tag = _written_tag(node)
        if tag is not None:
            self._error(node, path, tag_problem(tag))
            return True
        if isinstance(node, yaml.ScalarNode) and node.tag in (_INT, _FLOAT):
            problem = digits_problem(node.value, node.tag == _INT)
            if problem:
                self._error(node, path, problem)
                return True
        return False

    def convert(self, node: yaml.Node, path: FieldPath) -> Any:
        self.values[path] = self._start(node)
        if self._refused(node, path):
            return None
        expected = {yaml.MappingNode: _MAP, yaml.SequenceNode: _SEQ}.get(type(node))
        # Untagged nodes resolve to these; anything else is a resolver bug, refused anyway.
        if expected and node.tag != expected or not expected and node.tag not in _SCALAR_TAGS:
            self._error(node, path, f"unsupported YAML tag {shown(node.tag)}")
            return None
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, (*path, i)) for i, item in enumerate(node.value)]
        return _scalar(node)

    def _mapping(self, node: yaml.MappingNode, path: FieldPath) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, _AliasNode) or _written_tag(key_node) is not None:
                self._refused(key_node, path)
                continue
            if key_node.tag == "tag:yaml.org,2002:merge" or getattr(key_node, "value", "") == "<<":
                self._error(key_node, path, "merge keys '<<' are not supported; write the keys out")
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                scalar = isinstance(key_node, yaml.ScalarNode)
                got = shown(key_node.value, quoted=False) if scalar else "a collection"
                self._error(key_node, path, f"keys must be strings, got {got}; quote it")
                continue
            key = key_node.value
            if key in out:
                first = self.keys[(*path, key)]
                self._error(
                    key_node, (*path, key), f"duplicate key (first at {first[0]}:{first[1]})"
                )
                continue
            self.keys[(*path, key)] = self._start(key_node)
            out[key] = self.convert(value_node, (*path, key))
        return out
