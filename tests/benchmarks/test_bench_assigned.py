"""bench.assigned keeps each spec's assigned peaks under its module's key, and sets them beside
the compiled records as `bench.ledger --population` prints them: on stores written here."""

from __future__ import annotations

import json

import pytest

from bench.assigned import ASSIGNED_STORE, assigned_errors, record_assigned
from bench.ledger_population import module_key, planned
from bench.population import population
from moegen.verify.memory.assigned import AssignedMemory

SPECS = population(3, 0)


def _key(name: str, text: str) -> str:
    return module_key(planned(name, text)[1])


def _compiled_store(path, peaks: dict[str, int]) -> None:
    modules = {
        _key(name, text): {"spec": name, "forward": {"peak": peak}, "train": {"peak": 2 * peak}}
        for (name, text), peak in zip(SPECS, peaks.values(), strict=True)
    }
    path.write_text(json.dumps({"modules": modules}), encoding="utf-8")


def test_recorded_figures_are_set_beside_the_compiled_ones(tmp_path):
    compiled, assigned = tmp_path / "compiled.json", tmp_path / "assigned.json"
    _compiled_store(compiled, {name: 1000 * (i + 1) for i, (name, _) in enumerate(SPECS)})
    (first, first_text), (second, second_text), (third, _) = SPECS
    figures = {"forward": AssignedMemory(600, 300, 200, 1.0)}  # 1100 against 1000
    figures["forward+backward"] = AssignedMemory(1000, 500, 500, 1.0)  # 2000 against 2000
    record_assigned(assigned, first, first_text, {"assigned": figures, "seconds": 2.5})
    refusal = "compile forward: out of HBM: RESOURCE_EXHAUSTED: ...\nmore"
    record_assigned(assigned, second, second_text, {"refused": refusal, "seconds": 1.0})
    kept = json.loads(assigned.read_text(encoding="utf-8"))["modules"]
    assert kept[_key(first, first_text)] == {
        "spec": first,
        "seconds": 2.5,
        "forward": 1100,
        "train": 2000,
    }
    assert kept[_key(second, second_text)]["refused"] == refusal.splitlines()[0]
    errors, missing, refused = assigned_errors(3, 0, compiled, assigned)
    assert errors["forward"] == [(1100 / 1000 - 1, first)]
    assert errors["train"] == [(0.0, first)]
    assert missing == [third]
    assert refused == [f"{second} (NOT the compile)"]  # its compiled record has no oom


def test_the_committed_store_is_keyed_like_the_compiled_one():
    """Every committed assigned record names a population spec and holds peaks or a refusal."""
    entries = json.loads(ASSIGNED_STORE.read_text(encoding="utf-8"))["modules"].values()
    assert len(entries) >= 100  # both seeds' populations
    for entry in entries:
        assert entry["spec"].startswith(("s0_", "s1_"))
        assert (
            {"refused"} <= set(entry)
            or {"failed"} <= set(entry)
            or {"forward", "train"} <= set(entry)
        )


def test_a_store_that_is_not_one_is_refused_by_name(tmp_path):
    compiled, assigned = tmp_path / "compiled.json", tmp_path / "assigned.json"
    _compiled_store(compiled, {name: 1000 for name, _ in SPECS})
    for bad in ("not json", '{"modules": []}', "[]"):
        assigned.write_text(bad, encoding="utf-8")
        with pytest.raises(SystemExit, match="assigned.json: not a store of figures"):
            assigned_errors(3, 0, compiled, assigned)
    assigned.write_text('{"modules": {"x": 3, "y": {"forward": "big"}}}', encoding="utf-8")
    errors, missing, _ = assigned_errors(3, 0, compiled, assigned)
    assert errors == {"forward": [], "train": []} and len(missing) == 3
