"""The pipeline wired together: load -> validate -> plan -> fit -> render -> verify -> emit.

The CLI calls these; each stage lives in its own module and imports only the stages before
it (tests/cli/test_pipeline_imports.py): what a stage needs from an earlier one it is handed
(verify gets the plan the source was rendered from), never recomputed. The fit stage reads
the compiler's memory figure through the reader verify supplies (moegen.verify.XLA_READS),
handed to it here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moegen import fit
from moegen.diagnostics import Diagnostic, SpecError
from moegen.emit import check_out_dir, rewrite_in_place, write_all
from moegen.fit import (
    ANNOUNCED,
    READ_TIME,
    TAKE_OFFER,
    Candidate,
    UnfitSpec,
    chooses_by_assignment,
    kept_words,
)
from moegen.hardware import hardware
from moegen.load import LoadedSpec, load_spec
from moegen.parallel import OrderedProgress, TaskFailed, run_tasks
from moegen.plan import Plan, make_plan
from moegen.render import render
from moegen.validate import validate
from moegen.verify import (
    XLA_READS,
    CompilerCrashed,
    MemoryVerdict,
    OutOfHbm,
    Step,
    VerifyCache,
    VerifyError,
    VerifyReport,
    allow_workers,
    require_verifiers,
    stop_workers,
    verify,
    whole_layer_verdict,
)

DEFAULT_SPEC_DIR = Path("specs")
DEFAULT_OUT_DIR = Path("generated")

# spec, step, seconds, and the verify step's figures (None for the stages before verify)
Progress = Callable[[str, str, float, Step | None], None]
# A spec whose layer ran out of HBM as planned, that plan, the failure and where to report
# each trade read: the spec with another trade written in, and the words of the choice
# (moegen.refit.take_fitting_trade); raises the failure where it takes none.
Refit = Callable[[LoadedSpec, Plan, Exception, Callable[[Any], None]], tuple[LoadedSpec, str]]


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


def load_planned(path: Path) -> tuple[LoadedSpec, list[str]]:
    """`load_valid`, then planned and fitted, never compiled (editors, pre-commit and CI run
    validate): UnfitSpec where the plan alone decides that the layer cannot fit its target's
    HBM; where XLA's read decides instead (as `generate` makes it), a note that says so
    (moegen.fit.fit_notes)."""
    loaded = load_valid(path)
    return loaded, fit.fit_notes(loaded, make_plan(loaded))


def refuse_unfit(loaded: LoadedSpec, plan: Plan) -> Plan:
    """`plan` where by it (or by XLA's read, where the ledger cannot tell) the spec can fit
    its target's HBM; UnfitSpec, located and naming what would fit, where it cannot."""
    return fit.fitting_plan(loaded, plan, XLA_READS)[0]


def take_fitting_trade(
    loaded: LoadedSpec, failed: Plan, failure: Exception, on_read: Callable[[Any], None]
) -> tuple[LoadedSpec, str]:
    """--take-fitting-trade (moegen.fit.refit), read by XLA's buffer assignment."""
    crashed = isinstance(failure, CompilerCrashed)
    return fit.take_fitting_trade(loaded, failed, failure, XLA_READS, on_read, crashed=crashed)


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
    plan, read = fit.fitting_plan(loaded, make_plan(loaded), XLA_READS)
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


def choose_reporting(loaded: LoadedSpec, ledger: Plan, note: Progress) -> tuple[LoadedSpec, Plan]:
    """The trade the spec leaves open, chosen by XLA's read (moegen.fit.own_trade), each read
    and the choice reported as steps of the spec, as --take-fitting-trade reports its own."""
    display = loaded.source.display
    start = time.perf_counter()

    def on_read(candidate: Candidate) -> None:
        step = read_step(candidate)
        note(display, step.step, step.seconds, step)

    def announce(count: int) -> None:
        words = f"up to {count} trades, fastest first, until one fits: {READ_TIME}"
        note(display, ANNOUNCED, 0.0, MemoryVerdict(ANNOUNCED, 0.0, words))

    chosen, plan, words = fit.choose_own_trade(loaded, ledger, XLA_READS, on_read, announce)
    step = MemoryVerdict("memory: trade chosen", time.perf_counter() - start, words)
    note(display, step.step, step.seconds, step)
    return chosen, plan


def read_step(candidate: Candidate) -> MemoryVerdict:
    """One trade read by XLA's assignment as a step of the build: `memory: read ffn_chunks 2,
    token_chunks 4`, and its peak or why it was not taken."""
    trade = ", ".join(
        f"{path[1]} {value}" for path, value in candidate.choices.items() if path[0] == "memory"
    )
    kept = kept_words(candidate.peak_bytes)
    words = candidate.problem or f"{candidate.peak_bytes / 2**30:.2f} GiB per device{kept}: fits"
    return MemoryVerdict(f"memory: read {trade}", candidate.seconds, words)


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
    spec order. `cache`: reuse records of passed verifications (moegen.verify.records.record).
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
    by XLA's buffer assignment (moegen.verify.memory.assigned), as a step after the verdict."""
    start = time.perf_counter()
    verdict = whole_layer_verdict(generated.loaded, generated.plan)
    if verdict is None:
        return None
    return MemoryVerdict("memory: the layer whole", time.perf_counter() - start, verdict)


def _refuse_collisions(results: list[tuple[Path, Generated]]) -> None:

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
