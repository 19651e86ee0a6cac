"""How far a correct low-precision twin lies from the float32 dense reference, over a
population of specs: the figures behind TOLERANCES["bfloat16"] and the 1% set aside
(moegen.verify.twin, moegen.verify.reference.parity.set_aside_share).

    python -m bench.twin_tolerance --population 40 --seed 0
    python -m bench.twin_tolerance --population 40 --seed 1 --activation relu --weighting input
    python -m bench.twin_tolerance --population 40 --seed 2 --learned-scale

The specs are bench.population's (real model layers on TPU slices, bfloat16 compute), each
run as verification runs its spec-dtype twin: shrunken, on fake CPU devices, random and
starved routings, the module's forward, aux and gradients against the dense reference.
`--activation`/`--weighting` rewrite every spec (ReLU with input weighting is where rounding
flips the most ReLU terms); `--kernel xla` (the default) runs the twins on XLA's grouped
matmul rather than interpreted Pallas, which is slower and rounds alike. Per case it prints
the worst relative error of any output or gradient, whole and with the largest 1% of each
tensor's element differences set aside, and then their distributions (median, 95th
percentile, worst, and the count at or over the tolerance).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml


def _rewritten(text: str, args: argparse.Namespace) -> str:
    tree = yaml.safe_load(text)
    if args.activation:
        tree["layer"]["activation"] = args.activation
        tree["layer"].pop("glu", None)
    if args.weighting:
        tree["router"]["weighting"] = args.weighting
    if args.learned_scale:
        tree["router"]["learned_scale"] = True
    if args.kernel:
        tree["target"]["kernel"] = args.kernel
        tree["target"].pop("tiles", None)
    return yaml.safe_dump(tree, sort_keys=False)


def _twin_module(loaded: Any, directory: Path) -> tuple[Any, Any]:
    """The spec-dtype twin's module, imported, and its reference config."""
    from moegen.plan import make_plan
    from moegen.render import render
    from moegen.verify import reference_config
    from moegen.verify.reference.layer import ReferenceConfig
    from moegen.verify.twin import plan_twin, twin_of
    from moegen.verify.worker.child import import_module

    full = make_plan(loaded)
    plan = plan_twin(twin_of(loaded, full, dtype=None), full)
    path = directory / f"{plan.module_name}_twin.py"
    path.write_text(render(plan), encoding="utf-8")
    module = import_module(str(path), f"tolerance_{plan.module_name}")
    return module, ReferenceConfig(**reference_config(plan))


def _case_errors(programs: Any, case: tuple) -> tuple[float, float, float]:
    """(whole, 1% set aside, 1% set aside against this draw's gradients alone): the worst
    relative error of any output or gradient. Verification takes the second: each gradient
    measured against its typical size over fresh cotangents where one draw cancels it
    (ParityPrograms.typical_gradient_norms); the third is without that."""
    from moegen.verify.reference import parity

    drawn = programs.compare(*case)
    compared = programs.with_typical_sizes(drawn)
    whole = parity.parity_errors(compared)
    aside = parity.parity_errors(compared, parity.KINK_SHARE)
    one_draw = parity.parity_errors(drawn, parity.KINK_SHARE)
    return max(whole.values()), max(aside.values()), max(one_draw.values())


def _cases(module: Any) -> dict[str, tuple]:
    from moegen.verify.reference import parity

    cases = {"random": parity.random_case(module, 0)}
    if module.NUM_EXPERTS > module.TOP_K:
        cases["starved"] = parity.starved_case(module, 1)[:3]
    return cases


def _summary(label: str, values: list[float], tolerance: float) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    over = sum(value >= tolerance for value in ordered)
    return (
        f"{label:<16} n {len(ordered)}  median {statistics.median(ordered):.2e}  "
        f"p95 {p95:.2e}  worst {ordered[-1]:.2e}  at or over {tolerance:g}: {over}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--activation", choices=["swiglu", "geglu", "gelu", "relu", "relu2"])
    parser.add_argument("--weighting", choices=["output", "input"])
    parser.add_argument(
        "--learned-scale", action="store_true", help="router.learned_scale on every spec"
    )
    parser.add_argument("--kernel", default="xla", help="the kernel every spec runs ('' keeps)")
    args = parser.parse_args()
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=64")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from bench.population import population
    from moegen.diagnostics import SpecError
    from moegen.load import load_spec_bytes
    from moegen.validate import validate
    from moegen.verify.reference.parity import ParityPrograms
    from moegen.verify.twin import TOLERANCES

    tolerance = TOLERANCES["bfloat16"]
    whole, aside, one_draw = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        for name, text in population(args.population, args.seed):
            try:
                loaded = validate(load_spec_bytes(_rewritten(text, args).encode(), name, name))
            except SpecError:
                print(f"{name}: refused once rewritten, skipped")
                continue
            module, cfg = _twin_module(loaded, Path(scratch))
            programs = ParityPrograms(module, cfg, module.moe_layer)  # shared by its cases
            for case, values in _cases(module).items():
                full, set_aside, drawn = _case_errors(programs, values)
                whole.append(full)
                aside.append(set_aside)
                one_draw.append(drawn)
                print(
                    f"{name} {case:<8} whole {full:.2e}  1% set aside {set_aside:.2e}  "
                    f"against this draw alone {drawn:.2e}"
                )
    print(_summary("whole", whole, tolerance))
    print(_summary("1% set aside", aside, tolerance))
    print(_summary("this draw alone", one_draw, tolerance))


if __name__ == "__main__":
    main()
