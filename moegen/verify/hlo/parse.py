"""The one reader of HLO text in moegen: instructions, computations, shapes.

`parse_hlo(text)` splits a module's text (`compiled.as_text()`, scheduled or not) into its
computations, each a list of `Instruction`s in text order, which in a scheduled module is the
order they run in. Everything that reads compiled HLO goes through here: the collective
analysis (`collectives`), the loop trips (`loops`), the ring overlap (`overlap`) and the
tests, so that a change in how XLA prints a line is fixed once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Custom calls that allocate, annotate or move memory rather than compute.
NON_COMPUTE_CUSTOM_CALLS = frozenset(
    {
        "AllocateBuffer",
        "Sharding",
        "SPMDFullToShardShape",
        "SPMDShardToFullShape",
        "MoveToHost",
        "MoveToDevice",
        "annotate_device_placement",
        "LayoutConstraint",
        "AsyncCollectiveStart",
        "AsyncCollectiveDone",
    }
)

DTYPE_BYTES = {
    "pred": 1.0,
    "s2": 0.25,
    "u2": 0.25,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1.0,
    "u8": 1.0,
    "s16": 2.0,
    "u16": 2.0,
    "f16": 2.0,
    "bf16": 2.0,
    "s32": 4.0,
    "u32": 4.0,
    "f32": 4.0,
    "s64": 8.0,
    "u64": 8.0,
    "f64": 8.0,
    "c64": 8.0,
    "c128": 16.0,
}
_ARRAY = re.compile(r"\b(pred|bf16|c64|c128|f8\w*|f4\w*|[suf]\d+)\[([\d,]*)\]")
_NAME = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\(")
_COMMENT = re.compile(r"/\*.*?\*/")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_SCHEDULED_CALLS = re.compile(r"\b(body|condition|to_apply)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_FUSION_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")


@dataclass(frozen=True)
class Instruction:
    name: str  # without the leading %
    opcode: str
    operands: tuple[str, ...]  # instruction names, without %
    shape: str  # the result shape as written (a tuple in parentheses, or one array)
    text: str  # the whole line

    @property
    def custom_call_target(self) -> str | None:
        found = _TARGET.search(self.text)
        return found.group(1) if found else None

    def called(self) -> tuple[str, ...]:
        """Computations this instruction calls through `calls=` (fusions, async wrappers)."""
        return tuple(_FUSION_CALLS.findall(self.text))

    def scheduled_calls(self) -> tuple[str, ...]:
        """Computations run in sequence by this instruction: loops, conditionals, calls."""
        if self.opcode not in ("while", "conditional", "call"):
            return ()
        names = [name for _, name in _SCHEDULED_CALLS.findall(self.text)]
        for group in _BRANCHES.findall(self.text):
            names += [n.strip().lstrip("%") for n in group.split(",") if n.strip()]
        return tuple(names)


@dataclass
class HloModuleText:
    computations: dict[str, list[Instruction]] = field(default_factory=dict)
    entry: str | None = None


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
        end = _closing(line, pos)
    else:
        end = line.find(" ", pos)
        if end < 0:
            return None
    shape = line[pos:end]
    op = _OPCODE.match(line, end)
    if op is None:
        return None
    open_paren = op.end() - 1
    inner = _COMMENT.sub("", line[open_paren + 1 : _closing(line, open_paren) - 1])
    operands = tuple(re.findall(r"%([\w.\-]+)", inner))
    return Instruction(head.group(1), op.group(1), operands, shape, line)


def parse_hlo(hlo_text: str) -> HloModuleText:
    """Every computation of an HLO module's text, instructions in text (schedule) order."""
    module = HloModuleText()
    current: list[Instruction] | None = None
    for line in hlo_text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header:
                name = header.group(2)
                current = module.computations.setdefault(name, [])
                if header.group(1):
                    module.entry = name
            continue
        if line.startswith("}"):
            current = None
            continue
        instruction = parse_instruction(line)
        if instruction is not None:
            current.append(instruction)
    return module


def shape_bytes(shape: str) -> int:
    """Bytes of every array in a shape string (tuples summed); layouts are ignored."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += count * DTYPE_BYTES.get(dtype, 1.0 if dtype.startswith(("f8", "f4")) else 4.0)
    return int(total)


def is_kernel(instruction: Instruction) -> bool:
    """A custom call that computes (a Pallas/Mosaic kernel, a library GEMM, ...)."""
    return (
        instruction.opcode == "custom-call"
        and instruction.custom_call_target not in NON_COMPUTE_CUSTOM_CALLS
    )


def entry_instructions(hlo_text: str) -> list[Instruction]:
    """The ENTRY computation's instructions in text order (the schedule, when is_scheduled)."""
    module = parse_hlo(hlo_text)
    if module.entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return module.computations[module.entry]
