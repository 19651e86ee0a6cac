"""Two edges of the records' trust model (issue 54): a records directory that is a symbolic
link is neither written nor read through, and a state directory other users can write
(no key, no private place for JAX's cache) is said, once, with the fix, instead of a
build that silently verifies everything again; its jax-cache is not made."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from record_cases import passing_steps

import moegen.verify.verification
from moegen.pipeline import generate
from moegen.verify import VerifyReport
from moegen.verify.messages import Imported, Job
from moegen.verify.records import record

SPEC = REPO_ROOT / "specs" / "mixtral_small_cpu.yaml"
KEY = "a" * 64


def _genuine_records(tmp_path: Path, monkeypatch) -> Path:
    """A directory holding one record this user's moegen wrote and signed (key KEY)."""
    monkeypatch.setenv(record.CACHE_ENV, str(tmp_path / "first-cache"))
    record.store_record(record.new_record(KEY, "x = 1\n", [Imported("import", 0.1)]))
    assert record.load_record(KEY) is not None
    return record.records_dir()


@pytest.mark.parametrize("linked", ["verify", "verify/records"])
def test_a_linked_records_directory_is_neither_written_nor_read_through(
    linked, monkeypatch, tmp_path
):
    """Whoever can write the cache (one restored from a fork) can make its records directory
    a link to a directory of the user's: no record is written there, none is read from it."""
    users_own = tmp_path / "users-own"
    shutil.copytree(_genuine_records(tmp_path, monkeypatch), users_own / "records")
    before = sorted(p.relative_to(users_own) for p in users_own.rglob("*"))
    cache = tmp_path / "cache"
    monkeypatch.setenv(record.CACHE_ENV, str(cache))
    (cache / linked).parent.mkdir(parents=True, exist_ok=True)
    target = users_own if linked == "verify" else users_own / "records"
    (cache / linked).symlink_to(target, target_is_directory=True)

    record.store_record(record.new_record("b" * 64, "x = 2\n", [Imported("import", 0.2)]))
    assert sorted(p.relative_to(users_own) for p in users_own.rglob("*")) == before
    assert (cache / linked).is_symlink()  # left as it was, not replaced
    assert record.load_record(KEY) is None  # a signed record behind the link is not read
    notice = record.caching_off()
    assert notice is not None and "\n" not in notice
    assert f"{cache / linked} is a symbolic link" in notice and "remove it" in notice


def test_records_below_a_linked_cache_directory_are_kept(monkeypatch, tmp_path):
    """The cache directory itself is the user's choice (a link to a larger disk, say)."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "disk", target_is_directory=True)
    monkeypatch.setenv(record.CACHE_ENV, str(tmp_path / "cache"))
    stored = record.new_record(KEY, "x = 1\n", [Imported("import", 0.1)])
    record.store_record(stored)
    assert record.load_record(KEY) == stored
    assert (tmp_path / "disk" / "verify" / "records" / f"{KEY}.json").is_file()
    assert record.caching_off() is None


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
