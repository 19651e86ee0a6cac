"""`moegen check`: are the specs valid and every committed module fresh? No compiles.

Regenerates each module in memory and compares it with generated/; reports stale files
(with a unified diff), missing files and orphans (files no spec produces).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from moegen.diagnostics import Diagnostic, SpecError
from moegen.pipeline import generate, output_path


@dataclass
class CheckReport:
    invalid: list[Diagnostic] = field(default_factory=list)
    stale: dict[Path, str] = field(default_factory=dict)  # path -> unified diff
    missing: list[Path] = field(default_factory=list)
    orphans: list[Path] = field(default_factory=list)
    fresh: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.invalid or self.stale or self.missing or self.orphans)


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
        if not target.is_file():
            report.missing.append(target)
            continue
        committed = target.read_text(encoding="utf-8")
        if committed == generated.source:
            report.fresh.append(target)
        else:
            report.stale[target] = "".join(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    generated.source.splitlines(keepends=True),
                    fromfile=f"{target} (committed)",
                    tofile=f"{target} (from {generated.loaded.source.display})",
                )
            )
    if find_orphans and out_dir.is_dir():
        report.orphans = sorted(
            p
            for p in out_dir.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p not in expected
        )
    return report
