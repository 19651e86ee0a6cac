"""One static input shape and the memory trades it can be planned with.

A shape's quantities that no trade changes (its per-device sizes, parameters, base costs)
are computed once (`ShapeBasis`); each trade (token chunks, FFN slices) then plans only what
it changes: the experts' buffers, the FFN layout and its memory ledger, the communication
and the roofline (`Traded`). The plan's own choices (default token chunks and FFN slices)
and the candidates `moegen plan` lists are trades of one basis, never a rewritten spec
planned again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from moegen.hardware import hardware
from moegen.load import LoadedSpec
from moegen.plan.costs import DTYPE_BYTES, CostPlan, cost_plan, forward_hbm_bytes
from moegen.plan.experts import ExpertPlan, expert_plan
from moegen.plan.ffn import FfnLayout, chosen_layout, layouts
from moegen.plan.model import Trade
from moegen.plan.network import NetworkPlan, network_plan
from moegen.plan.params import LayerShape, ParamPlan, param_plans
from moegen.plan.roofline import Roofline, roofline
from moegen.plan.slicing import regathers_weights
from moegen.plan.step_time import StepShape, StepTime, step_time
from moegen.plan.token_chunks import TradeOutcome
from moegen.sizes import axes_product
from moegen.spec import GATED_ACTIVATIONS, Spec


@dataclass(frozen=True)
class ShapeBasis:
    """What one static input shape plans the same under every trade."""

    loaded: LoadedSpec
    interpret: bool  # Pallas kernels run on CPU (the twins)
    whole_forward: bool | None  # pinned: a sliced FFN's forward pass runs whole (None: ledger)
    batch_shards: int
    local_batch: int
    local_seq_len: int
    local_tokens: int
    local_ffn: int  # the FFN columns of one device
    local_shared_ffn: int
    routed_rows: int
    params: tuple[ParamPlan, ...]
    base_cost: CostPlan


@dataclass(frozen=True)
class Traded:
    """One trade of a shape, planned: what the trade changes."""

    experts: ExpertPlan
    layout: Callable[[int], FfnLayout]  # every FFN slice count's layout under this trade
    chosen: FfnLayout
    network: NetworkPlan
    roofline: Roofline
    step: StepTime  # the passes' estimated seconds as run (moegen.plan.step_time)

    def outcome(self) -> TradeOutcome:
        return TradeOutcome(
            token_chunks=self.experts.token_chunks,
            ffn_chunks=self.chosen.chunks,
            memory=self.chosen.memory,
            train_flops=self.roofline.passes[-1].kernel_flops,
            ici_bytes=self.network.ici_bytes,
            train_s=self.step.train_s,
        )


def local_tokens(spec: Spec) -> int:
    """Tokens per device: its batch shard times its share of each sequence."""
    local_batch = spec.shapes.batch // axes_product(dict(spec.mesh.axes), spec.batch_axes)
    return local_batch * (spec.shapes.seq_len // spec.sequence_shards)


def shape_basis(loaded: LoadedSpec, interpret: bool, whole_forward: bool | None) -> ShapeBasis:
    """The trade-independent quantities of the spec's shape (shapes.batch, shapes.seq_len)."""
    spec = loaded.spec
    layer = spec.layer
    tokens = local_tokens(spec)
    local_ffn = layer.ffn_dim // spec.tensor_shards
    local_shared_ffn = (layer.shared_ffn_dim or 0) // spec.tensor_shards
    # the expert axis and shards, which the parameters' layout needs, depend on no trade
    params = _param_plans(loaded, expert_plan(loaded, tokens, 1, emulate=interpret))
    base_cost = cost_plan(
        params,
        local_tokens=tokens,
        routed_rows=tokens * spec.router.top_k,
        embed_dim=layer.embed_dim,
        ffn_dim=local_ffn,
        num_experts=layer.num_experts,
        param_bytes=DTYPE_BYTES[spec.dtypes.params],
        compute_bytes=DTYPE_BYTES[spec.dtypes.compute],
        fsdp=spec.mesh.axes.get("fsdp", 1),
        gated=layer.activation in GATED_ACTIVATIONS,
        shared_ffn_dim=local_shared_ffn,
        latent_dim=layer.latent_dim or 0,
    )
    batch_shards = axes_product(dict(spec.mesh.axes), spec.batch_axes)
    return ShapeBasis(
        loaded=loaded,
        interpret=interpret,
        whole_forward=whole_forward,
        batch_shards=batch_shards,
        local_batch=spec.shapes.batch // batch_shards,
        local_seq_len=spec.shapes.seq_len // spec.sequence_shards,
        local_tokens=tokens,
        local_ffn=local_ffn,
        local_shared_ffn=local_shared_ffn,
        routed_rows=tokens * spec.router.top_k,
        params=params,
        base_cost=base_cost,
    )


def trader(basis: ShapeBasis) -> Callable[[Trade], Traded]:
    """Plans each trade of `basis` once (the default choice and the candidates share them)."""
    return functools.cache(functools.partial(traded, basis))


def traded(basis: ShapeBasis, trade: Trade) -> Traded:
    """`trade` of the shape planned: one token chunk where it pins none, and the pinned FFN
    slices or the plan's own for those chunks."""
    spec = basis.loaded.spec
    token_chunks = trade.token_chunks or 1
    experts = expert_plan(basis.loaded, basis.local_tokens, token_chunks, emulate=basis.interpret)
    layout = layouts(
        basis.loaded,
        experts,
        basis.params,
        basis.base_cost,
        basis.local_tokens,
        basis.whole_forward,
    )
    chosen = chosen_layout(basis.loaded, layout, trade.ffn_chunks, token_chunks)
    network = network_plan(
        basis.params,
        experts,
        dict(spec.mesh.axes),
        dict(spec.mesh.dcn_axes or {}),
        spec.target.slices,
        spec.dtypes.params,
        regather_sliced=regathers_weights(basis.loaded.spec, chosen.chunks),
        token_chunks=token_chunks,
        tensor_sum_bytes=basis.local_tokens
        * spec.layer.embed_dim
        * DTYPE_BYTES[spec.dtypes.compute],
    )
    step = _step_time(basis, experts, chosen)
    roofline = replace(_roofline(basis, experts, chosen, network), step=step)
    return Traded(experts, layout, chosen, network, roofline, step)


def _step_time(basis: ShapeBasis, experts: ExpertPlan, chosen: FfnLayout) -> StepTime:
    spec = basis.loaded.spec
    chip = hardware(spec.target.hardware)
    per_chip = max(chip.devices_per_chip, 1)
    shape = StepShape(
        tokens=basis.local_tokens,
        routed_rows=basis.routed_rows,
        kernel_rows=chosen.rows,
        calls=experts.ffn_calls * experts.token_chunks,
        experts=max(experts.local_slots, experts.local_experts),
        embed=spec.layer.latent_dim or spec.layer.embed_dim,
        ffn=basis.local_ffn,
        matmuls=3 if spec.layer.activation in GATED_ACTIVATIONS else 2,
        compute_bytes=DTYPE_BYTES[spec.dtypes.compute],
        param_bytes=DTYPE_BYTES[spec.dtypes.params],
        token_chunks=experts.token_chunks,
        ffn_slices=chosen.chunks,
        whole_forward=chosen.forward_layout is not None,
        fused_gate_up=chosen.fused,
        tiles=tuple(tile.as_tuple() for tile in chosen.tiles or ()),
    )
    return step_time(
        shape, chip.peak_bf16_flops_per_chip / per_chip, chip.hbm_bytes_per_s_per_chip / per_chip
    )


def _roofline(
    basis: ShapeBasis, experts: ExpertPlan, chosen: FfnLayout, network: NetworkPlan
) -> Roofline:
    spec = basis.loaded.spec
    kernel_rows = chosen.rows * experts.ffn_calls * experts.token_chunks
    return roofline(
        hardware(spec.target.hardware),
        local_tokens=basis.local_tokens,
        routed_rows=basis.routed_rows,
        kernel_rows=kernel_rows,
        embed_dim=spec.layer.embed_dim,
        ffn_dim=basis.local_ffn,
        shared_ffn_dim=basis.local_shared_ffn,
        num_experts=spec.layer.num_experts,
        gated=spec.layer.activation in GATED_ACTIVATIONS,
        hbm_forward_bytes=forward_hbm_bytes(
            chosen.cost, kernel_rows, spec.mesh.axes.get("fsdp", 1)
        ),
        network=network,
        overlap_chunks=experts.overlap_chunks,
        recompute_flops=chosen.cost.recompute_flops,
        latent_dim=spec.layer.latent_dim or 0,
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
            shared_ffn_bias=layer.shared_ffn_bias,
            router_input_scale=spec.router.input_norm_eps is not None,
            per_expert_scale=spec.router.per_expert_scale,
            expert_input_norm=layer.expert_input_norm_eps is not None,
            output_norm=layer.output_norm_eps is not None,
            expert_output_norm=layer.expert_output_norm_eps is not None,
            shared_output_norm=layer.shared_output_norm_eps is not None,
            zero_computation=spec.router.identity_experts + spec.router.zero_experts,
            weighed_shared=layer.shared_experts if spec.router.weighs_shared_experts else 0,
            router_scale=spec.router.learned_scale,
            latent=layer.latent_dim or 0,
            latent_bias=layer.latent_bias,
        ),
        "fsdp" if "fsdp" in axes else None,
        axes.get("fsdp", 1),
        spec.dtypes.compute,
        experts.axis,
        experts.shards,
        "tensor" if "tensor" in axes else None,
        spec.tensor_shards,
    )
