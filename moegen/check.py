"""`moegen check`: are the specs valid and every committed module fresh? No compiles.

Regenerates each module in memory and compares its bytes with the committed file: any
difference is stale, reported with a unified diff (control characters shown escaped, so a
damaged file cannot drive the terminal) and, where the diff cannot show it, a note on what
differs: line ends, bytes that are not UTF-8, a byte-order mark, the final newline. Also
reports missing files, unreadable ones (a directory, permission denied, not a regular file)
and orphans: every entry of the output directory that no spec produces, __pycache__ aside.
"""

from __future__ import annotations

import codecs
import difflib
import errno
import os
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from moegen.diagnostics import Diagnostic, SpecError
from moegen.pipeline import generate, output_path


@dataclass
class CheckReport:
    invalid: list[Diagnostic] = field(default_factory=list)
    stale: dict[Path, str] = field(default_factory=dict)  # path -> unified diff (may be "")
    notes: dict[Path, list[str]] = field(default_factory=dict)  # what the diff cannot show
    missing: list[Path] = field(default_factory=list)
    unreadable: dict[Path, str] = field(default_factory=dict)  # path -> why
    orphans: list[Path] = field(default_factory=list)
    fresh: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.invalid or self.stale or self.missing or self.unreadable or self.orphans)


def check(spec_paths: list[Path], out_dir: Path, *, find_orphans: bool) -> CheckReport:
    report = CheckReport()
    expected: set[Path] = set()
    for path in spec_paths:
        try:
            generated = generate(path)
        except SpecError as err:
            report.invalid.extend(err.diagnostics)
            expected.add(out_dir / f"{path.stem}.py")  # its module is not an orphan
            continue
        target = output_path(out_dir, generated)
        expected.add(target)
        want = generated.source.encode("utf-8")
        try:
            got, size = _read(target, limit=4 * len(want) + 65536)
        except FileNotFoundError:
            report.missing.append(target)
            continue
        except OSError as err:
            report.unreadable[target] = err.strerror or str(err)
            continue
        if got == want:
            report.fresh.append(target)
            continue
        display = generated.loaded.source.display
        report.stale[target], report.notes[target] = _compare(target, display, got, size, want)
    if find_orphans and out_dir.is_dir():
        report.orphans = sorted(_entries(out_dir, report) - expected)
    return report


def _read(target: Path, limit: int) -> tuple[bytes, int]:
    """At most `limit` bytes of `target` and its size; OSError unless a regular file."""
    # O_NONBLOCK: a FIFO put there must not hang the check (it is refused below).
    fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        with open(fd, "rb", closefd=False) as handle:
            return handle.read(limit), st.st_size
    finally:
        os.close(fd)


def _compare(target: Path, display: str, got: bytes, size: int, want: bytes) -> tuple[str, list]:
    """The unified diff of committed and generated text, and notes on what it cannot show."""
    notes = []
    try:
        got.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(got) - 3 or size <= len(got):  # not a character cut by the limit
            notes.append(f"not UTF-8 at byte {err.start}")
    if got.startswith(codecs.BOM_UTF8):
        notes.append("starts with a UTF-8 byte-order mark")
    if b"\r\n" in got and b"\r\n" not in want:
        crlf = got.count(b"\r\n")
        only = got.replace(b"\r\n", b"\n") == want
        notes.append(f"{'only ' if only else ''}line endings differ (CRLF on {crlf} lines)")
    elif b"\r" in got and b"\r" not in want:
        notes.append("carriage returns (CR) inside lines")
    if size > len(got):
        notes.append(f"{size} bytes where the module has {len(want)}; diff of the first {len(got)}")
    elif want.endswith(b"\n") and not got.endswith(b"\n"):
        notes.append("no newline at end of file")
    if got.replace(b"\r\n", b"\n") == want and got.count(b"\r\n") == got.count(b"\n"):
        return "", notes  # every line would be in the diff; the note says it all
    diff = difflib.unified_diff(
        _lines(got.decode("utf-8", errors="replace")),
        _lines(want.decode("utf-8")),
        fromfile=f"{target} (committed)",
        tofile=f"{target} (from {display})",
    )
    return "".join(diff), notes


def _lines(text: str) -> list[str]:
    """Lines split at "\\n" only (str.splitlines also splits at \\r, \\f, U+2028...), each
    ending in "\\n", with control and format characters escaped so that they show."""
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()
    return [_visible(part) + "\n" for part in parts]


def _visible(line: str) -> str:
    if line.isprintable():
        return line
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if ch != "\t" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")
        else ch
        for ch in line
    )


def _entries(out_dir: Path, report: CheckReport) -> set[Path]:
    """Every non-directory under `out_dir` (symlinks to directories too), __pycache__ aside."""

    def unreadable(err: OSError) -> None:
        report.unreadable[Path(err.filename)] = err.strerror or str(err)

    found = set()
    for folder, dirs, files in os.walk(out_dir, onerror=unreadable):
        links = [name for name in dirs if os.path.islink(os.path.join(folder, name))]
        dirs[:] = [name for name in dirs if name != "__pycache__" and name not in links]
        found.update(Path(folder) / name for name in files + links if name != "__pycache__")
    return found
