"""The verify workers: each verification's child process started, its steps read as they come,
and every live one stopped at once when a build that verifies several specs fails or is
interrupted.

A worker runs `moegen.verify.worker.child` in a fresh interpreter (JAX fixes its device count at
start-up) with the host platform's device count forced to the mesh's; it dies with this
process (interrupts.guard_worker, before it imports JAX) and then removes its scratch
directory itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from moegen import interrupts
from moegen.verify.memory.compiler_errors import crash_words
from moegen.verify.memory.verdict import CompilerCrashed, VerifyError
from moegen.verify.messages import Message, Step, VerifyReport, WorkerFailed, decode
from moegen.verify.worker import heartbeat

DEFAULT_TIMEOUT_S = 1800
TIMEOUT_ENV = "MOEGEN_VERIFY_TIMEOUT"  # seconds a verify worker may run
OnStep = Callable[[Step], None]


def run_worker(
    job_path: Path,
    num_devices: int,
    on_step: OnStep,
    timeout_s: float | None,
) -> VerifyReport:
    env = worker_env(num_devices, job_path.parent)
    timeout = timeout_s or heartbeat.seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)
    command = [sys.executable, "-c", _WORKER_MAIN, str(job_path)]
    report = VerifyReport()
    # Not `with Popen`: its exit waits for the worker unless the exception is exactly
    # KeyboardInterrupt, and an interrupt (a subclass) must not wait for a worker at work.
    proc = _WORKERS.start(command, env)
    try:
        with heartbeat.beating(job_path, num_devices, on_step) as noted:
            messages, stderr = _collect(proc, report, noted, timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise VerifyError(f"verification timed out after {timeout:.0f} s") from None
    except BaseException:  # an interrupt before _collect's own handler: the same
        _stop(proc)
        raise
    finally:
        _WORKERS.forget(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    if _WORKERS.stopped:
        raise VerifyError("verification stopped")
    if proc.returncode != 0:
        errors = [message for message in messages if isinstance(message, WorkerFailed)]
        if errors:
            raise VerifyError(errors[-1].error)
        raise _ended_without_word(proc, stderr, report)
    return report


def _ended_without_word(
    proc: subprocess.Popen[str], stderr: str, report: VerifyReport
) -> VerifyError:
    """What a worker that died without reporting its error left: a compiler's crash in one
    line where its output has one, else the output's end."""
    after = f" after the step '{report.steps[-1].step}'" if report.steps else ""
    crashed = crash_words(stderr, proc.returncode, after)
    if crashed:
        return CompilerCrashed(crashed)
    return VerifyError(stderr.strip()[-4000:] or f"verifier exited with code {proc.returncode}")


def worker_env(num_devices: int, scratch: Path, xla_flags: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a worker: `num_devices` host devices (and `xla_flags`), CPU JAX with
    compile-only TPU devices, libtpu quiet; it dies with this process (interrupts.guard_worker,
    before it imports JAX) and then removes `scratch` itself."""
    env = dict(os.environ)
    flags = (env.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={num_devices}")
    env["XLA_FLAGS"] = " ".join((*flags, *xla_flags)).strip()
    env["JAX_PLATFORMS"] = "cpu"
    # Compile-only TPU devices need no exclusive hold on libtpu: let verifications run side by side.
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    env.update(_quiet_libtpu(env))
    env[interrupts.PARENT_ENV] = str(os.getpid())
    env[interrupts.SCRATCH_ENV] = str(scratch)
    return env


def _quiet_libtpu(env: dict[str, str]) -> dict[str, str]:
    """What keeps libtpu from guessing at a Cloud TPU VM it is not on. Loaded for a
    compile-only TPU target (no TPU here), it asks for this host's place in a TPU slice and,
    finding none, logs `E0000 ... TPU_WORKER_HOSTNAMES` errors and 'Logging before InitGoogle'
    to stderr, which a failed verification would show. One host of its own answers it; the
    compiled programs are the same (the slice is named by the job's topology). A value the
    user set is kept. CPU targets never load libtpu (JAX_PLATFORMS=cpu)."""
    return {
        name: env.get(name, value)
        for name, value in (("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_HOST_BOUNDS", "1,1,1"))
    }


class _Workers:
    """The verify workers running now, so that a build verifying several specs at once (one
    thread each) can stop them all when one fails or the user interrupts it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen[str]] = set()
        self.stopped = False

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        with self._lock:
            if self.stopped:
                raise VerifyError("verification stopped")
            proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            self._live.add(proc)
            return proc

    def forget(self, proc: subprocess.Popen[str]) -> None:
        with self._lock:
            self._live.discard(proc)

    def stop(self) -> None:
        """Kill every live worker; no new one starts until `allow`."""
        with self._lock:
            self.stopped = True
            for proc in self._live:
                if proc.poll() is None:
                    proc.kill()

    def allow(self) -> None:
        with self._lock:
            self.stopped = False


_WORKERS = _Workers()
stop_workers, allow_workers = _WORKERS.stop, _WORKERS.allow


_WORKER_MAIN = (
    "from moegen.interrupts import guard_worker; guard_worker(); import runpy; "
    "runpy.run_module('moegen.verify.worker.child', run_name='__main__', alter_sys=True)"
)


def _stop(proc: subprocess.Popen[str]) -> None:
    """End the worker and reap it before its scratch directory goes. SIGKILL: it holds
    nothing to release, and SIGTERM means to it that moegen died (interrupts._leave)."""
    with interrupts.blocked():  # a second Ctrl-C must not leave it running
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _collect(
    proc: subprocess.Popen[str],
    report: VerifyReport,
    on_step: OnStep,
    timeout: float,
) -> tuple[list[Message], str]:
    messages: list[Message] = []
    stderr_chunks: list[str] = []
    drain = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)
    timer = threading.Timer(timeout, proc.kill)
    try:
        drain.start()
        timer.start()
        for line in proc.stdout:
            try:
                data = json.loads(line)
                message = decode(data) if isinstance(data, dict) else None
            except ValueError:  # JSONDecodeError too
                message = None
            if message is None:
                continue  # stray output from a library
            messages.append(message)
            if isinstance(message, Step):
                report.steps.append(message)
                on_step(message)
        proc.wait()
    except BaseException:  # SIGINT, SIGTERM, SIGHUP: the worker goes before its scratch
        _stop(proc)
        raise
    finally:
        timed_out = not timer.is_alive() and proc.returncode not in (0, 1)
        timer.cancel()
        if drain.ident is not None:
            drain.join(timeout=5)
    if timed_out:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return messages, "".join(stderr_chunks)
