"""One golden runner for every corpus of expected outputs, in the manner of an end-to-end suite:
a corpus is a folder of cases, and a case is an input spec `CASE.yaml` with one expected file
that says what running it must print and how it must exit:

- `CASE.expected`: refused, exit 3, exactly these diagnostics on stderr, nothing on stdout;
- `CASE.py`: the module rendered, exit 0, exactly this text on stdout, nothing on stderr.

The corpora (CORPORA below):

- tests/invalid_specs/: `moegen validate CASE` refuses it by a rule of validation;
- tests/unfit_specs/: `moegen validate CASE` refuses a valid spec by its plan (HBM);
- tests/hostile/: `moegen validate CASE` refuses a file malformed on purpose;
- tests/goldens/render/: the pairwise covering set of the option matrix (pairwise_cases),
  each case loaded, validated, planned and rendered as `moegen build --no-verify` does; its
  inputs are made from the cases, so they are goldens too, checked byte for byte.

tests/render/test_goldens.py runs every case of every corpus. After an intended change, the one
update command rewrites the expected files (and the made inputs) from what runs now:

    MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/render/test_goldens.py

then read the diff: every golden is a promise about what a user sees. `-k hostile` (a
corpus) or `-k CASE` narrows it. One process (`-n 0`): workers would write the same folders.

Each corpus's own test file checks more about the same cases (every output format, the
location of each diagnostic, `build` writing nothing) against the same expected files,
read-only (`expected_text`), so they are written in one place only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO_ROOT
from pairwise_cases import CASES as PAIRWISE_CASES
from pairwise_cases import case_spec_text
from spec_builder import validated

from moegen.cli import cli
from moegen.diagnostics import SpecError
from moegen.plan import make_plan
from moegen.render import render

UPDATE = os.environ.get("MOEGEN_UPDATE_GOLDENS") == "1"
UPDATE_COMMAND = "MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/render/test_goldens.py"
EXIT_INVALID = 3
# expected file suffix -> (exit code, the stream it holds); the other stream must be empty
EXPECTED_KINDS = {".expected": (EXIT_INVALID, "stderr"), ".py": (0, "stdout")}


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Corpus:
    name: str
    folder: Path  # relative to REPO_ROOT, as diagnostics show the cases' paths
    run: Callable[[Path], Outcome]  # a case's input (relative) -> what running it does
    least: int  # the corpus holds at least this many cases (it was found at all)
    kinds: tuple[str, ...] = (".expected",)  # the expected files a case may have
    made: Callable[[str], str] | None = None  # case -> its input text, where inputs are made
    made_names: tuple[str, ...] = ()
    # cases whose golden states the intended text while moegen still prints something else:
    # their tests are strict xfails, and the update command leaves their goldens alone
    known_bugs: Mapping[str, str] = field(default_factory=dict)

    def case_names(self) -> list[str]:
        if self.made is not None:
            return list(self.made_names)
        return sorted(path.stem for path in (REPO_ROOT / self.folder).glob("*.yaml"))

    def case(self, name: str) -> Path:
        return self.folder / f"{name}.yaml"


def validate_command(case: Path) -> Outcome:
    """`moegen validate CASE` from the repository root, in this process (a subprocess per
    case would cost a second each; the corpora's own tests run the real CLI)."""
    with contextlib.chdir(REPO_ROOT):
        result = CliRunner().invoke(cli, ["validate", case.as_posix()])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def plan_command(case: Path) -> Outcome:
    """`moegen plan CASE` from the repository root, in this process: what plan and build
    refuse, XLA's read included where it decides (validate never reads)."""
    with contextlib.chdir(REPO_ROOT):
        result = CliRunner().invoke(cli, ["plan", case.as_posix()])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def render_command(case: Path) -> Outcome:
    """The case's spec loaded as its file name shows it, validated, planned and rendered: the
    module on stdout, or the refusal's diagnostics on stderr."""
    loaded = validated((REPO_ROOT / case).read_text(encoding="utf-8"), case.name, case.stem)
    if isinstance(loaded, SpecError):
        return Outcome(EXIT_INVALID, "", "\n".join(d.text() for d in loaded.diagnostics) + "\n")
    return Outcome(0, render(make_plan(loaded)), "")


INVALID = Corpus("invalid", Path("tests/invalid_specs"), validate_command, least=20)
UNFIT = Corpus("unfit", Path("tests/unfit_specs"), plan_command, least=4)
HOSTILE = Corpus("hostile", Path("tests/hostile"), validate_command, least=30)
RENDER = Corpus(
    "render",
    Path("tests/goldens/render"),
    render_command,
    least=10,
    kinds=(".expected", ".py"),
    made=case_spec_text,
    made_names=tuple(PAIRWISE_CASES),
)
CORPORA = (INVALID, UNFIT, HOSTILE, RENDER)


def expected_file(case: Path) -> Path:
    """The one expected file of `case` (relative to REPO_ROOT); fails when there is none."""
    found = [
        case.with_suffix(s) for s in EXPECTED_KINDS if (REPO_ROOT / case).with_suffix(s).exists()
    ]
    if not found:
        pytest.fail(f"{case.with_suffix('.expected')} is missing; run {UPDATE_COMMAND}")
    assert len(found) == 1, f"{case} has more than one expected file: {found}"
    return found[0]


def expected_text(case: Path) -> str:
    """The text `case`'s expected file holds (for the corpora's own, read-only, tests)."""
    return (REPO_ROOT / expected_file(case)).read_text(encoding="utf-8")


def write_golden(corpus: Corpus, case: Path, outcome: Outcome) -> None:
    """Under the update command: the expected file of what ran, and no other."""
    kind = next((s for s, (code, _) in EXPECTED_KINDS.items() if code == outcome.exit_code), None)
    assert kind in corpus.kinds, f"{case}: exit {outcome.exit_code} is no outcome of {corpus.name}"
    stream = EXPECTED_KINDS[kind][1]
    (REPO_ROOT / case).with_suffix(kind).write_text(getattr(outcome, stream), encoding="utf-8")
    for other in set(EXPECTED_KINDS) - {kind}:
        (REPO_ROOT / case).with_suffix(other).unlink(missing_ok=True)


def check_made_input(corpus: Corpus, name: str) -> None:
    """A made input is a golden too: written by the update command, else compared."""
    assert corpus.made is not None
    path = REPO_ROOT / corpus.case(name)
    text = corpus.made(name)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if not path.is_file():
        pytest.fail(f"{path} is missing; run {UPDATE_COMMAND}")
    assert text.encode() == path.read_bytes(), f"{path.name} differs; run {UPDATE_COMMAND}"


def check_case(corpus: Corpus, name: str) -> None:
    """Run one case and compare exit code, stdout and stderr with its expected file, byte for
    byte (rewriting the file first under the update command)."""
    case = corpus.case(name)
    if corpus.made is not None:
        check_made_input(corpus, name)
    outcome = corpus.run(case)
    if UPDATE and name not in corpus.known_bugs:
        write_golden(corpus, case, outcome)
    golden = expected_file(case)
    assert golden.suffix in corpus.kinds, golden
    exit_code, stream = EXPECTED_KINDS[golden.suffix]
    other = "stdout" if stream == "stderr" else "stderr"
    assert outcome.exit_code == exit_code, (golden, outcome)
    assert getattr(outcome, other) == "", (golden, outcome)
    assert getattr(outcome, stream).encode() == (REPO_ROOT / golden).read_bytes(), (
        f"{golden} differs from what runs now; if the change is intended, run {UPDATE_COMMAND}"
    )


def check_corpus_files(corpus: Corpus) -> None:
    """Every case has one expected file, and every file in the folder belongs to a case."""
    names = corpus.case_names()
    assert len(names) >= corpus.least, (corpus.name, names)
    assert set(corpus.known_bugs) <= set(names)
    folder = REPO_ROOT / corpus.folder
    files = {path.name for path in folder.iterdir()} if folder.is_dir() else set()
    orphans = {f for f in files if f.split(".")[0] not in names}
    assert not orphans, f"files of no case in {corpus.folder} (remove them): {sorted(orphans)}"
    if UPDATE:
        return  # the case tests write what is missing
    for name in names:
        assert f"{name}.yaml" in files, f"{name}.yaml is missing; run {UPDATE_COMMAND}"
        expected_file(corpus.case(name))
