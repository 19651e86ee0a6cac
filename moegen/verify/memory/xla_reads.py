"""The fit stage's reader of the compiler's memory figure (moegen.fit.reads), made by XLA's
buffer assignment of the full-size programs (moegen.verify.memory.assigned: seconds a program, the
compiled peak to 0.003%, kept reads read back).

The fit stage comes before render and verify, so it is handed this reader (by the pipeline,
tune and the CLI) rather than importing it. Both seams are looked up when a read is made,
so a test stands in for the read (`assigned.assigned_peak`) or for a missing libtpu
(`preflight.module_installed`) in one place.
"""

from __future__ import annotations

from moegen.fit import CompilerReads, ReadError
from moegen.plan import Plan
from moegen.verify import preflight
from moegen.verify.memory import assigned
from moegen.verify.memory.verdict import VerifyError


def assigned_peak_or_read_error(plan: Plan) -> int:
    """XLA's assigned peak of every shape of `plan`'s module; ReadError where the compiler
    refuses it (out of HBM) or the read fails."""
    try:
        return assigned.assigned_peak(plan)
    except VerifyError as err:
        raise ReadError(str(err)) from None


def libtpu_missing() -> str | None:
    """What to install where libtpu, which makes the read, is not here."""
    if preflight.module_installed("libtpu"):
        return None
    return f"libtpu: {preflight.LIBTPU_FIX}"


XLA_READS = CompilerReads(peak=assigned_peak_or_read_error, missing=libtpu_missing)
