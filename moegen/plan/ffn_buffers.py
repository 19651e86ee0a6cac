"""What the memory ledger counts of the routed FFN (FfnBuffers) in a given number of
slices, and the FLOPs its slices or token chunks recompute."""

from __future__ import annotations

import math
from dataclasses import dataclass

from moegen.kernels import kernel
from moegen.plan.costs import DTYPE_BYTES
from moegen.plan.experts import ExpertPlan
from moegen.plan.params import ParamPlan
from moegen.plan.replicas import expert_bytes
from moegen.plan.slicing import casts_per_slice, regathers_weights, slice_grads_by_hand
from moegen.spec import GATED_ACTIVATIONS, Spec
from moegen.strategies import strategy


@dataclass(frozen=True)
class FfnBuffers:
    """What sizes the routed FFN's buffers on one device."""

    rows: int  # rows of the grouped-matmul calls, padding and ring steps included
    embed_dim: int  # the rows' width: embed_dim, or the experts' latent width
    width: int  # FFN columns computed at once: FFN_DIM, or one slice of it
    chunks: int  # FFN slices run one at a time (1: whole)
    matmuls: int  # 3 gated (gate, up, down), 2 plain
    gate_up_calls: int  # grouped-matmul calls for gate and up: 1 side by side (or up alone), 2
    sliced_cast_bytes: int  # the sliced weights' local shards cast to the compute dtype
    sliced_kept_bytes: int = 0  # the same, uncast, kept whole by the forward for the backward
    exchanged: bool = False  # the rows arrive by ragged all-to-all (and go back so)
    ring: bool = False  # a gathering strategy: the group's tokens, outputs reduce-scattered in f32
    gathers_whole: bool = False  # fsdp gathers the whole expert weights (FFN not sliced)
    biased: bool = False  # a bias after each projection, gathered per row
    calls: int = 1  # grouped-matmul calls per projection (ring steps, overlapped)
    token_chunks: int = 1  # chunks of the device's tokens run one at a time (rows: one chunk's)
    kept_output_bytes: int = 0  # every token chunk's expert outputs, kept for the backward
    # the sliced weights' stored shards, in the dtype of a token chunk's gradient buffer (the
    # parameter dtype, or the compute dtype where the slices' backward is written out)
    sliced_param_bytes: int = 0
    # the weight gradients are all-reduced over data or sequence shards (no fsdp: it
    # reduce-scatters them)
    all_reduced: bool = False
    # redundant expert slots: the replicas' weights received, in the compute dtype (their
    # gradients, sent back, as many bytes), and every slot's weights (the own experts' and the
    # replicas') concatenated for the grouped matmul
    replica_bytes: int = 0
    slot_weight_bytes: int = 0
    # the mesh shards nothing but the FFN columns (tensor alone): every device routes all
    # the tokens and holds every expert's slice of columns
    tensor_alone: bool = False
    # the kernels read the stored float32 weights and cast each block in VMEM: no copy of the
    # weights in the compute dtype is made (moegen.plan.weight_reads)
    weights_as_stored: bool = False


def local_ffn_dim(spec: Spec) -> int:
    """The expert FFN columns one device holds: FFN_DIM over the tensor axis."""
    return spec.layer.ffn_dim // spec.tensor_shards


def recompute_flops(spec: Spec, experts: ExpertPlan, kernel_rows: int, chunks: int) -> int:
    """FFN slices and token chunks, alone or together, run (gate and) up once more in the
    backward pass."""
    if chunks == 1 and experts.token_chunks == 1:
        return 0
    matmuls = 3 if spec.layer.activation in GATED_ACTIVATIONS else 2
    rows = kernel_rows * experts.token_chunks
    return 2 * (matmuls - 1) * rows * spec.layer.routed_dim * local_ffn_dim(spec)


def ffn_buffers(
    spec: Spec,
    experts: ExpertPlan,
    params: tuple[ParamPlan, ...],
    chunks: int,
    kernel_rows: int,
    gate_up_calls: int,
    *,
    weights_as_stored: bool = False,
) -> FfnBuffers:
    """The buffers the ledger counts for the FFN run in `chunks` slices."""
    compute_bytes = DTYPE_BYTES[spec.dtypes.compute]
    param_bytes = DTYPE_BYTES[spec.dtypes.params]
    ffn_params = [p for p in params if p.ffn_axis is not None]
    axes = spec.mesh.axes
    routes = strategy(experts.strategy)
    extra = spec.parallelism.redundant_experts // experts.shards
    one_expert = expert_bytes(params, axes.get("fsdp", 1))
    compute_copy = sum(math.prod(p.local_shape) * compute_bytes for p in ffn_params)
    # Cast slice by slice, only the slice's copy is live (counted as gathered). Stored in the
    # compute dtype and read in place by the kernel, nothing is copied, but the forward keeps
    # the slices' weights whole for the backward pass, unless fsdp gathers each slice again
    # there (in token chunks it gathers the weights once, before the chunks: kept too).
    in_place = param_bytes == compute_bytes and kernel(spec.target.kernel).reads_weights_in_place
    casts_once = chunks > 1 and not casts_per_slice(spec, chunks) and not in_place
    regathers = regathers_weights(spec, chunks) and experts.token_chunks == 1
    keeps_slices = chunks > 1 and in_place and not regathers
    return FfnBuffers(
        rows=kernel_rows,
        embed_dim=spec.layer.routed_dim,
        width=local_ffn_dim(spec) // chunks,
        chunks=chunks,
        matmuls=3 if spec.layer.activation in GATED_ACTIVATIONS else 2,
        gate_up_calls=gate_up_calls,
        sliced_cast_bytes=compute_copy if casts_once else 0,
        sliced_kept_bytes=compute_copy if keeps_slices else 0,
        sliced_param_bytes=sum(math.prod(p.local_shape) for p in ffn_params)
        * (compute_bytes if slice_grads_by_hand(spec, chunks, experts) else param_bytes),
        token_chunks=experts.token_chunks,
        kept_output_bytes=_kept_output_bytes(experts, kernel_rows, spec, compute_bytes),
        exchanged=routes.exchanges_rows and experts.shards > 1,
        gathers_whole=axes.get("fsdp", 1) > 1 and chunks == 1,
        biased=spec.layer.ffn_bias,
        ring=routes.gathers_group,
        calls=experts.ffn_calls,
        all_reduced="fsdp" not in axes
        and any(axes.get(axis, 1) > 1 for axis in ("data", "sequence")),
        replica_bytes=extra * one_expert,
        slot_weight_bytes=(experts.local_experts + extra) * one_expert if extra else 0,
        tensor_alone={axis for axis, size in axes.items() if size > 1} == {"tensor"},
        weights_as_stored=weights_as_stored,
    )


def _kept_output_bytes(experts: ExpertPlan, rows: int, spec: Spec, compute_bytes: int) -> int:
    """What the token chunks keep for the backward pass: each chunk's expert outputs as they
    are combined: a gathering strategy's grouped-matmul rows of the group's tokens, else this
    device's copies (returned to it, or sorted where they stay). 0 without token chunks."""
    if experts.token_chunks == 1:
        return 0
    gathers = strategy(experts.strategy).gathers_group
    kept_rows = rows if gathers else experts.call_tokens * spec.router.top_k
    return experts.token_chunks * kept_rows * spec.layer.routed_dim * compute_bytes
