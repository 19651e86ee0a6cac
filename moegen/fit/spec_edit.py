"""A spec's memory fields set in its own text, every other byte kept.

`moegen build --take-fitting-trade` writes the trade it took into the user's spec, so that
the spec alone says what the committed module runs (`moegen check` regenerates it from the
spec). A field already written has its value replaced where it stands; one left out is
written as a key of the `memory` mapping (block or flow), or in a `memory` mapping of its own
at the end of the document. Each edit is read back by the loader: text it cannot place (a
layout this does not know) is never written; the caller says what to write by hand.
"""

from __future__ import annotations

import re
from pathlib import Path

from moegen.diagnostics import SpecError
from moegen.load import FieldPath, LoadedSpec, load_spec_bytes

SECTION = "memory"
# A scalar as it stands in the text: quoted, or plain up to a separator or a comment.
_SCALAR = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\"|[^\s,}\]#]+")


class CannotEdit(ValueError):
    """The spec's layout leaves no place this edit knows for a field."""


def with_memory_fields(loaded: LoadedSpec, values: dict[FieldPath, int | str]) -> LoadedSpec:
    """`loaded` as it reads with each memory field (`("memory", "token_chunks")`) set to its
    value, one edit at a time; raises CannotEdit where an edit does not read back as set."""
    for path, value in values.items():
        if len(path) != 2 or path[0] != SECTION:
            raise CannotEdit(f"not a memory field: {path!r}")
        key = str(path[1])
        loaded = _reread(loaded, _with_field(loaded, key, str(value)))
        if path not in loaded.locations.values or getattr(loaded.spec.memory, key) != value:
            raise CannotEdit(f"memory.{key} does not read back as {value}")
    return loaded


def _reread(loaded: LoadedSpec, text: str) -> LoadedSpec:
    source = loaded.source
    try:
        return load_spec_bytes(
            text.encode("utf-8"), source.display, source.name, Path(source.display).parent
        )
    except SpecError as err:
        raise CannotEdit(err.diagnostics[0].message) from None


def _with_field(loaded: LoadedSpec, key: str, value: str) -> str:
    """The text with memory.`key` set to `value` (replaced, or inserted)."""
    values = loaded.locations.values
    text = loaded.source.text
    newline = "\r\n" if "\r\n" in text else "\n"
    if (SECTION, key) in values:
        line, col = values[(SECTION, key)]
        return _replaced(text, line, col, value)
    if (SECTION,) in values:
        line, col = values[(SECTION,)]
        row = _row(text, line)
        start = col - 1 + _bom(text, line)
        if row.startswith("{", start):  # flow mapping: first entry after the brace
            rest = row[start + 1 :].lstrip()
            entry = f"{key}: {value}" + ("" if rest.startswith("}") else ", ")
            return _inserted(text, line, start + 1, entry)
        # block mapping: its value starts at its first key; a line of its own before it
        return _inserted(text, line, start, f"{key}: {value}{newline}{' ' * (col - 1)}")
    return _appended_section(loaded, key, value, newline)


def _appended_section(loaded: LoadedSpec, key: str, value: str, newline: str) -> str:
    """A `memory` mapping of its own at the end, indented as the document's other keys."""
    text = loaded.source.text
    tops = [loc for path, loc in loaded.locations.keys.items() if len(path) == 1]
    if not tops:
        raise CannotEdit("the document has no top-level key to place memory beside")
    line, col = min(tops)
    # a key at the first column opens no mapping's brace (col - 2 would read the row's end)
    if col > 1 and _row(text, line).startswith("{", col - 2 + _bom(text, line)):
        raise CannotEdit("the document is one flow mapping")
    indent = " " * (col - 1)
    ending = "" if not text or text.endswith("\n") else newline
    return f"{text}{ending}{indent}{SECTION}:{newline}{indent}  {key}: {value}{newline}"


def _replaced(text: str, line: int, col: int, value: str) -> str:
    lines = text.split("\n")
    row = lines[line - 1]
    start = col - 1 + _bom(text, line)
    found = _SCALAR.match(row, start)
    if found is None:
        raise CannotEdit(f"no scalar at line {line}, column {col}")
    lines[line - 1] = row[:start] + value + row[found.end() :]
    return "\n".join(lines)


def _inserted(text: str, line: int, at: int, new: str) -> str:
    lines = text.split("\n")
    row = lines[line - 1]
    lines[line - 1] = row[:at] + new + row[at:]
    return "\n".join(lines)


def _row(text: str, line: int) -> str:
    return text.split("\n")[line - 1]


def _bom(text: str, line: int) -> int:
    """Columns count from after a leading byte-order mark, on the first line."""
    return 1 if line == 1 and text.startswith("\ufeff") else 0
