"""Counters of a compiled program: what the compiler says it will do, beside what the plan says.

`compiled_counters(compiled)` reads a `jax.stages.Compiled` (any backend; meant for TPU
targets compiled on compile-only devices) and returns plain JSON-able values:

- `flops`, `bytes_accessed`, `transcendentals`: `compiled.cost_analysis()`, per device. Its
  `optimal_seconds` is deliberately not read: it goes negative with Pallas kernels and async
  collectives, and it does not model the interconnect. For Pallas kernels `flops` is the
  kernel's own CostEstimate (megablox: 2*m*k*n over the whole padded row buffer).
  cost_analysis counts a while loop's body once: `flops` and `bytes_accessed` add the other
  trips (`moegen.verify.hlo.loops`), and `loops` says how many loops were completed so.
- `memory`: `compiled.memory_analysis()` sizes per device, and `peak` =
  argument + output + temp - alias (what XLA must hold at once).
- `collectives`: every collective of the scheduled HLO and whether compute is scheduled while
  it is in flight (`moegen.verify.hlo.collectives`).
"""

from __future__ import annotations

from typing import Any

from moegen.verify.hlo.collectives import collective_counters
from moegen.verify.hlo.loops import loop_corrections

MEMORY_FIELDS = ("argument", "output", "temp", "alias", "generated_code")


def memory_counters(compiled: Any) -> dict[str, int]:
    """Per-device sizes from memory_analysis(), and the peak argument+output+temp-alias."""
    stats = compiled.memory_analysis()
    memory = {f: int(getattr(stats, f"{f}_size_in_bytes", 0) or 0) for f in MEMORY_FIELDS}
    memory["peak"] = memory["argument"] + memory["output"] + memory["temp"] - memory["alias"]
    return memory


def cost_counters(compiled: Any) -> dict[str, float]:
    """flops, bytes accessed and transcendentals from cost_analysis() (optimal_seconds: never)."""
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list | tuple):  # older JAX: one dict per program
        cost = cost[0] if cost else {}
    return {
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "transcendentals": float(cost.get("transcendentals", 0.0)),
    }


def compiled_counters(compiled: Any, *, items: bool = True) -> dict[str, Any]:
    """flops, bytes accessed, per-device memory and collectives of a compiled JAX program.

    `items=False` leaves out the per-collective list (the totals stay).
    """
    hlo = compiled.as_text()
    collectives = collective_counters(hlo)
    if not items:
        collectives.pop("items")
    cost = cost_counters(compiled)
    loops = loop_corrections(hlo)
    return {
        **cost,
        "flops": cost["flops"] + loops.flops,
        "bytes_accessed": cost["bytes_accessed"] + loops.bytes,
        "loops": {
            "completed": loops.loops,
            "unknown_trips": loops.unknown_trips,
            "flops_added": loops.flops,
            "bytes_added": loops.bytes,
        },
        "memory": memory_counters(compiled),
        "collectives": collectives,
    }
