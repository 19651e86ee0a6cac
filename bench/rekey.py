"""Re-key the bench's stores when the record key's definition changes (a one-off tool).

The stores (ledger_population.json, holdout_assigned.json, assigned_population.json,
ledger_compiled.json, packing_*.json) keep each compiled or assigned figure under a module
key. Until a373b72 the key hashed the module's whole source; now it hashes its code less the
header and docstring (bench.ledger_population.program_text), so that a docstring that says
more keeps its records. A store recorded under the old key is mapped by rendering, in the tree
it was recorded with, every module the bench's readers ask for:

    # 1. in a checkout of the tree the stores were recorded with (old keys), this file run
    #    from the new tree: each key the readers ask for, beside its new key
    PYTHONPATH=/path/to/old-tree python /path/to/new-tree/bench/rekey.py collect pairs.json
    # 2. in the new tree: the stores' keys (and packing rows' module fields) mapped
    python -m bench.rekey apply pairs.json bench/ledger_population.json ...

`collect` compiles nothing: a reader that would have to (a record missing) is stopped and
named, and that record is left for the recorder. Keys no reader asks for stay as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import sys
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

    def refuse(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a record is missing: left for the recorder")

    lp.module_key, lp.compile_spec = logged, refuse
    import bench.assigned as assigned
    import bench.holdout as holdout
    import bench.ledger as ledger

    holdout.assigned_memory = refuse  # no buffer assignment read either
    for name, step in _readers(lp, assigned, holdout, ledger):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                step()
        except Exception as err:  # noqa: BLE001  # a reader stopped: the rest still count
            print(f"{name}: stopped ({err})", file=sys.stderr)
    out.write_text(json.dumps(pairs, indent=1) + "\n", encoding="utf-8")
    print(f"{len(pairs)} keys mapped -> {out}")
    return 0


def _readers(lp: Any, assigned: Any, holdout: Any, ledger: Any) -> list[tuple[str, Any]]:
    import bench.defaults_fit as defaults_fit

    steps = []
    for seed in (0, 1):
        steps.append((f"ledger seed {seed}", lambda s=seed: lp.ledger_errors(60, s)))
        steps.append((f"assigned seed {seed}", lambda s=seed: assigned.print_assigned(60, s)))
        args = ["--population", "60", "--seed", str(seed), "--recorded-only"]
        steps.append((f"defaults seed {seed}", lambda a=args: defaults_fit.main(a)))
    for seed in (2, 3, 4):
        args = ["--population", "60", "--seed", str(seed), "--take-fitting-trade"]
        steps.append((f"hold-out seed {seed}", lambda a=args: holdout.main(a)))
    steps.append(("examples", lambda: [ledger.rendered_key(n) for n in ledger.tpu_specs()]))
    return steps


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
    if len(argv) >= 2 and argv[0] == "collect":
        return collect(Path(argv[1]))
    if len(argv) >= 3 and argv[0] == "apply":
        return apply(Path(argv[1]), [Path(a) for a in argv[2:]])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
