"""Parameter layouts: shapes, shardings, the dtype each is used in, initial scale."""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def param_plans(
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
