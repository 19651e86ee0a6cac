"""A line at a steady interval while a verify step runs, for a person at a terminal.

A full-size compile of forward+backward can take minutes and a twin parity run several, with
nothing printed between two steps; the heartbeat says which step is running and for how
long, with the seconds the same step took in a recorded verification of this module when
moegen holds one (moegen.verify.records.record). The command line turns it on only when stderr is a
terminal (`enabled`); off, nothing here runs, so output to a pipe or a file is unchanged.

The worker reports each step when it ends, so the step running is the one after the last
reported, in the order moegen.verify.records.evidence reads from the job (a record is judged by it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from moegen import provenance
from moegen.verify.messages import Job
from moegen.verify.records import record
from moegen.verify.records.evidence import expected_steps

Sink = Callable[[str], None]
DEFAULT_INTERVAL_S = 20.0
INTERVAL_ENV = "MOEGEN_HEARTBEAT_S"  # seconds between two lines (tests use a fraction)
# Records are small, but a cache of years of builds need not be read whole for an estimate.
MAX_RECORDS_SCANNED = 200


@dataclasses.dataclass
class _Settings:
    sink: Sink | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    name_modules: bool = False  # several verifications at once: say whose step it is


_settings = _Settings()


MAX_ENV_SECONDS = 7 * 86400.0  # "inf" and the like: a week, which time.monotonic can add


def seconds_from_env(name: str, default: float) -> float:
    """Seconds from the environment variable `name`: `default` when unset, not a number or
    not positive; at most a week (a timer past time_t's range raises in its thread)."""
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    if math.isnan(value) or value <= 0:
        return default
    return min(value, MAX_ENV_SECONDS)


def interval_from_env() -> float:
    return seconds_from_env(INTERVAL_ENV, DEFAULT_INTERVAL_S)


@contextlib.contextmanager
def enabled(sink: Sink, interval_s: float, name_modules: bool = False) -> Iterator[None]:
    """Heartbeats go to `sink` every `interval_s` seconds inside this block."""
    global _settings
    saved, _settings = _settings, _Settings(sink, interval_s, name_modules)
    try:
        yield
    finally:
        _settings = saved


class Heartbeat:
    """Calls `sink` every `interval_s` with the running step's line until `stop`."""

    def __init__(
        self,
        sink: Sink,
        interval_s: float,
        steps: list[str],
        estimates: dict[str, float],
        module: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sink, self._interval_s, self._clock = sink, interval_s, clock
        self._steps, self._estimates, self._module = steps, estimates, module
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._index, self._since = 0, clock()
        self._thread = threading.Thread(target=self._beat, name="moegen-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def step_done(self) -> None:
        with self._lock:
            self._index, self._since = self._index + 1, self._clock()

    def stop(self) -> None:
        self._done.set()
        if self._thread.ident is not None:
            self._thread.join()

    def line(self) -> str | None:
        """The running step, how long it has run, and how long it took last time (if known);
        None once every expected step is reported (the worker is exiting)."""
        with self._lock:
            if self._index >= len(self._steps):
                return None
            step, elapsed = self._steps[self._index], self._clock() - self._since
        who = f"[{self._module}] " if self._module else ""
        estimate = self._estimates.get(step)
        known = "" if estimate is None else f" (took {estimate:.0f} s last time)"
        return f"  {who}verify: {step} still running, {elapsed:.0f} s{known}"

    def _beat(self) -> None:
        while not self._done.wait(self._interval_s):
            text = self.line()
            if text is not None:
                self._sink(text)


@contextlib.contextmanager
def beating(job_path: Path, num_devices: int, on_step: Callable[[Any], None]) -> Iterator[Any]:
    """`on_step`, told of each step as the worker of `job_path` reports it; while heartbeats
    are enabled, a heartbeat runs meanwhile. Disabled: `on_step` itself, nothing else."""
    sink = _settings.sink
    if sink is None:
        yield on_step
        return
    job = Job.from_json(json.loads(job_path.read_text(encoding="utf-8")))
    module = Path(job.module).stem if _settings.name_modules else None
    beat = Heartbeat(
        sink, _settings.interval_s, expected_steps(job), recorded_seconds(job, num_devices), module
    )

    def noted(step: Any) -> None:
        beat.step_done()
        on_step(step)

    beat.start()
    try:
        yield noted
    finally:
        beat.stop()


def recorded_seconds(job: Job, num_devices: int) -> dict[str, float]:
    """Each step's seconds in a passed record of this verification (`--reverify`, or a record
    ignored), else in the newest record of the same module source (verified by another moegen
    or with other settings); {} without one, or when the build uses no cache (--no-cache)."""
    if job.compilation_cache is None:
        return {}
    paths = {job.module, *(twin.path for twin in job.twins)}
    sources = {path: Path(path).read_text(encoding="utf-8") for path in paths}
    found = _trusted(record.record_key(job, sources, num_devices))
    if found is None:
        found = _newest_of_module(record.module_sha256(sources[job.module]))
    return {} if found is None else {step.step: step.seconds for step in found.steps}


def _trusted(key: str) -> record.Record | None:
    try:
        return record.load_record(key)
    except (record.UntrustedRecord, OSError, ValueError):
        return None


def _newest_of_module(module_sha256: str) -> record.Record | None:
    """The newest signed record of the module with this digest, among the latest written.
    Each file is read as load_record reads one (the cache may hold anything: links, FIFOs)."""
    try:
        paths = sorted(record.records_dir().glob("*.json"), key=_mtime, reverse=True)
    except OSError:
        return None
    for path in paths[:MAX_RECORDS_SCANNED]:
        try:
            read = provenance.read_own_json(path, record.MAX_RECORD_BYTES)
        except (provenance.NotOurs, OSError):
            continue
        data = read[0] if read else None
        if isinstance(data, dict) and data.get("module_sha256") == module_sha256:
            found = _trusted(path.stem)
            if found is not None:
                return found
    return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
