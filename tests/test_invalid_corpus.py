"""The invalid-spec corpus: every file in tests/invalid_specs/ must be refused with exactly
the located diagnostics in its golden `.expected` file, by the library and by the CLI.

To regenerate the goldens after an intended message change:

    MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/test_invalid_corpus.py

then read the diff: every golden is a promise about what a user sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moegen.diagnostics import SpecError
from moegen.pipeline import load_valid

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPUS_DIR = Path("tests/invalid_specs")  # relative to REPO_ROOT, as shown in messages
# Cases whose golden states the intended text while moegen still prints something else;
# their tests are strict xfails, and MOEGEN_UPDATE_GOLDENS leaves their goldens alone.
KNOWN_BUGS: dict[str, str] = {}
CASES = [
    pytest.param(
        path,
        id=path.stem,
        marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[path.stem])]
        if path.stem in KNOWN_BUGS
        else [],
    )
    for path in sorted((REPO_ROOT / CORPUS_DIR).glob("*.yaml"))
]
CASE_IDS = [param.id for param in CASES]
UPDATE = os.environ.get("MOEGEN_UPDATE_GOLDENS") == "1"
EXIT_INVALID = 3


def _relative(case: Path) -> Path:
    return CORPUS_DIR / case.name


def _golden_path(case: Path) -> Path:
    return case.with_suffix(".expected")


def _golden(case: Path) -> str:
    golden = _golden_path(case)
    if not golden.is_file():
        pytest.fail(f"{golden} is missing; run with MOEGEN_UPDATE_GOLDENS=1 to create it")
    return golden.read_text(encoding="utf-8")


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MOEGEN_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "moegen", *args],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 20, CASES


def test_every_case_has_a_golden_and_every_golden_a_case() -> None:
    goldens = sorted((REPO_ROOT / CORPUS_DIR).glob("*.expected"))
    assert [g.stem for g in goldens] == CASE_IDS


def test_known_bugs_are_cases() -> None:
    assert set(KNOWN_BUGS) <= set(CASE_IDS)


@pytest.mark.parametrize("case", CASES)
def test_load_valid_reports_golden_diagnostics(case: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(SpecError) as info:
        load_valid(_relative(case))
    actual = "\n".join(d.text() for d in info.value.diagnostics) + "\n"
    if UPDATE and case.stem not in KNOWN_BUGS:
        _golden_path(case).write_text(actual, encoding="utf-8")
    assert actual == _golden(case)
    # Every diagnostic is located in this file, on a line that exists (1 for an empty file).
    lines = max(1, len((REPO_ROOT / _relative(case)).read_bytes().splitlines()))
    for d in info.value.diagnostics:
        assert d.file == _relative(case).as_posix()
        assert 1 <= d.line <= lines, d
        assert d.column >= 1, d


@pytest.mark.parametrize("case", CASES)
def test_cli_validate_reports_golden_in_every_format(case: Path) -> None:
    golden = _golden(case)
    path = _relative(case).as_posix()

    text = _run_cli("validate", path)
    assert text.returncode == EXIT_INVALID, text
    assert golden.rstrip("\n") in text.stderr
    assert "Traceback" not in text.stdout + text.stderr
    assert "internal error" not in text.stderr

    as_json = _run_cli("validate", "--format", "json", path)
    assert as_json.returncode == EXIT_INVALID, as_json
    assert "Traceback" not in as_json.stdout + as_json.stderr
    items = json.loads(as_json.stdout)
    assert isinstance(items, list) and items
    for item in items:
        assert isinstance(item, dict)
        assert set(item) == {"file", "line", "column", "field", "message"}
        assert isinstance(item["line"], int) and isinstance(item["column"], int)
    rebuilt = [
        f"{i['file']}:{i['line']}:{i['column']}: "
        + (f"{i['field']}: " if i["field"] else "")
        + i["message"]
        for i in items
    ]
    assert "\n".join(rebuilt) + "\n" == golden

    github = _run_cli("validate", "--format", "github", path)
    assert github.returncode == EXIT_INVALID, github
    assert "Traceback" not in github.stdout + github.stderr
    lines = github.stdout.splitlines()
    assert len(lines) == len(golden.splitlines())
    for line, expected in zip(lines, golden.splitlines(), strict=True):
        assert line.startswith(f"::error file={path},line="), line
        assert line.endswith("::" + expected), line
