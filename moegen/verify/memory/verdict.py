"""The memory verdict: the compiled per-device peaks against the chip's HBM, in words.

A compiler out-of-memory is one of two failures, told apart by the compiler's own error
(moegen.verify.memory.compiler_errors): the layer does not fit HBM, which the spec can change (the
verdict names the plan's largest buffers and what to change), or a kernel's tiles do not fit
its scoped VMEM, which is the plan's defect: the plan chose the tiles (or admitted pinned ones)
against a VMEM budget the compiler does not grant, and HBM advice would send the user after
the wrong memory.
"""

from __future__ import annotations

from collections.abc import Mapping

from moegen.fit import TAKE_OFFER
from moegen.hardware import hardware
from moegen.plan import Plan
from moegen.verify.memory.compiler_errors import KERNEL_ROLES
from moegen.verify.messages import Compiled, CompilerOutOfMemory, VerifyReport


class VerifyError(Exception):
    """The rendered module failed a verification step."""


class OutOfHbm(VerifyError):
    """A full-size program does not fit the target's HBM (the compiler's figure said)."""


class CompilerCrashed(VerifyError):
    """A compiler stopped on a failed internal check (moegen.verify.memory.compiler_errors): a
    defect of the pinned compiler, not of the spec; another memory trade compiles another
    program."""


class PlanDefect(VerifyError):
    """The spec is valid and the module right, but the plan chose what the target cannot
    build: a defect in moegen, reported as such rather than as the user's problem."""


def peak_bytes(memory: Mapping[str, int]) -> int:
    """Per-device peak of a compiled program: what XLA must hold at once."""
    return memory["argument"] + memory["output"] + memory["temp"] - memory["alias"]


def memory_verdict(plan: Plan, report: VerifyReport) -> str | None:
    """Compiled peaks against the device's HBM (None on targets without fixed memory).

    Raises VerifyError naming the largest buffers and what to change when one does not fit,
    and PlanDefect when a kernel's tiles do not fit its scoped VMEM.
    """
    hbm = plan.memory.hbm_bytes_per_device
    if not hbm:
        return None
    for step in report.steps:
        if isinstance(step, CompilerOutOfMemory):
            if step.memory_space == "vmem":
                raise vmem_defect(plan, step)
            raise OutOfHbm(
                f"{step.step.removeprefix('compile ')} does not fit {plan.hardware} "
                f"{plan.mesh.topology}; the TPU compiler says:\n  {step.oom}\n{_hbm_advice(plan)}"
            )
    compiled = [s for s in report.steps if isinstance(s, Compiled)]
    if not compiled:  # lowered for CUDA: nothing compiled to measure, only the plan
        return (
            f"not compiled here (lowered for CUDA only); plan estimate: forward "
            f"{plan.memory.forward_peak / 2**30:.2f}, forward+backward "
            f"{plan.memory.train_peak / 2**30:.2f} GiB of {hbm / 2**30:.2f} GiB HBM per device"
        )
    for step in compiled:
        mem = step.memory
        if mem.peak <= hbm:
            continue
        raise OutOfHbm(
            f"{step.step.removeprefix('compile ')} does not fit {plan.hardware} "
            f"{plan.mesh.topology}: {mem.peak / 2**30:.2f} GiB per device "
            f"(arguments {mem.argument / 2**30:.2f}, outputs {mem.output / 2**30:.2f}, "
            f"temporaries {mem.temp / 2**30:.2f}) > {hbm / 2**30:.2f} GiB HBM.\n"
            f"{_hbm_advice(plan)}"
        )
    peaks = ", ".join(
        f"{s.step.removeprefix('compile ')} {s.memory.peak / 2**30:.2f} GiB" for s in compiled
    )
    return (
        f"fits: {peaks} of {hbm / 2**30:.2f} GiB HBM per device "
        f"(plan estimate: forward {plan.memory.forward_peak / 2**30:.2f}, "
        f"forward+backward {plan.memory.train_peak / 2**30:.2f} GiB)"
    )


def _hbm_advice(plan: Plan) -> str:
    largest = "; ".join(f"{name} {size / 2**30:.2f} GiB" for name, size in plan.memory.ledger[:4])
    slices = [
        f"memory.ffn_chunks: {o.chunks} ({o.train_peak / 2**30:.2f} GiB planned)"
        for o in plan.ffn.chunk_options
        if o.chunks > plan.ffn.chunks and o.train_peak < plan.memory.train_peak
    ][:2]
    return (
        f"The plan estimated forward {plan.memory.forward_peak / 2**30:.2f}, forward+backward "
        f"{plan.memory.train_peak / 2**30:.2f} GiB per device; largest buffers by the plan: "
        f"{largest}.\n"
        + _next_candidates(plan)
        + f"{TAKE_OFFER}\n"
        + "To fit: shard parameters over more devices (a larger fsdp axis), shorten the "
        "per-device batch (shapes.batch or seq_len, or more batch shards), store parameters "
        "in bfloat16, "
        + (f"run the FFN in slices ({' or '.join(slices)}), " if slices else "")
        + "or pick a larger slice or a generation with more HBM."
    )


def _next_candidates(plan: Plan) -> str:
    """The plan's next token chunk counts (more chunks than the layer runs), planned lower
    than the layer that ran out: the first thing to try, since it changes no shape."""
    current = max(plan.memory.train_peak, plan.memory.forward_peak)
    found = [
        f"memory.token_chunks: {o.chunks} ({max(o.train_peak, o.forward_peak) / 2**30:.2f} GiB "
        "planned)"
        for o in plan.chunk_candidates.token_chunks
        if o.chunks > plan.experts.token_chunks and max(o.train_peak, o.forward_peak) < current
    ][:2]
    if not found:
        return ""
    return (
        f"Next candidates of the plan: {' or '.join(found)}; or set memory.token_chunks: auto "
        "and memory.ffn_chunks: auto and run moegen tune SPEC, which reads XLA's buffer "
        "assignment of each trade (seconds each) and writes the fastest that fits into the "
        "spec.\n"
    )


def vmem_defect(plan: Plan, step: CompilerOutOfMemory) -> PlanDefect:
    """The words for a kernel whose tiles the compiler cannot fit in scoped VMEM."""
    program = step.step.removeprefix("compile ")
    call = KERNEL_ROLES.get(step.call or "", "a kernel the compiler does not name")
    tiles = plan.kernel.tiles
    pinned = (
        [f"{name} {list(tile)}" for name, tile in zip(("gate_up", "down"), tiles, strict=True)]
        if tiles
        else []
    )
    budget = hardware(plan.hardware).vmem_bytes_for_tiles / 2**20
    if pinned:
        change = (
            f"The tiles are {' and '.join(pinned)} (rows, contraction, output), within the "
            f"{budget:.0f} MiB of scoped VMEM the plan allows a kernel's tiles. To build "
            "meanwhile, pin smaller tiles in target.tiles: a smaller contraction or output "
            "tile (a multiple of 128) for the projection of that call."
        )
    else:  # no megablox tiles: XLA's own kernels (moegen pins nothing there)
        change = f"The layer runs kernel {plan.kernel.name}, for which moegen pins no tiles."
    return PlanDefect(
        f"{program} does not compile for {plan.hardware} {plan.mesh.topology}: the kernel tiles "
        "do not fit the chip's scoped VMEM (a kernel's working memory, not the layer's HBM); "
        f"the TPU compiler says:\n  {step.oom}\n"
        f"The call: {call}. {change}\n"
        "This is a defect in moegen's plan, not in the spec: please report it with the spec."
    )
