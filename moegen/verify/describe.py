"""One line of figures for each verification step, as `moegen build` and `moegen plan
--compile` print it beside the step's name and time."""

from __future__ import annotations

from moegen.verify.messages import (
    Compiled,
    Lowered,
    MemoryVerdict,
    RecordIgnored,
    Reused,
    Step,
    TwinParity,
)


def describe_step(step: Step | None) -> str:
    """One line for a verification step's figures."""
    if isinstance(step, Reused):
        when = step.verified_at.replace("T", " ")[:16]
        return f"(verified {when}, reused: {step.reason}; --reverify to run it again)"
    if isinstance(step, RecordIgnored):
        return f"(a record was there: {step.reason}; verifying again)"
    if isinstance(step, TwinParity):
        return "; ".join(
            f"{c.case}: max rel err {c.max_relative_error:.1e}"
            + (
                f", {len(c.starved_experts)} experts got 0 tokens"
                if c.starved_experts is not None
                else ""
            )
            + (f", {c.dropped} copies dropped" if c.dropped else "")
            for c in step.cases
        )
    if isinstance(step, MemoryVerdict):
        return step.verdict
    if isinstance(step, Lowered):
        calls = ", ".join(f"{name} x{n}" for name, n in step.te_calls.items())
        return f"SM {step.sm / 10:.1f}: {calls}"
    if isinstance(step, Compiled):
        mib = {k: v / 2**20 for k, v in step.memory.to_json().items()}
        text = (
            f"per device: args {mib['argument']:.1f} MiB, out {mib['output']:.1f} MiB, "
            f"temp {mib['temp']:.1f} MiB"
        )
        if step.transfers is not None:
            text += (
                f"; {step.hidden_transfers} of {step.transfers} ring transfers "
                "overlap a grouped matmul"
            )
        if step.flops:
            text += f"; {step.flops:.3e} FLOPs, {step.bytes_accessed:.3e} bytes"
        coll = step.collectives
        if coll and coll.total:
            text += (
                f"; collectives {coll.total}: {coll.hidden} with compute inside, "
                f"{coll.exposed} exposed"
            )
        return text
    return ""  # import, and a compiler's refusal (the verdict that follows says it all)
