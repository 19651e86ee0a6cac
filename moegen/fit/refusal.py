"""Does the planned layer fit the target's HBM? A spec the plan proves cannot fit is refused
here, located, before any twin runs or any compile starts, with what would fit instead: the
FFN slice counts, the largest batch and the larger mesh axes whose plans fit.

The refusal is the plan's, so it allows for the plan's own error in the direction that could
make a refusal wrong (moegen.plan.headroom); a spec the plan says only just fits, or just
misses, goes on to the compile, whose memory verdict decides (moegen.verify.memory.verdict). On a
TPU target the build asks XLA's buffer assignment first, where the plan refuses on its
ledger's word or puts the layer over HBM at all (moegen.fit.refusal_read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from moegen.diagnostics import Diagnostic
from moegen.hardware import hardware
from moegen.load import FieldPath, LoadedSpec, shape_variants
from moegen.plan import (
    MEASURED_OVERESTIMATE,
    REFUSAL_OVERESTIMATE,
    Plan,
    cannot_fit,
    peak,
    proved_unfit,
)
from moegen.spec import Shapes

# The plan of the spec with some fields changed (and no shape variants), validated: None
# when the changed spec breaks a rule. The caller supplies it (moegen.fit.fitting.plan_changed).
PlanWith = Callable[[LoadedSpec, Mapping[FieldPath, Any]], Plan | None]

# What a refusal by the ledger's word alone offers, unless XLA's own figure has spoken
# (moegen.fit.refusal_read: on a TPU target the build reads it before refusing).
COMPILE_DECIDES = "; memory.fit_check: compile lets the full-size compile decide"
# Plans made to find the largest batch that fits: a binary search over multiples of the batch
# shards takes log2(batch / shards) of them (a few ms each), so 24 cover any batch moegen
# accepts and keep a refusal well under a second.
MAX_BATCH_PLANS = 24
MESH_FACTORS = (2, 4)  # an axis this many times larger, on the slice that has the devices
MAX_SUGGESTED = 3  # of each kind of change


def fit_problems(loaded: LoadedSpec, plan: Plan, plan_with: PlanWith) -> list[Diagnostic]:
    """One located diagnostic per shape (the main one, each variant) whose plan says it cannot
    fit the target's HBM; `plan_with` plans a derived spec (a smaller batch, a larger mesh) to
    name what would fit."""
    shapes = [(loaded, plan, None)]
    for (name, variant), planned in zip(shape_variants(loaded), plan.variants, strict=True):
        shapes.append((variant, planned.plan, name))
    out = []
    for shape, shape_plan, variant_name in shapes:
        problem = _shape_problem(shape, shape_plan, plan_with, variant_name)
        if problem:
            out.append(problem)
    return out


def _fits(plan: Plan) -> bool:
    return peak(plan) <= plan.memory.hbm_bytes_per_device


def _shape_problem(
    loaded: LoadedSpec, plan: Plan, plan_with: PlanWith, variant: str | None
) -> Diagnostic | None:
    """The diagnostic of one shape (`variant`: its name; None for the main one)."""
    spec = loaded.spec
    if not cannot_fit(plan, compile_decides=spec.memory.fit_check == "compile"):
        return None
    slices = _fitting_slices(plan)
    batch = _largest_batch(loaded, plan, plan_with)
    meshes = _larger_meshes(loaded, plan_with)
    batch_field = f"shapes.variants.{variant}.batch" if variant else "shapes.batch"
    message = _refusal(plan) + _would_fit(
        slices, batch and (batch_field, *batch), meshes, _fitting_token_chunks(plan)
    )
    if spec.memory.ffn_chunks is not None and slices:  # where the refusal points
        found = loaded.diagnostic(("memory", "ffn_chunks"), message)
    elif batch:
        found = loaded.diagnostic(("shapes", "batch"), message)
    else:  # no smaller batch fits: what one device holds is the layer as the mesh shards it
        found = loaded.diagnostic(("mesh", "axes"), message, at_key=True)
    return _of_variant(found, variant, spec.shapes) if variant else found


def _refusal(plan: Plan) -> str:
    """Why the plan refuses, in HBM words: the exact part over HBM, the estimate over it by
    more than its error bound (both taken as proof), or by more than LEDGER_OVERESTIMATE."""
    memory = plan.memory
    hbm = memory.hbm_bytes_per_device
    where = f"the {_gib(hbm)} GiB HBM of {plan.hardware}"
    if memory.exact_bytes > hbm:
        return (
            f"the parameters and their gradients alone take {_gib(memory.exact_bytes)} GiB "
            f"per device, over {where}: it cannot fit. "
        )
    needs = (
        f"the plan needs {_gib(peak(plan))} GiB per device for forward+backward "
        f"({_slices_text(plan.ffn.chunks)}), {peak(plan) / hbm - 1:.0%} over {where}"
    )
    if proved_unfit(memory):
        return (
            f"{needs}, more than the plan's error bound ({REFUSAL_OVERESTIMATE:.0%} over; "
            f"measured at most {MEASURED_OVERESTIMATE:.0%} over the compiler): it cannot fit. "
        )
    return (
        f"{needs}: it does not fit by the plan, though by less than the plan's error bound "
        f"({REFUSAL_OVERESTIMATE:.0%} over; measured at most {MEASURED_OVERESTIMATE:.0%} over "
        f"the compiler{COMPILE_DECIDES}). "
    )


def _of_variant(found: Diagnostic, name: str, shapes: Shapes) -> Diagnostic:
    """A shape variant's diagnostic as validation words them: at its batch line (a variant
    spec's shapes.batch is there) named by its field, else prefixed by the variant."""
    if found.field == "shapes.batch":
        return replace(found, field=f"shapes.variants.{name}.batch")
    where = f"shape variant {name} (batch {shapes.batch}, seq_len {shapes.seq_len})"
    return replace(found, message=f"{where}: {found.message}")


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f}"


def _slices_text(chunks: int) -> str:
    return "the FFN whole" if chunks == 1 else f"the FFN in {chunks} slices"


def _would_fit(
    slices: list[tuple[int, int]],
    batch: tuple[str, int, int] | None,
    meshes: list[str],
    token_chunks: list[tuple[int, int]] = (),
) -> str:
    """What would fit: slice counts, (the batch field, the largest batch, its peak), meshes,
    token chunk counts."""
    options = []
    if slices:
        options.append(
            "memory.ffn_chunks "
            + " or ".join(f"{c} ({_gib(size)} GiB planned)" for c, size in slices)
        )
    if token_chunks:
        options.append(
            "memory.token_chunks "
            + " or ".join(f"{c} ({_gib(size)} GiB planned)" for c, size in token_chunks)
        )
    if batch:
        options.append(f"{batch[0]} {batch[1]} ({_gib(batch[2])} GiB planned)")
    options.extend(meshes)
    if not options:
        return (
            "By the plan, no smaller batch, FFN slice or token chunk count or mesh axis up to 4 "
            "times larger fits; shard the experts over more devices (an expert axis), store "
            "parameters in bfloat16, or pick a target with more HBM."
        )
    return "Would fit: " + "; ".join(options) + "."


def _fitting_slices(plan: Plan) -> list[tuple[int, int]]:
    """(slice count, planned peak) of the listed FFN slice counts that fit, fewest first."""
    hbm = plan.memory.hbm_bytes_per_device
    return [
        (o.chunks, o.train_peak)
        for o in plan.ffn.chunk_options
        if o.chunks != plan.ffn.chunks and o.train_peak <= hbm
    ][:MAX_SUGGESTED]


def _fitting_token_chunks(plan: Plan) -> list[tuple[int, int]]:
    """(chunk count, planned peak) of the listed token chunk counts that fit, fewest first."""
    hbm = plan.memory.hbm_bytes_per_device
    return [
        (o.chunks, max(o.train_peak, o.forward_peak))
        for o in plan.chunk_candidates.token_chunks
        if o.chunks != plan.experts.token_chunks and max(o.train_peak, o.forward_peak) <= hbm
    ][:MAX_SUGGESTED]


def _largest_batch(loaded: LoadedSpec, plan: Plan, plan_with: PlanWith) -> tuple[int, int] | None:
    """The largest valid batch below the spec's, a multiple of its batch shards, whose plan
    fits (the FFN slices as the spec pins them, or as the plan chooses), and its peak."""
    shards = plan.batch_shards
    low, high = 0, plan.batch // shards - 1  # multiples of the shards: low fits, high unknown
    best = None
    for _ in range(MAX_BATCH_PLANS):
        if low >= high:
            break
        middle = (low + high + 1) // 2
        planned = plan_with(loaded, {("shapes", "batch"): middle * shards})
        if planned is not None and _fits(planned):
            low, best = middle, (middle * shards, peak(planned))
        else:
            high = middle - 1
    return best


def _larger_meshes(loaded: LoadedSpec, plan_with: PlanWith) -> list[str]:
    """Each mesh axis made 2 or 4 times larger, on a slice of the target with that many
    devices, whose plan fits: the smallest factor per axis."""
    spec = loaded.spec
    chip = hardware(spec.target.hardware)
    axes = dict(spec.mesh.axes)
    devices = 1
    for size in axes.values():
        devices *= size
    out = []
    for axis in axes:
        if axis in (spec.mesh.dcn_axes or {}):
            continue
        for factor in MESH_FACTORS:
            wanted = devices * factor // spec.target.slices
            topology = next((t for t in chip.topologies if chip.devices(t) == wanted), None)
            if topology is None:
                continue
            larger = MappingProxyType(axes | {axis: axes[axis] * factor})
            change = {("mesh", "axes"): larger, ("target", "topology"): topology}
            planned = plan_with(loaded, change)
            if planned is not None and _fits(planned):
                out.append(
                    f"mesh.axes {axis}: {axes[axis] * factor} on {spec.target.hardware} "
                    f"{topology} ({_gib(peak(planned))} GiB planned)"
                )
                break
    return out[:MAX_SUGGESTED]
