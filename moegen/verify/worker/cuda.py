"""Lower GPU targets on a CPU-only CI: a program lowered for CUDA to StableHLO, no GPU needed.

A kernel lowered this way (its registry entry's CudaLowering) first prepares its own package
in the worker's process (`prepare_kernel`: the kernel module imports it as if every device had
the target's compute capability); the program is then lowered for CUDA
(`lowering_platforms=("cuda",)`), where the kernel's launches show as custom calls, counted
here. Nothing is compiled or run: numerics of those code paths need a GPU.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from moegen.kernels import kernel

XLA_RAGGED_DOT = re.compile(r"\bchlo\.ragged_dot\b")  # jax.lax.ragged_dot lowered: no kernel's
_CUSTOM_CALL = re.compile(r'custom_call\s*@([\w.$-]+)|call_target_name\s*=\s*"([^"]+)"')


def prepare_kernel(name: str, sm: int) -> Any:
    """Prepare the package kernel `name` lowers through, as if every device had compute
    capability `sm` (KernelNotInstalled, saying how to install it, where it is missing)."""
    lowering = kernel(name).cuda_lowering
    assert lowering is not None, f"kernel {name} is not lowered for CUDA"
    return lowering.prepare(sm)


def lower_for_cuda(fn: Callable[..., Any], *abstract_args: Any) -> str:
    """StableHLO text of `jax.jit(fn)` lowered for CUDA from abstract args (ShapeDtypeStructs).

    Lowering needs no GPU; compiling would, so this stops at the lowered module.
    """
    import jax

    traced = jax.jit(fn).trace(*abstract_args)
    return traced.lower(lowering_platforms=("cuda",)).as_text()


def count_custom_calls(text: str) -> dict[str, int]:
    """Custom call target name -> number of calls in a StableHLO (or HLO) text."""
    names = (pretty or generic for pretty, generic in _CUSTOM_CALL.findall(text))
    return dict(Counter(names))
