"""XLA's packing of the temporaries, read from its own buffer assignment: the block a compile
places every temporary in, against the most bytes of them ever live at once.

    python -m bench.packing --seed S --specs NAME [NAME ...]   # population specs, compiled
    python -m bench.packing --dumps DIR [DIR ...]              # XLA dumps already written

The memory ledger (moegen/plan/memory.py) names the buffers live at a program's peak and
multiplies them by one packing fraction (TRAIN_PACKING, FORWARD_PACKING). This measures what
that fraction stands for, program by program: a compiled peak is arguments + outputs + one
preallocated block of temporaries, and XLA places each temporary at an offset in the block,
so the block can be larger than the temporaries live at any one moment. The live peak is
exact, not a model: the union of the offsets the block's values occupy at each instruction
of the schedule (`after_optimizations-live-range.txt`), the largest over the program.

Each population spec is compiled once (twins off, forward and forward+backward) with an XLA
dump in a temporary folder, which is read and deleted; `--keep DIR` keeps the dumps. Printed
per program: the block and the live peak (GiB), block / live, and the plan's temporaries
(its planned peak less the compiled arguments and outputs, which are exact) against each.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.ledger_population import compile_spec, planned
from bench.population import population

GiB = 2**30
# the programs moegen's verifier compiles, by the name XLA gives their modules
MODULES = {"forward": "jit_moe_layer", "train": "jit_loss"}
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+),.*preallocated-temp:$", re.M)
_VALUE = re.compile(r"^ value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\)", re.M)
_RANGE = re.compile(r"^\s+(\S+\{[^}]*\}):(\d+)-(\d+)$", re.M)


@dataclass(frozen=True)
class Temporaries:
    """One program's block of temporaries and the most bytes of it live at once."""

    block: int
    live_peak: int


def block_values(buffer_assignment: str) -> tuple[int, list[tuple[str, int, int]]]:
    """The largest preallocated-temp allocation: its size and its values (name as the live
    ranges spell it, size, offset)."""
    starts = list(_ALLOCATION.finditer(buffer_assignment))
    if not starts:
        raise ValueError("no preallocated-temp allocation in the buffer assignment")
    largest = max(starts, key=lambda m: int(m.group(1)))
    end = buffer_assignment.find("\nallocation ", largest.end())
    body = buffer_assignment[largest.end() : end if end >= 0 else None]
    values = []
    for name, size, offset in _VALUE.findall(body):
        values.append((name if "{" in name else name + "{}", int(size), int(offset)))
    return int(largest.group(1)), values


def live_ranges(live_range: str) -> dict[str, tuple[int, int]]:
    """Each value's first and last instruction in the schedule."""
    return {name: (int(a), int(b)) for name, a, b in _RANGE.findall(live_range)}


def live_peak(values: list[tuple[str, int, int]], ranges: dict[str, tuple[int, int]]) -> int:
    """The most bytes of the block occupied at one instruction: values that share offsets
    (a loop's carried buffer, an operand written over) count once."""
    spans = [
        (*ranges[name], offset, offset + size)
        for name, size, offset in values
        if name in ranges and size
    ]
    peak = 0
    for moment in sorted({span[0] for span in spans}):
        occupied = sorted((lo, hi) for start, end, lo, hi in spans if start <= moment <= end)
        total, reached = 0, 0
        for lo, hi in occupied:
            total += max(0, hi - max(lo, reached))
            reached = max(reached, hi)
        peak = max(peak, total)
    return peak


def temporaries(prefix: Path) -> Temporaries:
    """Read one program's dump: `prefix` + the after_optimizations files' suffixes."""
    assignment = Path(f"{prefix}after_optimizations-buffer-assignment.txt").read_text()
    ranges = live_ranges(Path(f"{prefix}after_optimizations-live-range.txt").read_text())
    block, values = block_values(assignment)
    return Temporaries(block, live_peak(values, ranges))


def program_prefixes(folder: Path) -> dict[str, Path]:
    """The dump file prefix of each program moegen compiled into `folder`."""
    found = {}
    for program, module in MODULES.items():
        files = sorted(folder.glob(f"module_*.{module}.*after_optimizations-live-range.txt"))
        if files:
            found[program] = Path(str(files[-1]).removesuffix("after_optimizations-live-range.txt"))
    return found


def dump_compile(name: str, text: str, folder: Path) -> dict:
    """Compile a population spec as bench.ledger does, with an XLA dump into `folder`."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={folder}".strip()
    try:
        return compile_spec(name, text)
    finally:
        os.environ["XLA_FLAGS"] = flags


def spec_rows(name: str, text: str, folder: Path) -> list[tuple[str, str, float, float, float]]:
    """(spec, program, block / live, plan / block, plan / live) of each program, printed."""
    figures = dump_compile(name, text, folder)
    peaks, _ = planned(name, text)
    rows = []
    for program, prefix in program_prefixes(folder).items():
        compiled = figures.get(program)
        if not compiled or "temp" not in compiled:
            continue
        temps = temporaries(prefix)
        plan = peaks[program] - compiled["argument"] - compiled["output"]
        row = (name, program, temps.block / temps.live_peak, plan / temps.block)
        rows.append((*row, plan / temps.live_peak))
        print(
            f"{name} | {program} | block {temps.block / GiB:.2f} | live {temps.live_peak / GiB:.2f}"
            f" | block / live {row[2]:.2f} | plan / block {row[3]:.2f}"
            f" | plan / live {rows[-1][4]:.2f}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.packing", description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the population's seed")
    parser.add_argument("--count", type=int, default=60, help="the population's size")
    parser.add_argument("--specs", nargs="*", default=[], help="population spec names")
    parser.add_argument("--dumps", nargs="*", type=Path, default=[], help="dump folders to read")
    parser.add_argument("--keep", type=Path, help="keep the dumps here (one folder per spec)")
    args = parser.parse_args(argv)
    for folder in args.dumps:
        for program, prefix in program_prefixes(folder).items():
            temps = temporaries(prefix)
            ratio = temps.block / temps.live_peak
            sizes = f"block {temps.block / GiB:.2f} | live {temps.live_peak / GiB:.2f}"
            print(f"{folder.name} | {program} | {sizes} | block / live {ratio:.2f}")
    texts = dict(population(args.count, args.seed))
    rows = []
    for name in args.specs:
        if name not in texts:
            print(f"{name}: not in population seed {args.seed} of {args.count}", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="moegen-packing-") as tmp:
            folder = args.keep / name if args.keep else Path(tmp)
            rows += spec_rows(name, texts[name], folder)
    for program in MODULES:
        ratios = [row[2] for row in rows if row[1] == program]
        if ratios:
            spread = f"from {min(ratios):.2f} to {max(ratios):.2f}"
            median = statistics.median(ratios)
            print(f"{program}: block / live over {len(ratios)} programs: {median:.2f}, {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
