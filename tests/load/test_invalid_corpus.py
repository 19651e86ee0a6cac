"""The invalid-spec corpus: every file in tests/invalid_specs/ must be refused with exactly
the located diagnostics in its golden `.expected` file, by the library and by the CLI in every
format. The golden runner (tests/support/golden_runner.py) checks `moegen validate` against each golden
and writes them after an intended message change:

    MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/render/test_goldens.py

then read the diff: every golden is a promise about what a user sees.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO_ROOT, CliResult, run_moegen
from golden_runner import INVALID, expected_text

from moegen.diagnostics import SpecError
from moegen.pipeline import load_valid

CORPUS_DIR = INVALID.folder  # relative to REPO_ROOT, as shown in messages
CASES = [
    pytest.param(
        REPO_ROOT / INVALID.case(name),
        id=name,
        marks=[pytest.mark.xfail(strict=True, reason=INVALID.known_bugs[name])]
        if name in INVALID.known_bugs
        else [],
    )
    for name in INVALID.case_names()
]
EXIT_INVALID = 3


def _relative(case: Path) -> Path:
    return CORPUS_DIR / case.name


def _golden(case: Path) -> str:
    return expected_text(_relative(case))


@pytest.mark.parametrize("case", CASES)
def test_load_valid_reports_golden_diagnostics(case: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(SpecError) as info:
        load_valid(_relative(case))
    actual = "\n".join(d.text() for d in info.value.diagnostics) + "\n"
    assert actual == _golden(case)  # the library says what the CLI says
    # Every diagnostic is located in this file, on a line that exists (1 for an empty file).
    lines = max(1, len((REPO_ROOT / _relative(case)).read_bytes().splitlines()))
    for d in info.value.diagnostics:
        assert d.file == _relative(case).as_posix()
        assert 1 <= d.line <= lines, d
        assert d.column >= 1, d


@pytest.mark.parametrize("case", CASES)
def test_cli_validate_reports_golden_in_every_format(case: Path, invoke_main) -> None:
    """The console script's `main`, in this process (a process per case and format was most of
    this file's time); the next test holds a `python -m moegen` process to the same output."""
    golden = _golden(case)
    path = _relative(case).as_posix()

    def validate(*args: str) -> CliResult:
        return invoke_main("validate", *args, cwd=REPO_ROOT)

    text = validate(path)
    assert text.code == EXIT_INVALID, text
    assert golden.rstrip("\n") in text.stderr
    assert "Traceback" not in text.stdout + text.stderr
    assert "internal error" not in text.stderr

    as_json = validate("--format", "json", path)
    assert as_json.code == EXIT_INVALID, as_json
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

    github = validate("--format", "github", path)
    assert github.code == EXIT_INVALID, github
    assert "Traceback" not in github.stdout + github.stderr
    lines = github.stdout.splitlines()
    assert len(lines) == len(golden.splitlines())
    for line, expected in zip(lines, golden.splitlines(), strict=True):
        assert line.startswith(f"::error file={path},line="), line
        assert line.endswith("::" + expected), line


# A spread sample of the corpus (every sixth case; none a known bug): a process adds only its
# own encoding and exit status to what `main` prints.
PROCESS_SAMPLE = [
    REPO_ROOT / INVALID.case(name)
    for name in INVALID.case_names()[::6]
    if name not in INVALID.known_bugs
]


@pytest.mark.parametrize("case", PROCESS_SAMPLE)
@pytest.mark.parametrize("output", ["text", "json", "github"])
def test_a_moegen_process_reports_what_main_does(case: Path, output: str, invoke_main) -> None:
    path = _relative(case).as_posix()
    process = run_moegen("validate", "--format", output, path)
    in_process = invoke_main("validate", "--format", output, path, cwd=REPO_ROOT)
    assert (process.returncode, process.stdout, process.stderr) == (
        in_process.code,
        in_process.stdout,
        in_process.stderr,
    )
