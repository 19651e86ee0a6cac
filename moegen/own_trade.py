"""The memory trade a TPU spec leaves to the plan, chosen by XLA's buffer assignment.

Where a spec leaves `memory.ffn_chunks` or `memory.token_chunks` out and the plan's ledger
trades (it does not fit the layer whole with TRADE_HEADROOM free), the ledger's count is an
estimate: on generated populations it is more than 10% off the compiled peak on about a third
of the programs (bench/LEDGER.md), so its trade leaves 30% of HBM free, and recomputes where
the layer whole fits (14 of the 24 population layers made too big: bench.defaults_fit). With
`memory.fit_check: assigned` (the default) the build instead ranks the trades the spec leaves
open by the plan's step time (moegen.plan.step_time), as `moegen tune` does, and reads XLA's
buffer assignment of each in that order (moegen.verify.assigned: the compiled peak to 0.0034%
on every program measured, seconds a read); the first that fits is the module's trade, and
the build says so.

The same spec gives the same module on every machine: the read is made by the pinned libtpu,
in full (no time budget), and a read that fails for any reason but HBM stops the build rather
than move on to another trade. Without libtpu the build says what to install, or to write the
trade, rather than fall back to another module.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from moegen.diagnostics import SpecError
from moegen.hardware import hardware
from moegen.load import FieldPath, LoadedSpec
from moegen.plan import Plan
from moegen.tune import candidate_of, candidates, count_by_plan, yaml_value
from moegen.tune_candidate import Candidate
from moegen.tune_memory import MEMORY_FIELDS, NOT_READ, READ_BY, choose_by_assignment
from moegen.variants import unchecked
from moegen.verify import Step, VerifyError
from moegen.verify.assigned import assigned_peak, kept_words
from moegen.verify.messages import MemoryVerdict
from moegen.verify.preflight import LIBTPU_FIX, module_installed
from moegen.verify.verdict import every_shapes_own_trades

OUT_OF_HBM = "out of HBM"  # in a read's error: XLA's answer that the trade does not fit
# What a read costs, said before the first: the forward and forward+backward programs
# assigned side by side (5.45 s for Qwen3-30B-A3B over 16 v5e chips; 25-60 s for DeepSeek-V3,
# Qwen3-235B and Jamba at batch 32), a kept read (moegen.verify.read_record) milliseconds.
ANNOUNCED = "memory: XLA's buffer assignment"  # the step that says reads are coming
READ_TIME = "about 5 s to a minute a read, the largest layers longest; a kept read milliseconds"
OnRead = Callable[[Candidate], None]
Note = Callable[[str, str, float, Step | None], None]  # moegen.pipeline's Progress
ReadPeak = Callable[[Plan], int]


class ReadFailed(Exception):
    """A read that failed for another reason than HBM (not a VerifyError: the ranking must
    not move on to the next trade, which would make the module depend on the failure)."""


def chooses_by_assignment(loaded: LoadedSpec, plan: Plan) -> bool:
    """Whether the build reads the spec's open trades by XLA's assignment: a TPU target whose
    plan trades on its own (FFN slices or token chunks the spec leaves out), fit_check
    `assigned`."""
    memory = loaded.spec.memory  # every shape's: variants change the batch and seq_len only
    if memory.fit_check != "assigned" or hardware(plan.hardware).platform != "tpu":
        return False
    return bool(every_shapes_own_trades(memory, plan))


def choose_reporting(loaded: LoadedSpec, ledger: Plan, note: Note) -> tuple[LoadedSpec, Plan]:
    """choose_own_trade, each read and the choice reported as steps of the spec, as
    --take-fitting-trade reports its own."""
    display = loaded.source.display
    start = time.perf_counter()

    def on_read(candidate: Candidate) -> None:
        step = read_step(candidate)
        note(display, step.step, step.seconds, step)

    def announce(count: int) -> None:
        words = f"up to {count} trades, fastest first, until one fits: {READ_TIME}"
        note(display, ANNOUNCED, 0.0, MemoryVerdict(ANNOUNCED, 0.0, words))

    chosen, plan, words = choose_own_trade(loaded, ledger, on_read, announce=announce)
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


def choose_own_trade(
    loaded: LoadedSpec,
    plan: Plan,
    on_read: OnRead,
    read_peak: ReadPeak | None = None,
    announce: Callable[[int], None] | None = None,
) -> tuple[LoadedSpec, Plan, str]:
    """The spec with its open trades set to the fastest that XLA fits (the source text
    unchanged: the spec leaves them to the build), its plan, and the words of the choice;
    `announce` is told how many trades may be read, before the first. SpecError, located at
    `memory`, where no libtpu can read, a read fails, or none fits."""
    if not module_installed("libtpu"):
        raise _refused(loaded, plan, f"XLA's buffer assignment needs libtpu: {LIBTPU_FIX}")
    memory = loaded.spec.memory
    open_fields = {p: "auto" for p in sorted(MEMORY_FIELDS) if getattr(memory, p[1]) is None}
    found = candidates(unchecked(loaded, open_fields))
    found += _ledger_trade(loaded, plan, open_fields, found)
    read = read_peak or assigned_peak  # looked up now: tests stand in for it
    if announce is not None:
        announce(sum(c.plan is not None for c in found))

    def strict(candidate_plan: Plan) -> int:
        try:
            return read(candidate_plan)
        except VerifyError as err:
            if OUT_OF_HBM in str(err):
                raise
            raise ReadFailed(str(err).strip().splitlines()[0][:300]) from None

    def reported(i: int, n: int, candidate: Candidate) -> None:
        if candidate.problem != NOT_READ and candidate.plan is not None:
            on_read(candidate)

    try:
        winner = choose_by_assignment(found, count_by_plan, float("inf"), reported, strict)
    except ReadFailed as err:
        raise _refused(loaded, plan, f"XLA's read of a trade failed: {err}") from None
    if winner is None or winner.loaded is None or winner.plan is None:
        raise _refused(loaded, plan, f"no trade fits by {READ_BY}")
    return winner.loaded, winner.plan, _chosen_words(winner, plan)


def _ledger_trade(
    loaded: LoadedSpec, plan: Plan, open_fields: dict[FieldPath, str], found: list[Candidate]
) -> list[Candidate]:
    """The ledger's own trade as a candidate too, where tune's counts do not hold it (its
    FFN slices can be any divisor of the width: 7, 11, 42 slices were chosen)."""
    trade = {("memory", "ffn_chunks"): plan.ffn.chunks}
    trade[("memory", "token_chunks")] = plan.experts.token_chunks
    choices = {path: trade[path] for path in open_fields}
    if any(c.choices == choices for c in found):
        return []
    return [candidate_of(loaded, choices)]


def _refused(loaded: LoadedSpec, plan: Plan, why: str) -> SpecError:
    own = " and ".join(every_shapes_own_trades(loaded.spec.memory, plan))
    message = (
        f"this TPU layer does not fit whole by the plan, which would run it in {own}; the "
        f"build chooses the trade by XLA's buffer assignment, and {why}. Write the trade "
        "(memory.ffn_chunks, memory.token_chunks), or memory.fit_check: plan to take the "
        "plan's own, chosen by its ledger."
    )
    return SpecError([loaded.diagnostic(("memory",), message)])


def _chosen_words(winner: Candidate, ledger: Plan) -> str:
    """The trade taken, XLA's figure, and what the ledger would have run."""
    assert winner.plan is not None
    granted = hardware(winner.plan.hardware).compiler_hbm_bytes_per_device
    taken = ", ".join(
        f"memory.{path[1]}: {yaml_value(value)}"
        for path, value in winner.choices.items()
        if path in MEMORY_FIELDS
    )
    return (
        f"{taken}: {READ_BY} {winner.peak_bytes / 2**30:.2f} GiB per device, of the "
        f"{granted / 2**30:.2f} GiB the compiler grants a program (the plan's ledger would "
        f"have run {_count(ledger.ffn.chunks, 'FFN slice')} x "
        f"{_count(ledger.experts.token_chunks, 'token chunk')})"
    )


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"
