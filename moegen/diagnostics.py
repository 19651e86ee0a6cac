"""Located diagnostics: one message per violated rule, pointing at file:line:col.

Every user mistake moegen detects becomes a `Diagnostic`; stages collect them and
raise `SpecError` once, so a user sees every problem of a spec in one run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

# Enough to fix a spec by; thousands (5,000 unknown keys) only bury the first ones.
MAX_REPORTED = 100


def escape_unprintable(text: str) -> str:
    """`text` with every character that could end, forge or disguise a line written as a
    backslash escape (newlines, NUL, ESC, U+2028, bidirectional controls: everything
    `str.isprintable` refuses), so that a diagnostic is always one honest printable line."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


@dataclass(frozen=True)
class Diagnostic:
    """One problem in a spec file. `line` and `column` are 1-based."""

    file: str
    line: int
    column: int
    field: str
    message: str

    def __post_init__(self) -> None:
        # Defence in depth: whatever a stage echoes from the spec (a key, a value, a path),
        # the text, github and json forms all carry the same escaped, single-line strings.
        for name in ("file", "field", "message"):
            value = getattr(self, name)
            if not value.isprintable():
                object.__setattr__(self, name, escape_unprintable(value))

    def text(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )

    def github(self) -> str:
        """A GitHub Actions workflow command, escaped as the runner expects."""
        body = _escape_data(self.text())
        file = _escape_data(self.file).replace(":", "%3A").replace(",", "%2C")
        return f"::error file={file},line={self.line},col={self.column}::{body}"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


class SpecError(Exception):
    """A spec is invalid; carries every diagnostic found (the first MAX_REPORTED of them, then
    one that counts the rest, at the first one left out), in file order."""

    def __init__(self, diagnostics: list[Diagnostic]):
        ordered = sorted(diagnostics, key=lambda d: (d.file, d.line, d.column, d.field))
        if len(ordered) > MAX_REPORTED + 1:
            first_left_out = ordered[MAX_REPORTED]
            more = Diagnostic(
                first_left_out.file,
                first_left_out.line,
                first_left_out.column,
                "",
                f"... and {len(ordered) - MAX_REPORTED} more problems, from here on; "
                "fix the ones above first",
            )
            ordered = [*ordered[:MAX_REPORTED], more]
        self.diagnostics = ordered
        super().__init__("\n".join(d.text() for d in self.diagnostics))


FORMATS = ("text", "json", "github")


def format_diagnostics(diagnostics: list[Diagnostic], fmt: str) -> str:
    """Render diagnostics for humans (`text`), machines (`json`) or GitHub Actions (`github`)."""
    if fmt == "json":
        return json.dumps([asdict(d) for d in diagnostics], indent=2)
    if fmt == "github":
        return "\n".join(d.github() for d in diagnostics)
    return "\n".join(d.text() for d in diagnostics)
