"""`moegen rebalance SPEC --load FILE`: the redundant-expert placement a measured load asks
for (moegen.placement), with each device's expected rows before and after. Registered on
the `moegen` group by moegen.cli."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from moegen.cli_output import fail_invalid
from moegen.diagnostics import SpecError

EXIT_FAILED = 2  # a load file or a spec that cannot be placed for


@click.command(name="rebalance")
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--load",
    "load_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A load file: aux.tokens_per_expert summed over steps (moegen.placement.save_load).",
)
@click.option(
    "--slots",
    default=1,
    show_default=True,
    type=click.IntRange(0, 1024),
    help="Extra expert slots per device.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the placement (each device's experts) to this JSON file.",
)
def rebalance_command(spec: Path, load_path: Path, slots: int, out: Path | None) -> None:
    """Place SLOTS extra expert slots per device for the load of SPEC's layer, and print each
    device's expected rows before and after."""
    from moegen.pipeline import load_valid
    from moegen.placement import LoadError, contiguous, place, read_load
    from moegen.plan import make_plan

    try:  # the plan only: nothing is rendered or compiled
        plan = make_plan(load_valid(spec))
    except SpecError as err:
        fail_invalid(err)
    devices, experts = plan.experts.shards, plan.num_experts
    if plan.mesh.expert_axis is None:
        _fail(
            f"{spec}: no expert axis: every device holds every expert, so extra slots "
            "spread nothing"
        )
    try:
        load = read_load(load_path, experts)
        placement = place(load, devices, slots)
    except (LoadError, ValueError) as err:
        _fail(str(err))
    before, after = contiguous(experts, devices).rows(load), placement.rows(load)
    click.echo(
        f"{spec}: {experts} experts over {plan.mesh.expert_axis} {devices}, "
        f"{slots} extra slot(s) per device"
    )
    click.echo(
        "placement: each extra replica to the expert with the most copies per replica, then "
        "the replicas, heaviest first, each to the least-loaded device"
    )
    click.echo(f"{'device':>6}  {'rows before':>12}  {'rows after':>12}  experts after")
    for device, (was, now) in enumerate(zip(before, after, strict=True)):
        held = ", ".join(str(e) for e in placement.slots[device])
        click.echo(f"{device:>6}  {was:>12.1f}  {now:>12.1f}  {held}")
    mean = sum(load) / devices
    click.echo(
        f"busiest device: {max(before) / mean:.3f}x the mean before, {max(after) / mean:.3f}x after"
    )
    if out is not None:
        from moegen.emit import write_all

        write_all({out: json.dumps(placement.as_json()) + "\n"})
        click.echo(f"wrote {out}")


def _fail(message: str) -> None:
    click.echo(f"moegen rebalance: {message}; nothing written", err=True)
    sys.exit(EXIT_FAILED)
