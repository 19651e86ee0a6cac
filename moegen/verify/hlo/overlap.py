"""Ring overlap in a compiled TPU module: which collective-permutes a grouped matmul hides.

An overlapping strategy (parallelism.overlap_chunks > 1) claims that while the gate and up
grouped matmuls run on the block one device holds, the next block is in flight: in the
scheduled ENTRY computation a collective-permute-start, then megablox kernel(s), then its
done. A start and its done are matched by the done's operand, not by position (transfers
overlap each other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moegen.verify.hlo.parse import Instruction, entry_instructions

_GROUPED_MATMUL = re.compile(r"gmm")


def is_grouped_matmul(instruction: Instruction) -> bool:
    """A megablox gmm/tgmm Pallas kernel: a tpu_custom_call named after gmm."""
    return (
        instruction.opcode == "custom-call"
        and instruction.custom_call_target == "tpu_custom_call"
        and _GROUPED_MATMUL.search(instruction.text) is not None
    )


@dataclass(frozen=True)
class PermuteWindow:
    start: str
    done: str
    grouped_matmuls: tuple[str, ...]  # scheduled strictly between start and done


def permute_windows(hlo_text: str, *, strict: bool = True) -> list[PermuteWindow]:
    """Every collective-permute-done of ENTRY with what runs while its transfer is in flight.

    A done that waits on anything but a permute start raises ValueError (`strict`: the tests,
    where it would mean the parser misread the schedule) or is skipped (the verify worker,
    where a verdict on the overlap must not stop a build).
    """
    instructions = entry_instructions(hlo_text)
    position = {instruction.name: i for i, instruction in enumerate(instructions)}
    windows = []
    for i, instruction in enumerate(instructions):
        if instruction.opcode != "collective-permute-done":
            continue
        start_name = instruction.operands[0] if instruction.operands else ""
        j = position.get(start_name)
        if j is None or instructions[j].opcode != "collective-permute-start":
            if strict:
                raise ValueError(f"{instruction.name} waits on {start_name}, not a permute start")
            continue
        between = tuple(x.name for x in instructions[j + 1 : i] if is_grouped_matmul(x))
        windows.append(PermuteWindow(start_name, instruction.name, between))
    return windows


def overlapped(hlo_text: str) -> list[PermuteWindow]:
    """The windows with at least one grouped matmul under the transfer."""
    return [w for w in permute_windows(hlo_text) if w.grouped_matmuls]


def hidden_transfers(hlo_text: str) -> tuple[int, int]:
    """(collective-permutes with a grouped matmul between start and done, all of them)."""
    windows = permute_windows(hlo_text, strict=False)
    return sum(1 for w in windows if w.grouped_matmuls), len(windows)
