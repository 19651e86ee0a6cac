"""Stage 2, validate: rules that relate several fields of a schema-valid spec.

The logic lives in moegen.validate.validation; this package face only re-exports.
"""

from __future__ import annotations

from moegen.validate.rules import MAX_CPU_DEVICES, Rule
from moegen.validate.validation import (
    RULES,
    SHAPE_RULES,
    check_rules,
    choices_left_to_tune,
    validate,
)

__all__ = [
    "MAX_CPU_DEVICES",
    "RULES",
    "Rule",
    "SHAPE_RULES",
    "check_rules",
    "choices_left_to_tune",
    "validate",
]
