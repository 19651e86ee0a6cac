"""The memory trade a TPU spec leaves to the plan, chosen by XLA's buffer assignment.

Where a spec leaves `memory.ffn_chunks` or `memory.token_chunks` out and the plan's ledger
trades (it does not fit the layer whole with TRADE_HEADROOM free), the ledger's count is an
estimate: on generated populations it is more than 10% off the compiled peak on about a third
of the programs (bench/LEDGER.md), so its trade leaves 30% of HBM free, and recomputes where
the layer whole fits (14 of the 24 population layers made too big: bench.defaults_fit). With
`memory.fit_check: assigned` (the default) the build instead ranks the trades the spec leaves
open by the plan's step time (moegen.plan.step_time), as `moegen tune` does, and reads XLA's
buffer assignment of each in that order (moegen.fit.reads, as moegen.verify.memory.xla_reads reads
it: the compiled peak to 0.0034% on every program measured, seconds a read); the first that
fits is the module's trade, and the build says so.

The same spec gives the same module on every machine: the read is made by the pinned libtpu,
in full (no time budget), and a read that fails for any reason but HBM stops the build rather
than move on to another trade. Without libtpu the build says what to install, or to write the
trade, rather than fall back to another module.
"""

from __future__ import annotations

from collections.abc import Callable

from moegen.diagnostics import SpecError
from moegen.fit.by_assignment import MEMORY_FIELDS, NOT_READ, choose_by_assignment
from moegen.fit.candidates import Candidate, candidate_of, candidates, trade_words, yaml_value
from moegen.fit.reads import READ_BY, CompilerReads, ReadError
from moegen.hardware import hardware
from moegen.load import FieldPath, LoadedSpec
from moegen.plan import Plan
from moegen.spec import Memory
from moegen.variants import unchecked

# What a read costs, said before the first: the forward and forward+backward programs
# assigned side by side (5.45 s for Qwen3-30B-A3B over 16 v5e chips; 25-60 s for DeepSeek-V3,
# Qwen3-235B and Jamba at batch 32), a kept read (moegen.verify.records.read_record) milliseconds.
ANNOUNCED = "memory: XLA's buffer assignment"  # the step that says reads are coming
READ_TIME = "about 5 s to a minute a read, the largest layers longest; a kept read milliseconds"
OnRead = Callable[[Candidate], None]


class ReadFailed(Exception):
    """A read that failed for another reason than HBM (not a ReadError: the ranking must
    not move on to the next trade, which would make the module depend on the failure)."""


def chooses_by_assignment(loaded: LoadedSpec, plan: Plan) -> bool:
    """Whether the build reads the spec's open trades by XLA's assignment: a TPU target whose
    plan trades on its own (FFN slices or token chunks the spec leaves out), fit_check
    `assigned`."""
    memory = loaded.spec.memory  # every shape's: variants change the batch and seq_len only
    if memory.fit_check != "assigned" or hardware(plan.hardware).platform != "tpu":
        return False
    return bool(every_shapes_own_trades(memory, plan))


def choose_own_trade(
    loaded: LoadedSpec,
    plan: Plan,
    reads: CompilerReads,
    on_read: OnRead,
    announce: Callable[[int], None] | None = None,
) -> tuple[LoadedSpec, Plan, str]:
    """The spec with its open trades set to the fastest that XLA fits (the source text
    unchanged: the spec leaves them to the build), its plan, and the words of the choice;
    `announce` is told how many trades may be read, before the first. SpecError, located at
    `memory`, where no libtpu can read, a read fails, or none fits."""
    missing = reads.missing()
    if missing is not None:
        raise _refused(loaded, plan, f"{READ_BY} needs {missing}")
    memory = loaded.spec.memory
    open_fields = {p: "auto" for p in sorted(MEMORY_FIELDS) if getattr(memory, p[1]) is None}
    found = candidates(unchecked(loaded, open_fields))
    found += _ledger_trade(loaded, plan, open_fields, found)
    if announce is not None:
        announce(sum(c.plan is not None for c in found))

    def strict(candidate_plan: Plan) -> int:
        try:
            return reads.peak(candidate_plan)
        except ReadError as err:
            if err.out_of_hbm:
                raise
            raise ReadFailed(str(err).strip().splitlines()[0][:300]) from None

    def reported(i: int, n: int, candidate: Candidate) -> None:
        if candidate.problem != NOT_READ and candidate.plan is not None:
            on_read(candidate)

    try:
        strict_reads = CompilerReads(strict, reads.missing)
        winner = choose_by_assignment(found, strict_reads, float("inf"), reported)
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
        f"have run {trade_words(ledger)})"
    )


def own_trades(memory: Memory, plan: Plan) -> list[str]:
    """The FFN slices and token chunks the plan chose on a TPU target where the spec leaves
    them to it (empty: none, or not a TPU target)."""
    if hardware(plan.hardware).platform != "tpu":
        return []
    own = []
    if memory.ffn_chunks is None and plan.ffn.chunks > 1:
        own.append(f"{plan.ffn.chunks} FFN slices")
    if memory.token_chunks is None and plan.experts.token_chunks > 1:
        own.append(f"{plan.experts.token_chunks} token chunks")
    return own


def every_shapes_own_trades(memory: Memory, plan: Plan) -> list[str]:
    """own_trades of the main shape and of each variant, a variant's named ("4 token chunks
    for long"): one memory section serves every shape."""
    return [
        trade + (f" for {name}" if name else "")
        for name, shape in plan.shape_plans()
        for trade in own_trades(memory, shape)
    ]


def own_trade_note(memory: Memory, plan: Plan) -> str:
    """Where, on a TPU target, the plan chose FFN slices or token chunks the spec leaves to
    it: that the choice rests on the plan's ledger (an estimate), and how to have it made by
    the compiler's own figure instead (moegen.fit.by_assignment)."""
    own = own_trades(memory, plan)
    if not own:
        return ""
    return (
        f"; {' and '.join(own)} chosen by the plan's memory ledger, an estimate (write "
        "memory.ffn_chunks: auto and memory.token_chunks: auto and run `moegen tune` to have "
        "them chosen by XLA's buffer assignment, in seconds a candidate)"
    )
