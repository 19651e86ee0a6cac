"""Hypothesis strategies over the spec space, as choices for `spec_builder.spec_yaml`.

`choices()` draws in the order a user decides: the target (hardware, slice, slices, kernel,
quantization), the layer (a real model's sizes or tiny ones), the router, the strategy and
the mesh that spans the target's devices, shapes, dtypes, FFN slices. Each option is drawn
from the values the rules accept together, so most specs validate; then, one time in four,
one mistake (MISTAKES) breaks a rule, so that refusals are drawn too. A few options are drawn
without regard to the rules that bound them (pinned tiles against VMEM, FFN slices against
pallas lanes, quantized widths, int32 sizes on realistic shapes): whichever way those fall,
the spec is one a user could write.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from moegen.hardware import CATALOGUE
from moegen.kernels import KERNELS
from moegen.sizes import divisors
from moegen.strategies import STRATEGIES as STRATEGY_REGISTRY

HARDWARE = list(CATALOGUE)
# (experts, embed, ffn, top_k) of published MoE layers
REAL_LAYERS = {
    "mixtral_8x7b": (8, 4096, 14336, 2),
    "qwen3_30b_a3b": (128, 2048, 768, 8),
    "deepseek_v3": (256, 7168, 2048, 8),
    "gpt_oss_120b": (128, 2880, 2880, 4),
    "llama4_scout": (16, 5120, 8192, 1),
    "phi35_moe": (16, 4096, 6400, 2),
    "qwen2_57b_a14b": (64, 3584, 2560, 8),
    "grok1": (8, 6144, 32768, 2),
    "dbrx": (16, 6144, 10752, 4),
}
TINY_EMBED = [128, 64, 256, 32, 8, 16, 384, 512, 96]
TINY_FFN = [128, 64, 256, 512, 16, 24, 96, 384, 768]
TINY_EXPERTS = [8, 4, 2, 1, 16, 3, 6, 32, 64]
STRATEGIES = list(STRATEGY_REGISTRY)
DESCRIPTIONS = ["", "A layer.", 'Quotes " and # hash', "Überschrift: naïve façade", "x" * 200]


def topologies(hardware: str, small: bool) -> list[str]:
    chip = CATALOGUE[hardware]
    if not small:
        return list(chip.topologies)
    return [t for t in chip.topologies if chip.devices(t) <= 16] or list(chip.topologies[:1])


def _kernels_on(chip: Any) -> list[str]:
    """The kernels the registry says run on `chip` (its platform and, on a GPU, its SM)."""
    return [name for name, kernel in KERNELS.items() if kernel.runs_on(chip.platform, chip.sm)]


@st.composite
def targets(draw: st.DrawFn, hardware: list[str] = HARDWARE, small: bool = False) -> dict:
    """hardware, topology, slices, kernel, quantization; and `devices`, the mesh size."""
    name = draw(st.sampled_from(hardware))
    chip = CATALOGUE[name]
    out: dict[str, Any] = {"hardware": name}
    if chip.platform == "cpu":
        out["devices"] = draw(st.sampled_from([4, 1, 2, 8, 3, 6, 16, 32]))
        kernels = _kernels_on(chip)
    else:
        topology = draw(st.sampled_from(topologies(name, small or draw(st.booleans()))))
        out["topology"] = int(topology) if topology.isdigit() else topology
        slices = 1
        if chip.platform == "tpu":
            slices = draw(st.sampled_from([1, 2] if small else [1, 2, 4]))
            if slices > 1 or draw(st.booleans()):
                out["slices"] = slices
        out["devices"] = chip.devices(topology) * slices
        kernels = _kernels_on(chip)
    out["kernel"] = draw(st.sampled_from(kernels))
    if out["kernel"] == "te":
        out["quantization"] = draw(st.sampled_from(["none", "fp8", "mxfp8"]))
    elif draw(st.booleans()):
        out["quantization"] = "none"
    return out


@st.composite
def layers(draw: st.DrawFn, tiny_only: bool = False) -> dict:
    if not tiny_only and draw(st.booleans()):
        experts, embed, ffn, top_k = REAL_LAYERS[draw(st.sampled_from(list(REAL_LAYERS)))]
    else:
        experts = draw(st.sampled_from(TINY_EXPERTS))
        embed, ffn = draw(st.sampled_from(TINY_EMBED)), draw(st.sampled_from(TINY_FFN))
        top_k = draw(st.integers(1, min(experts, 8)))
    out = {"experts": experts, "embed": embed, "ffn": ffn, "top_k": top_k}
    activation = draw(st.sampled_from([None, "swiglu", "geglu", "gelu", "relu", "relu2"]))
    if activation is not None:
        out["activation"] = activation
    if activation in (None, "swiglu", "geglu") and draw(st.booleans()):
        glus = ["gpt_oss", {"gate_limit": 7.0, "up_limit": 7.0}, {"up_offset": 1.0}]
        out["glu"] = draw(st.sampled_from(glus if activation != "geglu" else glus[1:]))
    if draw(st.booleans()):
        out["ffn_bias"] = draw(st.booleans())
    if draw(st.booleans()):
        out["shared_ffn"] = draw(st.sampled_from([ffn, 2 * ffn, 64]))
        if draw(st.booleans()):
            out["shared_expert_gate"] = True
    return out


@st.composite
def routers(draw: st.DrawFn, experts: int, top_k: int) -> dict:
    score = draw(st.sampled_from(["softmax", "sigmoid", "sqrtsoftplus"]))
    out: dict[str, Any] = {"score": score}
    out["renormalize"] = top_k > 1 and draw(st.booleans())
    after = score == "softmax" and top_k > 1 and not out["renormalize"] and draw(st.booleans())
    if after:
        out["score_after_top_k"] = True
    scaling = draw(st.sampled_from([None, 1.0, 2.5, 0.5]))
    if scaling is not None:
        out["routed_scaling"] = scaling
    limits = [
        {"groups": groups, "keep": keep, "top_per_group": top}
        for groups in divisors(experts)
        if groups > 1
        for keep in range(-(-top_k // (experts // groups)), groups)
        for top in (1, 2)
        if top <= experts // groups
    ]
    if limits and not after and draw(st.booleans()):
        out["group_limit"] = draw(st.sampled_from(limits))
    if not after and draw(st.booleans()):
        out["routing_bias"] = True
    if draw(st.booleans()):
        out["linear_bias"] = True
    if draw(st.booleans()):
        out["weighting"] = draw(st.sampled_from(["input", "output"]))
    for name, weights in (("load_balance_loss", [0.01, 0.0]), ("z_loss", [0.001, 0.0])):
        if draw(st.booleans()):
            out[name] = draw(st.sampled_from(weights))
    if out.get("load_balance_loss") or out.get("routing_bias"):
        capacity = draw(st.sampled_from([None, (1.25, "probability"), (1.0, "position"), 2.0]))
        if capacity is not None:  # a bare factor: drop takes its default
            out["capacity"] = capacity if isinstance(capacity, tuple) else {"factor": capacity}
    # identity experts: not with what counts per expert (identity_experts_stand_alone)
    alone = not any(out.get(k) for k in ("capacity", "group_limit", "load_balance_loss"))
    if alone and draw(st.booleans()):
        out["identity_experts"] = draw(st.sampled_from([0, 1, 2, experts]))
        out["zero_experts"] = draw(st.sampled_from([0, 0, 1, 3]))
    return out


@st.composite
def meshes(draw: st.DrawFn, devices: int, experts: int, embed: int, strategy: str) -> dict:
    """Axes whose sizes multiply to `devices`: expert divides the experts, fsdp the embed."""
    expert = 1
    if strategy != "replicated":
        expert = draw(st.sampled_from(divisors(math.gcd(devices, experts))[::-1]))
    rest = devices // expert
    fsdp = draw(st.sampled_from([d for d in divisors(rest) if embed % d == 0][::-1]))
    data = rest // fsdp
    sizes = {"data": data, "fsdp": fsdp, "expert": expert}
    present = [a for a in ("data", "fsdp") if sizes[a] > 1 or draw(st.booleans())]
    present += ["expert"] if strategy != "replicated" else []
    present = present or ["data"]
    order = draw(st.permutations(present))
    out: dict[str, Any] = {"axes": {axis: sizes[axis] for axis in order}}
    if draw(st.integers(0, 3)) == 0:
        out["batch_axes"] = draw(st.permutations(present))
    return out


def cross_slices(axes: dict[str, int], slices: int) -> dict:
    """The dcn_axes (and expert_over_dcn) that put `slices` slices on one axis."""
    for axis in ("data", "fsdp", "expert"):
        if axes.get(axis, 0) % slices == 0 and axis in axes:
            out: dict[str, Any] = {"dcn_axes": {axis: slices}}
            return out | ({"expert_over_dcn": True} if axis == "expert" else {})
    return {}  # no axis splits: the spec is refused (dcn_axes_span_the_slices)


@st.composite
def pallas_tiles(draw: st.DrawFn) -> dict:
    lanes = st.sampled_from([512, 128, 256, 1024, 2048])
    tiles = {}
    for name in ("gate_up", "down"):
        if draw(st.booleans()):
            tiles[name] = [draw(st.sampled_from([512, 128, 256])), draw(lanes), draw(lanes)]
    return tiles or {"down": [512, 512, 512]}


@st.composite
def valid_choices(draw: st.DrawFn, hardware: list[str] = HARDWARE, small: bool = False) -> dict:
    """Choices drawn to satisfy the rules (but see the module docstring)."""
    target = draw(targets(hardware, small))
    devices = target.pop("devices")
    choices: dict[str, Any] = draw(layers(tiny_only=small))
    choices |= draw(routers(choices["experts"], choices["top_k"]))
    strategy = draw(st.sampled_from(STRATEGIES))
    choices |= draw(meshes(devices, choices["experts"], choices["embed"], strategy))
    if strategy != "replicated" or draw(st.booleans()):
        choices["strategy"] = strategy
    embed, ffn, kernel = choices["embed"], choices["ffn"], target["kernel"]
    lanes = 128 if kernel == "pallas" else 1
    overlaps = [c for c in (2, 4, 8) if embed % c == 0 and embed // c % lanes == 0]
    if strategy == "ring_of_experts" and overlaps and draw(st.booleans()):
        choices["overlap_chunks"] = draw(st.sampled_from(overlaps))
    if target.get("slices", 1) > 1:
        choices |= cross_slices(choices["axes"], target["slices"])
    seq = draw(st.sampled_from([16, 1, 7, 32, 128] if small else [16, 1, 7, 128, 512, 4096]))
    choices |= {"batch": devices * draw(st.sampled_from([1, 2, 4])), "seq_len": seq}
    for name in ("params_dtype", "compute_dtype"):
        dtype = draw(st.sampled_from([None, "float32", "bfloat16"]))
        if dtype is not None:
            choices[name] = dtype
    if kernel == "pallas" and draw(st.integers(0, 3)) == 0:
        target["tiles"] = draw(pallas_tiles())
    if choices.get("overlap_chunks", 1) == 1:
        chunks = draw(st.sampled_from([None, 1, 2, 4, 8]))
        if chunks is not None and ffn % chunks == 0:  # pallas lanes: not checked here
            choices["ffn_chunks"] = chunks
    if draw(st.booleans()):
        choices["description"] = draw(st.sampled_from(DESCRIPTIONS))
    if _can_weigh_shared(choices) and draw(st.booleans()):  # Inkling's router
        count = draw(st.sampled_from([c for c in (1, 2, 4) if choices["shared_ffn"] % c == 0]))
        choices |= {"weighs_shared_experts": True, "shared_experts": count}
    if draw(st.integers(0, 3)) == 0:
        choices["learned_scale"] = True
    if _can_carry_replicas(choices) and draw(st.booleans()):
        choices |= draw(replicas(choices["experts"], choices["axes"]["expert"]))
    if "overlap_chunks" not in choices and draw(st.integers(0, 3)) == 0:
        choices |= draw(latent(choices["axes"].get("fsdp", 1)))
    return choices | target


@st.composite
def latent(draw: st.DrawFn, fsdp: int) -> dict:
    """The experts' latent width (Nemotron-H's moe_latent_size), lane-wide as published
    ones are, split over fsdp; its biases half the time."""
    width = draw(st.sampled_from([w for w in (128, 256, 1024, 128 * fsdp) if w % fsdp == 0]))
    return {"latent": width} | ({"latent_bias": True} if draw(st.booleans()) else {})


def _can_carry_replicas(choices: dict) -> bool:
    """A drawn layer that may have redundant experts (redundant_experts_have_somewhere_to_go)."""
    return (
        choices.get("strategy") == "ragged_all_to_all"
        and choices["axes"].get("expert", 1) > 1
        and choices.get("ffn_chunks", 1) == 1
    )


@st.composite
def replicas(draw: st.DrawFn, experts: int, devices: int) -> dict:
    """Extra slots on every device, each holding another device's expert, with shares that
    leave every expert's home slot some of its copies."""
    local = experts // devices
    extra = draw(st.integers(1, min(2, experts - local)))
    placement = []
    for device in range(devices):
        others = [e for e in range(experts) if e // local != device]
        held = draw(st.permutations(others))[:extra]
        units = [draw(st.integers(1, 1024 // (devices + 1))) for _ in held]
        placement.append(
            [{"expert": e, "share": u / 1024} for e, u in zip(held, units, strict=True)]
        )
    return {"redundant_experts": extra * devices, "placement": placement}


def _can_weigh_shared(choices: dict) -> bool:
    """A drawn layer whose shared expert the router may weigh (weighed_shared_experts_stand_alone)."""
    return (
        "shared_ffn" in choices
        and choices.get("score") in ("sigmoid", "sqrtsoftplus")
        and "tensor" not in choices["axes"]
        and not any(
            choices.get(k)
            for k in ("identity_experts", "shared_expert_gate", "load_balance_loss", "z_loss")
        )
        and choices.get("weighting", "output") == "output"
    )


def _first_other(value: str, options: list[str]) -> str:
    return next(o for o in options if o != value)


# Each breaks (at least) one rule of a spec drawn by valid_choices; names say which.
MISTAKES = {
    "top_k_above_experts": lambda c: c | {"top_k": c["experts"] + 1},
    "batch_not_divisible": lambda c: c | {"batch": c["batch"] + 1, "axes": {"data": 2}},
    "auto_strategy": lambda c: c | {"strategy": "auto"},
    "auto_overlap_chunks": lambda c: c | {"overlap_chunks": "auto"},
    "auto_tiles": lambda c: c | {"tiles": "auto"},
    "expert_axis_over_dcn": lambda c: (
        c | {"hardware": "tpu-v5e", "topology": "2x2", "slices": 2, "dcn_axes": {"expert": 2}}
    ),
    "overlap_without_ring": lambda c: c | {"strategy": "replicated", "overlap_chunks": 2},
    "pallas_off_tpu": lambda c: c | {"kernel": "pallas", "hardware": "cpu"},
    "te_off_gpu": lambda c: c | {"kernel": "te", "hardware": "tpu-v5e", "topology": "2x2"},
    "quantization_without_te": lambda c: c | {"kernel": "xla", "quantization": "fp8"},
    "unknown_topology": lambda c: c | {"topology": "3x3"},
    "embed_not_divisible_by_fsdp": lambda c: c | {"embed": 63, "axes": {"fsdp": 2}},
    "routing_bias_by_logits": lambda c: (
        c | {"score": "softmax", "score_after_top_k": True, "routing_bias": True}
    ),
    "glu_without_a_gate": lambda c: c | {"activation": "relu", "glu": "gpt_oss"},
    "shared_expert_gate_without_shared_expert": lambda c: (
        {k: v for k, v in c.items() if k != "shared_ffn"} | {"shared_expert_gate": True}
    ),
    "capacity_without_balancer": lambda c: (
        {k: v for k, v in c.items() if k not in ("load_balance_loss", "routing_bias")}
        | {"capacity": (1.0, "probability")}
    ),
    "shared_experts_unweighed": lambda c: c | {"shared_ffn": 64, "shared_experts": 2},
    "identity_experts_with_capacity": lambda c: (
        c | {"identity_experts": 2, "routing_bias": True, "capacity": (1.0, "position")}
    ),
    "groups_do_not_divide": lambda c: c | {"group_limit": (c["experts"] + 1, 1)},
    "ffn_chunks_uneven": lambda c: c | {"ffn_chunks": 7, "ffn": 64},
    "too_many_ffn_chunks": lambda c: c | {"ffn_chunks": 65},
    "slices_on_cpu": lambda c: c | {"hardware": "cpu", "slices": 2},
    "batch_axes_leave_one_out": lambda c: (
        c | {"axes": {"data": 2, "fsdp": 2}, "batch_axes": ["data"]}
    ),
    "tiles_on_xla": lambda c: c | {"kernel": "xla", "tiles": {"down": [512, 512, 512]}},
    "version_2": lambda c: c | {"version": 2},
    "zero_experts": lambda c: c | {"experts": 0},
    "description_too_long": lambda c: c | {"description": "y" * 501},
    "mxfp8_before_blackwell": lambda c: (
        c | {"kernel": "te", "quantization": "mxfp8", "hardware": "gpu-h100", "topology": 8}
    ),
    "latent_bias_without_latent": lambda c: (
        {k: v for k, v in c.items() if k != "latent"} | {"latent_bias": True}
    ),
    "replica_on_its_home_device": lambda c: (
        c
        | {"strategy": "ragged_all_to_all", "axes": {"expert": 2}, "redundant_experts": 2}
        | {"placement": [[{"expert": 0, "share": 0.5}], [{"expert": 0, "share": 0.5}]]}
    ),
    "other_strategy": lambda c: c | {"strategy": _first_other(c.get("strategy", ""), STRATEGIES)},
}


@st.composite
def choices(draw: st.DrawFn) -> dict:
    """Any spec: a valid draw, and one time in four a mistake on top."""
    drawn = draw(valid_choices())
    if draw(st.integers(0, 3)) < 3:  # shrinks towards no mistake
        return drawn
    return MISTAKES[draw(st.sampled_from(list(MISTAKES)))](drawn)
