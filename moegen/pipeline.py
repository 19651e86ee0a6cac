"""The pipeline wired together: load -> validate -> plan -> render -> verify -> emit.

The CLI calls these; each stage lives in its own module and imports only the stages before
it (tests/test_pipeline_imports.py): what a stage needs from an earlier one it is handed
(verify gets the plan the source was rendered from), never recomputed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moegen.emit import recover, write_all
from moegen.load import LoadedSpec, load_spec
from moegen.plan import Plan, make_plan
from moegen.render import render
from moegen.validate import validate
from moegen.verify import Step, VerifyReport, verify

DEFAULT_SPEC_DIR = Path("specs")
DEFAULT_OUT_DIR = Path("generated")

# spec, step, seconds, and the verify step's figures (None for the stages before verify)
Progress = Callable[[str, str, float, Step | None], None]


@dataclass(frozen=True)
class Generated:
    loaded: LoadedSpec
    plan: Plan
    source: str
    report: VerifyReport | None = None


def load_valid(path: Path) -> LoadedSpec:
    """Stages load and validate; raises SpecError with every problem found."""
    return validate(load_spec(path))


def generate(path: Path, progress: Progress | None = None) -> Generated:
    """Load, validate, plan and render one spec (no verification)."""
    note = progress or (lambda *args: None)
    start = time.perf_counter()
    loaded = load_valid(path)
    note(loaded.source.display, "load + validate", time.perf_counter() - start, None)
    start = time.perf_counter()
    plan = make_plan(loaded)
    note(loaded.source.display, "plan", time.perf_counter() - start, None)
    start = time.perf_counter()
    source = render(plan)
    note(loaded.source.display, "render", time.perf_counter() - start, None)
    return Generated(loaded, plan, source)


def output_path(out_dir: Path, generated: Generated) -> Path:
    return out_dir / f"{generated.plan.module_name}.py"


def build(
    paths: list[Path], out_dir: Path, *, run_verify: bool = True, progress: Progress | None = None
) -> list[tuple[Path, Generated]]:
    """Generate and verify every spec, then write all modules; nothing is written on failure.

    The write is one atomic exchange of `out_dir` (moegen.emit); what killed builds left
    beside it is cleared first, so that a failing build does not keep it either.
    """
    note = progress or (lambda *args: None)
    recover(out_dir)
    results = []
    for path in paths:
        generated = generate(path, progress)
        if run_verify:
            display = generated.loaded.source.display

            def on_step(step: Step, display: str = display) -> None:
                note(display, f"verify: {step.step}", step.seconds, step)

            report = verify(
                generated.loaded, generated.source, plan=generated.plan, on_step=on_step
            )
            generated = Generated(generated.loaded, generated.plan, generated.source, report)
        results.append((output_path(out_dir, generated), generated))
    _refuse_collisions(results)
    write_all({target: generated.source for target, generated in results}, out_dir=out_dir)
    return results


def _refuse_collisions(results: list[tuple[Path, Generated]]) -> None:
    from moegen.diagnostics import Diagnostic, SpecError

    seen: dict[Path, str] = {}
    problems = []
    for target, generated in results:
        display = generated.loaded.source.display
        if target in seen and seen[target] != display:
            problems.append(
                Diagnostic(
                    display, 1, 1, "", f"writes {target}, as {seen[target]} does; rename one"
                )
            )
        seen.setdefault(target, display)
    if problems:
        raise SpecError(problems)


def default_specs(spec_dir: Path = DEFAULT_SPEC_DIR) -> list[Path]:
    return sorted(spec_dir.glob("*.yaml")) + sorted(spec_dir.glob("*.yml"))
