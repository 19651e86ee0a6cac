"""Per-device FLOPs, bytes and the memory ledger of forward+backward."""

from __future__ import annotations

import math
from dataclasses import dataclass

from moegen.plan.params import ParamPlan

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class CostPlan:
    """Per-device estimates for one forward pass (training is about 3x the FLOPs)."""

    router_flops: int
    expert_flops: int
    forward_flops: int
    train_flops: int
    param_bytes: int  # parameters as stored on one device
    gathered_weight_bytes: int  # full expert weights after the fsdp gather, in use dtype
    routed_buffer_bytes: int  # dispatched rows, gate, up, hidden and expert outputs
    activation_bytes: int  # layer input and output on one device
    gather_bytes_received: int  # fsdp all-gather traffic into one device, forward


@dataclass(frozen=True)
class MemoryPlan:
    """Per-device memory estimate of forward+backward, item by item, in bytes."""

    ledger: tuple[tuple[str, int], ...]  # largest first
    forward_peak: int
    train_peak: int
    hbm_bytes_per_device: int  # 0 when the target has no fixed memory (cpu)


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
) -> CostPlan:
    router_flops = 2 * local_tokens * embed_dim * num_experts
    # gate, up, down matmuls; with experts sharded, the group's rows average out per device
    expert_flops = 6 * routed_rows * embed_dim * ffn_dim
    # Each device gathers the fsdp shards of its own parameters (its experts only).
    gathered = sum(
        math.prod(p.local_shape)
        * (fsdp if p.gather_axis is not None else 1)
        * DTYPE_BYTES[p.use_dtype]
        for p in params
    )
    return CostPlan(
        router_flops=router_flops,
        expert_flops=expert_flops,
        forward_flops=router_flops + expert_flops,
        train_flops=3 * (router_flops + expert_flops),
        param_bytes=sum(math.prod(p.local_shape) for p in params) * param_bytes,
        gathered_weight_bytes=gathered,
        routed_buffer_bytes=routed_rows * (2 * embed_dim + 3 * ffn_dim) * compute_bytes,
        activation_bytes=2 * local_tokens * embed_dim * compute_bytes,
        gather_bytes_received=gathered * (fsdp - 1) // fsdp,
    )


def memory_plan(
    cost: CostPlan,
    *,
    local_tokens: int,
    padded_rows: int,
    embed_dim: int,
    ffn_dim: int,
    num_experts: int,
    compute_bytes: int,
    hbm: int,
) -> MemoryPlan:
    """What forward+backward keeps live on one device, by the plan's own count."""
    routed = padded_rows * (2 * embed_dim + 3 * ffn_dim) * compute_bytes
    activations = local_tokens * embed_dim * compute_bytes
    router = local_tokens * num_experts * 4 * 3  # logits, scores, their gradient (float32)
    items = {
        "parameters (stored shards)": cost.param_bytes,
        "parameter gradients (stored shards)": cost.param_bytes,
        "gathered expert weights, kept for the backward pass": cost.gathered_weight_bytes,
        "gradients of the gathered weights, before the reduce-scatter": cost.gathered_weight_bytes,
        "routed activations (dispatched rows, gate, up, hidden, expert out)": routed,
        "gradients of the routed activations": routed,
        "layer input, output and input gradient": 3 * activations,
        "router logits, scores and their gradients": router,
    }
    forward = cost.param_bytes + cost.gathered_weight_bytes + routed + 2 * activations + router // 3
    ledger = tuple(sorted(items.items(), key=lambda item: -item[1]))
    return MemoryPlan(ledger, forward, sum(items.values()), hbm)
