"""`moegen build --jobs N`: specs verified at once, reported as a serial build reports them,
all or nothing, interrupted cleanly; and a rebuild that reuses its verification records."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import _clean_env, snapshot
from test_signals import _processes_mentioning, _wait_for, make_project

import moegen.pipeline
from moegen.parallel import OrderedProgress, TaskFailed, run_tasks
from moegen.verify import VerifyError, VerifyReport
from moegen.verify.messages import Imported

SPECS = ["mixtral_small_cpu", "sigmoid_top1_data_cpu"]
PATHS = [Path(f"specs/{name}.yaml") for name in SPECS]


def test_ordered_progress_holds_a_later_spec_until_the_earlier_one_is_done():
    printed = []
    ordered = OrderedProgress(printed.append, 3)
    ordered.for_spec(1)("b1")
    ordered.for_spec(2)("c1")
    ordered.for_spec(0)("a1")
    assert printed == ["a1"]
    ordered.finish(2)
    assert printed == ["a1"]
    ordered.finish(0)
    assert printed == ["a1", "b1"]
    ordered.for_spec(1)("b2")
    ordered.finish(1)
    assert printed == ["a1", "b1", "b2", "c1"]


def test_ordered_progress_flushes_the_failed_spec_last():
    printed = []
    ordered = OrderedProgress(printed.append, 3)
    for index, event in enumerate(["a", "b", "c"]):
        ordered.for_spec(index)(event)
    ordered.flush(last=1)
    assert printed == ["a", "c", "b"]


def test_run_tasks_keeps_task_order_and_reports_the_first_failure():
    stopped = []
    assert run_tasks([lambda: 1, lambda: 2, lambda: 3], 2, lambda: stopped.append(1)) == [1, 2, 3]
    release = threading.Event()

    def slow_failure():
        release.wait(10)
        raise ValueError("first")

    def quick_failure():
        release.set()
        raise ValueError("second")

    with pytest.raises(TaskFailed) as failed:
        run_tasks([lambda: 0, slow_failure, quick_failure], 3, lambda: stopped.append(1))
    assert failed.value.index in (1, 2) and isinstance(failed.value.error, ValueError)
    assert stopped


def test_run_tasks_serially_in_this_thread():
    threads = []
    run_tasks([lambda: threads.append(threading.current_thread())], 1, lambda: None)
    assert threads == [threading.main_thread()]


def test_an_interrupted_serial_run_stops_its_workers_and_runs_no_more_tasks():
    stopped, ran = [], []

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_tasks([interrupted, lambda: ran.append(1)], 1, lambda: stopped.append(1))
    assert stopped == [1] and ran == []


def _fake_verify(order: list[str], *, out_of_order: bool, failing: str | None = None):
    """out_of_order: the first spec's verification waits until the second's is done."""
    second_done = threading.Event()

    def verify(loaded, source, *, plan, on_step=lambda step: None, timeout_s=None, cache=None):
        name = loaded.source.name
        if name == SPECS[0] and out_of_order:
            assert second_done.wait(10)
        on_step(Imported("import", 0.0))
        order.append(name)
        if name == SPECS[1]:
            second_done.set()
        if name == failing:
            raise VerifyError(f"twin parity: y differs ({name})")
        return VerifyReport(steps=[Imported("import", 0.0)])

    return verify


def _build(project: Path, jobs: int, monkeypatch, failing: str | None = None):
    order, events = [], []
    verify = _fake_verify(order, out_of_order=jobs > 1, failing=failing)
    monkeypatch.setattr(moegen.pipeline, "verify", verify)
    monkeypatch.chdir(project)

    def progress(spec, step, seconds, details):
        events.append((spec, step))

    try:
        moegen.pipeline.build(PATHS, Path("generated"), progress=progress, jobs=jobs)
    finally:
        monkeypatch.undo()
    return order, events


def test_two_jobs_report_and_write_what_one_job_does(tmp_path, monkeypatch):
    serial = make_project(tmp_path / "serial", SPECS)
    parallel = make_project(tmp_path / "parallel", SPECS)
    serial_order, serial_events = _build(serial, 1, monkeypatch)
    parallel_order, parallel_events = _build(parallel, 2, monkeypatch)
    assert serial_order == SPECS
    assert parallel_order == SPECS[::-1]  # the second finished first...
    assert parallel_events == serial_events  # ...yet the report is the serial one
    assert [spec for spec, _ in serial_events] == [f"specs/{SPECS[0]}.yaml"] * 4 + [
        f"specs/{SPECS[1]}.yaml"
    ] * 4
    assert snapshot(parallel / "generated") == snapshot(serial / "generated")


def test_a_failure_among_jobs_writes_nothing_and_is_reported_last(tmp_path, monkeypatch):
    project = make_project(tmp_path / "p", SPECS)
    before = snapshot(project / "generated")
    order, events = [], []
    monkeypatch.setattr(
        moegen.pipeline, "verify", _fake_verify(order, out_of_order=True, failing=SPECS[1])
    )
    monkeypatch.chdir(project)
    with pytest.raises(VerifyError, match=SPECS[1]):
        moegen.pipeline.build(
            PATHS, Path("generated"), progress=lambda *e: events.append(e[:2]), jobs=2
        )
    assert snapshot(project / "generated") == before
    assert events[-1] == (f"specs/{SPECS[1]}.yaml", "verify: import")


# ---------------------------------------------------------------------------------------
# the real thing: CPU specs verified by their workers


def _normalized(stderr: str) -> list[str]:
    """Progress lines with their times blanked."""
    return [re.sub(r" +\d+\.\d\d s", " T s", line) for line in stderr.splitlines()]


def _moegen(project: Path, *args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moegen", "build", *args],
        cwd=project,
        env=_clean_env() | {"MOEGEN_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
def test_jobs_2_prints_and_writes_what_a_serial_build_does(tmp_path):
    serial = make_project(tmp_path / "serial", SPECS)
    parallel = make_project(tmp_path / "parallel", SPECS)
    specs = [f"specs/{name}.yaml" for name in SPECS]
    one = _moegen(serial, "--no-cache", *specs, cache=tmp_path / "c1")
    two = _moegen(parallel, "--no-cache", "--jobs", "2", *specs, cache=tmp_path / "c2")
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    assert _normalized(two.stderr) == _normalized(one.stderr)
    assert snapshot(parallel / "generated") == snapshot(serial / "generated")
    assert not (tmp_path / "c1").exists() and not (tmp_path / "c2").exists()  # --no-cache


@pytest.mark.slow
def test_rebuild_reuses_the_record_and_a_description_edit_too(tmp_path):
    project = make_project(tmp_path / "p", SPECS[:1])
    spec = f"specs/{SPECS[0]}.yaml"
    cache = tmp_path / "cache"
    first = _moegen(project, spec, cache=cache)
    assert first.returncode == 0 and "reused" not in first.stderr, first.stderr
    second = _moegen(project, spec, cache=cache)
    assert second.returncode == 0, second.stderr
    assert "reused: module unchanged;" in second.stderr
    verify_lines = [line for line in _normalized(first.stderr) if "verify:" in line]
    replayed = [line for line in _normalized(second.stderr) if "(recorded)" in line]
    unmarked = [
        re.sub(r"  \(recorded\)$", "", line.replace("(recorded) ", "")) for line in replayed
    ]
    assert verify_lines and verify_lines == unmarked, (verify_lines, replayed)
    path = project / spec
    text = path.read_text(encoding="utf-8")
    path.write_text(re.sub(r"(?m)^description: .*$", "description: Edited.", text), "utf-8")
    third = _moegen(project, spec, cache=cache)
    assert third.returncode == 0 and "reused: module unchanged but for" in third.stderr
    assert 'SPEC_DESCRIPTION = "Edited."' in (project / "generated" / f"{SPECS[0]}.py").read_text()
    fourth = _moegen(project, "--reverify", spec, cache=cache)
    assert fourth.returncode == 0 and "reused" not in fourth.stderr, fourth.stderr


def _two_jobs(scratch_root: Path) -> list[str] | None:
    found = [str(path) for path in scratch_root.glob("moegen-verify-*/job.json")]
    return found if len(found) == 2 else None


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
@pytest.mark.slow
def test_interrupted_jobs_leave_no_worker_and_no_scratch(tmp_path, sig):
    project = make_project(tmp_path / "p", SPECS)
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    before = snapshot(project / "generated")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moegen", "build", "--jobs", "2", *map(str, PATHS)],
        cwd=project,
        env=_clean_env() | {"TMPDIR": str(scratch_root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        jobs = _wait_for(lambda: _two_jobs(scratch_root), 60, "two jobs")
        _wait_for(lambda: all(_processes_mentioning(job) for job in jobs), 60, "both workers")
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    expected = -signal.SIGKILL if sig == signal.SIGKILL else 128 + sig
    assert proc.returncode == expected, stderr
    _wait_for(lambda: not any(_processes_mentioning(job) for job in jobs), 10, "workers to exit")
    _wait_for(lambda: not list(scratch_root.iterdir()), 10, "the scratch directories to go")
    assert snapshot(project / "generated") == before
