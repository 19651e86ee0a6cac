"""Signals and process lifetimes: how an interrupted or killed moegen cleans up.

- The CLI turns SIGINT, SIGTERM and SIGHUP alike into `Interrupted` (a KeyboardInterrupt),
  so every `finally` runs: the write phase removes its stage, verify stops its worker and
  removes its scratch directory. Only the first signal raises; a second is dropped, so that
  a second Ctrl-C cannot cut that clean-up short; a third ends moegen (what it leaves, the
  next run removes). A signal the parent process left ignored (`nohup` ignores SIGHUP)
  stays ignored.
- `blocked()` defers those signals across a few system calls that must not be separated.
- Files and directories moegen leaves while it works carry an owner token, `<pid>-<start>`
  (start: the process's start time in clock ticks, from /proc), so that a later run can tell
  the leftovers of a dead process (SIGKILL, power loss) from those of a live one, even after
  its pid has been reused. (The names prove more than that: moegen.provenance.)
- `guard_worker()` is the first thing the verify worker runs: it dies with its parent
  (PR_SET_PDEATHSIG) and removes the scratch directory it was given if the parent is gone.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PARENT_ENV, SCRATCH_ENV = "MOEGEN_VERIFY_PARENT", "MOEGEN_VERIFY_SCRATCH"
SCRATCH_PREFIX = "moegen-verify-"
_PR_SET_PDEATHSIG = 1


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived; `signum` says which (exit status 128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def interrupt_of(err: BaseException | None) -> int | None:
    """The signal behind `err` or its causes (click wraps KeyboardInterrupt in Abort)."""
    while err is not None:
        if isinstance(err, Interrupted):
            return err.signum
        if isinstance(err, KeyboardInterrupt):
            return signal.SIGINT
        err = err.__cause__ or err.__context__
    return None


@contextmanager
def handling_signals() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise Interrupted once; handlers restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may install handlers; the caller's stay in force
        return
    raised: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        raised.append(signum)
        if len(raised) == 1:
            raise Interrupted(signum)
        if len(raised) >= 3:  # clean-up stuck (a lock held elsewhere?): the user insists
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    previous = {sig: signal.getsignal(sig) for sig in CAUGHT}
    try:
        for sig, old in previous.items():
            if old is not signal.SIG_IGN:
                signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


@contextmanager
def blocked() -> Iterator[None]:
    """Defer SIGINT, SIGTERM and SIGHUP (this thread) until the block is done."""
    old = None
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
        yield
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ---------------------------------------------------------------------------------------
# Owner tokens


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _start_time(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else 0


def owner_token() -> str:
    """`<pid>-<start>` of this process, for names of the files it may leave behind."""
    return f"{os.getpid()}-{_start_time(os.getpid())}"


def owner_alive(pid: int, start: int) -> bool:
    """Is the process that made a `<pid>-<start>-...` name still running?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    fields = _stat_fields(pid)
    if fields is None or len(fields) <= 19:
        return True  # no /proc: trust the pid alone
    if fields[0] in ("Z", "X"):
        return False  # a zombie has exited; only its parent has not reaped it yet
    return start == 0 or int(fields[19]) == start


# ---------------------------------------------------------------------------------------
# The verify worker's lifeline


def guard_worker() -> None:
    """First thing in the verify worker: exit at once when moegen dies or signals it.

    The kernel sends SIGTERM when the parent dies (PR_SET_PDEATHSIG; "parent" is the thread
    that started this process, so moegen starts workers from the thread that waits for them);
    the parent pid passed in closes the race of a parent that died before prctl. A signal is
    handled by a thread woken through the wakeup fd, which Python's C-level handler writes
    even while the main thread is inside XLA (where a Python handler would wait for the
    compile to finish). If the parent is gone, nobody else will remove the scratch
    directory: the thread does.
    """
    parent = int(os.environ.get(PARENT_ENV) or 0)
    scratch = os.environ.get(SCRATCH_ENV) or ""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for sig in CAUGHT:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup moegen`: so is the worker
            signal.signal(sig, lambda signum, frame: None)  # the thread below acts
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        signum = os.read(read_fd, 1)[0]
        _leave(parent, scratch, signum)

    threading.Thread(target=watch, name="moegen-lifeline", daemon=True).start()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if parent and os.getppid() != parent:
        _leave(parent, scratch, signal.SIGTERM)


def _leave(parent: int, scratch: str, signum: int) -> None:
    if signum == signal.SIGTERM and parent:
        # The death signal comes when the thread that started this process exits; while the
        # rest of moegen is still going down, getppid() names moegen. Wait for init to adopt
        # this process. (moegen itself stops a worker with SIGKILL and removes the scratch.)
        deadline = time.monotonic() + 3
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.005)
    orphaned = bool(parent) and os.getppid() != parent
    if orphaned and os.path.basename(scratch).startswith(SCRATCH_PREFIX):
        for _ in range(3):  # the main thread may still be writing into it (bytecode caches)
            shutil.rmtree(scratch, ignore_errors=True)
            if not os.path.lexists(scratch):
                break
    os._exit(128 + signum)  # no atexit, no flushing into a pipe nobody reads
