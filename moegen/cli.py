"""The `moegen` command line. Exit codes: 0 ok, 1 stale output, 2 usage, 3 invalid spec,
4 verification failure or internal error; 128 + the signal's number when SIGINT (130),
SIGHUP (129) or SIGTERM (143) aborted it, the shell's own convention for a process that a
signal ended, after the same clean-up for all three (moegen.interrupts): the output holds
the old set or the new one, and no temporary or verify worker is left."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from moegen import __version__
from moegen.cli_init import init_command
from moegen.cli_output import EXIT_FAILED, EXIT_INVALID, fail_invalid, terminal_heartbeat
from moegen.cli_plan import plan_command
from moegen.cli_rebalance import rebalance_command
from moegen.cli_tune import tune_command
from moegen.diagnostics import FORMATS, SpecError, format_diagnostics

if TYPE_CHECKING:  # imported where used: `moegen validate` must not pay for verify
    from moegen.verify import Step

EXIT_OK, EXIT_STALE, EXIT_USAGE = 0, 1, 2
SCHEMA_PATH = Path("specs/moegen.schema.json")

spec_paths = click.argument(
    "specs", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)


out_dir_option = click.option(
    "--out",
    "out_dir",
    default="generated",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where generated modules live.",
)


def _err(message: str) -> None:
    click.echo(message, err=True)


_terminal_heartbeat = terminal_heartbeat  # the verify steps' heartbeat (moegen.cli_output)


def _fail_invalid(err: SpecError, fmt: str = "text") -> None:
    fail_invalid(err, fmt)


# `moegen --help` lists the commands in the order a user meets them, then the rest by name.
WORKFLOW = ("init", "validate", "plan", "build", "check")


class WorkflowGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return [n for n in WORKFLOW if n in names] + [n for n in names if n not in WORKFLOW]


@click.group(cls=WorkflowGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="moegen")
def cli() -> None:
    """moegen: verified JAX Mixture-of-Experts layers from YAML specs.

    \b
    The usual order: init -> validate -> plan -> build -> check (in CI).
    """


@cli.command()
@click.argument(
    "specs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@out_dir_option
@click.option("--no-verify", is_flag=True, help="Skip the twin parity run and the compile.")
@click.option("--jobs", "-j", default=1, type=click.IntRange(1, 64), help="Specs verified at once.")
@click.option("--reverify", is_flag=True, help="Verify again though a record of the module passed.")
@click.option("--no-cache", is_flag=True, help="No verification records, no compilation cache.")
@click.option(
    "--take-fitting-trade",
    is_flag=True,
    help="Where a TPU layer runs out of HBM as planned (by XLA's read or the full compile), "
    "or its compile crashes the compiler, take the plan's fastest other memory trade that "
    "XLA's buffer assignment fits, and write it into the spec.",
)
def build(
    specs: tuple[Path, ...],
    out_dir: Path,
    no_verify: bool,
    jobs: int,
    reverify: bool,
    no_cache: bool,
    take_fitting_trade: bool,
) -> None:
    """Generate, verify and write the module of each SPEC (all or nothing). A module that
    passed before (same bytes but for description and header) reuses its recorded verdict."""
    from moegen.cli_output import verify_cache
    from moegen.pipeline import SpecNotRewritten
    from moegen.pipeline import build as run_build
    from moegen.pipeline import take_fitting_trade as refit
    from moegen.render import RenderError
    from moegen.verify import MissingVerifier, Reused, VerifyError, describe_step

    current: list[str] = []
    replayed: set[str] = set()  # specs whose steps are a record's, not this run's

    def progress(spec: str, step: str, seconds: float, details: Step | None) -> None:
        if current[-1:] != [spec]:
            current.append(spec)
            _err(spec)
        recorded = "(recorded) " if spec in replayed else ""
        if isinstance(details, Reused):
            replayed.add(spec)
        _err(f"  {step:<40} {seconds:7.2f} s  {recorded}{describe_step(details)}".rstrip())

    cache = verify_cache(verifying=not no_verify, no_cache=no_cache, reverify=reverify)
    try:
        paths, verifying = list(specs), not no_verify
        with _terminal_heartbeat(name_modules=jobs > 1 and len(paths) > 1):
            results = run_build(
                paths,
                out_dir,
                run_verify=verifying,
                progress=progress,
                jobs=jobs,
                cache=cache,
                refit=refit if take_fitting_trade else None,
            )
    except SpecError as err:
        _fail_invalid(err)
    except MissingVerifier as err:
        _err(f"cannot verify here; nothing written:\n{err}")
        sys.exit(EXIT_FAILED)
    except (VerifyError, RenderError) as err:
        _err(f"verification failed; nothing written:\n{err}")
        sys.exit(EXIT_FAILED)
    except SpecNotRewritten as err:
        _err(f"wrote the modules, but cannot write the trade taken into {err}")
        sys.exit(EXIT_FAILED)
    except (OSError, UnicodeError) as err:
        _err(f"cannot write the generated files; nothing changed: {err}")
        sys.exit(EXIT_FAILED)
    for target, generated in results:
        _err(f"  wrote {target}" + ("" if not no_verify else " (not verified)"))
        if generated.retraded:
            _err(f"  wrote {generated.loaded.source.display}: the memory trade taken")


@cli.command(name="validate")
@spec_paths
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
def validate_command(specs: tuple[Path, ...], fmt: str) -> None:
    """Check SPECs (default: every spec in specs/) and report every problem, located; a
    spec whose plan cannot fit its target's HBM is one. Nothing is compiled: where XLA's
    buffer assignment decides the fit (a TPU target), validate says that `moegen plan` and
    `moegen build` read it."""
    from moegen.pipeline import default_specs, load_planned

    diagnostics, notes = [], []
    paths = list(specs) or _default_specs_or_exit(default_specs)
    for path in paths:
        try:
            notes += load_planned(path)[1]
        except SpecError as err:
            diagnostics.extend(err.diagnostics)
    if diagnostics:
        click.echo(format_diagnostics(diagnostics, fmt), err=fmt == "text")
        sys.exit(EXIT_INVALID)
    if fmt == "json":
        click.echo("[]")
    elif fmt == "text":
        for note in notes:
            _err(f"note: {note}")
        _err(f"{len(paths)} spec(s) valid")


def _default_specs_or_exit(default_specs: Any) -> list[Path]:
    """Every spec in specs/; none there is a usage mistake (a run in the wrong directory), not
    a pass."""
    found = default_specs()
    if not found:
        _err(
            "no specs to check: specs/ holds no *.yaml here; pass spec files, or run in the "
            "directory that holds specs/"
        )
        sys.exit(EXIT_USAGE)
    return found


@cli.command(name="check")
@spec_paths
@out_dir_option
def check_command(specs: tuple[Path, ...], out_dir: Path) -> None:
    """Fail when a spec is invalid or a committed module is stale, missing or orphaned."""
    from moegen.check import check
    from moegen.pipeline import default_specs

    paths = list(specs) or _default_specs_or_exit(default_specs)
    report = check(paths, out_dir, find_orphans=not specs)
    if report.invalid:
        _err(format_diagnostics(report.invalid, "text"))
    for path, diff in report.stale.items():
        if diff:
            click.echo(diff)
        notes = "".join(f"{note}; " for note in report.notes.get(path, []))
        _err(f"stale: {path} ({notes}run `moegen build` on its spec)")
    for path in report.missing:
        _err(f"missing: {path} (run `moegen build` on its spec)")
    for path, why in report.unreadable.items():
        _err(f"unreadable: {path}: {why} (delete it, then run `moegen build` on its spec)")
    for path in report.orphans:
        _err(f"orphaned: {path} (no spec generates it; delete it or restore its spec)")
    if report.invalid:
        sys.exit(EXIT_INVALID)
    if not report.ok:
        sys.exit(EXIT_STALE)
    _err(f"{len(report.fresh)} generated module(s) fresh")


@cli.command(name="schema")
@click.option("--check", "check_only", is_flag=True, help="Fail if the schema file is stale.")
@click.option("--write", is_flag=True, help="Write the schema file.")
@click.option(
    "--path",
    "schema_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=SCHEMA_PATH,
    show_default=True,
    help="The schema file that --check and --write use.",
)
def schema_command(check_only: bool, write: bool, schema_path: Path) -> None:
    """Print the spec's JSON Schema (for editors via yaml-language-server)."""
    from moegen.schema import schema_text
    from moegen.schema_file import SchemaPathError, check_file, shown, write_file

    text = schema_text()
    if not (check_only or write):
        click.echo(text, nl=False)
        return
    # --path is the user's: a path that cannot be read or written is their mistake, told
    # located with `moegen init`'s exit code (2), not an internal error
    try:
        if write and not check_only:
            write_file(schema_path, text)
            _err(f"wrote {shown(schema_path)}")
            return
        verdict, note = check_file(schema_path, text)
    except SchemaPathError as err:
        _err(f"moegen schema: {err}" + ("" if check_only else "; nothing written"))
        sys.exit(EXIT_USAGE)
    if verdict == "fresh":
        _err(f"{shown(schema_path)} is fresh")
        return
    path_option = "" if schema_path == SCHEMA_PATH else f" --path {shown(schema_path, shell=True)}"
    fix = f"moegen schema --write{path_option}"
    _err(f"{verdict}: {shown(schema_path)} ({note + '; ' if note else ''}run `{fix}`)")
    sys.exit(EXIT_STALE)


cli.add_command(init_command)  # moegen.cli_init
cli.add_command(rebalance_command)  # moegen.cli_rebalance
cli.add_command(plan_command)  # moegen.cli_plan
cli.add_command(tune_command)  # moegen.cli_tune


@cli.command(name="install-te")
@click.option("--cache-only", is_flag=True, help="Fill the cache only, install nothing.")
@click.argument("venv", required=False, type=click.Path(file_okay=False, path_type=Path))
def install_te_command(cache_only: bool, venv: Path | None) -> None:
    """Build Transformer Engine (JAX) into VENV (default: this one) to lower `kernel: te`."""
    from moegen.install_te import command

    sys.exit(command(venv, cache_only=cache_only))


def main() -> None:
    from moegen.interrupts import handling_signals, interrupt_of

    try:
        with handling_signals():
            cli.main(standalone_mode=False)
    except click.exceptions.Abort as err:  # click's wrapper of KeyboardInterrupt and EOFError
        signum = interrupt_of(err)
        _err("aborted" if signum is None else f"aborted ({signal.Signals(signum).name})")
        sys.exit(EXIT_FAILED if signum is None else 128 + signum)
    except KeyboardInterrupt as err:  # raised outside click's own handling
        signum = interrupt_of(err) or signal.SIGINT
        _err(f"aborted ({signal.Signals(signum).name})")
        sys.exit(128 + signum)
    except click.ClickException as err:
        err.show()
        sys.exit(EXIT_USAGE)
    except SystemExit:
        raise
    except Exception as err:  # a moegen bug, not a user mistake
        _err(f"moegen: internal error: {type(err).__name__}: {err}")
        if os.environ.get("MOEGEN_DEBUG"):
            traceback.print_exc()
        else:
            _err("(set MOEGEN_DEBUG=1 for the traceback; please report it)")
        sys.exit(EXIT_FAILED)
