"""Located diagnostics: one message per violated rule, pointing at file:line:col.

Every user mistake moegen detects becomes a `Diagnostic`; stages collect them and
raise `SpecError` once, so a user sees every problem of a spec in one run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Diagnostic:
    """One problem in a spec file. `line` and `column` are 1-based."""

    file: str
    line: int
    column: int
    field: str
    message: str

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
    """A spec is invalid; carries every diagnostic found, in file order."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = sorted(diagnostics, key=lambda d: (d.file, d.line, d.column, d.field))
        super().__init__("\n".join(d.text() for d in self.diagnostics))


FORMATS = ("text", "json", "github")


def format_diagnostics(diagnostics: list[Diagnostic], fmt: str) -> str:
    """Render diagnostics for humans (`text`), machines (`json`) or GitHub Actions (`github`)."""
    if fmt == "json":
        return json.dumps([asdict(d) for d in diagnostics], indent=2)
    if fmt == "github":
        return "\n".join(d.github() for d in diagnostics)
    return "\n".join(d.text() for d in diagnostics)
