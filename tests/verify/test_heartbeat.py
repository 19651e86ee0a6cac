"""The heartbeat a build prints on a terminal while a verify step runs (moegen.verify.worker.heartbeat), its
absence everywhere else, and verify workers that keep libtpu's start-up noise to themselves."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import LIBTPU_NOISE, REPO_ROOT
from tpu_cases import pallas_yaml, write_spec

from moegen.pipeline import generate
from moegen.verify import verify
from moegen.verify.messages import Imported, Job, TwinJob, encode
from moegen.verify.records import record
from moegen.verify.worker import heartbeat, pool


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_line_names_the_running_step_its_time_and_the_recorded_estimate():
    clock = FakeClock()
    beat = heartbeat.Heartbeat(
        print, 20.0, ["import", "compile forward"], {"compile forward": 540.4}, clock=clock
    )
    clock.now += 3.2
    assert beat.line() == "  verify: import still running, 3 s"
    beat.step_done()
    clock.now += 61.0
    assert beat.line() == ("  verify: compile forward still running, 61 s (took 540 s last time)")
    beat.step_done()  # every expected step reported: the worker is exiting, nothing to say
    assert beat.line() is None


def test_line_names_the_module_when_several_verify_at_once():
    beat = heartbeat.Heartbeat(print, 20.0, ["import"], {}, module="qwen", clock=FakeClock())
    assert beat.line() == "  [qwen] verify: import still running, 0 s"


def test_heartbeat_beats_at_its_interval_until_stopped():
    lines: list[str] = []
    beat = heartbeat.Heartbeat(lines.append, 0.02, ["import"], {})
    beat.start()
    time.sleep(0.3)
    beat.stop()
    count = len(lines)
    assert count >= 3 and all("verify: import still running" in line for line in lines)
    time.sleep(0.1)
    assert len(lines) == count


def test_expected_steps_come_from_the_job(tmp_path):
    twin = TwinJob(str(tmp_path / "twin.py"), "float32", 1e-5, {})
    job = Job(module=str(tmp_path / "m.py"), twins=(twin,), variants=("short",))
    assert heartbeat.expected_steps(job) == [
        "import",
        "twin parity (float32)",
        "compile forward",
        "compile forward+backward",
        "compile forward (short)",
        "compile forward+backward (short)",
    ]


def _job_file(tmp_path: Path, cache: bool = False) -> tuple[Path, Job]:
    module = tmp_path / "tiny_module.py"
    module.write_text("X = 1\n", encoding="utf-8")
    job = Job(
        module=str(module),
        programs=("forward",),
        compilation_cache=str(tmp_path / "jax-cache") if cache else None,
    )
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job.to_json()), encoding="utf-8")
    return path, job


# A stand-in for the worker: one step after a second's work, then done.
FAKE_WORKER = (
    "import sys, time; time.sleep(1.0); "
    f"print({encode(Imported('import', 1.0))!r}, flush=True); "
    f"print({encode(Imported('compile forward', 0.0))!r}, flush=True)"
)


def test_a_worker_beats_while_heartbeats_are_enabled(tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "_WORKER_MAIN", FAKE_WORKER)
    job_path, _ = _job_file(tmp_path)
    lines: list[str] = []
    steps: list[str] = []
    with heartbeat.enabled(lines.append, 0.2):
        report = pool.run_worker(job_path, 1, lambda step: steps.append(step.step), 60)
    assert steps == ["import", "compile forward"] == [s.step for s in report.steps]
    assert lines and all(line.startswith("  verify: import still running, ") for line in lines)


def test_a_worker_is_silent_without_heartbeats(tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "_WORKER_MAIN", FAKE_WORKER)
    monkeypatch.setattr(heartbeat, "Heartbeat", None)  # any use would raise
    job_path, _ = _job_file(tmp_path)
    report = pool.run_worker(job_path, 1, lambda step: None, 60)
    assert [s.step for s in report.steps] == ["import", "compile forward"]


def test_estimates_come_from_a_record_of_the_same_module(tmp_path):
    _, job = _job_file(tmp_path, cache=True)
    assert heartbeat.recorded_seconds(job, 1) == {}
    record.records_dir().mkdir(parents=True, exist_ok=True)
    os.mkfifo(record.records_dir() / f"{'0' * 64}.json")  # a planted FIFO must not block it
    (record.records_dir() / f"{'1' * 64}.json").symlink_to("/dev/zero")
    assert heartbeat.recorded_seconds(job, 1) == {}
    source = Path(job.module).read_text(encoding="utf-8")
    other_job = Job(module=job.module, programs=("forward+backward",), compilation_cache="x")
    other_key = record.record_key(other_job, {job.module: source}, 1)
    record.store_record(record.new_record(other_key, source, [Imported("import", 7.0)]))
    assert heartbeat.recorded_seconds(job, 1) == {"import": 7.0}
    key = record.record_key(job, {job.module: source}, 1)
    record.store_record(record.new_record(key, source, [Imported("import", 9.0)]))
    assert heartbeat.recorded_seconds(job, 1) == {"import": 9.0}  # this very verification's
    no_cache = Job(module=job.module, programs=("forward",))
    assert heartbeat.recorded_seconds(no_cache, 1) == {}  # --no-cache reads no record


CLI_PROBE = textwrap.dedent(
    """
    from moegen import cli
    from moegen.verify.worker import heartbeat
    with cli._terminal_heartbeat():
        print("heartbeat on" if heartbeat._settings.sink else "heartbeat off", flush=True)
    """
)


def _output_on_a_terminal(command: list[str], env: dict[str, str], cwd: Path = REPO_ROOT) -> str:
    """What `command` writes on stdout and stderr, both a pseudo-terminal."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin, stdout and stderr are the pty
        os.chdir(cwd)
        os.execve(command[0], command, env)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the pty
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.waitpid(pid, 0)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")  # the tty's newlines


def test_the_command_line_beats_on_a_terminal_only():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    command = [sys.executable, "-c", CLI_PROBE]
    assert "heartbeat on" in _output_on_a_terminal(command, env)
    piped = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert "heartbeat off" in piped.stdout


@pytest.mark.slow
def test_a_build_on_a_terminal_beats_while_it_verifies(tmp_project):
    """A real build, its stderr a terminal: heartbeat lines between the verify steps."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), MOEGEN_HEARTBEAT_S="0.3")
    spec = "specs/sigmoid_top1_data_cpu.yaml"
    command = [sys.executable, "-m", "moegen", "build", spec]
    output = _output_on_a_terminal(command, env, cwd=tmp_project)
    assert "wrote generated/sigmoid_top1_data_cpu.py" in output, output
    assert re.search(r"^  verify: twin parity \(float32\) still running, \d+ s$", output, re.M), (
        output
    )


@pytest.mark.slow
def test_compile_only_tpu_worker_compiles_without_libtpu_noise(tmp_path, monkeypatch):
    """libtpu, loaded for compile-only TPU devices, would log errors about the TPU VM it is
    not on; the worker's environment answers it, and the compile still fits."""
    monkeypatch.chdir(tmp_path)
    for name in ("JAX_PLATFORMS", "TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS"):
        monkeypatch.delenv(name, raising=False)
    generated = generate(write_spec(tmp_path, "quiet_tpu", pallas_yaml()).relative_to(tmp_path))
    stderr: list[str] = []
    collect = pool._collect

    def collect_keeping_stderr(*args):
        messages, text = collect(*args)
        stderr.append(text)
        return messages, text

    monkeypatch.setattr(pool, "_collect", collect_keeping_stderr)
    report = verify(generated.loaded, generated.source, timeout_s=300, run_twins=False)
    assert report.step("memory verdict")["verdict"].startswith("fits")
    assert stderr and not [word for word in LIBTPU_NOISE if word in stderr[0]], stderr[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.5", 0.5),
        ("inf", heartbeat.MAX_ENV_SECONDS),
        ("1e400", heartbeat.MAX_ENV_SECONDS),
        ("nan", 20.0),
        ("abc", 20.0),
        ("", 20.0),
        ("-3", 20.0),
        ("0", 20.0),
    ],
)
def test_seconds_from_the_environment_are_positive_finite_and_bounded(text, expected, monkeypatch):
    """MOEGEN_HEARTBEAT_S=inf made the heartbeat thread's timer raise (a traceback mid-build);
    MOEGEN_VERIFY_TIMEOUT=abc was an internal error."""
    monkeypatch.setenv("MOEGEN_TEST_SECONDS", text)
    assert heartbeat.seconds_from_env("MOEGEN_TEST_SECONDS", 20.0) == expected
