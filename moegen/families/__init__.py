"""Everything moegen knows of the model families it maps and loads, in one table
(moegen.families.table): per config.json model_type, the config keys of its sizes, the rules
that turn its config into spec choices, which decoder layers are MoE layers, and where its
checkpoints keep the weights. `moegen init --from-hf` (moegen.hf) and the checkpoint loader
(moegen.checkpoints) read it; it imports nothing of moegen outside itself."""

from moegen.families.config_file import (
    MAX_LAYERS,
    MAX_SIZE,
    MISSING,
    ConfigView,
    HfConfigError,
    config_file,
    read_json,
    short,
)
from moegen.families.entry import CheckpointKeys, Family, Sizes, Transformers
from moegen.families.layer_rules import ABSENT, ConfigReader, Layers
from moegen.families.layer_set import LayerSet, describe
from moegen.families.layer_types import HASH_MOE, LayerRule, count_key
from moegen.families.layouts import Layout
from moegen.families.rules import Choice, Size, lookup
from moegen.families.sources import AXIS_NAMES, PARAM_AXES, Source, Split, full_key
from moegen.families.table import FAMILIES

__all__ = [
    "ABSENT",
    "AXIS_NAMES",
    "FAMILIES",
    "HASH_MOE",
    "MAX_LAYERS",
    "MAX_SIZE",
    "MISSING",
    "PARAM_AXES",
    "CheckpointKeys",
    "Choice",
    "ConfigReader",
    "ConfigView",
    "Family",
    "HfConfigError",
    "LayerRule",
    "LayerSet",
    "Layers",
    "Layout",
    "Size",
    "Sizes",
    "Transformers",
    "Source",
    "Split",
    "config_file",
    "count_key",
    "describe",
    "full_key",
    "lookup",
    "read_json",
    "short",
]
