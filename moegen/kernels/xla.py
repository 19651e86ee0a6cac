"""Kernel xla: jax.lax.ragged_dot, the portable grouped matmul. It runs anywhere (the CPU twin
of every other kernel runs it), needs no config and nothing installed."""

from __future__ import annotations

from moegen.kernels.base import Kernel

XLA = Kernel(
    name="xla",
    summary="jax.lax.ragged_dot (anywhere)",
    aliases=("ragged_dot",),
    platforms=frozenset({"cpu", "tpu", "gpu"}),
)
