"""Stage 6, verify: prove a rendered module before anything is written.

The logic lives in moegen.verify.verification (the steps), moegen.verify.memory.assigned (XLA's
buffer assignment, which moegen.verify.memory.xla_reads hands the fit stage) and the modules they
name; this package face only re-exports.
"""

from __future__ import annotations

from moegen.verify.describe import describe_step
from moegen.verify.memory.assigned import (
    assigned_memory,
    assigned_peak,
    whole_layer,
    whole_layer_text,
    whole_layer_verdict,
)
from moegen.verify.memory.verdict import (
    CompilerCrashed,
    OutOfHbm,
    PlanDefect,
    VerifyError,
    memory_verdict,
    peak_bytes,
)
from moegen.verify.memory.xla_reads import XLA_READS
from moegen.verify.messages import (
    PROGRAMS,
    Compiled,
    Imported,
    MemoryVerdict,
    Reused,
    Step,
    VerifyReport,
)
from moegen.verify.preflight import LIBTPU_FIX, MissingVerifier, require_verifiers
from moegen.verify.records.record import VerifyCache, caching_off
from moegen.verify.twin import TOLERANCES, TwinSpec, plan_twin, twin_of, twins_of
from moegen.verify.verification import OnStep, reference_config, tpu_target, verify
from moegen.verify.worker.heartbeat import enabled as heartbeat_enabled
from moegen.verify.worker.heartbeat import interval_from_env as heartbeat_interval
from moegen.verify.worker.pool import allow_workers, stop_workers

__all__ = [
    "LIBTPU_FIX",
    "PROGRAMS",
    "TOLERANCES",
    "XLA_READS",
    "Compiled",
    "CompilerCrashed",
    "Imported",
    "MemoryVerdict",
    "MissingVerifier",
    "OnStep",
    "OutOfHbm",
    "PlanDefect",
    "Reused",
    "Step",
    "TwinSpec",
    "VerifyCache",
    "VerifyError",
    "VerifyReport",
    "allow_workers",
    "assigned_memory",
    "assigned_peak",
    "caching_off",
    "describe_step",
    "heartbeat_enabled",
    "heartbeat_interval",
    "memory_verdict",
    "peak_bytes",
    "plan_twin",
    "reference_config",
    "require_verifiers",
    "stop_workers",
    "tpu_target",
    "twin_of",
    "twins_of",
    "verify",
    "whole_layer",
    "whole_layer_text",
    "whole_layer_verdict",
]
