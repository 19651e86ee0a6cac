"""`moegen tune`: choose a spec's `auto` values by compiling each candidate for the target;
registered in the `moegen` group by moegen.cli."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import click

from moegen.cli_output import EXIT_FAILED, fail_invalid, to_stderr
from moegen.diagnostics import SpecError


def _a_number(value: float, param: click.Parameter) -> float:
    """click's FloatRange lets NaN through (every comparison with it is false)."""
    if math.isnan(value):
        raise click.BadParameter("nan is not a number of seconds", param=param)
    return value


@click.command(name="tune")
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print the patch instead of rewriting SPEC.")
@click.option(
    "--budget",
    "budget_s",
    default=240.0,
    show_default=True,
    type=click.FloatRange(1, 3600),
    callback=lambda ctx, param, value: _a_number(value, param),
    help="Seconds after which no further candidate is compiled.",
)
def tune_command(spec: Path, dry_run: bool, budget_s: float) -> None:
    """Choose SPEC's `auto` values by compiling each candidate for the target (memory trades
    alone, on TPU: by XLA's buffer assignment of each, fastest first)."""
    from moegen.emit import rewrite_in_place
    from moegen.fit import NOT_READ
    from moegen.load import load_spec
    from moegen.tune import patch, tune, yaml_value
    from moegen.verify import MissingVerifier

    def progress(i: int, n: int, candidate: Any) -> None:
        choice = _choice_text(candidate.choices, yaml_value)
        if candidate.problem == NOT_READ:
            return  # the table lists them
        if candidate.problem:
            to_stderr(f"  [{i}/{n}] {choice}: {candidate.problem}")
        else:
            how = "compiled" if candidate.peak_by == "compiler" else f"{candidate.peak_by} read"
            to_stderr(
                f"  [{i}/{n}] {choice}: {how} in {candidate.seconds:.1f} s, "
                f"peak {candidate.peak_bytes / 2**30:.2f} GiB"
            )

    try:
        loaded = load_spec(spec)
        to_stderr(f"{loaded.source.display}: tuning {len(loaded.spec.auto_fields())} choice(s)")
        result = tune(loaded, budget_s=budget_s, on_candidate=progress)
    except SpecError as err:
        fail_invalid(err)
    except MissingVerifier as err:
        to_stderr(f"cannot compile here; the spec is unchanged:\n{err}")
        sys.exit(EXIT_FAILED)
    unit = result.unit
    click.echo(f"{'candidate':<60} {'FLOPs':>11} {'bytes':>11} {'peak GiB':>9} {'score':>12}")
    for c in sorted(result.candidates, key=lambda c: c.score):
        click.echo(_tune_row(c, c is result.winner, unit, _choice_text(c.choices, yaml_value)))
    click.echo(_tune_footnote(result.candidates))
    if result.winner is None:
        to_stderr("no candidate fit the target; the spec is unchanged")
        sys.exit(EXIT_FAILED)
    if dry_run:
        click.echo(patch(loaded, result.new_text), nl=False)
        return
    try:
        rewrite_in_place(spec, result.new_text, was=loaded.source.text)
    except (OSError, UnicodeError) as err:
        choice = _choice_text(result.winner.choices, yaml_value)
        to_stderr(
            f"cannot write {loaded.source.display}, left as it is: {err}; write by hand: {choice}"
        )
        sys.exit(EXIT_FAILED)
    to_stderr(f"wrote {loaded.source.display}: {_choice_text(result.winner.choices, yaml_value)}")


def _tune_row(c: Any, chosen: bool, unit: str, choice: str) -> str:
    """One candidate: the figures it was scored by ('-' where none), and its problem."""
    scored = c.score != float("inf")
    counts = f"{c.flops:>11.3e} {c.bytes_accessed:>11.3e}" if scored else f"{'-':>11} {'-':>11}"
    peak = f"{c.peak_bytes / 2**30:>9.2f}" if c.peak_bytes else f"{'-':>9}"
    score = "-" if not scored else f"{c.score * 1e3:.3f} ms" if unit == "s" else f"{c.score:.3e} B"
    mark = "  <- chosen" if chosen else f"  {c.problem}" if c.problem else ""
    return f"{choice:<60} {counts} {peak} {score:>12}{mark}"


def _tune_footnote(candidates: list[Any]) -> str:
    """Whose figures the table shows: the plan's counts where a candidate loops, and the
    compiler's peak or XLA's buffer assignment of it."""
    from moegen.fit import READ_BY

    if any(c.peak_by == READ_BY for c in candidates):
        return (
            "FLOPs and bytes are the plan's (the main shape's), the score its step time "
            "(moegen.plan.step_time); candidates are read fastest first, each peak is "
            f"{READ_BY} of its "
            "full-size programs (every shape's, the largest: the compiled peak, read before "
            "code generation), and none after the first that fits HBM is read. `moegen build` "
            "compiles the chosen one in full."
        )
    if any(c.counted_by == "plan" for c in candidates):
        return (
            "FLOPs and bytes are the plan's, for every candidate, and the score its step time: "
            "XLA's cost analysis counts a loop's body once, and some candidates loop (token "
            "chunks, FFN slices, ring steps); the peak is the compiler's."
        )
    return "FLOPs, bytes and the peak are the compiler's."


def _choice_text(choices: dict, to_yaml: Any) -> str:
    return ", ".join(f"{'.'.join(map(str, path))}={to_yaml(v)}" for path, v in choices.items())
