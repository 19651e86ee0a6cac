"""`moegen init`: a spec from a commented starter, or from a transformers model's
config.json (--from-hf, with the placement flags). Registered on the `moegen` group by
moegen.cli."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from moegen.cli_output import fail_invalid
from moegen.diagnostics import SpecError

SIZE = click.IntRange(1, 2**31 - 1)  # a spec's sizes are int32


def _hardware_names() -> list[str]:
    """The spec's target.hardware values (the schema's, so that the two never differ)."""
    from typing import get_args

    from moegen.spec import Target

    return list(get_args(Target.model_fields["hardware"].annotation))


def _mesh_axes(ctx: click.Context, param: click.Parameter, text: str | None) -> dict | None:
    """--mesh data=2,expert=4 -> {"data": 2, "expert": 4}, major to minor."""
    if text is None:
        return None
    axes: dict[str, int] = {}
    for item in text.split(","):
        name, _, size = item.strip().partition("=")
        if name in axes:  # a mesh has each axis once; which size was meant is not ours to pick
            raise click.BadParameter(
                f"{item!r}: the axis {name!r} is given twice; give each axis once, "
                "e.g. data=2,expert=4"
            )
        # ASCII digits: "²" is a digit to str.isdigit, and int() raises on it
        if not name.isidentifier() or not (size.isascii() and size.isdigit()) or len(size) > 9:
            raise click.BadParameter(f"{item!r}: write NAME=SIZE pairs, e.g. data=2,expert=4")
        axes[name] = int(size)
    return axes


@click.command(name="init")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--model", default="cpu", show_default=True, help="Starter (see --list).")
@click.option("--no-schema", is_flag=True, help="Do not write moegen.schema.json beside PATH.")
@click.option("--list", "list_starters", is_flag=True, help="List the starters and exit.")
@click.option(
    "--from-hf",
    "from_hf",
    type=click.Path(path_type=Path),
    help="A transformers config.json (or its folder): write the specs of its MoE layers "
    "(PATH default specs/MODEL_TYPE.yaml).",
)
@click.option(
    "--hardware",
    type=click.Choice(_hardware_names()),
    help="--from-hf: target.hardware (default cpu).",
)
@click.option("--topology", help="--from-hf: target.topology, e.g. 2x4 (TPU) or 8 (GPUs).")
@click.option(
    "--mesh",
    callback=_mesh_axes,
    help="--from-hf: mesh axes, e.g. data=2,expert=4 (default data=2).",
)
@click.option("--batch", type=SIZE, help="--from-hf: global batch (default 8).")
@click.option("--seq-len", type=SIZE, help="--from-hf: sequence length (default 128).")
def init_command(
    path: Path | None,
    model: str,
    no_schema: bool,
    list_starters: bool,
    from_hf: Path | None,
    **placement: Any,
) -> None:
    """Start a spec at PATH (default specs/moe.yaml) from a commented, valid starter, or
    from a transformers model's config.json (--from-hf)."""
    from moegen.init import command

    given = [f"--{k.replace('_', '-')}" for k, v in placement.items() if v is not None]
    if from_hf is None and given:
        raise click.UsageError(f"{', '.join(given)}: only with --from-hf")
    if from_hf is not None and model != "cpu":
        raise click.UsageError("--model and --from-hf: choose one")
    hf_placement = None
    if from_hf is not None:
        from moegen.hf import Placement

        hf_placement = Placement(**placement)
    try:
        sys.exit(
            command(
                path,
                model,
                schema=not no_schema,
                list_only=list_starters,
                from_hf=from_hf,
                placement=hf_placement,
            )
        )
    except SpecError as err:
        fail_invalid(err)
