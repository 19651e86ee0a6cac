"""Specs the plan proves cannot fit their target's HBM (tests/unfit_specs/): valid by every
rule of validation, refused by the plan (moegen.fit.refusal) with exactly the located diagnostic
of their golden `.expected` file, by `plan` and `build` alike, before any twin runs and with
nothing written; by `validate` too where the plan alone decides (validate never compiles:
where XLA's buffer assignment decides, it says so and passes). The time a refusal takes is
measured by `python -m bench.refuse_fast`, not here.

The golden runner (tests/support/golden_runner.py) checks `moegen plan` against each golden and
writes them after an intended message change:

    MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/render/test_goldens.py
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLE_SPECS, REPO_ROOT, assert_no_traceback, run_moegen
from golden_runner import UNFIT, expected_text

from moegen.diagnostics import SpecError
from moegen.fit import read_has_a_say
from moegen.load import load_spec_bytes
from moegen.pipeline import generate, load_valid, refuse_unfit
from moegen.plan import (
    LEDGER_OVERESTIMATE,
    MEASURED_OVERESTIMATE,
    REFUSAL_OVERESTIMATE,
    cannot_fit,
    make_plan,
)
from moegen.validate import validate

CORPUS_DIR = UNFIT.folder  # relative to REPO_ROOT, as shown in messages
CASES = [REPO_ROOT / UNFIT.case(name) for name in UNFIT.case_names()]
CASE_IDS = UNFIT.case_names()
EXIT_INVALID = 3


def _golden(case: Path) -> str:
    return expected_text(CORPUS_DIR / case.name)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_the_plan_refuses_a_valid_spec_with_the_golden(
    case: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO_ROOT)
    relative = CORPUS_DIR / case.name
    load_valid(relative)  # every rule of validation holds: the refusal is the plan's
    with pytest.raises(SpecError) as info:
        generate(relative)
    actual = "\n".join(d.text() for d in info.value.diagnostics) + "\n"
    assert actual == _golden(case)
    assert all(d.file == relative.as_posix() for d in info.value.diagnostics)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_cli_refuses_with_the_golden(case: Path) -> None:
    result = run_moegen("plan", (CORPUS_DIR / case.name).as_posix())
    assert result.returncode == EXIT_INVALID, result
    assert result.stderr.rstrip("\n") == _golden(case).rstrip("\n")
    assert result.stdout == ""
    assert_no_traceback(result.stdout + result.stderr)


def _xla_decides(case: Path) -> bool:
    loaded = load_valid(case)
    return loaded.spec.memory.fit_check == "assigned" and read_has_a_say(make_plan(loaded))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_validate_refuses_what_the_plan_decides_and_names_what_xla_does(case: Path) -> None:
    """validate compiles nothing: a refusal the plan proves is the golden's; where XLA's read
    decides (a TPU target, the ledger's word alone), the spec passes, and validate says that
    plan and build read it."""
    result = run_moegen("validate", (CORPUS_DIR / case.name).as_posix())
    assert_no_traceback(result.stdout + result.stderr)
    if not _xla_decides(REPO_ROOT / CORPUS_DIR / case.name):
        assert result.returncode == EXIT_INVALID, result
        assert result.stderr.rstrip("\n") == _golden(case).rstrip("\n")
        return
    assert result.returncode == 0, result
    assert f"note: {(CORPUS_DIR / case.name).as_posix()}: " in result.stderr
    assert "XLA's to say: `moegen plan` and `moegen build` read" in result.stderr
    assert result.stderr.rstrip().endswith("1 spec(s) valid")


def test_the_corpus_holds_both_kinds_of_refusal() -> None:
    decides = [_xla_decides(case) for case in CASES]
    assert any(decides) and not all(decides)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_build_refuses_before_any_twin_and_writes_nothing(case: Path, tmp_path: Path) -> None:
    out = tmp_path / "generated"
    result = run_moegen("build", (CORPUS_DIR / case.name).as_posix(), "--out", out)
    assert result.returncode == EXIT_INVALID, result
    assert _golden(case).rstrip("\n") in result.stderr
    assert "verify:" not in result.stderr and "render" not in result.stderr
    assert "wrote" not in result.stderr
    assert not out.exists() or not any(out.iterdir())
    assert_no_traceback(result.stdout + result.stderr)


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=[p.stem for p in EXAMPLE_SPECS])
def test_every_committed_spec_fits_by_its_plan(spec: Path) -> None:
    loaded = load_valid(spec)
    plan = make_plan(loaded)
    assert refuse_unfit(loaded, plan) is plan


def test_a_target_without_fixed_memory_is_never_refused() -> None:
    loaded = load_valid(REPO_ROOT / "specs" / "mixtral_small_cpu.yaml")
    plan = make_plan(loaded)
    assert plan.memory.hbm_bytes_per_device == 0
    huge = replace(plan, memory=replace(plan.memory, train_peak=2**60, forward_peak=2**60))
    assert not cannot_fit(huge)
    assert refuse_unfit(loaded, huge) is huge


def test_within_the_ledgers_error_of_hbm_the_compile_decides() -> None:
    loaded = load_valid(REPO_ROOT / "specs" / "mixtral_8x7b_v5e.yaml")
    plan = make_plan(loaded)
    hbm = plan.memory.hbm_bytes_per_device
    assert hbm == 16 * 2**30

    def with_peak(peak: int):
        return replace(plan, memory=replace(plan.memory, train_peak=peak))

    assert not cannot_fit(with_peak(hbm))
    assert not cannot_fit(with_peak(int(hbm * (1 + LEDGER_OVERESTIMATE))))
    assert cannot_fit(with_peak(int(hbm * (1 + LEDGER_OVERESTIMATE)) + 1))
    # memory.fit_check: compile refuses only what is proved: over the plan's measured error
    assert not cannot_fit(with_peak(int(hbm * (1 + REFUSAL_OVERESTIMATE))), compile_decides=True)
    assert cannot_fit(with_peak(int(hbm * (1 + REFUSAL_OVERESTIMATE)) + 1), compile_decides=True)


def test_the_fit_check_field_states_the_margins_the_plan_uses() -> None:
    """The spec reference (load stage, which cannot import the plan) writes both margins out:
    they are the plan's constants."""
    from moegen.spec import Memory

    text = Memory.model_fields["fit_check"].description
    assert f"{LEDGER_OVERESTIMATE:.0%} over HBM" in text
    assert f"{REFUSAL_OVERESTIMATE:.0%} over it" in text
    assert f"up to {MEASURED_OVERESTIMATE:.0%} above" in text


def test_the_parameters_and_their_gradients_over_hbm_are_refused_whatever_the_estimate() -> None:
    """What the compiled program's arguments and outputs hold is exact: over HBM, no compile
    can fit it, even where the estimate of the rest would be within the band."""
    loaded = load_valid(REPO_ROOT / "specs" / "mixtral_8x7b_v5e.yaml")
    plan = make_plan(loaded)
    hbm = plan.memory.hbm_bytes_per_device
    assert plan.memory.exact_bytes < hbm
    exact = replace(plan, memory=replace(plan.memory, exact_bytes=hbm + 1, train_peak=hbm + 1))
    assert cannot_fit(exact, compile_decides=True) and cannot_fit(exact)


def _with_fit_check(case: str, check: str):
    tree = yaml.safe_load((REPO_ROOT / UNFIT.case(case)).read_text(encoding="utf-8"))
    tree.setdefault("memory", {})["fit_check"] = check
    text = yaml.safe_dump(tree, sort_keys=False)
    return validate(load_spec_bytes(text.encode(), f"{case}.yaml", case))


def test_with_fit_check_compile_a_layer_the_plan_does_not_prove_unfit_goes_to_the_compile() -> None:
    """pinned_whole_ffn_v5e is planned 40% over HBM: refused by the ledger with
    memory.fit_check: plan, by default where XLA's buffer assignment agrees (the golden), and
    left to the compile's memory verdict with memory.fit_check: compile."""
    loaded = _with_fit_check("pinned_whole_ffn_v5e", "compile")
    plan = make_plan(loaded)
    assert plan.memory.hbm_bytes_per_device < plan.memory.train_peak
    assert refuse_unfit(loaded, plan) is plan
    with pytest.raises(SpecError, match="memory.fit_check: compile lets"):  # the ledger alone
        refuse_unfit(*_loaded_and_plan(_with_fit_check("pinned_whole_ffn_v5e", "plan")))
    # by default XLA reads the plan's word (moegen.fit.refusal_read), and agrees here
    with pytest.raises(SpecError, match="XLA.s buffer assignment: compile .* out of HBM"):
        refuse_unfit(*_loaded_and_plan(_with_fit_check("pinned_whole_ffn_v5e", "assigned")))


@pytest.mark.parametrize("case", ["batch_too_large_v5e", "experts_too_many_v5e"])
def test_with_fit_check_compile_a_proved_refusal_stands(case: str) -> None:
    with pytest.raises(SpecError, match="it cannot fit"):
        refuse_unfit(*_loaded_and_plan(_with_fit_check(case, "compile")))


def _loaded_and_plan(loaded):
    return loaded, make_plan(loaded)
