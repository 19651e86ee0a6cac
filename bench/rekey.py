"""Re-key the bench's stores when a module's key changes (a one-off tool, two uses).

The stores in bench/stores/ (ledger_population.json, holdout_assigned.json,
assigned_population.json, ledger_compiled.json, packing_*.json) keep each compiled or
assigned figure under a module key: the SHA-256 of the module's code less its header and docstring
(bench.ledger_population.program_text) and the pinned versions. Each use writes pairs (old
key, new key) for every module the bench's readers ask for, which `apply` maps in the stores:

    # the key's definition changed (until a373b72 it hashed the whole source): in a checkout
    # of the tree the stores were recorded with, this file run from the new tree
    PYTHONPATH=/path/to/old-tree python /path/to/new-tree/bench/rekey.py collect pairs.json

    # the templates changed code the compiler never sees (make_mesh's message): each tree
    # renders its own module of the same plan. 1. in the old tree, each plan's key; 2. in the
    # new tree, the readers answered under the old key of the same plan (so they find the old
    # records and ask what they asked there), each paired with this tree's key
    PYTHONPATH=/path/to/old-tree python /path/to/new-tree/bench/rekey.py plans plans.json READS
    python -m bench.rekey plan-pairs plans.json pairs.json READS

    # then, in the new tree: the stores' keys (and packing rows' module fields) mapped
    python -m bench.rekey apply pairs.json bench/stores/ledger_population.json ...

A plan is named by the SHA-256 of its fields (Plan.to_dict as JSON): the same in both trees
while the change is the templates' alone. READS is a folder for XLA's buffer-assignment reads
that the readers make past the stores (moegen.own_trade, moegen.verify.refusal_read): kept
there by plan, not by module text, so the second tree reads none again. Nothing is
compiled: a reader that would have to (a record missing) is stopped and named, and that
record is left for the recorder. Keys no reader asks for stay as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _new_program_text() -> Any:
    """This tree's bench.ledger_population.program_text, loaded from the file beside this one:
    `collect` runs with an old tree first on the path, whose module has none."""
    path = Path(__file__).resolve().parent / "ledger_population.py"
    spec = importlib.util.spec_from_file_location("new_ledger_population", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.program_text


def collect(out: Path) -> int:
    import bench.ledger_population as lp

    legacy, pairs, program_text = lp.module_key, {}, _new_program_text()

    def logged(source: str) -> str:
        versions = json.dumps(lp.compile_versions(), sort_keys=True)
        key = legacy(source)
        pairs[key] = hashlib.sha256((versions + "\0" + program_text(source)).encode()).hexdigest()
        return key

    _run_readers(logged)
    out.write_text(json.dumps(pairs, indent=1) + "\n", encoding="utf-8")
    print(f"{len(pairs)} keys mapped -> {out}")
    return 0


def _refuse(*_: Any, **__: Any) -> Any:
    raise RuntimeError("a record is missing: left for the recorder")


def _run_readers(key_of: Callable[[str], str]) -> None:
    """Every reader of the stores, with `key_of` for bench.ledger_population.module_key and
    nothing compiled or read into a store: a reader that would is stopped and named."""
    import bench.ledger_population as lp

    lp.module_key, lp.compile_spec = key_of, _refuse
    import bench.assigned as assigned
    import bench.holdout as holdout
    import bench.ledger as ledger

    holdout.assigned_memory = _refuse  # no buffer assignment read into its store either
    for name, step in _readers(lp, assigned, holdout, ledger):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                step()
        except Exception as err:  # noqa: BLE001  # a reader stopped: the rest still count
            print(f"{name}: stopped ({err})", file=sys.stderr)


def _readers(lp: Any, assigned: Any, holdout: Any, ledger: Any) -> list[tuple[str, Any]]:
    import bench.defaults_fit as defaults_fit
    import bench.extrapolate as extrapolate

    # bench.extrapolate reads the specs it was asked for: those whose shorter layers are stored
    labels = {entry.get("spec", "") for entry in lp._load(lp.STORE)["modules"].values()}
    steps = []
    for seed in (0, 1):
        steps.append((f"ledger seed {seed}", lambda s=seed: lp.ledger_errors(60, s)))
        steps.append((f"assigned seed {seed}", lambda s=seed: assigned.print_assigned(60, s)))
        args = ["--population", "60", "--seed", str(seed), "--recorded-only", "--tuned"]
        steps.append((f"defaults seed {seed}", lambda a=args: defaults_fit.main(a)))
        for name in sorted(n for n in labels if n.startswith(f"s{seed}_") and n.endswith("_seq2")):
            args = ["--seed", str(seed), "--specs", name.removesuffix("_seq2")]
            steps.append((f"extrapolate {args[-1]}", lambda a=args: extrapolate.main(a)))
    for seed in (2, 3, 4):
        args = ["--population", "60", "--seed", str(seed), "--take-fitting-trade"]
        steps.append((f"hold-out seed {seed}", lambda a=args: holdout.main(a)))
    steps.append(("examples", lambda: [ledger.rendered_key(n) for n in ledger.tpu_specs()]))
    return steps


def collect_plans(out: Path, reads: Path) -> int:
    """{plan: this tree's key} of every module the readers ask for (the tree the stores
    were recorded with: its lookups find their records)."""
    keys = _keys_by_plan(reads, answers={})
    out.write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(keys)} plans keyed -> {out}")
    return 0


def plan_pairs(plans_path: Path, out: Path, reads: Path) -> int:
    """{old key: this tree's key} of every plan the readers ask for in both trees."""
    old = json.loads(plans_path.read_text(encoding="utf-8"))
    new = _keys_by_plan(reads, answers=old)
    pairs: dict[str, str] = {}
    clashes = 0  # two plans of one old module, two modules here: no one key to map it to
    for plan in old.keys() & new.keys():
        clashes += pairs.setdefault(old[plan], new[plan]) != new[plan]
    print(
        f"{len(pairs)} keys mapped -> {out}; plans asked for only in the old tree: "
        f"{len(old.keys() - new.keys())}, only here: {len(new.keys() - old.keys())}"
    )
    if clashes:
        print(f"{clashes} old keys name two modules here: nothing written", file=sys.stderr)
        return 1
    out.write_text(json.dumps(pairs, indent=1) + "\n", encoding="utf-8")
    return 0


def _keys_by_plan(reads: Path, answers: dict[str, str]) -> dict[str, str]:
    """This tree's key of each module the readers ask for, by the plan that renders it; a
    lookup answered under answers[plan] where it names one (the old tree's key), so that the
    readers find the old records and take the paths they took there."""
    os.environ["MOEGEN_CACHE_DIR"] = str(reads.resolve())
    plan_of = _plan_of_sources()  # before bench is imported: its modules import render by name
    import bench.ledger_population as lp

    xla = _xla_reads()
    own_key, read_key, keys = lp.module_key, xla.read_key, {}

    def key_of(source: str) -> str:
        plan = plan_of[_digest(source)]  # a module no plan rendered: its reader is stopped
        keys[plan] = own_key(source)
        return answers.get(plan, keys[plan])

    def read_key_by_plan(source: str, *shape: Any) -> str:
        """XLA's read of a module kept under its plan: the same read in either tree."""
        plan = plan_of.get(_digest(source))
        return read_key(source if plan is None else f"plan {plan}", *shape)

    xla.read_key = read_key_by_plan
    _run_readers(key_of)
    return keys


def _xla_reads() -> Any:
    """moegen's module of XLA's buffer-assignment reads, in either tree: it moved to
    moegen.verify.memory when the verifier was split by role."""
    try:
        return importlib.import_module("moegen.verify.memory.assigned")
    except ModuleNotFoundError as err:
        if err.name not in ("moegen.verify.memory", "moegen.verify.memory.assigned"):
            raise
        return importlib.import_module("moegen.verify.assigned")


def _plan_of_sources() -> dict[str, str]:
    """moegen.render.render made to remember the plan of each module it renders:
    {SHA-256 of the source: SHA-256 of the plan's fields}."""
    import moegen.render

    plain, plans = moegen.render.render, {}

    def render(plan: Any) -> str:
        source = plain(plan)
        plans[_digest(source)] = _digest(json.dumps(plan.to_dict(), sort_keys=True))
        return source

    moegen.render.render = render
    return plans


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def apply(pairs_path: Path, stores: list[Path]) -> int:
    pairs = json.loads(pairs_path.read_text(encoding="utf-8"))
    if not isinstance(pairs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in pairs.items()
    ):
        print(f"{pairs_path}: not a mapping of keys", file=sys.stderr)
        return 2

    def new_key(key: str) -> str:
        base, sep, variant = key.partition(":")  # bench.holdout's variant suffix
        return pairs.get(base, base) + sep + variant

    for store in stores:
        data = json.loads(store.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("modules"), dict):
            data["modules"] = {new_key(k): v for k, v in data["modules"].items()}
        _map_module_fields(data, new_key)
        store.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"{store}: re-keyed")
    return 0


def _map_module_fields(node: Any, new_key: Any) -> None:
    """Packing rows and the examples' figures name their module in a `module` field."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "module" and isinstance(value, str):
                node[key] = new_key(value)
            elif key != "modules":
                _map_module_fields(value, new_key)
    elif isinstance(node, list):
        for value in node:
            _map_module_fields(value, new_key)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "collect":
        return collect(Path(argv[1]))
    if len(argv) == 3 and argv[0] == "plans":
        return collect_plans(Path(argv[1]), Path(argv[2]))
    if len(argv) == 4 and argv[0] == "plan-pairs":
        return plan_pairs(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    if len(argv) >= 3 and argv[0] == "apply":
        return apply(Path(argv[1]), [Path(a) for a in argv[2:]])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
