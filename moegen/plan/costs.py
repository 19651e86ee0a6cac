"""Per-device FLOPs and bytes (the memory ledger: moegen.plan.memory)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from moegen.plan.params import ParamPlan

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class CostPlan:
    """Per-device estimates for one forward pass (training is about 3x the FLOPs)."""

    router_flops: int
    expert_flops: int  # routed experts, every chosen copy (an upper bound under a capacity)
    shared_expert_flops: int
    forward_flops: int
    train_flops: int
    param_bytes: int  # parameters as stored on one device
    gathered_weight_bytes: int  # full expert weights after the fsdp gather, in use dtype
    routed_buffer_bytes: int  # dispatched rows, gate, up, hidden and expert outputs
    routed_row_bytes: int  # the same, per row
    shared_activation_bytes: int  # the shared expert's gate, up and hidden activations
    activation_bytes: int  # layer input and output on one device
    gather_bytes_received: int  # fsdp all-gather traffic into one device, forward
    recompute_flops: int = 0  # FFN slices: (gate and) up recomputed in the backward pass


def forward_hbm_bytes(cost: CostPlan, kernel_rows: int, fsdp: int) -> int:
    """HBM bytes of one forward pass per device: stored parameters read, gathered weights
    written by the gather and read, routed buffers and shared-expert activations written and
    read, the layer's input and output."""
    return (
        cost.param_bytes
        + cost.gathered_weight_bytes * (2 if fsdp > 1 else 1)
        + 2 * kernel_rows * cost.routed_row_bytes
        + cost.activation_bytes
        + 2 * cost.shared_activation_bytes
    )


def cost_plan(
    params: tuple[ParamPlan, ...],
    *,
    local_tokens: int,
    routed_rows: int,
    embed_dim: int,
    ffn_dim: int,
    num_experts: int,
    param_bytes: int,
    compute_bytes: int,
    fsdp: int,
    gated: bool,
    shared_ffn_dim: int,
    latent_dim: int = 0,
) -> CostPlan:
    router_flops = 2 * local_tokens * embed_dim * num_experts
    # (gate,) up, down matmuls; with experts sharded, the group's rows average out per device;
    # where the experts run in a latent width, the projections into it and back count here
    matmuls = 3 if gated else 2
    routed_dim = latent_dim or embed_dim
    latent_flops = 2 * 2 * local_tokens * embed_dim * latent_dim
    expert_flops = 2 * matmuls * routed_rows * routed_dim * ffn_dim + latent_flops
    shared_flops = 2 * matmuls * local_tokens * embed_dim * shared_ffn_dim
    # the row and its output [D] (or [L]) each; gate, up and hidden (or up and hidden) [F]
    row_bytes = (2 * routed_dim + matmuls * ffn_dim) * compute_bytes
    # Each device gathers the fsdp shards of its own parameters (its experts only).
    gathered = sum(
        math.prod(p.local_shape)
        * (fsdp if p.gather_axis is not None else 1)
        * DTYPE_BYTES[p.use_dtype]
        for p in params
    )
    # Only the parameters with an embed_dim are gathered; biases over experts stay as they are.
    gather_traffic = sum(
        math.prod(p.local_shape) * (fsdp - 1) * DTYPE_BYTES[p.use_dtype]
        for p in params
        if p.gather_axis is not None
    )
    return CostPlan(
        router_flops=router_flops,
        expert_flops=expert_flops,
        shared_expert_flops=shared_flops,
        forward_flops=router_flops + expert_flops + shared_flops,
        train_flops=3 * (router_flops + expert_flops + shared_flops),
        param_bytes=sum(math.prod(p.local_shape) for p in params) * param_bytes,
        gathered_weight_bytes=gathered,
        routed_buffer_bytes=routed_rows * row_bytes,
        routed_row_bytes=row_bytes,
        shared_activation_bytes=local_tokens * matmuls * shared_ffn_dim * compute_bytes,
        # x and y, and their latent projections
        activation_bytes=2 * local_tokens * (embed_dim + latent_dim) * compute_bytes,
        gather_bytes_received=gather_traffic,
    )
