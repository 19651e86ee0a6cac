"""bench.holdout reads each module once into its store, reads again what the store does not
hold well formed, refuses a file that is not a store by name and the seeds the rules were
written on: with a stand-in for XLA's reader (no compile here)."""

from __future__ import annotations

import json

import pytest

import bench.holdout as holdout
from bench.population import population
from moegen.verify import VerifyError
from moegen.verify.memory.assigned import AssignedMemory

SPECS = population(2, 2)


@pytest.fixture
def reads(monkeypatch):
    """Every read the bench asks of XLA, answered 1 GiB and 2 GiB (or refused, per spec)."""
    asked: list[str] = []

    def reader(plan, source, timeout_s, variant=""):
        asked.append(variant)
        if "refuse me" in source:
            raise VerifyError("compile forward: out of HBM: RESOURCE_EXHAUSTED\nmore")
        gib = 2**30
        return {
            "forward": AssignedMemory(gib, 0, 0, 1.0),
            "forward+backward": AssignedMemory(2 * gib, 0, 0, 1.0),
        }

    monkeypatch.setattr(holdout, "assigned_memory", reader)
    return asked


def test_a_module_is_read_once_and_kept_under_its_key(tmp_path, reads):
    store = tmp_path / "store.json"
    name, text = SPECS[0]
    errors = {program: [] for program in holdout.PROGRAMS}
    row = holdout.ledger_row(store, name, text, errors)
    assert row.startswith(name) and "vs 1.00 GiB" in row and "vs 2.00 GiB" in row
    holdout.ledger_row(store, name, text, errors)
    assert reads == [""]  # the second time from the store
    (entry,) = json.loads(store.read_text(encoding="utf-8"))["modules"].values()
    assert entry == {"spec": name, "forward": 2**30, "forward+backward": 2**31}
    plan = holdout.plan_of(name, text)
    planned = plan.memory.forward_peak / 2**30 - 1
    assert errors["forward"][0] == (pytest.approx(planned), name)


def test_a_forged_record_is_read_again_and_a_bad_store_refused(tmp_path, reads):
    store = tmp_path / "store.json"
    name, text = SPECS[0]
    holdout.ledger_row(store, name, text, {p: [] for p in holdout.PROGRAMS})
    data = json.loads(store.read_text(encoding="utf-8"))
    (key,) = data["modules"]
    for forged in ({"spec": name, "forward": -5, "forward+backward": 3}, {"forward": "big"}, 7):
        store.write_text(json.dumps({"modules": {key: forged}}), encoding="utf-8")
        holdout.ledger_row(store, name, text, {p: [] for p in holdout.PROGRAMS})
    assert len(reads) == 4
    store.write_text("not json", encoding="utf-8")
    with pytest.raises(SystemExit, match="store.json: not a store of figures"):
        holdout.ledger_row(store, name, text, {p: [] for p in holdout.PROGRAMS})


def test_a_compiler_refusal_is_kept_and_said(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(holdout, "render", lambda plan: "refuse me")
    store = tmp_path / "store.json"
    name, text = SPECS[1]
    row = holdout.ledger_row(store, name, text, {p: [] for p in holdout.PROGRAMS})
    assert (
        row == f"{name} | refused by the compiler: compile forward: out of HBM: RESOURCE_EXHAUSTED"
    )
    (entry,) = json.loads(store.read_text(encoding="utf-8"))["modules"].values()
    assert entry["refused"].startswith("compile forward: out of HBM")


def test_the_summary_counts_the_defaults_verdicts():
    errors = {"forward": [(0.05, "a"), (-0.2, "b")], "forward+backward": []}
    verdicts = {"fits": ["a", "b"], "OVER": [], "refused, whole fits (wrong)": ["c"]}
    lines = holdout.summary(errors, verdicts)
    assert lines[0].startswith("ledger forward: 2 programs") and "; 1 outside 10%" in lines[0]
    assert "worst -20.0% (b), +5.0% (a)" in lines[0]
    assert lines[-1].endswith("2 fits, 1 refused, whole fits (wrong)")


@pytest.mark.parametrize("seed", [0, 1])
def test_the_seeds_the_rules_were_written_on_are_refused(seed, capsys):
    with pytest.raises(SystemExit):
        holdout.main(["--population", "1", "--seed", str(seed)])
    assert "not a hold-out" in capsys.readouterr().err


def _unfit_llama4(tmp_path):
    """Llama 4's layer whose plan (2 token chunks) XLA finds out of HBM (test_refit)."""
    from over_hbm_specs import LLAMA4

    from moegen.diagnostics import Diagnostic, SpecError
    from moegen.pipeline import load_valid
    from moegen.plan import make_plan

    path = tmp_path / "llama4.yaml"
    path.write_text(LLAMA4, encoding="utf-8")
    loaded = load_valid(path)
    refusal = SpecError([Diagnostic(str(path), 1, 1, "shapes.batch", "out of HBM")])
    return loaded, make_plan(loaded), refusal


def test_the_trade_the_build_flag_takes_is_read_through_the_store(tmp_path, reads):
    store = tmp_path / "store.json"
    loaded, plan, refusal = _unfit_llama4(tmp_path)
    verdicts: dict[str, list] = holdout.defaultdict(list)
    row = holdout._taken(store, "llama4", loaded, plan, refusal, verdicts)
    assert row.startswith(" | --take-fitting-trade took memory.token_chunks: 1, ")
    assert "XLA's buffer assignment 2.00 GiB per device" in row
    assert verdicts == {"refused, and --take-fitting-trade takes a trade XLA fits": ["llama4"]}
    assert reads == [""]
    holdout._taken(store, "llama4", loaded, plan, refusal, verdicts)
    assert reads == [""]  # read again from the store


def test_where_no_trade_fits_the_row_says_what_was_read(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(holdout, "render", lambda plan: "refuse me")
    loaded, plan, refusal = _unfit_llama4(tmp_path)
    verdicts = holdout.defaultdict(list)
    row = holdout._taken(tmp_path / "store.json", "llama4", loaded, plan, refusal, verdicts)
    assert row.startswith(" | --take-fitting-trade: none of the plan's ")
    assert list(verdicts) == ["refused, and no other trade fits by XLA's read"]


def test_the_builds_own_choice_is_read_through_the_store(tmp_path, reads, monkeypatch):
    """A trade the spec leaves open, chosen as moegen.fit.own_trade chooses it (the fastest that
    XLA fits: here the layer whole, 2 GiB), each read once into the store."""
    store = tmp_path / "store.json"
    loaded, plan, _ = _unfit_llama4(tmp_path)
    verdicts: dict[str, list] = holdout.defaultdict(list)
    row = holdout._chosen_row(store, "llama4", loaded, plan, verdicts)
    assert row == (
        "llama4 | the ledger's 1 slices x 2 token chunks | the build's 1 slices x 1 token "
        "chunks (1 candidates) | 2.00 of 16.00 GiB: fits"
    )
    assert verdicts == {"chosen by XLA's read: another trade than the ledger's": ["llama4"]}
    holdout._chosen_row(store, "llama4", loaded, plan, verdicts)
    assert reads == [""]  # read again from the store
