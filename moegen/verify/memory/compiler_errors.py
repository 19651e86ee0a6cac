"""What a compiler's out-of-memory error says: which memory ran out, and in which call.

The TPU compiler refuses a program it proves cannot fit with RESOURCE_EXHAUSTED, and names
the memory (libtpu's error codes): E1000 `CompileTimeHbmOom`, the program's buffers exceed the
chip's HBM, which the spec can change (shard more, shorten the batch, slice the FFN); E1001
`CompileTimeScopedVmemOom`, one kernel's working set exceeds the scoped VMEM it may use,
which only the kernel's tiles change: the tiles are the plan's choice (or pinned, after the
plan's VMEM check), so that one is a defect of the plan, and must never read as an HBM verdict.
Pure text work: the worker classifies the error where it is raised, the parent classifies
reports written before that, and tests need no compile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# HBM first: an HBM report may list the scoped memory beside the temporaries
_HBM = re.compile(r"CompileTimeHbmOom|memory space hbm", re.IGNORECASE)
_VMEM = re.compile(r"ScopedVmemOom|scoped vmem|memory space vmem", re.IGNORECASE)
# megablox's kernels, as Mosaic names them: gmm (forward and input gradient), tgmm (weights)
_KERNEL = re.compile(r"(?<![A-Za-z0-9])(tgmm|gmm)(?![A-Za-z])")
KERNEL_ROLES = {
    "gmm": "gmm, a forward or input-gradient grouped matmul",
    "tgmm": "tgmm, a weight-gradient grouped matmul",
}


@dataclass(frozen=True)
class OutOfMemory:
    memory_space: str  # "hbm" | "vmem"
    first_line: str  # what is shown of the compiler's message
    call: str | None = None  # "gmm" | "tgmm" when the message names one


def out_of_memory(message: str) -> OutOfMemory | None:
    """The out-of-memory verdict in a compiler error; None when the error is another one."""
    text = message.strip()
    if "RESOURCE_EXHAUSTED" not in text:
        return None
    first_line = text.splitlines()[0]
    if _HBM.search(text) or not _VMEM.search(text):
        # CompileTimeHbmOom, and any other exhaustion, as reported before VMEM was told apart
        return OutOfMemory("hbm", first_line)
    kernel = _KERNEL.search(text)
    return OutOfMemory("vmem", first_line, kernel.group(1) if kernel else None)


# A fatal log line of the compiler (glog/absl): `F1206 06:35:50.340279 3892 file.cc:2636] text`
_FATAL = re.compile(r"^F\d{4} [\d:.]+\s+\d+ ([\w./-]+:\d+)\] (.+)$", re.M)
CRASH_LINE_CHARS = 240


def compiler_crash(stderr: str) -> str | None:
    """Where and why a compiler stopped the process on a failed internal check (a fatal log
    line, then SIGABRT), in one line; None when the output holds no such line."""
    found = _FATAL.search(stderr)
    if found is None:
        return None
    where, what = found.group(1).rsplit("/", 1)[-1], found.group(2).strip()
    if len(what) > CRASH_LINE_CHARS:
        what = what[: CRASH_LINE_CHARS - 3].rstrip() + "..."
    return f"{what} ({where})"


def crash_words(stderr: str, returncode: int | None, context: str = "") -> str | None:
    """What to tell the user of a process a compiler stopped on a failed internal check (its
    stack dump is no use to them), `context` saying when; None when `stderr` holds no such
    stop."""
    crash = compiler_crash(stderr)
    if crash is None:
        return None
    signal = f" (signal {-returncode})" if returncode is not None and returncode < 0 else ""
    return (
        f"the XLA compiler crashed{signal}{context}: it stopped on a failed internal check: "
        f"{crash}. That is a defect of the compiler (jaxlib, libtpu or the CUDA toolchain "
        "as pinned), not a mistake in the spec; another memory trade (memory.token_chunks, "
        "memory.ffn_chunks) or kernel compiles another program."
    )
