"""A spec derived from another: some fields set to new values, then validated again.

The shrunken twin (verify), each candidate of `moegen tune` and the benchmark's variants
(the FFN whole, the portable kernel) are all the same operation on a loaded spec, so they share it:
the copy keeps the source and locations of the spec it came from (a diagnostic on it points
at the original file), and it is valid by the same rules as any spec, or SpecError says why.
This is stage two of the pipeline (load, validate): what comes later may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from moegen.load import FieldPath, LoadedSpec
from moegen.validate import validate


def derive(loaded: LoadedSpec, overrides: Mapping[FieldPath, Any]) -> LoadedSpec:
    """`loaded` with the field at each path (`("memory", "ffn_chunks")`) set to its value,
    validated; raises SpecError listing every rule the result breaks."""
    return validate(unchecked(loaded, overrides))


def unchecked(loaded: LoadedSpec, overrides: Mapping[FieldPath, Any]) -> LoadedSpec:
    """The same copy, not validated: for callers that only want its diagnostics."""
    return replace(loaded, spec=_updated(loaded.spec, dict(overrides)))


def _updated(model: BaseModel, overrides: dict[FieldPath, Any]) -> BaseModel:
    # pydantic's model_copy replaces whole fields: nested paths are rebuilt section by section
    direct: dict[str, Any] = {}
    nested: dict[str, dict[FieldPath, Any]] = {}
    for path, value in overrides.items():
        if not path or not isinstance(path[0], str):
            raise ValueError(f"not a field path of a spec: {path!r}")
        if len(path) == 1:
            direct[path[0]] = value
        else:
            nested.setdefault(path[0], {})[path[1:]] = value
    for name, inner in nested.items():
        if name in direct:
            raise ValueError(f"{name} is set both whole and field by field")
        direct[name] = _updated(getattr(model, name), inner)
    return model.model_copy(update=direct)
