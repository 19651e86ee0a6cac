"""Benchmark: how long `moegen build` takes again, once a spec's verification is recorded.

    python -m bench.rebuild [SPEC] [--with-reverify]

SPEC (default specs/mixtral_8x7b_v5e.yaml, a TPU example) is copied into a temporary
directory with a fresh moegen cache (MOEGEN_CACHE_DIR) and output directory, then built by
`python -m moegen build`, each build one process, timed wall-clock from start to exit:

1. cold: empty cache, the whole verification (twins, compiles);
2. unchanged: the same spec again (the verification record is reused);
3. description edited: only `description:` changed (the record is reused too);
4. with --with-reverify: `--reverify`, a full verification again with JAX's compilation cache
   warm (it serves the CPU twins; compile-only TPU executables cannot be read back from it).

Every build must succeed and write the same module as the one before (but for its
description). This is a benchmark, not a test: the figures are printed, not judged.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_SPEC = Path("specs/mixtral_8x7b_v5e.yaml")


def timed_build(spec: Path, out: Path, cache: Path, *extra: str) -> tuple[float, str]:
    """Seconds of one `moegen build`, and the verification line that says why (if any)."""
    env = dict(os.environ, MOEGEN_CACHE_DIR=str(cache))
    command = [sys.executable, "-m", "moegen", "build", "--out", str(out), *extra, str(spec)]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"build failed (exit {done.returncode}):\n{done.stderr}")
    reused = [
        line.split("(", 1)[1].rstrip(")") for line in done.stderr.splitlines() if "reused" in line
    ]
    slowest = _slowest_step(done.stderr)
    return seconds, reused[0] if reused else f"verified; slowest step {slowest}"


def _slowest_step(stderr: str) -> str:
    steps = re.findall(r"^  verify: (.+?)\s+(\d+\.\d\d) s", stderr, re.MULTILINE)
    if not steps:
        return "none"
    name, seconds = max(steps, key=lambda step: float(step[1]))
    return f"{name.strip()} {float(seconds):.1f} s"


def edit_description(spec: Path) -> None:
    text = spec.read_text(encoding="utf-8")
    edited = re.sub(r"(?m)^description: .*$", "description: Edited for bench.rebuild.", text)
    if edited == text:
        sys.exit(f"{spec} has no one-line description to edit")
    spec.write_text(edited, encoding="utf-8")


def module_without_description(path: Path) -> str:
    from moegen.verify.records.record import verified_text

    return verified_text(path.read_text(encoding="utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", nargs="?", type=Path, default=DEFAULT_SPEC)
    parser.add_argument("--with-reverify", action="store_true", help="Also time --reverify.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="moegen-bench-rebuild-") as tmp:
        root = Path(tmp)
        spec, out, cache = root / "specs" / args.spec.name, root / "out", root / "cache"
        spec.parent.mkdir()
        shutil.copyfile(args.spec, spec)
        module = out / f"{spec.stem}.py"
        print(f"{args.spec}: built in {root} with a fresh cache, each build one process")
        runs = [("cold (empty cache)", ()), ("rebuild, unchanged", ())]
        runs.append(("rebuild, description edited", ("EDIT",)))
        if args.with_reverify:
            runs.append(("rebuild --reverify (compilation cache warm)", ("--reverify",)))
        previous = None
        for label, extra in runs:
            if extra == ("EDIT",):
                edit_description(spec)
                extra = ()
            seconds, why = timed_build(spec, out, cache, *extra)
            print(f"  {label:<45} {seconds:8.2f} s  {why}", flush=True)
            now = module_without_description(module)
            if previous is not None and now != previous:
                sys.exit("the rebuilt module differs from the one before")
            previous = now


if __name__ == "__main__":
    main()
