"""The JSON Schema of a spec, committed as specs/moegen.schema.json for editors.

The spec's model (stage load) types target.kernel as a name; which names exist is the kernels
registry's, so the schema gets them here: the enum an editor offers, and each kernel's summary.
"""

from __future__ import annotations

import json

from moegen.kernels import KERNELS
from moegen.spec import Spec


def spec_json_schema() -> dict:
    """The spec's JSON schema, with the registered kernels as target.kernel's choices."""
    schema = Spec.model_json_schema()
    field = schema["$defs"]["Target"]["properties"]["kernel"]
    field.pop("maxLength", None)
    field.pop("minLength", None)
    field["enum"] = list(KERNELS)
    summaries = "; ".join(f"{name} = {k.summary}" for name, k in KERNELS.items())
    field["description"] = f"{field['description']} {summaries}."
    return schema


def schema_text() -> str:
    return json.dumps(spec_json_schema(), indent=2, sort_keys=True) + "\n"
