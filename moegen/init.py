"""`moegen init`: start a spec from a starter (moegen/starters/*.yaml, shipped in the wheel).

A starter is a commented, valid spec whose first line is the editor modeline
`# yaml-language-server: $schema=moegen.schema.json`; `init_spec` validates it under the
file name it will have (the name becomes the module's), then writes it, and the JSON Schema
beside it when none is there, so that the modeline resolves. Paths are the user's: a file that
exists (a dangling symlink included) is never replaced, a missing folder is created, and on
any failure nothing is left behind, folders made for it included. Each file is written to a
temporary beside it, fsynced, then hard-linked to its name, which fails instead of replacing
a file that appeared meanwhile.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moegen.diagnostics import Diagnostic, SpecError

STARTERS_DIR = Path(__file__).resolve().parent / "starters"
SCHEMA_NAME = "moegen.schema.json"  # what the starters' modeline names, beside the spec
DEFAULT_STARTER = "cpu"
DEFAULT_PATH = Path("specs/moe.yaml")


class InitError(Exception):
    """A path `moegen init` cannot write to; the message says why and what to do."""


def starter_names() -> list[str]:
    return sorted(path.stem for path in STARTERS_DIR.glob("*.yaml"))


def starter_text(model: str) -> str:
    if model not in starter_names():
        raise InitError(f"no starter {model!r}; the starters are {', '.join(starter_names())}")
    return (STARTERS_DIR / f"{model}.yaml").read_text(encoding="utf-8")


def starter_summary(model: str) -> str:
    """The starter's description line, for `moegen init --list`."""
    import yaml

    return " ".join(str(yaml.safe_load(starter_text(model))["description"]).split())


def init_spec(path: Path, model: str = DEFAULT_STARTER, *, schema: bool = True) -> list[Path]:
    """Write starter `model` to `path` (and the schema beside it); returns what was written.

    Raises InitError for a path that cannot take it, SpecError when the spec would be invalid
    there (its file name must be a Python identifier: it names the generated module)."""
    return write_specs({path: starter_text(model)}, schema=schema)


def write_specs(
    texts: dict[Path, str],
    *,
    schema: bool = True,
    origins: Mapping[Path, Mapping[int, str]] | None = None,
) -> list[Path]:
    """Write each spec text to its path, all in one folder, and the schema beside them; all
    or nothing: every path checked and every spec validated before anything is written.
    With `origins` (written from a config: {path: {line: where its value came from}}), a
    diagnostic says its file was not written, and where the value on its line came from."""
    for path, text in texts.items():
        _check_target(path)
        _validate_as(path, text, None if origins is None else origins.get(path, {}))
    folder = next(iter(texts)).parent
    assert all(path.parent == folder for path in texts), "the specs share one folder"
    schema_path = folder / SCHEMA_NAME
    from moegen.emit import remove_folders

    made_dirs = _make_parents(folder)
    written: list[Path] = []
    try:
        if schema and not os.path.lexists(schema_path):
            from moegen.schema import schema_text

            _write_new(schema_path, schema_text())
            written.append(schema_path)
        for path, text in texts.items():
            _write_new(path, text)
            written.append(path)
    except BaseException:
        for done in reversed(written):
            done.unlink(missing_ok=True)
        remove_folders(made_dirs)
        raise
    return written[1:] + written[:1] if written[0] == schema_path else written


def stale_schema(path: Path) -> Path | None:
    """The schema beside `path` when it exists but is not this moegen's (after an upgrade)."""
    from moegen.schema import schema_text

    schema_path = path.parent / SCHEMA_NAME
    try:
        current = schema_path.read_text(encoding="utf-8")
    except (OSError, UnicodeError):
        return None
    return None if current == schema_text() else schema_path


def _check_target(path: Path) -> None:
    if path.suffix not in (".yaml", ".yml"):
        raise InitError(
            f"{path}: a spec file name ends in .yaml (moegen validate and check find "
            "specs/*.yaml), e.g. specs/moe.yaml"
        )
    if os.path.lexists(path):
        raise InitError(f"{path} exists ({_what(path)}); not replacing it: choose another path")
    for parent in path.parents:
        if os.path.lexists(parent) and not parent.is_dir():
            raise InitError(f"{parent} is not a folder; cannot create {path} under it")


# what a path that is there is, by its lstat mode (a link is said as a link, not followed)
_KINDS = (
    (stat.S_ISREG, "a file"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO, a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _what(path: Path) -> str:
    """What is at `path`, for the refusal: "a file", "a FIFO, a named pipe", "a dangling
    symbolic link to 'x'" ("a file" for all of them misleads)."""
    try:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            target = os.readlink(path)
            try:
                os.stat(path)
            except FileNotFoundError:
                return f"a dangling symbolic link to {target!r}"
            except OSError as err:  # ELOOP: a loop of links
                return f"a symbolic link to {target!r} that cannot be followed: {err.strerror}"
            return f"a symbolic link to {target!r}, {_what(path.resolve())}"
    except OSError as err:
        return f"which cannot be inspected: {err.strerror}"
    return next((what for test, what in _KINDS if test(mode)), "not a file nor a folder")


def _validate_as(path: Path, text: str, origins: Mapping[int, str] | None = None) -> None:
    """The spec as moegen will read it at `path` (its name is the module's); else SpecError
    naming that path, with "(not written)" and each line's origin when `origins` is given."""
    from moegen.load import display_path, load_spec_bytes
    from moegen.validate import validate

    display = display_path(path)
    try:
        validate(load_spec_bytes(text.encode("utf-8"), display, path.stem))
    except SpecError as err:  # name the file to be written, not a temporary
        if origins is None:
            raise SpecError(
                [dataclasses.replace(d, file=display) for d in err.diagnostics]
            ) from None
        raise SpecError([_unwritten(d, display, origins) for d in err.diagnostics]) from None


def _unwritten(diagnostic: Diagnostic, display: str, origins: Mapping[int, str]) -> Diagnostic:
    """The diagnostic of a spec that was drafted, refused and so not written: its file:line
    names nothing on disk, so it says so, and where the value on that line came from."""
    origin = origins.get(diagnostic.line)
    message = diagnostic.message + (f" (from {origin})" if origin else "")
    return dataclasses.replace(diagnostic, file=f"{display} (not written)", message=message)


def _make_parents(folder: Path) -> list[Path]:
    """Create `folder` and its missing ancestors (moegen.emit.make_folders); InitError if not."""
    from moegen.emit import make_folders

    try:
        return make_folders(folder)
    except OSError as err:
        raise InitError(
            f"cannot create the folder {err.filename or folder}: {err.strerror}"
        ) from None


def _write_new(path: Path, text: str) -> None:
    """Write a file that must not exist yet: temporary, fsync, hard link (never replaces)."""
    try:
        fd, temporary = tempfile.mkstemp(
            prefix=f".{path.name}.", suffix=".moegen-init", dir=path.parent
        )
    except OSError as err:
        raise InitError(f"cannot write {path}: {err.strerror}") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.link(temporary, path)
    except FileExistsError:
        raise InitError(f"{path} appeared while writing it; not replacing it") from None
    except OSError as err:
        raise InitError(f"cannot write {path}: {err.strerror}") from None
    finally:
        os.unlink(temporary)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def command(
    path: Path | None,
    model: str,
    *,
    schema: bool,
    list_only: bool,
    from_hf: Path | None = None,
    placement: Any = None,
) -> int:
    """`moegen init`: its messages (stderr) and exit status; SpecError is the CLI's to show.
    With `from_hf` (a config.json), the specs of that model's MoE layers (moegen.hf) placed
    as `placement` (a moegen.hf.Placement) says."""
    import click

    if list_only:
        for name in starter_names():
            click.echo(f"{name:<20} {starter_summary(name)}")
        return 0
    try:
        if from_hf is None:
            path = path or DEFAULT_PATH
            written = init_spec(path, model, schema=schema)
        else:
            written = _from_hf(from_hf, path, placement, schema)
    except InitError as err:
        click.echo(f"moegen init: {err}; nothing written", err=True)
        return 2
    specs = [done for done in written if done.name != SCHEMA_NAME]
    for done in written:
        click.echo(f"wrote {done}", err=True)
    if schema and (stale := stale_schema(specs[0])):
        click.echo(
            f"note: {stale} is not this moegen's schema: `moegen schema --write "
            f"--path {stale}` updates it",
            err=True,
        )
    listed = " ".join(map(str, specs))
    click.echo(f"next: moegen validate {listed}; moegen build {listed} [--out DIR]", err=True)
    return 0


def _from_hf(source: Path, path: Path | None, placement: Any, schema: bool) -> list[Path]:
    """The specs of a transformers config's MoE layers, written (HfConfigError: InitError)."""
    from moegen.hf import HfConfigError, Placement, specs_from_hf

    try:
        drafts = specs_from_hf(source, path, placement or Placement())
    except HfConfigError as err:
        raise InitError(str(err)) from None
    texts = {target: draft.text for target, draft in drafts.items()}
    origins = {target: draft.origins for target, draft in drafts.items()}
    return write_specs(texts, schema=schema, origins=origins)
