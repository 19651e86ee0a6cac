"""A small parser of scheduled TPU HLO: ENTRY instructions, grouped-matmul custom calls, and collective-permute windows with what runs under them."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Instruction:
    name: str  # without the leading %
    opcode: str
    operands: tuple[str, ...]  # instruction names, without %
    text: str  # the whole line


_NAME = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\(")
_COMMENT = re.compile(r"/\*.*?\*/")


def _closing(text: str, start: int) -> int:
    """Index just past the bracket group opened at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced brackets in HLO line: {text[:200]}")


def parse_instruction(line: str) -> Instruction | None:
    """`[ROOT] %name = SHAPE opcode(%a, %b), attributes`; None for anything else."""
    head = _NAME.match(line)
    if head is None:
        return None
    pos = head.end()
    if pos >= len(line):
        return None
    if line[pos] == "(":  # tuple shape
        pos = _closing(line, pos)
    else:
        space = line.find(" ", pos)
        if space < 0:
            return None
        pos = space
    op = _OPCODE.match(line, pos)
    if op is None:
        return None
    open_paren = op.end() - 1
    inner = _COMMENT.sub("", line[open_paren + 1 : _closing(line, open_paren) - 1])
    operands = tuple(re.findall(r"%([\w.\-]+)", inner))
    return Instruction(head.group(1), op.group(1), operands, line)


def entry_instructions(hlo_text: str) -> list[Instruction]:
    """The ENTRY computation's instructions in text order (the schedule, when is_scheduled)."""
    lines = hlo_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("ENTRY ")), None)
    if start is None:
        raise ValueError("no ENTRY computation in the HLO text")
    instructions = []
    for line in lines[start + 1 :]:
        if line.startswith("}"):
            break
        instruction = parse_instruction(line)
        if instruction is not None:
            instructions.append(instruction)
    return instructions


def is_grouped_matmul(instruction: Instruction) -> bool:
    """A megablox gmm/tgmm Pallas kernel: a tpu_custom_call named after gmm."""
    return (
        instruction.opcode == "custom-call"
        and 'custom_call_target="tpu_custom_call"' in instruction.text
        and re.search(r"gmm", instruction.text) is not None
    )


@dataclass(frozen=True)
class PermuteWindow:
    start: str
    done: str
    grouped_matmuls: tuple[str, ...]  # scheduled strictly between start and done


def permute_windows(hlo_text: str) -> list[PermuteWindow]:
    """Every collective-permute-done of ENTRY with what runs while its transfer is in flight."""
    instructions = entry_instructions(hlo_text)
    position = {instruction.name: i for i, instruction in enumerate(instructions)}
    windows = []
    for i, instruction in enumerate(instructions):
        if instruction.opcode != "collective-permute-done":
            continue
        start_name = instruction.operands[0]
        j = position[start_name]
        if instructions[j].opcode != "collective-permute-start":
            raise ValueError(f"{instruction.name} waits on {start_name}, not a permute start")
        between = tuple(x.name for x in instructions[j + 1 : i] if is_grouped_matmul(x))
        windows.append(PermuteWindow(start_name, instruction.name, between))
    return windows


def overlapped(hlo_text: str) -> list[PermuteWindow]:
    """The windows with at least one grouped matmul under the transfer."""
    return [w for w in permute_windows(hlo_text) if w.grouped_matmuls]
