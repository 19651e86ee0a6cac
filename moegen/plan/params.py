"""Parameter layouts: shapes, shardings, the dtype each is used in, initial scale."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

ROUTER_DTYPE = "float32"  # router math is float32 whatever the compute dtype

PartitionSpec = tuple[str | tuple[str, ...] | None, ...]

# The FFN widths the tensor axis shards: the routed experts' and the shared expert's.
FFN_WIDTHS = ("FFN_DIM", "SHARED_FFN_DIM")
ONES = -1  # a layout's fan-in that says: starts at one


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
    ffn_axis: int | None  # the routed experts' FFN_DIM dimension (what FFN slices cut)
    use_dtype: str  # dtype it is cast to before use (and before the gather)
    init_scale: float  # std of its normal initialiser: 1/sqrt(fan_in); 0.0: starts at zero
    init_ones: bool = False  # starts at one (a norm weight or a scale), not random
    use_name: str | None = None  # its key among the weights the layer uses; None: used through
    # another's (w_up beside w_gate); set by side_by_side
    joined_with: str | None = None  # the parameter put beside it along the FFN axis

    @property
    def shape_code(self) -> str:
        """The shape as a Python tuple of the constants naming it: "(A, B)", "(A,)"."""
        names = ", ".join(self.shape_names)
        return f"({names},)" if len(self.shape_names) == 1 else f"({names})"


@dataclass(frozen=True)
class LayerShape:
    """What decides the parameter set: sizes and the optional parts of the layer."""

    experts: int
    embed: int
    ffn: int
    gated: bool
    ffn_bias: bool
    shared_ffn: int | None  # hidden width of the shared expert, None when there is none
    routing_bias: bool
    router_bias: bool = False  # the router is a linear layer with a bias
    shared_expert_gate: bool = False  # a sigmoid gate [D] on the shared expert's output
    shared_ffn_bias: bool = False  # a bias after each projection of the shared expert
    router_input_scale: bool = False  # the router's RMSNorm weight [D] (Gemma 4)
    per_expert_scale: bool = False  # each chosen weight times its expert's scale [E]
    expert_input_norm: bool = False  # the experts' input RMSNorm weight [D]
    output_norm: bool = False  # the layer's output RMSNorm weight [D]
    expert_output_norm: bool = False  # each routed expert's output RMSNorm weight [E, D]
    shared_output_norm: bool = False  # the shared expert's output RMSNorm weight [D]
    zero_computation: int = 0  # router columns past the experts (identity and zero experts)
    weighed_shared: int = 0  # router columns past those, weighing the shared experts
    router_scale: bool = False  # a learned scalar [1] times every combine weight
    latent: int = 0  # the routed experts' latent width (0: they run on embed_dim)
    latent_bias: bool = False  # a bias after each latent projection


def _layouts(layer: LayerShape, compute_dtype: str) -> list[tuple]:
    """(name, dimension names, shape, embed_dim axis or None, use dtype, fan-in or 0 = zeros)."""
    e, d, f, s = "NUM_EXPERTS", "EMBED_DIM", "FFN_DIM", "SHARED_FFN_DIM"
    E, D, F = layer.experts, layer.embed, layer.ffn
    dt = compute_dtype
    # The router scores every expert, then the zero-computation ones, then the shared experts it
    # weighs; the selection bias covers what can be chosen (not the shared experts).
    extra = layer.zero_computation + layer.weighed_shared
    c, C = ("ROUTER_COLUMNS", E + extra) if extra else (e, E)
    chosen = (c, C) if layer.zero_computation else (e, E)
    out: list[tuple] = [("router", (d, c), (D, C), 0, ROUTER_DTYPE, D)]
    if layer.router_bias:
        out.append(("router_bias", (c,), (C,), None, ROUTER_DTYPE, 0))
    if layer.routing_bias:
        out.append(("routing_bias", (chosen[0],), (chosen[1],), None, ROUTER_DTYPE, 0))
    if layer.router_scale:
        out.append(("router_scale", ("1",), (1,), None, ROUTER_DTYPE, ONES))
    # Norm weights and scales start at one (fan-in ONES); replicated: [D] and [E] vectors
    # are not worth an fsdp gather.
    if layer.router_input_scale:
        out.append(("router_input_scale", (d,), (D,), None, ROUTER_DTYPE, ONES))
    if layer.per_expert_scale:
        out.append(("per_expert_scale", (e,), (E,), None, ROUTER_DTYPE, ONES))
    if layer.expert_input_norm:
        out.append(("expert_input_norm", (d,), (D,), None, ROUTER_DTYPE, ONES))
    if layer.latent:
        out += _latent_layouts(layer, dt)
    # The routed experts' width: the latent one where the tokens are projected into it.
    r, R = ("LATENT_DIM", layer.latent) if layer.latent else (d, D)
    projections = ["gate", "up"] if layer.gated else ["up"]
    out += [(f"w_{p}", (e, r, f), (E, R, F), 1, dt, R) for p in projections]
    out.append(("w_down", (e, f, r), (E, F, R), 2, dt, F))
    if layer.ffn_bias:
        out += [(f"b_{p}", (e, f), (E, F), None, dt, 0) for p in projections]
        out.append(("b_down", (e, r), (E, R), 1, dt, 0))
    if layer.expert_output_norm:  # after the down projection, laid out like its bias
        out.append(("expert_output_norm", (e, r), (E, R), 1, ROUTER_DTYPE, ONES))
    if layer.shared_ffn:
        S = layer.shared_ffn
        out += [(f"shared_{p}", (d, s), (D, S), 0, dt, D) for p in projections]
        out.append(("shared_down", (s, d), (S, D), 1, dt, S))
        if layer.shared_ffn_bias:
            out += [(f"shared_b_{p}", (s,), (S,), None, dt, 0) for p in projections]
            # Replicated like the output it is added to (on one tensor shard only).
            out.append(("shared_b_down", (d,), (D,), None, dt, 0))
        if layer.shared_expert_gate:
            # Replicated: a [D] vector is not worth an fsdp gather.
            out.append(("shared_expert_gate", (d,), (D,), None, ROUTER_DTYPE, D))
        if layer.shared_output_norm:
            out.append(("shared_output_norm", (d,), (D,), None, ROUTER_DTYPE, ONES))
    if layer.output_norm:  # last, as in the layer: it normalises the sum of the above
        out.append(("output_norm", (d,), (D,), None, ROUTER_DTYPE, ONES))
    return out


def _latent_layouts(layer: LayerShape, dt: str) -> list[tuple]:
    """The projections into the experts' latent width and back: [D, L] and [L, D], each
    sharded over fsdp along embed_dim; their biases replicated (the output one like the
    output it is added to, on one tensor shard only)."""
    d, D, L = "EMBED_DIM", layer.embed, layer.latent
    out: list[tuple] = [
        ("latent_in", (d, "LATENT_DIM"), (D, L), 0, dt, D),
        ("latent_out", ("LATENT_DIM", d), (L, D), 1, dt, L),
    ]
    if layer.latent_bias:
        out.append(("latent_in_bias", ("LATENT_DIM",), (L,), None, dt, 0))
        out.append(("latent_out_bias", (d,), (D,), None, dt, 0))
    return out


def param_plans(
    layer: LayerShape,
    fsdp_axis: str | None,
    fsdp: int,
    compute_dtype: str,
    expert_axis: str | None,
    expert_shards: int,
    tensor_axis: str | None = None,
    tensor_shards: int = 1,
) -> tuple[ParamPlan, ...]:
    """Router [D, E] (and its biases [E]); routed experts' weights [E, ...] and biases; the
    shared expert's weights.

    fsdp shards every embed_dim, and the experts' latent width (gathered inside the layer);
    the expert axis shards the
    experts of the routed experts' weights and biases (never gathered: each device runs its
    own experts); the tensor axis shards the FFN width of the routed and the shared experts
    (never gathered: each device computes its columns' share of the output). The router, its
    biases and the shared expert are replicated over the expert axis.
    """
    plans = []
    for name, names, shape, embed_axis, use_dtype, fan_in in _layouts(layer, compute_dtype):
        sharded_experts = expert_axis is not None and routed_expert_param(names)
        ways = {
            "embed": (fsdp_axis, fsdp) if fsdp_axis else (None, 1),
            "experts": (expert_axis, expert_shards) if sharded_experts else (None, 1),
            "ffn": (tensor_axis, tensor_shards) if tensor_axis else (None, 1),
        }
        sharding = [ways.get(_role(i, n, embed_axis), (None, 1)) for i, n in enumerate(names)]
        plans.append(
            ParamPlan(
                name=name,
                doc="[" + ", ".join(names) + "]",
                shape=shape,
                shape_names=names,
                local_shape=tuple(n // ways for n, (_, ways) in zip(shape, sharding, strict=True)),
                partition=tuple(axis for axis, _ in sharding),
                gather_axis=embed_axis if fsdp_axis else None,
                ffn_axis=names.index("FFN_DIM") if "FFN_DIM" in names else None,
                use_dtype=use_dtype,
                init_scale=1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0,
                init_ones=fan_in == ONES,
                use_name=name,
            )
        )
    return tuple(plans)


def routed_expert_param(shape_names: tuple[str, ...]) -> bool:
    """Whether a parameter is the routed experts' own, one block of one or more dimensions
    per expert: their FFN weights and biases and their output norm's weights (the expert axis
    shards them, redundant slots copy them), not the router's per-expert vectors ([E])."""
    return len(shape_names) >= 2 and shape_names[0] == "NUM_EXPERTS"


def _role(index: int, name: str, embed_axis: int | None) -> str:
    """What dimension `index` (named `name`) of a parameter holds, for its sharding."""
    if index == embed_axis:
        return "embed"
    if index == 0 and name == "NUM_EXPERTS":
        return "experts"
    return "ffn" if name in FFN_WIDTHS else "other"


GATE_UP_SIDE_BY_SIDE = "w_gate_up"


def side_by_side(params: tuple[ParamPlan, ...], fused: bool) -> tuple[ParamPlan, ...]:
    """The parameters as the layer uses them: fused, w_gate is used as w_gate_up (w_up beside
    it along the FFN axis) and w_up only through it."""
    if not fused:
        return params
    return tuple(
        replace(p, use_name=GATE_UP_SIDE_BY_SIDE, joined_with="w_up")
        if p.name == "w_gate"
        else replace(p, use_name=None)
        if p.name == "w_up"
        else p
        for p in params
    )
