"""An edge of the records' trust model (issue 54): a state directory other users can write
(no key, no private place for JAX's cache) is said, once, with the fix, instead of a
build that silently verifies everything again; its jax-cache is not made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from record_cases import passing_steps

import moegen.verify.verification
from moegen.pipeline import generate
from moegen.verify import VerifyReport, record
from moegen.verify.messages import Job

SPEC = REPO_ROOT / "specs" / "mixtral_small_cpu.yaml"


@pytest.mark.parametrize("mode", [0o770, 0o777], ids=["group-writable", "world-writable"])
def test_a_state_directory_others_can_write_gets_no_jax_cache(mode, monkeypatch, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    monkeypatch.setenv("MOEGEN_STATE_DIR", str(state))
    assert record.compilation_cache_dir() is None
    assert list(state.iterdir()) == []  # no jax-cache made, to be left unused


@pytest.fixture
def counted_worker(monkeypatch) -> list[Job]:
    """A worker reporting every step of its job with passing figures; the jobs it ran."""
    started: list[Job] = []
    param_bytes = generate(SPEC).plan.cost.param_bytes

    def worker(job_path: Path, num_devices, on_step, timeout_s):
        started.append(Job.from_json(json.loads(job_path.read_text(encoding="utf-8"))))
        steps = passing_steps(started[-1], param_bytes)
        for step in steps:
            on_step(step)
        return VerifyReport(steps=steps)

    monkeypatch.setattr(moegen.verify.verification, "_run_worker", worker)
    return started


def _build(invoke_main, project: Path):
    result = invoke_main("build", "specs/mixtral_small_cpu.yaml", cwd=project)
    assert result.code == 0, result.output
    return result


def test_the_build_says_once_why_reuse_is_off_and_the_fix(
    counted_worker, tmp_project, invoke_main, monkeypatch, tmp_path
):
    state = tmp_path / "shared-state"
    state.mkdir()
    state.chmod(0o777)
    monkeypatch.setenv("MOEGEN_STATE_DIR", str(state))
    for _ in range(2):  # every build says so, each once
        said = [
            line
            for line in _build(invoke_main, tmp_project).stderr.splitlines()
            if line.startswith("moegen:")
        ]
        assert said == [
            "moegen: reuse of passed verifications and JAX's compilation cache are off: "
            f"{state} is writable by other users (run: chmod go-w {state})"
        ]
    assert len(counted_worker) == 2  # verified twice: nothing reused, as the line said
    assert counted_worker[-1].compilation_cache is None and list(state.iterdir()) == []


def test_a_private_state_directory_builds_without_a_word(counted_worker, tmp_project, invoke_main):
    first, again = _build(invoke_main, tmp_project), _build(invoke_main, tmp_project)
    assert "moegen:" not in first.stderr + again.stderr
    assert len(counted_worker) == 1 and "reused record" in again.stderr
