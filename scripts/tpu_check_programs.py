"""TPU check, run phase: the programs it times, compiled ahead in threads.

On the TPU machine a program compiles in 15-30 s, one at a time, and the check of 2026-12-07
spent most of its 520 s budget compiling (five of fifteen modules timed). The compiles are
independent of one another and of the chip, so `Programs` compiles them all ahead, eight at a
time in threads, from abstract arguments (shapes, dtypes, shardings), in the order the run will
time them, then times them with nothing compiling (`wait`)
(bench/tpu_explore/ab.py: a layer's programs in 40-53 s on eight threads, ~6 min one at a
time). With JAX's persistent cache (JAX_COMPILATION_CACHE_DIR), `--compile-only` fills it in one
call of the device tool and the next call times every program.
Imports only jax and the standard library (no moegen on the TPU machine).
"""

from __future__ import annotations

import concurrent.futures
import statistics
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp

TIMING = {"warmups": 2, "repeats": 10}  # median of repeats after warm-ups (the prototype's)
THREADS = 8  # the TPU machine's host has 13 cores; ab.py's eight compiled without contention
Compiled = Any  # jax.stages.Compiled


def fwd_bwd(fn: Callable[..., jax.Array]) -> Callable[..., Any]:
    """(p, x, ct) -> the gradients of sum(fn(p, x) * ct) with respect to p and x. The
    cotangent is an argument of the program, not a constant folded into it, so that a program
    compiled ahead from shapes is the one that runs."""

    def loss(p: Any, x: jax.Array, ct: jax.Array) -> jax.Array:
        return jnp.sum(fn(p, x).astype(jnp.float32) * ct)

    return jax.grad(loss, argnums=(0, 1))


def abstract(tree: Any) -> Any:
    """Shapes, dtypes and shardings of arrays (or of abstract arrays), for lowering ahead."""

    def one(a: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=getattr(a, "sharding", None))

    return jax.tree.map(one, tree)


def _compile(fn: Callable[..., Any], args: tuple) -> tuple[Compiled, float]:
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


class Programs:
    """Programs compiled in threads: `ahead` submits one (by key, with abstract arguments);
    `compiled` returns it (compiling it now where it was never submitted) and forgets it, so
    that no executable outlives its use. A compile error is raised where the program is taken,
    as if it had been compiled there."""

    def __init__(self, threads: int = THREADS) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(threads)
        self._futures: dict[Hashable, concurrent.futures.Future] = {}
        self.submitted = 0

    def ahead(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> None:
        if key not in self._futures:
            self._futures[key] = self._pool.submit(_compile, fn, abstract(args))
            self.submitted += 1

    def compiled(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> tuple[Compiled, float]:
        """(the compiled program, seconds its compile took)."""
        future = self._futures.pop(key, None)
        if future is None:
            return _compile(fn, abstract(args))
        return future.result()

    def wait(self, seconds: float) -> int:
        """Waits (at most `seconds`) for every compile submitted; how many are still running.
        Timing waits for them all: a program compiling on the host beside a timed one slowed
        it up to 3x on the chip (loading an executable onto the chip holds up the programs
        running there), so the check compiles first and times with nothing compiling."""
        done = concurrent.futures.wait(list(self._futures.values()), timeout=max(0.0, seconds))
        return len(done.not_done)

    def close(self) -> None:
        """Drops what was never taken (a run stopped by its budget) without waiting for it."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._futures.clear()


def median_ms(compiled: Compiled, *args: Any) -> float:
    """The median milliseconds of the timed calls after the warm-ups."""
    for _ in range(TIMING["warmups"]):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(TIMING["repeats"]):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3
