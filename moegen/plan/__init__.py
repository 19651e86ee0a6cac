"""Stage 3, plan: every static quantity the generated module needs, in plain Python.

The plan is the single source of numbers for the templates (which do no arithmetic) and
for `moegen plan`: shapes global and per device, PartitionSpecs, kernel tiles, the expert
placement and its worst-case buffers, and FLOP / byte / memory estimates per device.
This package splits the work: params (layouts and shardings), experts (strategy, buffers,
communication), ffn (FFN slices, gate and up side by side, kernel tiles), costs (FLOPs, bytes,
the memory ledger), mesh (the device layout), prose (the summary) and report (the text of
`moegen plan`); this module puts the Plan together.
"""

from __future__ import annotations

import math

from moegen import __version__
from moegen.hardware import hardware
from moegen.load import LoadedSpec
from moegen.plan.costs import DTYPE_BYTES, CostPlan, MemoryPlan, cost_plan
from moegen.plan.experts import ExpertPlan, expert_plan
from moegen.plan.ffn import chosen_layout, ffn_chunk_options, layouts
from moegen.plan.mesh import lays_out_on_whole_axes, physical_mesh_shape
from moegen.plan.model import GluPlan, Plan
from moegen.plan.network import NetworkPlan, Transfer, network_plan
from moegen.plan.params import (
    ROUTER_DTYPE,
    LayerShape,
    ParamPlan,
    PartitionSpec,
    param_plans,
    side_by_side,
)
from moegen.plan.prose import summary, vma_unchecked_reason
from moegen.plan.report import format_plan
from moegen.plan.roofline import PassRoofline, Roofline, roofline
from moegen.sizes import axes_product
from moegen.spec import GATED_ACTIVATIONS, Layer
from moegen.tiling import round_up

__all__ = [
    "CostPlan", "ExpertPlan", "GluPlan", "MemoryPlan", "NetworkPlan", "ParamPlan", "PartitionSpec",
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
            router_bias=spec.router.linear_bias,
            shared_expert_gate=layer.shared_expert_gate,
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
    layout = layouts(loaded, experts, params, base_cost, local_tokens)
    ffn = chosen_layout(loaded, layout)
    chunks, tiles, rows, cost, memory = ffn.chunks, ffn.tiles, ffn.rows, ffn.cost, ffn.memory
    gate_up_outputs, fused = ffn.gate_up_outputs, ffn.fused
    options = ffn_chunk_options(loaded, chunks, layout)
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
        summary=summary(loaded),
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
        multislice=spec.target.slices > 1,
        devices_per_slice=axes_product(axes, axes) // spec.target.slices,
        splits_physical_axes=_splits_physical_axes(loaded, network),
        chips_per_host_bounds=(
            chip.chips_per_host_bounds(spec.target.topology) if chip.platform == "tpu" else None
        ),
        kernel=spec.target.kernel,
        kernel_interpret=interpret and spec.target.kernel == "pallas",
        check_vma=not vma_unchecked_reason(loaded),
        vma_unchecked_reason=vma_unchecked_reason(loaded),
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
        ffn_layout=_ffn_layout(experts, chunks),
        ffn_chunks=chunks,
        ffn_chunk_width=layer.ffn_dim // chunks,
        recompute_flops_text=f"{cost.recompute_flops:.3g}",
        regathers_weights=regathers,
        sliced_params=tuple(p.name for p in params if chunks > 1 and p.ffn_axis is not None),
        ffn_chunk_options=options,
        batch=spec.shapes.batch,
        seq_len=spec.shapes.seq_len,
        embed_dim=spec.layer.embed_dim,
        ffn_dim=spec.layer.ffn_dim,
        num_experts=spec.layer.num_experts,
        local_experts=experts.local_experts,
        copies_per_device=min(spec.router.top_k, experts.local_experts),
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
        scales_routing=spec.router.routed_scaling != 1.0,
        expert_groups=group_limit.groups if group_limit else None,
        kept_groups=group_limit.keep if group_limit else None,
        group_top_k=group_limit.top_per_group if group_limit else None,
        ranks_groups_by_max=group_limit is not None and group_limit.top_per_group == 1,
        experts_per_group=spec.layer.num_experts // group_limit.groups if group_limit else None,
        routing_bias=spec.router.routing_bias,
        router_linear_bias=spec.router.linear_bias,
        weights_on_input=spec.router.weighting == "input",
        selection_is_score=not (
            spec.router.score_after_top_k or spec.router.routing_bias or group_limit
        ),
        chooses_by_logit=spec.router.score in ELEMENTWISE_SCORES
        and not (spec.router.routing_bias or group_limit),
        route_returns_logits=spec.router.load_balance_loss > 0 or spec.router.z_loss > 0,
        load_balance_weight=spec.router.load_balance_loss,
        z_loss_weight=spec.router.z_loss,
        has_load_balance_loss=spec.router.load_balance_loss > 0,
        has_z_loss=spec.router.z_loss > 0,
        capacity=experts.capacity,
        drop_policy=spec.router.capacity.drop if spec.router.capacity else None,
        activation=layer.activation,
        gated=gated,
        glu=_glu_plan(layer),
        ffn_bias=layer.ffn_bias,
        shared_ffn_dim=layer.shared_ffn_dim,
        shared_expert_gate=layer.shared_expert_gate,
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


# Scores that are an increasing function of each logit alone: their top-k is the logits' top-k,
# which is exact where the score saturates (a float32 sigmoid is 1.0 past a logit of ~17).
ELEMENTWISE_SCORES = ("sigmoid", "sqrtsoftplus")

# Transformer Engine's grouped GEMM: every expert's rows fill a multiple of this many rows
# when quantized (cuBLAS FP8 contracts over rows in the weight gradient in 16s; TE's SM 100
# MXFP8 kernels scale 32-row blocks and want 128 when every dimension is a multiple of 128).
TE_GROUP_ALIGN = {"none": 1, "fp8": 16, "mxfp8": 128}


def _glu_plan(layer: Layer) -> GluPlan | None:
    glu = layer.glu_params
    if glu is None:
        return None
    return GluPlan(
        gate_limit=glu.gate_limit,
        up_limit=glu.up_limit,
        sigmoid_scale=None if glu.sigmoid_scale == 1.0 else glu.sigmoid_scale,
        up_offset=None if glu.up_offset == 0.0 else glu.up_offset,
        preset=layer.glu if isinstance(layer.glu, str) else None,
    )


def _ffn_layout(experts: ExpertPlan, chunks: int) -> str:
    """How the routed FFN runs: "ring_overlapped" (gate and up chunk by chunk of the embedding
    around the ring, in the strategy's code), "sliced" (slices of the FFN width one at a time),
    or "whole"."""
    if experts.overlap_chunks > 1:
        return "ring_overlapped"
    return "sliced" if chunks > 1 else "whole"


def _splits_physical_axes(loaded: LoadedSpec, network: NetworkPlan) -> bool:
    """The mesh (each slice's part of it) has an axis that no set of the slice's whole physical
    axes multiplies to (moegen.plan.mesh): the module lets mesh_utils split physical axes."""
    spec = loaded.spec
    chip = hardware(spec.target.hardware)
    if chip.platform != "tpu" or spec.target.topology is None:
        return False
    physical = physical_mesh_shape(chip, spec.target.topology)
    return not lays_out_on_whole_axes(physical, network.ici_mesh_shape)
