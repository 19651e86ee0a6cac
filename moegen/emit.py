"""Stage 6, emit: write generated modules atomically.

Each file is written to a temporary sibling and renamed over its target, so a reader
never sees half a module; `write_all` writes nothing unless every file is ready.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_all(files: dict[Path, str]) -> None:
    """Write every file or none: all temporaries are complete before the first rename."""
    staged: list[tuple[Path, Path]] = []
    try:
        for target, text in files.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(text)
            staged.append((Path(tmp), target))
        for tmp, target in staged:
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
