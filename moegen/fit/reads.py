"""What the fit stage asks of the compiler, as a small protocol: verify supplies it.

The fit stage decides with the compiler's own memory figure where the plan's ledger cannot: whether
a layer the ledger refuses does fit, and which of the memory trades a spec leaves open is the
fastest that fits. Reading that figure means rendering the plan's module and compiling it for the
target, which are later stages (render, verify); so the fit stage takes the reader as an argument
(`CompilerReads`) and imports neither. moegen.verify.memory.xla_reads supplies XLA's buffer
assignment (seconds a program, the compiled peak to 0.003%); the pipeline hands it to the fit stage,
and tests and benchmarks hand in their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from moegen.hardware import hardware
from moegen.plan import Plan

READ_BY = "XLA's buffer assignment"
OUT_OF_HBM = "out of HBM"  # in a ReadError's message: the compiler's answer that it does not fit
# What the compiler's last HBM check adds to the assigned peak: the generated code (s0_041 of
# bench.population: assigned 15.74 GiB, refused at "15.77G of 15.75G"), a fraction of what
# the compiler grants a program (moegen.hardware: less than the HBM).
CODE_MARGIN = 0.01
KEPT = " (kept from an earlier read of the same programs)"


class ReadError(Exception):
    """A read that gave no figure: the compiler found the programs out of HBM (OUT_OF_HBM
    in the message: an answer) or the read failed (the first line says why)."""

    @property
    def out_of_hbm(self) -> bool:
        return OUT_OF_HBM in str(self)


class KeptPeak(int):
    """A peak read back from an earlier read of the same programs, not read now: the words
    that print it say so (KEPT)."""


@dataclass(frozen=True)
class CompilerReads:
    """The compiler's memory figure of a plan, and whether it can be read here.

    peak: the largest per-device peak of the full-size programs of every shape of the plan's
        module (a KeptPeak where every figure was read back); raises ReadError.
    missing: why no read can be made on this machine (what to install), or None.
    """

    peak: Callable[[Plan], int]
    missing: Callable[[], str | None]


def kept_words(peak: int) -> str:
    """KEPT where `peak` was read back, else nothing."""
    return KEPT if isinstance(peak, KeptPeak) else ""


def fits_by_assignment(plan: Plan, peak: int) -> bool:
    """Whether a read peak leaves the compiler's grant of HBM CODE_MARGIN to spare."""
    granted = hardware(plan.hardware).compiler_hbm_bytes_per_device
    return peak <= (1 - CODE_MARGIN) * granted
