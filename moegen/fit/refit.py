"""`moegen build --take-fitting-trade`: where a TPU layer runs out of HBM as planned (or its
full-size compile crashes the compiler), take the plan's fastest other memory trade that
XLA's buffer assignment fits, and write it into the spec.

Without the flag a layer out of HBM (by XLA's read before any twin, or by the full-size
compile) is refused, and the error offers the plan's next candidates. With it, the plan's
other trades (FFN slices x token chunks, as `moegen tune` lists them with both fields
`auto`) are ranked by the plan's step time and read by XLA's assigned peak in that order
(moegen.fit.by_assignment): the first that fits is taken. The trade that failed is not read again.
The trade is written into the spec text (moegen.fit.spec_edit), every other byte kept, so that the
spec alone says what the committed module runs; the build then verifies that spec as any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from moegen.diagnostics import SpecError
from moegen.fit.by_assignment import FIT_CHECK, NOT_READ, PROVED, choose_by_assignment
from moegen.fit.candidates import Candidate, candidates, trade_words, yaml_value
from moegen.fit.reads import OUT_OF_HBM, READ_BY, CompilerReads
from moegen.fit.spec_edit import CannotEdit, with_memory_fields
from moegen.hardware import hardware
from moegen.load import FieldPath, LoadedSpec
from moegen.plan import Plan
from moegen.validate import validate
from moegen.variants import unchecked

TRADES: dict[FieldPath, str] = {
    ("memory", "ffn_chunks"): "auto",
    ("memory", "token_chunks"): "auto",
}
BUDGET_S = 240.0  # moegen tune's default: reads stop being started after it
OnRead = Callable[[Candidate], None]  # each trade read, as it is decided
# What an out-of-HBM error offers last: taking another trade (moegen.fit.refit) strips it.
TAKE_OFFER = (
    "Or build with --take-fitting-trade: it reads the plan's other memory trades by XLA's "
    "buffer assignment, fastest first, and writes the first that fits into the spec."
)


def take_fitting_trade(
    loaded: LoadedSpec,
    failed: Plan,
    failure: Exception,
    reads: CompilerReads,
    on_read: OnRead = lambda candidate: None,
    *,
    crashed: bool = False,
) -> tuple[LoadedSpec, str]:
    """The spec with the fastest memory trade XLA fits written in, and the words of the
    choice; raises `failure` (with why no trade was taken) where none is, where no read can
    be made here, or where the target is not a TPU. `failed`: the plan that ran out of HBM
    (its trade is not read again). `failure`: a SpecError, or an exception made of its
    message alone (verify's), which is raised again with the words added; `crashed`: it is a
    compiler crash, not HBM."""
    if hardware(loaded.spec.target.hardware).platform != "tpu":
        raise _with_words(failure, "--take-fitting-trade reads trades on TPU targets only")
    try:
        found = [c for c in candidates(unchecked(loaded, TRADES)) if not _same_trade(c, failed)]
    except SpecError:
        raise _with_words(failure, "the spec admits no other memory trade") from None
    planned = [c for c in found if c.plan is not None and c.loaded is not None]
    if not planned:
        raise _with_words(failure, "the spec admits no other memory trade")
    missing = reads.missing()
    if missing is not None:
        raise _with_words(failure, f"{READ_BY} needs {missing}")

    def reported(i: int, n: int, candidate: Candidate) -> None:
        if candidate.problem != NOT_READ and candidate.plan is not None:
            on_read(candidate)

    winner = choose_by_assignment(found, reads, BUDGET_S, reported)
    if winner is None:
        raise _with_words(failure, _none_fits(planned))
    values = {path: value for path, value in winner.choices.items() if path[0] == "memory"}
    try:
        taken = validate(with_memory_fields(loaded, values))  # as load_valid: what is built
    except CannotEdit:
        by_hand = ", ".join(f"memory.{path[1]}: {yaml_value(v)}" for path, v in values.items())
        message = (
            f"{trade_text(winner)} fits by {READ_BY} ({winner.peak_bytes / 2**30:.2f} GiB), "
            f"but moegen cannot write it into this spec's layout; write it by hand: {by_hand}"
        )
        raise SpecError([loaded.diagnostic(("memory",), message)]) from None
    return taken, _taken_words(winner, failed, crashed)


def trade_text(candidate: Candidate) -> str:
    """The memory choices of a candidate as they are written in the spec."""
    return ", ".join(
        f"memory.{path[1]}: {yaml_value(value)}"
        for path, value in candidate.choices.items()
        if path[0] == "memory" and path != FIT_CHECK
    )


def _same_trade(candidate: Candidate, failed: Plan) -> bool:
    """Whether the candidate runs every shape in the slices and chunks that ran out."""
    if candidate.plan is None:
        return False
    pairs = [(s.ffn.chunks, s.experts.token_chunks) for _, s in candidate.plan.shape_plans()]
    return pairs == [(s.ffn.chunks, s.experts.token_chunks) for _, s in failed.shape_plans()]


def _none_fits(planned: list[Candidate]) -> str:
    """Why none of the trades read fits: each trade's fate, counted, the lowest peak read."""
    read = [c for c in planned if c.peak_bytes]
    proved = [c for c in planned if c.problem == PROVED]
    fates = {
        f"do not fit by {READ_BY}": [
            c for c in planned if c.peak_bytes or (OUT_OF_HBM in c.problem and c not in proved)
        ],
        "proved out of HBM by the plan": proved,
        "not read in the budget": [c for c in planned if "budget ran out" in c.problem],
    }
    told = {id(c) for found in fates.values() for c in found}
    fates["with no figure"] = [c for c in planned if id(c) not in told]
    counted = ", ".join(f"{len(found)} {fate}" for fate, found in fates.items() if found)
    said = f"none of the plan's {len(planned)} other trades fits: {counted}"
    if read:
        lowest = min(read, key=lambda c: c.peak_bytes)
        said += f" (lowest read: {trade_text(lowest)}, {lowest.peak_bytes / 2**30:.2f} GiB)"
    unread = fates["with no figure"]
    if unread:
        said += f" (first with no figure: {unread[0].problem.splitlines()[0][:200]})"
    return said


def _taken_words(winner: Candidate, failed: Plan, crashed: bool) -> str:
    assert winner.plan is not None
    fate = "crashed the compiler" if crashed else "ran out of HBM"
    granted = hardware(winner.plan.hardware).compiler_hbm_bytes_per_device
    fit_check = (
        " (and memory.fit_check: compile: the plan's ledger alone would refuse it)"
        if FIT_CHECK in winner.choices
        else ""
    )
    return (
        f"the plan's {trade_words(failed)} {fate}; took "
        f"{trade_text(winner)}{fit_check}: {READ_BY} {winner.peak_bytes / 2**30:.2f} GiB per "
        f"device, of the {granted / 2**30:.2f} GiB the compiler grants a program; written "
        "into the spec"
    )


def _with_words(failure: Exception, words: str) -> Exception:
    """The failure, its message extended by why --take-fitting-trade took no trade."""
    said = f"--take-fitting-trade took no trade: {words}."
    if isinstance(failure, SpecError):
        first, *rest = failure.diagnostics
        message = first.message.replace(TAKE_OFFER, said)
        if said not in message:
            message = f"{message.rstrip()} {said}"
        return SpecError([replace(first, message=message), *rest])
    message = str(failure).replace(TAKE_OFFER, said)
    return type(failure)(message if said in message else f"{message}\n{said}")
