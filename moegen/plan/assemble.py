"""Stage 3, plan: every static quantity the generated module needs, in plain Python.

The plan is the single source of numbers for the templates (which do no arithmetic) and
for `moegen plan`: shapes global and per device, PartitionSpecs, kernel tiles, the expert
placement and its worst-case buffers, and FLOP / byte / memory estimates per device.
Each sub-plan is built by one function beside its type: router (routing, weights, losses),
ffn (activation, FFN slices, gate and up side by side, kernel tiles), mesh (the device
layout), kernel (the grouped matmul and its backend's config), params (layouts and
shardings), experts (strategy, buffers, communication), costs (FLOPs, bytes, the memory
ledger), network and roofline; prose writes the summary and report the text of `moegen
plan`. This module puts the Plan together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from moegen import __version__
from moegen.hardware import hardware
from moegen.load import LoadedSpec
from moegen.plan.costs import DTYPE_BYTES, cost_plan, forward_hbm_bytes
from moegen.plan.experts import ExpertPlan, expert_plan
from moegen.plan.ffn import chosen_layout, ffn_plan, layouts
from moegen.plan.kernel import kernel_plan
from moegen.plan.mesh import mesh_plan
from moegen.plan.model import ChunkCandidates, Plan
from moegen.plan.network import network_plan
from moegen.plan.params import (
    ROUTER_DTYPE,
    LayerShape,
    ParamPlan,
    param_plans,
    side_by_side,
)
from moegen.plan.prose import summary
from moegen.plan.roofline import roofline
from moegen.plan.router import router_plan
from moegen.plan.token_chunks import (
    default_token_chunks,
    sliced_token_chunk_options,
    token_chunk_options,
)
from moegen.plan.variants import variant_plans
from moegen.sizes import axes_product
from moegen.spec import GATED_ACTIVATIONS, Spec

MAIN_SHAPE = ""  # make_plan's key of the spec's own shape, beside its variants' names


def make_plan(
    loaded: LoadedSpec,
    *,
    interpret: bool = False,
    variant_memory: Mapping[str, Mapping[str, int]] | None = None,
    whole_forward: Mapping[str, bool] | None = None,
    options: bool = True,
) -> Plan:
    """Derive the plan of a validated spec (`interpret`: run Pallas kernels on CPU), with
    a plan for each of its shape variants (`variant_memory` pins their FFN slices and token
    chunks, by name; `whole_forward`, by variant name or MAIN_SHAPE, whether a sliced FFN's
    forward pass runs whole: the twin runs each shape as its full-size plan does) and, with
    `options`, the token chunk candidates planned."""
    pins = whole_forward or {}
    main = _shape_plan(loaded, interpret, pins.get(MAIN_SHAPE))
    if options:
        main = _with_token_chunk_options(loaded, main, interpret)
    if not loaded.spec.shapes.variants:
        return replace(main, some_shape_chunks_tokens=main.experts.chunks_tokens)
    variants = variant_plans(
        loaded,
        lambda variant, name: _shape_plan(variant, interpret, pins.get(name)),
        variant_memory,
    )
    # Each shape chooses its own token chunks: the module imports what any of them uses.
    chunked = any(plan.experts.chunks_tokens for plan in (main, *(v.plan for v in variants)))
    return replace(main, variants=variants, some_shape_chunks_tokens=chunked)


def _with_token_chunk_options(loaded: LoadedSpec, main: Plan, interpret: bool) -> Plan:
    """`main` with its token chunk candidates: alone, and with each FFN slice count listed."""

    def plan_of(candidate: LoadedSpec) -> Plan:
        return _shape_plan(candidate, interpret)

    slices = [option.chunks for option in main.ffn.chunk_options]
    candidates = ChunkCandidates(
        token_chunks=token_chunk_options(loaded, main.local_tokens, plan_of),
        sliced_token_chunks=sliced_token_chunk_options(loaded, main.local_tokens, plan_of, slices),
    )
    return replace(main, chunk_candidates=candidates)


def _shape_plan(loaded: LoadedSpec, interpret: bool, whole_forward: bool | None = None) -> Plan:
    """The plan of one static input shape (the spec's shapes.batch and shapes.seq_len), with
    the token chunks the spec pins or, when it omits them, the plan's (default_token_chunks);
    `whole_forward` pins whether a sliced FFN's forward pass runs whole (None: the ledger's)."""
    if loaded.spec.memory.token_chunks is not None:
        return _chunked_shape_plan(loaded, interpret, whole_forward)
    local_tokens = _local_tokens(loaded.spec)
    return default_token_chunks(
        loaded,
        local_tokens,
        lambda candidate: _chunked_shape_plan(candidate, interpret, whole_forward),
    )


def _local_tokens(spec: Spec) -> int:
    """Tokens per device: its batch shard times its share of each sequence."""
    local_batch = spec.shapes.batch // axes_product(dict(spec.mesh.axes), spec.batch_axes)
    return local_batch * (spec.shapes.seq_len // spec.sequence_shards)


def _chunked_shape_plan(
    loaded: LoadedSpec, interpret: bool, whole_forward: bool | None = None
) -> Plan:
    """The plan of one static input shape with the spec's token chunks (omitted: one)."""
    spec = loaded.spec
    layer = spec.layer
    axes = dict(spec.mesh.axes)
    fsdp = axes.get("fsdp", 1)
    batch_shards = axes_product(axes, spec.batch_axes)
    local_batch = spec.shapes.batch // batch_shards
    local_seq_len = spec.shapes.seq_len // spec.sequence_shards
    local_tokens = _local_tokens(spec)
    local_ffn = layer.ffn_dim // spec.tensor_shards  # the FFN columns of one device
    local_shared_ffn = (layer.shared_ffn_dim or 0) // spec.tensor_shards
    routed_rows = local_tokens * spec.router.top_k
    experts = expert_plan(loaded, local_tokens, emulate=interpret)
    params = _param_plans(loaded, experts)
    base_cost = cost_plan(
        params,
        local_tokens=local_tokens,
        routed_rows=routed_rows,
        embed_dim=layer.embed_dim,
        ffn_dim=local_ffn,
        num_experts=layer.num_experts,
        param_bytes=DTYPE_BYTES[spec.dtypes.params],
        compute_bytes=DTYPE_BYTES[spec.dtypes.compute],
        fsdp=fsdp,
        gated=layer.activation in GATED_ACTIVATIONS,
        shared_ffn_dim=local_shared_ffn,
    )
    layout = layouts(loaded, experts, params, base_cost, local_tokens, whole_forward)
    chosen = chosen_layout(loaded, layout)
    ffn = ffn_plan(loaded, chosen, layout, experts, params)
    network = network_plan(
        params,
        experts,
        axes,
        dict(spec.mesh.dcn_axes or {}),
        spec.target.slices,
        spec.dtypes.params,
        regather_sliced=ffn.regathers_weights,
        token_chunks=experts.token_chunks,
        tensor_sum_bytes=local_tokens * layer.embed_dim * DTYPE_BYTES[spec.dtypes.compute],
    )
    kernel_rows = chosen.rows * experts.ffn_calls * experts.token_chunks
    return Plan(
        moegen_version=__version__,
        module_name=loaded.source.name,
        spec_display=loaded.source.display,
        spec_sha256=loaded.source.sha256,
        description=spec.description,
        summary=summary(loaded),
        hardware=spec.target.hardware,
        batch=spec.shapes.batch,
        seq_len=spec.shapes.seq_len,
        local_seq_len=local_seq_len,
        embed_dim=layer.embed_dim,
        ffn_dim=layer.ffn_dim,
        local_ffn_dim=local_ffn,
        num_experts=layer.num_experts,
        local_experts=experts.local_experts,
        copies_per_device=min(spec.router.top_k, experts.local_experts),
        batch_shards=batch_shards,
        local_batch=local_batch,
        local_tokens=local_tokens,
        routed_rows=routed_rows,
        global_tokens=spec.shapes.batch * spec.shapes.seq_len,
        param_dtype=spec.dtypes.params,
        compute_dtype=spec.dtypes.compute,
        router_dtype=ROUTER_DTYPE,
        input_partition=(spec.batch_axes or None, _sequence_axis(spec.mesh.axes), None),
        zero_initialised=any(param.init_scale == 0.0 for param in params),
        router=router_plan(loaded, experts.capacity),
        ffn=ffn,
        mesh=mesh_plan(loaded, experts.axis, network),
        kernel=kernel_plan(loaded, chosen, experts, interpret=interpret),
        params=side_by_side(params, ffn.fuses_gate_up),
        experts=experts,
        cost=chosen.cost,
        network=network,
        roofline=roofline(
            hardware(spec.target.hardware),
            local_tokens=local_tokens,
            routed_rows=routed_rows,
            kernel_rows=kernel_rows,
            embed_dim=layer.embed_dim,
            ffn_dim=local_ffn,
            shared_ffn_dim=local_shared_ffn,
            num_experts=layer.num_experts,
            gated=ffn.gated,
            hbm_forward_bytes=forward_hbm_bytes(chosen.cost, kernel_rows, fsdp),
            network=network,
            overlap_chunks=experts.overlap_chunks,
            recompute_flops=chosen.cost.recompute_flops,
        ),
        memory=chosen.memory,
    )


def _param_plans(loaded: LoadedSpec, experts: ExpertPlan) -> tuple[ParamPlan, ...]:
    """Every parameter as stored (gate and up apart; `side_by_side` joins them for use)."""
    spec = loaded.spec
    layer = spec.layer
    axes = dict(spec.mesh.axes)
    return param_plans(
        LayerShape(
            experts=layer.num_experts,
            embed=layer.embed_dim,
            ffn=layer.ffn_dim,
            gated=layer.activation in GATED_ACTIVATIONS,
            ffn_bias=layer.ffn_bias,
            shared_ffn=layer.shared_ffn_dim,
            routing_bias=spec.router.routing_bias,
            router_bias=spec.router.linear_bias,
            shared_expert_gate=layer.shared_expert_gate,
        ),
        "fsdp" if "fsdp" in axes else None,
        axes.get("fsdp", 1),
        spec.dtypes.compute,
        experts.axis,
        experts.shards,
        "tensor" if "tensor" in axes else None,
        spec.tensor_shards,
    )


def _sequence_axis(axes: dict[str, int]) -> str | None:
    """The axis x's dimension 1 (seq_len) is sharded over."""
    return "sequence" if "sequence" in axes else None
