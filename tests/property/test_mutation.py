"""Seeded mutation campaign over the example specs (tests/support/mutations.py): every input is a
valid spec that plans and renders, or an invalid one refused with located diagnostics.
Never an exception other than SpecError, never a diagnostic off the file, never one that
spans two lines or carries control characters; `--format json` says what text says.

2,400 inputs in CI (8 seeds x 300), in-process for speed; a sample also goes through the
real command line. MOEGEN_MUTATIONS=N raises the count per seed for a longer campaign.
"""

from __future__ import annotations

import json
import os
import traceback
import unicodedata
from pathlib import Path

import pytest
from conftest import assert_no_traceback, run_moegen
from mutations import mutated_specs

from moegen.diagnostics import Diagnostic, SpecError, format_diagnostics
from moegen.load import load_spec_bytes
from moegen.plan import make_plan
from moegen.render import render
from moegen.validate import validate

SEEDS = range(8)
PER_SEED = int(os.environ.get("MOEGEN_MUTATIONS", "300"))
DISPLAY = "specs/mutant.yaml"
_BIDI = {
    "\u061c",
    "\u200e",
    "\u200f",
    *map(chr, range(0x202A, 0x202F)),
    *map(chr, range(0x2066, 0x206A)),
}


def _line_count(raw: bytes) -> int:
    return raw.count(b"\n") + 1


def _diagnostic_problem(d: Diagnostic, raw: bytes) -> str | None:
    """What is wrong with one diagnostic of `raw`, or None."""
    if d.file != DISPLAY:
        return f"names another file: {d.file!r}"
    if not 1 <= d.line <= _line_count(raw) or d.column < 1:
        return f"located off the file: {d.line}:{d.column}"
    text = d.text()
    if not text.isprintable() or any(c in _BIDI for c in text):
        return f"not one printable line: {text!r}"
    if any(unicodedata.category(c) in ("Zl", "Zp") for c in text):
        return f"holds a line separator: {text!r}"
    return None


def _json_agrees_with_text(diagnostics: list[Diagnostic]) -> bool:
    items = json.loads(format_diagnostics(diagnostics, "json"))
    rebuilt = "\n".join(
        f"{i['file']}:{i['line']}:{i['column']}: "
        + (f"{i['field']}: " if i["field"] else "")
        + i["message"]
        for i in items
    )
    return rebuilt == format_diagnostics(diagnostics, "text")


def _outcome(raw: bytes) -> tuple[str, str | None]:
    """('valid' | 'invalid', problem or None) for one input, through every stage but verify."""
    try:
        loaded = validate(load_spec_bytes(raw, DISPLAY, "mutant"))
    except SpecError as err:
        if not err.diagnostics:
            return "invalid", "SpecError without diagnostics"
        for d in err.diagnostics:
            problem = _diagnostic_problem(d, raw)
            if problem:
                return "invalid", problem
        if not _json_agrees_with_text(err.diagnostics):
            return "invalid", "json and text disagree"
        return "invalid", None
    except Exception:  # any other exception is the defect under test
        return "crash", "load/validate: " + traceback.format_exc(limit=-3)
    try:
        render(make_plan(loaded))
    except Exception:  # a valid spec must plan and render
        return "crash", "plan/render of a valid spec: " + traceback.format_exc(limit=-3)
    return "valid", None


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_specs_are_valid_or_refused_with_located_diagnostics(seed: int) -> None:
    problems: list[str] = []
    counts = {"valid": 0, "invalid": 0, "crash": 0}
    for label, raw in mutated_specs(seed, PER_SEED):
        kind, problem = _outcome(raw)
        counts[kind] += 1
        if problem:
            problems.append(f"{label}: {problem}\n  input: {raw[:400]!r}")
    print(f"seed {seed}: {counts}")
    assert not problems, f"{len(problems)} of {PER_SEED} inputs:\n" + "\n".join(problems[:10])
    # The campaign must reach both sides of the line, or it tests nothing.
    assert counts["valid"] >= PER_SEED // 20 and counts["invalid"] >= PER_SEED // 5, counts


def test_mutated_sample_through_the_command_line(tmp_path: Path) -> None:
    """The CLI agrees with the library on a sample: exit 0 or 3, no traceback, json == text."""
    specs = tmp_path / "specs"
    specs.mkdir()
    sample = [raw for i, (_, raw) in enumerate(mutated_specs(99, 400)) if i % 10 == 0]
    for i, raw in enumerate(sample):
        (specs / f"mutant_{i}.yaml").write_bytes(raw)
    paths = [f"specs/mutant_{i}.yaml" for i in range(len(sample))]
    text = run_moegen("validate", *paths, cwd=tmp_path, timeout=300)
    as_json = run_moegen("validate", "--format", "json", *paths, cwd=tmp_path, timeout=300)
    assert text.returncode in (0, 3), text.stderr
    assert as_json.returncode == text.returncode
    assert_no_traceback(text.stdout + text.stderr + as_json.stdout + as_json.stderr)
    items = json.loads(as_json.stdout)
    rebuilt = [
        f"{i['file']}:{i['line']}:{i['column']}: "
        + (f"{i['field']}: " if i["field"] else "")
        + i["message"]
        for i in items
    ]
    assert "\n".join(rebuilt) in text.stderr
    assert {i["file"] for i in items} <= set(paths)
