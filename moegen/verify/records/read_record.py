"""XLA's buffer assignment reads kept, so that a second `moegen plan`, `build` or `check` of
the same layer reads its figures back instead of compiling again (issue 53, item 1).

A read is keyed like a verification record (moegen.verify.records.record): by a SHA-256 over what
shapes XLA's figure (the module's code less its header and description, the shape variant,
the TPU slice and device count, XLA_FLAGS and LIBTPU_INIT_ARGS, the jax, jaxlib and libtpu
versions, moegen's verifier sources). It keeps each program's assigned bytes, or the
compiler's refusal where the programs are out of HBM (an answer, as deterministic as a
figure); a read that failed otherwise (a timeout, a killed worker) is not kept.

Reads live beside the verification records (`$MOEGEN_CACHE_DIR/verify/reads`), are signed
with this user's key and read as untrusted input, as records are: a file that is not ours,
not signed, or not strictly of this form is ignored and the layer read again. A kept read is
a figure that decides which trade a module holds, so it is never trusted more than a fresh
read would be: the build's full-size compile still judges the module.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import suppress
from typing import Any

from moegen import provenance
from moegen.verify.messages import PROGRAMS
from moegen.verify.records.record import (
    WORKER_ENV,
    cache_root,
    installed_version,
    open_below_cache,
    signed_payload,
    verified_text,
    verifier_digest,
    write_file_in,
)

READ_FORMAT = 1
MAX_READ_BYTES = 1 << 14
_BELOW = ("verify", "reads")
_PURPOSE = "buffer assignment read"
_KEYS = {"format", "key", "figures", "refused", "signature"}
_FIGURES = ("argument", "output", "temp", "seconds")
Figures = dict[str, dict[str, float]]  # program -> argument, output, temp bytes and seconds


def read_key(source: str, variant: str, tpu_json: str, num_devices: int) -> str:
    """The key of XLA's read of one shape of `source` for the TPU slice `tpu_json`."""
    versions = {dist: installed_version(dist) for dist in ("jax", "jaxlib", "libtpu")}
    content = {
        "format": READ_FORMAT,
        "module": hashlib.sha256(verified_text(source).encode("utf-8")).hexdigest(),
        "variant": variant,
        "tpu": tpu_json,
        "num_devices": num_devices,
        "env": {name: os.environ.get(name, "") for name in WORKER_ENV},
        "versions": versions,
        "verifier": verifier_digest(),
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def recall(key: str) -> tuple[Figures, str] | None:
    """(figures, refusal) of the kept read of `key`: the refusal '' where the programs were
    read, the figures empty where the compiler refused them; None where no trusted read is
    kept (none, a link on the way, not ours, not signed, not of this form)."""
    try:
        directory = open_below_cache(create=False, below=_BELOW)
    except OSError:
        return None
    try:
        read = provenance.read_own_json(f"{key}.json", MAX_READ_BYTES, dir_fd=directory)
    except provenance.NotOurs:
        return None
    finally:
        os.close(directory)
    data = read[0] if read is not None else None
    if not isinstance(data, dict) or set(data) != _KEYS or data["key"] != key:
        return None
    if data["format"] != READ_FORMAT:
        return None
    if not provenance.signed_by_us(_PURPOSE, signed_payload(data), data["signature"]):
        return None
    return _strict(data["figures"], data["refused"])


def keep(key: str, figures: Figures, refused: str = "") -> None:
    """Keep a read (signed, written atomically); skipped where the cache cannot be written or
    nothing can be signed, as verification records are."""
    data: dict[str, Any] = {
        "format": READ_FORMAT,
        "key": key,
        "figures": figures,
        "refused": refused,
    }
    signature = provenance.sign(_PURPOSE, signed_payload(data))
    if signature is None:
        return
    with suppress(OSError):
        directory = open_below_cache(create=True, below=_BELOW)
        try:
            write_file_in(directory, key, {**data, "signature": signature}, _path())
        finally:
            os.close(directory)


def _path() -> Any:
    return cache_root().joinpath(*_BELOW)


def _strict(figures: Any, refused: Any) -> tuple[Figures, str] | None:
    """The kept figures, exactly of the form a read gives, else None."""
    if not isinstance(refused, str) or len(refused) > 4000 or not isinstance(figures, dict):
        return None
    if refused:
        return ({}, refused) if not figures and "out of HBM" in refused else None
    if set(figures) != set(PROGRAMS):
        return None
    kept: Figures = {}
    for program, figure in figures.items():
        if not isinstance(figure, dict) or set(figure) != set(_FIGURES):
            return None
        sizes = [figure[name] for name in _FIGURES[:3]]
        if not all(type(size) is int and 0 <= size < 2**50 for size in sizes):
            return None
        seconds = figure["seconds"]
        if type(seconds) not in (int, float) or not 0 <= seconds < 1e6:
            return None
        kept[program] = {name: figure[name] for name in _FIGURES}
    return kept, ""
