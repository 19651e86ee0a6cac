"""Stage 3, plan: every static quantity the generated module needs, in plain Python.

The plan is the single source of numbers for the templates (which do no arithmetic) and
for `moegen plan`: shapes global and per device, PartitionSpecs, the routed buffer size,
and FLOP / byte / communication estimates per device.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from moegen import __version__
from moegen.hardware import hardware
from moegen.load import LoadedSpec
from moegen.sizes import axes_product
from moegen.tiling import Tile, choose_tile, padded_rows

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ROUTER_DTYPE = "float32"  # router math is float32 whatever the compute dtype

PartitionSpec = tuple[str | tuple[str, ...] | None, ...]


@dataclass(frozen=True)
class ParamPlan:
    """One parameter: its global and per-device shape and how it is sharded."""

    name: str
    doc: str  # axes in words, e.g. "[NUM_EXPERTS, EMBED_DIM, FFN_DIM]"
    shape: tuple[int, ...]
    shape_names: tuple[str, ...]  # the module constants naming each dimension
    local_shape: tuple[int, ...]
    partition: PartitionSpec
    gather_axis: int | None  # dimension all-gathered over fsdp inside the layer
    use_dtype: str  # dtype it is cast to before use (and before the gather)
    init_scale: float  # std of its normal initialiser: 1/sqrt(fan_in)


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
class ExpertPlan:
    """How experts are spread and how many rows their grouped matmuls see, per device."""

    strategy: str
    axis: str | None  # "expert" or None (replicated)
    shards: int  # devices along the expert axis
    local_experts: int
    group_tokens: int  # tokens of the whole expert group (ring_of_experts gathers them)
    ffn_rows: int  # worst-case rows of one grouped-matmul call, before tile padding
    ffn_calls: int  # grouped-matmul calls per projection (ring steps when chunked)
    receive_rows: int  # ragged_all_to_all: the certified receive buffer (0 otherwise)
    overlap_chunks: int
    chunk_width: int  # embedding columns per chunk
    emulate_ragged_all_to_all: bool  # XLA:CPU lacks the op: the twin uses an all_gather twin
    communication_bytes: tuple[tuple[str, int], ...]  # forward, per strategy (the chosen first)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-device memory estimate of forward+backward, item by item, in bytes."""

    ledger: tuple[tuple[str, int], ...]  # largest first
    forward_peak: int
    train_peak: int
    hbm_bytes_per_device: int  # 0 when the target has no fixed memory (cpu)


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
    chips_per_host_bounds: tuple[int, int, int] | None
    kernel: str
    kernel_interpret: bool  # pallas kernels interpreted on CPU (the shrunken twin only)
    check_vma: bool  # shard_map's varying-axes check; off around Pallas calls
    gate_up_tile: tuple[int, int, int] | None  # megablox (rows, contraction, output)
    down_tile: tuple[int, int, int] | None

    batch: int
    seq_len: int
    embed_dim: int
    ffn_dim: int
    num_experts: int
    local_experts: int
    top_k: int
    batch_shards: int
    local_batch: int
    local_tokens: int
    routed_rows: int  # dropless: every token copy of this device has a row
    row_alignment: int  # the routed buffer's row count is a multiple of this (every row tile)
    padded_rows: int  # routed buffer rows including kernel padding
    pads_rows: bool  # padded_rows > routed_rows: the kernel gets rows of no expert group

    score: str
    renormalize: bool
    activation: str
    param_dtype: str
    compute_dtype: str
    router_dtype: str

    input_partition: PartitionSpec
    params: tuple[ParamPlan, ...]
    experts: ExpertPlan
    cost: CostPlan
    memory: MemoryPlan

    def to_dict(self) -> dict:
        return asdict(self)


def make_plan(loaded: LoadedSpec, *, interpret: bool = False) -> Plan:
    """Derive the plan of a validated spec (`interpret`: run Pallas kernels on CPU)."""
    spec = loaded.spec
    chip = hardware(spec.target.hardware)
    axes = dict(spec.mesh.axes)
    batch_axes = spec.batch_axes
    fsdp_axis = "fsdp" if "fsdp" in axes else None
    batch_shards = axes_product(axes, batch_axes)
    local_batch = spec.shapes.batch // batch_shards
    local_tokens = local_batch * spec.shapes.seq_len
    routed_rows = local_tokens * spec.router.top_k
    experts = _expert_plan(loaded, local_tokens, emulate=interpret)
    tiles = _kernel_tiles(loaded, experts.ffn_rows, experts.chunk_width)
    rows = padded_rows(experts.ffn_rows, list(tiles)) if tiles else experts.ffn_rows
    params = _param_plans(
        spec.layer.num_experts,
        spec.layer.embed_dim,
        spec.layer.ffn_dim,
        fsdp_axis,
        axes.get("fsdp", 1),
        spec.dtypes.compute,
        experts.axis,
        experts.shards,
    )
    cost = _cost_plan(
        params,
        local_tokens=local_tokens,
        routed_rows=routed_rows,
        embed_dim=spec.layer.embed_dim,
        ffn_dim=spec.layer.ffn_dim,
        num_experts=spec.layer.num_experts,
        param_bytes=DTYPE_BYTES[spec.dtypes.params],
        compute_bytes=DTYPE_BYTES[spec.dtypes.compute],
        fsdp=axes.get("fsdp", 1),
    )
    return Plan(
        moegen_version=__version__,
        module_name=loaded.source.name,
        spec_display=loaded.source.display,
        spec_sha256=loaded.source.sha256,
        description=spec.description,
        summary=_summary(loaded),
        mesh_axes=tuple(axes.items()),
        num_devices=axes_product(axes, axes),
        batch_axes=batch_axes,
        fsdp_axis=fsdp_axis,
        expert_axis=experts.axis,
        expert_strategy=spec.parallelism.experts,
        hardware=spec.target.hardware,
        topology=spec.target.topology,
        tpu_topology_name=(
            f"{chip.topology_prefix}:{spec.target.topology}" if chip.platform == "tpu" else None
        ),
        chips_per_host_bounds=(
            chip.chips_per_host_bounds(spec.target.topology) if chip.platform == "tpu" else None
        ),
        kernel=spec.target.kernel,
        kernel_interpret=interpret and spec.target.kernel == "pallas",
        check_vma=spec.target.kernel != "pallas",
        gate_up_tile=tiles[0].as_tuple() if tiles else None,
        down_tile=tiles[1].as_tuple() if tiles else None,
        batch=spec.shapes.batch,
        seq_len=spec.shapes.seq_len,
        embed_dim=spec.layer.embed_dim,
        ffn_dim=spec.layer.ffn_dim,
        num_experts=spec.layer.num_experts,
        local_experts=experts.local_experts,
        top_k=spec.router.top_k,
        batch_shards=batch_shards,
        local_batch=local_batch,
        local_tokens=local_tokens,
        routed_rows=routed_rows,
        row_alignment=math.lcm(*(t.rows for t in tiles)) if tiles else 1,
        padded_rows=rows,
        pads_rows=rows > experts.ffn_rows,
        score=spec.router.score,
        renormalize=spec.router.renormalize,
        activation=spec.layer.activation,
        param_dtype=spec.dtypes.params,
        compute_dtype=spec.dtypes.compute,
        router_dtype=ROUTER_DTYPE,
        input_partition=(batch_axes or None, None, None),
        params=params,
        experts=experts,
        cost=cost,
        memory=_memory_plan(
            cost,
            local_tokens=local_tokens,
            padded_rows=rows * experts.ffn_calls,
            embed_dim=spec.layer.embed_dim,
            ffn_dim=spec.layer.ffn_dim,
            num_experts=spec.layer.num_experts,
            compute_bytes=DTYPE_BYTES[spec.dtypes.compute],
            hbm=chip.hbm_bytes_per_device,
        ),
    )


def _expert_plan(loaded: LoadedSpec, local_tokens: int, *, emulate: bool) -> ExpertPlan:
    """Expert placement, worst-case grouped-matmul rows and communication per strategy."""
    spec = loaded.spec
    strategy = spec.parallelism.experts
    shards = spec.mesh.axes.get("expert", 1)
    local_experts = spec.layer.num_experts // shards
    top_k = spec.router.top_k
    # A token sends at most min(top_k, local_experts) copies to any one device: the most
    # rows a device can be asked to process, when every token of the group picks its experts.
    per_token = min(top_k, local_experts)
    group_tokens = local_tokens * shards
    chunks = spec.parallelism.overlap_chunks
    if strategy == "replicated":
        ffn_rows, calls = local_tokens * top_k, 1
    elif strategy == "ring_of_experts" and chunks > 1:
        ffn_rows, calls = local_tokens * per_token, shards  # one call per ring step
    else:
        ffn_rows, calls = group_tokens * per_token, 1
    compute_bytes = DTYPE_BYTES[spec.dtypes.compute]
    embed = spec.layer.embed_dim
    traffic = {
        "ragged_all_to_all": 2
        * compute_bytes
        * local_tokens
        * top_k
        * embed
        * (shards - 1)
        // shards,
        # tokens gathered in the compute dtype, partial outputs reduce-scattered in float32
        "ring_of_experts": (compute_bytes + 4) * local_tokens * embed * (shards - 1),
    }
    ordered = sorted(traffic.items(), key=lambda item: item[0] != strategy)
    return ExpertPlan(
        strategy=strategy,
        axis="expert" if shards > 1 or strategy != "replicated" else None,
        shards=shards,
        local_experts=local_experts,
        group_tokens=group_tokens,
        ffn_rows=ffn_rows,
        ffn_calls=calls,
        receive_rows=ffn_rows if strategy == "ragged_all_to_all" else 0,
        overlap_chunks=chunks,
        chunk_width=embed // chunks,
        # XLA:CPU has no ragged all-to-all: CPU twins, and modules for target cpu, emulate it
        emulate_ragged_all_to_all=strategy == "ragged_all_to_all"
        and (emulate or spec.target.hardware == "cpu"),
        communication_bytes=tuple(ordered) if strategy != "replicated" else (),
    )


def _kernel_tiles(loaded: LoadedSpec, ffn_rows: int, chunk_width: int) -> tuple[Tile, Tile] | None:
    """Megablox tiles for (gate, up) and down: pinned by the spec, else chosen here.

    With overlap chunks the gate and up matmuls contract over one chunk of the embedding.
    """
    spec = loaded.spec
    if spec.target.kernel != "pallas":
        return None  # ragged_dot takes groups of any size: nothing to tile or pad
    budget = hardware(spec.target.hardware).vmem_bytes_for_tiles
    dtype = spec.dtypes.compute
    embed, ffn = chunk_width, spec.layer.ffn_dim
    pinned = spec.target.tiles
    gate_up = (
        Tile(*pinned.gate_up)
        if pinned and pinned.gate_up
        else choose_tile(ffn_rows, embed, ffn, dtype, budget)
    )
    down = (
        Tile(*pinned.down)
        if pinned and pinned.down
        else choose_tile(ffn_rows, ffn, spec.layer.embed_dim, dtype, budget)
    )
    return gate_up, down


def _memory_plan(
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


def _param_plans(
    experts: int,
    embed: int,
    ffn: int,
    fsdp_axis: str | None,
    fsdp: int,
    compute_dtype: str,
    expert_axis: str | None,
    expert_shards: int,
) -> tuple[ParamPlan, ...]:
    """Router [D, E], gate/up [E, D, F], down [E, F, D].

    fsdp shards every embed_dim (gathered inside the layer); the expert axis shards the
    experts of the expert weights (never gathered: each device runs its own experts).
    """
    e, d, f = "NUM_EXPERTS", "EMBED_DIM", "FFN_DIM"
    # name, dimension names, shape, the embed_dim axis, dtype in use, fan-in
    layouts = (
        ("router", (d, e), (embed, experts), 0, ROUTER_DTYPE, embed),
        ("w_gate", (e, d, f), (experts, embed, ffn), 1, compute_dtype, embed),
        ("w_up", (e, d, f), (experts, embed, ffn), 1, compute_dtype, embed),
        ("w_down", (e, f, d), (experts, ffn, embed), 2, compute_dtype, ffn),
    )
    plans = []
    for name, names, shape, embed_axis, use_dtype, fan_in in layouts:
        sharded_experts = expert_axis is not None and name != "router"
        partition = tuple(
            fsdp_axis if i == embed_axis else expert_axis if i == 0 and sharded_experts else None
            for i in range(len(shape))
        )
        local = tuple(
            n // fsdp
            if i == embed_axis
            else n // expert_shards
            if i == 0 and sharded_experts
            else n
            for i, n in enumerate(shape)
        )
        plans.append(
            ParamPlan(
                name=name,
                doc="[" + ", ".join(names) + "]",
                shape=shape,
                shape_names=names,
                local_shape=local,
                partition=partition,
                gather_axis=embed_axis if fsdp_axis else None,
                use_dtype=use_dtype,
                init_scale=1.0 / math.sqrt(fan_in),
            )
        )
    return tuple(plans)


def _cost_plan(
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


def _summary(loaded: LoadedSpec) -> str:
    """One sentence stating the spec, built from validated numbers and enums only."""
    spec = loaded.spec
    renorm = ", renormalised" if spec.router.renormalize else ""
    mesh = " x ".join(f"{name} {size}" for name, size in spec.mesh.axes.items())
    return (
        f"MoE layer: {spec.layer.num_experts} {spec.layer.activation} experts "
        f"(embed {spec.layer.embed_dim}, ffn {spec.layer.ffn_dim}), top-{spec.router.top_k} "
        f"{spec.router.score} routing{renorm}, {spec.parallelism.experts} experts, "
        f"on a {mesh} mesh, kernel {spec.target.kernel}, target {spec.target.hardware}"
        + (f" {spec.target.topology}." if spec.target.topology else ".")
    )


def format_plan(plan: Plan) -> str:
    """Human-readable plan for `moegen plan`."""
    c = plan.cost
    mesh = " x ".join(f"{name}={size}" for name, size in plan.mesh_axes)
    lines = [
        f"{plan.spec_display} -> {plan.module_name}.py",
        f"  {plan.summary}",
        f"  mesh            {mesh} ({plan.num_devices} devices); batch over {plan.batch_axes}",
        f"  input           [{plan.batch}, {plan.seq_len}, {plan.embed_dim}] {plan.compute_dtype}"
        f" -> per device [{plan.local_batch}, {plan.seq_len}, {plan.embed_dim}]",
        f"  tokens/device   {plan.local_tokens}; routed rows {plan.routed_rows} "
        f"(x top_{plan.top_k}, dropless)"
        + (
            f"; grouped-matmul rows padded to {plan.padded_rows} "
            f"(a multiple of {plan.row_alignment}: whole row tiles)"
            if plan.row_alignment > 1
            else "; no row padding (groups of any size)"
        ),
        f"  experts         {plan.num_experts} ({plan.local_experts} per device, "
        f"{plan.expert_strategy}); kernel {plan.kernel}; target {plan.hardware}"
        + (f" {plan.topology}" if plan.topology else ""),
        *_expert_lines(plan),
        "  parameters:",
    ]
    for p in plan.params:
        lines.append(
            f"    {p.name:<8} {list(p.shape)} {plan.param_dtype} "
            f"spec {_spec_text(p.partition)} -> per device {list(p.local_shape)}"
        )
    lines += [
        "  per device, forward:",
        f"    FLOPs          router {c.router_flops:.3e}, experts {c.expert_flops:.3e}, "
        f"total {c.forward_flops:.3e} (train ~{c.train_flops:.3e})",
        f"    parameters     {_gib(c.param_bytes)} stored, "
        f"{_gib(c.gathered_weight_bytes)} gathered",
        f"    routed buffers {_gib(c.routed_buffer_bytes)}; activations {_gib(c.activation_bytes)}",
        f"    fsdp gather    {_gib(c.gather_bytes_received)} received",
    ]
    if plan.gate_up_tile:
        down = list(plan.down_tile or ())
        lines.append(
            f"  megablox tiles  gate/up {list(plan.gate_up_tile)}, down {down} "
            "(rows, contraction, output)"
        )
    m = plan.memory
    hbm = f" of {_gib(m.hbm_bytes_per_device)} HBM" if m.hbm_bytes_per_device else ""
    lines.append(
        f"  memory estimate forward {_gib(m.forward_peak)}, forward+backward "
        f"{_gib(m.train_peak)}{hbm} per device"
    )
    lines += [f"    {_gib(size):>12}  {name}" for name, size in m.ledger]
    return "\n".join(lines)


def _expert_lines(plan: Plan) -> list[str]:
    experts = plan.experts
    if experts.strategy == "replicated":
        return []
    calls = f" x {experts.ffn_calls} ring steps" if experts.ffn_calls > 1 else ""
    lines = [f"  expert FFN rows {experts.ffn_rows}{calls} per device, worst case (dropless)"]
    if experts.receive_rows:
        lines.append(
            f"  receive buffer  {experts.receive_rows} rows: every token of the expert group "
            f"sending min(top_k, local experts) copies here; no per-expert padding"
        )
    if experts.overlap_chunks > 1:
        lines.append(
            f"  overlap         {experts.overlap_chunks} chunks of {experts.chunk_width} columns "
            "(ring of ppermute steps, transfer of the next block under the grouped matmul)"
        )
    for name, size in experts.communication_bytes:
        chosen = " (chosen)" if name == experts.strategy else ""
        lines.append(f"  comm forward    {name:<18} {_gib(size)} per device{chosen}")
    return lines


def _spec_text(partition: PartitionSpec) -> str:
    return "P(" + ", ".join(repr(entry) for entry in partition) + ")"


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
