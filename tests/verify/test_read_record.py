"""XLA's buffer assignment reads kept (moegen.verify.records.read_record): a second read of the same
programs is read back, said to be kept, and never trusted past what a record is: a forged,
unsigned, malformed or linked one is ignored and the programs read again."""

from __future__ import annotations

import json
import os

import pytest
from conftest import REPO_ROOT

from moegen.fit import KEPT, KeptPeak, kept_words
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify.memory import assigned
from moegen.verify.memory.assigned import AssignedMemory, assigned_memory, assigned_peak
from moegen.verify.memory.verdict import VerifyError
from moegen.verify.messages import PROGRAMS
from moegen.verify.records import read_record

GiB = 2**30
FIGURES = {
    program: {"argument": 2 * GiB, "output": GiB, "temp": 5 * GiB + i, "seconds": 1.5}
    for i, program in enumerate(PROGRAMS)
}


@pytest.fixture
def plan():
    return make_plan(load_valid(REPO_ROOT / "specs" / "mixtral_8x7b_v5e.yaml"))


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """XLA's read stood in: each read's variant recorded, FIGURES returned."""
    made: list[str] = []

    def read(source, shape, timeout_s):
        made.append(shape.variant)
        return {
            p: AssignedMemory(f["argument"], f["output"], f["temp"], 1.5)
            for p, f in FIGURES.items()
        }

    monkeypatch.setattr(assigned, "_read", read)
    return made


def _key(plan, source: str = "") -> str:
    tpu = json.dumps(assigned.tpu_target(plan).to_json())
    return read_record.read_key(source or render(plan), "", tpu, plan.mesh.num_devices)


def test_a_second_read_of_the_same_programs_is_read_back_and_says_so(plan, reads):
    first = assigned_peak(plan)
    second = assigned_peak(plan)
    assert reads == [""] and first == second == 6 * GiB + len(PROGRAMS) + 2 * GiB - 1
    assert not isinstance(first, KeptPeak) and isinstance(second, KeptPeak)
    assert kept_words(second) == KEPT and kept_words(first) == ""
    figures = assigned_memory(plan, render(plan))
    assert all(f.kept for f in figures.values()) and reads == [""]


def test_a_refusal_by_the_compiler_is_kept_and_said_to_be(plan, monkeypatch):
    calls = []

    def out_of_hbm(source, shape, timeout_s):
        calls.append(1)
        raise VerifyError("compile forward+backward: out of HBM: (19.07G)\nmore")

    monkeypatch.setattr(assigned, "_read", out_of_hbm)
    for _ in range(2):
        with pytest.raises(VerifyError) as info:
            assigned_peak(plan)
    assert calls == [1]
    assert str(info.value) == f"compile forward+backward: out of HBM: (19.07G){KEPT}\nmore"


def test_a_failed_read_is_not_kept(plan, monkeypatch):
    calls = []

    def killed(source, shape, timeout_s):
        calls.append(1)
        raise VerifyError("compile forward ended before XLA's buffer assignment (killed)")

    monkeypatch.setattr(assigned, "_read", killed)
    for _ in range(2):
        with pytest.raises(VerifyError, match="killed"):
            assigned_peak(plan)
    assert calls == [1, 1]


def test_the_key_follows_the_code_not_the_description(plan):
    source = render(plan)
    described = source.replace('    "Mixtral 8x7B MoE layer', '    "A Mixtral 8x7B MoE layer', 1)
    assert described != source and _key(plan, described) == _key(plan, source)
    changed = source.replace("TOP_K = 2", "TOP_K = 1", 1)
    assert changed != source and _key(plan, changed) != _key(plan, source)


@pytest.mark.parametrize(
    "forge",
    [
        lambda data: data.update(figures={**data["figures"], "forward": {"temp": 1}}),
        lambda data: data["figures"]["forward"].update(temp=-1),
        lambda data: data["figures"]["forward"].update(temp=1.5),
        lambda data: data["figures"]["forward"].update(temp=True),
        lambda data: data.update(refused="anything at all"),
        lambda data: data.update(format=99),
        lambda data: data.update(signature="0" * 64),
        lambda data: data.update(extra=1),
    ],
)
def test_a_forged_or_malformed_read_is_ignored_and_the_programs_read_again(plan, reads, forge):
    assigned_peak(plan)
    path = read_record._path() / f"{_key(plan)}.json"
    data = json.loads(path.read_text())
    forge(data)
    path.write_text(json.dumps(data))
    peak = assigned_peak(plan)
    assert reads == ["", ""] and not isinstance(peak, KeptPeak)


def test_a_linked_reads_directory_is_neither_read_nor_written_through(plan, reads, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    below = read_record._path()
    below.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, below)
    assigned_peak(plan)
    assigned_peak(plan)
    assert reads == ["", ""] and list(elsewhere.iterdir()) == []
