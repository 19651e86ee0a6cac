"""Stage 1, load: a YAML file to a frozen, schema-checked `Spec`, with source locations.

The logic lives in moegen.load.loader; this package face only re-exports.
"""

from __future__ import annotations

from moegen.load.loader import (
    MAX_NAME_CHARACTERS,
    MAX_SPEC_BYTES,
    LoadedSpec,
    display_path,
    load_spec,
    load_spec_bytes,
    module_name_problem,
)
from moegen.load.schema_errors import choice_message, describe
from moegen.load.shape_variants import SHAPE_FIELDS, shape_variants
from moegen.load.source import FieldPath, Locations, SpecSource, dotted

__all__ = [
    "FieldPath",
    "LoadedSpec",
    "Locations",
    "MAX_NAME_CHARACTERS",
    "MAX_SPEC_BYTES",
    "SHAPE_FIELDS",
    "SpecSource",
    "choice_message",
    "describe",
    "display_path",
    "dotted",
    "load_spec",
    "load_spec_bytes",
    "module_name_problem",
    "shape_variants",
]
