"""XLA's buffer assignment read before code generation (moegen.verify.memory.assigned) against the
finished compile, on the generated populations: the same figure, in how many seconds.

    python -m bench.assigned --population 60 --seed S [--specs NAME ...] [--record]

For every population spec whose compiled figures are recorded (bench.ledger --population:
bench/stores/ledger_population.json, under the key of the module the plan renders now), the
assigned peak of each program (forward, forward+backward) is read and set beside the
recorded compiled peak; a program the compiler found out of HBM should be refused the same
way. Printed per spec: the assigned peaks, their difference from the compiled ones, and the
seconds both took (the two programs' workers run side by side; the recorded compile ran
them one after the other, code generation included); then the distribution. With
`--record`, each spec's assigned figures are kept in bench/stores/assigned_population.json
(keyed as the compiled records are), which `python -m bench.ledger --population` reads to
print the assigned figure's distribution beside the ledger's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.ledger_population import STORE, STORES, Errors, _load, _save, module_key, plan_of
from bench.population import population
from moegen.render import render
from moegen.verify import VerifyError
from moegen.verify.memory.assigned import assigned_memory

GiB = 2**30
PROGRAMS = {"forward": "forward", "forward+backward": "train"}
ASSIGNED_STORE = STORES / "assigned_population.json"


def compare(name: str, text: str, store: Path = STORE) -> dict | None:
    """The assigned figures of one spec beside its compiled record; None without one."""
    plan = plan_of(name, text)
    source = render(plan)
    record = _load(store)["modules"].get(module_key(source))
    if record is None:
        return None
    start = time.perf_counter()
    try:
        assigned = assigned_memory(plan, source)
    except VerifyError as err:
        return {"record": record, "refused": str(err), "seconds": time.perf_counter() - start}
    return {"record": record, "assigned": assigned, "seconds": time.perf_counter() - start}


def row(name: str, result: dict) -> tuple[str, list[float]]:
    """The printed row and the relative differences of its compiled programs."""
    record, cells, differences = result["record"], [name], []
    if "refused" in result:
        recorded = [k for k, v in record.items() if isinstance(v, dict) and "oom" in v]
        reason = result["refused"].splitlines()[0][:90]
        cells.append(f"refused ({reason}); compiler out of memory on: {recorded or 'none'}")
    for program, key in PROGRAMS.items() if "assigned" in result else ():
        got, compiled = result["assigned"][program].peak, record.get(key, {})
        if "peak" not in compiled:
            cells.append(f"{program}: {got / GiB:.2f} GiB, compiled: {compiled or '-'}")
            continue
        differences.append(got / compiled["peak"] - 1)
        cells.append(f"{program}: {got / GiB:.2f} GiB ({differences[-1]:+.4%})")
    cells.append(f"{result['seconds']:.1f} s (the compile: {record.get('seconds', '?')} s)")
    return " | ".join(cells), differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.assigned", description=__doc__)
    parser.add_argument("--population", type=int, default=60, help="the population's size")
    parser.add_argument("--seed", type=int, default=0, help="the population's seed")
    parser.add_argument("--specs", nargs="*", default=[], help="only these population specs")
    parser.add_argument(
        "--record", action="store_true", help=f"keep the figures in {ASSIGNED_STORE.name}"
    )
    args = parser.parse_args(argv)
    differences, seconds, compiles = [], [], []
    for name, text in population(args.population, args.seed):
        if args.specs and name not in args.specs:
            continue
        result = compare(name, text)
        if result is None:
            print(f"{name} | no compiled record of the module it renders", flush=True)
            continue
        line, diffs = row(name, result)
        print(line, flush=True)
        if args.record:
            record_assigned(ASSIGNED_STORE, name, text, result)
        differences += diffs
        seconds.append(result["seconds"])
        if isinstance(result["record"].get("seconds"), (int, float)):
            compiles.append(result["record"]["seconds"])
    if differences:
        worst = max(abs(d) for d in differences)
        print(f"{len(differences)} programs: assigned / compiled - 1 at most {worst:.4%}")
    if seconds:
        print(
            f"seconds a spec: median {statistics.median(seconds):.1f}, worst {max(seconds):.1f}"
            f" (the compiles: median {statistics.median(compiles):.0f}, worst {max(compiles):.0f})"
        )
    return 0


def record_assigned(store: Path, name: str, text: str, result: dict) -> None:
    """Keep one spec's assigned peaks (or the compiler's refusal) under its module's key."""
    data = _load(store)
    entry: dict = {"spec": name, "seconds": round(result["seconds"], 1)}
    if "refused" in result:  # the compiler's HBM refusal, or a worker that failed
        reason = result["refused"].splitlines()[0]
        entry["refused" if "out of HBM" in reason else "failed"] = reason
    else:
        entry |= {key: result["assigned"][program].peak for program, key in PROGRAMS.items()}
    data["modules"][module_key(render(plan_of(name, text)))] = entry
    _save(store, data)


def assigned_errors(
    count: int, seed: int, compiled: Path = STORE, assigned: Path = ASSIGNED_STORE
) -> tuple[Errors, list[str], list[str]]:
    """Each recorded assigned peak against the recorded compiled one (assigned / compiled - 1)
    for the specs of the population that have both; the specs with none recorded; the specs
    refused while assigning, each marked with whether the full compile refused it too."""
    compiled_data, assigned_data = _records(compiled), _records(assigned)
    errors: Errors = {key: [] for key in PROGRAMS.values()}
    missing, refused = [], []
    for name, text in population(count, seed):
        key = module_key(render(plan_of(name, text)))
        got, record = assigned_data.get(key), compiled_data.get(key)
        if got is None or record is None:
            missing.append(name)
            continue
        if "refused" in got:
            too = any(isinstance(v, dict) and "oom" in v for v in record.values())
            refused.append(f"{name} ({'the compile too' if too else 'NOT the compile'})")
        if "failed" in got:
            missing.append(f"{name} (the read failed: {got['failed'][:80]})")
        for program in errors:
            compiled_program = record.get(program)
            peak = got.get(program)
            compiled_peak = (
                compiled_program.get("peak") if isinstance(compiled_program, dict) else None
            )
            if isinstance(peak, int) and isinstance(compiled_peak, int) and compiled_peak > 0:
                errors[program].append((peak / compiled_peak - 1, name))
    return errors, missing, refused


def _records(store: Path) -> dict[str, dict]:
    """A store's records by module key; a file that is not one is refused, named (records
    read back from disk are untrusted: an entry that is not a mapping is left out)."""
    try:
        data = _load(store)
        modules = data["modules"]
        if not isinstance(modules, dict):
            raise TypeError("modules is not a mapping")
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise SystemExit(f"{store}: not a store of figures ({err})") from None
    return {key: entry for key, entry in modules.items() if isinstance(entry, dict)}


def print_assigned(count: int, seed: int, compiled: Path = STORE) -> None:
    """The assigned figure's distribution, as `bench.ledger --population` prints it."""
    errors, missing, refused = assigned_errors(count, seed, compiled)
    print("XLA's buffer assignment read before code generation (moegen plan --assigned; the")
    print("figure the build chooses a TPU layer's open trades by, and reads before refusing),")
    print("against the same compiles; recorded by bench.assigned --record:")
    for program, found in errors.items():
        if not found:
            continue
        sizes = sorted(abs(e) for e, _ in found)
        worst_error, worst_spec = max(found, key=lambda item: abs(item[0]))
        outside = sum(1 for e in sizes if e > 0.10)
        print(
            f"{program}: {len(found)} programs, |error| median {statistics.median(sizes):.4%}, "
            f"worst {worst_error:+.4%} ({worst_spec}); {outside} outside 10%"
        )
    if refused:
        print(f"refused for HBM while assigning: {len(refused)} specs: {', '.join(refused)}")
    if missing:
        print(f"no assigned or compiled record: {len(missing)} specs: {', '.join(missing)}")


if __name__ == "__main__":
    sys.exit(main())
