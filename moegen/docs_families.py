"""docs/reference/families.md: the model families moegen maps and loads, written from the
family table (moegen.families) by `python -m moegen.docs_reference --write`, so the page
cannot drift from the code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from moegen.families import FAMILIES, Family
from moegen.hf import REFUSED

FAMILIES_PAGE = Path("docs/reference/families.md")


def _layer_keys(rule: object) -> str:
    """The config keys a layer rule reads (its own and its fallback's), in order."""
    keys: list[str] = []
    for field in dataclasses.fields(rule):  # type: ignore[arg-type]
        value = getattr(rule, field.name)
        # config keys are snake_case; values a rule matches ("sparse", "moe") are not
        if isinstance(value, str) and "_" in value and value not in keys:
            keys.append(value)
        elif dataclasses.is_dataclass(value):
            keys.append(_layer_keys(value))
    return ", ".join(k for k in keys if k)


def _row(model_type: str, family: Family) -> str:
    classes = family.transformers
    loads = (
        ", ".join(layout.name for layout in family.checkpoint.layouts) if family.checkpoint else ""
    )
    where = "text_config" if family.text_config else ""
    rule = type(family.layers).__name__
    return (
        f"| `{model_type}` | {family.title} | `{classes.block}` ({classes.block_folder}) | "
        f"{rule}: {_layer_keys(family.layers)} | {where} | {loads} |"
    )


def families_page(header: str) -> str:
    """The page: one row per model_type of the table, then the model_types init refuses."""
    out = [
        header,
        "# Model families",
        "",
        f"The {len(FAMILIES)} config.json `model_type`s `moegen init --from-hf` maps, each one "
        "entry of the family table (`moegen/families/`): the transformers MoE block its rules "
        "follow, the rule and config keys that say which decoder layers are MoE layers, where a "
        "multimodal config keeps the text model, and the checkpoint layouts "
        "`moegen.checkpoints` loads (blank: init maps it, the loader does not).",
        "",
        "| model_type | family | transformers block | MoE layers | keys under | checkpoints |",
        "|---|---|---|---|---|---|",
        *(_row(model_type, family) for model_type, family in sorted(FAMILIES.items())),
        "",
        "## Refused",
        "",
        *(f"- `{model_type}`: {why}" for model_type, why in sorted(REFUSED.items())),
    ]
    return "\n".join(out) + "\n"
