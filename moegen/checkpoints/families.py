"""The families whose checkpoints the loader reads: the entries of the family table
(moegen.families) that say where their checkpoints keep the weights, as the loader names
them. A multimodal config's entry (text_config) loads as its text model's family: one
family, both model_types (Llama 4's llama4_text and llama4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from moegen.families import FAMILIES as TABLE
from moegen.families import CheckpointKeys, Family, LayerRule, Layout


@dataclass(frozen=True)
class Loadable:
    """One family as the loader reads it: its names, sizes, layouts and MoE layers."""

    name: str  # the model_type of its entry; `family=` names it
    model_types: tuple[str, ...]  # config.json model_type values of this family

    @property
    def entry(self) -> Family:
        """Its entry, looked up in the table each time: the table is the one source."""
        return TABLE[self.name]

    @property
    def title(self) -> str:
        return self.entry.title

    @property
    def checkpoint(self) -> CheckpointKeys:
        assert self.entry.checkpoint is not None  # only such entries are loadable
        return self.entry.checkpoint

    @property
    def layouts(self) -> tuple[Layout, ...]:
        return self.checkpoint.layouts

    @property
    def layers(self) -> tuple[str, ...]:
        """Where a decoder layer's keys start ({L}: its index)."""
        return self.checkpoint.prefixes

    @property
    def refuse(self) -> Mapping[str, str]:
        return self.checkpoint.refuse

    @property
    def moe_layers(self) -> LayerRule:
        return self.entry.layers

    def size_keys(self, name: str) -> tuple[str, ...]:
        """config.json's keys of one size (experts, embed, ffn, top_k)."""
        return self.entry.sizes.keys(name)


def _loadable() -> dict[str, Loadable]:
    found: dict[str, Loadable] = {}
    for model_type, entry in TABLE.items():
        if entry.checkpoint is not None and not entry.text_config:
            twins = [
                other
                for other, twin in TABLE.items()
                if twin.text_config and twin == replace(entry, text_config=True)
            ]
            found[model_type] = Loadable(model_type, (model_type, *twins))
    return found


FAMILIES: Mapping[str, Loadable] = _loadable()
