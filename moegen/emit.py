"""Stage 7, emit: write generated modules all or nothing, even when the process is killed.

`write_all(files, out_dir=OUT)`, what `moegen build` uses, commits by one directory swap:
1. under a flock of OUT's parent (moegen writers take turns), clear what this user's dead
   runs provably left (names and journals signed with its key: moegen.provenance);
2. build the whole new directory as a hidden sibling, `.<name>.moegen-stage-<owner>`: OUT's
   tree reproduced (hard links, copies where a link fails, directories and symlinks, same
   modes), each module written into it; fsync every new file and every stage directory;
3. renameat2(RENAME_EXCHANGE) stage and OUT, fsync the parent: the commit point. The
   exchange is atomic, so at every instant, and after a crash, the name OUT holds the whole
   old tree or the whole new one (a new OUT: the stage is renamed onto it);
4. remove the stage, now the old tree.
No progress record is needed: a kill at any moment leaves at most the stage, outside OUT
(`moegen check` never looks there), and removing it is right whether the kill came before
step 3 (it holds the unused new tree) or after (the old one). The next write removes stages
whose owner is dead (pid and start time, moegen.interrupts). SIGINT, SIGTERM and SIGHUP raise
an exception whose `finally` removes the stage at once; they wait across the exchange and
the removal (after the commit point they leave the new set).

Journaled per-file protocol instead where OUT is the current directory or an ancestor of it
(the swap would strand this process and the user's shell in a deleted directory), is
another user's (the new one would be ours), is or holds a mount point, holds other than
files, directories and symlinks, cannot be staged beside, or where the kernel or file system
refuses the exchange (EINVAL, ENOSYS, EXDEV...): each file is staged beside its target
(`.<file>.moegen-tmp-<owner>`, fsynced), each existing target gets a hard-link backup
(`.moegen-old-`), a journal naming them is made durable beside OUT; then, signals blocked,
the temporaries are renamed over the targets, the directories fsynced and the journal
removed (the commit point). A failure before it rolls back from the backups, as does the
next write after a SIGKILL (`recover` replays the journal). All or nothing under SIGINT,
SIGTERM and SIGHUP, then; but a SIGKILL between two renames leaves a mixed set and
temporaries until the next moegen write: SIGKILL safety needs the exchange.

The swap loses changes other programs make to OUT meanwhile, and OUT's inode and extended
attributes. Without OUT, one file is temporary + fsync + rename + directory fsync (`moegen
tune`, `moegen schema --write`); several use the journaled protocol.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from moegen import interrupts, provenance
from moegen.journal import OLD as _OLD
from moegen.journal import TMP as _TMP
from moegen.journal import Journal, discard, recover_journals, roll_back, unlink

_STAGE = ".moegen-stage-"
_RENAME_NOREPLACE, _RENAME_EXCHANGE, _AT_FDCWD = 1, 2, -100
# renameat2's number where libc has no wrapper (glibc < 2.28)
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "riscv64": 276, "ppc64le": 357, "s390x": 347}


def make_folders(folder: Path) -> list[Path]:
    """Create `folder` and its missing ancestors; the ones created, outermost first, for
    `remove_folders` to undo. On OSError those made so far are removed, then it is raised."""
    missing = [p for p in [folder, *folder.parents] if not os.path.lexists(p)]
    made: list[Path] = []
    try:
        for parent in reversed(missing):
            parent.mkdir()
            made.append(parent)
    except OSError:
        remove_folders(made)
        raise
    return made


def remove_folders(made: list[Path]) -> None:
    """Remove the folders `make_folders` made, innermost first, each only while empty (one
    that is not is someone else's now)."""
    for folder in reversed(made):
        with suppress(OSError):
            folder.rmdir()


class _NoExchange(Exception):
    """OUT cannot be swapped as a whole: use the journaled protocol."""


def write_all(files: dict[Path, str], *, out_dir: Path | None = None) -> None:
    """Write every file or none; with `out_dir` (every target inside it), by one exchange."""
    # Encoding errors surface before anything on disk changes.
    data = {Path(target): text.encode("utf-8") for target, text in files.items()}
    if len(data) == 1 and out_dir is None:
        [(target, blob)] = data.items()
        _write_one(target, blob)
    elif data:
        root = out_dir or Path(os.path.commonpath([os.path.abspath(t.parent) for t in data]))
        _write_tree(Path(root), data, swap=out_dir is not None)


class ChangedOnDisk(OSError):
    """The user's file is no longer the text it was read as: a rewrite would lose an edit."""


def rewrite_in_place(path: Path, text: str, was: str) -> None:
    """Replace a user's own file (the spec `moegen tune` rewrites) atomically, as write_all
    writes one file, but through a symlink to the file it names (the link stays a link) and
    keeping the file's permission bits; refused (ChangedOnDisk) where the file is no longer
    `was`, the text it was read as minutes before (an edit made meanwhile is kept)."""
    blob = text.encode("utf-8")
    target = Path(os.path.realpath(path))
    expected = was.encode("utf-8")  # its size first: a file grown meanwhile is not read
    if os.stat(target).st_size != len(expected) or target.read_bytes() != expected:
        raise ChangedOnDisk("it changed on disk since it was read")
    _write_one(target, blob, stat.S_IMODE(os.stat(target).st_mode))


def recover(out_dir: Path) -> None:
    """Clear what dead runs left around `out_dir`: stages, journals (rolled back), temporaries."""
    real = Path(os.path.realpath(out_dir))
    with suppress(OSError):  # best effort: a write would report the same problem, located
        with _locked(real.parent):
            _recover(real)


def _write_one(target: Path, blob: bytes, mode: int = 0o644) -> None:
    _refuse_dangling_links(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    provenance.remove_leftovers(target.parent, _TMP)
    tmp = _sibling(target, _TMP)
    try:
        _write_file(tmp, blob, mode)
        _trace(f"write {target.name}")
        with interrupts.blocked():
            os.replace(tmp, target)
            _fsync(target.parent)
        _trace(f"rename {target.name}")
    finally:
        unlink(tmp)


def _sibling(path: Path, mark: str) -> Path:
    """A new name beside `path` that proves who made it (moegen.provenance). Every name is
    noted before its file is made: an interrupt between the two must not leave a file
    nobody removes."""
    return path.with_name(provenance.owned_name(path.parent, f".{path.name[:64]}", mark))


def _write_file(path: Path, blob: bytes, mode: int = 0o644) -> None:
    """`blob` in the new file `path`, `mode` (0644), fsynced."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
        handle.write(blob)
        handle.flush()
        os.fchmod(handle.fileno(), mode)
        os.fsync(handle.fileno())


def check_out_dir(out_dir: Path, targets: Iterable[Path]) -> tuple[Path, list[str]]:
    """OSError when no protocol could write `targets` into `out_dir` (asked before a build
    spends minutes verifying, and again at the write); else the real OUT, targets in it."""
    real = Path(os.path.realpath(out_dir))  # a symlinked OUT: its target is written
    relative = [os.path.relpath(os.path.abspath(t), os.path.abspath(out_dir)) for t in targets]
    if any(rel.split(os.sep)[0] in ("..", ".") for rel in relative):
        raise ValueError(f"not every file is inside {out_dir}")
    _refuse_unwritable_out(out_dir, real, relative)
    return real, relative


def _write_tree(out_dir: Path, data: dict[Path, bytes], *, swap: bool) -> None:
    real, names = check_out_dir(out_dir, data)  # a symlinked OUT: swap its target, keep the link
    relative = dict(zip(names, data.values(), strict=True))
    real.parent.mkdir(parents=True, exist_ok=True)
    with _locked(real.parent):
        _recover(real)
        _trace("recovered")
        if swap and _may_swap(real):
            with suppress(_NoExchange):
                return _swap(real, relative)
        _write_journaled(real, {real / rel: blob for rel, blob in relative.items()})


def _refuse_unwritable_out(out_dir: Path, real: Path, relative: list[str]) -> None:
    """What no protocol can write, refused before anything is staged."""
    if not str(out_dir).isprintable():  # as a spec's path: a name that prints as another
        raise OSError(errno.EINVAL, "a path with a control character", str(out_dir))
    # `link/..` is the link's parent to a shell's cd but its target's to the kernel (every
    # write): refused, not guessed, since either reading writes where the other was meant
    if real != Path(os.path.realpath(os.path.normpath(out_dir))):
        raise OSError(errno.EINVAL, f"`..` climbs out of a symbolic link, to {real}", str(out_dir))
    if real.parent == real:
        message = "the file system's root (moegen stages its output beside it)"
        raise OSError(errno.EINVAL, message, str(out_dir))
    if os.path.lexists(real) and not real.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(out_dir))
    for rel in relative:
        if (real / rel).is_dir():
            message = "a directory where the module would be written"
            raise IsADirectoryError(errno.EISDIR, message, str(out_dir / rel))
    _refuse_dangling_links(out_dir)


def _refuse_dangling_links(path: Path) -> None:
    """A symlink on the way to `path` whose target is missing: refused, rather than making
    directories wherever the link points."""
    for at in (Path(os.path.abspath(path)), *Path(os.path.abspath(path)).parents):
        if os.path.islink(at) and not os.path.exists(at):
            message = f"a symbolic link to {os.readlink(at)!r}, which does not exist"
            raise FileNotFoundError(errno.ENOENT, message, str(at))


def _may_swap(real: Path) -> bool:
    """Whether OUT may be exchanged as a whole (a new OUT may always be renamed into place)."""
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return True
    with suppress(OSError):  # a current directory that was deleted holds nothing
        cwd = os.path.realpath(os.getcwd())
        if cwd == str(real) or cwd.startswith(str(real).rstrip(os.sep) + os.sep):
            return False  # the swap would strand this process and the user's shell
    return (
        st.st_uid == os.geteuid()  # the new directory is ours: keep the owner as it is
        and real.parent != real
        and st.st_dev == os.lstat(real.parent).st_dev  # not a mount point
    )


def _swap(real: Path, relative: dict[str, bytes]) -> None:
    parent, existed, stage = real.parent, real.is_dir(), _sibling(real, _STAGE)
    try:
        try:
            os.mkdir(stage)
        except OSError as err:
            raise _NoExchange(str(err)) from err
        _trace("stage")
        if existed:
            _reproduce(real, stage, set(relative))
            os.chmod(stage, stat.S_IMODE(os.lstat(real).st_mode))
        for rel, blob in relative.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            _write_file(stage / rel, blob)  # the stage is private and never links a target
            _trace(f"write {rel}")
        for directory, _, _ in os.walk(stage, topdown=False):
            _fsync(directory)
        _trace("sync stage")
        with interrupts.blocked():
            try:
                _renameat2(stage, real, _RENAME_EXCHANGE if existed else _RENAME_NOREPLACE)
            except OSError as err:
                raise _NoExchange(str(err)) from err
            _fsync(parent)
        _trace("exchange")
    finally:
        with interrupts.blocked():
            provenance.remove_tree(stage)  # every failure path too: permissions, ENOSPC...
    _trace("remove stage")


def _reproduce(src: Path, dst: Path, skip: set[str], rel: str = "") -> None:
    """OUT's tree under the stage: hard links, recreated directories and symlinks."""
    device = os.lstat(src).st_dev
    try:
        with os.scandir(src) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        for entry in entries:
            name, there = os.path.join(rel, entry.name), dst / entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev != device:
                    raise _NoExchange(f"{entry.path} is a mount point")
                os.mkdir(there, 0o700)
                _reproduce(Path(entry.path), there, skip, name)
                os.chmod(there, stat.S_IMODE(st.st_mode))
            elif name in skip:
                continue  # replaced by its new content
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(entry.path), there)
            elif stat.S_ISREG(st.st_mode):
                try:
                    os.link(entry.path, there, follow_symlinks=False)
                except OSError:  # another owner's file (protected_hardlinks), link limit
                    shutil.copy2(entry.path, there, follow_symlinks=False)
                    _fsync(there)
            else:
                raise _NoExchange(f"{entry.path} is not a file, directory or symlink")
            _trace(f"link {name}")
    except OSError as err:
        raise _NoExchange(str(err)) from err


def _renameat2(src: Path, dst: Path, flags: int) -> None:
    """Linux renameat2 through libc, or the raw system call where libc lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    args = [ctypes.c_int(_AT_FDCWD), os.fsencode(src), ctypes.c_int(_AT_FDCWD), os.fsencode(dst)]
    args.append(ctypes.c_uint(flags))
    if hasattr(libc, "renameat2"):
        result = libc.renameat2(*args)
    elif platform.system() == "Linux" and platform.machine() in _SYS_RENAMEAT2:
        result = libc.syscall(ctypes.c_long(_SYS_RENAMEAT2[platform.machine()]), *args)
    else:
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(src))
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(src), None, str(dst))


def _write_journaled(root: Path, data: dict[Path, bytes]) -> None:
    entries: list[list] = []  # [target, temporary, backup or None, the temporary's inode]
    journal = Journal.beside(root)
    committed = whole = False  # whole: old or new set in place, temporaries may go
    try:
        for target, blob in data.items():
            if os.path.isdir(target) and not os.path.islink(target):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
            target.parent.mkdir(parents=True, exist_ok=True)
            entry = [str(target), str(_sibling(target, _TMP)), None, 0]
            entries.append(entry)
            _write_file(Path(entry[1]), blob)
            entry[3] = os.lstat(entry[1]).st_ino
            _trace(f"write {target.name}")
            if os.path.lexists(target):
                entry[2] = str(_sibling(target, _OLD))
                _backup(target, Path(entry[2]))
                _trace(f"backup {target.name}")
        journaled = journal.write(root, entries, _fsync)
        _trace("journal")
        with interrupts.blocked():
            for target, tmp, _, _ in entries:
                os.replace(tmp, target)
                _trace(f"rename {Path(target).name}")
            for directory in sorted({os.path.dirname(e[0]) for e in entries}):
                _fsync(directory)
            if journaled:
                os.unlink(journal.path)
                _fsync(journal.path.parent)
            committed = whole = True
        _trace("commit")
    except BaseException:
        if not committed:
            with interrupts.blocked():
                roll_back(entries, _fsync)  # should this fail, the journal stays for recover()
                whole = True
        raise
    finally:
        if whole:
            with interrupts.blocked():
                discard(entries)
                journal.remove()


def _backup(target: Path, backup: Path) -> None:
    try:
        os.link(target, backup, follow_symlinks=False)
    except OSError:
        shutil.copy2(target, backup, follow_symlinks=False)
        _fsync(backup)
    _fsync(target.parent)


def _recover(real: Path) -> None:
    recover_journals(real, _fsync)  # before the sweep below: it needs the backups
    provenance.remove_leftovers(real.parent, _STAGE, _TMP)
    if real.is_dir() and not real.is_symlink():
        provenance.remove_leftovers(real, _TMP, _OLD)


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive flock of `directory` (none where the file system refuses one)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fsync(path: str | Path) -> None:
    """fsync a file or a directory (a file system that cannot sync a directory: skipped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def _trace(step: str) -> None:
    """Test hook (tests/emit/test_signals.py): MOEGEN_EMIT_TRACE="W,R", two inherited pipe fds.
    Name the step just done on W, wait for a byte or end of file on R: a test can signal
    this process between any two system calls of the write."""
    fds = os.environ.get("MOEGEN_EMIT_TRACE")
    if fds:
        write_fd, read_fd = (int(fd) for fd in fds.split(","))
        os.write(write_fd, step.encode("utf-8", "replace") + b"\n")
        os.read(read_fd, 1)
