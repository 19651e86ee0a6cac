"""How the command line refuses an invalid spec: its diagnostics, then exit 3. Shared by
moegen.cli and the commands it registers from other modules (moegen.cli_init)."""

from __future__ import annotations

import sys

import click

from moegen.diagnostics import SpecError, format_diagnostics

EXIT_INVALID = 3


def fail_invalid(err: SpecError, fmt: str = "text") -> None:
    click.echo(format_diagnostics(err.diagnostics, fmt), err=fmt == "text")
    sys.exit(EXIT_INVALID)
