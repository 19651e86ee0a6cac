"""What the command line's commands share: how an invalid spec is refused (its diagnostics,
then exit 3) and the heartbeat of a verify step on a terminal. Shared by moegen.cli and the
commands it registers from other modules (moegen.cli_init, moegen.cli_plan)."""

from __future__ import annotations

import contextlib
import sys

import click

from moegen.diagnostics import SpecError, format_diagnostics

EXIT_INVALID = 3  # the spec is invalid
EXIT_FAILED = 4  # a verification (a compile, a twin) failed


def fail_invalid(err: SpecError, fmt: str = "text") -> None:
    click.echo(format_diagnostics(err.diagnostics, fmt), err=fmt == "text")
    sys.exit(EXIT_INVALID)


def to_stderr(message: str) -> None:
    click.echo(message, err=True)


def terminal_heartbeat(name_modules: bool = False) -> contextlib.AbstractContextManager[None]:
    """A line every MOEGEN_HEARTBEAT_S seconds (default 20) on stderr while a verify step
    runs, when stderr is a terminal; elsewhere (CI, a pipe, a file) the output stays as is."""
    if not sys.stderr.isatty():
        return contextlib.nullcontext()
    from moegen.verify import heartbeat

    return heartbeat.enabled(to_stderr, heartbeat.interval_from_env(), name_modules)
