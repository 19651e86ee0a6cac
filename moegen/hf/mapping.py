"""The specs of a transformers model's MoE layers, from its
config.json.

The family table (moegen/hf/families.py) maps each supported model_type's keys to spec
fields; every MoE decoder layer gets its choices, and layers with the same choices share one
spec (a model whose MoE layers differ, in top-k or width, gets one spec per kind). Nothing is
written here: `specs_from_hf` returns {path: text} and moegen.init validates and writes it,
all or nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegen.hf.config_file import ConfigView, HfConfigError, config_file, read_json
from moegen.hf.families import FAMILIES, REFUSED
from moegen.hf.family_base import HfFamily
from moegen.hf.layers import decoder_layers, ranges
from moegen.hf.rules import Choice, Size
from moegen.hf.spec_text import Placement, spec_text

# layouts' size names -> the spec fields they give
SIZE_FIELDS = {
    "experts": "layer.num_experts",
    "embed": "layer.embed_dim",
    "ffn": "layer.ffn_dim",
    "top_k": "router.top_k",
}
# how a spec's file name says what sets its kind apart from the others
SHORT_NAMES = {
    "router.top_k": "top",
    "layer.num_experts": "experts",
    "layer.ffn_dim": "ffn",
    "layer.shared_ffn_dim": "shared",
}


@dataclass(frozen=True)
class LayerKind:
    """MoE layers that map to the same spec."""

    choices: tuple[Choice, ...]
    layers: tuple[int, ...]


@dataclass(frozen=True)
class Model:
    file: Path
    model_type: str
    family: HfFamily
    view: ConfigView
    layers_how: str
    kinds: tuple[LayerKind, ...]


def _family(file: Path, data: dict[str, Any]) -> tuple[str, HfFamily, ConfigView]:
    model_type = data.get("model_type")
    if type(model_type) is not str:
        raise HfConfigError(f"{file}: model_type: missing or not a string ({model_type!r})")
    if model_type in REFUSED:
        raise HfConfigError(
            f"{file}: model_type {model_type!r} is not supported: {REFUSED[model_type]}"
        )
    text = data.get("text_config")
    inner = text.get("model_type") if isinstance(text, dict) else None
    if model_type not in FAMILIES and inner in FAMILIES:  # multimodal: the MoE is the text model's
        return inner, FAMILIES[inner], ConfigView(file, text, "text_config.")
    if model_type not in FAMILIES:
        names = ", ".join(sorted(FAMILIES))
        raise HfConfigError(
            f"{file}: model_type {model_type!r} is not a family moegen maps; supported: {names}"
        )
    family = FAMILIES[model_type]
    if not family.text_config:
        return model_type, family, ConfigView(file, data)
    if not isinstance(text, dict):
        raise HfConfigError(f"{file}: text_config: a {model_type} config keeps its MoE there")
    return model_type, family, ConfigView(file, text, "text_config.")


def _size_rules(family: HfFamily) -> list[Size]:
    from moegen.checkpoints.layouts import FAMILIES as LAYOUTS  # the size keys, known there

    layout = LAYOUTS[family.sizes]

    def keys(name: str) -> tuple[str, ...]:
        if name in family.size_keys:
            return family.size_keys[name]
        return (*getattr(layout, name), *family.size_aliases.get(name, ()))

    return [Size(spec_field, keys(name)) for name, spec_field in SIZE_FIELDS.items()]


def layer_choices(family: HfFamily, view: ConfigView, layer: int) -> tuple[Choice, ...]:
    rules = [*_size_rules(family), *family.rules]
    return _tidied([choice for rule in rules for choice in rule.choices(view, layer)])


# fields of the shared expert: a block whose shared width is 0 builds none, so they do nothing
SHARED_ONLY = ("layer.shared_glu", "layer.shared_ffn_bias", "layer.shared_expert_gate")


def _tidied(choices: list[Choice]) -> tuple[Choice, ...]:
    """The choices less those that change nothing, which the spec's checks refuse: the
    shared expert's fields without a shared expert, and a shared_glu that is the routed
    experts' glu (both clamped alike, or both plain)."""
    fields = {c.field: c.value for c in choices}
    same_glu = fields.get("layer.shared_glu", "plain") == fields.get("layer.glu", "plain")
    drop = set(SHARED_ONLY) if "layer.shared_ffn_dim" not in fields else set()
    drop |= {"layer.shared_glu"} if same_glu else set()
    return tuple(c for c in choices if c.field not in drop)


def model_of(source: Path) -> Model:
    """config.json (or a folder holding it) read, its family found, its MoE layers mapped."""
    file = config_file(source)
    model_type, family, view = _family(file, read_json(file))
    layers, how = family.layers.moe_layers(view)
    if not layers:
        raise HfConfigError(f"{file}: no MoE layer: {how} selects none")
    grouped: dict[str, list[int]] = {}
    choices_of: dict[str, tuple[Choice, ...]] = {}
    for layer in layers:
        choices = layer_choices(family, view, layer)
        key = json.dumps([(c.field, c.value) for c in choices], sort_keys=True)
        grouped.setdefault(key, []).append(layer)
        choices_of.setdefault(key, choices)
    kinds = tuple(LayerKind(choices_of[k], tuple(v)) for k, v in grouped.items())
    return Model(file, model_type, family, view, how, kinds)


def _kind_names(kinds: tuple[LayerKind, ...]) -> list[str]:
    """A file-name suffix per kind, from the fields whose values tell the kinds apart."""
    if len(kinds) == 1:
        return [""]
    values = [{c.field: c.value for c in kind.choices} for kind in kinds]
    differing = [f for f in values[0] if len({json.dumps(v.get(f)) for v in values}) > 1]
    named = [f for f in differing if f in SHORT_NAMES]
    names = ["_".join(f"{SHORT_NAMES[f]}{v[f]}" for f in named) for v in values]
    if len(set(names)) < len(names):  # told apart by something else: number them
        names = [f"kind{i + 1}" for i in range(len(kinds))]
    return ["_" + name for name in names]


def specs_from_hf(source: Path, target: Path | None, placement: Placement) -> dict[Path, str]:
    """{spec path: YAML text} for each kind of MoE layer of the model at `source`, at
    `target` (default specs/<model_type>.yaml; several kinds: a suffix each)."""
    model = model_of(source)
    target = target or Path("specs") / f"{model.model_type}.yaml"
    total = decoder_layers(model.family.layers, model.view)
    found: dict[Path, str] = {}
    for kind, suffix in zip(model.kinds, _kind_names(model.kinds), strict=True):
        path = target.with_name(f"{target.stem}{suffix}{target.suffix}")
        listed = ranges(list(kind.layers))
        header = [
            f"Written by `moegen init --from-hf` from {model.file} (model_type "
            f"{model.model_type}: {model.family.title}).",
            "Each mapped value names its config.json key, or the block that fixes it.",
            f"MoE layers: {model.layers_how}.",
            f"This spec: layers {listed} ({len(kind.layers)} of {total} decoder layers).",
        ]
        if len(model.kinds) > 1:
            header.append(f"The model's MoE layers differ: {len(model.kinds)} specs, one a kind.")
        description = f"{model.family.title} MoE layers {listed} of {total} (from config.json)"
        if model.family.note:
            header.append(model.family.note)
            description = f"{description}. {model.family.note}"
        found[path] = spec_text(header, description, list(kind.choices), placement)
    return found
