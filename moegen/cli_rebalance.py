"""`moegen rebalance SPEC --load FILE`: the redundant-expert placement a measured load asks
for (moegen.placement), with each device's expected rows before and after, and with --out
the placement file the spec names (`parallelism.placement`). Registered on the `moegen`
group by moegen.cli."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from moegen.cli_output import fail_invalid
from moegen.diagnostics import SpecError

if TYPE_CHECKING:
    from moegen.placement import Placement
    from moegen.plan import Plan

EXIT_FAILED = 2  # a load file, a request or an --out that cannot be used
ALGORITHM = (
    "water-filling towards the mean: the busiest device gives 1024ths of its experts' copies "
    "to replicas on devices under the mean (moegen.placement)"
)


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
    default=None,
    type=click.IntRange(0, 4096),
    help="Extra expert slots per device (default: the spec's, if it has redundant experts, "
    "else 1).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the placement to this JSON file beside SPEC, for `placement: NAME.json`.",
)
def rebalance_command(spec: Path, load_path: Path, slots: int | None, out: Path | None) -> None:
    """Place SLOTS extra expert slots per device for the load of SPEC's layer, and print each
    device's expected rows before (the spec's placement, or none) and after."""
    from moegen.pipeline import load_valid
    from moegen.placement import LoadError, place, read_load
    from moegen.plan import make_plan

    try:  # the plan only: nothing is rendered or compiled
        plan = make_plan(load_valid(spec))
    except SpecError as err:
        fail_invalid(err)
    devices = plan.experts.shards
    if plan.mesh.expert_axis is None:
        _fail(
            f"{spec}: no expert axis: every device holds every expert, so extra slots "
            "spread nothing"
        )
    if slots is None:  # the spec's slots, so that a rebalance keeps the layer's shapes
        replicas = plan.experts.replicas
        slots = replicas.extra_per_device if replicas.active else 1
    if out is not None:
        _check_out(out, spec, load_path, slots * devices)
    try:
        load = read_load(load_path, plan.num_experts)
        placement = place(load, devices, slots)
    except (LoadError, ValueError) as err:
        _fail(str(err))
    before = _current(plan)
    _report(spec, plan, load, before, placement)
    if out is not None:
        _write(out, spec, load_path, placement, load, before)
        _note_the_strategy(plan.experts.strategy)


def _current(plan: Plan) -> Placement:
    """The spec's placement as the layer runs it: its replicas, or the experts alone."""
    from moegen.placement import Placement, contiguous

    replicas = plan.experts.replicas
    if not replicas.active:
        return contiguous(plan.num_experts, plan.experts.shards)
    extra = tuple(
        tuple(zip(experts, shares, strict=True))
        for experts, shares in zip(replicas.experts, replicas.shares, strict=True)
    )
    return Placement(plan.num_experts, plan.experts.shards, extra)


def _check_out(out: Path, spec: Path, load_path: Path, redundant: int) -> None:
    """Refuse, before anything is computed or written, an --out the spec could not name."""
    from moegen.spec_parallelism import MAX_REDUNDANT_EXPERTS, PLACEMENT_FILE_PATTERN

    if os.path.realpath(out.parent) != os.path.realpath(spec.parent):
        _fail(
            f"--out {out}: the placement file must be beside the spec "
            f"({spec.parent.as_posix()}/), where `placement: NAME.json` looks for it"
        )
    if not re.fullmatch(PLACEMENT_FILE_PATTERN, out.name):
        _fail(
            f"--out {out.name!r}: a spec names a placement file by a plain name matching "
            f"{PLACEMENT_FILE_PATTERN} (letters, digits, _ . -, ending in .json)"
        )
    if os.path.realpath(out) == os.path.realpath(load_path):
        _fail(f"--out {out}: that is the load file; write the placement to another name")
    if redundant == 0:
        _fail(
            "--slots 0 places no replicas, so there is no placement to write: remove "
            "redundant_experts and placement from the spec instead"
        )
    if redundant > MAX_REDUNDANT_EXPERTS:
        _fail(
            f"{redundant} redundant experts: a spec takes at most {MAX_REDUNDANT_EXPERTS}; "
            "ask for fewer --slots"
        )


def _report(spec: Path, plan: Plan, load: list[float], before: Placement, after: Placement) -> None:
    devices, slots = plan.experts.shards, len(after.extra[0])
    click.echo(
        f"{spec}: {plan.num_experts} experts over {plan.mesh.expert_axis} {devices}, "
        f"{slots} extra slot(s) per device; {sum(load):.6g} copies in the load"
    )
    click.echo(f"placement: {ALGORITHM}")
    was = "the spec's placement" if plan.experts.replicas.active else "no redundant experts"
    click.echo(f"before: {was}; after: this placement (rows are predictions from the load)")
    click.echo(f"{'device':>6}  {'rows before':>12}  {'rows after':>12}  extra slots after")
    for device, (rows_before, rows_after) in enumerate(
        zip(before.rows(load), after.rows(load), strict=True)
    ):
        held = ", ".join(f"{e}: {units}/1024" for e, units in after.extra[device])
        click.echo(f"{device:>6}  {rows_before:>12.1f}  {rows_after:>12.1f}  {held or '-'}")
    click.echo(
        f"busiest device: {before.busiest_over_mean(load):.3f}x the mean before, "
        f"{after.busiest_over_mean(load):.3f}x after"
    )


def _write(
    out: Path,
    spec: Path,
    load_path: Path,
    placement: Placement,
    load: list[float],
    before: Placement,
) -> None:
    """The placement file, atomically (moegen.emit), and the spec lines that name it."""
    from moegen.emit import write_all

    slots = len(placement.extra[0])
    source = (
        f"moegen rebalance {spec.name} --load {load_path.name} --slots {slots}: busiest "
        f"device {before.busiest_over_mean(load):.3f}x -> "
        f"{placement.busiest_over_mean(load):.3f}x the mean, predicted from the load"
    )
    text = _placement_text(placement.as_json(source))
    try:
        write_all({out: text})
    except OSError as err:
        _fail(f"--out {out}: cannot be written: {err.strerror or err}")
    click.echo(f"wrote {out}; in {spec.name}'s parallelism section:")
    click.echo(f"  redundant_experts: {slots * placement.devices}")
    click.echo(f"  placement: {out.name}")


def _note_the_strategy(name: str) -> None:
    """The placement is written either way: the user may be about to switch strategies."""
    from moegen.strategies import strategy

    if not strategy(name).carries_replicas:
        click.echo(
            f"note: strategy {name} cannot carry redundant experts yet; the spec needs "
            "parallelism.experts: ragged_all_to_all for them"
        )


def _placement_text(data: dict) -> str:
    """The placement file's JSON with a line per device, for people who read or diff it."""
    devices = ",\n  ".join(json.dumps(slots) for slots in data["placement"])
    header = ",\n ".join(
        f"{json.dumps(k)}: {json.dumps(v)}" for k, v in data.items() if k != "placement"
    )
    return f'{{\n {header},\n "placement": [\n  {devices}\n ]\n}}\n'


def _fail(message: str) -> None:
    click.echo(f"moegen rebalance: {message}; nothing written", err=True)
    sys.exit(EXIT_FAILED)
