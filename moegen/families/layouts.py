"""Where each model family keeps one layer's MoE weights, in transformers 5.x's names.

Each family has one or two layouts, told apart by the key of the experts' down projection:

- `fused`: the names of transformers' modules in memory (`model.state_dict()`), experts as 3D
  tensors, e.g. Mixtral `mlp.experts.gate_up_proj` [E, 2F, D] (gate first, then up) and
  `mlp.experts.down_proj` [E, D, F];
- `published`: what the Hub's checkpoints hold and what `save_pretrained` writes (transformers
  converts on load and back on save, `transformers/conversion_mapping.py`), e.g. Mixtral
  `block_sparse_moe.experts.{i}.w1.weight` [F, D] per expert.

Families whose checkpoints are already in the in-memory names (gpt-oss, Llama 4, DBRX) have one
layout, `published`. Keys are relative to the MoE block, the block to the decoder layer, the
layer to one of the family's layer prefixes (`model.layers.{L}.`, or
`language_model.model.layers.{L}.` in a multimodal checkpoint: moegen.families.entry's
CheckpointKeys). The family table (moegen/families/table.py) names each family's layouts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from moegen.families.sources import Source, Split


@dataclass(frozen=True)
class Layout:
    name: str  # "fused" or "published"
    block: str  # the MoE block's attribute in the decoder layer: "mlp", "block_sparse_moe"
    params: Mapping[str, Source]  # module parameter -> where it is read from


def _router(key: str) -> dict[str, Source]:
    return {"router": Source(key, ("e", "d"))}


def _fused(experts: str = "experts") -> dict[str, Source]:
    """transformers' in-memory experts: gate_up_proj [E, 2F, D] (chunked), down_proj [E, D, F]."""
    return {
        "w_gate": Source(f"{experts}.gate_up_proj", ("e", "f", "d"), Split("f", 0)),
        "w_up": Source(f"{experts}.gate_up_proj", ("e", "f", "d"), Split("f", 1)),
        "w_down": Source(f"{experts}.down_proj", ("e", "d", "f")),
    }


def _per_expert(gate: str, up: str, down: str) -> dict[str, Source]:
    """One nn.Linear per expert and projection: gate/up [F, D], down [D, F]."""
    return {
        "w_gate": Source(f"experts.{{i}}.{gate}.weight", ("f", "d")),
        "w_up": Source(f"experts.{{i}}.{up}.weight", ("f", "d")),
        "w_down": Source(f"experts.{{i}}.{down}.weight", ("d", "f")),
    }


def _shared(
    module: str, gate: str = "gate_proj", up: str = "up_proj", down: str = "down_proj"
) -> dict[str, Source]:
    return {
        "shared_gate": Source(f"{module}.{gate}.weight", ("s", "d")),
        "shared_up": Source(f"{module}.{up}.weight", ("s", "d")),
        "shared_down": Source(f"{module}.{down}.weight", ("d", "s")),
    }


def _output_norm(module: str) -> dict[str, Source]:
    """The RMSNorm of the block's output (layer.output_norm_eps): its weight [D]."""
    return {"output_norm": Source(f"{module}.weight", ("d",))}


_QWEN_PUBLISHED = _per_expert("gate_proj", "up_proj", "down_proj")
_MIXTRAL_PUBLISHED = _per_expert("w1", "w3", "w2")
_BIAS = {"routing_bias": Source("gate.e_score_correction_bias", ("e",))}
_V3_EXTRA = {**_BIAS, **_shared("shared_experts")}  # DeepSeek-V3's block: bias, a shared expert
_KOLIBRI_BIAS = {"routing_bias": Source("../moe.router.expert_bias", ("e",))}


def _qwen_style(
    extra: Mapping[str, Source] | None = None,
    router: str = "gate.weight",
    published: Mapping[str, Source] | None = None,
) -> tuple[Layout, ...]:
    """Qwen2-MoE's conversion (qwen3_moe, olmoe, deepseek_v2/v3, glm4_moe, dots1, hunyuan):
    the same block, experts fused in memory and per expert on the Hub (`published`: the
    sources the Hub keeps elsewhere)."""
    extra = extra or {}
    return (
        Layout("fused", "mlp", {**_router(router), **_fused(), **extra}),
        Layout(
            "published", "mlp", {**_router(router), **_QWEN_PUBLISHED, **extra, **(published or {})}
        ),
    )


MIXTRAL_LAYOUTS = (
    Layout("fused", "mlp", {**_router("gate.weight"), **_fused()}),
    Layout("published", "block_sparse_moe", {**_router("gate.weight"), **_MIXTRAL_PUBLISHED}),
)
_GPT_OSS = {
    **_router("router.weight"),
    "router_bias": Source("router.bias", ("e",)),
    "w_gate": Source("experts.gate_up_proj", ("e", "d", "f"), Split("f", 0, interleaved=True)),
    "w_up": Source("experts.gate_up_proj", ("e", "d", "f"), Split("f", 1, interleaved=True)),
    "w_down": Source("experts.down_proj", ("e", "f", "d")),
    "b_gate": Source("experts.gate_up_proj_bias", ("e", "f"), Split("f", 0, interleaved=True)),
    "b_up": Source("experts.gate_up_proj_bias", ("e", "f"), Split("f", 1, interleaved=True)),
    "b_down": Source("experts.down_proj_bias", ("e", "d")),
}
_LLAMA4 = {
    **_router("router.weight"),
    "w_gate": Source("experts.gate_up_proj", ("e", "d", "f"), Split("f", 0)),
    "w_up": Source("experts.gate_up_proj", ("e", "d", "f"), Split("f", 1)),
    "w_down": Source("experts.down_proj", ("e", "f", "d")),
    **_shared("shared_expert"),
}
_DBRX = {
    **_router("router.layer.weight"),
    "w_gate": Source("experts.mlp.w1", ("ef", "d")),
    "w_up": Source("experts.mlp.v1", ("ef", "d")),
    "w_down": Source("experts.mlp.w2", ("ef", "d")),
}
_GRANITE_PUBLISHED = {
    **_router("router.layer.weight"),
    "w_gate": Source("input_linear.weight", ("e", "f", "d"), Split("f", 0)),
    "w_up": Source("input_linear.weight", ("e", "f", "d"), Split("f", 1)),
    "w_down": Source("output_linear.weight", ("e", "d", "f")),
}
_V4_SHARED = _shared("shared_experts", "w1", "w3", "w2")
# ERNIE 4.5's shared experts have biases where the config says use_bias (nn.Linear's)
_ERNIE_SHARED_BIASES = {
    "shared_b_gate": Source("shared_experts.gate_proj.bias", ("s",)),
    "shared_b_up": Source("shared_experts.up_proj.bias", ("s",)),
    "shared_b_down": Source("shared_experts.down_proj.bias", ("d",)),
}
_ERNIE_BIAS_FUSED = {"routing_bias": Source("gate.moe_statics.e_score_correction_bias", ("1", "e"))}
_ERNIE_BIAS_PUBLISHED = {"routing_bias": Source("moe_statics.e_score_correction_bias", ("1", "e"))}

# The layouts of each family whose checkpoints moegen loads (the table's entries name them).
QWEN_LAYOUTS = _qwen_style()
# DeepSeek-V3's block: a selection bias and a shared expert
DEEPSEEK_V3_LAYOUTS = _qwen_style(_V3_EXTRA)
# A.X K1's output norm: moved into the block by transformers on load, beside it (in the
# decoder layer) on the Hub
AXK1_LAYOUTS = _qwen_style(
    {**_V3_EXTRA, **_output_norm("post_mlp_layernorm")},
    published=_output_norm("../post_mlp_layernorm"),
)
# DeepSeek-V3's block names; the Hub keeps the selection bias beside the block
KOLIBRI_LAYOUTS = _qwen_style(_V3_EXTRA, published=_KOLIBRI_BIAS)
DEEPSEEK_V2_LAYOUTS = _qwen_style(_shared("shared_experts"))
DBRX_LAYOUTS = (Layout("published", "ffn", _DBRX),)
JAMBA_LAYOUTS = (
    Layout("fused", "feed_forward", {**_router("router.weight"), **_fused()}),
    Layout("published", "feed_forward", {**_router("router.weight"), **_QWEN_PUBLISHED}),
)
GRANITE_LAYOUTS = (
    Layout("fused", "block_sparse_moe", {**_router("router.weight"), **_fused()}),
    Layout("published", "block_sparse_moe", _GRANITE_PUBLISHED),
)
HUNYUAN_LAYOUTS = _qwen_style(_shared("shared_mlp"), router="gate.wg.weight")
DEEPSEEK_V4_LAYOUTS = (
    Layout(
        "fused",
        "mlp",
        {**_router("gate.weight"), **_BIAS, **_fused(), **_shared("shared_experts")},
    ),
    Layout(
        "published",
        "ffn",
        {
            **_router("gate.weight"),
            "routing_bias": Source("gate.bias", ("e",)),
            **_MIXTRAL_PUBLISHED,
            **_V4_SHARED,
        },
    ),
)
GPT_OSS_LAYOUTS = (Layout("published", "mlp", _GPT_OSS),)
LLAMA4_LAYOUTS = (Layout("published", "feed_forward", _LLAMA4),)
QWEN2_LAYOUTS = _qwen_style(
    {
        **_shared("shared_expert"),
        "shared_expert_gate": Source("shared_expert_gate.weight", ("1", "d")),
    }
)
ERNIE_LAYOUTS = (
    Layout(
        "fused",
        "mlp",
        {
            **_router("gate.weight"),
            **_ERNIE_BIAS_FUSED,
            **_fused(),
            **_shared("shared_experts"),
            **_ERNIE_SHARED_BIASES,
        },
    ),
    Layout(
        "published",
        "mlp",
        {
            **_router("gate.weight"),
            **_ERNIE_BIAS_PUBLISHED,
            **_QWEN_PUBLISHED,
            **_shared("shared_experts"),
            **_ERNIE_SHARED_BIASES,
        },
    ),
)
# Ergo: its router a linear of its own (gate.linear), the experts' up and down applied as x @ W
# ([E, D, F], [E, F, D]), each expert's output norm a weight row [E, D], the shared expert's
# output norm inside it; on the Hub (and from save_pretrained) in its training framework's
# names, the router and the shared expert's projections stored transposed (transformers'
# conversion_mapping.py, "ergo").
ERGO_LAYOUTS = (
    Layout(
        "fused",
        "mlp",
        {
            "router": Source("gate.linear.weight", ("e", "d")),
            "routing_bias": Source("gate.e_score_correction_bias", ("e",)),
            "w_up": Source("experts.up_proj", ("e", "d", "f")),
            "w_down": Source("experts.down_proj", ("e", "f", "d")),
            "expert_output_norm": Source("experts.post_expert_norm.weight", ("e", "d")),
            "shared_up": Source("shared_experts.up_proj.weight", ("s", "d")),
            "shared_down": Source("shared_experts.down_proj.weight", ("d", "s")),
            "shared_output_norm": Source("shared_experts.norm.weight", ("d",)),
        },
    ),
    Layout(
        "published",
        "feed_forward",
        {
            "router": Source("gate_kernel", ("d", "e")),
            "routing_bias": Source("router_bias", ("e",)),
            "w_up": Source("up_proj", ("e", "d", "f")),
            "w_down": Source("down_proj", ("e", "f", "d")),
            "expert_output_norm": Source("expert_output_norm.scale", ("e", "d")),
            "shared_up": Source("shared_up_proj", ("d", "s")),
            "shared_down": Source("shared_down_proj", ("s", "d")),
            "shared_output_norm": Source("shared_expert_output_norm.scale", ("d",)),
        },
    ),
)
# DeepSeek-V4's hash layers: a key of their gate no top-k layer has
HASH_ROUTED = (
    "the layer is hash-routed (a fixed token-to-expert table, tid2eid), which moegen's routers "
    "do not do; load one of DeepSeek-V4's top-k layers (mlp_layer_types 'moe')"
)
