"""The plan's memory ledger against the compiler's peak, for every committed TPU example.

    python -m bench.ledger [--specs NAME ...] [--write bench/stores/ledger_compiled.json]
                           [--dump DIR]
    python -m bench.ledger --population N --seed S   (bench.ledger_population)

Each spec is planned, rendered and compiled for its TPU slice (compile-only devices, libtpu)
by moegen's own verifier (`moegen.verify.verify`, twins off: one worker process per spec,
which compiles the forward and the forward+backward program); the compiled peaks
(memory_analysis: arguments + outputs + temporaries - aliased) are printed beside the plan's
`forward_peak` and `train_peak`, with the error. `--write` merges the compiled figures into
the JSON file (one entry per spec, and the versions: jax, libtpu, moegen commit), so that
specs can be measured one at a time; tests/fit/test_ledger.py checks the plan against it.
`--dump DIR` also has XLA dump each spec's compiled programs (buffer assignment and memory
usage report) into DIR/NAME.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.ledger_population import STORES, module_key
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify import verify
from moegen.verify.messages import Compiled

REPO_ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = REPO_ROOT / "specs"
DEFAULT_JSON = STORES / "ledger_compiled.json"
PROGRAMS = {"forward": "compile forward", "train": "compile forward+backward"}
GiB = 2**30


def tpu_specs(spec_dir: Path = SPEC_DIR) -> list[str]:
    """The committed examples with a TPU target, by name."""
    names = []
    for path in sorted(spec_dir.glob("*.yaml")):
        if load_valid(path).spec.target.hardware.startswith("tpu"):
            names.append(path.stem)
    return names


def versions() -> dict[str, str]:
    """What the compiled figures depend on: jax, libtpu, and the moegen commit measured
    ("-dirty": with uncommitted changes)."""
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=7"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "jax": importlib.metadata.version("jax"),
        "libtpu": importlib.metadata.version("libtpu"),
        "moegen_commit": commit or "unknown",
    }


def planned(name: str) -> dict[str, int]:
    """The plan's peaks of `name` (bytes) and its FFN slice count."""
    plan = make_plan(load_valid(SPEC_DIR / f"{name}.yaml"))
    return {
        "forward": plan.memory.forward_peak,
        "train": plan.memory.train_peak,
        "ffn_chunks": plan.ffn.chunks,
    }


def rendered_key(name: str) -> str:
    """The key (bench.ledger_population.module_key) of the module `name` renders now."""
    return module_key(render(make_plan(load_valid(SPEC_DIR / f"{name}.yaml"))))


def measure(name: str, dump: Path | None = None) -> dict[str, Any]:
    """Compile `name`'s main shape for its TPU slice: each program's memory_analysis sizes."""
    loaded = load_valid(SPEC_DIR / f"{name}.yaml")
    plan = make_plan(loaded)
    flags = os.environ.get("XLA_FLAGS", "")
    if dump is not None:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={dump / name}".strip()
    source = render(plan)
    start = time.perf_counter()
    try:
        report = verify(loaded, source, plan=plan, run_twins=False)
    finally:
        os.environ["XLA_FLAGS"] = flags
    steps = {step.step: step for step in report.steps if isinstance(step, Compiled)}
    memory = {key: steps[step].memory.to_json() for key, step in PROGRAMS.items()}
    return {
        "ffn_chunks": plan.ffn.chunks,
        # the module compiled, with the pinned compiler: the same key, the same figures
        "module": module_key(source),
        **memory,
        "moegen_commit": versions()["moegen_commit"],
        "seconds": round(time.perf_counter() - start, 1),
    }


def error(planned_bytes: int, compiled_bytes: int) -> float:
    """(planned - compiled) / compiled."""
    return (planned_bytes - compiled_bytes) / compiled_bytes


def row(name: str, compiled: dict[str, Any]) -> str:
    plan = planned(name)
    cells = [name, str(plan["ffn_chunks"])]
    for key in ("forward", "train"):
        got = compiled[key]["peak"]
        cells += [f"{plan[key] / GiB:.2f}", f"{got / GiB:.2f}", f"{error(plan[key], got):+.1%}"]
    return " | ".join(cells)


HEADER = (
    "spec | FFN slices | plan fwd GiB | compiled fwd GiB | error | plan fwd+bwd GiB | "
    "compiled fwd+bwd GiB | error"
)


def load_json(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    return {"versions": {}, "specs": {}}


def write_json(path: Path, data: dict[str, Any]) -> None:
    data["specs"] = dict(sorted(data["specs"].items()))
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__)
    parser.add_argument("--specs", nargs="*", help="spec names (default: every TPU example)")
    parser.add_argument("--write", type=Path, help="merge the figures into this JSON file")
    parser.add_argument("--dump", type=Path, help="XLA dump directory (one folder per spec)")
    parser.add_argument(
        "--from-json", type=Path, help="compile nothing: the plan against this file's figures"
    )
    parser.add_argument(
        "--population", type=int, help="a generated population of N specs (bench.population)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the population's seed (1: hold-out)")
    parser.add_argument(
        "--recorded-only", action="store_true", help="with --population: compile nothing new"
    )
    parser.add_argument(
        "--store",
        type=Path,
        help="with --population: the figures' JSON file (default"
        " bench/stores/ledger_population.json; another lets two seeds compile side by side,"
        " merged after with --merge)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="*",
        default=[],
        help="with --population: fold these stores into --store (or the default) first",
    )
    args = parser.parse_args(argv)
    if args.population:
        from bench.ledger_population import STORE, merge_stores, run

        store = args.store or STORE
        merge_stores(store, args.merge)
        status = run(args.population, args.seed, store, compile_missing=not args.recorded_only)
        from bench.assigned import print_assigned

        print_assigned(args.population, args.seed, store)
        return status
    names = args.specs or tpu_specs()
    print(HEADER, flush=True)
    if args.from_json:
        stored = load_json(args.from_json)["specs"]
        for name in names:
            print(row(name, stored[name]), flush=True)
        return 0
    data = load_json(args.write) if args.write else None
    for name in names:
        compiled = measure(name, args.dump)
        print(row(name, compiled) + f" | ({compiled['seconds']:.0f} s)", flush=True)
        if data is not None:
            data["versions"] = versions()
            data["specs"][name] = compiled
            write_json(args.write, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
