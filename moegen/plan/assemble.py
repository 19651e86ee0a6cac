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
from moegen.load import LoadedSpec
from moegen.plan.combine import combine_plan
from moegen.plan.ffn import ffn_plan
from moegen.plan.kernel import kernel_plan
from moegen.plan.mesh import mesh_plan
from moegen.plan.model import ChunkCandidates, InitPlan, Plan, Trade
from moegen.plan.params import ROUTER_DTYPE, ParamPlan, side_by_side
from moegen.plan.prose import summary
from moegen.plan.replicas import replica_plan
from moegen.plan.router import router_plan
from moegen.plan.token_chunks import (
    TradeOutcome,
    default_token_chunks,
    sliced_token_chunk_options,
    token_chunk_options,
)
from moegen.plan.trades import ShapeBasis, Traded, shape_basis, trader
from moegen.plan.variants import variant_plans
from moegen.plan.weight_reads import read_in_kernel

MAIN_SHAPE = ""  # make_plan's key of the spec's own shape, beside its variants' names


def make_plan(
    loaded: LoadedSpec,
    *,
    interpret: bool = False,
    variant_memory: Mapping[str, Mapping[str, int]] | None = None,
    whole_forward: Mapping[str, bool] | None = None,
    weights_on_hidden: bool | None = None,
    options: bool = True,
) -> Plan:
    """Derive the plan of a validated spec (`interpret`: run Pallas kernels on CPU), with
    a plan for each of its shape variants (`variant_memory` pins their FFN slices and token
    chunks, by name; `whole_forward`, by variant name or MAIN_SHAPE, whether a sliced FFN's
    forward pass runs whole: the twin runs each shape as its full-size plan does;
    `weights_on_hidden`, where the combine weights apply, CombinePlan) and, with `options`,
    the token chunk candidates planned."""
    pins = whole_forward or {}
    hidden = weights_on_hidden
    main = _shape_plan(loaded, interpret, pins.get(MAIN_SHAPE), hidden, options=options)
    if not loaded.spec.shapes.variants:
        return replace(main, some_shape_chunks_tokens=main.experts.chunks_tokens)
    variants = variant_plans(
        loaded,
        lambda variant, name, trade: _shape_plan(variant, interpret, pins.get(name), hidden, trade),
        variant_memory,
    )
    # Each shape chooses its own token chunks: the module imports what any of them uses.
    chunked = any(plan.experts.chunks_tokens for plan in (main, *(v.plan for v in variants)))
    return replace(main, variants=variants, some_shape_chunks_tokens=chunked)


def _shape_plan(
    loaded: LoadedSpec,
    interpret: bool,
    whole_forward: bool | None,
    weights_on_hidden: bool | None,
    trade: Trade | None = None,
    *,
    options: bool = False,
) -> Plan:
    """The plan of one static input shape (the spec's shapes.batch and shapes.seq_len) with
    `trade` (default: the one the spec's memory section pins), its token chunks chosen by the
    plan where none are pinned (default_token_chunks); `whole_forward` pins whether a sliced
    FFN's forward pass runs whole (None: the ledger's); `options`: with the candidates."""
    pinned = Trade.of(loaded.spec.memory)
    trade = pinned if trade is None else trade
    basis = shape_basis(loaded, interpret, whole_forward)
    plan_trade = trader(basis)

    def outcome_of(candidate: Trade) -> TradeOutcome:
        return plan_trade(candidate).outcome()

    overlap = loaded.spec.parallelism.overlap_chunks
    if trade.token_chunks is None:
        chosen = default_token_chunks(trade, basis.local_tokens, overlap, outcome_of)
        trade = replace(trade, token_chunks=chosen)
    plan = _plan(basis, plan_trade(trade), weights_on_hidden)
    whole = plan_trade(Trade(1, 1)).step
    plan = replace(plan, roofline=replace(plan.roofline, whole_step=whole))
    if not options:
        return plan
    if whole_forward is not None:  # the candidates are the ledger's own choices (twins pin)
        plan_trade = trader(replace(basis, whole_forward=None))
    slices = [option.chunks for option in plan.ffn.chunk_options]
    candidates = ChunkCandidates(
        token_chunks=token_chunk_options(pinned, basis.local_tokens, overlap, outcome_of),
        sliced_token_chunks=sliced_token_chunk_options(
            basis.local_tokens, overlap, outcome_of, slices
        ),
    )
    return replace(plan, chunk_candidates=candidates)


def _plan(basis: ShapeBasis, traded: Traded, weights_on_hidden: bool | None) -> Plan:
    """The whole plan of one shape under one trade (`weights_on_hidden`: CombinePlan's pin)."""
    loaded, experts, chosen = basis.loaded, traded.experts, traded.chosen
    spec = loaded.spec
    layer = spec.layer
    ffn = ffn_plan(loaded, chosen, traded.layout, experts, basis.params)
    router = router_plan(loaded, basis.local_tokens)
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
        local_seq_len=basis.local_seq_len,
        embed_dim=layer.embed_dim,
        ffn_dim=layer.ffn_dim,
        local_ffn_dim=basis.local_ffn,
        num_experts=layer.num_experts,
        local_experts=experts.local_experts,
        copies_per_device=min(spec.router.top_k, experts.local_slots),
        batch_shards=basis.batch_shards,
        local_batch=basis.local_batch,
        local_tokens=basis.local_tokens,
        routed_rows=basis.routed_rows,
        global_tokens=spec.shapes.batch * spec.shapes.seq_len,
        param_dtype=spec.dtypes.params,
        compute_dtype=spec.dtypes.compute,
        router_dtype=ROUTER_DTYPE,
        input_partition=(spec.batch_axes or None, _sequence_axis(spec.mesh.axes), None),
        init=InitPlan(
            zeros=any(param.init_scale == 0.0 and not param.init_ones for param in basis.params),
            ones=tuple(param.name for param in basis.params if param.init_ones),
        ),
        router=router,
        ffn=ffn,
        mesh=mesh_plan(loaded, experts.axis, traded.network),
        kernel=kernel_plan(loaded, chosen, experts, interpret=basis.interpret),
        params=(params := _params_as_used(basis, chosen.weight_dtype, ffn.fuses_gate_up)),
        experts=replace(
            experts,
            replicas=replica_plan(loaded, params),
            combine=combine_plan(loaded, experts.strategy, router, ffn, weights_on_hidden),
        ),
        cost=chosen.cost,
        network=traded.network,
        roofline=traded.roofline,
        memory=chosen.memory,
    )


def _params_as_used(basis: ShapeBasis, weight_dtype: str, fused: bool) -> tuple[ParamPlan, ...]:
    """The parameters as the layer uses them: the routed weights in the dtype the kernels read
    them in, gate and up side by side where fused."""
    return side_by_side(read_in_kernel(basis.params, weight_dtype), fused)


def _sequence_axis(axes: Mapping[str, int]) -> str | None:
    """The axis x's dimension 1 (seq_len) is sharded over."""
    return "sequence" if "sequence" in axes else None
