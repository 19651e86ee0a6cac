"""The model-family table, continued (tests/support/families.py concatenates it): the families whose
MoE block is DeepSeek's, or a close relative of it, checked by the oracle alone (no checkpoint
case). Each keeps the published model's routing as its transformers config sets it by
default (top-k, groups, scaling, shared experts), on up to 32 experts.

Most are DeepSeek-V3's block under another name: a sigmoid router with a selection-only bias
(e_score_correction_bias), optional groups ranked by the sum of their top 2, renormalised,
scaled, plus shared experts of moe_intermediate_size each. The others differ as noted.
"""

from __future__ import annotations

import families_keys
from families_keys import CF, DENSE_FIRST, LOCAL_MOE, MLA, RENORMALIZED, SIGMOID_BIAS, SOFTMAX, F
from family_model import ModelFamily, Tiny

ONE_SHARED = dict(n_shared_experts=1, norm_topk_prob=True)
ONE_GROUP = dict(n_group=1, topk_group=1)  # the published configs': no group limit


def _v3_like(name: str, oracle: Tiny, model_type: str | None = None) -> ModelFamily:
    """A family whose block is DeepSeek-V3's (n_routed_experts, moe_intermediate_size)."""
    return ModelFamily(name, SIGMOID_BIAS, oracle=oracle, model_type=model_type)


DEEPSEEK_FAMILIES: list[ModelFamily] = [
    # DeepSeek-V3.2: V3's MoE (256 experts, 8 groups keep 4, top-8, scaling 2.5, 1 shared)
    ModelFamily(
        "deepseek_v32",
        SIGMOID_BIAS,
        oracle=Tiny(32, 8, shared=F, scaling=2.5, groups=(8, 4), config=ONE_SHARED),
        # its checkpoints keep V3's names (a dense layer 0, then MoE layers)
        checkpoint=Tiny(
            16,
            4,
            shared=CF,
            scaling=2.5,
            groups=(4, 2),
            config=DENSE_FIRST | dict(n_shared_experts=1, q_lora_rank=16, **MLA),
        ),
    ),
    # Ling/Ring hybrid: 512 experts, 8 groups keep 4, top-8, scaling 2.5, 1 shared; the
    # block takes its layer index (transformers 5.25), which picks the layer's SwiGLU limits
    ModelFamily(
        "bailing_hybrid",
        SIGMOID_BIAS,
        oracle=Tiny(
            32, 8, shared=F, scaling=2.5, groups=(8, 4), config=ONE_SHARED, block_args=(0,)
        ),
        config_keys=LOCAL_MOE,
    ),
    # Ling/Ring with the per-layer SwiGLU limits of transformers 5.25 (Step 3.7's clamp:
    # min(silu(gate), L), up in [-L, L]), the shared experts at their own limit
    ModelFamily(
        "bailing_hybrid_clamped",
        SIGMOID_BIAS,
        oracle=Tiny(
            32,
            8,
            shared=F,
            scaling=2.5,
            groups=(8, 4),
            config=ONE_SHARED
            | dict(
                num_hidden_layers=1,
                mlp_layer_types=["sparse"],  # its default makes layers 0-1 dense
                expert_swiglu_limit_list=[0.5],
                share_expert_swiglu_limit_list=[0.8],
            ),
            spec={
                "glu": {"gate_limit": 0.5, "up_limit": 0.5, "gate_clamp": "after_activation"},
                "shared_glu": {
                    "gate_limit": 0.8,
                    "up_limit": 0.8,
                    "gate_clamp": "after_activation",
                },
            },
            block_args=(0,),
        ),
        model_type="bailing_hybrid",
        config_keys=LOCAL_MOE,
    ),
    # A.X-K2-Light routes without groups (n_group None): 128 experts, top-8, scaling 2.5
    _v3_like("axk2", Tiny(16, 8, shared=F, scaling=2.5, config=ONE_SHARED)),
    # A.X-K1: V3's MoE (192 experts, 8 groups keep 4, top-8, scaling 2.5, 1 shared), then an
    # RMSNorm of the block's output (post_mlp_layernorm, eps rms_norm_eps): spec
    # layer.output_norm_eps. The oracle's epsilon is large enough to matter at these sizes.
    # Its checkpoints keep the norm's weight beside the block (model.layers.{L}.
    # post_mlp_layernorm.weight), transformers' state_dict inside it (mlp.post_mlp_layernorm).
    ModelFamily(
        "axk1",
        SIGMOID_BIAS,
        oracle=Tiny(
            32,
            8,
            shared=F,
            scaling=2.5,
            groups=(8, 4),
            config=ONE_SHARED | dict(rms_norm_eps=0.01),
            spec={"output_norm_eps": 0.01},
        ),
        checkpoint=Tiny(
            8,
            2,
            shared=families_keys.CF,
            scaling=2.5,
            config=ONE_GROUP | ONE_SHARED | dict(rms_norm_eps=0.01),
            spec={"output_norm_eps": 0.01},
        ),
    ),
    # GLM-4.7-Flash: 64 experts, top-4, scaling 1.8
    _v3_like("glm4_moe_lite", Tiny(16, 4, shared=F, scaling=1.8, config=ONE_GROUP | ONE_SHARED)),
    # GLM-4.5V's text model: 128 experts, top-8, scaling 1
    _v3_like(
        "glm4v_moe",
        Tiny(16, 8, shared=F, scaling=1.0, config=ONE_GROUP | ONE_SHARED),
        model_type="glm4v_moe_text",
    ),
    # GLM-5 (DSA attention): 256 experts, top-8, scaling 2.5
    _v3_like("glm_moe_dsa", Tiny(16, 8, shared=F, scaling=2.5, config=ONE_GROUP | ONE_SHARED)),
    # GLM-5-Next's text model: 288 experts, top-8, scaling 2.5, and its SwiGLU clamped at
    # swiglu_limit 10 (gate at most 10, up within +-10), routed and shared experts alike
    _v3_like(
        "glm5_next",
        Tiny(
            16,
            8,
            shared=F,
            scaling=2.5,
            config=ONE_GROUP | ONE_SHARED | dict(swiglu_limit=10.0),
            spec={"glu": {"gate_limit": 10.0, "up_limit": 10.0}},
        ),
        model_type="glm5_next_text",
    ),
    # MiniCPM5-MoE (transformers 5.25): V3's block, 160 experts, top-16, scaling 3.66, 1 shared
    ModelFamily(
        "minicpm5_moe",
        SIGMOID_BIAS,
        oracle=Tiny(32, 16, shared=F, scaling=3.66, config=ONE_GROUP | ONE_SHARED),
        checkpoint=Tiny(8, 2, shared=families_keys.CF, scaling=3.66, config=ONE_GROUP | ONE_SHARED),
    ),
    # Kimi Linear: 256 experts, top-8, scaling 2.446
    ModelFamily(
        "kimi_linear",
        SIGMOID_BIAS,
        oracle=Tiny(16, 8, shared=F, scaling=2.446, config=ONE_GROUP | ONE_SHARED),
        config_keys=LOCAL_MOE,
    ),
    # Solar Open: 128 experts, top-8, scaling 1
    _v3_like("solar_open", Tiny(16, 8, shared=F, scaling=1.0, config=ONE_GROUP | ONE_SHARED)),
    # dots3 note's text model: its shared experts are shared_experts_intermediate_size wide
    # each; 256 experts, top-8, scaling 1
    _v3_like(
        "dots3_note",
        Tiny(
            16,
            8,
            shared=F,
            scaling=1.0,
            config=ONE_GROUP | ONE_SHARED | dict(shared_experts_intermediate_size=F),
        ),
        model_type="dots3_note_text",
    ),
    # EXAONE MoE: 64 experts, top-8, scaling 2.5, 1 shared (num_shared_experts)
    ModelFamily(
        "exaone_moe",
        SIGMOID_BIAS,
        oracle=Tiny(
            16,
            8,
            shared=F,
            scaling=2.5,
            config=ONE_GROUP | dict(num_shared_experts=1, norm_topk_prob=True),
        ),
    ),
    # MiMo-V2-Flash: no shared expert; 256 experts, top-8, scaling 1
    _v3_like(
        "mimo_v2_flash", Tiny(16, 8, scaling=1.0, config=ONE_GROUP | dict(norm_topk_prob=True))
    ),
    # Beam: no shared expert, the scaling applied to the experts' sum (the same product);
    # 256 experts, 8 groups keep 4, top-8, scaling 2.5
    ModelFamily(
        "beam",
        SIGMOID_BIAS,
        oracle=Tiny(32, 8, scaling=2.5, groups=(8, 4), config=dict(norm_topk_prob=True)),
    ),
    # HY3: the selection bias is the block's buffer, the scaling router_scaling_factor;
    # 192 experts, top-8, scaling 2.826, 1 shared
    ModelFamily(
        "hy_v3",
        SIGMOID_BIAS,
        oracle=Tiny(
            16,
            8,
            shared=F,
            config=dict(num_shared_experts=1, router_scaling_factor=2.826),
            spec={"routed_scaling": 2.826},
        ),
    ),
    # AFMoE (Trinity): the selection bias is the block's expert_bias, the scaling
    # route_scale; 64 experts, top-6, scale 1, 2 shared
    ModelFamily(
        "afmoe",
        SIGMOID_BIAS,
        oracle=Tiny(16, 6, shared=2 * F, config=dict(num_shared_experts=2, route_scale=1.0)),
    ),
    # dots3 note's vision MoE: the selection bias is the block's buffer, no shared expert;
    # experts per layer from pyramid_num_routed (up to 64), top-2 (capacity_factor),
    # router_scaling_factor 1
    ModelFamily(
        "dots3_note_vision",
        SIGMOID_BIAS,
        oracle=Tiny(
            16,
            2,
            config=dict(
                pyramid_num_routed=[16],  # layer 0: 16 experts
                router_scaling_factor=1.0,
                adapter_in_dim=32,  # = D, as its config checks
                num_attention_heads=4,
            ),
            block_args=(0,),
        ),
        model_type="dots3_note_vision_encoder",
    ),
    # MiniMax-M2: the selection bias is the block's buffer; no scaling, no shared expert;
    # 256 experts, top-8
    ModelFamily("minimax_m2", SIGMOID_BIAS, oracle=Tiny(16, 8)),
    # MiniMax-M3-VL's text model: 128 experts, top-4, scaling 2.0 on the experts' sum, one
    # shared expert (shared_intermediate_size) whose gate and up are one Linear, and
    # gpt-oss's SwiGLU (limit 7, alpha 1.702, up + 1) on a concatenated gate_up, routed
    # and shared alike
    ModelFamily(
        "minimax_m3_vl",
        SIGMOID_BIAS | {"glu": "gpt_oss"},
        oracle=Tiny(
            16,
            4,
            shared=F,
            scaling=2.0,
            config=dict(shared_intermediate_size=F, swiglu_limit=7.0, swiglu_alpha=1.702),
        ),
        model_type="minimax_m3_vl_text",
    ),
    # Mistral Small 4: softmax, no bias, the group limit of 1 group (all kept),
    # renormalised; 128 experts, top-4, scaling 1, 1 shared
    ModelFamily(
        "mistral4",
        RENORMALIZED,
        oracle=Tiny(16, 4, shared=F, scaling=1.0, config=ONE_GROUP | ONE_SHARED),
    ),
    # Mistral Large 3's text model: Mistral 4's router, always renormalised
    ModelFamily(
        "mistral_large4",
        RENORMALIZED,
        oracle=Tiny(16, 4, shared=F, scaling=1.0, config=ONE_GROUP | dict(n_shared_experts=1)),
        model_type="mistral_large4_text",
    ),
    # DeepSeek-OCR 2's and Unlimited-OCR's text models: DeepSeek-V2-Lite's MoE (softmax,
    # greedy top-6 of 64, not renormalised, scaling 1, 2 shared)
    ModelFamily(
        "deepseek_ocr2",
        SOFTMAX,
        oracle=Tiny(  # layer 0 an MoE layer ("sparse"), as its config needs the list
            16,
            6,
            shared=2 * F,
            scaling=1.0,
            config=dict(
                topk_method="greedy",
                n_shared_experts=2,
                num_hidden_layers=2,
                mlp_layer_types=["sparse", "sparse"],
            ),
        ),
        model_type="deepseek_ocr2_text",
    ),
    ModelFamily(
        "unlimited_ocr",
        SOFTMAX,
        oracle=Tiny(  # its config checks that D splits over the (10) attention heads
            16,
            6,
            shared=2 * F,
            scaling=1.0,
            config=dict(topk_method="greedy", n_shared_experts=2, num_attention_heads=4),
        ),
        model_type="unlimited_ocr_text",
    ),
]
