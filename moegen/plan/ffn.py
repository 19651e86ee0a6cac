"""The routed FFN's plan: the activation and biases, how many slices of its width run at a
time, gate and up side by side or not, the megablox tiles and padded rows of each slice count,
and what each costs.

`make_plan` asks `layouts(...)(count)` for the count the spec pins or, when it pins none, for
the fewest slices that fit the target's HBM (`default_ffn_chunks`); `moegen plan` lists the
others (`ffn_chunk_options`); `ffn_plan` is what the templates read of the chosen one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from moegen.hardware import hardware
from moegen.kernels import LANES, Tile, TileRequest, kernel, padded_rows
from moegen.load import LoadedSpec
from moegen.plan.activation import GluPlan, glu_plan
from moegen.plan.costs import DTYPE_BYTES, CostPlan
from moegen.plan.experts import ExpertPlan
from moegen.plan.ffn_buffers import ffn_buffers, local_ffn_dim, recompute_flops
from moegen.plan.memory import (
    HELD_WEIGHT_GRADIENTS,
    TRADE_HEADROOM,
    MemoryPlan,
    fits,
    memory_plan,
)
from moegen.plan.params import ParamPlan, side_by_side
from moegen.plan.slicing import casts_per_slice, regathers_weights, slice_grads_by_hand
from moegen.plan.weight_reads import kernel_weight_dtype
from moegen.sizes import ffn_slice_problem
from moegen.spec import GATED_ACTIVATIONS, Spec

# Slice counts `moegen plan` lists (beside the chosen one), and the most the plan picks itself.
LISTED_CHUNKS = (1, 2, 4, 8, 16)
MAX_CHOSEN_CHUNKS = 64


@dataclass(frozen=True)
class FfnChunkOption:
    """One value of memory.ffn_chunks and what it costs."""

    chunks: int
    train_peak: int  # planned forward+backward peak per device, bytes
    recompute_flops: int  # per device per training step


@dataclass(frozen=True)
class FfnPlan:
    """The experts' FFN as the module runs it: activation, biases, shared expert, layout."""

    activation: str
    gated: bool  # swiglu, geglu: a gate projection beside up
    glu: GluPlan | None  # clamps, sigmoid scale, up offset; None: the plain activation
    shared_glu: GluPlan | None  # the shared expert's (None: plain)
    shared_glu_differs: bool  # the shared expert has its own function (or the plain one)
    bias: bool  # a bias after each projection
    shared_ffn_dim: int | None
    shared_expert_gate: bool  # the shared expert's output times sigmoid(x @ shared_expert_gate)
    shared_bias: bool  # a bias after each projection of the shared expert
    input_norm_eps: float | None  # the experts run on rms_norm(x) * expert_input_norm
    output_norm_eps: float | None  # the layer's output is rms_norm(y) * output_norm
    # each routed expert's output is rms_norm(out) * expert_output_norm[its expert]
    expert_output_norm_eps: float | None
    # the shared expert's output is rms_norm(s) * shared_output_norm
    shared_output_norm_eps: float | None
    row_experts: bool  # the grouped rows' expert ids are needed (biases, expert output norm)
    gelu_tanh: bool  # gelu / geglu use GELU's tanh approximation
    latent: int  # the routed experts' latent width (0: they run on embed_dim)
    latent_bias: bool  # a bias after each latent projection
    # down biases kept on tensor shard 0 only (the shards' outputs are summed)
    down_biases_once: tuple[str, ...]
    layout: str  # "whole" | "sliced" (chunks > 1) | "ring_overlapped" (overlap_chunks > 1)
    chunks: int  # slices of the expert FFN width run one at a time (1: whole)
    chunk_width: int  # FFN_DIM / chunks
    chunk_options: tuple[FfnChunkOption, ...]  # valid slice counts (powers of 2) and costs
    recompute_flops_text: str  # cost.recompute_flops to 3 significant digits, for the docstring
    regathers_weights: bool  # sliced weights are fsdp-gathered per slice, again in the backward
    casts_per_slice: bool  # sliced weights rounded to the compute dtype per slice (in integers)
    whole_forward: bool  # sliced: the forward pass runs the FFN whole, the backward in slices
    # sliced in token chunks: the slices' backward pass is written out, a chunk's weight
    # gradients placed in a compute-dtype buffer (slice_grads_by_hand says why)
    slice_grads_by_hand: bool
    forward_fuses_gate_up: bool  # that whole forward pass: gate and up side by side
    forward_params: tuple[ParamPlan, ...]  # the parameters as it uses them (empty: no such pass)
    sliced_params: tuple[str, ...]  # parameters cut into FFN slices (none when whole)
    fuses_gate_up: bool  # gate and up as one grouped matmul over w_gate_up, [E, D, 2 x width]
    gate_up_outputs: tuple[str, ...]  # per gate/up grouped-matmul call: "gate_up" | "gate", "up"
    grouped_matmul_sites: int  # grouped-matmul calls in the forward code: (gate,) up, down


@dataclass(frozen=True)
class FfnLayout:
    """The routed FFN run in `chunks` slices of its width."""

    chunks: int
    gate_up_outputs: tuple[str, ...]  # per gate/up grouped-matmul call: "gate_up" | "gate", "up"
    tiles: tuple[Tile, Tile] | None  # megablox (gate/up, down); None for other kernels
    rows: int  # rows of one grouped-matmul call, padded to whole row tiles
    cost: CostPlan
    memory: MemoryPlan
    # the routed weights' dtype as the kernels read them (float32: as stored, weight_reads)
    weight_dtype: str
    # sliced: the whole layout, when the forward pass runs as it does (`layouts`); None: the
    # forward pass runs in slices too
    forward_layout: FfnLayout | None = None

    @property
    def fused(self) -> bool:
        return self.gate_up_outputs == ("gate_up",)


def _slice_problem(loaded: LoadedSpec, chunks: int) -> str:
    """Why the FFN width cannot be cut into `chunks` slices ('' when it can)."""
    spec = loaded.spec
    if chunks > 1 and spec.parallelism.redundant_experts:
        return "redundant experts run the FFN whole (a slice would gather its replicas again)"
    name = spec.target.kernel
    return ffn_slice_problem(local_ffn_dim(spec), chunks, name, kernel(name).width_multiple)


def layouts(
    loaded: LoadedSpec,
    experts: ExpertPlan,
    params: tuple[ParamPlan, ...],
    base_cost: CostPlan,
    local_tokens: int,
    whole_forward: bool | None = None,
) -> Callable[[int], FfnLayout]:
    """The layout of each slice count (cached: the options and the default ask again).

    In slices, the forward pass runs the FFN as the whole layout does (its tiles, gate and up
    side by side or not) when the ledger says it holds less so (`whole_forward` pins that
    choice: the twin runs the full-size plan's path). Nothing of the forward pass is kept for
    the backward pass, which recomputes the FFN slice by slice either way; but the slices'
    down projections add up in a float32 [rows, D] sum, beside each slice's own, which
    outweighs a narrow FFN's whole-width activations (Qwen3: D 2048, FFN 768, a 262144-row
    receive buffer: 6.6 GB forward in 2 slices, 2.9 GB whole, v5e). In token chunks the
    slices keep their forward pass: a chunk's rows are few, its sliced forward is already
    below the whole layer's, and run whole it cost forward+backward more (b_qwen3_ep8 in 4
    chunks: 2.947 GB against 2.921, for a forward of 1.066 instead of 1.871).
    """
    spec = loaded.spec
    layer = spec.layer
    gated = layer.activation in GATED_ACTIVATIONS
    compute_bytes = DTYPE_BYTES[spec.dtypes.compute]
    whole_gather = "fsdp" in spec.mesh.axes
    ffn_dim = local_ffn_dim(spec)

    def layout(chunks: int) -> FfnLayout:
        return layout_reading(chunks, kernel_weight_dtype(loaded, experts, chunks))

    @functools.cache
    def layout_reading(chunks: int, weight_dtype: str) -> FfnLayout:
        """The layout of `chunks` slices whose kernels read the routed weights in
        `weight_dtype`; sliced, its whole forward pass reads them as its slices do."""
        # read as stored, side by side would be a float32 copy of gate and up
        as_stored = weight_dtype != spec.dtypes.compute
        gathered = whole_gather and chunks == 1
        fused = not as_stored and fuses_gate_up(gated, ffn_dim // chunks, gathered)
        outputs = ("gate_up",) if fused else ("gate", "up") if gated else ("up",)
        gate_up_width = ffn_dim // chunks * (2 if fused else 1)
        tiles = kernel_tiles(loaded, experts, gate_up_width, chunks, weight_dtype)
        # Every row tile the rows may meet, the whole layout's too (a forward pass it may run;
        # both depend on the rows alone and agree, so this changes no padding).
        whole_tiles = layout_reading(1, weight_dtype).tiles if chunks > 1 else ()
        row_tiles = [*tiles, *whole_tiles] if tiles else []
        rows = padded_rows(experts.ffn_rows, row_tiles) if tiles else experts.ffn_rows
        kernel_rows = rows * experts.ffn_calls  # of one token chunk (all tokens: one chunk)
        recompute = recompute_flops(spec, experts, kernel_rows, chunks)
        cost = replace(base_cost, recompute_flops=recompute)
        buffers = ffn_buffers(
            spec, experts, params, chunks, kernel_rows, len(outputs), weights_as_stored=as_stored
        )
        memory = memory_plan(
            cost,
            buffers,
            local_tokens=local_tokens,
            num_experts=layer.num_experts,
            compute_bytes=compute_bytes,
            hbm=hardware(spec.target.hardware).hbm_bytes_per_device,
            held_gradients=HELD_WEIGHT_GRADIENTS.get(spec.target.hardware, 0.0),
        )
        sliced_whole = chunks > 1 and experts.token_chunks == 1
        whole = layout_reading(1, weight_dtype) if sliced_whole else None
        if whole is None or not _forward_whole(memory, whole.memory, whole_forward):
            return FfnLayout(chunks, outputs, tiles, rows, cost, memory, weight_dtype)
        memory = replace(memory, forward_peak=whole.memory.forward_peak)
        return FfnLayout(chunks, outputs, tiles, rows, cost, memory, weight_dtype, whole)

    return layout


def _forward_whole(sliced: MemoryPlan, whole: MemoryPlan, pinned: bool | None) -> bool:
    """Whether the sliced FFN's forward pass runs whole: `pinned`, else when the whole layout's
    planned forward peak is the lower."""
    return whole.forward_peak < sliced.forward_peak if pinned is None else pinned


def ffn_plan(
    loaded: LoadedSpec,
    chosen: FfnLayout,
    layout: Callable[[int], FfnLayout],
    experts: ExpertPlan,
    params: tuple[ParamPlan, ...],
) -> FfnPlan:
    """The FFN of a validated spec in its `chosen` layout (`layout`: every slice count's)."""
    spec = loaded.spec
    layer = spec.layer
    chunks = chosen.chunks
    forward = chosen.forward_layout
    return FfnPlan(
        activation=layer.activation,
        gated=layer.activation in GATED_ACTIVATIONS,
        glu=glu_plan(layer.glu_params, layer.glu),
        shared_glu=glu_plan(layer.shared_glu_params, layer.shared_glu),
        shared_glu_differs=layer.shared_glu is not None
        and layer.shared_glu_params != layer.glu_params,
        bias=layer.ffn_bias,
        shared_ffn_dim=layer.shared_ffn_dim,
        shared_expert_gate=layer.shared_expert_gate,
        shared_bias=layer.shared_ffn_bias,
        input_norm_eps=layer.expert_input_norm_eps,
        output_norm_eps=layer.output_norm_eps,
        expert_output_norm_eps=layer.expert_output_norm_eps,
        shared_output_norm_eps=layer.shared_output_norm_eps,
        row_experts=layer.ffn_bias or layer.expert_output_norm_eps is not None,
        gelu_tanh=layer.gelu_approximation == "tanh",
        latent=layer.latent_dim or 0,
        latent_bias=layer.latent_bias,
        down_biases_once=_down_biases_once(spec),
        layout=_layout_name(experts, chunks),
        chunks=chunks,
        chunk_width=local_ffn_dim(spec) // chunks,
        chunk_options=ffn_chunk_options(loaded, chunks, layout),
        recompute_flops_text=f"{chosen.cost.recompute_flops:.3g}",
        regathers_weights=regathers_weights(spec, chunks),
        casts_per_slice=casts_per_slice(spec, chunks),
        whole_forward=forward is not None,
        slice_grads_by_hand=slice_grads_by_hand(spec, chunks, experts),
        forward_fuses_gate_up=forward is not None and forward.fused,
        forward_params=() if forward is None else side_by_side(params, forward.fused),
        sliced_params=tuple(p.name for p in params if chunks > 1 and p.ffn_axis is not None),
        fuses_gate_up=chosen.fused,
        gate_up_outputs=chosen.gate_up_outputs,
        grouped_matmul_sites=len(chosen.gate_up_outputs) + 1,  # and down
    )


def _down_biases_once(spec: Spec) -> tuple[str, ...]:
    """With a tensor axis each shard computes its FFN columns' share of the output, and the
    shares are summed: a down bias is added on one shard only."""
    if "tensor" not in spec.mesh.axes:
        return ()
    layer = spec.layer
    return (
        (("b_down",) if layer.ffn_bias else ())
        + (("shared_b_down",) if layer.shared_ffn_bias else ())
        + (("latent_out_bias",) if layer.latent_bias else ())
    )


def _layout_name(experts: ExpertPlan, chunks: int) -> str:
    """How the routed FFN runs: "ring_overlapped" (gate and up chunk by chunk of the embedding
    around the ring, in the strategy's code), "sliced" (slices of the FFN width one at a time),
    or "whole"."""
    if experts.overlap_chunks > 1:
        return "ring_overlapped"
    return "sliced" if chunks > 1 else "whole"


def chosen_layout(
    loaded: LoadedSpec,
    layout: Callable[[int], FfnLayout],
    ffn_chunks: int | None,
    token_chunks: int,
) -> FfnLayout:
    """The pinned slice count (`ffn_chunks`), else the plan's (`default_ffn_chunks`)."""
    return layout(ffn_chunks or default_ffn_chunks(loaded, layout, token_chunks))


def default_ffn_chunks(
    loaded: LoadedSpec, layout: Callable[[int], FfnLayout], token_chunks: int
) -> int:
    """Whole (no recomputation) when the layer fits the target's memory; else the fewest FFN
    slices that fit with the ledger's headroom (TRADE_HEADROOM), or failing that the count
    that fits planned lowest (whole when none does: slicing would not save it). A slice count
    whose pinned tiles would not fit VMEM is skipped: sliced, the down projection writes
    float32, and its weight gradient holds blocks of that gradient. With token chunks, 1:
    slices in each chunk are a choice the spec makes (the refusal names the counts that fit)."""
    hbm = hardware(loaded.spec.target.hardware).hbm_bytes_per_device
    if not hbm or loaded.spec.parallelism.overlap_chunks != 1 or token_chunks > 1:
        return 1
    if layout(1).memory.train_peak <= hbm:
        return 1
    counts = [
        c
        for c in range(2, MAX_CHOSEN_CHUNKS + 1)
        if not _slice_problem(loaded, c) and not pinned_tile_problems(loaded, c)
    ]
    fitting = [c for c in counts if layout(c).memory.train_peak <= hbm]
    roomy = (c for c in fitting if fits(layout(c).memory, TRADE_HEADROOM))
    lowest = min(fitting, key=lambda c: layout(c).memory.train_peak, default=1)
    return next(roomy, lowest)


def ffn_chunk_options(
    loaded: LoadedSpec, chosen: int, layout: Callable[[int], FfnLayout]
) -> tuple[FfnChunkOption, ...]:
    """The valid power-of-two slice counts up to 16 (and the chosen one), costed with the
    spec's token chunks; none with the overlapped ring (it cuts the layer another way)."""
    if loaded.spec.parallelism.overlap_chunks != 1:
        return ()
    counts = {c for c in LISTED_CHUNKS if c == 1 or not _slice_problem(loaded, c)}
    options = []
    for count in sorted(counts | {chosen}):
        option = layout(count)
        options.append(FfnChunkOption(count, option.memory.train_peak, option.cost.recompute_flops))
    return tuple(options)


def pinned_tile_problems(loaded: LoadedSpec, ffn_chunks: int) -> list[tuple[str, str]]:
    """(projection, problem) for each pinned tile that cannot run with `ffn_chunks` slices."""
    return kernel(loaded.spec.target.kernel).pinned_tile_problems(loaded, ffn_chunks)


def kernel_tiles(
    loaded: LoadedSpec,
    experts: ExpertPlan,
    gate_up_width: int,
    ffn_chunks: int,
    weight_dtype: str,
) -> tuple[Tile, Tile] | None:
    """The tiles of the gate/up calls and of down, where the kernel runs in tiles (its module
    takes them pinned or chooses them); None where it takes groups of any size."""
    spec = loaded.spec
    choose = kernel(spec.target.kernel).tiles
    if choose is None:
        return None  # nothing to tile or pad
    request = TileRequest(
        rows=experts.ffn_rows,
        groups=experts.local_slots,
        gate_up_contraction=experts.chunk_width,
        gate_up_width=gate_up_width,
        down_contraction=local_ffn_dim(spec) // ffn_chunks,
        ffn_chunks=ffn_chunks,
        weight_dtype=weight_dtype,
    )
    return choose(loaded, request)


def fuses_gate_up(gated: bool, width: int, gathers_whole_weights: bool) -> bool:
    """Gate and up as one grouped matmul over their weights side by side (the rows read once,
    one row gradient instead of two to add): when the layer is gated, the FFN width of a call
    is whole 128-lane tiles, so that up starts on a lane tile (splitting the result elsewhere
    costs XLA a copy of it), and fsdp does not gather the whole weights. Gathered whole, gate
    and up (the largest buffers) and their gradients would be one buffer each, which XLA can
    no longer gather or reduce-scatter one after the other: measured on v5e, libtpu 0.0.51,
    mixtral_8x7b_v5e peaks 1.18 GiB higher fused. Per FFN slice or unsharded, fused is lighter
    (the memory reference in 8 slices: 3.24 GiB instead of 3.63)."""
    return gated and width % LANES == 0 and not gathers_whole_weights
