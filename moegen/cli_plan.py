"""`moegen plan SPEC`: every static quantity moegen derives from SPEC; with --compile the
full-size programs compiled for the target beside it, with --assigned XLA's buffer
assignment of them (moegen.verify.memory.assigned: the compiled peak in seconds). Registered on the
`moegen` group by moegen.cli."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from moegen.cli_output import EXIT_FAILED, fail_invalid, terminal_heartbeat, to_stderr
from moegen.diagnostics import SpecError

if TYPE_CHECKING:
    from moegen.plan import Plan
    from moegen.verify import Step


@click.command(name="plan")
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--compile",
    "compile_too",
    is_flag=True,
    help="Also compile the full-size layer for the target and show its memory beside the plan's.",
)
@click.option(
    "--assigned",
    is_flag=True,
    help="Also read XLA's buffer assignment of the full-size programs (TPU targets: the "
    "compiled peak, in seconds, stopped before code generation) and show it beside the plan's.",
)
def plan_command(spec: Path, as_json: bool, compile_too: bool, assigned: bool) -> None:
    """Print every static quantity moegen derives from SPEC."""
    from moegen.fit import ANNOUNCED
    from moegen.pipeline import generate
    from moegen.plan import format_plan
    from moegen.verify import Imported, MemoryVerdict, VerifyError, describe_step, verify

    # XLA's reads: where the ledger alone would have refused, and of the trades a TPU spec
    # leaves open, with the one chosen (moegen.fit.own_trade)
    reads: list[MemoryVerdict] = []

    def keep_read(spec: str, step: str, seconds: float, details: Step | None) -> None:
        if isinstance(details, MemoryVerdict) and step != ANNOUNCED:
            reads.append(details)

    try:
        generated = generate(spec, keep_read)
    except SpecError as err:
        fail_invalid(err)
    plan = generated.plan
    compiled: list[Step] = []
    if compile_too:
        try:
            with terminal_heartbeat():
                report = verify(generated.loaded, generated.source, plan=plan, run_twins=False)
        except VerifyError as err:
            to_stderr(f"compile failed:\n{err}")
            sys.exit(EXIT_FAILED)
        compiled = [s for s in report.steps if not isinstance(s, Imported)]
    figures, whole = {}, None
    if assigned:
        from moegen.verify import whole_layer, whole_layer_text

        try:
            with terminal_heartbeat():
                figures = assigned_figures(plan, generated.source)
                whole = whole_layer(generated.loaded, plan)
        except VerifyError as err:
            to_stderr(f"XLA's buffer assignment: {err}")
            sys.exit(EXIT_FAILED)
    if as_json:
        steps = [step.to_json() for step in compiled]
        extra = {"assigned": figures, "assigned_whole": whole} if assigned else {}
        if reads:
            extra["fit_read"] = reads[0].verdict
            extra["memory_reads"] = [{"step": r.step, "verdict": r.verdict} for r in reads]
        click.echo(json.dumps(plan.to_dict() | {"compiled": steps} | extra, indent=2))
        return
    click.echo(format_plan(plan))
    for read in reads:
        click.echo(f"  {read.step}: {read.verdict}")
    for step in compiled:
        click.echo(f"  {step.step:<26} {describe_step(step)}")
    if figures:
        click.echo(assigned_text(plan, figures))
    if whole:
        click.echo(f"  {whole_layer_text(whole)}")


GiB = 2**30


def assigned_figures(plan: Plan, source: str) -> dict[str, dict[str, float]]:
    """Each program's assigned bytes (argument, output, temp, peak) and seconds, of every
    shape ("forward", "forward+backward", then "forward (VARIANT)" ...); raises VerifyError
    (off TPU, a failed compile, the compiler's out-of-memory verdict)."""
    from moegen.verify import assigned_memory

    figures = {}
    for variant, _ in plan.shape_plans():
        label = f" ({variant})" if variant else ""
        for program, figure in assigned_memory(plan, source, variant=variant).items():
            figures[program + label] = {**dataclasses.asdict(figure), "peak": figure.peak}
    return figures


def assigned_text(plan: Plan, figures: dict[str, dict[str, float]]) -> str:
    """The figures beside the plan's ledger (each shape's own), as `moegen plan` prints them."""
    from moegen.verify import PROGRAMS

    planned, seconds = {}, 0.0
    for name, shape in plan.shape_plans():
        label = f" ({name})" if name else ""
        planned[f"forward{label}"] = shape.memory.forward_peak
        planned[f"forward+backward{label}"] = shape.memory.train_peak
        # a shape's two programs are read side by side, the shapes one after another
        seconds += max(figures[f"{program}{label}"]["seconds"] for program in PROGRAMS)
    lines = [f"XLA's buffer assignment (read before code generation, {seconds:.1f} s), per device:"]
    width = max(len(program) for program in figures)
    for program, figure in figures.items():
        error = planned[program] / figure["peak"] - 1
        lines.append(
            f"  {program:<{width}} {figure['peak'] / GiB:.2f} GiB"
            f" (the plan's ledger: {planned[program] / GiB:.2f} GiB, {error:+.1%})"
        )
    return "\n".join(lines)
