"""The cases the tests hold moegen's model families against transformers with: at least one
for each family of moegen's family table (moegen.families; tests/model_families/test_family_table.py holds
that), for both harnesses that do it.

- The oracle (tests/support/oracle/families.py, tests/model_families/test_transformers_oracle.py) builds transformers'
  own MoE block from the entry's `oracle` sizes and compares it with a moegen layer;
- the checkpoint tests (tests/support/checkpoint_cases.py, tests/model_families/test_checkpoints.py) build a 2-layer
  model from its `checkpoint` sizes (layer 1 an MoE layer), save it and load layer 1 into moegen.

A case is of one entry of the family table (`model_type`, else its name), which says the
transformers classes (config, MoE block, causal LM) and the names its config gives the sizes;
the case says the spec choices (tests/spec_builder keys) that make moegen route as the model
does at any size (`routing`, which tests/model_families/test_init_hf.py holds equal to what the entry's rules
map the case's config to), and each harness's tiny sizes: the
expert count, top-k, routed scaling and groups are written once and go to both the config and
the spec. The harnesses keep different sizes: the oracle keeps each model's real top-k, groups
and scaling on up to 32 experts; a checkpoint case is a whole small model, top-2 of 8 mostly.
"""

from __future__ import annotations

from dataclasses import replace

from families_deepseek import DEEPSEEK_FAMILIES
from families_keys import (  # EMBED and the FFN widths: the harnesses read them from here
    CF,
    CHECKPOINT_FFN,  # noqa: F401
    DENSE_FIRST,
    EMBED,  # noqa: F401
    MLA,
    ORACLE_FFN,  # noqa: F401
    RENORMALIZED,
    SIGMOID_BIAS,
    SOFTMAX,
    F,
)
from families_more import MORE_FAMILIES
from families_options import OPTION_FAMILIES, with_latent, with_shared_biases
from family_model import ModelFamily, Tiny

DEEPSEEK_V2_CHECKPOINT = DENSE_FIRST | dict(n_shared_experts=2, q_lora_rank=None, **MLA)

FAMILIES: list[ModelFamily] = [
    ModelFamily("mixtral", RENORMALIZED, oracle=Tiny(8, 2), checkpoint=Tiny(8, 2)),
    ModelFamily(
        "qwen3_moe",
        RENORMALIZED,
        oracle=Tiny(16, 8, config=dict(norm_topk_prob=True)),
        checkpoint=Tiny(8, 2, config=dict(intermediate_size=64, norm_topk_prob=True)),
    ),
    ModelFamily(
        "olmoe",
        SOFTMAX,
        oracle=Tiny(16, 8, config=dict(norm_topk_prob=False)),
        checkpoint=Tiny(8, 2),
    ),
    ModelFamily(
        "deepseek_v3",
        SIGMOID_BIAS,
        oracle=Tiny(
            32,
            8,
            shared=F,
            scaling=2.5,
            groups=(8, 4),
            config=dict(norm_topk_prob=True, n_shared_experts=1),
        ),
        checkpoint=Tiny(
            16,
            4,
            shared=CF,
            scaling=2.5,
            groups=(4, 2),
            config=DENSE_FIRST | dict(n_shared_experts=1, q_lora_rank=16, **MLA),
        ),
    ),
    ModelFamily(
        "glm4_moe",
        SIGMOID_BIAS,
        oracle=Tiny(
            16,
            8,
            shared=F,
            scaling=2.5,
            config=dict(n_group=1, topk_group=1, norm_topk_prob=True, n_shared_experts=1),
        ),
        checkpoint=Tiny(
            8, 2, shared=CF, scaling=1.5, config=DENSE_FIRST | dict(n_shared_experts=1)
        ),
    ),
    ModelFamily(
        "dots1",
        SIGMOID_BIAS,
        oracle=Tiny(
            16,
            6,
            shared=2 * F,
            scaling=2.5,
            config=dict(n_group=1, topk_group=1, norm_topk_prob=True, n_shared_experts=2),
        ),
        checkpoint=Tiny(
            8,
            2,
            shared=2 * CF,
            scaling=2.0,
            config=DENSE_FIRST | dict(n_shared_experts=2, norm_topk_prob=True),
        ),
    ),
    # DeepSeek-V2-Lite: topk_method "greedy", no groups (moegen.checkpoints: "deepseek_v2")
    ModelFamily(
        "deepseek_v2_lite",
        SOFTMAX,
        oracle=Tiny(
            16,
            6,
            shared=2 * F,
            scaling=1.0,
            config=dict(topk_method="greedy", norm_topk_prob=False, n_shared_experts=2),
        ),
        checkpoint=Tiny(8, 2, shared=2 * CF, scaling=2.0, config=DEEPSEEK_V2_CHECKPOINT),
        model_type="deepseek_v2",
    ),
    ModelFamily(
        "dbrx",
        RENORMALIZED,
        oracle=Tiny(
            16,
            4,
            config={
                "ffn_config": {"moe_normalize_expert_weights": 1.0, "ffn_act_fn": {"name": "silu"}}
            },
        ),
        checkpoint=Tiny(
            8,
            2,
            config=dict(
                n_layers=2,
                n_heads=2,
                vocab_size=64,
                attn_config={"kv_n_heads": 2},
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
        ),
        checkpoint_block="transformer.blocks.1.ffn",
        fused_differs=False,
    ),
    ModelFamily(
        "jamba",
        SOFTMAX,
        oracle=Tiny(16, 2),
        checkpoint=Tiny(
            8,
            2,
            config=dict(
                mamba_d_state=4,
                mamba_dt_rank=4,
                mamba_d_conv=2,
                mamba_expand=1,
                attn_layer_period=2,
                attn_layer_offset=0,
            ),
        ),
        checkpoint_block="model.layers.1.feed_forward",
    ),
    ModelFamily(
        "granitemoe",
        SOFTMAX | {"score_after_top_k": True},
        oracle=Tiny(32, 8),
        checkpoint=Tiny(8, 2),
        checkpoint_block="model.layers.1.block_sparse_moe",
    ),
    # the shared MLP and every expert are intermediate_size wide
    ModelFamily(
        "hunyuan_v1_moe",
        RENORMALIZED,
        oracle=Tiny(16, 8, shared=F),
        checkpoint=Tiny(8, 2, shared=CF),
    ),
    ModelFamily(
        "minimax",
        RENORMALIZED,
        oracle=Tiny(32, 2),
        checkpoint=Tiny(8, 2, config=dict(layer_types=["full_attention", "full_attention"])),
    ),
    # DeepseekV4TopKRouter layers; the first layers' hash routing looks experts up by token
    # id, not a spec option
    ModelFamily(
        "deepseek_v4",
        {"score": "sqrtsoftplus", "renormalize": True, "routing_bias": True},
        oracle=Tiny(
            16,
            6,
            shared=F,
            scaling=1.5,  # moe_intermediate_size: routed and shared
            config=dict(
                n_shared_experts=1,
                scoring_func="sqrtsoftplus",
                norm_topk_prob=True,
                swiglu_limit=10.0,
                num_hidden_layers=1,
                mlp_layer_types=["moe"],
            ),
            spec={"glu": {"gate_limit": 10.0, "up_limit": 10.0}},  # swiglu_limit, both
            block_args=(0,),  # layer 0, a top-k ("moe") layer
        ),
        checkpoint=Tiny(8, 2, shared=CF, scaling=1.5, config=dict(mlp_layer_types=["moe", "moe"])),
    ),
    # ---- the families below need the spec features of issue 18 ----
    ModelFamily(
        "gpt_oss",
        {"glu": "gpt_oss", "ffn_bias": True, "score_after_top_k": True, "linear_bias": True}
        | SOFTMAX,
        oracle=Tiny(  # swiglu_limit: the published config's, = the gpt_oss preset
            16, 4, config=dict(swiglu_limit=7.0, swiglu_alpha=1.702)
        ),
        checkpoint=Tiny(8, 2),
        fused_differs=False,
    ),
    # the shared expert is intermediate_size wide, like each routed one
    ModelFamily(
        "llama4",
        {"score": "sigmoid", "weighting": "input"},
        oracle=Tiny(16, 1, shared=F),
        checkpoint=Tiny(8, 1, shared=CF, config=dict(intermediate_size_mlp=64)),
        checkpoint_block="model.layers.1.feed_forward",
        fused_differs=False,
        model_type="llama4_text",
    ),
    # Qwen1.5-MoE-A2.7B: 60 experts, top-4, not renormalised, shared expert 4 x 1408 wide
    ModelFamily(
        "qwen2_moe",
        {"shared_expert_gate": True} | SOFTMAX,
        oracle=Tiny(
            16,
            4,
            shared=4 * F,
            config=dict(shared_expert_intermediate_size=4 * F, norm_topk_prob=False),
        ),
        checkpoint=Tiny(
            8,
            2,
            shared=24,
            config=dict(intermediate_size=64, shared_expert_intermediate_size=24),
        ),
    ),
    # ERNIE-4.5-21B-A3B: 64 experts, top-6, moe_statics bias on the softmax, 2 shared
    ModelFamily(
        "ernie4_5_moe",
        RENORMALIZED | {"routing_bias": True},
        oracle=Tiny(16, 6, shared=2 * F, config=dict(moe_num_shared_experts=2, use_bias=False)),
        checkpoint=Tiny(
            8, 2, shared=CF, config=dict(intermediate_size=64, moe_num_shared_experts=1)
        ),
    ),
    # DeepSeek-V2: topk_method "group_limited_greedy", groups ranked by their best score;
    # published: 160 experts in 8 groups, keep 3, top-6, scaling 16, 2 shared
    ModelFamily(
        "deepseek_v2",
        SOFTMAX | {"group_limit": {"top_per_group": 1}},
        oracle=Tiny(
            32,
            6,
            shared=2 * F,
            scaling=16.0,
            groups=(8, 3),
            config=dict(
                topk_method="group_limited_greedy", norm_topk_prob=False, n_shared_experts=2
            ),
        ),
        checkpoint=Tiny(
            8,
            2,
            shared=2 * CF,
            scaling=2.0,
            groups=(4, 2),
            config=DEEPSEEK_V2_CHECKPOINT | dict(topk_method="group_limited_greedy"),
        ),
    ),
]

# synthetic: DeepSeek-V3's router with top-6 of 4 kept groups (not a multiple): groups are still
# ranked by the sum of their top 2 (top_per_group: the default)
_V3 = next(family for family in FAMILIES if family.name == "deepseek_v3")
FAMILIES.append(
    replace(
        _V3,
        name="deepseek_v3_top6_keep4",
        model_type="deepseek_v3",
        oracle=replace(_V3.oracle, top_k=6),
        checkpoint=None,
    )
)
# the families the oracle alone checks, in tests/families_*.py to keep each file short
FAMILIES += DEEPSEEK_FAMILIES + MORE_FAMILIES + OPTION_FAMILIES
FAMILIES.append(with_shared_biases(next(f for f in FAMILIES if f.name == "ernie4_5_moe")))
FAMILIES.append(with_latent(next(f for f in FAMILIES if f.name == "nemotron_h")))
BY_NAME = {family.name: family for family in FAMILIES}
assert len(BY_NAME) == len(FAMILIES)
