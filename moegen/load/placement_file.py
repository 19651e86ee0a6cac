"""A placement file named by a spec (`parallelism.placement: NAME.json`): read beside the
spec, bounded, and put in the spec in place of its name, with its bytes hashed into the
spec's hash so that a new placement makes the committed module stale.

The file is untrusted input like the spec: every refusal is a located diagnostic at the
spec's `placement` value that names the file and what is wrong with it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import TypeAdapter, ValidationError

from moegen.diagnostics import SpecError
from moegen.load.source import SpecSource
from moegen.spec_parallelism import Placement

if TYPE_CHECKING:  # the loader imports this module
    from moegen.load.loader import LoadedSpec

PLACEMENT_FORMAT = "moegen-placement-2"
MAX_PLACEMENT_BYTES = 1 << 20  # a few numbers per extra slot
_KEYS = {"format", "placement", "source"}
_READER = TypeAdapter(Placement, config={"strict": True})
AT = ("parallelism", "placement")


def with_placement_file(loaded: LoadedSpec, spec_dir: Path | None) -> LoadedSpec:
    """`loaded` with its placement file read into the spec, or `loaded` when it names none."""
    name = loaded.spec.parallelism.placement
    if not isinstance(name, str):
        return loaded

    def fail(message: str) -> SpecError:
        return SpecError([loaded.diagnostic(AT, f"placement file {name!r}: {message}")])

    if spec_dir is None:
        raise fail(
            "a spec read from text has no directory to read it from; write the placement inline"
        )
    path = spec_dir / name

    raw = _read(path, fail)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise fail(f"not JSON: {str(error)[:200]}") from None
    if not isinstance(data, dict) or "placement" not in data or set(data) - _KEYS:
        raise fail(f'expected a JSON object with a "placement" list (keys: {sorted(_KEYS)})')
    if data.get("format", PLACEMENT_FORMAT) != PLACEMENT_FORMAT:
        raise fail(f"format {str(data['format'])[:40]!r} is not {PLACEMENT_FORMAT!r}")
    try:
        placement = _READER.validate_python(data["placement"])
    except ValidationError as error:
        first = error.errors()[0]
        where = "".join(f"[{part!r}]" for part in first["loc"])
        raise fail(f"placement{where}: {first['msg']}") from None
    parallelism = loaded.spec.parallelism.model_validate(
        {**loaded.spec.parallelism.model_dump(), "placement": _as_data(placement)}
    )
    spec = loaded.spec.model_copy(update={"parallelism": parallelism})
    digest = hashlib.sha256(loaded.source.text.encode("utf-8") + b"\0placement\0" + raw)
    source: SpecSource = replace(loaded.source, sha256=digest.hexdigest())
    return replace(loaded, spec=spec, source=source)


def _read(path: Path, fail) -> bytes:
    if not path.is_file():
        raise fail(f"no such file beside the spec ({path.as_posix()[:200]})")
    try:  # bounded: a device or a growing file must not be read to its end
        with path.open("rb") as stream:
            raw = stream.read(MAX_PLACEMENT_BYTES + 1)
    except OSError as error:
        raise fail(f"cannot be read: {error.strerror or error}") from None
    if len(raw) > MAX_PLACEMENT_BYTES:
        raise fail(f"over {MAX_PLACEMENT_BYTES} bytes; a placement file is at most that")
    return raw


def _as_data(placement) -> list:
    return [[replica.model_dump() for replica in device] for device in placement]
