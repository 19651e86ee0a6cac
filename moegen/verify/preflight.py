"""Before any twin runs: is what the target's verification needs installed here?

A TPU target compiles on libtpu's compile-only devices, and a kernel lowered for CUDA through
the package its registry entry names (moegen.kernels: Kernel.preflight); without them
verification would fail only after the twins, minutes in.
This looks them up (package metadata and the import system; nothing is imported) and
reports each one missing at the spec's line that asks for it, with the command that fixes it.
"""

from __future__ import annotations

import importlib.util

from moegen import pins
from moegen.diagnostics import Diagnostic
from moegen.hardware import hardware
from moegen.kernels import KERNELS, kernel
from moegen.load import LoadedSpec
from moegen.plan import Plan
from moegen.strategies import sharding_strategies, strategy
from moegen.verify.memory.verdict import VerifyError

LIBTPU_PIN = f"libtpu=={pins.LIBTPU}"
LIBTPU_FIX = f"pip install 'moegen[tpu]' ({LIBTPU_PIN}), or `make setup` in a moegen checkout"


class MissingVerifier(VerifyError):
    """What verification of a target needs is not installed: located, with the fix."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = diagnostics
        super().__init__("\n".join(d.text() for d in diagnostics))


def module_installed(name: str) -> bool:
    """Whether `name` can be imported here (a seam: tests fake a missing libtpu with it)."""
    return importlib.util.find_spec(name) is not None


def preflight_problems(
    loaded: LoadedSpec, plan: Plan, *, compiles: bool = True
) -> list[Diagnostic]:
    """Located problems that would make verification of `plan` fail for want of a package."""
    problems = []
    if compiles and plan.mesh.tpu_topology_name is not None and not module_installed("libtpu"):
        problems.append(
            loaded.diagnostic(
                ("target", "hardware"),
                f"compiling for {loaded.spec.target.hardware} needs libtpu, which is not "
                f"installed here: {LIBTPU_FIX}",
            )
        )
    chosen = kernel(plan.kernel.name)
    on_gpu = hardware(loaded.spec.target.hardware).platform == "gpu"
    if compiles and chosen.preflight is not None and on_gpu:
        missing = chosen.preflight.missing()
        if missing:
            problems.append(
                loaded.diagnostic(
                    ("target", "kernel"),
                    f"kernel {chosen.name}: missing: {'; '.join(missing)}. {chosen.preflight.fix}",
                )
            )
    if compiles and on_gpu:
        problems += _compiled_on_cpu_problems(loaded, plan)
    return problems


def _compiled_on_cpu_problems(loaded: LoadedSpec, plan: Plan) -> list[Diagnostic]:
    """A GPU module whose kernel is not lowered for CUDA is compiled with XLA:CPU to verify
    it (moegen.verify.verification): a collective XLA:CPU lacks cannot compile there, and
    would fail only after the twins, as an XLA error."""
    chosen = strategy(plan.experts.strategy)
    lacking = chosen.emulated_on_cpu and not plan.experts.emulates_collective
    if kernel(plan.kernel.name).cuda_lowering is not None or not lacking:
        return []
    lowered = [name for name, k in KERNELS.items() if k.cuda_lowering is not None]
    others = [n for n in sharding_strategies() if not strategy(n).emulated_on_cpu]
    return [
        loaded.diagnostic(
            ("parallelism", "experts"),
            f"verifying {chosen.name} on {loaded.spec.target.hardware} with kernel "
            f"{plan.kernel.name} compiles the full-size layer with XLA:CPU, which has no "
            f"{chosen.name} collective; use a kernel lowered for CUDA ({' or '.join(lowered)}), "
            f"or {' or '.join(others)}, or build with --no-verify (nothing verified)",
        )
    ]


def require_verifiers(checks: list[tuple[LoadedSpec, Plan]], *, compiles: bool = True) -> None:
    """Raise MissingVerifier with every problem of every (spec, plan) before any work."""
    problems = [
        p for loaded, plan in checks for p in preflight_problems(loaded, plan, compiles=compiles)
    ]
    if problems:
        raise MissingVerifier(problems)
