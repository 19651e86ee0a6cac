"""In the child process: the target's devices, and a program compiled for them or refused.

Public, beside `moegen.verify`: the verify worker and the benchmark's compile children use
it, so that both compile for the same devices and read an out-of-memory the same way. It
imports JAX: only processes started for the work import it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import jax

from moegen.verify.hlo.counters import compiled_counters
from moegen.verify.hlo.loops import kernel_tile_bytes
from moegen.verify.memory.compiler_errors import OutOfMemory, out_of_memory
from moegen.verify.messages import TpuTarget

__all__ = [
    "CheckFailed", "OutOfMemory", "compile_program", "compiled_counters", "kernel_tile_bytes",
    "target_devices",
]  # fmt: skip


class CheckFailed(Exception):
    """A check of the worker failed: reported as the step's error, not as a traceback."""


def target_devices(module: Any, tpu: TpuTarget | Mapping[str, Any] | None) -> list[Any]:
    """Fake CPU devices, or compile-only devices of the TPU slice (libtpu, no TPU needed)."""
    if tpu is None:
        return jax.devices()[: module.NUM_DEVICES]
    if importlib.util.find_spec("libtpu") is None:
        raise CheckFailed(
            "compiling for TPU needs libtpu: pip install 'moegen[tpu]' (libtpu==0.0.51)"
        )
    from jax.experimental import topologies

    target = tpu if isinstance(tpu, TpuTarget) else TpuTarget.from_json(tpu)
    return topologies.get_topology_desc(
        platform="tpu",
        topology_name=target.topology_name,
        chip_config_name="default",
        chips_per_host_bounds=tuple(target.chips_per_host_bounds),
        num_slices=target.num_slices,
    ).devices


def compile_program(program: Callable[..., Any], *args: Any) -> Any | OutOfMemory:
    """`jax.jit(program)` compiled for `args` (abstract, with shardings), or the compiler's
    proof that it cannot fit (OutOfMemory: which memory, and the call it names)."""
    try:
        return jax.jit(program).lower(*args).compile()
    except jax.errors.JaxRuntimeError as err:
        refused = out_of_memory(str(err))
        if refused is None:
            raise
        return refused
