"""A verification record is evidence, not a verdict: its steps judged again, by the rules a
fresh verification applies.

`judge(job, plan, steps)` says why the recorded steps do not make a pass for this job, or
None when they do: every step the worker would report for the job, in its order and nothing
else (import; each twin, each routing case it runs; each program of each shape, compiled or
lowered), each parity figure under the twin's tolerance (`within_tolerance`, the worker's
own test), starved experts that received no token, lowered modules holding the kernel's
calls, compiled programs that are not out of memory and whose arguments hold at least the
parameters the plan stores on a device. The memory verdict against HBM is the caller's
(moegen.verify.memory.verdict), as for a fresh verification.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from moegen.kernels import CudaLowering, kernel
from moegen.verify.messages import (
    Compiled,
    CompilerOutOfMemory,
    CudaTarget,
    Job,
    Lowered,
    ParityCase,
    Step,
    TwinJob,
    TwinParity,
)

if TYPE_CHECKING:  # the worker imports this module: it needs no plan
    from moegen.plan import Plan


def within_tolerance(error: float, tolerance: float) -> bool:
    """The parity test: NaN fails (a plain `error > tolerance` would let it pass)."""
    return error < tolerance


def least_kernel_calls(want: CudaTarget, program: str) -> int:
    """The kernel's calls a lowered program must hold: one per grouped-matmul site forward;
    with the backward, as many per site as the kernel's registry entry says."""
    if program == "forward":
        return want.call_sites
    return want.call_sites * _lowering(want).calls_per_site


def _lowering(want: CudaTarget) -> CudaLowering:
    lowering = kernel(want.kernel).cuda_lowering
    assert lowering is not None  # only kernels lowered for CUDA make a CudaTarget
    return lowering


def expected_steps(job: Job) -> list[str]:
    """The names of the steps a worker reports for `job`, in order."""
    names = ["import"] if job.compile or job.cuda is None else []
    names += [_twin_step(twin) for twin in job.twins]
    for label in ("", *(f" ({v})" for v in job.variants)) if job.compile else ():
        for program in job.programs:
            if job.cuda is not None:
                names.append(f"lower {program} for cuda{label}")
            else:
                names.append(f"compile {program}{label}")
    return names


def _twin_step(twin: TwinJob) -> str:
    suffix = "" if twin.variant is None else f", {twin.variant}"
    return f"twin parity ({twin.label}{suffix})"


def judge(job: Job, plan: Plan, steps: Sequence[Step]) -> str | None:
    """Why `steps` are no pass for `job` (the first reason), or None."""
    names, expected = [s.step for s in steps], expected_steps(job)
    if names != expected:
        missing = [n for n in expected if n not in names]
        extra = [n for n in names if n not in expected]
        return (
            f"its steps are not this job's (missing {missing or 'none'}, "
            f"unexpected {extra or 'none'}{', or out of order' if not missing + extra else ''})"
        )
    twins = {_twin_step(twin): twin for twin in job.twins}
    for step in steps:
        if isinstance(step, TwinParity):
            problem = _twin_problem(step, twins[step.step])
        elif isinstance(step, Compiled | CompilerOutOfMemory):
            problem = _compiled_problem(step, _shape_plan(plan, step.step))
        elif isinstance(step, Lowered):
            problem = _lowered_problem(step, job)
        else:
            problem = None
        if problem:
            return f"{step.step}: {problem}"
    return None


def _twin_problem(step: TwinParity, twin: TwinJob) -> str | None:
    cases = {case.case: case for case in step.cases}
    if [c.case for c in step.cases][:1] != ["random routing"] or len(cases) != len(step.cases):
        return "no random-routing case first, or a case twice"
    experts = len(cases["random routing"].tokens_per_expert)
    want = {"random routing", "starved experts"} if experts > twin.reference["top_k"] else set()
    if set(cases) != (want or {"random routing"}):
        return f"cases {sorted(cases)}, expected {sorted(want or {'random routing'})}"
    for case in step.cases:
        problem = _case_problem(case, experts, twin.tolerance)
        if problem:
            return f"{case.case}: {problem}"
    return None


def _case_problem(case: ParityCase, experts: int, tolerance: float) -> str | None:
    if not within_tolerance(case.max_relative_error, tolerance):
        return f"relative error {case.max_relative_error:.3e} >= {tolerance:.0e}"
    if len(case.tokens_per_expert) != experts:
        return "tokens per expert of another expert count"
    starved = case.starved_experts or ()
    if (case.case == "starved experts") != bool(starved):
        return "starved experts named where none were starved, or none named"
    if any(e >= experts or case.tokens_per_expert[e] for e in starved):
        return f"starved experts {list(starved)} received tokens"
    return None


def _shape_plan(plan: Plan, step_name: str) -> Plan:
    return next((v.plan for v in plan.variants if step_name.endswith(f" ({v.name})")), plan)


def _compiled_problem(step: Compiled | CompilerOutOfMemory, plan: Plan) -> str | None:
    if isinstance(step, CompilerOutOfMemory):
        return "the compiler ran out of memory"
    parameters = plan.cost.param_bytes
    if step.memory.argument < parameters:
        return (
            f"arguments of {step.memory.argument} bytes per device cannot hold the "
            f"{parameters} bytes of parameters the plan stores there"
        )
    if (step.transfers is None) != (step.hidden_transfers is None) or (
        step.transfers is not None and step.hidden_transfers > step.transfers
    ):
        return "more ring transfers hidden than there are"
    return None


def _lowered_problem(step: Lowered, job: Job) -> str | None:
    want = job.cuda
    if want is None or step.sm != want.sm:
        return f"lowered for SM {step.sm}, the job's is {want.sm if want else 'none'}"
    lowering = _lowering(want)
    program = "forward" if step.step.startswith("lower forward ") else "forward+backward"
    least = least_kernel_calls(want, program)
    gemms = step.te_calls.get(lowering.custom_call, 0)
    if gemms < least:
        return f"{gemms} kernel calls, expected at least {least}"
    quantizes = sum(n for name, n in step.te_calls.items() if "grouped_quantize" in name)
    if lowering.quantizes and (want.quantization != "none") != (quantizes > 0):
        return f"quantization {want.quantization} but {quantizes} grouped quantize calls"
    return None
