"""The plan refused where it cannot fit the target's HBM, and, where the plan's ledger cannot
tell, the compiler's own figure asked (moegen.fit.reads).

Validation asks `fit_notes` (it never reads: editors, pre-commit and CI run it); the build
asks `fitting_plan` before it renders, and then chooses the trade a TPU spec leaves open
(moegen.fit.own_trade).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from moegen.diagnostics import Diagnostic, SpecError
from moegen.fit.own_trade import chooses_by_assignment
from moegen.fit.reads import CompilerReads
from moegen.fit.refit import TAKE_OFFER
from moegen.fit.refusal import COMPILE_DECIDES, fit_problems
from moegen.fit.refusal_read import (
    RefusalRead,
    planned_over_hbm,
    read_before_refusing,
    read_has_a_say,
)
from moegen.load import FieldPath, LoadedSpec
from moegen.plan import Plan, make_plan, peak
from moegen.variants import derive

# What `moegen plan` and `moegen build` read where validate leaves the fit to XLA.
READ_LATER = (
    "`moegen plan` and `moegen build` read XLA's buffer assignment of the full-size programs "
    "(seconds a program; up to a minute for the largest layers)"
)


class UnfitSpec(SpecError):
    """The plan (or XLA's read of it) says the layer cannot fit its target's HBM."""

    def __init__(self, diagnostics: list[Diagnostic], plan: Plan) -> None:
        super().__init__(diagnostics)
        self.plan = plan


def fit_notes(loaded: LoadedSpec, plan: Plan) -> list[str]:
    """What validation says of the fit, never reading: UnfitSpec where the plan alone decides
    that the layer cannot fit its target's HBM (a refusal it proves, `memory.fit_check`
    other than `assigned`, a target XLA's read cannot reach); where XLA's read decides
    instead (as the build makes it), a note that says so."""
    display = loaded.source.display
    problems = fit_problems(loaded, plan, plan_changed)
    reads = loaded.spec.memory.fit_check == "assigned" and read_has_a_say(plan)
    if problems and not reads:
        raise UnfitSpec(problems, plan)
    if problems:
        return [
            f"{display}: the plan's ledger puts the layer over HBM, by less than it proves; "
            f"whether it fits is XLA's to say: {READ_LATER}"
        ]
    if chooses_by_assignment(loaded, plan):
        return [
            f"{display}: the plan trades memory for time, and the trade is chosen by XLA's "
            f"figure, fastest first: {READ_LATER}"
        ]
    if reads and planned_over_hbm(plan):
        return [
            f"{display}: planned over HBM within the ledger's error; whether it fits is "
            f"XLA's to say: {READ_LATER}"
        ]
    return []


def fitting_plan(
    loaded: LoadedSpec, plan: Plan, reads: CompilerReads
) -> tuple[Plan, RefusalRead | None]:
    """`plan` where by it the spec can fit its target's HBM, and XLA's read where the plan's
    ledger cannot tell; UnfitSpec, located and naming what would fit, where it cannot. With
    `memory.fit_check: assigned` (the default), on a TPU target, a refusal the ledger does not
    prove stands only where XLA's buffer assignment agrees, and a layer planned over HBM
    within the ledger's error is refused where XLA finds it out of HBM
    (moegen.fit.refusal_read); each says XLA's figure. A trade the spec leaves to the plan
    is XLA's to choose instead, fit included (moegen.fit.own_trade, after this)."""
    problems = fit_problems(loaded, plan, plan_changed)
    assigned = loaded.spec.memory.fit_check == "assigned"
    if not problems and chooses_by_assignment(loaded, plan):
        return plan, None
    if not problems:  # but over HBM within the ledger's error
        read = read_before_refusing(plan, reads) if assigned and planned_over_hbm(plan) else None
        if read is None or not read.measured:
            return plan, None
        if read.fits:
            return plan, read
        raise UnfitSpec([_over_by_xla(loaded, plan, read)], plan)
    read = read_before_refusing(plan, reads) if assigned else None
    if read is not None and read.fits:
        return plan, read
    if read is not None:
        problems = [_with_read(problem, read) for problem in problems]
    raise UnfitSpec(problems, plan)


def plan_changed(loaded: LoadedSpec, changes: Mapping[FieldPath, Any]) -> Plan | None:
    """The plan of the spec with `changes` and no shape variants; None when that is invalid
    (the refusal's search for what would fit: moegen.fit.refusal)."""
    try:
        # Only the peak is asked of it: no token chunk candidates.
        return make_plan(derive(loaded, {("shapes", "variants"): None, **changes}), options=False)
    except SpecError:
        return None


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
