"""Benchmark: how long moegen takes to refuse a spec its plan says cannot fit the target's HBM.

    python -m bench.refuse_fast [--fit-check plan|assigned|compile] [SPEC ...]

Default: every spec of tests/unfit_specs/. For each, the wall time of `moegen validate`,
`moegen plan` and `moegen build` as a user runs them (a fresh `python -m moegen`, interpreter
start and imports included), with their exit codes, and the time of the refusal itself in
this process (`moegen.pipeline.load_fitting`: load, validate, plan, and the plans that find
what would fit); then the worst of each column. `build` runs only on a spec the other two
refused (on one that fits it would verify, for minutes). Issue 20 asks for a refusal in under 2 s.
With `--fit-check V`, each spec is run with `memory.fit_check: V` written in (a copy in a
scratch folder): `plan` refuses by the plan's ledger alone; `assigned` (the default) reads
XLA's buffer assignment, seconds, before a refusal the ledger does not prove.
This is a benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from moegen.diagnostics import SpecError
from moegen.pipeline import load_fitting

CORPUS = Path("tests/unfit_specs")
COMMANDS = ("validate", "plan", "build")


def cli_seconds(command: str, spec: Path, out_dir: Path) -> tuple[float, int]:
    """Wall time and exit code of one `python -m moegen COMMAND SPEC`."""
    extra = ["--out", str(out_dir)] if command == "build" else []
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "moegen", command, str(spec), *extra],
        capture_output=True,
        check=False,
    )
    return time.perf_counter() - start, done.returncode


def in_process_seconds(spec: Path) -> tuple[float, str]:
    """Time of `load_fitting` (imports already paid) and its outcome."""
    start = time.perf_counter()
    try:
        load_fitting(spec)
        outcome = "fits"
    except SpecError as err:
        outcome = f"refused at {err.diagnostics[0].field}"
    return time.perf_counter() - start, outcome


def with_fit_check(spec: Path, value: str | None, folder: Path) -> Path:
    """`spec`, or a copy of it in `folder` with memory.fit_check: `value`."""
    if value is None:
        return spec
    tree = yaml.safe_load(spec.read_text(encoding="utf-8"))
    tree.setdefault("memory", {})["fit_check"] = value
    copy = folder / spec.name
    copy.write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return copy


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.refuse_fast", description=__doc__)
    parser.add_argument("--fit-check", choices=("plan", "assigned", "compile"))
    parser.add_argument("specs", nargs="*", type=Path)
    args = parser.parse_args(argv)
    specs = args.specs or sorted(CORPUS.glob("*.yaml"))
    header = "".join(f"{c:>15}" for c in COMMANDS)
    print(f"{'spec':<36}{header}{'in-process':>12}  outcome")
    worst = dict.fromkeys((*COMMANDS, "in-process"), 0.0)
    with tempfile.TemporaryDirectory(prefix="refuse-fast-") as tmp:
        for original in specs:
            spec = with_fit_check(original, args.fit_check, Path(tmp))
            row = ""
            refused = True
            for command in COMMANDS:
                if command == "build" and not refused:
                    row += f"{'-':>15}"  # it would verify, minutes: not a refusal's time
                    continue
                seconds, code = cli_seconds(command, spec, Path(tmp) / "generated")
                refused = refused and code == 3
                worst[command] = max(worst[command], seconds)
                row += f"{seconds:>9.2f} s ({code})"
            seconds, outcome = in_process_seconds(spec)
            worst["in-process"] = max(worst["in-process"], seconds)
            print(f"{spec.stem:<36}{row}{seconds:>10.3f} s  {outcome}")
    print(f"{'worst':<36}" + "".join(f"{worst[c]:>9.2f} s    " for c in COMMANDS), end="")
    print(f"{worst['in-process']:>10.3f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
