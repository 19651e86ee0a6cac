"""The family table, continued (moegen/families/table.py merges it): the families whose MoE block
is DeepSeek's or a close relative of it (transformers 5.25's modeling_<family>.py), most of
them DeepSeek-V3's block under another name: a sigmoid router with a selection-only bias,
optional groups ranked by the sum of their best two, renormalised, scaled, and shared experts
of moe_intermediate_size each. The defaults are each config class's.

Most choose their MoE layers by `mlp_layer_types` ("sparse"; "dense" layers run an MLP),
which the config class derives when a config.json does not give it, each in its own way
(each entry's `layers` says how).
"""

from __future__ import annotations

from collections.abc import Mapping

from moegen.families.entry import (
    DEEPSEEK_SIZES,
    MIXTRAL_SIZES,
    QWEN_SIZES,
    CheckpointKeys,
    Family,
    Rule,
    Transformers,
)
from moegen.families.layer_rules import (
    AllLayers,
    FirstDense,
)
from moegen.families.layouts import (
    AXK1_LAYOUTS,
    DEEPSEEK_V3_LAYOUTS,
)
from moegen.families.rules import Clamp, Copy, Expect, GptOssGlu, Groups, SharedWidth, step_clamps
from moegen.families.schedules import (
    BY_FREQ,
    FIRST_K,
    mlp_types,
    sparse_after,
    sparse_after_first_k,
)
from moegen.families.shared_rules import (
    ACTIVATION,
    DEEPSEEK_V2,
    NO_JITTER,
    SELECTION_BIAS,
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

DEEPSEEK_FAMILIES: Mapping[str, Family] = {
    "deepseek_v32": Family(
        "DeepSeek-V3.2",
        DEEPSEEK_SIZES,
        deepseek_v3_style("DeepseekV32MoE", True, 2.5, (8, 4), 1),
        layers=sparse_after_first_k(3),
        checkpoint=CheckpointKeys(DEEPSEEK_V3_LAYOUTS),
        transformers=Transformers(
            "deepseek_v32", "DeepseekV32Config", "DeepseekV32MoE", "DeepseekV32ForCausalLM"
        ),
    ),
    "glm_moe_dsa": Family(
        "GLM-5",
        DEEPSEEK_SIZES,
        deepseek_v3_style("GlmMoeDsaMoE", True, 2.5, (1, 1), 1),
        layers=sparse_after_first_k(3),
        transformers=Transformers(
            "glm_moe_dsa", "GlmMoeDsaConfig", "GlmMoeDsaMoE", "GlmMoeDsaForCausalLM"
        ),
    ),
    "glm4_moe_lite": Family(
        "GLM-4.7-Flash",
        DEEPSEEK_SIZES,
        deepseek_v3_style("Glm4MoeLiteMoE", True, 1.8, (1, 1), 1),
        layers=sparse_after(1),
        transformers=Transformers(
            "glm4_moe_lite", "Glm4MoeLiteConfig", "Glm4MoeLiteMoE", "Glm4MoeLiteForCausalLM"
        ),
    ),
    "glm4v_moe_text": Family(
        "GLM-4.5V text",
        DEEPSEEK_SIZES,
        (*deepseek_v3_style("Glm4vMoeTextMoE", True, 1.0, (1, 1), 1), balance(0.0001)),
        layers=FirstDense(FIRST_K, 1),
        transformers=Transformers(
            "glm4v_moe", "Glm4vMoeTextConfig", "Glm4vMoeTextMoE", "Glm4vMoeForConditionalGeneration"
        ),
    ),
    "glm5_next_text": Family(
        "GLM-5-Next text",
        DEEPSEEK_SIZES,
        (
            *silu_experts("Glm5NextTextExperts"),
            *deepseek_v3_style("Glm5NextTextMoE", True, 2.5, (1, 1), 1)[1:],
            Clamp("swiglu_limit", 10.0),  # routed and shared experts alike
            balance(0.001),
        ),
        layers=sparse_after(3),
        transformers=Transformers(
            "glm5_next", "Glm5NextTextConfig", "Glm5NextTextMoE", "Glm5NextForConditionalGeneration"
        ),
    ),
    "bailing_hybrid": Family(
        "Ling/Ring hybrid",
        DEEPSEEK_SIZES.but(top_k=("num_experts_per_token", "num_experts_per_tok"), **_QWEN_SIZES),
        (*_linear_attention_v3(True, 2.5, (8, 4)), *_BAILING_CLAMPS),
        layers=sparse_after_first_k(2),
        transformers=Transformers(
            "bailing_hybrid", "BailingHybridConfig", "BailingHybridMoE", "BailingHybridForCausalLM"
        ),
    ),
    # MiniCPM5-MoE: V3's router and shared experts; its config class reads
    # first_k_dense_replace (default 1) only to derive mlp_layer_types
    "minicpm5_moe": Family(
        "MiniCPM5-MoE",
        DEEPSEEK_SIZES.but(experts=("n_routed_experts", "num_local_experts")),
        (*v3_router("MiniCPM5MoeTopkRouter", True, 3.66, (1, 1)), _shared("n_shared_experts", 1)),
        layers=sparse_after_first_k(1),
        checkpoint=CheckpointKeys(DEEPSEEK_V3_LAYOUTS),
        transformers=Transformers(
            "minicpm5_moe", "MiniCPM5MoeConfig", "MiniCPM5MoeMoE", "MiniCPM5MoeForCausalLM"
        ),
    ),
    "kimi_linear": Family(
        "Kimi Linear",
        DEEPSEEK_SIZES.but(top_k=("num_experts_per_token", "num_experts_per_tok"), **_QWEN_SIZES),
        _linear_attention_v3(True, 2.446, (1, 1)),
        layers=sparse_after_first_k(1),
        transformers=Transformers(
            "kimi_linear", "KimiLinearConfig", "KimiLinearMoE", "KimiLinearForCausalLM"
        ),
    ),
    "axk2": Family(
        "A.X K2",
        DEEPSEEK_SIZES,
        _AXK2,
        layers=BY_FREQ,
        transformers=Transformers("axk2", "AXK2Config", "AXK2MoE", "AXK2ForCausalLM"),
    ),
    "axk1": Family(
        "A.X K1",
        DEEPSEEK_SIZES,
        _AXK1,
        layers=BY_FREQ,
        checkpoint=CheckpointKeys(AXK1_LAYOUTS),
        transformers=Transformers("axk1", "AXK1Config", "AXK1MoE", "AXK1ForCausalLM"),
    ),
    "solar_open": Family(
        "Solar Open",
        DEEPSEEK_SIZES,
        deepseek_v3_style("SolarOpenMoE", True, 1.0, (1, 1), 1),
        layers=AllLayers(),
        transformers=Transformers(
            "solar_open", "SolarOpenConfig", "SolarOpenMoE", "SolarOpenForCausalLM"
        ),
    ),
    "dots3_note_text": Family(
        "dots3 note text",
        DEEPSEEK_SIZES,
        (
            *v3_router("Dots3NoteTextTopkRouter", True, 1.0, (1, 1)),
            _shared("n_shared_experts", 1, "shared_experts_intermediate_size"),
        ),
        layers=BY_FREQ,
        transformers=Transformers(
            "dots3_note", "Dots3NoteTextConfig", "Dots3NoteTextMoE", "Dots3NoteForCausalLM"
        ),
    ),
    "exaone_moe": Family(
        "EXAONE MoE",
        QWEN_SIZES,
        (*v3_router("ExaoneMoeTopkRouter", True, 2.5, (1, 1)), _shared("num_shared_experts", 1)),
        layers=sparse_after_first_k(1),
        transformers=Transformers(
            "exaone_moe", "ExaoneMoeConfig", "ExaoneMoeSparseMoEBlock", "ExaoneMoeForCausalLM"
        ),
    ),
    "mimo_v2_flash": Family(
        "MiMo-V2-Flash",
        DEEPSEEK_SIZES,
        v3_router("MiMoV2FlashTopkRouter", True, 1.0, (1, 1)),
        layers=sparse_after(1),
        transformers=Transformers(
            "mimo_v2_flash", "MiMoV2FlashConfig", "MiMoV2FlashMoE", "MiMoV2FlashForCausalLM"
        ),
    ),
    "beam": Family(
        "Beam",
        QWEN_SIZES,
        v3_router("BeamTopKRouter", True, 2.5, (8, 4)),
        layers=sparse_after(3),
        transformers=Transformers("beam", "BeamConfig", "BeamMoE", "BeamForCausalLM"),
    ),
    "hy_v3": Family(
        "HY3",
        QWEN_SIZES,
        (
            ACTIVATION,
            *_biased_sigmoid("HYV3TopKRouter"),
            scaling(2.826, "router_scaling_factor"),
            _shared("num_shared_experts", 1),
        ),
        layers=sparse_after(1),
        transformers=Transformers("hy_v3", "HYV3Config", "HYV3MoE", "HYV3ForCausalLM"),
    ),
    "afmoe": Family(
        "AFMoE (Trinity)",
        QWEN_SIZES,
        (
            ACTIVATION,
            *_biased_sigmoid("AfmoeTokenChoiceRouter"),
            scaling(1.0, "route_scale"),
            _shared("num_shared_experts", 2),
        ),
        layers=FirstDense("num_dense_layers", 1),
        transformers=Transformers(
            "afmoe", "AfmoeConfig", "AfmoeSparseMoeBlock", "AfmoeForCausalLM"
        ),
    ),
    "dots3_note_vision_encoder": Family(
        "dots3 note vision",
        QWEN_SIZES.but(**_LOCAL_EXPERTS),
        (
            ACTIVATION,
            *_biased_sigmoid("Dots3NoteVisionTopKRouter"),
            scaling(1.0, "router_scaling_factor"),
        ),
        layers=mlp_types(None),
        transformers=Transformers(
            "dots3_note",
            "Dots3NoteVisionConfig",
            "Dots3NoteVisionMoE",
            "Dots3NoteForConditionalGeneration",
        ),
    ),
    "minimax_m2": Family(
        "MiniMax-M2",
        MIXTRAL_SIZES,
        (ACTIVATION, *_biased_sigmoid("MiniMaxM2TopKRouter"), NO_JITTER, balance(0.001)),
        layers=AllLayers(),
        transformers=Transformers(
            "minimax_m2", "MiniMaxM2Config", "MiniMaxM2SparseMoeBlock", "MiniMaxM2ForCausalLM"
        ),
    ),
    "minimax_m3_vl_text": Family(
        "MiniMax-M3-VL text",
        MIXTRAL_SIZES,
        (
            # gpt-oss's clamped SwiGLU on routed and shared experts, whatever hidden_act says
            *silu_experts("MiniMaxM3VLExperts")[:1],
            GptOssGlu("swiglu_limit", "swiglu_alpha"),
            *_biased_sigmoid("MiniMaxM3VLTopKRouter"),
            scaling(2.0),  # on the experts' sum: the same product
            SharedWidth((), ("shared_intermediate_size",)),
            balance(0.001),
        ),
        layers=mlp_types(FirstDense(None, 0, "moe_layer_freq", freq_list=True)),
        transformers=Transformers(
            "minimax_m3_vl",
            "MiniMaxM3VLTextConfig",
            "MiniMaxM3VLSparseMoeBlock",
            "MiniMaxM3VLForCausalLM",
        ),
    ),
    "mistral4": Family(
        "Mistral Small 4",
        DEEPSEEK_SIZES,
        (*_MISTRAL4, norm_topk(True)),
        layers=FirstDense(FIRST_K, 0),
        transformers=Transformers(
            "mistral4", "Mistral4Config", "Mistral4MoE", "Mistral4ForCausalLM"
        ),
    ),
    "mistral_large4_text": Family(
        "Mistral Large 3 text",
        DEEPSEEK_SIZES,
        (*_MISTRAL4, renormalized("MistralLarge4TextTopkRouter")),
        layers=sparse_after_first_k(1),
        transformers=Transformers(
            "mistral_large4",
            "MistralLarge4TextConfig",
            "MistralLarge4TextMoE",
            "MistralLarge4ForConditionalGeneration",
        ),
    ),
    # DeepSeek-V2's block; their config classes derive no list for a null mlp_layer_types
    # but Unlimited-OCR's, and the decoder layers index it
    "deepseek_ocr2_text": Family(
        "DeepSeek-OCR 2 text",
        DEEPSEEK_SIZES,
        DEEPSEEK_V2,
        layers=mlp_types(None),
        transformers=Transformers(
            "deepseek_ocr2",
            "DeepseekOcr2TextConfig",
            "DeepseekOcr2TextMoe",
            "DeepseekOcr2ForConditionalGeneration",
        ),
    ),
    "unlimited_ocr_text": Family(
        "Unlimited-OCR text",
        DEEPSEEK_SIZES,
        DEEPSEEK_V2,
        layers=sparse_after_first_k(1),
        transformers=Transformers(
            "unlimited_ocr",
            "UnlimitedOcrTextConfig",
            "UnlimitedOcrTextMoe",
            "UnlimitedOcrForConditionalGeneration",
        ),
    ),
}
