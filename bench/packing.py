"""XLA's packing of the temporaries, read from its own buffer assignment: the block a compile
places every temporary in, against the most bytes of them ever live at once.

    python -m bench.packing --seed S --specs NAME [...] [--record F.json] [--keep DIR]
    python -m bench.packing --seed S --dumps DIR [...]      # dumps already written, one a spec
    python -m bench.packing --summary bench/stores/packing_sample.json   # nothing compiled

The memory ledger (moegen/plan/memory.py) names the buffers live at a program's peak and
multiplies them by one packing fraction (TRAIN_PACKING, FORWARD_PACKING). This measures what
that fraction stands for, program by program: a compiled peak is arguments + outputs + one
preallocated block of temporaries, and XLA places each temporary at an offset in the block,
so the block can be larger than the temporaries live at any one moment. The live peak is
exact, not a model: the union of the offsets the block's values occupy at each instruction
of the schedule (`after_optimizations-live-range.txt`), the largest over the program.

Each population spec is compiled once (twins off, forward and forward+backward) with an XLA
dump in a temporary folder, which is read and deleted; `--keep DIR` keeps the dumps. Printed
per program: the block and the live peak (GiB), block / live, the plan's temporaries (its
planned peak less the compiled arguments and outputs, which are exact) against each, and the
ledger's error; then, per program kind, the packing's spread and how many programs a ledger
that knew the live peak exactly would have within 10% with the best single packing fraction.
A record names the module it was compiled from: `--summary` re-plans each spec, judges the
ledger as it plans now and leaves out a record whose module has changed.
bench/stores/packing_sample.json holds the first 30 specs of seeds 0 and 1 that compile (an
unbiased sample), bench/stores/packing_chosen.json seed 0 specs chosen for their misses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench.ledger_population import STORE, _load, compile_spec, module_key, planned
from bench.population import population
from moegen.verify.memory.assigned import MODULE_NAMES

GiB = 2**30
# the programs moegen's verifier compiles, keyed as the population store keys them
MODULES = {"forward": MODULE_NAMES["forward"], "train": MODULE_NAMES["forward+backward"]}
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+),.*preallocated-temp:$", re.M)
_VALUE = re.compile(r"^ value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\)", re.M)
_RANGE = re.compile(r"^\s+(\S+\{[^}]*\}):(\d+)-(\d+)$", re.M)


@dataclass(frozen=True)
class Temporaries:
    """One program's block of temporaries and the most bytes of it live at once."""

    block: int
    live_peak: int


def block_values(buffer_assignment: str) -> tuple[int, list[tuple[str, int, int]]]:
    """The largest preallocated-temp allocation, the block: its size and its values (name as
    the live ranges spell it, size, offset). The others are scoped scratch of a few KiB and
    another memory space's; memory_analysis's temp size is the block's to within 0.1%."""
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


@dataclass(frozen=True)
class Measured:
    """One compiled program: its block of temporaries and their live peak, its exact part
    (arguments and outputs) and the plan's peak, bytes."""

    spec: str
    program: str
    block: int
    live: int
    exact: int
    planned: int
    module: str = ""  # bench.ledger_population.module_key of the module compiled

    @property
    def peak(self) -> int:
        return self.exact + self.block

    def line(self) -> str:
        plan = self.planned - self.exact
        return (
            f"{self.spec} | {self.program} | block {self.block / GiB:.2f} | live "
            f"{self.live / GiB:.2f} | block / live {self.block / self.live:.2f} | plan / block "
            f"{plan / self.block:.2f} | plan / live {plan / self.live:.2f} | ledger "
            f"{self.planned / self.peak - 1:+.1%}"
        )


def measure_spec(name: str, text: str, folder: Path) -> list[Measured]:
    """Compile a population spec with a dump into `folder` and read each program's."""
    figures = dump_compile(name, text, folder)
    peaks, source = planned(name, text)
    key = module_key(source)
    measured = []
    for program, prefix in program_prefixes(folder).items():
        compiled = figures.get(program)
        if not compiled or "temp" not in compiled:
            continue
        temps = temporaries(prefix)
        exact = compiled["argument"] + compiled["output"] - compiled.get("alias", 0)
        row = Measured(name, program, compiled["temp"], temps.live_peak, exact, peaks[program], key)
        print(row.line(), flush=True)
        measured.append(row)
    return measured


def from_dump(name: str, text: str, folder: Path) -> list[Measured]:
    """Read a dump already written for the population spec `name`: its compiled sizes are
    the store's record of the module it renders (bench.ledger --population)."""
    peaks, source = planned(name, text)
    key = module_key(source)
    figures = _load(STORE)["modules"].get(key, {})
    measured = []
    for program, prefix in program_prefixes(folder).items():
        compiled = figures.get(program)
        if not compiled or "temp" not in compiled:
            print(f"{name} {program}: no record of its module in {STORE.name}", file=sys.stderr)
            continue
        try:
            temps = temporaries(prefix)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            print(f"{name} {program}: the dump cannot be read ({err})", file=sys.stderr)
            continue
        if abs(temps.block - compiled["temp"]) > compiled["temp"] // 1000:
            print(f"{name} {program}: the dump is not of the recorded module", file=sys.stderr)
            continue
        exact = compiled["argument"] + compiled["output"] - compiled.get("alias", 0)
        live = temps.live_peak
        measured.append(Measured(name, program, compiled["temp"], live, exact, peaks[program], key))
        print(measured[-1].line(), flush=True)
    return measured


def within(rows: list[Measured], packing: float, tolerance: float = 0.10) -> int:
    """Programs whose peak a ledger that knew the live peak exactly, times `packing`, would
    give within `tolerance`."""
    return sum(abs(r.exact + packing * r.live - r.peak) <= tolerance * r.peak for r in rows)


def summarise(rows: list[Measured]) -> None:
    """Per program: XLA's packing over the sample, and what the best single fraction would
    leave outside 10% with every live byte known, beside the ledger's own count."""
    for program in MODULES:
        mine = [r for r in rows if r.program == program]
        if not mine:
            continue
        ratios = sorted(r.block / r.live for r in mine)
        best = max((within(mine, c / 100), c / 100) for c in range(100, 201))
        ledger = sum(abs(r.planned / r.peak - 1) <= 0.10 for r in mine)
        print(
            f"{program}: {len(mine)} programs; block / live median "
            f"{statistics.median(ratios):.2f}, from {ratios[0]:.2f} to {ratios[-1]:.2f}; the live "
            f"peak known exactly x {best[1]:.2f} (the best one fraction): {best[0]} within 10% "
            f"of the compiled peak; the ledger: {ledger}"
        )


def record(path: Path, rows: list[Measured]) -> None:
    """Merge `rows` into the JSON file `path` (keyed by spec and program)."""
    known = {(r.spec, r.program): r for r in load_records(path)} if path.exists() else {}
    known |= {(r.spec, r.program): r for r in rows}
    path.write_text(json.dumps([asdict(r) for r in known.values()], indent=1) + "\n")


_SPEC_NAME = re.compile(r"s(\d{1,3})_(\d{3})_\w+")
_FIELDS = {"spec": str, "program": str, "block": int, "live": int, "exact": int}
_FIELDS |= {"planned": int, "module": str}


def load_records(path: Path) -> list[Measured]:
    """The records of `path`, each checked: a file that is not one is refused (ValueError),
    never half read."""
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable JSON file ({err})") from None
    if not isinstance(items, list):
        raise ValueError(f"{path}: not a list of bench.packing records")
    for number, item in enumerate(items):
        well_formed = isinstance(item, dict) and set(item) == set(_FIELDS)
        if not well_formed or not all(type(item[k]) is t for k, t in _FIELDS.items()):
            raise ValueError(f"{path}: record {number} is not a bench.packing record")
        sized = item["block"] > 0 and item["live"] > 0 and item["exact"] >= 0
        if not (sized and item["program"] in MODULES and _SPEC_NAME.fullmatch(item["spec"])):
            raise ValueError(f"{path}: record {number} names no population program")
    return [Measured(**item) for item in items]


def current(rows: list[Measured]) -> list[Measured]:
    """The recorded rows whose spec renders the module they were compiled from, with the
    plan's peak as it plans now (the ledger may have changed since); the others, stale, are
    named on stderr and left out."""
    fresh = []
    for row in rows:
        seed, index = (int(part) for part in _SPEC_NAME.fullmatch(row.spec).groups())
        name, text = population(index + 1, seed)[-1]
        peaks, source = planned(name, text)
        if name != row.spec or module_key(source) != row.module:
            print(f"{row.spec} {row.program}: stale (its module has changed)", file=sys.stderr)
            continue
        fresh.append(replace(row, planned=peaks[row.program]))
    return fresh


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.packing", description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the population's seed")
    parser.add_argument("--count", type=int, default=60, help="the population's size")
    parser.add_argument("--specs", nargs="*", default=[], help="population spec names")
    parser.add_argument("--dumps", nargs="*", type=Path, default=[], help="dump folders to read")
    parser.add_argument("--keep", type=Path, help="keep the dumps here (one folder per spec)")
    parser.add_argument("--record", type=Path, help="merge the figures into this JSON file")
    parser.add_argument("--summary", nargs="*", type=Path, default=[], help="recorded files")
    args = parser.parse_args(argv)
    texts = dict(population(args.count, args.seed))
    try:
        rows = current([row for path in args.summary for row in load_records(path)])
        if args.record and args.record.exists():
            load_records(args.record)  # merged into later: refused now, not half way
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    for row in rows:
        print(row.line())
    for folder in args.dumps:
        if folder.name not in texts:
            print(f"{folder}: not a spec of population seed {args.seed}", file=sys.stderr)
            return 2
        measured = from_dump(folder.name, texts[folder.name], folder)
        if args.record:
            record(args.record, measured)
        rows += measured
    for name in args.specs:
        if name not in texts:
            print(f"{name}: not in population seed {args.seed} of {args.count}", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="moegen-packing-") as tmp:
            folder = args.keep / name if args.keep else Path(tmp)
            measured = measure_spec(name, texts[name], folder)
        if args.record:
            record(args.record, measured)
        rows += measured
    summarise(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
