"""Load one layer of a published MoE checkpoint into a generated module's parameters.

The logic lives in moegen.checkpoints.loading; this package face only re-exports.
"""

from __future__ import annotations

from moegen.checkpoints.layouts import FAMILIES, Family, Layout
from moegen.checkpoints.loading import MAX_LAYER, load_layer_params, match_checkpoint, module_target
from moegen.checkpoints.reader import CheckpointError

__all__ = [
    "CheckpointError",
    "FAMILIES",
    "Family",
    "Layout",
    "MAX_LAYER",
    "load_layer_params",
    "match_checkpoint",
    "module_target",
]
