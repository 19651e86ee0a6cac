"""One candidate of `moegen tune` (a value for each `auto` field) and what tuning found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moegen.load import FieldPath, LoadedSpec
from moegen.plan import Plan


@dataclass
class Candidate:
    choices: dict[FieldPath, Any]
    loaded: LoadedSpec | None = None  # the spec with these choices, when it is valid
    plan: Plan | None = None
    problem: str = ""  # why it was not scored ('' when it was)
    flops: float = 0.0
    bytes_accessed: float = 0.0
    peak_bytes: int = 0
    score: float = float("inf")  # seconds on TPU targets, bytes on cpu
    seconds: float = 0.0  # compile time
    counted_by: str = "compiler"  # whose FLOPs and bytes scored it: "compiler" or "plan"
    peak_by: str = "compiler"  # whose peak decided its fit: a full compile, or XLA's assignment


@dataclass
class TuneResult:
    candidates: list[Candidate]
    winner: Candidate | None
    unit: str  # "s" or "bytes"
    new_text: str
