"""The family table, continued (moegen/hf/families.py merges it): the families whose MoE block
is DeepSeek's or a close relative of it (transformers 5.25's modeling_<family>.py), most of
them DeepSeek-V3's block under another name: a sigmoid router with a selection-only bias,
optional groups ranked by the sum of their best two, renormalised, scaled, and shared experts
of moe_intermediate_size each. The defaults are each config class's.

Most choose their MoE layers by `mlp_layer_types` ("sparse"; "dense" layers run an MLP),
which the config class derives when a config.json does not give it, each in its own way
(moegen.checkpoints.schedules says how, for each model_type).
"""

from __future__ import annotations

from collections.abc import Mapping

from moegen.hf.family_base import (
    ACTIVATION,
    DEEPSEEK_V2,
    NO_JITTER,
    SELECTION_BIAS,
    HfFamily,
    Rule,
    balance,
    deepseek_v3_style,
    norm_topk,
    renormalized,
    scaling,
    sigmoid,
    silu_experts,
    softmax,
    v3_router,
)
from moegen.hf.rules import Clamp, Copy, Expect, GptOssGlu, Groups, SharedWidth, step_clamps


def _shared(count: str, default: int | None, width: str = "moe_intermediate_size") -> SharedWidth:
    return SharedWidth((count,), (width,), default)


def _linear_attention_v3(norm: bool, scale: float, groups: tuple[int, int]) -> tuple[Rule, ...]:
    """Bailing-hybrid's and Kimi Linear's block: DeepSeek-V3's, its keys named as their
    config classes save them (n_group is num_expert_group, norm_topk_prob moe_renormalize)."""
    return (
        ACTIVATION,
        sigmoid("DeepSeek-V3's TopkRouter"),
        norm_topk(norm, "moe_renormalize"),
        scaling(scale),
        Groups("num_expert_group", "topk_group", groups[0], groups[1]),
        SELECTION_BIAS,
        _shared("num_shared_experts", 1),
    )


# Ling/Ring (transformers 5.25): Step 3.7's clamp, min(silu(gate), L) and up in [-L, L], the
# routed experts at expert_swiglu_limit_list[i], the shared experts at
# share_expert_swiglu_limit_list[i]; 0 or null: no clamp
_BAILING_CLAMPS = step_clamps("expert_swiglu_limit_list", "share_expert_swiglu_limit_list")


# a router that takes its top-k by sigmoid score plus a selection bias and renormalises
# (MiniMax-M2's, HY3's, AFMoE's, dots3 note's vision router)
def _biased_sigmoid(block: str) -> tuple[Rule, ...]:
    return (sigmoid(block), renormalized(block), SELECTION_BIAS)


# A.X K2 masks the scores of dropped groups to 0, not -inf: with a negative selection bias an
# expert of a dropped group can still be chosen, which moegen's group limit never does
_AXK2 = (
    *v3_router("AXK2TopkRouter", True, 2.5, (1, 1))[:-2],
    Expect("n_group", (None, 1), "AXK2TopkRouter masks dropped groups to 0, not -inf"),
    SELECTION_BIAS,
    _shared("n_shared_experts", 1),
)
# A.X-K1: DeepSeek-V3's block (its router masks dropped groups to -inf), then an RMSNorm of
# the block's output, post_mlp_layernorm, with rms_norm_eps
_AXK1 = (
    *v3_router("AXK1TopkRouter", True, 2.5, (8, 4)),
    _shared("n_shared_experts", 1),
    Copy("layer.output_norm_eps", ("rms_norm_eps",), 1e-6, "number"),
)
# Mistral 4: softmax scores, no bias, groups ranked by their best two (their 0.0 mask is
# -inf's: a softmax score is positive)
_MISTRAL4 = (
    ACTIVATION,
    softmax("Mistral4TopkRouter"),
    scaling(1.0),
    Groups("n_group", "topk_group", 1, 1),
    _shared("n_shared_experts", 1),
)
_QWEN_SIZES = {"experts": ("num_experts", "num_local_experts")}
_LOCAL_EXPERTS = {"experts": ("num_local_experts", "num_experts")}

DEEPSEEK_FAMILIES: Mapping[str, HfFamily] = {
    "deepseek_v32": HfFamily(
        "DeepSeek-V3.2",
        "deepseek_v3",
        deepseek_v3_style("DeepseekV32MoE", True, 2.5, (8, 4), 1),
    ),
    "glm_moe_dsa": HfFamily(
        "GLM-5",
        "deepseek_v3",
        deepseek_v3_style("GlmMoeDsaMoE", True, 2.5, (1, 1), 1),
    ),
    "glm4_moe_lite": HfFamily(
        "GLM-4.7-Flash",
        "deepseek_v3",
        deepseek_v3_style("Glm4MoeLiteMoE", True, 1.8, (1, 1), 1),
    ),
    "glm4v_moe_text": HfFamily(
        "GLM-4.5V text",
        "deepseek_v3",
        (*deepseek_v3_style("Glm4vMoeTextMoE", True, 1.0, (1, 1), 1), balance(0.0001)),
    ),
    "glm5_next_text": HfFamily(
        "GLM-5-Next text",
        "deepseek_v3",
        (
            *silu_experts("Glm5NextTextExperts"),
            *deepseek_v3_style("Glm5NextTextMoE", True, 2.5, (1, 1), 1)[1:],
            Clamp("swiglu_limit", 10.0),  # routed and shared experts alike
            balance(0.001),
        ),
    ),
    "bailing_hybrid": HfFamily(
        "Ling/Ring hybrid",
        "deepseek_v3",
        (*_linear_attention_v3(True, 2.5, (8, 4)), *_BAILING_CLAMPS),
        size_keys={**_QWEN_SIZES, "top_k": ("num_experts_per_token", "num_experts_per_tok")},
    ),
    # MiniCPM5-MoE: V3's router and shared experts; its config class reads
    # first_k_dense_replace (default 1) only to derive mlp_layer_types
    "minicpm5_moe": HfFamily(
        "MiniCPM5-MoE",
        "deepseek_v3",
        (*v3_router("MiniCPM5MoeTopkRouter", True, 3.66, (1, 1)), _shared("n_shared_experts", 1)),
        size_keys={"experts": ("n_routed_experts", "num_local_experts")},
    ),
    "kimi_linear": HfFamily(
        "Kimi Linear",
        "deepseek_v3",
        _linear_attention_v3(True, 2.446, (1, 1)),
        size_keys={**_QWEN_SIZES, "top_k": ("num_experts_per_token", "num_experts_per_tok")},
    ),
    "axk2": HfFamily(
        "A.X K2",
        "deepseek_v3",
        _AXK2,
    ),
    "axk1": HfFamily(
        "A.X K1",
        "deepseek_v3",
        _AXK1,
    ),
    "solar_open": HfFamily(
        "Solar Open",
        "deepseek_v3",
        deepseek_v3_style("SolarOpenMoE", True, 1.0, (1, 1), 1),
    ),
    "dots3_note_text": HfFamily(
        "dots3 note text",
        "deepseek_v3",
        (
            *v3_router("Dots3NoteTextTopkRouter", True, 1.0, (1, 1)),
            _shared("n_shared_experts", 1, "shared_experts_intermediate_size"),
        ),
    ),
    "exaone_moe": HfFamily(
        "EXAONE MoE",
        "qwen3_moe",
        (*v3_router("ExaoneMoeTopkRouter", True, 2.5, (1, 1)), _shared("num_shared_experts", 1)),
    ),
    "mimo_v2_flash": HfFamily(
        "MiMo-V2-Flash",
        "deepseek_v3",
        v3_router("MiMoV2FlashTopkRouter", True, 1.0, (1, 1)),  # no shared expert
    ),
    "beam": HfFamily(
        "Beam",
        "qwen3_moe",
        # BeamMoE scales the experts' sum, not each weight: the same product
        v3_router("BeamTopKRouter", True, 2.5, (8, 4)),
    ),
    "hy_v3": HfFamily(
        "HY3",
        "qwen3_moe",
        (
            ACTIVATION,
            *_biased_sigmoid("HYV3TopKRouter"),
            scaling(2.826, "router_scaling_factor"),
            _shared("num_shared_experts", 1),
        ),
    ),
    "afmoe": HfFamily(
        "AFMoE (Trinity)",
        "qwen3_moe",
        (
            ACTIVATION,
            *_biased_sigmoid("AfmoeTokenChoiceRouter"),
            scaling(1.0, "route_scale"),
            _shared("num_shared_experts", 2),
        ),
    ),
    "dots3_note_vision_encoder": HfFamily(
        "dots3 note vision",
        "qwen3_moe",
        # absent, the class derives it from pyramid_num_routed, which config.json does not keep
        (
            ACTIVATION,
            *_biased_sigmoid("Dots3NoteVisionTopKRouter"),
            scaling(1.0, "router_scaling_factor"),
        ),
        size_keys=_LOCAL_EXPERTS,
    ),
    "minimax_m2": HfFamily(
        "MiniMax-M2",
        "mixtral",
        (ACTIVATION, *_biased_sigmoid("MiniMaxM2TopKRouter"), NO_JITTER, balance(0.001)),
    ),
    "minimax_m3_vl_text": HfFamily(
        "MiniMax-M3-VL text",
        "mixtral",
        (
            # gpt-oss's clamped SwiGLU on routed and shared experts, whatever hidden_act says
            *silu_experts("MiniMaxM3VLExperts")[:1],
            GptOssGlu("swiglu_limit", "swiglu_alpha"),
            *_biased_sigmoid("MiniMaxM3VLTopKRouter"),
            scaling(2.0),  # on the experts' sum: the same product
            SharedWidth((), ("shared_intermediate_size",)),
            balance(0.001),
        ),
    ),
    "mistral4": HfFamily(
        "Mistral Small 4",
        "deepseek_v3",
        (*_MISTRAL4, norm_topk(True)),
    ),
    "mistral_large4_text": HfFamily(
        "Mistral Large 3 text",
        "deepseek_v3",
        (*_MISTRAL4, renormalized("MistralLarge4TextTopkRouter")),
    ),
    # DeepSeek-V2's block; their config classes derive no list for a null mlp_layer_types
    # but Unlimited-OCR's, and the decoder layers index it
    "deepseek_ocr2_text": HfFamily("DeepSeek-OCR 2 text", "deepseek_v3", DEEPSEEK_V2),
    "unlimited_ocr_text": HfFamily(
        "Unlimited-OCR text",
        "deepseek_v3",
        DEEPSEEK_V2,
    ),
}
