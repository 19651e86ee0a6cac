"""The specs of a transformers model's MoE layers, from its
config.json.

The family table (moegen.families) maps each supported model_type's keys to spec
fields; every MoE decoder layer gets its choices, and layers with the same choices share one
spec (a model whose MoE layers differ, in top-k or width, gets one spec per kind; the layers
are grouped without running the rules once a layer: moegen.hf.layer_kinds). Nothing is
written here: `specs_from_hf` returns {path: Draft (text, and each line's source)} and
moegen.init validates and writes it, all or nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegen.families import (
    FAMILIES,
    Choice,
    ConfigView,
    Family,
    HfConfigError,
    LayerSet,
    Size,
    config_file,
    describe,
    read_json,
    short,
)
from moegen.hf.layer_kinds import layer_kinds
from moegen.hf.layers import layers_of
from moegen.hf.refused import REFUSED
from moegen.hf.spec_text import Draft, Placement, spec_text

# the entries' size names -> the spec fields they give
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
    layers: LayerSet


@dataclass(frozen=True)
class Model:
    file: Path
    model_type: str
    family: Family
    view: ConfigView
    layers_how: str  # how the MoE layers were found (the entry's `layers` rule)
    decoder_layers: int  # the count the rule went by
    kinds: tuple[LayerKind, ...]


def _family(file: Path, data: dict[str, Any]) -> tuple[str, Family, ConfigView]:
    model_type = data.get("model_type")
    if type(model_type) is not str:
        raise HfConfigError(f"{file}: model_type: missing or not a string ({short(model_type)})")
    if model_type in REFUSED:
        raise HfConfigError(
            f"{file}: model_type {model_type!r} is not supported: {REFUSED[model_type]}"
        )
    text = data.get("text_config")
    inner = text.get("model_type") if isinstance(text, dict) else None
    if model_type not in FAMILIES and inner in FAMILIES:  # multimodal: the MoE is the text model's
        return inner, FAMILIES[inner], ConfigView(file, text, "text_config.")
    if model_type not in FAMILIES and not _names_experts(data):
        raise HfConfigError(
            f"{file}: model_type {short(model_type)} has no MoE layers (no key of its config "
            "sets experts or an moe_ option): moegen generates Mixture-of-Experts layers only; "
            "a dense model's MLP is not one"
        )
    if model_type not in FAMILIES:
        names = ", ".join(sorted(FAMILIES))
        raise HfConfigError(
            f"{file}: model_type {short(model_type)} is not a family moegen maps; "
            f"supported: {names}"
        )
    family = FAMILIES[model_type]
    if not family.text_config:
        return model_type, family, ConfigView(file, data)
    if not isinstance(text, dict):
        raise HfConfigError(f"{file}: text_config: a {model_type} config keeps its MoE there")
    return model_type, family, ConfigView(file, text, "text_config.")


# transformers' MoE configs all hold a key naming experts (num_experts, n_routed_experts,
# num_local_experts, experts_per_token, moe_num_experts, ...) or an moe_ setting; a config
# with none of them set, at any depth, describes a dense model.
MOE_KEY = re.compile(r"expert|(^|_)moe(_|$)", re.IGNORECASE)


def _names_experts(data: dict[str, Any]) -> bool:
    """Whether any key of the config (or of a nested config) is an MoE setting that is set."""
    for key, value in data.items():
        if isinstance(key, str) and MOE_KEY.search(key) and value not in (None, 0, False, [], {}):
            return True
        if isinstance(value, dict) and _names_experts(value):
            return True
    return False


def _size_rules(family: Family) -> list[Size]:
    return [Size(field, family.sizes.keys(name)) for name, field in SIZE_FIELDS.items()]


def choices_of(family: Family) -> Callable[[ConfigView, int], tuple[Choice, ...]]:
    """A layer's spec choices under the family's rules (its size rules found once)."""
    rules = [*_size_rules(family), *family.rules]

    def layer_choices(view: ConfigView, layer: int) -> tuple[Choice, ...]:
        return _tidied([choice for rule in rules for choice in rule.choices(view, layer)])

    return layer_choices


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
    found = layers_of(FAMILIES[model_type], view)
    if not found.moe:
        raise HfConfigError(f"{file}: no MoE layer: {found.how} selects none")
    kinds = tuple(LayerKind(c, k) for c, k in layer_kinds(view, found.moe, choices_of(family)))
    return Model(file, model_type, family, view, found.how, found.count, kinds)


def _kind_names(kinds: tuple[LayerKind, ...]) -> list[str]:
    """A file-name suffix per kind, from the fields whose values tell the kinds apart."""
    if len(kinds) == 1:
        return [""]
    values = [{c.field: c.value for c in kind.choices} for kind in kinds]
    differing = [f for f in values[0] if len({json.dumps(v.get(f)) for v in values}) > 1]
    named = [f for f in differing if f in SHORT_NAMES]
    # a field another kind lacks is its shared expert's width: it has none, 0 wide
    names = ["_".join(f"{SHORT_NAMES[f]}{v.get(f, 0)}" for f in named) for v in values]
    if len(set(names)) < len(names):  # told apart by something else: number them
        names = [f"kind{i + 1}" for i in range(len(kinds))]
    return ["_" + name for name in names]


def specs_from_hf(source: Path, target: Path | None, placement: Placement) -> dict[Path, Draft]:
    """{spec path: its draft} for each kind of MoE layer of the model at `source`, at
    `target` (default specs/<model_type>.yaml; several kinds: a suffix each)."""
    try:
        model = model_of(source)
    except RecursionError:  # a value nested past what comparing or showing it can follow
        raise HfConfigError(f"{source}: nested too deeply to be a model config") from None
    target = target or Path("specs") / f"{model.model_type}.yaml"
    total = model.decoder_layers
    found: dict[Path, Draft] = {}
    for kind, suffix in zip(model.kinds, _kind_names(model.kinds), strict=True):
        path = target.with_name(f"{target.stem}{suffix}{target.suffix}")
        listed = describe(kind.layers)
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
        origin = str(model.file)
        found[path] = spec_text(header, description, list(kind.choices), placement, origin)
    return found
