"""The pipeline wired together: load -> validate -> plan -> render -> verify -> emit.

The CLI calls these; each stage lives in its own module and imports only the stages before
it (tests/test_pipeline_imports.py): what a stage needs from an earlier one it is handed
(verify gets the plan the source was rendered from), never recomputed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moegen.diagnostics import Diagnostic, SpecError
from moegen.emit import check_out_dir, rewrite_in_place, write_all
from moegen.hardware import hardware
from moegen.load import FieldPath, LoadedSpec, load_spec
from moegen.own_trade import (
    choose_reporting,
    chooses_by_assignment,
    read_step,
)
from moegen.parallel import OrderedProgress, TaskFailed, run_tasks
from moegen.plan import Plan, fit_problems, make_plan
from moegen.plan.fit import COMPILE_DECIDES, peak
from moegen.render import render
from moegen.validate import validate
from moegen.variants import derive
from moegen.verify import (
    Step,
    VerifyCache,
    VerifyReport,
    allow_workers,
    stop_workers,
    verify,
)
from moegen.verify.assigned import whole_layer_verdict
from moegen.verify.messages import MemoryVerdict
from moegen.verify.preflight import require_verifiers
from moegen.verify.refusal_read import (
    RefusalRead,
    planned_over_hbm,
    read_before_refusing,
    read_has_a_say,
)
from moegen.verify.verdict import TAKE_OFFER, CompilerCrashed, OutOfHbm, VerifyError

DEFAULT_SPEC_DIR = Path("specs")
DEFAULT_OUT_DIR = Path("generated")

# spec, step, seconds, and the verify step's figures (None for the stages before verify)
Progress = Callable[[str, str, float, Step | None], None]
# A spec whose layer ran out of HBM as planned, that plan, the failure and where to report
# each trade read: the spec with another trade written in, and the words of the choice
# (moegen.refit.take_fitting_trade); raises the failure where it takes none.
Refit = Callable[[LoadedSpec, Plan, Exception, Callable[[Any], None]], tuple[LoadedSpec, str]]


class UnfitSpec(SpecError):
    """The plan (or XLA's read of it) says the layer cannot fit its target's HBM."""

    def __init__(self, diagnostics: list[Diagnostic], plan: Plan) -> None:
        super().__init__(diagnostics)
        self.plan = plan


class SpecNotRewritten(Exception):
    """The modules are written; the trade taken could not be written into the spec."""

    def __init__(self, loaded: LoadedSpec, error: BaseException) -> None:
        memory = loaded.spec.memory
        trade = ", ".join(
            f"{key}: {getattr(memory, key)}" for key in ("ffn_chunks", "token_chunks", "fit_check")
        )
        written = f"write it by hand: memory: {{{trade}}}"
        super().__init__(f"{loaded.source.display} ({error}); {written}")
        self.display = loaded.source.display


@dataclass(frozen=True)
class Generated:
    loaded: LoadedSpec
    plan: Plan
    source: str
    report: VerifyReport | None = None
    # --take-fitting-trade wrote another memory trade into the spec: the spec's text as read
    read_as: str | None = None

    @property
    def retraded(self) -> bool:
        return self.read_as is not None


def load_valid(path: Path) -> LoadedSpec:
    """Stages load and validate; raises SpecError with every problem found."""
    return validate(load_spec(path))


# What `moegen plan` and `moegen build` read where validate leaves the fit to XLA.
READ_LATER = (
    "`moegen plan` and `moegen build` read XLA's buffer assignment of the full-size programs "
    "(seconds a program; up to a minute for the largest layers)"
)


def load_planned(path: Path) -> tuple[LoadedSpec, list[str]]:
    """`load_valid`, then planned, never compiled (editors, pre-commit and CI run validate):
    SpecError also where the plan alone decides that the layer cannot fit its target's HBM
    (moegen.plan.fit: a refusal it proves, `memory.fit_check` other than `assigned`, a
    target XLA's read cannot reach). Where XLA's read decides instead (as `generate` makes
    it), the spec passes with a note that says so."""
    loaded = load_valid(path)
    plan = make_plan(loaded)
    display = loaded.source.display
    problems = fit_problems(loaded, plan, _plan_changed)
    reads = loaded.spec.memory.fit_check == "assigned" and read_has_a_say(plan)
    if problems and not reads:
        raise UnfitSpec(problems, plan)
    if problems:
        return loaded, [
            f"{display}: the plan's ledger puts the layer over HBM, by less than it proves; "
            f"whether it fits is XLA's to say: {READ_LATER}"
        ]
    if chooses_by_assignment(loaded, plan):
        return loaded, [
            f"{display}: the plan trades memory for time, and the trade is chosen by XLA's "
            f"figure, fastest first: {READ_LATER}"
        ]
    if reads and planned_over_hbm(plan):
        return loaded, [
            f"{display}: planned over HBM within the ledger's error; whether it fits is "
            f"XLA's to say: {READ_LATER}"
        ]
    return loaded, []


def refuse_unfit(loaded: LoadedSpec, plan: Plan) -> Plan:
    """`plan` when by it the spec can fit its target's HBM; SpecError, located and naming
    what would fit, when it cannot (moegen.plan.fit)."""
    return fitting_plan(loaded, plan)[0]


def fitting_plan(loaded: LoadedSpec, plan: Plan) -> tuple[Plan, RefusalRead | None]:
    """refuse_unfit, and XLA's read where the plan's ledger cannot tell: with
    `memory.fit_check: assigned` (the default), on a TPU target, a refusal the ledger does not
    prove stands only where XLA's buffer assignment agrees, and a layer planned over HBM
    within the ledger's error is refused where XLA finds it out of HBM
    (moegen.verify.refusal_read); each says XLA's figure. A trade the spec leaves to the plan
    is XLA's to choose instead, fit included (moegen.own_trade, after this)."""
    problems = fit_problems(loaded, plan, _plan_changed)
    reads = loaded.spec.memory.fit_check == "assigned"
    if not problems and chooses_by_assignment(loaded, plan):
        return plan, None
    if not problems:  # but over HBM within the ledger's error
        read = read_before_refusing(plan) if reads and planned_over_hbm(plan) else None
        if read is None or not read.measured:
            return plan, None
        if read.fits:
            return plan, read
        raise UnfitSpec([_over_by_xla(loaded, plan, read)], plan)
    read = read_before_refusing(plan) if reads else None
    if read is not None and read.fits:
        return plan, read
    if read is not None:
        problems = [_with_read(problem, read) for problem in problems]
    raise UnfitSpec(problems, plan)


def _over_by_xla(loaded: LoadedSpec, plan: Plan, read: RefusalRead) -> Diagnostic:
    """A layer the ledger puts over HBM within its error (its trade written in the spec) that
    XLA finds out of HBM: refused in seconds, not after minutes of twins and compiles, with
    what to try."""
    largest = max(peak(shape) for _, shape in plan.shape_plans())
    hbm = plan.memory.hbm_bytes_per_device
    message = (
        f"the plan needs {largest / 2**30:.2f} GiB per device by its ledger, "
        f"{largest / hbm - 1:.0%} over the {hbm / 2**30:.2f} GiB HBM of {plan.hardware}, "
        f"within the ledger's own error; {read.words.rstrip('.')}. Leave memory.ffn_chunks "
        "and memory.token_chunks out (the build then takes the fastest trade XLA's buffer "
        "assignment fits, seconds a trade), or shorten shapes.batch. "
        f"{TAKE_OFFER}"
    )
    return loaded.diagnostic(("shapes", "batch"), message)


def _with_read(problem: Diagnostic, read: RefusalRead) -> Diagnostic:
    """A refusal by the ledger's word with XLA's answer; where XLA has measured the layer,
    leaving the decision to the full-size compile is no longer offered, but another trade
    read by XLA is (the ledger refused every trade; XLA may fit one: bench.holdout)."""
    message = problem.message.rstrip()
    if read.measured:
        message = message.replace(COMPILE_DECIDES, "")
    offer = f" {TAKE_OFFER}" if read.measured else ""
    return replace(problem, message=f"{message} {read.words.rstrip('.')}.{offer}")


def _plan_changed(loaded: LoadedSpec, changes: Mapping[FieldPath, Any]) -> Plan | None:
    """The plan of the spec with `changes` and no shape variants; None when that is invalid."""
    try:
        # Only the peak is asked of it: no token chunk candidates.
        return make_plan(derive(loaded, {("shapes", "variants"): None, **changes}), options=False)
    except SpecError:
        return None


def generate(path: Path, progress: Progress | None = None, refit: Refit | None = None) -> Generated:
    """Load, validate, plan and render one spec (no verification). `refit`: where the plan
    cannot fit HBM, the spec with the trade it takes instead (`retraded`)."""
    note = progress or (lambda *args: None)
    start = time.perf_counter()
    loaded = load_valid(path)
    note(loaded.source.display, "load + validate", time.perf_counter() - start, None)
    try:
        return _planned(loaded, note)
    except UnfitSpec as unfit:
        if refit is None:
            raise
        retraded = _retraded(loaded, unfit.plan, unfit, refit, note)
    return replace(_planned(retraded, note), read_as=loaded.source.text)


def _planned(loaded: LoadedSpec, note: Progress) -> Generated:
    """Plan (refused where it cannot fit, before any twin or compile) and render."""
    start = time.perf_counter()
    plan, read = fitting_plan(loaded, make_plan(loaded))
    planned_s = time.perf_counter() - start - (read.seconds if read else 0.0)
    note(loaded.source.display, "plan", planned_s, None)
    if read is not None:  # the ledger would have refused it; XLA's assignment fits it
        step = MemoryVerdict("plan: memory by XLA's assignment", read.seconds, read.words)
        note(loaded.source.display, step.step, step.seconds, step)
    if chooses_by_assignment(loaded, plan):
        loaded, plan = choose_reporting(loaded, plan, note)
    start = time.perf_counter()
    source = render(plan)
    note(loaded.source.display, "render", time.perf_counter() - start, None)
    return Generated(loaded, plan, source)


def _retraded(
    loaded: LoadedSpec, failed: Plan, failure: Exception, refit: Refit, note: Progress
) -> LoadedSpec:
    """The spec with the trade `refit` takes, each read and the choice reported as steps."""
    display = loaded.source.display
    start = time.perf_counter()

    def on_read(candidate: Any) -> None:
        step = read_step(candidate)
        note(display, step.step, step.seconds, step)

    retraded, words = refit(loaded, failed, failure, on_read)
    step = MemoryVerdict("memory: trade taken", time.perf_counter() - start, words)
    note(display, step.step, step.seconds, step)
    return retraded


def output_path(out_dir: Path, generated: Generated) -> Path:
    return out_dir / f"{generated.plan.module_name}.py"


def build(
    paths: list[Path],
    out_dir: Path,
    *,
    run_verify: bool = True,
    progress: Progress | None = None,
    jobs: int = 1,
    cache: VerifyCache | None = None,
    refit: Refit | None = None,
) -> list[tuple[Path, Generated]]:
    """Generate and verify every spec, then write all modules; nothing is written on failure.

    Every spec is generated, and checked for what its verification needs installed, before
    any is verified; `jobs` specs are verified at a time (moegen.parallel), the report kept in
    spec order. `cache`: reuse records of passed verifications (moegen.verify.record).
    The write is one atomic exchange of `out_dir` (moegen.emit), which first clears what
    this user's killed builds provably left there; a build that writes nothing (an invalid
    spec, a failed verification) touches nothing on disk. `refit`: where a layer runs out of
    HBM as planned, the spec with the trade it takes instead, rewritten after the modules.
    """
    ordered = OrderedProgress(progress or (lambda *args: None), len(paths))
    try:
        results = [(i, generate(path, ordered.for_spec(i), refit)) for i, path in enumerate(paths)]
        _refuse_collisions([(output_path(out_dir, g), g) for _, g in results])
        check_out_dir(out_dir, [output_path(out_dir, g) for _, g in results])
        if run_verify:
            require_verifiers([(g.loaded, g.plan) for _, g in results])
            tasks = [_verifying(i, g, ordered, cache, refit) for i, g in results]
            verified = run_tasks(tasks, jobs, stop_workers)
        else:
            verified = [g for _, g in results]
    except TaskFailed as failed:
        ordered.flush(last=failed.index)
        raise failed.error from None
    except BaseException:
        ordered.flush()
        raise
    finally:
        allow_workers()
    ordered.flush()
    written = [(output_path(out_dir, g), g) for g in verified]
    write_all({target: g.source for target, g in written}, out_dir=out_dir)
    for path, generated in zip(paths, verified, strict=True):
        if generated.read_as is not None:  # the spec says what its module runs (moegen check)
            try:
                rewrite_in_place(path, generated.loaded.source.text, was=generated.read_as)
            except (OSError, UnicodeError) as err:
                raise SpecNotRewritten(generated.loaded, err) from None
    return written


def _verifying(
    index: int,
    generated: Generated,
    ordered: OrderedProgress,
    cache: VerifyCache | None,
    refit: Refit | None = None,
) -> Callable[[], Generated]:
    """The task that verifies one generated spec, its steps reported as spec `index`;
    `refit`: where the full-size compile runs out of HBM, the trade taken instead."""
    display = generated.loaded.source.display
    note = ordered.for_spec(index)

    def on_step(step: Step) -> None:
        note(display, f"verify: {step.step}", step.seconds, step)

    def verified(which: Generated) -> Generated:
        report = verify(which.loaded, which.source, plan=which.plan, on_step=on_step, cache=cache)
        whole = _whole_layer_step(which)
        if whole is not None:
            report.steps.append(whole)
            on_step(whole)
        return replace(which, report=report)

    def task() -> Generated:
        try:
            done = verified(generated)
        except (OutOfHbm, CompilerCrashed) as err:
            failure = _taking_words(err, generated)
            if refit is None:
                raise failure from None
            retraded = _retraded(generated.loaded, generated.plan, failure, refit, note)
            planned = _planned(retraded, note)
            read_as = generated.read_as  # the spec as the user wrote it, retraded or not
            if read_as is None:
                read_as = generated.loaded.source.text
            done = verified(replace(planned, read_as=read_as))
        ordered.finish(index)
        return done

    return task


def _taking_words(err: VerifyError, generated: Generated) -> VerifyError:
    """A failure another memory trade can mend, with what to do: an out-of-HBM compile of a
    trade the plan chose on its own (by its ledger) with XLA's buffer assignment of the layer
    whole (a layer the ledger traded can fit whole where the trade does not: its sliced
    backward holds more); a compiler crash on a TPU target with the offer to take another
    trade (another trade is another program)."""
    if isinstance(err, CompilerCrashed):
        tpu = hardware(generated.plan.hardware).platform == "tpu"
        return CompilerCrashed(f"{err} {TAKE_OFFER}") if tpu else err
    whole = whole_layer_verdict(generated.loaded, generated.plan, out_of_hbm=True)
    return OutOfHbm(f"{err}\n{_sentence(whole)}") if whole else err


def _sentence(verdict: str) -> str:
    """A verdict in words (lower-case, no stop) as a sentence of its own."""
    return f"{verdict[0].upper()}{verdict[1:]}."


def _whole_layer_step(generated: Generated) -> MemoryVerdict | None:
    """Where the plan chose a memory trade on its own on a TPU target: the layer whole, read
    by XLA's buffer assignment (moegen.verify.assigned), as a step after the verdict."""
    start = time.perf_counter()
    verdict = whole_layer_verdict(generated.loaded, generated.plan)
    if verdict is None:
        return None
    return MemoryVerdict("memory: the layer whole", time.perf_counter() - start, verdict)


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
