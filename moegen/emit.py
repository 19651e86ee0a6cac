"""Stage 6, emit: write generated modules atomically, all of them or none.

Every file is first written in full to a temporary sibling; only then are the targets
replaced, each by an atomic rename. Should a rename fail midway, the targets already
replaced get their previous content back, so a failed build leaves the tree as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_all(files: dict[Path, str]) -> None:
    """Write every file or none (previous contents restored on failure)."""
    staged: list[tuple[Path, Path]] = []
    previous: dict[Path, bytes | None] = {}
    replaced: list[Path] = []
    try:
        for target, text in files.items():
            staged.append((_stage(target, text), target))
        for tmp, target in staged:
            previous[target] = target.read_bytes() if target.is_file() else None
            os.replace(tmp, target)
            replaced.append(target)
    except BaseException:
        _restore(replaced, previous)
        raise
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def _stage(target: Path, text: str) -> Path:
    """The full text in a temporary file beside `target` (same file system: atomic rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _restore(replaced: list[Path], previous: dict[Path, bytes | None]) -> None:
    for target in reversed(replaced):
        old = previous[target]
        if old is None:
            target.unlink(missing_ok=True)
        else:
            target.write_bytes(old)
