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
    gated: bool,
    shared_ffn_dim: int,
) -> CostPlan:
    router_flops = 2 * local_tokens * embed_dim * num_experts
    # (gate,) up, down matmuls; with experts sharded, the group's rows average out per device
    matmuls = 3 if gated else 2
    expert_flops = 2 * matmuls * routed_rows * embed_dim * ffn_dim
    shared_flops = 2 * matmuls * local_tokens * embed_dim * shared_ffn_dim
    # the row and its output [D] each; gate, up and hidden (or up and hidden) [F]
    row_bytes = (2 * embed_dim + matmuls * ffn_dim) * compute_bytes
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
        activation_bytes=2 * local_tokens * embed_dim * compute_bytes,
        gather_bytes_received=gather_traffic,
    )


@dataclass(frozen=True)
class FfnBuffers:
    """What sizes the routed FFN's buffers on one device."""

    rows: int  # rows of the grouped-matmul calls, padding and ring steps included
    embed_dim: int
    width: int  # FFN columns computed at once: FFN_DIM, or one slice of it
    chunks: int  # FFN slices run one at a time (1: whole)
    matmuls: int  # 3 gated (gate, up, down), 2 plain
    gate_up_calls: int  # grouped-matmul calls for gate and up: 1 side by side (or up alone), 2
    sliced_cast_bytes: int  # the sliced weights' local shards in the compute dtype
    token_chunks: int = 1  # chunks of the device's tokens run one at a time (rows: one chunk's)
    kept_output_bytes: int = 0  # every token chunk's expert outputs, kept for the backward


def memory_plan(
    cost: CostPlan,
    ffn: FfnBuffers,
    *,
    local_tokens: int,
    num_experts: int,
    compute_bytes: int,
    hbm: int,
) -> MemoryPlan:
    """What one device holds at the peak of the forward pass and of forward+backward.

    The training peak is in the backward pass of the expert FFN (of its last slice when
    sliced): beside the parameters, their gradients and the layer input, the routed rows
    kept for it, the gradient of the expert output, and the FFN activations being
    differentiated ((gate,) up, the hidden gradient and one projection's gradient). Whole, the
    gathered weights stay live from the forward pass; sliced, only one slice's are, beside the
    stored shards cast once to the compute dtype (the compiler hoists the cast out of the
    loop), and the row gradient is summed over slices in float32.
    """
    row_block = ffn.rows * ffn.embed_dim * compute_bytes  # one [rows, D] buffer
    activation = ffn.rows * ffn.width * compute_bytes  # one [rows, width] buffer
    x = local_tokens * ffn.embed_dim * compute_bytes
    router = local_tokens * num_experts * 4 * 3  # logits, scores, their gradient (float32)
    shared = cost.shared_activation_bytes
    items = {
        "parameters (stored shards)": cost.param_bytes,
        "parameter gradients (stored shards)": cost.param_bytes,
        "layer input and its gradient": 2 * x,
        "routed rows, kept for the backward pass": row_block,
        "gradient of the routed experts' output": row_block,
        f"FFN activations and gradients at the backward peak ({ffn.matmuls + 1} x [rows, "
        f"{ffn.width}])": (ffn.matmuls + 1) * activation,
        "router logits, scores and their gradients": router,
    }
    if ffn.chunks == 1:
        items["gathered expert weights, kept for the backward pass"] = cost.gathered_weight_bytes
        forward_weights = cost.gathered_weight_bytes
    else:
        sliced = cost.gathered_weight_bytes // ffn.chunks
        items["one FFN slice's weights, gathered"] = sliced
        items["stored expert weights cast to the compute dtype once"] = ffn.sliced_cast_bytes
        items["row gradient, summed over the slices in float32"] = ffn.rows * ffn.embed_dim * 4
        # One row gradient per grouped-matmul call that reads the rows.
        items["the slice's row gradients"] = ffn.gate_up_calls * row_block
        forward_weights = sliced + ffn.sliced_cast_bytes
    if ffn.token_chunks > 1:
        items[f"expert outputs of the {ffn.token_chunks} token chunks, kept"] = (
            ffn.kept_output_bytes
        )
    if shared:
        items["shared expert activations and their gradients"] = 2 * shared
    # Forward: received and sorted rows, two [rows, width] activations at once (the
    # projection being computed and the one before it), the output (float32 summed when sliced).
    forward = (
        cost.param_bytes
        + 2 * x
        + forward_weights
        + 2 * row_block
        + 2 * activation
        + (ffn.rows * ffn.embed_dim * 4 if ffn.chunks > 1 else 0)
        + shared
        + router // 3
    )
    ledger = tuple(sorted(items.items(), key=lambda item: -item[1]))
    return MemoryPlan(ledger, forward, sum(items.values()), hbm)
