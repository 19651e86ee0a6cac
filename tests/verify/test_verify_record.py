"""Verification records (moegen.verify.records.record): what changes the key and what does not, a hit,
a miss, a corrupt record, atomic writes, and verify() reusing a record without a worker."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from record_cases import passing_steps

import moegen.verify.verification
from moegen.pipeline import generate
from moegen.verify import VerifyCache, VerifyReport, verify
from moegen.verify.messages import Imported, Job, Reused, TpuTarget, TwinJob, TwinParity
from moegen.verify.records import record

SPEC = REPO_ROOT / "specs" / "mixtral_small_cpu.yaml"
MODULE = (REPO_ROOT / "generated" / "mixtral_small_cpu.py").read_text(encoding="utf-8")


def _with_description(source: str, text: str) -> str:
    start = source.index("SPEC_DESCRIPTION = ")
    end = source.index("\n\n", start)
    return source[:start] + f"SPEC_DESCRIPTION = {text!r}" + source[end:]


def _job(**changes) -> tuple[Job, dict[str, str]]:
    twin = TwinJob("/scratch/twin_0.py", "float32", 1e-5, {"top_k": 2})
    job = Job(module="/scratch/m.py", twins=(twin,), **changes)
    return job, {"/scratch/m.py": MODULE, "/scratch/twin_0.py": MODULE.replace("512", "16")}


def _key(job_and_sources: tuple[Job, dict[str, str]], devices: int = 8) -> str:
    job, sources = job_and_sources
    return record.record_key(job, sources, devices)


# ---------------------------------------------------------------------------------------
# the key


def test_description_and_spec_header_are_not_verified_text():
    edited = _with_description(MODULE, "Another description, " * 20)
    edited = edited.replace("# spec: specs/mixtral_small_cpu.yaml", "# spec: elsewhere/x.yaml")
    edited = edited.replace("# spec-sha256: ", "# spec-sha256: 0")
    assert edited != MODULE
    assert record.verified_text(edited) == record.verified_text(MODULE)
    assert "Another description" not in record.verified_text(edited)


def test_code_and_docstring_are_verified_text():
    for changed in (MODULE.replace("NUM_DEVICES = 8", "NUM_DEVICES = 4"), MODULE + "# x\n"):
        assert record.verified_text(changed) != record.verified_text(MODULE)


def test_key_is_stable_and_ignores_paths_description_and_cache_location():
    job, sources = _job()
    moved = Job(
        module="/other/m.py", twins=(TwinJob("/other/t.py", "float32", 1e-5, {"top_k": 2}),)
    )
    moved_sources = {
        "/other/m.py": _with_description(MODULE, "edited"),
        "/other/t.py": sources["/scratch/twin_0.py"],
    }
    assert _key((job, sources)) == _key((job, sources))
    assert _key((moved, moved_sources)) == _key((job, sources))
    assert _key(_job(compilation_cache="/somewhere")) == _key((job, sources))


@pytest.mark.parametrize(
    "change",
    [
        "module",
        "twin",
        "tolerance",
        "reference",
        "tpu",
        "programs",
        "devices",
        "xla_flags",
        "jax",
        "verifier",
    ],
)
def test_key_changes_with_what_shapes_the_verdict(change, monkeypatch):
    base = _key(_job())
    job, sources = _job()
    devices = 8
    if change == "module":
        sources["/scratch/m.py"] = MODULE.replace("NUM_DEVICES = 8", "NUM_DEVICES = 4")
    elif change == "twin":
        sources["/scratch/twin_0.py"] += "# changed\n"
    elif change == "tolerance":
        job = Job(
            module=job.module, twins=(TwinJob(job.twins[0].path, "float32", 1e-4, {"top_k": 2}),)
        )
    elif change == "reference":
        job = Job(
            module=job.module, twins=(TwinJob(job.twins[0].path, "float32", 1e-5, {"top_k": 1}),)
        )
    elif change == "tpu":
        job, sources = _job(tpu=TpuTarget("v5e:2x4", (2, 2, 1)))
    elif change == "programs":
        job, sources = _job(programs=("forward+backward",))
    elif change == "devices":
        devices = 4
    elif change == "xla_flags":
        monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    elif change == "jax":
        real = record.installed_version
        monkeypatch.setattr(
            record, "installed_version", lambda d: "0.0.0" if d == "jax" else real(d)
        )
    elif change == "verifier":
        monkeypatch.setattr(record, "verifier_digest", lambda: "another verifier")
    assert record.record_key(job, sources, devices) != base


def test_tpu_jobs_pin_libtpu_and_te_jobs_pin_transformer_engine():
    assert "libtpu" in record.pinned_versions(_job(tpu=TpuTarget("v5e:2x4", (2, 2, 1)))[0])
    assert "libtpu" not in record.pinned_versions(_job()[0])
    assert {"jax", "jaxlib", "python", "moegen"} <= set(record.pinned_versions(_job()[0]))


# ---------------------------------------------------------------------------------------
# records on disk

STEPS = (Imported("import", 0.1), TwinParity("twin parity (float32)", 2.0, ()))


def test_stored_record_reads_back():
    stored = record.new_record("k" * 64, MODULE, STEPS)
    record.store_record(stored)
    assert record.load_record("k" * 64) == stored
    assert record.records_dir().is_relative_to(record.cache_root())
    assert [p.name for p in record.records_dir().iterdir()] == ["k" * 64 + ".json"]  # no temporary


def test_no_record_is_a_miss():
    assert record.load_record("0" * 64) is None


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{",
        "[]",
        "null",
        '{"format": 1}',
        "not json at all \x00",
        "WRONG_KEY",
        "BAD_STEP",
        "OLD_FORMAT",
    ],
)
def test_corrupt_record_is_ignored_with_a_reason(content):
    key = "c" * 64
    data = record.new_record(key, MODULE, STEPS).to_json()
    if content == "WRONG_KEY":
        content = json.dumps(data | {"key": "d" * 64})
    elif content == "BAD_STEP":
        content = json.dumps(data | {"steps": [{"step": "unheard of", "seconds": 1}]})
    elif content == "OLD_FORMAT":
        content = json.dumps(data | {"format": 0})
    record.records_dir().mkdir(parents=True)
    (record.records_dir() / f"{key}.json").write_text(content, encoding="utf-8")
    with pytest.raises(record.UntrustedRecord):
        record.load_record(key)


def test_a_directory_where_the_record_should_be_is_ignored():
    record.records_dir().mkdir(parents=True)
    (record.records_dir() / f"{'e' * 64}.json").mkdir()
    with pytest.raises(record.UntrustedRecord, match="not a regular file"):
        record.load_record("e" * 64)


def test_a_cache_that_cannot_be_written_is_skipped(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    monkeypatch.setenv(record.CACHE_ENV, str(blocker))
    record.store_record(record.new_record("f" * 64, MODULE, STEPS))  # no exception
    assert record.load_record("f" * 64) is None


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(record.CACHE_ENV, str(tmp_path / "mine"))
    assert record.cache_root() == tmp_path / "mine"
    monkeypatch.delenv(record.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert record.cache_root() == tmp_path / "xdg" / "moegen"


def test_the_compilation_cache_is_private_state_not_the_shared_cache(monkeypatch, tmp_path):
    """JAX's cache entries are executables the twins run unchecked: a cache restored from a
    fork must not be able to plant one, so they live where only this user writes."""
    monkeypatch.setenv(record.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("MOEGEN_STATE_DIR", str(tmp_path / "state"))
    directory = record.compilation_cache_dir()
    assert directory == tmp_path / "state" / "jax-cache"
    assert not directory.is_relative_to(record.cache_root())
    assert (directory.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("where", ["state", "state/jax-cache"])
def test_no_compilation_cache_where_others_may_write(where, monkeypatch, tmp_path):
    monkeypatch.setenv("MOEGEN_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / where).mkdir(parents=True)
    (tmp_path / where).chmod(0o777)
    assert record.compilation_cache_dir() is None


def test_a_link_for_the_compilation_cache_is_not_followed(monkeypatch, tmp_path):
    monkeypatch.setenv("MOEGEN_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "state" / "jax-cache").symlink_to(tmp_path / "elsewhere")
    assert record.compilation_cache_dir() is None


# ---------------------------------------------------------------------------------------
# verify() with a record: the worker is not started


@pytest.fixture
def counted_worker(monkeypatch):
    """A worker that reports every step of its job with passing figures, and counts its runs."""
    started = []
    param_bytes = generate(SPEC).plan.cost.param_bytes

    def worker(job_path: Path, num_devices, on_step, timeout_s):
        started.append(json.loads(job_path.read_text(encoding="utf-8")))
        steps = passing_steps(Job.from_json(started[-1]), param_bytes)
        for step in steps:
            on_step(step)
        return VerifyReport(steps=steps)

    monkeypatch.setattr(moegen.verify.verification, "_run_worker", worker)
    return started


def test_verify_reuses_a_passed_record_and_says_so(counted_worker):
    generated = generate(SPEC)
    first = verify(generated.loaded, generated.source, plan=generated.plan, cache=VerifyCache())
    seen = []
    again = verify(
        generated.loaded,
        generated.source,
        plan=generated.plan,
        cache=VerifyCache(),
        on_step=seen.append,
    )
    assert len(counted_worker) == 1
    assert counted_worker[0]["compilation_cache"] == str(record.compilation_cache_dir())
    reused, *steps = again.steps
    assert isinstance(reused, Reused) and reused.reason == "module unchanged"
    assert reused.verified_at[:4].isdigit()
    assert steps == first.steps
    assert seen == again.steps


def test_verify_reuses_the_record_after_a_description_edit(counted_worker):
    generated = generate(SPEC)
    verify(generated.loaded, generated.source, plan=generated.plan, cache=VerifyCache())
    edited = _with_description(generated.source, "Only the description changed.")
    report = verify(generated.loaded, edited, plan=generated.plan, cache=VerifyCache())
    assert len(counted_worker) == 1
    assert report.steps[0].reason == "module unchanged but for its description or header"


def test_reverify_runs_the_worker_and_no_cache_keeps_no_record(counted_worker):
    generated = generate(SPEC)
    verify(generated.loaded, generated.source, plan=generated.plan, cache=None)
    assert not record.records_dir().exists()
    assert "compilation_cache" not in counted_worker[0]  # nor JAX's compilation cache
    verify(generated.loaded, generated.source, plan=generated.plan, cache=VerifyCache())
    report = verify(
        generated.loaded, generated.source, plan=generated.plan, cache=VerifyCache(reuse=False)
    )
    assert len(counted_worker) == 3
    assert not any(isinstance(step, Reused) for step in report.steps)


def test_a_failed_verification_is_not_recorded(monkeypatch):
    def failing(*args):
        raise moegen.verify.VerifyError("twin parity: y differs")

    monkeypatch.setattr(moegen.verify.verification, "_run_worker", failing)
    generated = generate(SPEC)
    with pytest.raises(moegen.verify.VerifyError):
        verify(generated.loaded, generated.source, plan=generated.plan, cache=VerifyCache())
    assert not record.records_dir().exists() or not list(record.records_dir().iterdir())


# ---------------------------------------------------------------------------------------
# the command line


def _build(invoke_main, project: Path, *options: str):
    return invoke_main("build", *options, "specs/mixtral_small_cpu.yaml", cwd=project)


def test_cli_marks_a_reused_verification(counted_worker, tmp_project, invoke_main):
    first = _build(invoke_main, tmp_project)
    second = _build(invoke_main, tmp_project)
    assert first.code == second.code == 0, first.output + second.output
    assert len(counted_worker) == 1
    [line] = [line for line in second.stderr.splitlines() if "reused" in line]
    assert re.fullmatch(
        r"  verify: reused record +0\.00 s  \(verified \d{4}-\d\d-\d\d \d\d:\d\d, reused: "
        r"module unchanged; --reverify to run it again\)",
        line,
    ), line
    # the recorded steps again, with their figures and times, each marked as a record's
    recorded = [line for line in first.stderr.splitlines() if line.startswith("  verify:")]
    marked = [re.sub(r" s(  |$)", " s  (recorded) ", line, count=1) for line in recorded]
    assert all(line.rstrip() in second.stderr.splitlines() for line in marked), second.stderr
    assert "wrote generated/mixtral_small_cpu.py" in second.stderr


def test_cli_reverify_and_no_cache(counted_worker, tmp_project, invoke_main):
    assert _build(invoke_main, tmp_project, "--no-cache").code == 0
    assert not record.records_dir().exists()
    assert _build(invoke_main, tmp_project).code == 0
    again = _build(invoke_main, tmp_project, "--reverify")
    assert again.code == 0 and "reused" not in again.stderr, again.output
    assert len(counted_worker) == 3
