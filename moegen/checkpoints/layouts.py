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
`language_model.model.layers.{L}.` in a multimodal checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from moegen.checkpoints.sources import Source, Split


@dataclass(frozen=True)
class Layout:
    name: str  # "fused" or "published"
    block: str  # the MoE block's attribute in the decoder layer: "mlp", "block_sparse_moe"
    params: Mapping[str, Source]  # module parameter -> where it is read from


@dataclass(frozen=True)
class Family:
    name: str  # transformers' model_type
    title: str
    model_types: tuple[str, ...]  # config.json model_type values of this family
    layouts: tuple[Layout, ...]
    # config.json keys (dotted paths, the first present wins; list values are per layer)
    experts: tuple[str, ...]
    embed: tuple[str, ...]
    ffn: tuple[str, ...]
    top_k: tuple[str, ...]
    layers: tuple[str, ...] = (
        "model.layers.{L}.",
        "layers.{L}.",
        "model.language_model.layers.{L}.",
        "language_model.model.layers.{L}.",
    )
    # keys (relative to the block) that make a layer unloadable, with the reason
    refuse: Mapping[str, str] = field(default_factory=dict)


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


def _v3_like(name: str, title: str) -> Family:
    """A family whose checkpoints hold DeepSeek-V3's block, in its names."""
    return Family(name, title, (name,), _qwen_style(_V3_EXTRA), **_DEEPSEEK_CONFIG)


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


_MIXTRAL_LAYOUTS = (
    Layout("fused", "mlp", {**_router("gate.weight"), **_fused()}),
    Layout("published", "block_sparse_moe", {**_router("gate.weight"), **_MIXTRAL_PUBLISHED}),
)
_MIXTRAL_CONFIG = {
    "experts": ("num_local_experts",),
    "embed": ("hidden_size",),
    "ffn": ("intermediate_size",),
    "top_k": ("num_experts_per_tok",),
}
_DEEPSEEK_CONFIG = {
    "experts": ("n_routed_experts",),
    "embed": ("hidden_size",),
    "ffn": ("moe_intermediate_size",),
    "top_k": ("num_experts_per_tok",),
}
_QWEN_CONFIG = _DEEPSEEK_CONFIG | {"experts": ("num_experts",)}

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
_HASH = (
    "the layer is hash-routed (a fixed token-to-expert table, tid2eid), which moegen's routers "
    "do not do; load one of DeepSeek-V4's top-k layers (mlp_layer_types 'moe')"
)

FAMILIES: Mapping[str, Family] = {
    f.name: f
    for f in (
        Family("mixtral", "Mixtral", ("mixtral",), _MIXTRAL_LAYOUTS, **_MIXTRAL_CONFIG),
        Family("qwen3_moe", "Qwen3-MoE", ("qwen3_moe",), _qwen_style(), **_QWEN_CONFIG),
        Family(
            "olmoe",
            "OLMoE",
            ("olmoe",),
            _qwen_style(),
            **(_QWEN_CONFIG | {"ffn": ("intermediate_size",)}),
        ),
        _v3_like("deepseek_v3", "DeepSeek-V3"),
        _v3_like("glm4_moe", "GLM-4.5"),
        _v3_like("dots1", "dots.llm1"),
        _v3_like("minicpm5_moe", "MiniCPM5-MoE"),
        Family(
            "axk1",
            "A.X K1",
            ("axk1",),
            # the output norm: moved into the block by transformers on load, beside it (in the
            # decoder layer) on the Hub
            _qwen_style(
                {**_V3_EXTRA, **_output_norm("post_mlp_layernorm")},
                published=_output_norm("../post_mlp_layernorm"),
            ),
            **_DEEPSEEK_CONFIG,
        ),
        *(
            # DeepSeek-V3's block names; the Hub keeps the selection bias beside the block
            Family(
                name,
                title,
                (name,),
                _qwen_style(_V3_EXTRA, published=_KOLIBRI_BIAS),
                **_QWEN_CONFIG,
            )
            for name, title in (("kolibri1", "Kolibri1"), ("kolibri1_1", "Kolibri 1.1"))
        ),
        Family(
            "deepseek_v2",
            "DeepSeek-V2 / V2-Lite",
            ("deepseek_v2",),
            _qwen_style(_shared("shared_experts")),
            **_DEEPSEEK_CONFIG,
        ),
        Family(
            "dbrx",
            "DBRX",
            ("dbrx",),
            (Layout("published", "ffn", _DBRX),),
            experts=("ffn_config.moe_num_experts",),
            embed=("d_model",),
            ffn=("ffn_config.ffn_hidden_size",),
            top_k=("ffn_config.moe_top_k",),
            layers=("transformer.blocks.{L}.",),
        ),
        Family(
            "jamba",
            "Jamba",
            ("jamba",),
            (
                Layout("fused", "feed_forward", {**_router("router.weight"), **_fused()}),
                Layout(
                    "published", "feed_forward", {**_router("router.weight"), **_QWEN_PUBLISHED}
                ),
            ),
            **(_QWEN_CONFIG | {"ffn": ("intermediate_size",)}),
        ),
        Family(
            "granitemoe",
            "Granite-MoE",
            ("granitemoe",),
            (
                Layout("fused", "block_sparse_moe", {**_router("router.weight"), **_fused()}),
                Layout("published", "block_sparse_moe", _GRANITE_PUBLISHED),
            ),
            **_MIXTRAL_CONFIG,
        ),
        Family(
            "hunyuan_v1_moe",
            "Hunyuan-A13B",
            ("hunyuan_v1_moe",),
            _qwen_style(_shared("shared_mlp"), router="gate.wg.weight"),
            experts=("num_experts",),
            embed=("hidden_size",),
            ffn=("intermediate_size",),
            top_k=("moe_topk",),
        ),
        Family("minimax", "MiniMax-Text-01", ("minimax",), _MIXTRAL_LAYOUTS, **_MIXTRAL_CONFIG),
        Family(
            "deepseek_v4",
            "DeepSeek-V4",
            ("deepseek_v4",),
            (
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
            ),
            **_DEEPSEEK_CONFIG,
            refuse={"gate.tid2eid": _HASH},
        ),
        Family(
            "gpt_oss",
            "gpt-oss",
            ("gpt_oss",),
            (Layout("published", "mlp", _GPT_OSS),),
            **(_MIXTRAL_CONFIG | {"top_k": ("num_experts_per_tok", "experts_per_token")}),
        ),
        Family(
            "llama4",
            "Llama 4 text",
            ("llama4", "llama4_text"),
            (Layout("published", "feed_forward", _LLAMA4),),
            **_MIXTRAL_CONFIG,
        ),
        Family(
            "qwen2_moe",
            "Qwen2-MoE",
            ("qwen2_moe",),
            _qwen_style(
                {
                    **_shared("shared_expert"),
                    "shared_expert_gate": Source("shared_expert_gate.weight", ("1", "d")),
                }
            ),
            **_QWEN_CONFIG,
        ),
        Family(
            "ernie4_5_moe",
            "ERNIE 4.5",
            ("ernie4_5_moe",),
            (
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
            ),
            experts=("moe_num_experts",),
            embed=("hidden_size",),
            ffn=("moe_intermediate_size",),
            top_k=("moe_k",),
        ),
    )
}

# What the spec must say for a module to have each parameter (refusal messages name it).
SPEC_FIELD: Mapping[str, str] = {
    "router": "router",
    "router_bias": "router.linear_bias: true",
    "routing_bias": "router.routing_bias: true",
    "w_gate": "layer.activation: swiglu (a gated activation)",
    "w_up": "layer.ffn_dim",
    "w_down": "layer.ffn_dim",
    "b_gate": "layer.ffn_bias: true",
    "b_up": "layer.ffn_bias: true",
    "b_down": "layer.ffn_bias: true",
    "shared_gate": "layer.shared_ffn_dim",
    "shared_up": "layer.shared_ffn_dim",
    "shared_down": "layer.shared_ffn_dim",
    "shared_expert_gate": "layer.shared_expert_gate: true",
    "shared_b_gate": "layer.shared_ffn_bias: true",
    "shared_b_up": "layer.shared_ffn_bias: true",
    "shared_b_down": "layer.shared_ffn_bias: true",
    "latent_in": "layer.latent_dim",
    "latent_out": "layer.latent_dim",
    "latent_in_bias": "layer.latent_bias: true",
    "latent_out_bias": "layer.latent_bias: true",
    "output_norm": "layer.output_norm_eps",
}

# Key endings of quantized weights, which this loader does not dequantize.
QUANTIZED_SUFFIXES = (
    "_blocks",  # gpt-oss MXFP4 (with _scales)
    "_scales",
    ".weight_scale_inv",  # DeepSeek-V3 / V4 FP8 block scales
    ".weight_scale",
    ".input_scale",
    ".scale",
    ".qweight",  # GPTQ / AWQ
    ".qzeros",
    ".scales",
    ".g_idx",
    ".absmax",  # bitsandbytes
    ".quant_map",
    ".quant_state.bitsandbytes__nf4",
    ".SCB",
)
