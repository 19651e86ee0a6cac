"""Several specs verified at once (`moegen build --jobs N`), printed as one at a time would be.

Each verification already runs in a worker process of its own; here one thread per running
verification starts its worker and waits for it (a worker dies with the thread that started
it, moegen.interrupts.guard_worker). `OrderedProgress` keeps the report in spec order: the
first unfinished spec prints as it goes, the others are held and printed whole when their
turn comes, so the output of `--jobs N` is that of `--jobs 1`, line for line, times aside.
When one verification fails, or the user interrupts the build, every other worker is killed
and every thread joined before the error goes on (each thread removes its scratch first).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

Event = tuple[Any, ...]


class OrderedProgress:
    """A progress callback per spec; events of a spec whose turn has not come are held."""

    def __init__(self, progress: Callable[..., None], count: int) -> None:
        self._progress = progress
        self._lock = threading.Lock()
        self._held: list[list[Event]] = [[] for _ in range(count)]
        self._finished = [False] * count
        self._turn = 0

    def for_spec(self, index: int) -> Callable[..., None]:
        return lambda *event: self._note(index, event)

    def _note(self, index: int, event: Event) -> None:
        with self._lock:
            if index == self._turn:
                self._progress(*event)
            else:
                self._held[index].append(event)

    def finish(self, index: int) -> None:
        """Spec `index` has nothing more to print; the next ones print what they hold."""
        with self._lock:
            self._finished[index] = True
            while self._turn < len(self._finished) and self._finished[self._turn]:
                self._turn += 1
                self._release(self._turn)

    def flush(self, last: int | None = None) -> None:
        """Print everything held, spec `last` (the one that failed) after all the others."""
        with self._lock:
            order = [i for i in range(len(self._held)) if i != last]
            for index in [*order, *([] if last is None else [last])]:
                self._release(index)
            self._turn = len(self._held)

    def _release(self, index: int) -> None:
        if index < len(self._held):
            held, self._held[index] = self._held[index], []
            for event in held:
                self._progress(*event)


class TaskFailed(Exception):
    """Task `index` raised `error` (the first one in task order among those that failed)."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index, self.error = index, error


def run_tasks[T](tasks: Sequence[Callable[[], T]], jobs: int, stop: Callable[[], None]) -> list[T]:
    """Every task's result in order, at most `jobs` at a time (jobs 1: in this thread).

    A failure raises TaskFailed; then, as on any interrupt, the tasks not started are
    dropped, `stop()` ends those running, and their threads are joined first.
    """
    if jobs <= 1 or len(tasks) <= 1:
        results = []
        for index, task in enumerate(tasks):
            try:
                results.append(task())
            except Exception as err:
                raise TaskFailed(index, err) from err
            except BaseException:  # an interrupt: a worker started a moment ago goes too
                stop()
                raise
        return results
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="moegen-verify") as pool:
        futures = [pool.submit(task) for task in tasks]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
            _raise_first_failure(futures)
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            stop()
            raise  # leaving the pool joins its threads


def _raise_first_failure(futures: list[Future[Any]]) -> None:
    for index, future in enumerate(futures):
        if future.done() and not future.cancelled() and future.exception() is not None:
            error = future.exception()
            assert error is not None
            raise TaskFailed(index, error) from error
