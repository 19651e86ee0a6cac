"""Load a published MoE checkpoint's layers into a generated module's parameters.

The logic lives in moegen.checkpoints.loading (one layer) and moegen.checkpoints.model (every
MoE layer of a model); this package face only re-exports. LayerSet (moegen.checkpoints.layer_set)
is the answer of the rules that find a model's MoE layers, which `moegen init --from-hf` reads
here too.
"""

from __future__ import annotations

from moegen.checkpoints.layer_set import LayerSet, describe
from moegen.checkpoints.layouts import FAMILIES, Family, Layout
from moegen.checkpoints.loading import MAX_LAYER, load_layer_params, match_checkpoint, module_target
from moegen.checkpoints.model import StackedParams, find_moe_layers, load_model_params
from moegen.checkpoints.reader import CheckpointError

__all__ = [
    "CheckpointError",
    "FAMILIES",
    "Family",
    "LayerSet",
    "Layout",
    "MAX_LAYER",
    "StackedParams",
    "describe",
    "find_moe_layers",
    "load_layer_params",
    "load_model_params",
    "match_checkpoint",
    "module_target",
]
