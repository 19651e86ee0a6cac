"""Verification records: a passed verification kept, so that an unchanged module is not
verified again.

A record is keyed by a SHA-256 over everything that shapes the module's verdict: the bytes
of the full-size module and of its twins, minus what no check reads (the header comments
naming the spec file and its hash, and the `SPEC_DESCRIPTION` string: a description-only
edit is a hit), the job the worker would run (twin labels, tolerances, reference settings,
programs, TPU slice or CUDA target), the device count, the environment the worker reads
(XLA_FLAGS, LIBTPU_INIT_ARGS), the pinned versions (Python, jax, jaxlib, libtpu for TPU
targets, the packages a kernel lowered for CUDA goes through, moegen) and the source of the
verifier itself (moegen/verify/*.py and the kernels' registry, moegen/kernels/*.py). It holds
the steps the worker reported, so that a reused build prints the same figures. Only passes
are recorded.

Records live in `$MOEGEN_CACHE_DIR/verify/records` (default `$XDG_CACHE_HOME/moegen`, else
`~/.cache/moegen`), never beside the generated modules. Writes are atomic (a temporary in
the same directory, fsynced, renamed over). The directories below the cache directory are
opened without following a symbolic link: one there (anyone who can write the cache can
make it, to a directory of the user's) means no record is read or written, and `moegen
build` says so, once, with the fix (caching_off), as it does for a state directory that
others can write.

The trust model. Anyone who can write the cache (a CI cache restored from another branch or
a fork) can put a file under any key: the key is computed from public inputs. So a record is
signed (HMAC-SHA256) with this user's key (moegen.provenance: `$MOEGEN_SECRET`, else a file
in moegen's private state directory, never in the cache), and read like a spec: a regular
file of ours (no link, FIFO or device), at most MAX_RECORD_BYTES, JSON without NaN or
Infinity, every step strictly of the form a worker reports (moegen.verify.records.strict). Then it
is evidence, not a verdict: verify judges every figure again (moegen.verify.records.evidence and the
memory verdict). A record that fails anything is ignored, with one line saying why, and the
module is verified again: a poisoned cache costs a verification, never a pass.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import errno
import hashlib
import importlib.metadata
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from moegen import __version__, provenance
from moegen.kernels import kernel
from moegen.verify.messages import Job, Step
from moegen.verify.records.strict import BadRecord, strict_step

CACHE_ENV = "MOEGEN_CACHE_DIR"
RECORD_FORMAT = 2  # 2: signed; read strictly
MAX_RECORD_BYTES, MAX_STEPS = 1 << 20, 1000
_PURPOSE = "verification record"
_KEYS = {"format", "key", "verified_at", "module_sha256", "steps", "signature"}
WORKER_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
_TEMP_MARK = ".tmp-"
_HEADER_PREFIXES = ("# spec-sha256:", "# spec:")
_DESCRIPTION_NAME = "SPEC_DESCRIPTION"
_JAX_CACHE = "jax-cache"


@dataclasses.dataclass(frozen=True)
class VerifyCache:
    """What a verification may use: `reuse` a matching record (False: --reverify verifies
    again, and records the new result); records are written and JAX's compilation cache used
    either way. `moegen build --no-cache` passes no VerifyCache at all."""

    reuse: bool = True


def cache_root() -> Path:
    """moegen's cache directory: $MOEGEN_CACHE_DIR, $XDG_CACHE_HOME/moegen or ~/.cache/moegen."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "moegen"


_BELOW_ROOT = ("verify", "records")


def records_dir() -> Path:
    return cache_root().joinpath(*_BELOW_ROOT)


def open_below_cache(*, create: bool, below: tuple[str, ...] = _BELOW_ROOT) -> int:
    """The records directory (or another `below` the cache root), opened (made first, with
    `create`) without following a symbolic link below the cache root: the root is the
    user's own choice and may be a link (to a larger disk, say), but what is below it anyone
    who can write the cache may have made, a link to a directory of the user's among it.
    OSError where it cannot be (ENOTDIR or ELOOP: a link, which is never followed)."""
    root = cache_root()
    if create:
        root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for name in below:
        try:
            if create:
                with suppress(FileExistsError):  # a link there too: mkdir does not follow it
                    os.mkdir(name, dir_fd=fd)
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = below
    return fd


def linked_records() -> Path | None:
    """The directory on the way to the records that is a symbolic link, if one is."""
    path = cache_root()
    for name in _BELOW_ROOT:
        path = path / name
        if path.is_symlink():
            return path
    return None


def _why_no_records() -> str | None:
    reason = provenance.no_key_reason()  # nothing signed: nothing kept, nothing trusted
    linked = linked_records()
    if reason is None and linked is not None:
        reason = f"{linked} is a symbolic link, which moegen neither reads nor writes through "
        reason += "(remove it: moegen makes the directory)"
    return reason


def caching_off() -> str | None:
    """One line for the user where reuse of passed verifications or JAX's compilation cache
    is off: which, why, and what to do; None when both are on. Without it, a build whose
    state directory others can write verifies every spec again, minutes each, unexplained."""
    why_not = {
        "reuse of passed verifications": _why_no_records(),
        "JAX's compilation cache": provenance.state_problem(_JAX_CACHE),
    }
    off: dict[str, list[str]] = {}  # one reason (the state directory's) may cost both
    for what, why in why_not.items():
        if why:
            off.setdefault(why, []).append(what)
    said = [f"{' and '.join(w)} {'are' if len(w) > 1 else 'is'} off: {y}" for y, w in off.items()]
    return "; ".join(said) or None


def compilation_cache_dir() -> Path | None:
    """JAX's persistent compilation cache for the verify workers' CPU compiles: in the private
    state directory, not the cache. Its entries are executables the verifier runs unchecked,
    so one planted in a shared or restored cache could make a broken twin pass; None (no
    compilation cache) when there is no private directory for it."""
    return provenance.private_directory(_JAX_CACHE)


def verified_text(source: str) -> str:
    """`source` without what no verification step reads: the spec's path and hash in the
    header comments, and the value of SPEC_DESCRIPTION (kept as a placeholder line)."""
    lines = source.splitlines(keepends=True)
    for i, line in enumerate(lines[:3]):
        if line.startswith(_HEADER_PREFIXES):
            lines[i] = line.split(":", 1)[0] + ":\n"
    start, end = _description_lines(source)
    if start is not None:
        lines[start:end] = [f"{_DESCRIPTION_NAME} = ...\n"]
    return "".join(lines)


def _description_lines(source: str) -> tuple[int | None, int]:
    """The 0-based line range of the top-level `SPEC_DESCRIPTION = ...` (None: not there)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None, 0
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == [_DESCRIPTION_NAME]
            and isinstance(node.value, ast.Constant)
        ):
            return node.lineno - 1, node.end_lineno or node.lineno
    return None, 0


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def pinned_versions(job: Job) -> dict[str, str | None]:
    """The versions the verdict depends on for this job."""
    dists = ["jax", "jaxlib"]
    if job.tpu is not None:
        dists.append("libtpu")
    lowering = kernel(job.cuda.kernel).cuda_lowering if job.cuda is not None else None
    if lowering is not None:
        dists += lowering.distributions
    versions = {dist: installed_version(dist) for dist in dists}
    versions["python"] = ".".join(map(str, sys.version_info[:2]))
    versions["moegen"] = __version__
    return versions


# the verifier's sources: verify itself (every role's folder) and the kernels' registry, whose
# entries say what a kernel's lowered program must hold and which package it lowers through
PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent
VERIFIER_FOLDERS = (PACKAGE_ROOT / "verify", PACKAGE_ROOT / "kernels")


def verifier_digest() -> str:
    """SHA-256 of moegen/verify/**/*.py and moegen/kernels/**/*.py: a changed verifier must
    not trust old verdicts."""
    digest = hashlib.sha256()
    for folder in VERIFIER_FOLDERS:
        for path in sorted(folder.rglob("*.py")):
            name = path.relative_to(PACKAGE_ROOT).as_posix()
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def record_key(job: Job, sources: Mapping[str, str], num_devices: int) -> str:
    """The key of a verification: `sources` maps each module path in `job` to its text."""
    content = {
        "format": RECORD_FORMAT,
        "job": _job_with_contents(job, sources),
        "num_devices": num_devices,
        "env": {name: os.environ.get(name, "") for name in WORKER_ENV},
        "versions": pinned_versions(job),
        "verifier": verifier_digest(),
    }
    return _sha256(json.dumps(content, sort_keys=True))


def _job_with_contents(job: Job, sources: Mapping[str, str]) -> dict[str, Any]:
    """The job's JSON with each module path replaced by the digest of its verified text."""
    data = job.to_json()
    data.pop("compilation_cache", None)  # where the cache is shapes no verdict
    data["module"] = _sha256(verified_text(sources[job.module]))
    data["twins"] = [
        {**twin, "path": _sha256(verified_text(sources[twin["path"]]))} for twin in data["twins"]
    ]
    return data


@dataclasses.dataclass(frozen=True)
class Record:
    """A passed verification: the worker's steps, when, and the exact module it checked."""

    key: str
    verified_at: str  # ISO 8601, local time, to the second
    module_sha256: str  # of the module exactly as rendered (header and description too)
    steps: tuple[Step, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "key": self.key,
            "verified_at": self.verified_at,
            "module_sha256": self.module_sha256,
            "steps": [step.to_json() for step in self.steps],
        }


def new_record(key: str, source: str, steps: Iterable[Step]) -> Record:
    now = datetime.datetime.now().astimezone().replace(microsecond=0)
    return Record(key, now.isoformat(), _sha256(source), tuple(steps))


def module_sha256(source: str) -> str:
    return _sha256(source)


def _name(key: str) -> str:
    return f"{key}.json"


class UntrustedRecord(Exception):
    """A record is there but proves nothing: the message says why, in a few words."""


def signed_payload(data: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in data.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def load_record(key: str) -> Record | None:
    """The record for `key`: None when there is none; UntrustedRecord when one is there but is not a
    file this user's moegen wrote and signed, of this format, step by step as a worker reports them.
    The figures in it are the caller's to judge (moegen.verify.records.evidence)."""
    try:
        directory = open_below_cache(create=False)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):  # none yet, or a link
            return None
        raise UntrustedRecord(f"the records directory cannot be read ({err.strerror})") from None
    try:
        read = provenance.read_own_json(_name(key), MAX_RECORD_BYTES, dir_fd=directory)
    except provenance.NotOurs as err:
        raise UntrustedRecord(str(err)) from None
    finally:
        os.close(directory)
    if read is None:  # no record
        return None
    data = read[0]
    if not isinstance(data, dict) or set(data) != _KEYS:
        raise UntrustedRecord("not a record of this moegen's format")
    if data["format"] != RECORD_FORMAT or data["key"] != key:
        raise UntrustedRecord("written for another format or key")
    if not provenance.signed_by_us(_PURPOSE, signed_payload(data), data["signature"]):
        raise UntrustedRecord(_unsigned_reason())
    return _decoded(key, data)


def _unsigned_reason() -> str:
    reason = provenance.no_key_reason()
    if reason is not None:
        return f"no key to check its signature: {reason}; or set ${provenance.SECRET_ENV}"
    return "not signed with this user's key"


def _decoded(key: str, data: dict[str, Any]) -> Record:
    when, digest, steps = data["verified_at"], data["module_sha256"], data["steps"]
    try:
        datetime.datetime.fromisoformat(when)
    except (TypeError, ValueError):
        raise UntrustedRecord("verified_at is not a time") from None
    if not (isinstance(digest, str) and re.fullmatch("[0-9a-f]{64}", digest)):
        raise UntrustedRecord("module_sha256 is not a digest")
    if not isinstance(steps, list) or len(steps) > MAX_STEPS:
        raise UntrustedRecord("steps are not a list of steps")
    try:
        return Record(key, when, digest, tuple(strict_step(step) for step in steps))
    except BadRecord as err:
        raise UntrustedRecord(f"a step is malformed ({err})") from None


def store_record(record: Record) -> None:
    """Write `record` signed and atomically; a cache that cannot be written (a link on the
    way to the records among the reasons: caching_off says so), or no key to sign with, is
    skipped, not fatal."""
    data = record.to_json()
    signature = provenance.sign(_PURPOSE, signed_payload(data))
    if signature is None:
        return
    with suppress(OSError):
        directory = open_below_cache(create=True)
        try:
            write_file_in(directory, record.key, {**data, "signature": signature})
        finally:
            os.close(directory)


def write_file_in(directory: int, key: str, data: dict[str, Any], path: Path | None = None) -> None:
    """`data` as the record of `key` in the open `directory` (at `path`, default the records
    directory): every name taken relative to it, so that no link swapped in meanwhile is
    followed."""
    # by path: should a link be swapped in since, it can only remove what this user's dead
    # moegen left there (names signed for that very directory)
    provenance.remove_leftovers(path or records_dir(), _TEMP_MARK)
    temp = provenance.owned_name(directory, f".{key[:16]}", _TEMP_MARK)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        fd = os.open(temp, flags, 0o600, dir_fd=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, _name(key), src_dir_fd=directory, dst_dir_fd=directory)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=directory)
