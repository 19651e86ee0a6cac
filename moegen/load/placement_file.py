"""A placement file named by a spec (`parallelism.placement: NAME.json`): read beside the
spec, bounded, and checked, for the loader to put in the spec in place of its name and to
hash with the spec's bytes (a new placement makes the committed module stale).

The file is untrusted input like the spec: every refusal is a `PlacementFileProblem` naming
what is wrong, which the loader reports at the spec's `placement` value."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from moegen.placement import strict_json
from moegen.spec_parallelism import Placement

PLACEMENT_FORMAT = "moegen-placement-2"
MAX_PLACEMENT_BYTES = 1 << 20  # a few numbers per extra slot
_KEYS = {"format", "placement", "source"}
# An expert index is an int32 and a share at most 1: an integer of more digits is refused
# before it is converted (Python refuses over 4300 digits, and converting is quadratic).
MAX_INTEGER_DIGITS = 20
_READER = TypeAdapter(Placement, config={"strict": True})


class PlacementFileProblem(ValueError):
    """Why a placement file cannot be used."""


def read_placement_file(name: str, spec_dir: Path | None) -> tuple[list[list[dict]], bytes]:
    """The placement file `name` beside the spec: its placement, as the spec would write it
    inline, and its bytes."""
    if spec_dir is None:
        raise PlacementFileProblem(
            "a spec read from text has no directory to read it from; write the placement inline"
        )
    raw = _read(spec_dir / name)
    data = strict_json(raw, PlacementFileProblem, _integer)
    if not isinstance(data, dict) or "placement" not in data or set(data) - _KEYS:
        raise PlacementFileProblem(
            f'expected a JSON object with a "placement" list (keys: {sorted(_KEYS)})'
        )
    if data.get("format", PLACEMENT_FORMAT) != PLACEMENT_FORMAT:
        shown = str(data["format"])[:40]
        raise PlacementFileProblem(f"format {shown!r} is not {PLACEMENT_FORMAT!r}")
    try:
        placement = _READER.validate_python(data["placement"])
    except ValidationError as error:
        first = error.errors()[0]
        where = "".join(f"[{part!r}]" for part in first["loc"])
        raise PlacementFileProblem(f"placement{where}: {first['msg']}") from None
    return [[replica.model_dump() for replica in device] for device in placement], raw


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INTEGER_DIGITS:
        raise PlacementFileProblem(f"a {digits}-digit integer: too long for an expert or a share")
    return int(text)


def _read(path: Path) -> bytes:
    if not path.exists():
        raise PlacementFileProblem(f"no such file beside the spec ({path.as_posix()[:200]})")
    if not path.is_file():  # a directory, a device, a pipe: nothing to read a placement from
        raise PlacementFileProblem("not a regular file")
    try:  # bounded: a device or a growing file must not be read to its end
        # non-blocking, and checked again through the descriptor: a FIFO swapped in since
        # the check above must not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PlacementFileProblem("not a regular file")
            raw = stream.read(MAX_PLACEMENT_BYTES + 1)
    except OSError as error:
        raise PlacementFileProblem(f"cannot be read: {error.strerror or error}") from None
    if len(raw) > MAX_PLACEMENT_BYTES:
        raise PlacementFileProblem(
            f"over {MAX_PLACEMENT_BYTES} bytes; a placement file is at most that"
        )
    return raw


def placement_digest_input(spec_bytes: bytes, placement_bytes: bytes) -> bytes:
    """What the spec's hash covers when it names a placement file: both files' bytes."""
    return spec_bytes + b"\0placement\0" + placement_bytes
