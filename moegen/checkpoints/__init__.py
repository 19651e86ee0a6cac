"""Load a published MoE checkpoint's layers into a generated module's parameters.

The logic lives in moegen.checkpoints.loading (one layer) and moegen.checkpoints.model (every
MoE layer of a model); this package face only re-exports. Which layers of a model are MoE
layers is one table, SCHEDULES (moegen.checkpoints.schedules: a rule per model_type, of the
kinds in layer_rules and layer_types, answering a LayerSet), which `moegen init --from-hf`
reads here too, supplying its own ConfigReader.
"""

from __future__ import annotations

from moegen.checkpoints.layer_rules import ABSENT, ConfigReader, Layers
from moegen.checkpoints.layer_set import LayerSet, describe
from moegen.checkpoints.layer_types import LayerRule
from moegen.checkpoints.layouts import FAMILIES, Family, Layout
from moegen.checkpoints.loading import MAX_LAYER, load_layer_params, match_checkpoint, module_target
from moegen.checkpoints.model import StackedParams, find_moe_layers, load_model_params
from moegen.checkpoints.reader import CheckpointError
from moegen.checkpoints.schedules import SCHEDULES

__all__ = [
    "ABSENT",
    "CheckpointError",
    "ConfigReader",
    "FAMILIES",
    "Family",
    "LayerRule",
    "LayerSet",
    "Layers",
    "Layout",
    "MAX_LAYER",
    "SCHEDULES",
    "StackedParams",
    "describe",
    "find_moe_layers",
    "load_layer_params",
    "load_model_params",
    "match_checkpoint",
    "module_target",
]
