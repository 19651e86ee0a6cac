"""Stage 5, verify: prove a rendered module before anything is written.

The logic lives in moegen.verify.verification; this package face only re-exports.
"""

from __future__ import annotations

from moegen.verify.messages import Step, VerifyReport
from moegen.verify.pool import allow_workers, stop_workers
from moegen.verify.preflight import MissingVerifier
from moegen.verify.record import VerifyCache
from moegen.verify.twin import TOLERANCES, TwinSpec, plan_twin, twin_of, twins_of
from moegen.verify.verdict import (
    CompilerCrashed,
    PlanDefect,
    VerifyError,
    memory_verdict,
    peak_bytes,
)
from moegen.verify.verification import OnStep, reference_config, tpu_target, verify

__all__ = [
    "CompilerCrashed",
    "MissingVerifier",
    "OnStep",
    "PlanDefect",
    "Step",
    "TOLERANCES",
    "TwinSpec",
    "VerifyCache",
    "VerifyError",
    "VerifyReport",
    "allow_workers",
    "memory_verdict",
    "peak_bytes",
    "plan_twin",
    "reference_config",
    "stop_workers",
    "tpu_target",
    "twin_of",
    "twins_of",
    "verify",
]
