"""The plan object: everything static about one generated module."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moegen.plan.costs import CostPlan, MemoryPlan
from moegen.plan.experts import ExpertPlan
from moegen.plan.network import NetworkPlan
from moegen.plan.params import ParamPlan, PartitionSpec
from moegen.plan.roofline import Roofline


@dataclass(frozen=True)
class FfnChunkOption:
    """One value of memory.ffn_chunks and what it costs."""

    chunks: int
    train_peak: int  # planned forward+backward peak per device, bytes
    recompute_flops: int  # per device per training step


@dataclass(frozen=True)
class GluPlan:
    """The gated activation's parameters; None: that part is plain (no clamp, scale 1,
    offset 0), and the module has no constant for it."""

    gate_limit: float | None  # the gate clamped to at most this
    up_limit: float | None  # up clamped to [-up_limit, up_limit]
    sigmoid_scale: float | None  # swiglu: gate * sigmoid(sigmoid_scale * gate)
    up_offset: float | None  # added to up before the product
    preset: str | None  # the spec's preset name (gpt_oss), for the docstring


@dataclass(frozen=True)
class Plan:
    """Everything static about one generated module."""

    moegen_version: str
    module_name: str
    spec_display: str
    spec_sha256: str
    description: str
    summary: str

    mesh_axes: tuple[tuple[str, int], ...]
    num_devices: int
    batch_axes: tuple[str, ...]
    fsdp_axis: str | None
    expert_axis: str | None  # seam for expert parallelism; None: experts replicated
    expert_strategy: str
    hardware: str
    topology: str | None
    tpu_topology_name: str | None  # libtpu's name, e.g. "v5e:2x4"
    slices: int  # TPU slices joined by the data-center network (1: one slice)
    multislice: bool  # slices > 1: the mesh is built per slice and across slices
    devices_per_slice: int
    splits_physical_axes: bool  # some mesh axis shares a physical axis of the torus with another
    chips_per_host_bounds: tuple[int, int, int] | None
    kernel: str
    kernel_interpret: bool  # pallas kernels interpreted on CPU (the shrunken twin only)
    check_vma: bool  # shard_map's varying-axes check; off around Pallas calls and erf
    vma_unchecked_reason: str  # why it is off ('' when on)
    cuda_sm: int | None  # GPU targets: compute capability x 10 (TE is traced for it)
    te_quantization: str  # kernel te: "none" | "fp8" | "mxfp8"
    te_group_align: int  # kernel te: every expert's rows fill a multiple of this in the GEMM
    te_aligned_rows: int  # kernel te: rows of the group-aligned GEMM buffer (quantized)
    fuses_gate_up: bool  # gate and up as one grouped matmul over w_gate_up, [E, D, 2 x width]
    gate_up_outputs: tuple[str, ...]  # per gate/up grouped-matmul call: "gate_up" | "gate", "up"
    grouped_matmul_sites: int  # grouped-matmul calls in the forward code: (gate,) up, down
    gate_up_tile: tuple[int, int, int] | None  # megablox (rows, contraction, output)
    down_tile: tuple[int, int, int] | None
    ffn_layout: str  # "whole" | "sliced" (ffn_chunks > 1) | "ring_overlapped" (overlap_chunks > 1)
    ffn_chunks: int  # slices of the expert FFN width run one at a time (1: whole)
    ffn_chunk_width: int  # FFN_DIM / ffn_chunks
    recompute_flops_text: str  # cost.recompute_flops to 3 significant digits, for the docstring
    regathers_weights: bool  # sliced weights are fsdp-gathered per slice, again in the backward
    sliced_params: tuple[str, ...]  # parameters cut into FFN slices (none when whole)
    ffn_chunk_options: tuple[FfnChunkOption, ...]  # valid slice counts (powers of 2) and costs

    batch: int
    seq_len: int
    embed_dim: int
    ffn_dim: int
    num_experts: int
    local_experts: int
    copies_per_device: int  # most copies of one token a device receives: min(top_k, local_experts)
    top_k: int
    batch_shards: int
    local_batch: int
    local_tokens: int
    routed_rows: int  # dropless: every token copy of this device has a row
    row_alignment: int  # the routed buffer's row count is a multiple of this (every row tile)
    padded_rows: int  # routed buffer rows including kernel padding
    pads_rows: bool  # padded_rows > routed_rows: the kernel gets rows of no expert group

    global_tokens: int  # BATCH * SEQ_LEN: balance losses average over all of them
    score: str
    score_after_top_k: bool
    renormalize: bool
    routed_scaling: float
    scales_routing: bool  # routed_scaling != 1: the combine weights are scaled
    expert_groups: int | None  # group-limited routing, None when off
    kept_groups: int | None
    group_top_k: int | None  # a group's best selection scores summed to rank it
    ranks_groups_by_max: bool  # group_top_k == 1: a group's score is its best one
    experts_per_group: int | None
    routing_bias: bool
    router_linear_bias: bool  # logits = x @ router + router_bias
    weights_on_input: bool  # combine weights scale each copy's input (Llama 4), not its output
    selection_is_score: bool  # experts chosen by score alone: no bias, no groups, no after-top-k
    chooses_by_logit: bool  # so, by an elementwise increasing score: top-k of the logits
    route_returns_logits: bool  # the balance losses need the router logits
    load_balance_weight: float
    z_loss_weight: float
    has_load_balance_loss: bool  # load_balance_weight > 0: aux has the loss
    has_z_loss: bool  # z_loss_weight > 0: aux has the router z-loss
    capacity: int | None  # copies per expert per device; None: dropless
    drop_policy: str | None  # "probability" | "position" under a capacity
    activation: str
    gated: bool  # swiglu, geglu: a gate projection beside up
    glu: GluPlan | None  # clamps, sigmoid scale, up offset; None: the plain activation
    ffn_bias: bool
    shared_ffn_dim: int | None
    shared_expert_gate: bool  # the shared expert's output times sigmoid(x @ shared_expert_gate)
    param_dtype: str
    compute_dtype: str
    router_dtype: str

    input_partition: PartitionSpec
    params: tuple[ParamPlan, ...]
    zero_initialised: bool  # some parameters (biases) start at zero
    experts: ExpertPlan
    cost: CostPlan
    network: NetworkPlan
    roofline: Roofline
    memory: MemoryPlan

    def to_dict(self) -> dict:
        return asdict(self)
