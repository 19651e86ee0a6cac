"""Load a published MoE checkpoint's layers into a generated module's parameters.

The logic lives in moegen.checkpoints.loading (one layer) and moegen.checkpoints.model (every
MoE layer of a model); this package face only re-exports. Which layers of a model are MoE
layers is each family's entry in the family table (moegen.families), which `moegen init
--from-hf` reads too; the families the loader covers are FAMILIES (moegen.checkpoints.families).
"""

from __future__ import annotations

from moegen.checkpoints.families import FAMILIES, Loadable
from moegen.checkpoints.loading import MAX_LAYER, load_layer_params, match_checkpoint, module_target
from moegen.checkpoints.model import StackedParams, find_moe_layers, load_model_params
from moegen.checkpoints.reader import CheckpointError

__all__ = [
    "CheckpointError",
    "FAMILIES",
    "Loadable",
    "MAX_LAYER",
    "StackedParams",
    "find_moe_layers",
    "load_layer_params",
    "load_model_params",
    "match_checkpoint",
    "module_target",
]
