"""What the command line's commands share: how an invalid spec is refused (its diagnostics,
then exit 3), the heartbeat of a verify step on a terminal, and the word on caches that are
off. Shared by moegen.cli and the commands it registers from other modules (moegen.cli_init,
moegen.cli_plan)."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

import click

from moegen.diagnostics import SpecError, format_diagnostics

if TYPE_CHECKING:  # imported where used: `moegen validate` must not pay for verify
    from moegen.verify import VerifyCache

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
    from moegen.verify import heartbeat_enabled, heartbeat_interval

    return heartbeat_enabled(to_stderr, heartbeat_interval(), name_modules)


def verify_cache(*, verifying: bool, no_cache: bool, reverify: bool) -> VerifyCache | None:
    """What a build's verifications may use of moegen's caches (None: --no-cache). Where one
    is off that the user did not turn off (a state directory others can write, a link in the
    cache), one line says so before anything is verified, with why and the fix: otherwise
    every build would verify every spec again, minutes each, and never say why."""
    from moegen.verify import VerifyCache, caching_off

    if no_cache:
        return None
    notice = caching_off() if verifying else None
    if notice is not None:
        to_stderr(f"moegen: {notice}")
    return VerifyCache(reuse=not reverify)
