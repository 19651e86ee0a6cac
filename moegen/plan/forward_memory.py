"""The memory ledger's forward pass, the FFN whole: the temporaries XLA places for it, as
measured in its buffer assignment of the committed TPU examples (bench/LEDGER.md)."""

from __future__ import annotations

from moegen.plan.costs import CostPlan
from moegen.plan.ffn_buffers import FfnBuffers

# XLA's block of temporaries over the forward's live peak, where the activations fit in the
# space the rows free (`_forward_fits`): measured 1.06 (qwen3_30b_a3b_chunked_v5e: two
# [rows, D] and the cast weights) to 1.35 (qwen3_30b_a3b_v6e: the gathered weights alternate
# between two slots); the fraction that minimises the worst error over the whole-FFN TPU
# examples. Where the activations are wider than the rows, the forward has no fraction: they
# are stacked (`_stacked_forward`).
FORWARD_PACKING = 0.14


def whole_forward_temporaries(cost: CostPlan, ffn: FfnBuffers, compute_bytes: int) -> int:
    """The forward pass's temporaries, the FFN whole, as XLA places them (bench/LEDGER.md)."""
    if ffn.width > ffn.embed_dim:
        return _stacked_forward(cost, ffn, compute_bytes)
    return int((1 + FORWARD_PACKING) * _forward_fits(cost, ffn, compute_bytes))


def _forward_activations(ffn: FfnBuffers) -> tuple[int, int]:
    """[rows, width] buffers live (beside the rows at the last gate/up call, at the hidden).
    XLA writes the hidden activation over its operand's buffer (the elementwise fusion aliases
    it: silu(gate) * up over gate, as measured on v5e and tpu7x; act(up) over up alike), so a
    gated FFN in two calls never holds three; side by side, the hidden is narrower than the
    gate_up buffer and needs its own.
    With biases, the (gate and) up biases gathered per row are live too."""
    biases = ffn.matmuls - 1 if ffn.biased else 0
    outputs = ffn.matmuls - 1  # (gate,) up
    fused = ffn.matmuls == 3 and ffn.gate_up_calls == 1
    return outputs + biases, outputs + int(fused) + biases


def _forward_weights(cost: CostPlan, ffn: FfnBuffers) -> int:
    """The expert weights in the compute dtype that the forward's live peak holds: under fsdp
    one gathered weight (XLA gathers each just before its matmul); without it, in a ring, or
    in token chunks (the weights are gathered once, before the scan over the chunks: olmoe
    over fsdp 8 in 4 chunks held all three), all of them, cast once. Read as stored by the
    kernels, none: the stored weights are the parameters the ledger counts already."""
    if ffn.weights_as_stored:
        return 0
    if ffn.gathers_whole and not ffn.ring and ffn.token_chunks == 1:
        return cost.gathered_weight_bytes // ffn.matmuls
    return cost.gathered_weight_bytes


def _forward_fits(cost: CostPlan, ffn: FfnBuffers, compute_bytes: int) -> int:
    """The forward's live peak where an activation is no wider than a [rows, D] buffer: it fits
    where the rows were, and XLA packs the block as it does its live peak (FORWARD_PACKING).
    The peak is the largest of three moments beside the weights: two [rows, D] buffers (the
    received rows and their sort by expert; gathered locally, the sorted rows and the expert
    output), the rows beside the gate and up outputs at the last gate/up call, and the
    activations at the hidden (qwen3_30b_a3b_v6e, qwen3_30b_a3b_chunked_v5e as measured)."""
    rows = ffn.rows // ffn.calls  # one grouped-matmul call's (one ring step's)
    activation = rows * ffn.width * compute_bytes
    row_block = rows * ffn.embed_dim * compute_bytes
    at_call, at_hidden = _forward_activations(ffn)
    moments = (2 * row_block, row_block + at_call * activation, at_hidden * activation)
    return max(moments) + _forward_weights(cost, ffn)


def _stacked_forward(cost: CostPlan, ffn: FfnBuffers, compute_bytes: int) -> int:
    """The forward's temporaries where an activation is wider than a [rows, D] buffer: it fits
    in no space the rows free, so XLA places the activations above the buffers live during the
    FFN, with no gap: two [rows, D] buffers (the exchange's received and sorted rows; gathered
    locally, the sorted rows and the expert output) and, under fsdp, the gathered weights in
    two slots (the one in use and the next, gathered while it is used). No packing fraction:
    measured, the block is that stack to within 3% (mixtral_8x7b_2slices_v5e, the tensor
    example compiled for v5e) and mixtral_8x7b_v5e's is its two weight slots and two
    activations; on tpu7x the scheduler starts every weight's gather at once (10% more)."""
    rows = ffn.rows // ffn.calls
    activations = max(_forward_activations(ffn)) * rows * ffn.width * compute_bytes
    row_blocks = 2 * rows * ffn.embed_dim * compute_bytes
    slots = 2 if ffn.gathers_whole and not ffn.ring and ffn.token_chunks == 1 else 1
    return activations + row_blocks + slots * _forward_weights(cost, ffn)
