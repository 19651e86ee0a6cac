"""The JSON Schema of a spec, committed as specs/moegen.schema.json for editors."""

from __future__ import annotations

import json

from moegen.spec import Spec


def schema_text() -> str:
    return json.dumps(Spec.model_json_schema(), indent=2, sort_keys=True) + "\n"
