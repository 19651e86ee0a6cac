"""The model-family table, continued (tests/support/families.py concatenates it): the Qwen-, OLMoE-,
Granite-, gpt-oss- and ERNIE-like families, checked by the oracle alone (no checkpoint case).
Each keeps the routing its transformers config sets by default (top-k, normalisation, shared
experts), on up to 32 experts; multimodal models contribute their text model's block.
"""

from __future__ import annotations

from families_keys import AFTER_TOP_K, RENORMALIZED, SIGMOID_BIAS, SOFTMAX, F
from family_model import Keys, ModelFamily, Tiny

SIGMOID_RENORMALIZED = {"score": "sigmoid", "renormalize": True}
GATED_SHARED = {"shared_expert_gate": True}  # sigmoid(x @ g) scales the shared expert


def _shared(width: int) -> dict[str, int]:
    """The config arguments of one shared expert this wide (Qwen's name for it)."""
    return dict(shared_expert_intermediate_size=width)


MORE_FAMILIES: list[ModelFamily] = [
    # FlexOlmo: OLMoE's router (softmax, not renormalised), top-5; published with 7 experts,
    # 8 here so that two expert shards split them evenly
    ModelFamily("flex_olmo", SOFTMAX, oracle=Tiny(8, 5, config=dict(norm_topk_prob=False))),
    # Mellum: Qwen3-MoE's block, 64 experts, top-8, renormalised
    ModelFamily("mellum", RENORMALIZED, oracle=Tiny(16, 8, config=dict(norm_topk_prob=True))),
    # Qwen3-VL-MoE's text model: 60 experts, top-4, always renormalised
    ModelFamily("qwen3_vl_moe", RENORMALIZED, oracle=Tiny(16, 4), model_type="qwen3_vl_moe_text"),
    # Qwen3-Omni's thinker: 128 experts, top-8, renormalised
    ModelFamily(
        "qwen3_omni_moe",
        RENORMALIZED,
        oracle=Tiny(16, 8, config=dict(norm_topk_prob=True)),
        model_type="qwen3_omni_moe_text",
    ),
    # Qwen3-Omni's talker: 128 experts, top-8, not renormalised, a gated shared expert
    ModelFamily(
        "qwen3_omni_moe_talker",
        SOFTMAX | GATED_SHARED,
        oracle=Tiny(16, 8, shared=F, config=_shared(F) | dict(norm_topk_prob=False)),
        model_type="qwen3_omni_moe_talker_text",
    ),
    # Qwen3.5-MoE: 256 experts, top-8, always renormalised, a gated shared expert
    ModelFamily(
        "qwen3_5_moe",
        RENORMALIZED | GATED_SHARED,
        oracle=Tiny(16, 8, shared=F, config=_shared(F)),
        model_type="qwen3_5_moe_text",
    ),
    # Qwen3-Next: 512 experts, top-10, renormalised, a gated shared expert
    ModelFamily(
        "qwen3_next",
        RENORMALIZED | GATED_SHARED,
        oracle=Tiny(32, 10, shared=F, config=_shared(F) | dict(norm_topk_prob=True)),
    ),
    # Qwen4-Exp's text model: Qwen3-Next's block and settings
    ModelFamily(
        "qwen4_exp",
        RENORMALIZED | GATED_SHARED,
        oracle=Tiny(32, 10, shared=F, config=_shared(F) | dict(norm_topk_prob=True)),
        model_type="qwen4_exp_text",
    ),
    # Lara-Mini: 128 experts, top-4, renormalised, a shared expert added in full (no gate)
    ModelFamily(
        "lara_mini",
        RENORMALIZED,
        oracle=Tiny(16, 4, shared=F, config=_shared(F) | dict(norm_topk_prob=True)),
    ),
    # Flint: sigmoid scores without a bias, 256 experts, top-6, renormalised, an ungated
    # shared expert twice an expert's width
    ModelFamily(
        "flint",
        SIGMOID_RENORMALIZED,
        oracle=Tiny(16, 6, shared=2 * F, config=_shared(2 * F) | dict(norm_topk_prob=True)),
    ),
    # Granite-MoE's block under three more models (their shared MLP, where there is one,
    # lives outside the block, in the decoder layer); the configs' 8 experts, top-2
    ModelFamily("granitemoe_swa", AFTER_TOP_K, oracle=Tiny(8, 2)),
    ModelFamily(
        "granitemoehybrid",
        AFTER_TOP_K,
        oracle=Tiny(
            8, 2, shared=2 * F, config=dict(mamba_n_heads=8, shared_intermediate_size=2 * F)
        ),
        oracle_block="oracle.composed.GraniteMoeHybridWithShared",
    ),
    ModelFamily("granitemoeshared", AFTER_TOP_K, oracle=Tiny(8, 2)),
    # Cohere2-MoE: expert_selection_fn softmax over the chosen logits, the config's 8
    # experts, top-2, no shared expert (num_shared_experts 0)
    ModelFamily("cohere2_moe", AFTER_TOP_K, oracle=Tiny(8, 2)),
    # Aria's text model: softmax over the chosen logits, experts applied as x @ W, 2 shared
    # experts of intermediate_size each; the config's 8 experts, top-2
    ModelFamily(
        "aria",
        AFTER_TOP_K,
        oracle=Tiny(8, 2, shared=2 * F, config=dict(moe_num_shared_experts=2)),
        model_type="aria_text",
    ),
    # OpenAI's privacy filter: gpt-oss's MLP with gate and up concatenated, not interleaved
    # (its router's division by top_k is undone by the block's product with it); 128
    # experts, top-4
    ModelFamily(
        "openai_privacy_filter",
        AFTER_TOP_K | {"glu": "gpt_oss", "ffn_bias": True, "linear_bias": True},
        oracle=Tiny(16, 4, config=dict(swiglu_limit=7.0, swiglu_alpha=1.702)),
    ),
    # JetMoE: softmax over the chosen logits, 8 experts, top-2, and one output bias added
    # after the combine: as those weights sum to 1, the same bias as every expert's b_down
    # adds it once (the experts' gate and up biases are zero)
    ModelFamily("jetmoe", AFTER_TOP_K | {"ffn_bias": True}, oracle=Tiny(8, 2)),
    # ERNIE-4.5-VL's MoE layer on text tokens (no token types given): the text experts and
    # 2 shared experts; softmax + moe_statics selection bias, top-6 of 64, renormalised.
    # moe_intermediate_size is [text, vision]
    ModelFamily(
        "ernie4_5_vl_moe",
        RENORMALIZED | {"routing_bias": True},
        oracle=Tiny(
            16,
            6,
            shared=2 * F,
            config=dict(moe_intermediate_size=[F, F], moe_num_shared_experts=2, use_bias=False),
        ),
        model_type="ernie4_5_vl_moe_text",
        config_keys=Keys("moe_num_experts", "moe_k", "moe_intermediate_size"),
    ),
    # one modality's experts of it (text or vision alike), its width an argument
    ModelFamily(
        "ernie4_5_vl_moe_modality",
        RENORMALIZED | {"routing_bias": True},
        oracle=Tiny(16, 6, config=dict(moe_intermediate_size=[F, F]), block_args=(F,)),
        config_of="ernie4_5_vl_moe",
        model_type="ernie4_5_vl_moe_text",
        other_block="Ernie4_5_VLMoeSparseMoeBlock",
        config_keys=Keys("moe_num_experts", "moe_k", "moe_intermediate_size"),
    ),
    # Sarvam-30B (128 experts, top-6, scaling 2.5, 1 shared) and Param2 (64 experts, top-6,
    # scaling 2.5, 2 shared): GLM-4.5's block under their own config classes
    ModelFamily(
        "sarvam_moe",
        SIGMOID_BIAS,
        oracle=Tiny(16, 6, shared=F, scaling=2.5, config=dict(n_shared_experts=1)),
    ),
    ModelFamily(
        "param2moe",
        SIGMOID_BIAS,
        oracle=Tiny(16, 6, shared=2 * F, scaling=2.5, config=dict(n_shared_experts=2)),
    ),
    # Sarvam-105B (128 experts, top-8, scaling 2.5, 1 shared): DeepSeek-V3's block, one group
    ModelFamily(
        "sarvam_mla",
        SIGMOID_BIAS,
        oracle=Tiny(16, 8, shared=F, scaling=2.5, config=dict(n_shared_experts=1)),
    ),
]
