"""`moegen tune` when only memory trades are left to it (memory.ffn_chunks and
memory.token_chunks written `auto`) on a TPU target: each candidate's fit is read from XLA's
own buffer assignment of its full-size programs, every shape's (moegen.fit.reads, as
moegen.verify.memory.xla_reads reads it: the compiled peak, in seconds, stopped before code
generation) instead of from a full compile or the plan's ledger. The build's own trade
(moegen.fit.own_trade) and --take-fitting-trade (moegen.fit.refit) choose the same way.

A memory trade changes no result, only work: FFN slices and token chunks recompute the gate
and up matmuls and gather weights again. The plan counts what each candidate runs, every
iteration of every loop (XLA's cost analysis counts a loop's body once), so candidates are
ranked by the plan's step time (moegen.plan.step_time: what a trade adds between the
matmuls, which FLOPs do not show) before anything is compiled and read in that order: the
first that fits HBM by XLA's figure is the fastest that fits, and none after it is read.

Where the plan's ledger puts the chosen trade above HBM (by more than the refusal allows), the
tuned spec also says `memory.fit_check: compile`: the compiler's figure found it to fit, and
the plan must not refuse it by its own; the build's full compile still judges it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from moegen.fit.candidates import Candidate, count_by_plan
from moegen.fit.reads import READ_BY, CompilerReads, ReadError, fits_by_assignment
from moegen.hardware import hardware
from moegen.load import LoadedSpec
from moegen.plan import Plan, over_hbm, proved_unfit

MEMORY_FIELDS = frozenset({("memory", "ffn_chunks"), ("memory", "token_chunks")})
FIT_CHECK = ("memory", "fit_check")
NOT_READ = "not read: a faster candidate fits"
PROVED = "not read: the plan proves it out of HBM"
OnCandidate = Callable[[int, int, Candidate], None]


def by_assignment(loaded: LoadedSpec) -> bool:
    """Whether tune reads fits from XLA's buffer assignment: only memory trades are `auto`,
    on a TPU target (compile-only slices). With shape variants every shape is read."""
    spec = loaded.spec
    autos = set(spec.auto_fields())
    return (
        bool(autos) and autos <= MEMORY_FIELDS and hardware(spec.target.hardware).platform == "tpu"
    )


def choose_by_assignment(
    found: list[Candidate], reads: CompilerReads, budget_s: float, on_candidate: OnCandidate
) -> Candidate | None:
    """Rank the valid candidates by the plan's counts, read XLA's peak of each in that order
    and return the first that fits HBM with the generated code's margin to spare
    (moegen.fit.reads.fits_by_assignment) (None: none does). Every
    candidate is reported once, in the order it was decided. (tune says a missing compiler
    before this is called.)"""
    planned = [c for c in found if c.plan is not None]
    for candidate in planned:
        count_by_plan(candidate)
    ranked = sorted(planned, key=lambda c: (c.score, _trades(c.plan)))
    ranked += [c for c in found if c.plan is None]  # invalid: their problem says why
    start = time.perf_counter()
    winner = None
    for i, candidate in enumerate(ranked):
        if candidate.plan is not None:
            if winner is not None:
                candidate.problem = NOT_READ
            elif time.perf_counter() - start > budget_s:
                candidate.problem = f"not read: the {budget_s:.0f} s budget ran out"
            else:
                _read(candidate, reads)
                winner = None if candidate.problem else candidate
        on_candidate(i + 1, len(ranked), candidate)
    if winner is not None and winner.plan is not None and _ledger_refuses(winner.plan):
        winner.choices[FIT_CHECK] = "compile"  # the plan's ledger would refuse it
    return winner


def _read(candidate: Candidate, reads: CompilerReads) -> None:
    """Set the candidate's peak by XLA's assignment, or its problem: proved out of HBM by
    the plan (not read), refused by the compiler, or too near HBM to fit."""
    plan = candidate.plan
    assert plan is not None
    candidate.peak_by = READ_BY
    if any(proved_unfit(shape.memory) for _, shape in plan.shape_plans()):
        candidate.problem = PROVED
        return
    start = time.perf_counter()
    try:
        candidate.peak_bytes = reads.peak(plan)
    except ReadError as err:
        candidate.problem = f"{READ_BY}: {str(err).splitlines()[0]}"
        return
    finally:
        candidate.seconds = time.perf_counter() - start
    if not fits_by_assignment(plan, candidate.peak_bytes):
        granted = hardware(plan.hardware).compiler_hbm_bytes_per_device
        candidate.problem = (
            f"{READ_BY}: peak {candidate.peak_bytes / 2**30:.2f} GiB, "
            f"{candidate.peak_bytes / granted:.1%} of the {granted / 2**30:.2f} GiB the "
            "compiler grants a program (over 99%: the generated code needs the rest)"
        )


def _ledger_refuses(plan: Plan) -> bool:
    return any(over_hbm(shape.memory) for _, shape in plan.shape_plans())


def _trades(plan: Plan | None) -> int:
    """Among equal scores, fewer slices and chunks first."""
    assert plan is not None
    return plan.ffn.chunks * plan.experts.token_chunks
