"""Stage 1, load: a YAML file to a frozen, schema-checked `Spec`, with source locations.

The YAML is parsed node by node (safe loader, no anchors, no custom tags) so that every
key and value keeps its line and column; schema violations become located diagnostics,
all of them at once.
"""

from __future__ import annotations

import hashlib
import keyword
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from moegen.diagnostics import Diagnostic, SpecError
from moegen.load.schema_errors import describe, schema_diagnostics
from moegen.load.source import FieldPath, Locations, SpecSource, dotted
from moegen.load.yaml_nodes import parse_yaml
from moegen.spec import Spec

# Re-exported: the parts of this stage tests and other stages reach for.
_parse_yaml = parse_yaml
__all__ = [
    "MAX_SPEC_BYTES", "FieldPath", "LoadedSpec", "Locations", "SpecSource", "describe",
    "display_path", "dotted", "load_spec", "load_spec_bytes", "module_name_problem",
]  # fmt: skip

MAX_SPEC_BYTES = 64 * 1024


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
    """The spec path as shown to users: relative to the working directory when inside it."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def load_spec(path: Path) -> LoadedSpec:
    """Read, parse and schema-check one spec file. Raises SpecError with every problem."""
    display = display_path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        problem = Diagnostic(display, 1, 1, "", f"cannot read spec: {err.strerror}")
        raise SpecError([problem]) from None
    return load_spec_bytes(raw, display, path.stem)


def load_spec_bytes(raw: bytes, display: str, name: str) -> LoadedSpec:
    """Parse spec bytes named `display`; `name` is the module name the spec will produce."""

    def fail(message: str, line: int = 1, col: int = 1) -> SpecError:
        return SpecError([Diagnostic(display, line, col, "", message)])

    if not display.isprintable():
        # The path is echoed into a comment of the generated code: one clean line only.
        display = ascii(display)
        raise fail("file path must be printable")
    if len(raw) > MAX_SPEC_BYTES:
        raise fail(f"spec is {len(raw)} bytes; at most {MAX_SPEC_BYTES} are accepted")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        col = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
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
    return LoadedSpec(source, spec, locations)


# Generated modules sit beside user code: their names must not shadow what they import.
# A fixed set, so that a file name's verdict does not depend on the Python version.
_RESERVED_NAMES = {
    "jax", "jaxlib", "numpy", "moegen", "generated", "typing", "collections", "functools",
    "math", "os", "sys", "types", "abc", "dataclasses", "enum", "re", "json", "io",
}  # fmt: skip


def module_name_problem(name: str) -> str | None:
    """Why the spec file stem `name` cannot name a generated module, or None."""
    example = "e.g. 'mixtral_8x7b.yaml'"
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
