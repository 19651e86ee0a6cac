"""Stage 3, plan: every static quantity the generated module needs, in plain Python.

The plan is the single source of numbers for the templates (which do no arithmetic) and
for `moegen plan`: shapes global and per device, PartitionSpecs, the routed buffer size,
and FLOP / byte / communication estimates per device.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from moegen import __version__
from moegen.load import LoadedSpec
from moegen.sizes import axes_product

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ROUTER_DTYPE = "float32"  # router math is float32 whatever the compute dtype

# ragged_dot takes groups of any size; tiled kernels (megablox, TE) will need more.
KERNEL_ROW_ALIGNMENT = {"xla": 1}

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
    kernel: str

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
    row_alignment: int  # rows per expert group are padded to a multiple of this (kernel need)
    padded_rows: int  # routed buffer rows including kernel padding

    score: str
    renormalize: bool
    activation: str
    param_dtype: str
    compute_dtype: str
    router_dtype: str

    input_partition: PartitionSpec
    params: tuple[ParamPlan, ...]
    cost: CostPlan

    def to_dict(self) -> dict:
        return asdict(self)


def make_plan(loaded: LoadedSpec) -> Plan:
    """Derive the plan of a validated spec."""
    spec = loaded.spec
    axes = dict(spec.mesh.axes)
    batch_axes = spec.batch_axes
    fsdp_axis = "fsdp" if "fsdp" in axes else None
    batch_shards = axes_product(axes, batch_axes)
    local_batch = spec.shapes.batch // batch_shards
    local_tokens = local_batch * spec.shapes.seq_len
    routed_rows = local_tokens * spec.router.top_k
    params = _param_plans(
        spec.layer.num_experts,
        spec.layer.embed_dim,
        spec.layer.ffn_dim,
        fsdp_axis,
        axes.get("fsdp", 1),
        spec.dtypes.compute,
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
        expert_axis=None,
        expert_strategy=spec.parallelism.experts,
        hardware=spec.target.hardware,
        kernel=spec.target.kernel,
        batch=spec.shapes.batch,
        seq_len=spec.shapes.seq_len,
        embed_dim=spec.layer.embed_dim,
        ffn_dim=spec.layer.ffn_dim,
        num_experts=spec.layer.num_experts,
        local_experts=spec.layer.num_experts,
        top_k=spec.router.top_k,
        batch_shards=batch_shards,
        local_batch=local_batch,
        local_tokens=local_tokens,
        routed_rows=routed_rows,
        row_alignment=KERNEL_ROW_ALIGNMENT[spec.target.kernel],
        padded_rows=routed_rows,  # ragged_dot takes any group sizes: nothing to pad
        score=spec.router.score,
        renormalize=spec.router.renormalize,
        activation=spec.layer.activation,
        param_dtype=spec.dtypes.params,
        compute_dtype=spec.dtypes.compute,
        router_dtype=ROUTER_DTYPE,
        input_partition=(batch_axes or None, None, None),
        params=params,
        cost=cost,
    )


def _param_plans(
    experts: int, embed: int, ffn: int, fsdp_axis: str | None, fsdp: int, compute_dtype: str
) -> tuple[ParamPlan, ...]:
    """Router [D, E], gate/up [E, D, F], down [E, F, D]; fsdp shards every embed_dim."""
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
        partition = tuple(fsdp_axis if i == embed_axis else None for i in range(len(shape)))
        local = tuple(n // fsdp if i == embed_axis else n for i, n in enumerate(shape))
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
    expert_flops = 6 * routed_rows * embed_dim * ffn_dim  # gate, up, down matmuls
    gathered = sum(math.prod(p.shape) * DTYPE_BYTES[p.use_dtype] for p in params)
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
        f"on a {mesh} mesh, kernel {spec.target.kernel}, target {spec.target.hardware}."
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
        f"(x top_{plan.top_k}, dropless); padded rows {plan.padded_rows} "
        f"(groups aligned to {plan.row_alignment})",
        f"  experts         {plan.num_experts} ({plan.local_experts} per device, "
        f"{plan.expert_strategy}); kernel {plan.kernel}",
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
    return "\n".join(lines)


def _spec_text(partition: PartitionSpec) -> str:
    return "P(" + ", ".join(repr(entry) for entry in partition) + ")"


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
