"""Reading a spec file from a path nobody vetted: a regular file only, without blocking, and
never more than the size limit (plus one byte, to tell that it is over).

A path can name a FIFO (reading blocks until a writer comes, maybe never), a device
(/dev/zero never ends), a directory or a socket, directly or through a symlink; a file can
grow while it is read, or report a size it does not have (/proc). So the path is stat'ed
before it is opened (a device is never opened), opened non-blocking, stat'ed again through
the open descriptor (what is read is what was checked, whatever the path names by then),
and read up to the limit + 1.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_KINDS = [
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
]


class SpecFileProblem(Exception):
    """Why the spec file cannot be read, as a message for its diagnostic."""


def _not_regular(mode: int) -> SpecFileProblem | None:
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    return SpecFileProblem(f"spec path is {kind}, not a regular file; give a YAML file's path")


def _too_big(size: int, limit: int) -> SpecFileProblem:
    return SpecFileProblem(f"spec is {size} bytes; at most {limit} are accepted")


def _cannot_read(err: OSError | ValueError) -> SpecFileProblem:
    reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return SpecFileProblem(f"cannot read spec: {reason}")


def read_spec_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed), at most `limit` of them;
    raises SpecFileProblem otherwise."""
    try:
        problem = _not_regular(os.stat(path).st_mode)
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise _cannot_read(err) from None
    if problem:
        raise problem
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as err:
        raise _cannot_read(err) from None
    try:
        info = os.fstat(fd)
        problem = _not_regular(info.st_mode)  # the path was swapped after the first stat
        if problem:
            raise problem
        if info.st_size > limit:
            raise _too_big(info.st_size, limit)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise _cannot_read(err) from None
    finally:
        os.close(fd)
    if size > limit:  # it grew after fstat, or its size was not what fstat said
        raise SpecFileProblem(f"spec is more than {limit} bytes; at most {limit} are accepted")
    return b"".join(chunks)
