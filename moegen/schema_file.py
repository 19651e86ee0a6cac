"""The schema file of `moegen schema --check` and `--write`: the path is the user's, so every
way it can fail is a located message (SchemaPathError), never an internal error, and a failed
write leaves the disk as it was."""

from __future__ import annotations

import codecs
import os
import shlex
import stat
from pathlib import Path


class SchemaPathError(Exception):
    """A --path that `moegen schema` cannot read or write; the message names it and says why."""


def shown(path: Path, *, shell: bool = False) -> str:
    """`path` for a one-line message: quoted when it holds a control character (a newline in
    a file name must not start a line of its own) or is empty (click reads '' as '.'), and
    with `shell`, as a shell would read it (a command to run)."""
    if path == Path():
        return "''"
    text = str(path)
    if not text.isprintable():
        return repr(text)
    return shlex.quote(text) if shell else text


def check_file(path: Path, text: str) -> tuple[str, str]:
    """('fresh' | 'missing' | 'stale', a note for a stale file or '') of the file at `path`
    against `text`; SchemaPathError when it is there but no regular file moegen can read."""
    blob = text.encode("utf-8")
    data = _read_head(path, len(blob) + 1)
    if data is None:
        return "missing", ""
    if data == blob:
        return "fresh", ""
    # An editor may have saved it as UTF-16 (b"\xff\xfe..."): say so, the fix is the same.
    # The head of a longer file may end inside a character: only a full one is final.
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=len(data) <= len(blob))
    except UnicodeDecodeError:
        return "stale", "not UTF-8 text"
    return "stale", ""


def _read_head(path: Path, size: int) -> bytes | None:
    """The first `size` bytes of the regular file `path` (no more: a huge file is stale
    whatever follows), or None when nothing is at `path`."""
    _refuse_no_name(path, "read")
    _refuse_blocked_parents(path, "read")
    try:
        os.stat(path)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise SchemaPathError(f"cannot read {shown(path)}: it is {_kind(path)}") from None
        return None
    except OSError as err:
        raise SchemaPathError(f"cannot read {shown(path)}: {err.strerror}") from None
    _refuse_irregular(path, "read")  # before opening: opening a FIFO would wait for a writer
    try:
        # O_NONBLOCK: should a FIFO have replaced the file since, open it without waiting
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise SchemaPathError(f"cannot read {shown(path)}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SchemaPathError(f"cannot read {shown(path)}: it is no longer a regular file")
        try:
            return handle.read(size)
        except OSError as err:
            raise SchemaPathError(f"cannot read {shown(path)}: {err.strerror}") from None


def write_file(path: Path, text: str) -> None:
    """`text` to `path` atomically (moegen.emit: a temporary beside it, fsynced, renamed over
    it): a regular file there is replaced (a symlink's target, keeping the link), anything
    else refused. SchemaPathError when it cannot be written; the disk is then as it was."""
    from moegen.emit import make_folders, remove_folders, write_all

    target = _write_target(path)
    try:
        made = make_folders(target.parent)
    except OSError as err:
        folder = shown(Path(err.filename or target.parent))
        raise SchemaPathError(
            f"cannot write {shown(path)}: cannot create the folder {folder}: {err.strerror}"
        ) from None
    try:
        write_all({target: text})  # removes its temporary whatever happens
    except BaseException as err:
        remove_folders(made)  # nothing is left behind
        if isinstance(err, OSError):
            raise SchemaPathError(f"cannot write {shown(path)}: {err.strerror or err}") from None
        raise


def _write_target(path: Path) -> Path:
    """The file that writing `path` replaces or creates: `path`, or a symlink's target."""
    _refuse_no_name(path, "write")
    _refuse_blocked_parents(path, "write")
    try:
        os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as err:
        raise SchemaPathError(f"cannot write {shown(path)}: {err.strerror}") from None
    if os.path.islink(path) and not os.path.exists(path):
        raise SchemaPathError(f"cannot write {shown(path)}: it is {_kind(path)}")
    _refuse_irregular(path, "write")
    return Path(os.path.realpath(path))


def _refuse_no_name(path: Path, verb: str) -> None:
    """Refuse a path that ends in no file name ('', '.', 'x/..')."""
    if path.name in ("", ".", ".."):
        # click turns '' into Path('.'); an existing '.' it refuses as a directory
        raise SchemaPathError(f"cannot {verb} {shown(path)}: the path names no file")


def _refuse_blocked_parents(path: Path, verb: str) -> None:
    """Refuse a path whose parent is not a folder (a file, a dangling symlink)."""
    for parent in path.parents:
        if os.path.lexists(parent) and not parent.is_dir():
            raise SchemaPathError(
                f"cannot {verb} {shown(path)}: {shown(parent)} is {_kind(parent)}"
            )


def _refuse_irregular(path: Path, verb: str) -> None:
    """Refuse what is at `path` (followed) unless it is a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise SchemaPathError(f"cannot {verb} {shown(path)}: {err.strerror}") from None
    if not stat.S_ISREG(mode):
        raise SchemaPathError(
            f"cannot {verb} {shown(path)}: it is {_kind(path)}, not a regular file"
        )


def _kind(path: Path) -> str:
    """What is at `path`, in words, for a message."""
    if os.path.islink(path) and not os.path.exists(path):
        return f"a symlink to {os.readlink(path)!r}, which does not exist"
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        return f"unreadable ({err.strerror})"
    kinds = [
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISREG, "a file, not a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ]
    return next((words for test, words in kinds if test(mode)), "not a regular file")
