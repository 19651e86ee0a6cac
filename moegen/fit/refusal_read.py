"""Before the plan refuses a TPU layer on its ledger's word alone: XLA's own figure decides.

The plan refuses a spec whose ledger puts it over HBM (moegen.fit.refusal). Where the ledger
*proves* it cannot fit (the parameters and their gradients alone over HBM, or the estimate
over by more than the ledger has ever been measured over the compiler), the refusal stands
in milliseconds. Between the two (over by more than LEDGER_OVERESTIMATE, by less than
REFUSAL_OVERESTIMATE) the ledger is an estimate that has been measured up to 38% over XLA's
peak on a population nobody fitted it on (bench.holdout, seed 2: two of its seven refusals
there were of layers that fit), so a refusal there can be wrong.
On a TPU target the layer's buffer assignment, as XLA makes it for the full-size programs
(moegen.fit.reads, as moegen.verify.memory.xla_reads reads it: seconds, no code generated), says
whether it fits: the refusal stands only where XLA agrees, and says XLA's figure; a layer XLA fits
goes on to the build, whose full-size compile has the last word. Just over HBM (by less than
LEDGER_OVERESTIMATE) the plan does not refuse, and its ledger can as well be under the compiler
(seed 3 of bench.holdout: a trade planned 4% over HBM needs 18.08 of 15.75 GiB in temporaries
alone): the read refuses a layer XLA finds out of HBM in seconds, before the twins and the full
compile spend minutes. (A trade the spec leaves to the plan is chosen by XLA's read instead, fit
included: moegen.fit.own_trade.)
All of it with `memory.fit_check: assigned`, the default (moegen.fit.fitting).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from moegen.fit.reads import READ_BY, CompilerReads, ReadError, fits_by_assignment, kept_words
from moegen.hardware import hardware
from moegen.plan import Plan, memory_peak, proved_unfit

GiB = 2**30


@dataclass(frozen=True)
class RefusalRead:
    """XLA's answer where the ledger cannot tell: whether the layer fits, in words."""

    fits: bool
    words: str
    seconds: float
    measured: bool = True  # False: the read could not be made (no libtpu, a failed worker)


def planned_over_hbm(plan: Plan) -> bool:
    """Some shape's planned peak is above HBM (by no more than the ledger's own error, where
    the plan does not refuse it): the ledger cannot tell whether it fits."""
    return any(
        memory_peak(shape.memory) > shape.memory.hbm_bytes_per_device > 0
        for _, shape in plan.shape_plans()
    )


def read_has_a_say(plan: Plan) -> bool:
    """Whether XLA's read can overturn the ledger's word on `plan`: a TPU target, and no
    shape the plan proves cannot fit."""
    shapes = [shape for _, shape in plan.shape_plans()]
    tpu = plan.mesh.tpu_topology_name is not None  # a TPU slice XLA compiles for
    return tpu and not any(proved_unfit(s.memory) for s in shapes)


def read_before_refusing(plan: Plan, reads: CompilerReads) -> RefusalRead | None:
    """XLA's buffer assignment of every shape of `plan`, where the plan refuses it on its
    ledger's word on a TPU target, or plans it over HBM by less than its error; None where
    no read has a say (not a TPU target, or a shape the plan proves cannot fit)."""
    if not read_has_a_say(plan):
        return None
    missing = reads.missing()
    if missing is not None:
        words = f"{READ_BY}, which would decide, needs {missing}"
        return RefusalRead(False, words, 0.0, measured=False)
    start = time.perf_counter()
    try:
        peak = reads.peak(plan)
    except ReadError as err:
        line = str(err).strip().splitlines()[0]
        seconds = time.perf_counter() - start
        if err.out_of_hbm:
            return RefusalRead(False, f"{READ_BY}: {line}", seconds)
        words = f"{READ_BY} could not be read ({line})"
        return RefusalRead(False, words, seconds, measured=False)
    seconds = time.perf_counter() - start
    granted = hardware(plan.hardware).compiler_hbm_bytes_per_device
    words = (
        f"{READ_BY} of the full-size programs{kept_words(peak)}: "
        f"{peak / GiB:.2f} GiB per device, "
        f"of the {granted / GiB:.2f} GiB the compiler grants a program"
    )
    if fits_by_assignment(plan, peak):
        return RefusalRead(True, f"{words}: it fits", seconds)
    return RefusalRead(False, f"{words}: it does not fit either", seconds)
