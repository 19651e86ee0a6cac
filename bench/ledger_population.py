"""The plan's memory ledger on a generated population (bench.population), not the examples.

    python -m bench.ledger --population N --seed S [--store bench/stores/ledger_population.json]
    python -m bench.ledger --population N --seed S --merge A.json B.json   # fold in, then run

Two seeds compile side by side (one a core) into stores of their own (`--store`), folded
into the committed one after with `--merge`.

Each spec of the population is planned, rendered and compiled for its TPU slice by moegen's
own verifier (twins off), forward and forward+backward. A compiled figure is recorded in the
store under the SHA-256 of the rendered module's code (`program_text`: all but its header and
docstring) and the versions that shape a compile (jax, jaxlib, libtpu), so a rerun compiles
only what changed; a program the compiler refuses for HBM is recorded with the compiler's
first line. Printed: one row per spec, then for each program the distribution of the error
(planned / compiled - 1) over the specs that compiled: median, 95th percentile and worst of
|error|, the worst specs named.

Seed 0 is the population the ledger may be fitted on; seed 1 is the hold-out, on which no
constant of moegen/plan/memory.py was fitted.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.population import population
from moegen.load import load_spec_bytes
from moegen.plan import Plan, make_plan
from moegen.render import render
from moegen.validate import validate
from moegen.verify import VerifyError, verify
from moegen.verify.messages import Compiled, CompilerOutOfMemory, Step

# The recorded figures live apart from the code that records them (issue 53): every bench
# module names its store through this one folder.
STORES = Path(__file__).resolve().parent / "stores"
STORE = STORES / "ledger_population.json"
PROGRAMS = {"forward": "compile forward", "train": "compile forward+backward"}
GiB = 2**30
HOLD_OUT_SEEDS = (1,)
# One spec's two compiles: a few minutes at most on 2 cores; s0_026 once ran 68 minutes and
# reported nothing. A spec past this is recorded as an error, not compiled again.
COMPILE_TIMEOUT_S = 1200


def compile_versions() -> dict[str, str]:
    return {d: importlib.metadata.version(d) for d in ("jax", "jaxlib", "libtpu")}


def program_text(source: str) -> str:
    """What of a module the compiler sees: its text from the first statement after the
    module's docstring (the header comments and the docstring left out). A header or docstring
    that says more compiles the same program, so it keeps its records; a change to the code
    is a new key. Cut by line, not by a dump of the syntax tree, whose form moves between
    Python releases."""
    try:
        body = ast.parse(source).body
    except SyntaxError:  # not a module (a stand-in's text): keyed whole
        return source
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if not body:
        return ""
    first = min([body[0].lineno, *(d.lineno for d in getattr(body[0], "decorator_list", []))])
    return "".join(source.splitlines(keepends=True)[first - 1 :])


def module_key(source: str) -> str:
    versions = json.dumps(compile_versions(), sort_keys=True)
    return hashlib.sha256((versions + "\0" + program_text(source)).encode()).hexdigest()


def compile_spec(name: str, text: str) -> dict[str, Any]:
    """Each program's compiled sizes, or {"oom": the compiler's line}."""
    loaded = validate(load_spec_bytes(text.encode(), f"{name}.yaml", name))
    plan = make_plan(loaded)
    steps: list[Step] = []
    start = time.perf_counter()
    figures: dict[str, Any] = {}
    try:
        verify(
            loaded,
            render(plan),
            plan=plan,
            run_twins=False,
            on_step=steps.append,
            timeout_s=COMPILE_TIMEOUT_S,
        )
    except VerifyError as err:  # out of HBM (the compiler's figure is in its step), or worse
        figures["error"] = str(err).strip().splitlines()[-1][:300]
    for key, step_name in PROGRAMS.items():
        step = next((s for s in steps if s.step == step_name), None)
        if isinstance(step, Compiled):
            figures[key] = step.memory.to_json()
        elif isinstance(step, CompilerOutOfMemory):
            figures[key] = {"oom": step.oom, "memory_space": step.memory_space}
    if not any(key in figures for key in PROGRAMS):
        figures.setdefault("error", "the verifier reported no compiled program")
    figures["seconds"] = round(time.perf_counter() - start, 1)
    return figures


def plan_of(name: str, text: str) -> Plan:
    """The plan of the population spec `name` (YAML `text`)."""
    return make_plan(validate(load_spec_bytes(text.encode(), f"{name}.yaml", name)))


def planned(name: str, text: str) -> tuple[dict[str, int], str]:
    plan = plan_of(name, text)
    peaks = {"forward": plan.memory.forward_peak, "train": plan.memory.train_peak}
    return peaks, render(plan)


def _load(store: Path) -> dict[str, Any]:
    if store.exists():
        return json.loads(store.read_text(encoding="utf-8"))
    return {"modules": {}}


def _save(store: Path, data: dict[str, Any]) -> None:
    data["modules"] = dict(sorted(data["modules"].items()))
    store.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def merge_stores(store: Path, others: list[Path]) -> None:
    """Fold the records of `others` (stores of runs side by side) into `store`: a module's
    record in `store` is kept where both have one."""
    if not others:
        return
    data = _load(store)
    for other in others:
        for key, figures in _load(other)["modules"].items():
            data["modules"].setdefault(key, figures)
    _save(store, data)


def recorded(
    data: dict[str, Any],
    store: Path,
    name: str,
    text: str,
    source: str,
    compile_missing: bool = True,
) -> dict[str, Any] | None:
    """The figures `data` holds for the module `source` (rendered from the spec `text`):
    compiled now and saved to `store` where it holds none, or None if not `compile_missing`."""
    key = module_key(source)
    known = data["modules"].get(key, {})
    if not any(k in known for k in (*PROGRAMS, "error")):
        if not compile_missing:
            return None
        data["modules"][key] = {"spec": name, **compile_spec(name, text)}
        _save(store, data)
    return data["modules"][key]


Errors = dict[str, list[tuple[float, str]]]  # program -> (planned / compiled - 1, spec)


def run(count: int, seed: int, store: Path = STORE, compile_missing: bool = True) -> int:
    hold_out = " (hold-out: no ledger constant was fitted on it)" if seed in HOLD_OUT_SEEDS else ""
    print(f"population seed {seed}, {count} specs{hold_out}", flush=True)
    print("spec | target | mesh | plan fwd / fwd+bwd GiB | compiled | error", flush=True)
    errors, out_of_memory = ledger_errors(count, seed, store, compile_missing, echo=print)
    _distribution(errors, out_of_memory)
    return 0


def ledger_errors(
    count: int,
    seed: int,
    store: Path = STORE,
    compile_missing: bool = False,
    echo: Callable[..., None] = lambda *args, **kwargs: None,
) -> tuple[Errors, list[str]]:
    """The plan's error on each compiled program of the population, and the specs the
    compiler found out of memory; each spec's row to `echo`."""
    data = _load(store)
    errors: Errors = {key: [] for key in PROGRAMS}
    out_of_memory = []
    for name, text in population(count, seed):
        peaks, source = planned(name, text)
        figures = recorded(data, store, name, text, source, compile_missing)
        if figures is None:
            echo(f"{name} | not compiled yet", flush=True)
            continue
        row = _row(name, text, peaks, figures, errors)
        if "oom" in json.dumps(figures):
            out_of_memory.append(name)
        echo(row, flush=True)
    return errors, out_of_memory


def _row(name, text, peaks, figures, errors) -> str:
    tree = _tree(text)
    target = f"{tree['target']['hardware']} {tree['target']['topology']} {tree['target']['kernel']}"
    mesh = "x".join(f"{a}{n}" for a, n in tree["mesh"]["axes"].items())
    cells = [name, target, f"{mesh} {tree['parallelism']['experts']}"]
    cells.append(f"{peaks['forward'] / GiB:.2f} / {peaks['train'] / GiB:.2f}")
    compiled, errs = [], []
    for key in PROGRAMS:
        got = figures.get(key)
        if got is None or "oom" in got:
            compiled.append("OOM" if got else "-")
            continue
        err = peaks[key] / got["peak"] - 1
        errors[key].append((err, name))
        compiled.append(f"{got['peak'] / GiB:.2f}")
        errs.append(f"{err:+.1%}")
    return " | ".join([*cells, " / ".join(compiled), " / ".join(errs)])


def _tree(text: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(text)


def distribution_line(key: str, found: list[tuple[float, str]]) -> str:
    """One program's errors: how many, the median, 95th percentile and worst of |error|
    (the worst three named), and how many are outside 10%."""
    sizes = sorted(abs(e) for e, _ in found)
    p95 = sizes[min(len(sizes) - 1, round(0.95 * (len(sizes) - 1)))]
    worst = sorted(found, key=lambda item: -abs(item[0]))[:3]
    outside = sum(1 for e in sizes if e > 0.10)
    return (
        f"{key}: {len(found)} programs, |error| median {statistics.median(sizes):.1%}, "
        f"p95 {p95:.1%}, worst "
        + ", ".join(f"{e:+.1%} ({n})" for e, n in worst)
        + f"; {outside} outside 10%"
    )


def _distribution(errors: dict[str, list[tuple[float, str]]], oom: list[str]) -> None:
    for key, found in errors.items():
        if found:
            print(distribution_line(key, found), flush=True)
    if oom:
        print(f"compiler out of memory: {len(oom)} specs: {', '.join(oom)}", flush=True)
