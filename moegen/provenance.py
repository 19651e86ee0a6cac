"""Provenance: what proves that a file on disk was made by this user's moegen.

Whatever moegen reads back from disk (verification records, journals of interrupted writes,
the leftovers of killed runs) may have been planted by someone else who can write there: a
build cache restored from another branch or a fork, a shared parent directory, a
world-writable /tmp. Names and contents can be copied; a secret cannot. moegen keeps one
per user, outside every cache and output directory:

- `$MOEGEN_SECRET` when set (a CI secret: forks and other branches' jobs do not see it), else
- 32 random bytes in `$MOEGEN_STATE_DIR/secret` (default `$XDG_STATE_HOME/moegen`, else
  `~/.local/state/moegen`), made on first use with O_EXCL, mode 0600, in a directory of mode
  0700; a key file or directory another user owns, or that others may write, is not used.

With it, moegen signs (HMAC-SHA256) what it will later trust: the records it keeps, the
journals it writes, and the very names of its temporaries, stages and scratch directories
(`<prefix><mark><pid>-<start>-<nonce>-<tag>`, the tag binding the name to its directory).
Without it (no writable state directory), nothing is trusted: no record is reused, no
journal is replayed and no leftover is removed; moegen still builds (and `moegen build`
says once why reuse is off, and the fix: no_key_reason).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import shlex
import shutil
import stat
from contextlib import suppress
from pathlib import Path
from typing import Any

from moegen import interrupts

SECRET_ENV, STATE_ENV = "MOEGEN_SECRET", "MOEGEN_STATE_DIR"
_KEY_BYTES = 32
_NONCE = re.compile(r"(\d+)-(\d+)-([0-9a-f]{16})-([0-9a-f]{16})")


def state_dir() -> Path:
    """Private state: $MOEGEN_STATE_DIR, $XDG_STATE_HOME/moegen or ~/.local/state/moegen."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "moegen"


_keys: dict[tuple[str, str], bytes | None] = {}
_no_key_reasons: dict[tuple[str, str], str] = {}


def secret() -> bytes | None:
    """This user's key, or None when there is none to be had safely (see the module's doc)."""
    where = (os.environ.get(SECRET_ENV, ""), str(state_dir()))
    if where not in _keys:
        if where[0]:
            _keys[where] = _derive(where[0].encode())
        else:
            _keys[where], reason = _key_file()
            _no_key_reasons[where] = reason
    return _keys[where]


def no_key_reason() -> str | None:
    """Why secret() is None, with what to do about it, in a few words; None when it is not."""
    if secret() is not None:
        return None
    return _no_key_reasons.get((os.environ.get(SECRET_ENV, ""), str(state_dir())))


def _derive(text: bytes) -> bytes:
    return hashlib.sha256(b"moegen secret\0" + text).digest()


def _unsafe(path: Path, st: os.stat_result, kind: int) -> str | None:
    """Why `path` (`st`, not following a link) is not this user's alone to trust, and the
    fix; None when it is: ours, of the expected kind, and nobody else may write it (or read
    it, for the key)."""
    what = "directory" if kind == stat.S_IFDIR else "file"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (make it a {what} of your own)"
    if stat.S_IFMT(st.st_mode) != kind:
        return f"{path} is not a {what}"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to another user"
    if kind == stat.S_IFDIR and st.st_mode & 0o022:
        return f"{path} is writable by other users (run: chmod go-w {shlex.quote(str(path))})"
    if kind == stat.S_IFREG and st.st_mode & 0o077:
        return f"{path} is open to other users (remove it: moegen makes a new key)"
    return None


def state_problem(name: str | None = None) -> str | None:
    """Why the state directory, or the directory `name` in it, is no place only this user
    can write; None when it is one. Each is made, mode 0700, where missing; `name` only in a
    state directory that is private (one that is not will not be used)."""
    directory = state_dir()
    for path in (directory, *([directory / name] if name else [])):
        try:
            if not os.path.lexists(path):
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
            problem = _unsafe(path, os.lstat(path), stat.S_IFDIR)
        except OSError as err:
            problem = f"{path} cannot be made ({err.strerror or err})"
        if problem is not None:
            return problem
    return None


def private_directory(name: str) -> Path | None:
    """`name` under the state directory, made mode 0700 if need be: a place only this user
    can write, for what moegen runs without checking it (JAX's compiled executables). None
    when the state directory or it is not private (state_problem says why)."""
    return None if state_problem(name) else state_dir() / name


def _key_file() -> tuple[bytes | None, str]:
    """The key in the state directory, made if missing; else None and why not."""
    problem = state_problem()
    if problem is not None:
        return None, problem
    path, key = state_dir() / "secret", b""
    try:
        if not os.path.lexists(path):
            _create_key(path)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return None, f"{path} is a symbolic link (remove it: moegen makes a new key)"
        return None, f"{path} cannot be made or read ({err.strerror or err})"
    try:
        st = os.fstat(fd)
        problem = _unsafe(path, st, stat.S_IFREG)
        key = key if problem else os.read(fd, _KEY_BYTES + 1)
    except OSError as err:
        problem = f"{path} cannot be read ({err.strerror or err})"
    finally:
        os.close(fd)
    if problem is None and len(key) != _KEY_BYTES:
        problem = f"{path} is not a key moegen made (remove it: moegen makes a new one)"
    return (None, problem) if problem else (key, "")


def _create_key(path: Path) -> None:
    """The key written whole under a private name, then linked into place: a second process
    making one at the same moment finds either none or a whole one, never half of one."""
    temp = path.with_name(f".secret-{secrets.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(_KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        with suppress(FileExistsError):  # another process won: its key is the key
            os.link(temp, path)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temp)


def sign(purpose: str, payload: bytes) -> str | None:
    """HMAC-SHA256 (hex) of `payload` for `purpose` under this user's key; None without one."""
    key = secret()
    if key is None:
        return None
    return hmac.new(key, purpose.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def signed_by_us(purpose: str, payload: bytes, signature: object) -> bool:
    expected = sign(purpose, payload)
    return (
        expected is not None
        and isinstance(signature, str)
        and signature.isascii()  # compare_digest refuses other strings (a forged record)
        and hmac.compare_digest(expected, signature)
    )


# ---------------------------------------------------------------------------------------
# Files read back


class NotOurs(Exception):
    """A file read back is not one this user's moegen could have written: why, in a few words."""


def read_own_json(
    path: str | os.PathLike[str], limit: int, *, dir_fd: int | None = None
) -> tuple[Any, os.stat_result] | None:
    """The JSON of `path` (relative to the open directory `dir_fd`, if given) and the stat of
    the file it was read from, read as an untrusted spec is: opened without following a link
    or blocking on a FIFO, a regular file of this user, at most `limit` bytes, no NaN or
    Infinity, nesting bounded by the parser's recursion. None when there is no such file (or
    no directory for it); NotOurs otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:  # ELOOP: a symlink; EACCES...
        reason = "a symbolic link" if err.errno == errno.ELOOP else err.strerror
        raise NotOurs(reason or "cannot be opened") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotOurs("not a regular file")
        if st.st_uid != os.geteuid():
            raise NotOurs("owned by another user")
        if st.st_size > limit:
            raise NotOurs(f"larger than {limit} bytes")
        try:
            return json.loads(os.read(fd, limit + 1), parse_constant=_no_constant), st
        except (OSError, ValueError, RecursionError) as err:
            reason = "nested too deep" if isinstance(err, RecursionError) else "not JSON"
            raise NotOurs(reason) from None
    finally:
        os.close(fd)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no figure")


# ---------------------------------------------------------------------------------------
# Names that prove who made them


# a directory is named by its path or, for a write that must not follow a link on the way
# to it, by a descriptor of it opened without following one (moegen.verify.records.record)
Directory = str | os.PathLike[str] | int


def _directory_id(directory: Directory) -> bytes:
    st = os.stat(directory)
    return f"{st.st_dev}:{st.st_ino}".encode()


def _tag(directory: Directory, prefix: str, mark: str, token: str) -> str | None:
    payload = b"\0".join((_directory_id(directory), prefix.encode(), mark.encode(), token.encode()))
    signature = sign("leftover name", payload)
    return None if signature is None else signature[:16]


def owned_name(directory: Directory, prefix: str, mark: str) -> str:
    """A new name for an entry of `directory` that moegen may make and later remove:
    `<prefix><mark><pid>-<start>-<nonce>-<tag>`. Without a key the tag is one no check
    accepts (what is left behind then stays)."""
    token = f"{interrupts.owner_token()}-{secrets.token_hex(8)}"
    try:
        tag = _tag(directory, prefix, mark, token)
    except OSError:
        tag = None
    return f"{prefix}{mark}{token}-{tag or 'untrusted'}"


def made_by_us(directory: str | os.PathLike[str], name: str, mark: str) -> tuple[int, int] | None:
    """(pid, start) of the process that made `name` in `directory`, when the name proves it
    was this user's moegen (exact form, tag under our key, entry owned by us); else None."""
    at = name.rfind(mark)
    match = _NONCE.fullmatch(name[at + len(mark) :]) if at >= 0 else None
    if match is None:
        return None
    token = "-".join(match.groups()[:3])
    try:
        tag = _tag(directory, name[:at], mark, token)
        owner = os.lstat(os.path.join(directory, name)).st_uid
    except OSError:
        return None
    if tag is None or not hmac.compare_digest(tag, match[4]) or owner != os.geteuid():
        return None
    return int(match[1]), int(match[2])


def leftovers(directory: str | os.PathLike[str], mark: str) -> list[str]:
    """Entries of `directory` under `mark` that this user's moegen made and whose maker is
    dead. A name that merely looks like one (no valid tag, another owner) is never listed."""
    try:
        with os.scandir(directory) as listing:
            names = [entry.name for entry in listing if mark in entry.name]
    except OSError:
        return []
    found = []
    for name in names:
        owner = made_by_us(directory, name, mark)
        if owner is not None and not interrupts.owner_alive(*owner):
            found.append(os.path.join(directory, name))
    return found


def remove_leftovers(directory: str | os.PathLike[str], *marks: str) -> None:
    """Remove what dead moegen processes of this user left in `directory` under these marks."""
    for mark in marks:
        for path in leftovers(directory, mark):
            remove_tree(path)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a file, or a directory tree moegen made (its directories made writable first:
    a stage copies the modes of the tree it reproduces, 0555 included). Never raises."""
    if not os.path.isdir(path) or os.path.islink(path):
        with suppress(OSError):
            os.unlink(path)
        return
    for folder, dirs, _ in os.walk(path):
        for name in (folder, *(os.path.join(folder, d) for d in dirs)):
            with suppress(OSError):
                st = os.lstat(name)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                    os.chmod(name, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)
