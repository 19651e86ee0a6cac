"""Stage 3, plan: every static quantity the generated module needs, in plain Python.

The plan is the single source of numbers for the templates (which do no arithmetic) and
for `moegen plan`: shapes global and per device, PartitionSpecs, kernel tiles, the expert
placement and its worst-case buffers, and FLOP / byte / memory estimates per device.
This package splits the work: params (layouts and shardings), experts (strategy, buffers,
communication), costs (FLOPs, bytes, the memory ledger), report (the text of `moegen plan`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace

from moegen import __version__
from moegen.hardware import hardware
from moegen.load import LoadedSpec
from moegen.plan.costs import (
    DTYPE_BYTES,
    CostPlan,
    FfnBuffers,
    MemoryPlan,
    cost_plan,
    memory_plan,
)
from moegen.plan.experts import ExpertPlan, expert_plan
from moegen.plan.model import FfnChunkOption, Plan
from moegen.plan.network import NetworkPlan, Transfer, network_plan
from moegen.plan.params import (
    GATED_ACTIVATIONS,
    ROUTER_DTYPE,
    LayerShape,
    ParamPlan,
    PartitionSpec,
    param_plans,
    side_by_side,
)
from moegen.plan.report import format_plan
from moegen.plan.roofline import PassRoofline, Roofline, roofline
from moegen.sizes import axes_product
from moegen.tiling import LANES, Tile, choose_tile, padded_rows, round_up
from moegen.validate.memory import ffn_chunk_width

__all__ = [
    "CostPlan", "ExpertPlan", "MemoryPlan", "NetworkPlan", "ParamPlan", "PartitionSpec",
    "PassRoofline", "Plan", "Roofline", "Transfer",
    "format_plan", "make_plan",
]  # fmt: skip


def make_plan(loaded: LoadedSpec, *, interpret: bool = False) -> Plan:
    """Derive the plan of a validated spec (`interpret`: run Pallas kernels on CPU)."""
    spec = loaded.spec
    chip = hardware(spec.target.hardware)
    axes = dict(spec.mesh.axes)
    batch_axes = spec.batch_axes
    fsdp_axis = "fsdp" if "fsdp" in axes else None
    batch_shards = axes_product(axes, batch_axes)
    local_batch = spec.shapes.batch // batch_shards
    local_tokens = local_batch * spec.shapes.seq_len
    routed_rows = local_tokens * spec.router.top_k
    group_limit = spec.router.group_limit
    experts = expert_plan(loaded, local_tokens, emulate=interpret)
    layer = spec.layer
    gated = layer.activation in GATED_ACTIVATIONS
    params = param_plans(
        LayerShape(
            experts=layer.num_experts,
            embed=layer.embed_dim,
            ffn=layer.ffn_dim,
            gated=gated,
            ffn_bias=layer.ffn_bias,
            shared_ffn=layer.shared_ffn_dim,
            routing_bias=spec.router.routing_bias,
        ),
        fsdp_axis,
        axes.get("fsdp", 1),
        spec.dtypes.compute,
        experts.axis,
        experts.shards,
    )
    base_cost = cost_plan(
        params,
        local_tokens=local_tokens,
        routed_rows=routed_rows,
        embed_dim=spec.layer.embed_dim,
        ffn_dim=spec.layer.ffn_dim,
        num_experts=spec.layer.num_experts,
        param_bytes=DTYPE_BYTES[spec.dtypes.params],
        compute_bytes=DTYPE_BYTES[spec.dtypes.compute],
        fsdp=axes.get("fsdp", 1),
        gated=gated,
        shared_ffn_dim=layer.shared_ffn_dim or 0,
    )
    chip_hbm = chip.hbm_bytes_per_device
    compute_bytes = DTYPE_BYTES[spec.dtypes.compute]

    def projections(chunks: int) -> tuple[str, ...]:
        """What the gate and up grouped-matmul calls produce, one name per call."""
        whole_gather = bool(fsdp_axis) and chunks == 1
        fused = fuses_gate_up(gated, layer.ffn_dim // chunks, whole_gather)
        return ("gate_up",) if fused else ("gate", "up") if gated else ("up",)

    def sliced(chunks: int) -> tuple[tuple[Tile, Tile] | None, int, CostPlan, MemoryPlan]:
        """Tiles, padded rows, costs and memory with the FFN run in `chunks` slices."""
        outputs = projections(chunks)
        gate_up_width = layer.ffn_dim // chunks * (2 if outputs == ("gate_up",) else 1)
        tiles = _kernel_tiles(loaded, experts, gate_up_width, chunks)
        rows = padded_rows(experts.ffn_rows, list(tiles)) if tiles else experts.ffn_rows
        kernel_rows = rows * experts.ffn_calls
        matmuls = 3 if gated else 2
        recompute = 2 * (matmuls - 1) * kernel_rows * layer.embed_dim * layer.ffn_dim
        cost = replace(base_cost, recompute_flops=recompute if chunks > 1 else 0)
        ffn = FfnBuffers(
            rows=kernel_rows,
            embed_dim=layer.embed_dim,
            width=layer.ffn_dim // chunks,
            chunks=chunks,
            matmuls=matmuls,
            gate_up_calls=len(outputs),
            sliced_cast_bytes=sum(
                math.prod(p.local_shape) * compute_bytes for p in params if p.ffn_axis is not None
            ),
        )
        memory = memory_plan(
            cost,
            ffn,
            local_tokens=local_tokens,
            num_experts=layer.num_experts,
            compute_bytes=compute_bytes,
            hbm=chip_hbm,
        )
        return tiles, rows, cost, memory

    chunks = spec.memory.ffn_chunks or _default_ffn_chunks(loaded, lambda c: sliced(c)[3])
    tiles, rows, cost, memory = sliced(chunks)
    gate_up_outputs = projections(chunks)
    fused = gate_up_outputs == ("gate_up",)
    options = _ffn_chunk_options(loaded, chunks, sliced)
    kernel_rows = rows * experts.ffn_calls
    fsdp = axes.get("fsdp", 1)
    regathers = chunks > 1 and fsdp > 1
    quantization = spec.target.quantization if spec.target.kernel == "te" else "none"
    te_align = TE_GROUP_ALIGN[quantization]
    groups = experts.local_experts
    network = network_plan(
        params,
        experts,
        axes,
        dict(spec.mesh.dcn_axes or {}),
        spec.target.slices,
        spec.dtypes.params,
        regather_sliced=regathers,
    )
    hbm_forward = (
        cost.param_bytes
        + cost.gathered_weight_bytes * (2 if fsdp > 1 else 1)  # written by the gather, read
        + 2 * kernel_rows * cost.routed_row_bytes
        + cost.activation_bytes
        + 2 * cost.shared_activation_bytes
    )
    return Plan(
        moegen_version=__version__,
        module_name=loaded.source.name,
        spec_display=loaded.source.display,
        spec_sha256=loaded.source.sha256,
        description=spec.description,
        summary=_summary(loaded),
        mesh_axes=tuple(axes.items()),
        num_devices=axes_product(axes, axes),
        batch_axes=batch_axes,
        fsdp_axis=fsdp_axis,
        expert_axis=experts.axis,
        expert_strategy=spec.parallelism.experts,
        hardware=spec.target.hardware,
        topology=spec.target.topology,
        tpu_topology_name=(
            f"{chip.topology_prefix}:{spec.target.topology}" if chip.platform == "tpu" else None
        ),
        slices=spec.target.slices,
        chips_per_host_bounds=(
            chip.chips_per_host_bounds(spec.target.topology) if chip.platform == "tpu" else None
        ),
        kernel=spec.target.kernel,
        kernel_interpret=interpret and spec.target.kernel == "pallas",
        check_vma=not _vma_unchecked_reason(loaded),
        vma_unchecked_reason=_vma_unchecked_reason(loaded),
        cuda_sm=chip.sm if chip.platform == "gpu" else None,
        te_quantization=quantization,
        te_group_align=te_align,
        fuses_gate_up=fused,
        gate_up_outputs=gate_up_outputs,
        grouped_matmul_sites=len(gate_up_outputs) + 1,  # and down
        te_aligned_rows=round_up(
            kernel_rows // experts.ffn_calls + groups * (te_align - 1), te_align
        ),
        gate_up_tile=tiles[0].as_tuple() if tiles else None,
        down_tile=tiles[1].as_tuple() if tiles else None,
        ffn_chunks=chunks,
        ffn_chunk_width=layer.ffn_dim // chunks,
        regathers_weights=regathers,
        sliced_params=tuple(p.name for p in params if chunks > 1 and p.ffn_axis is not None),
        ffn_chunk_options=options,
        batch=spec.shapes.batch,
        seq_len=spec.shapes.seq_len,
        embed_dim=spec.layer.embed_dim,
        ffn_dim=spec.layer.ffn_dim,
        num_experts=spec.layer.num_experts,
        local_experts=experts.local_experts,
        top_k=spec.router.top_k,
        batch_shards=batch_shards,
        local_batch=local_batch,
        local_tokens=local_tokens,
        routed_rows=routed_rows,
        row_alignment=math.lcm(*(t.rows for t in tiles)) if tiles else 1,
        padded_rows=rows,
        pads_rows=rows > experts.ffn_rows,
        global_tokens=spec.shapes.batch * spec.shapes.seq_len,
        score=spec.router.score,
        score_after_top_k=spec.router.score_after_top_k,
        renormalize=spec.router.renormalize,
        routed_scaling=spec.router.routed_scaling,
        expert_groups=group_limit.groups if group_limit else None,
        kept_groups=group_limit.keep if group_limit else None,
        group_top_k=spec.router.top_k // group_limit.keep if group_limit else None,
        experts_per_group=spec.layer.num_experts // group_limit.groups if group_limit else None,
        routing_bias=spec.router.routing_bias,
        selection_is_score=not (
            spec.router.score_after_top_k or spec.router.routing_bias or group_limit
        ),
        route_returns_logits=spec.router.load_balance_loss > 0 or spec.router.z_loss > 0,
        load_balance_weight=spec.router.load_balance_loss,
        z_loss_weight=spec.router.z_loss,
        capacity=experts.capacity,
        drop_policy=spec.router.capacity.drop if spec.router.capacity else None,
        activation=layer.activation,
        gated=gated,
        ffn_bias=layer.ffn_bias,
        shared_ffn_dim=layer.shared_ffn_dim,
        param_dtype=spec.dtypes.params,
        compute_dtype=spec.dtypes.compute,
        router_dtype=ROUTER_DTYPE,
        input_partition=(batch_axes or None, None, None),
        params=side_by_side(params, fused),
        zero_initialised=any(param.init_scale == 0.0 for param in params),
        experts=experts,
        cost=cost,
        network=network,
        roofline=roofline(
            chip,
            local_tokens=local_tokens,
            routed_rows=routed_rows,
            kernel_rows=kernel_rows,
            embed_dim=layer.embed_dim,
            ffn_dim=layer.ffn_dim,
            shared_ffn_dim=layer.shared_ffn_dim or 0,
            num_experts=layer.num_experts,
            gated=gated,
            hbm_forward_bytes=hbm_forward,
            network=network,
            overlap_chunks=experts.overlap_chunks,
            recompute_flops=cost.recompute_flops,
        ),
        memory=memory,
    )


def _vma_unchecked_reason(loaded: LoadedSpec) -> str:
    """Why shard_map's varying-axes check must be off for this module ('' when it can stay on)."""
    spec = loaded.spec
    if spec.target.kernel == "pallas":
        return "Pallas kernels carry no varying-axes types"
    if spec.target.kernel == "te":
        return "Transformer Engine's custom VJPs carry no varying-axes types"
    if spec.layer.activation in ("geglu", "gelu"):
        return "XLA's erf polynomial carries no varying-axes types"
    return ""


# Transformer Engine's grouped GEMM: every expert's rows fill a multiple of this many rows
# when quantized (cuBLAS FP8 contracts over rows in the weight gradient in 16s; TE's SM 100
# MXFP8 kernels scale 32-row blocks and want 128 when every dimension is a multiple of 128).
TE_GROUP_ALIGN = {"none": 1, "fp8": 16, "mxfp8": 128}


def _ffn_chunk_options(
    loaded: LoadedSpec, chosen: int, sliced: Callable[[int], tuple]
) -> tuple[FfnChunkOption, ...]:
    """The valid power-of-two slice counts up to 16 (and the chosen one), costed."""
    if loaded.spec.parallelism.overlap_chunks != 1:
        return ()
    counts = {c for c in (1, 2, 4, 8, 16) if c == 1 or not ffn_chunk_width(loaded, c)}
    options = []
    for count in sorted(counts | {chosen}):
        _, _, cost, memory = sliced(count)
        options.append(FfnChunkOption(count, memory.train_peak, cost.recompute_flops))
    return tuple(options)


def _default_ffn_chunks(loaded: LoadedSpec, memory_with: Callable[[int], MemoryPlan]) -> int:
    """Whole (no recomputation) when the layer fits the target's memory; else the fewest FFN
    slices that make it fit (whole when none does: slicing would not save it)."""
    hbm = hardware(loaded.spec.target.hardware).hbm_bytes_per_device
    if not hbm or loaded.spec.parallelism.overlap_chunks != 1:
        return 1
    counts = [1] + [c for c in range(2, 65) if not ffn_chunk_width(loaded, c)]
    for count in counts:
        if memory_with(count).train_peak <= hbm:
            return count
    return 1


def _kernel_tiles(
    loaded: LoadedSpec, experts: ExpertPlan, gate_up_width: int, ffn_chunks: int
) -> tuple[Tile, Tile] | None:
    """Megablox tiles for the gate/up calls and for down: pinned by the spec, else chosen here.

    With overlap chunks the gate and up matmuls contract over one chunk of the embedding;
    with FFN slices each matmul covers one slice of the FFN width, and the down projection
    writes float32 (the slices are summed). Gate and up side by side are one call of twice
    the width.
    """
    spec = loaded.spec
    if spec.target.kernel != "pallas":
        return None  # ragged_dot takes groups of any size: nothing to tile or pad
    chip = hardware(spec.target.hardware)
    dtype = spec.dtypes.compute
    down_out = "float32" if ffn_chunks > 1 else dtype
    ffn = spec.layer.ffn_dim // ffn_chunks
    choose = functools.partial(
        choose_tile,
        experts.ffn_rows,
        dtype=dtype,
        vmem_budget=chip.vmem_bytes_for_tiles,
        groups=experts.local_experts,
        peak_flops=chip.peak_bf16_flops_per_chip,
        hbm_bytes_per_s=chip.hbm_bytes_per_s_per_chip,
    )
    pinned = spec.target.tiles
    gate_up = (
        Tile(*pinned.gate_up)
        if pinned and pinned.gate_up
        else choose(experts.chunk_width, gate_up_width)
    )
    down = (
        Tile(*pinned.down)
        if pinned and pinned.down
        else choose(ffn, spec.layer.embed_dim, out_dtype=down_out)
    )
    return gate_up, down


def _topology_text(hardware_name: str, topology: str | None) -> str:
    if not topology:
        return "."
    chip = hardware(hardware_name)
    return f", {chip.devices(topology)} GPUs." if chip.platform == "gpu" else f" {topology}."


def _summary(loaded: LoadedSpec) -> str:
    """One sentence stating the spec, built from validated numbers and enums only."""
    spec = loaded.spec
    router, layer = spec.router, spec.layer
    routing = f"{router.score} routing"
    if router.score_after_top_k:
        routing += " over the chosen logits"
    if router.group_limit:
        routing += f" in {router.group_limit.keep} of {router.group_limit.groups} groups"
    details = [
        "renormalised" if router.renormalize else "",
        f"scaled by {router.routed_scaling:g}" if router.routed_scaling != 1.0 else "",
        "balancing bias" if router.routing_bias else "",
        f"load-balancing loss {router.load_balance_loss:g}" if router.load_balance_loss else "",
        f"z-loss {router.z_loss:g}" if router.z_loss else "",
        f"capacity factor {router.capacity.factor:g} (drop by {router.capacity.drop})"
        if router.capacity
        else "",
    ]
    extras = "".join(f", {d}" for d in details if d)
    experts = f"{layer.num_experts} {layer.activation} experts"
    if layer.ffn_bias:
        experts += " with biases"
    widths = f"embed {layer.embed_dim}, ffn {layer.ffn_dim}"
    if layer.shared_ffn_dim:
        widths += f", shared expert ffn {layer.shared_ffn_dim}"
    mesh = " x ".join(f"{name} {size}" for name, size in spec.mesh.axes.items())
    return (
        f"MoE layer: {experts} ({widths}), top-{router.top_k} "
        f"{routing}{extras}, {spec.parallelism.experts} experts, "
        f"on a {mesh} mesh, kernel {spec.target.kernel}, target {spec.target.hardware}"
        + _topology_text(spec.target.hardware, spec.target.topology)
    )


def fuses_gate_up(gated: bool, width: int, gathers_whole_weights: bool) -> bool:
    """Gate and up as one grouped matmul over their weights side by side (the rows read once,
    one row gradient instead of two to add): when the layer is gated, the FFN width of a call
    is whole 128-lane tiles, so that up starts on a lane tile (splitting the result elsewhere
    costs XLA a copy of it), and fsdp does not gather the whole weights. Gathered whole, gate
    and up (the largest buffers) and their gradients would be one buffer each, which XLA can
    no longer gather or reduce-scatter one after the other: measured on v5e, libtpu 0.0.51,
    mixtral_8x7b_v5e peaks 1.18 GiB higher fused. Per FFN slice or unsharded, fused is lighter
    (the memory reference in 8 slices: 3.24 GiB instead of 3.63)."""
    return gated and width % LANES == 0 and not gathers_whole_weights
