"""Stage 4, fit: the plan against the target's HBM, and the memory trades chosen to fit it.

load -> validate -> plan -> fit -> render -> verify -> emit. The plan's ledger estimates what
a layer holds; where it cannot tell (or a TPU spec leaves its memory trade open) the fit
stage asks the compiler's own figure through a reader it is handed (moegen.fit.reads:
moegen.verify.memory.xla_reads supplies XLA's buffer assignment), so it imports no later stage.
It refuses what cannot fit (fitting), chooses the trade a spec leaves open (own_trade),
takes another where a layer runs out of HBM (refit, writing it into the spec: spec_edit),
and ranks and reads the candidates of those and of `moegen tune` (candidates,
by_assignment). The logic lives in those modules; this package face only re-exports.
"""

from __future__ import annotations

from moegen.fit.by_assignment import (
    FIT_CHECK,
    MEMORY_FIELDS,
    NOT_READ,
    PROVED,
    by_assignment,
    choose_by_assignment,
)
from moegen.fit.candidates import (
    Candidate,
    TuneResult,
    candidate_of,
    candidates,
    choice_values,
    count_by_plan,
    loops,
    set_score,
    yaml_value,
)
from moegen.fit.fitting import READ_LATER, UnfitSpec, fit_notes, fitting_plan, plan_changed
from moegen.fit.own_trade import (
    ANNOUNCED,
    READ_TIME,
    choose_own_trade,
    chooses_by_assignment,
    every_shapes_own_trades,
    own_trade_note,
    own_trades,
)
from moegen.fit.reads import (
    CODE_MARGIN,
    KEPT,
    OUT_OF_HBM,
    READ_BY,
    CompilerReads,
    KeptPeak,
    ReadError,
    fits_by_assignment,
    kept_words,
)
from moegen.fit.refit import TAKE_OFFER, take_fitting_trade, trade_text
from moegen.fit.refusal import COMPILE_DECIDES, fit_problems
from moegen.fit.refusal_read import (
    RefusalRead,
    planned_over_hbm,
    read_before_refusing,
    read_has_a_say,
)
from moegen.fit.spec_edit import CannotEdit, with_memory_fields

__all__ = [
    "ANNOUNCED",
    "CODE_MARGIN",
    "COMPILE_DECIDES",
    "FIT_CHECK",
    "KEPT",
    "MEMORY_FIELDS",
    "NOT_READ",
    "OUT_OF_HBM",
    "PROVED",
    "READ_BY",
    "READ_LATER",
    "READ_TIME",
    "TAKE_OFFER",
    "CannotEdit",
    "Candidate",
    "CompilerReads",
    "KeptPeak",
    "ReadError",
    "RefusalRead",
    "TuneResult",
    "UnfitSpec",
    "by_assignment",
    "candidate_of",
    "candidates",
    "choice_values",
    "choose_by_assignment",
    "choose_own_trade",
    "chooses_by_assignment",
    "count_by_plan",
    "every_shapes_own_trades",
    "fit_notes",
    "fit_problems",
    "fits_by_assignment",
    "fitting_plan",
    "kept_words",
    "loops",
    "own_trade_note",
    "own_trades",
    "plan_changed",
    "planned_over_hbm",
    "read_before_refusing",
    "read_has_a_say",
    "set_score",
    "take_fitting_trade",
    "trade_text",
    "with_memory_fields",
    "yaml_value",
]
