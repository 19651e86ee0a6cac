"""Redundant-expert placement from a measured load (issue 30, its first part): read a load
file, give the heaviest experts extra slots, put the slots on devices, and say what each
device's rows become.

The load is `aux.tokens_per_expert` summed over training steps (`accumulate_load` inside a
jitted step, `save_load` to write it). `place` chooses:

1. replicas: every expert keeps one slot; each extra slot goes, one at a time, to the expert
   whose copies per replica are highest now (ties: the lower index). This is the greedy
   apportionment that minimises the largest per-replica load for a given number of slots:
   each step lowers the current maximum, and no other assignment of the same slots has a
   lower one. An expert never gets more replicas than there are devices (two on one device
   would split nothing).
2. devices: the replicas, heaviest first, each to the device with the least load so far
   among those with a free slot and without a replica of the same expert (ties: the lower
   device). Longest-processing-time-first: within 4/3 of the best possible busiest device.

A replica takes an equal share of its expert's copies (the static split the layer will
use), so a device's expected rows are the sum over its slots of load / replicas.
Everything read from disk is untrusted input: a bad load file is a `LoadError` naming the
file and what is wrong, never a traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOAD_FORMAT = "moegen-load-1"
MAX_LOAD_BYTES = 16 << 20  # a load file is a few numbers per expert


class LoadError(ValueError):
    """A load file that cannot be used, with the reason."""


@dataclass(frozen=True)
class Placement:
    """Which experts each device's slots hold, and how many replicas each expert has."""

    slots: tuple[tuple[int, ...], ...]  # per device: its experts, in slot order
    replicas: tuple[int, ...]  # per expert: its slots over all devices

    def rows(self, load: Sequence[float]) -> list[float]:
        """Each device's expected rows: its slots' shares of their experts' copies."""
        return [sum(load[e] / self.replicas[e] for e in device) for device in self.slots]

    def as_json(self) -> dict[str, Any]:
        return {"format": "moegen-placement-1", "slots": [list(s) for s in self.slots]}


def contiguous(experts: int, devices: int) -> Placement:
    """The layout without extra slots: device d holds experts d*E/D .. (d+1)*E/D - 1."""
    _check_split(experts, devices)
    per = experts // devices
    return Placement(
        tuple(tuple(range(d * per, (d + 1) * per)) for d in range(devices)), (1,) * experts
    )


def place(load: Sequence[float], devices: int, extra_per_device: int) -> Placement:
    """`extra_per_device` more slots on each of `devices` devices, placed for `load`."""
    _check_split(len(load), devices)
    if extra_per_device < 0:
        raise ValueError(f"extra slots per device must be >= 0, got {extra_per_device}")
    replicas = _replicas(load, devices, devices * extra_per_device)
    return Placement(_assign(load, replicas, devices), tuple(replicas))


def _check_split(experts: int, devices: int) -> None:
    if devices < 1 or experts % devices:
        raise ValueError(f"{experts} experts do not split over {devices} devices")


def _replicas(load: Sequence[float], devices: int, extra: int) -> list[int]:
    """One slot per expert, then each extra slot to the heaviest expert per replica."""
    replicas = [1] * len(load)
    if extra > len(load) * (devices - 1):
        raise ValueError(
            f"{extra} extra slots: more than one replica of every expert on every device"
        )
    for _ in range(extra):
        open_experts = [e for e in range(len(load)) if replicas[e] < devices]
        heaviest = max(open_experts, key=lambda e: (load[e] / replicas[e], -e))
        replicas[heaviest] += 1
    return replicas


def _assign(
    load: Sequence[float], replicas: list[int], devices: int
) -> tuple[tuple[int, ...], ...]:
    """Replicas heaviest first, each to the least-loaded device that can take it."""
    per_device = sum(replicas) // devices
    pieces = sorted(
        ((load[e] / replicas[e], e) for e in range(len(load)) for _ in range(replicas[e])),
        key=lambda piece: (-piece[0], piece[1]),
    )
    slots: list[list[int]] = [[] for _ in range(devices)]
    rows = [0.0] * devices
    for share, expert in pieces:
        free = [d for d in range(devices) if len(slots[d]) < per_device]
        apart = [d for d in free if expert not in slots[d]] or free
        device = min(apart, key=lambda d: (rows[d], d))
        slots[device].append(expert)
        rows[device] += share
    return tuple(tuple(sorted(s)) for s in slots)


def read_load(path: Path, experts: int) -> list[float]:
    """The per-expert copies of a load file written by `save_load` (or by hand: a JSON object
    with "tokens_per_expert", one non-negative number per expert)."""
    try:  # a bounded read: a device file or a growing file must not be read to its end
        with path.open("rb") as stream:
            raw = stream.read(MAX_LOAD_BYTES + 1)
    except OSError as error:
        raise LoadError(f"{path}: cannot be read: {error.strerror or error}") from None
    if len(raw) > MAX_LOAD_BYTES:
        raise LoadError(f"{path}: over {MAX_LOAD_BYTES} bytes; a load file is at most that")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise LoadError(f"{path}: not JSON: {str(error)[:200]}") from None
    counts = data.get("tokens_per_expert") if isinstance(data, dict) else None
    if not isinstance(counts, list):
        raise LoadError(f'{path}: expected a JSON object with a "tokens_per_expert" list')
    if len(counts) != experts:
        raise LoadError(f"{path}: {len(counts)} counts for a layer of {experts} experts")
    for index, value in enumerate(counts):
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise LoadError(f"{path}: tokens_per_expert[{index}] = {value!r:.40}: not a count")
    if not sum(counts) > 0:
        raise LoadError(f"{path}: every count is 0: no load to place for")
    return [float(v) for v in counts]


def save_load(path: Path, tokens_per_expert: Any, steps: int) -> None:
    """Write the summed `aux.tokens_per_expert` of `steps` steps as a load file."""
    counts = [float(v) for v in list(tokens_per_expert)]
    record = {"format": LOAD_FORMAT, "steps": int(steps), "tokens_per_expert": counts}
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")


def accumulate_load(total: Any, tokens_per_expert: Any) -> Any:
    """total + this step's counts, in float32 (jit-friendly: an int32 sum of a long run
    would overflow; float32 keeps the shares the placement uses to ~1e-7 per step)."""
    import jax.numpy as jnp

    return total + tokens_per_expert.astype(jnp.float32)
