"""The steps a worker would report for a job, with passing figures: what the verification-record
tests put in place of a real worker (moegen.verify.verification._run_worker) and forge records from."""

from __future__ import annotations

from moegen.verify.messages import (
    Compiled,
    Imported,
    Job,
    Lowered,
    Memory,
    ParityCase,
    Step,
    TwinParity,
)
from moegen.verify.records.evidence import expected_steps, least_kernel_calls


def passing_steps(job: Job, param_bytes: int) -> list[Step]:
    """Every step `job` expects, each with figures a fresh verification would pass."""
    twins = iter(job.twins)
    steps: list[Step] = []
    for name in expected_steps(job):
        if name == "import":
            steps.append(Imported(name, 0.5))
        elif name.startswith("twin parity"):
            steps.append(_parity(name, next(twins).reference["top_k"]))
        elif name.startswith("lower "):
            program = "forward" if name.startswith("lower forward ") else "forward+backward"
            calls = {"te_grouped_gemm_ffi": least_kernel_calls(job.cuda, program)}
            steps.append(Lowered(name, 1.0, job.cuda.sm, calls))
        else:
            memory = Memory(argument=param_bytes + 4096, output=4096, temp=1 << 20)
            steps.append(Compiled(name, 2.0, memory, 1e9, 1e8))
    return steps


def _parity(name: str, top_k: int) -> TwinParity:
    experts = top_k + 2
    tokens = tuple([3] * experts)
    random = ParityCase("random routing", 2e-7, tokens)
    starved = ParityCase("starved experts", 3e-7, (0, *tokens[1:]), starved_experts=(0,))
    return TwinParity(name, 1.5, (random, starved))
