"""A verification record is evidence, not a verdict (issue 26): the corpus of forged, incomplete
and damaged records. Each is ignored with one line saying why and the module verified again:
no reuse of a failing or incomplete record, no hang, no exit 4."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from record_cases import passing_steps

import moegen.verify.verification
from moegen import provenance
from moegen.pipeline import generate
from moegen.verify import VerifyCache, VerifyReport, verify
from moegen.verify.messages import Job, RecordIgnored, Reused
from moegen.verify.records import record
from moegen.verify.records.evidence import judge

CPU_SPEC = REPO_ROOT / "specs" / "mixtral_small_cpu.yaml"
TPU_SPEC = REPO_ROOT / "specs" / "mixtral_8x7b_v5e.yaml"


@pytest.fixture
def worker(monkeypatch) -> list[Job]:
    """A worker reporting every step of its job with passing figures; the jobs it ran."""
    started: list[Job] = []

    def run(job_path: Path, num_devices, on_step, timeout_s):
        job = Job.from_json(json.loads(job_path.read_text(encoding="utf-8")))
        started.append(job)
        steps = passing_steps(job, _PARAM_BYTES[job.module.rsplit("/", 1)[-1]])
        for step in steps:
            on_step(step)
        return VerifyReport(steps=steps)

    monkeypatch.setattr(moegen.verify.verification, "_run_worker", run)
    return started


_PARAM_BYTES: dict[str, int] = {}


def _verify(spec: Path) -> tuple[VerifyReport, list]:
    generated = generate(spec)
    _PARAM_BYTES[f"{generated.plan.module_name}.py"] = generated.plan.cost.param_bytes
    seen: list = []
    report = verify(
        generated.loaded,
        generated.source,
        plan=generated.plan,
        cache=VerifyCache(),
        on_step=seen.append,
    )
    return report, seen


def _record_file() -> Path:
    [path] = record.records_dir().glob("*.json")
    return path


def _rewrite(change: Callable[[dict], None], *, sign: bool = True) -> None:
    """Edit the one record on disk as someone with write access to the cache would; `sign`:
    re-sign it with this user's key (someone who has the key too, or an older verifier)."""
    path = _record_file()
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    if sign:
        data["signature"] = provenance.sign(record._PURPOSE, record.signed_payload(data))
    path.write_text(json.dumps(data), encoding="utf-8")


def _ignored_then_verified(worker: list, spec: Path = CPU_SPEC) -> str:
    """Verify again: the record must be ignored (the reason returned) and the worker run."""
    before = len(worker)
    report, seen = _verify(spec)
    assert len(worker) == before + 1, "the record was reused"
    assert isinstance(seen[0], RecordIgnored) and report.steps[0] == seen[0]
    assert not any(isinstance(step, Reused) for step in report.steps)
    return seen[0].reason


def _steps(data: dict) -> list[dict]:
    return data["steps"]


def _twin(data: dict) -> dict:
    return next(s for s in _steps(data) if s["step"].startswith("twin parity"))


def _compiled(data: dict) -> dict:
    return next(s for s in _steps(data) if s["step"].startswith("compile "))


def test_a_genuine_record_is_reused(worker):
    _verify(CPU_SPEC)
    report, _ = _verify(CPU_SPEC)
    assert len(worker) == 1 and isinstance(report.steps[0], Reused)


# ---------------------------------------------------------------------------------------
# signed, but the figures fail or are missing: judged again like a fresh verification

FAILING = {
    "parity error 0.97": lambda d: _twin(d)["cases"][0].update(max_relative_error=0.97),
    "parity error 1e9": lambda d: _twin(d)["cases"][1].update(max_relative_error=1e9),
    "starved expert got tokens": lambda d: _twin(d)["cases"][1].update(
        tokens_per_expert=[5, *_twin(d)["cases"][1]["tokens_per_expert"][1:]]
    ),
    "no starved case": lambda d: _twin(d).update(cases=_twin(d)["cases"][:1]),
    "no steps": lambda d: d.update(steps=[]),
    "only the import": lambda d: d.update(steps=_steps(d)[:1]),
    "no compile": lambda d: d.update(steps=[s for s in _steps(d) if "compile" not in s["step"]]),
    "a step twice": lambda d: d.update(steps=[*_steps(d), _steps(d)[-1]]),
    "out of memory": lambda d: _steps(d).__setitem__(
        -1, {"step": _steps(d)[-1]["step"], "seconds": 1.0, "oom": "RESOURCE_EXHAUSTED: HBM"}
    ),
    "3-byte arguments": lambda d: _compiled(d).update(
        memory={"argument": 3, "output": 0, "temp": 0, "alias": 0, "generated_code": 0, "peak": 3}
    ),
}


@pytest.mark.parametrize("case", list(FAILING))
def test_a_signed_record_with_failing_or_missing_figures_is_verified_again(worker, case):
    _verify(CPU_SPEC)
    _rewrite(FAILING[case])
    reason = _ignored_then_verified(worker)
    assert reason and "\n" not in reason
    report, _ = _verify(CPU_SPEC)  # the fresh verification's record replaced the forged one
    assert len(worker) == 2 and isinstance(report.steps[0], Reused)


def test_a_signed_record_over_hbm_is_verified_again_not_failed(worker):
    _verify(TPU_SPEC)

    def over(data: dict) -> None:
        for step in _steps(data):
            if step["step"].startswith("compile "):
                step["memory"]["temp"] = 1 << 40
                step["memory"]["peak"] = sum(step["memory"][k] for k in ("argument", "output"))
                step["memory"]["peak"] += step["memory"]["temp"] - step["memory"]["alias"]

    _rewrite(over)
    assert "does not fit" in _ignored_then_verified(worker, TPU_SPEC)


def test_a_tpu_record_with_a_3_byte_peak_is_judged_against_the_plan(worker):
    generated = generate(TPU_SPEC)
    _verify(TPU_SPEC)
    _rewrite(FAILING["3-byte arguments"])
    assert "parameters" in _ignored_then_verified(worker, TPU_SPEC)
    job = worker[-1]
    steps = passing_steps(job, generated.plan.cost.param_bytes)
    assert judge(job, generated.plan, steps) is None  # what the fake worker reports passes


# ---------------------------------------------------------------------------------------
# not a record this user's moegen wrote, or not one at all


def _seconds(value: float) -> Callable[[dict], None]:
    return lambda d: _steps(d)[0].update(seconds=value)


def _deep(text: str) -> str:
    return text.replace('"steps": [', '"steps": [' + "[" * 200_000 + "]" * 200_000 + ",")


# case: (what the reason says, the change, re-signed, then an edit of the text)
DAMAGED = {
    "unsigned, passing figures": ("not signed", lambda d: d.update(signature="0" * 64), False),
    "NaN figure": ("not JSON", _seconds(float("nan")), True),
    "1e400 figure": (
        "finite",
        _seconds(float("inf")),
        True,
        lambda t: t.replace("Infinity", "1e400"),
    ),
    "seconds 'fast'": ("finite", _seconds("fast"), True),
    "bool as a figure": ("finite", _seconds(True), True),
    "negative bytes": ("count", lambda d: _compiled(d)["memory"].update(temp=-5), True),
    "bytes past 2**63": ("count", lambda d: _compiled(d)["memory"].update(temp=10**400), True),
    "seconds past float's range": ("finite", _seconds(10**400), True),
    "a non-ASCII signature": ("not signed", lambda d: d.update(signature="\u00e9" * 64), False),
    "unknown key": ("unknown keys", lambda d: _steps(d)[0].update(verdict="pass"), True),
    "peak that does not add up": ("peak", lambda d: _compiled(d)["memory"].update(peak=1), True),
    "parent's step": (
        "not a worker's",
        lambda d: _steps(d).append({"step": "memory verdict", "seconds": 0.0, "verdict": "ok"}),
        True,
    ),
    "steps nested 200,000 deep": ("nested too deep", lambda d: None, True, _deep),
    "wrong key": ("another format or key", lambda d: d.update(key="0" * 64), True),
    "old format": ("another format or key", lambda d: d.update(format=1), True),
    "not an object": ("format", lambda d: d.clear(), False),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_or_forged_record_is_ignored(worker, case):
    expected, change, sign, *edit = DAMAGED[case]
    _verify(CPU_SPEC)
    _rewrite(change, sign=sign)
    if edit:
        path = _record_file()
        path.write_text(edit[0](path.read_text(encoding="utf-8")), encoding="utf-8")
    assert expected in _ignored_then_verified(worker)


def _within(seconds: float, action: Callable[[], object]) -> object:
    """`action`'s result, failing the test (not hanging it) if it takes longer."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(action()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return result[0]


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "link inside the cache"])
def test_a_record_that_is_not_a_regular_file_is_ignored_at_once(worker, kind):
    _verify(CPU_SPEC)
    path = _record_file()
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    else:
        path.with_name("elsewhere.json").write_text("{}")
        path.symlink_to(path.with_name("elsewhere.json"))
    expected = "not a regular file" if kind == "fifo" else "symbolic link"
    assert expected in _within(60, lambda: _ignored_then_verified(worker))


def test_an_oversized_record_is_not_read(worker):
    _verify(CPU_SPEC)
    _record_file().write_bytes(b" " * (record.MAX_RECORD_BYTES + 1))
    assert "larger than" in _ignored_then_verified(worker)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file another user owns")
def test_a_record_another_user_owns_is_ignored(worker):
    _verify(CPU_SPEC)
    os.chown(_record_file(), 65534, 65534)
    assert "another user" in _ignored_then_verified(worker)


def test_records_signed_with_another_key_are_ignored(worker, monkeypatch, tmp_path):
    """A cache restored from another machine or a fork: its records carry another key."""
    _verify(CPU_SPEC)
    monkeypatch.setenv(provenance.STATE_ENV, str(tmp_path / "another-machine"))
    assert "not signed" in _ignored_then_verified(worker)


def test_a_ci_secret_shares_records_between_machines(worker, monkeypatch, tmp_path):
    monkeypatch.setenv(provenance.SECRET_ENV, "a CI secret")
    _verify(CPU_SPEC)
    monkeypatch.setenv(provenance.STATE_ENV, str(tmp_path / "another-machine"))
    report, _ = _verify(CPU_SPEC)
    assert len(worker) == 1 and isinstance(report.steps[0], Reused)
    monkeypatch.setenv(provenance.SECRET_ENV, "a fork's guess")
    assert "not signed" in _ignored_then_verified(worker)


# ---------------------------------------------------------------------------------------
# the command line: one line, exit 0, the module written


def test_the_build_says_why_a_record_was_ignored(worker, tmp_project, invoke_main):
    # the worker's figures need the module's parameter bytes, whichever test ran before
    generated = generate(tmp_project / "specs" / "mixtral_small_cpu.yaml")
    _PARAM_BYTES[f"{generated.plan.module_name}.py"] = generated.plan.cost.param_bytes
    first = invoke_main("build", "specs/mixtral_small_cpu.yaml", cwd=tmp_project)
    assert first.code == 0, first.output
    _rewrite(FAILING["parity error 0.97"])
    again = invoke_main("build", "specs/mixtral_small_cpu.yaml", cwd=tmp_project)
    assert again.code == 0, again.output
    [line] = [line for line in again.stderr.splitlines() if "record ignored" in line]
    assert "relative error 9.700e-01 >= 1e-05" in line and "verifying again" in line, line
    assert "reused" not in again.stderr and len(worker) == 2
    assert "wrote generated/mixtral_small_cpu.py" in again.stderr
