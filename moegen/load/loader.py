"""Stage 1, load: a YAML file to a frozen, schema-checked `Spec`, with source locations.

The YAML is parsed node by node (safe loader, no aliases, no explicit tags) so that every
key and value keeps its line and column; schema violations become located diagnostics,
all of them at once. Specs are untrusted input (they arrive in pull requests): the file is
read only if it is a regular file under the size limit (spec_file), and the YAML within the
limits of yaml_limits; every refusal is a located diagnostic, never a crash or a hang.
"""

from __future__ import annotations

import hashlib
import keyword
import os
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import ValidationError

from moegen.diagnostics import Diagnostic, SpecError
from moegen.load.placement_file import (
    PlacementFileProblem,
    placement_digest_input,
    read_placement_file,
)
from moegen.load.schema_errors import schema_diagnostics
from moegen.load.source import FieldPath, Locations, SpecSource, dotted
from moegen.load.spec_file import SpecFileProblem, read_spec_file
from moegen.load.yaml_limits import Positions
from moegen.load.yaml_nodes import parse_yaml
from moegen.spec import Spec

MAX_SPEC_BYTES = 16 * 1024  # 16x the largest real spec; what PyYAML reads in under 1 s loaded
# A module name is a file name: 100 characters leave room under the usual 255-byte limit
# for '.py' and the staging files beside it, and no real layer name comes near it.
MAX_NAME_CHARACTERS = 100


@dataclass(frozen=True)
class LoadedSpec:
    """A schema-valid spec together with its source, for located messages downstream."""

    source: SpecSource
    spec: Spec
    locations: Locations

    def diagnostic(self, path: FieldPath, message: str, *, at_key: bool = False) -> Diagnostic:
        line, col = self.locations.of_key(path) if at_key else self.locations.of_value(path)
        return Diagnostic(self.source.display, line, col, dotted(path), message)


def display_path(path: Path) -> str:
    """The spec path as shown to users: the path they gave, relative to the working directory
    when inside it. Symlinks are not resolved: the module is named after the link, so the
    messages and the generated header name the link too."""
    try:
        return Path(os.path.abspath(path)).relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.as_posix()


def load_spec(path: Path) -> LoadedSpec:
    """Read, parse and schema-check one spec file. Raises SpecError with every problem."""
    display = display_path(path)
    if not display.isprintable():
        raise _unprintable(display)
    try:
        raw = read_spec_file(path, MAX_SPEC_BYTES)
    except SpecFileProblem as problem:
        raise SpecError([Diagnostic(display, 1, 1, "", str(problem))]) from None
    return load_spec_bytes(raw, display, path.stem, path.parent)


def _unprintable(display: str) -> SpecError:
    # The path is echoed into messages and the generated header: one clean line only.
    return SpecError([Diagnostic(ascii(display), 1, 1, "", "file path must be printable")])


def load_spec_bytes(
    raw: bytes, display: str, name: str, spec_dir: Path | None = None
) -> LoadedSpec:
    """Parse spec bytes named `display`; `name` is the module name the spec will produce.
    A placement file the spec names is read from `spec_dir` (without one: refused)."""

    def fail(message: str, line: int = 1, col: int = 1) -> SpecError:
        return SpecError([Diagnostic(display, line, col, "", message)])

    if not display.isprintable():
        raise _unprintable(display)
    if len(raw) > MAX_SPEC_BYTES:
        raise fail(f"spec is {len(raw)} bytes; at most {MAX_SPEC_BYTES} are accepted")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        # The bytes before the bad one decode: count its column in characters, as editors do.
        before = raw[: err.start].decode("utf-8")
        line, col = Positions(before).of(len(before))
        raise fail(f"spec is not UTF-8 text (byte 0x{raw[err.start]:02x})", line, col) from None
    problem = module_name_problem(name)
    if problem:
        raise fail(problem)
    source = SpecSource(display, name, text, hashlib.sha256(raw).hexdigest())
    data, locations = parse_yaml(source)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        raise SpecError(schema_diagnostics(err, source, locations)) from None
    return _with_placement_file(LoadedSpec(source, spec, locations), raw, spec_dir)


def _with_placement_file(loaded: LoadedSpec, raw: bytes, spec_dir: Path | None) -> LoadedSpec:
    """`loaded` with the placement file it names read into the spec and hashed with it."""
    name = loaded.spec.parallelism.placement
    if not isinstance(name, str):
        return loaded
    at = ("parallelism", "placement")
    try:
        placement, placement_bytes = read_placement_file(name, spec_dir)
        parallelism = loaded.spec.parallelism.model_validate(
            {**loaded.spec.parallelism.model_dump(), "placement": placement}
        )
    except (PlacementFileProblem, ValidationError) as problem:
        message = f"placement file {name!r}: {problem}"
        raise SpecError([loaded.diagnostic(at, message)]) from None
    digest = hashlib.sha256(placement_digest_input(raw, placement_bytes)).hexdigest()
    return LoadedSpec(
        replace(loaded.source, sha256=digest),
        loaded.spec.model_copy(update={"parallelism": parallelism}),
        loaded.locations,
    )


# Generated modules sit beside user code: their names must not shadow what they import.
# A fixed set, so that a file name's verdict does not depend on the Python version.
_RESERVED_NAMES = {
    "jax", "jaxlib", "numpy", "moegen", "generated", "typing", "collections", "functools",
    "math", "os", "sys", "types", "abc", "dataclasses", "enum", "re", "json", "io",
}  # fmt: skip


def module_name_problem(name: str) -> str | None:
    """Why the spec file stem `name` cannot name a generated module, or None."""
    example = "e.g. 'mixtral_8x7b.yaml'"
    if len(name) > MAX_NAME_CHARACTERS:
        return (
            f"file name is {len(name)} characters long; at most {MAX_NAME_CHARACTERS} can name "
            f"the generated module, {example}"
        )
    if not name.isascii():
        # Python reads identifiers in NFKC form: 'ﬁle.py' (a ligature) imports as 'file', so a
        # non-ASCII stem may name another module than the one written. ASCII is simplest.
        normal = unicodedata.normalize("NFKC", name)
        imports_as = f"; Python would import {name!r} as {normal!r}" if normal != name else ""
        return (
            f"file name {name!r} must be ASCII letters, digits and '_' (it names the generated "
            f"module{imports_as}), {example}"
        )
    if not name.isidentifier() or name.startswith("_"):
        return (
            f"file name {name!r} must be a Python identifier not starting with '_' "
            f"(it names the generated module), {example}"
        )
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"file name {name!r} is a Python keyword and cannot name a module, {example}"
    if name in _RESERVED_NAMES:
        return f"file name {name!r} would shadow the Python module of that name, {example}"
    return None
