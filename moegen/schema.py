"""The JSON Schema of a spec, committed as specs/moegen.schema.json for editors.

The spec's model (stage load) types target.kernel and parallelism.experts as names; which
names exist is the kernels' and the strategies' registries' knowledge, so the schema gets them
here: the enum an editor offers, and each one's summary.
"""

from __future__ import annotations

import json

from moegen.kernels import KERNELS
from moegen.spec import Spec
from moegen.strategies import STRATEGIES


def spec_json_schema() -> dict:
    """The spec's JSON schema, with the registered kernels and strategies as the choices of
    target.kernel and parallelism.experts."""
    schema = Spec.model_json_schema()
    kernels = {name: k.summary for name, k in KERNELS.items()}
    strategies = {name: s.summary for name, s in STRATEGIES.items()}
    _offer(schema["$defs"]["Target"]["properties"]["kernel"], kernels)
    _offer(schema["$defs"]["Parallelism"]["properties"]["experts"], strategies, "auto")
    return schema


def _offer(field: dict, summaries: dict[str, str], *more: str) -> None:
    """A name field's schema as the registry's choices, each summarised in its description."""
    field.pop("maxLength", None)
    field.pop("minLength", None)
    field["enum"] = [*summaries, *more]
    listed = "; ".join(f"{name} = {summary}" for name, summary in summaries.items())
    field["description"] = f"{field['description']} {listed}."


def schema_text() -> str:
    return json.dumps(spec_json_schema(), indent=2, sort_keys=True) + "\n"
