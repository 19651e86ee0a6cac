"""The plan's ledger against the target's HBM: how far over it the plan trades memory of its
own, and what proves a layer cannot fit.

The ledger is an estimate (bench/LEDGER.md), so every threshold here allows for its measured
error in the direction that could make a decision wrong: the plan trades memory (moegen.plan.
token_chunks) above HBM by more than LEDGER_OVERESTIMATE, and a layer is proved unfit only
above it by more than REFUSAL_OVERESTIMATE (or by what is exact: the parameters and their
gradients). What to refuse, and what to offer instead, is the fit stage's (moegen.fit).
"""

from __future__ import annotations

from moegen.plan.memory import MemoryPlan
from moegen.plan.model import Plan

# How far above HBM the plan may put a layer before it trades memory of its own
# (moegen.plan.token_chunks) and, with `memory.fit_check: plan` (the default), before it
# refuses the spec. The committed examples' worst over-estimate (+8.7%, deepseek_v3_v5p;
# tests/fit/test_ledger.py). It is not a bound beyond them: on the generated populations no
# refusal was wrong (every spec refused is out of HBM in the compiler), but the plan has been
# measured up to REFUSAL_OVERESTIMATE above the compiled peak, so the message says so and
# names `memory.fit_check: compile`.
LEDGER_OVERESTIMATE = 0.10
# What proves a layer cannot fit (`memory.fit_check: compile` refuses only that): the plan
# above HBM by more than the most it has been measured above the compiled peak (the larger
# of the two programs, as compared here), with room to spare. Set at 55% on seeds 0 and 1 of
# the generated populations as drawn (worst +51.0%, s1_034), it was broken twice by what
# bench.holdout and bench.defaults_fit read since: a fresh seed 4 as drawn, +63.6% (s4_026,
# mixtral), and the layers made too big to run whole, read whole by XLA's buffer assignment
# when the build chooses their trade: +123.5% (s2_023, olmoe at batch 224, 7 [rows, D]
# buffers counted at the row gradient where XLA holds far fewer), +111.5% (s1_046), +100.9%
# (s3_003), +94.0% (s1_020). Three times HBM leaves a third above the worst. An empirical
# bound, not a proof, and said so; tests/fit/test_ledger_population.py holds it above every
# recorded over-estimate, compiled (seeds 0, 1) and assigned (seeds 2-4, too-big layers).
REFUSAL_OVERESTIMATE = 2.00
MEASURED_OVERESTIMATE = 1.24  # the worst of them, rounded up


def peak(plan: Plan) -> int:
    """The planned peak per device: forward+backward (the forward never holds more)."""
    return memory_peak(plan.memory)


def memory_peak(memory: MemoryPlan) -> int:
    return max(memory.train_peak, memory.forward_peak)


def cannot_fit(plan: Plan, compile_decides: bool = False) -> bool:
    """The spec is refused: proved not to fit (`proved_unfit`), or, unless the compile
    decides (`memory.fit_check: compile`), planned above HBM by more than LEDGER_OVERESTIMATE."""
    return proved_unfit(plan.memory) or (not compile_decides and over_hbm(plan.memory))


def proved_unfit(memory: MemoryPlan) -> bool:
    """The parameters and their gradients alone (the compiled program's arguments and outputs,
    which the ledger counts to the byte) are over HBM, or the planned peak is above it by more
    than the plan has been measured over the compiler (REFUSAL_OVERESTIMATE)."""
    hbm = memory.hbm_bytes_per_device
    return bool(hbm) and (
        memory.exact_bytes > hbm or memory_peak(memory) > hbm * (1 + REFUSAL_OVERESTIMATE)
    )


def over_hbm(memory: MemoryPlan) -> bool:
    """The planned peak is above HBM by more than LEDGER_OVERESTIMATE: the plan trades."""
    hbm = memory.hbm_bytes_per_device
    return bool(hbm) and memory_peak(memory) > hbm * (1 + LEDGER_OVERESTIMATE)


def _fits(plan: Plan) -> bool:
    return peak(plan) <= plan.memory.hbm_bytes_per_device
