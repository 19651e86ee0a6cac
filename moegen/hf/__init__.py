"""`moegen init --from-hf`: the specs of a transformers model's MoE layers, from its
config.json (moegen.hf.mapping; the family table: moegen.families)."""

from __future__ import annotations

from moegen.families import HfConfigError
from moegen.hf.mapping import LayerKind, Model, model_of, specs_from_hf
from moegen.hf.refused import REFUSED
from moegen.hf.spec_text import Placement

__all__ = [
    "REFUSED",
    "HfConfigError",
    "LayerKind",
    "Model",
    "Placement",
    "model_of",
    "specs_from_hf",
]
