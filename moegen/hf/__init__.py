"""`moegen init --from-hf`: the specs of a transformers model's MoE layers, from its
config.json (moegen.hf.mapping; the family table: moegen.hf.families)."""

from __future__ import annotations

from moegen.hf.config_file import HfConfigError
from moegen.hf.families import FAMILIES, REFUSED
from moegen.hf.mapping import LayerKind, Model, model_of, specs_from_hf
from moegen.hf.spec_text import Placement

__all__ = [
    "FAMILIES",
    "REFUSED",
    "HfConfigError",
    "LayerKind",
    "Model",
    "Placement",
    "model_of",
    "specs_from_hf",
]
