"""Before any twin runs: is what the target's verification needs installed here?

A TPU target compiles on libtpu's compile-only devices, a `te` kernel lowers through
Transformer Engine, a `tokamax` kernel through tokamax; without them verification would fail
only after the twins, minutes in.
This looks them up (package metadata and the import system; nothing is imported) and
reports each one missing at the spec's line that asks for it, with the command that fixes it.
"""

from __future__ import annotations

import importlib.util

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.plan import Plan
from moegen.verify import cuda
from moegen.verify.verdict import VerifyError

LIBTPU_PIN = "libtpu==0.0.51"
LIBTPU_FIX = f"pip install 'moegen[tpu]' ({LIBTPU_PIN}), or `make setup` in a moegen checkout"
TE_FIX = "`make te` (scripts/install-te .venv) in a moegen checkout"


class MissingVerifier(VerifyError):
    """What verification of a target needs is not installed: located, with the fix."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = diagnostics
        super().__init__("\n".join(d.text() for d in diagnostics))


def module_installed(name: str) -> bool:
    """Whether `name` can be imported here (a seam: tests fake a missing libtpu with it)."""
    return importlib.util.find_spec(name) is not None


def missing_te() -> list[str]:
    """What keeps Transformer Engine from loading (moegen.verify.cuda; a seam for tests)."""
    return cuda.missing_te()


def missing_tokamax() -> list[str]:
    """What keeps kernel tokamax from lowering (moegen.verify.cuda; a seam for tests)."""
    return cuda.missing_tokamax()


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
    te = plan.kernel.te
    if compiles and te is not None and te.cuda_sm is not None:
        missing = missing_te()
        if missing:
            problems.append(
                loaded.diagnostic(
                    ("target", "kernel"),
                    f"kernel te: missing: {'; '.join(missing)}. Run {TE_FIX}; "
                    f"otherwise: {cuda.TE_INSTALL_HINT}",
                )
            )
    if compiles and plan.kernel.tokamax is not None:
        missing = missing_tokamax()
        if missing:
            problems.append(
                loaded.diagnostic(
                    ("target", "kernel"),
                    f"kernel tokamax: missing: {'; '.join(missing)}. {cuda.TOKAMAX_INSTALL_HINT}",
                )
            )
    return problems


def require_verifiers(checks: list[tuple[LoadedSpec, Plan]], *, compiles: bool = True) -> None:
    """Raise MissingVerifier with every problem of every (spec, plan) before any work."""
    problems = [
        p for loaded, plan in checks for p in preflight_problems(loaded, plan, compiles=compiles)
    ]
    if problems:
        raise MissingVerifier(problems)
