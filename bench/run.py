"""Benchmark: generated layers against two plain-JAX baselines, and the tool's own speed.

    python -m bench.run [--specs NAME ...] [--out bench/RESULTS.md] [--repeats 5]

For each example spec (by name, from specs/):

1. TPU counters: forward+backward (gradients of sum(y) with respect to the parameters and x)
   of the generated module and of both baselines (bench/baselines.py) is compiled for the
   spec's slice on compile-only devices (libtpu, no TPU), each compile in a fresh process.
   Counters come from `moegen.verify.worker.compiled.compiled_counters`: compiled flops and bytes
   accessed, per-device peak memory, collectives with or without compute scheduled inside.
   Useful FLOPs are the plan's `cost.train_flops` (per device).
2. CPU wall time of the twins: the spec's shrunken twin (its own dtypes, the same mesh on
   fake CPU devices; Pallas kernels in interpret mode) and both baselines at the twin's shapes,
   forward+backward, median of `--repeats` runs after a warm-up, in one process per spec.
3. The tool's own speed: `moegen check` over all specs, `moegen build --no-verify` per spec,
   and `moegen build` (verification included) for the cpu specs.

Everything lands in one markdown file (--out) with the command, the date and the versions.
This module runs it: bench.measure measures (its child processes: bench.children),
bench.report writes the markdown.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.measure import REPO_ROOT, bench_spec, tool_speed
from bench.report import format_report, losses

DEFAULT_OUT = REPO_ROOT / "bench" / "RESULTS.md"
DEFAULT_SPECS = (
    "mixtral_8x7b_v5e",
    "mixtral_8x7b_ep_a2a_v5e",
    "qwen3_30b_a3b_v6e",
    "qwen3_30b_a3b_ring_v6e",
    "llama4_scout_v5e",
    "gpt_oss_120b_v6e",
)


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("moegen", "jax", "jaxlib", "libtpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        versions["commit"] = commit + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        pass
    return versions


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS), metavar="NAME")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-tool-speed", action="store_true", help="skip the tool's own speed")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    python = Path(sys.executable)
    if python.is_relative_to(REPO_ROOT):
        python = python.relative_to(REPO_ROOT)
    else:
        python = Path("python")
    command = f"{python} -m bench.run" + "".join(f" {shlex.quote(a)}" for a in argv)
    results: dict[str, Any] = {
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": _versions(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "specs": [],
    }
    with tempfile.TemporaryDirectory(prefix="moegen-bench-") as tmp:
        for name in args.specs:
            results["specs"].append(bench_spec(name, Path(tmp), args.repeats, log))
    if not args.no_tool_speed:
        results["tool"] = tool_speed(log)
    results["total_seconds"] = time.perf_counter() - started
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    args.out.write_text(format_report(results), encoding="utf-8")
    log(f"wrote {args.out}")
    for line in [line for spec in results["specs"] for line in losses(spec)]:
        print(f"moegen loses: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
