"""The model families checked against transformers: one entry each.

An entry names transformers' own MoE block and its config class (the module that defines
them in the comment above it, inside the installed `transformers/models/`), a tiny config
that keeps the model's real routing settings (top-k, normalisation, scoring function, groups,
scaling, shared experts, biases) at small widths, the moegen spec choices (tests/spec_builder
keys) that should compute the same layer, and how the block's weights map to moegen's
parameters (hf_blocks). Sizes are small so that every case runs in about a second.

Published settings the tiny configs keep (expert counts shrink to 8..32):
  Mixtral 8x7B       8 experts, top-2, softmax, renormalised
  Qwen3-30B-A3B      top-8, norm_topk_prob
  OLMoE              top-8, no renormalisation
  DeepSeek-V3        sigmoid + e_score_correction_bias, 8 groups keep 4, top-8, scaling 2.5,
                     renormalised, 1 shared expert
  GLM-4.5            sigmoid + bias, 1 group, top-8, scaling 2.5, renormalised, 1 shared
  dots.llm1          sigmoid + bias, 1 group, top-6, scaling 2.5, renormalised, 2 shared
  DeepSeek-V2-Lite   softmax, greedy top-6, scaling 1, not renormalised, 2 shared
  DBRX               16 experts, top-4, L1-normalised (= renormalised)
  Jamba              16 experts, top-2, not renormalised
  Granite-MoE        top-8, softmax over the chosen logits
  Hunyuan-A13B       top-8, renormalised, a shared MLP
  MiniMax-Text-01    32 experts, top-2, renormalised
  DeepSeek-V4        sqrtsoftplus + bias, top-6, scaling 1.5, renormalised, 1 shared,
                     SwiGLU clamped at swiglu_limit 10 (routed and shared)
and, with the spec features of issue 18:
  gpt-oss            router with a bias, top-4, softmax over the chosen logits, expert
                     biases, clamped SwiGLU with alpha 1.702 and (up + 1)
  Llama 4            top-1 sigmoid, the weight multiplies the expert's input, 1 shared
  Qwen1.5/2-MoE      top-4, not renormalised, shared expert gated by sigmoid(x @ g)
  ERNIE 4.5          softmax + a selection-only bias (moe_statics), top-6, renormalised,
                     2 shared
  DeepSeek-V2        softmax, 8 groups ranked by their best score, keep 3, top-6,
                     scaling 16, not renormalised, 2 shared
  (synthetic)        DeepSeek-V3's router with top-6 of 4 kept groups: still ranked by
                     the sum of each group's top 2
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from oracle.hf_blocks import (
    Init,
    Tensor,
    Weights,
    concatenated,
    dbrx_experts,
    fused_experts,
    gpt_oss_experts,
    interleaved,
    linear_t,
    llama4_experts,
    shared_mlp,
)

EMBED = 32  # D
FFN = 48  # F, each routed expert
BATCH, SEQ_LEN = 4, 16  # 64 tokens

M = "transformers.models."


@dataclass(frozen=True)
class Family:
    name: str
    block: str  # transformers' MoE block class
    config: str  # its config class
    config_kwargs: dict[str, Any]
    spec: dict[str, Any]  # spec_builder choices: layer and router (sizes, routing, FFN)
    weights: Callable[[nn.Module], Weights]  # the block's tensors as moegen's parameters
    block_args: tuple[Any, ...] = ()  # after the config (a layer index)
    init: Init = field(default_factory=Init)
    # (limit, how gate_up splits) where the experts clamp their SwiGLU: the large input
    # scale must make the clamps bite
    clamp: tuple[float, Callable[[Tensor], tuple[Tensor, Tensor]]] | None = None
    large_scale: float | None = 8.0  # input scale of the second case (None: normal only)


def _sizes(experts: int, shared: int | None = None) -> dict[str, Any]:
    choices: dict[str, Any] = {"experts": experts, "embed": EMBED, "ffn": FFN}
    if shared is not None:
        choices["shared_ffn"] = shared
    return choices


FAMILIES: list[Family] = [
    # transformers/models/mixtral/modeling_mixtral.py
    Family(
        name="mixtral",
        block=M + "mixtral.modeling_mixtral.MixtralSparseMoeBlock",
        config=M + "mixtral.configuration_mixtral.MixtralConfig",
        config_kwargs=dict(
            hidden_size=EMBED, intermediate_size=FFN, num_local_experts=8, num_experts_per_tok=2
        ),
        spec=_sizes(8) | {"top_k": 2, "score": "softmax", "renormalize": True},
        weights=lambda b: {"router": linear_t(b.gate.weight), **fused_experts(b.experts)},
    ),
    # transformers/models/qwen3_moe/modeling_qwen3_moe.py
    Family(
        name="qwen3_moe",
        block=M + "qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
        config=M + "qwen3_moe.configuration_qwen3_moe.Qwen3MoeConfig",
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,
            num_experts=16,
            num_experts_per_tok=8,
            norm_topk_prob=True,
        ),
        spec=_sizes(16) | {"top_k": 8, "score": "softmax", "renormalize": True},
        weights=lambda b: {"router": linear_t(b.gate.weight), **fused_experts(b.experts)},
    ),
    # transformers/models/olmoe/modeling_olmoe.py
    Family(
        name="olmoe",
        block=M + "olmoe.modeling_olmoe.OlmoeSparseMoeBlock",
        config=M + "olmoe.configuration_olmoe.OlmoeConfig",
        config_kwargs=dict(
            hidden_size=EMBED,
            intermediate_size=FFN,
            num_experts=16,
            num_experts_per_tok=8,
            norm_topk_prob=False,
        ),
        spec=_sizes(16) | {"top_k": 8, "score": "softmax"},
        weights=lambda b: {"router": linear_t(b.gate.weight), **fused_experts(b.experts)},
    ),
    # transformers/models/deepseek_v3/modeling_deepseek_v3.py
    Family(
        name="deepseek_v3",
        block=M + "deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE",
        config=M + "deepseek_v3.configuration_deepseek_v3.DeepseekV3Config",
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,
            n_routed_experts=32,
            num_experts_per_tok=8,
            n_group=8,
            topk_group=4,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            n_shared_experts=1,
        ),
        # groups are ranked by the sum of their top 2 (top_k / keep = 8 / 4 here)
        spec=_sizes(32, shared=FFN)
        | {
            "top_k": 8,
            "score": "sigmoid",
            "renormalize": True,
            "routed_scaling": 2.5,
            "group_limit": (8, 4),
            "routing_bias": True,
        },
        weights=lambda b: {
            "router": linear_t(b.gate.weight),
            "routing_bias": b.gate.e_score_correction_bias,
            **fused_experts(b.experts),
            **shared_mlp(b.shared_experts),
        },
    ),
    # transformers/models/glm4_moe/modeling_glm4_moe.py
    Family(
        name="glm4_moe",
        block=M + "glm4_moe.modeling_glm4_moe.Glm4MoeMoE",
        config=M + "glm4_moe.configuration_glm4_moe.Glm4MoeConfig",
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,
            n_routed_experts=16,
            num_experts_per_tok=8,
            n_group=1,
            topk_group=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            n_shared_experts=1,
        ),
        spec=_sizes(16, shared=FFN)
        | {
            "top_k": 8,
            "score": "sigmoid",
            "renormalize": True,
            "routed_scaling": 2.5,
            "routing_bias": True,
        },
        weights=lambda b: {
            "router": linear_t(b.gate.weight),
            "routing_bias": b.gate.e_score_correction_bias,
            **fused_experts(b.experts),
            **shared_mlp(b.shared_experts),
        },
    ),
    # transformers/models/dots1/modeling_dots1.py
    Family(
        name="dots1",
        block=M + "dots1.modeling_dots1.Dots1MoE",
        config=M + "dots1.configuration_dots1.Dots1Config",
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,
            n_routed_experts=16,
            num_experts_per_tok=6,
            n_group=1,
            topk_group=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            n_shared_experts=2,
        ),
        spec=_sizes(16, shared=2 * FFN)
        | {
            "top_k": 6,
            "score": "sigmoid",
            "renormalize": True,
            "routed_scaling": 2.5,
            "routing_bias": True,
        },
        weights=lambda b: {
            "router": linear_t(b.gate.weight),
            "routing_bias": b.gate.e_score_correction_bias,
            **fused_experts(b.experts),
            **shared_mlp(b.shared_experts),
        },
    ),
    # transformers/models/deepseek_v2/modeling_deepseek_v2.py (topk_method "greedy")
    Family(
        name="deepseek_v2_lite",
        block=M + "deepseek_v2.modeling_deepseek_v2.DeepseekV2Moe",
        config=M + "deepseek_v2.configuration_deepseek_v2.DeepseekV2Config",
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,
            n_routed_experts=16,
            num_experts_per_tok=6,
            topk_method="greedy",
            routed_scaling_factor=1.0,
            norm_topk_prob=False,
            n_shared_experts=2,
        ),
        spec=_sizes(16, shared=2 * FFN) | {"top_k": 6, "score": "softmax"},
        weights=lambda b: {
            "router": linear_t(b.gate.weight),
            **fused_experts(b.experts),
            **shared_mlp(b.shared_experts),
        },
    ),
    # transformers/models/dbrx/modeling_dbrx.py (DbrxFFN: router + experts)
    Family(
        name="dbrx",
        block=M + "dbrx.modeling_dbrx.DbrxFFN",
        config=M + "dbrx.configuration_dbrx.DbrxConfig",
        config_kwargs=dict(
            d_model=EMBED,
            ffn_config={
                "ffn_hidden_size": FFN,
                "moe_num_experts": 16,
                "moe_top_k": 4,
                "moe_normalize_expert_weights": 1.0,  # L1: the weights sum to 1
                "ffn_act_fn": {"name": "silu"},
            },
        ),
        spec=_sizes(16) | {"top_k": 4, "score": "softmax", "renormalize": True},
        weights=lambda b: {"router": linear_t(b.router.layer.weight), **dbrx_experts(b.experts)},
    ),
    # transformers/models/jamba/modeling_jamba.py
    Family(
        name="jamba",
        block=M + "jamba.modeling_jamba.JambaSparseMoeBlock",
        config=M + "jamba.configuration_jamba.JambaConfig",
        config_kwargs=dict(
            hidden_size=EMBED, intermediate_size=FFN, num_experts=16, num_experts_per_tok=2
        ),
        spec=_sizes(16) | {"top_k": 2, "score": "softmax"},
        weights=lambda b: {"router": linear_t(b.router.weight), **fused_experts(b.experts)},
    ),
    # transformers/models/granitemoe/modeling_granitemoe.py
    Family(
        name="granitemoe",
        block=M + "granitemoe.modeling_granitemoe.GraniteMoeMoE",
        config=M + "granitemoe.configuration_granitemoe.GraniteMoeConfig",
        config_kwargs=dict(
            hidden_size=EMBED, intermediate_size=FFN, num_local_experts=32, num_experts_per_tok=8
        ),
        spec=_sizes(32) | {"top_k": 8, "score": "softmax", "score_after_top_k": True},
        weights=lambda b: {"router": linear_t(b.router.weight), **fused_experts(b.experts)},
    ),
    # transformers/models/hunyuan_v1_moe/modeling_hunyuan_v1_moe.py
    Family(
        name="hunyuan_v1_moe",
        block=M + "hunyuan_v1_moe.modeling_hunyuan_v1_moe.HunYuanMoEV1Moe",
        config=M + "hunyuan_v1_moe.configuration_hunyuan_v1_moe.HunYuanMoEV1Config",
        # the shared MLP and every expert are intermediate_size wide
        config_kwargs=dict(hidden_size=EMBED, intermediate_size=FFN, num_experts=16, moe_topk=8),
        spec=_sizes(16, shared=FFN) | {"top_k": 8, "score": "softmax", "renormalize": True},
        weights=lambda b: {
            "router": linear_t(b.gate.wg.weight),
            **fused_experts(b.experts),
            **shared_mlp(b.shared_mlp),
        },
    ),
    # transformers/models/minimax/modeling_minimax.py
    Family(
        name="minimax",
        block=M + "minimax.modeling_minimax.MiniMaxSparseMoeBlock",
        config=M + "minimax.configuration_minimax.MiniMaxConfig",
        config_kwargs=dict(
            hidden_size=EMBED, intermediate_size=FFN, num_local_experts=32, num_experts_per_tok=2
        ),
        spec=_sizes(32) | {"top_k": 2, "score": "softmax", "renormalize": True},
        weights=lambda b: {"router": linear_t(b.gate.weight), **fused_experts(b.experts)},
    ),
    # transformers/models/deepseek_v4/modeling_deepseek_v4.py (DeepseekV4TopKRouter layers;
    # the first layers' hash routing looks experts up by token id, not a spec option)
    Family(
        name="deepseek_v4",
        block=M + "deepseek_v4.modeling_deepseek_v4.DeepseekV4SparseMoeBlock",
        config=M + "deepseek_v4.configuration_deepseek_v4.DeepseekV4Config",
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,  # the routed experts and the shared one
            n_routed_experts=16,
            num_experts_per_tok=6,
            n_shared_experts=1,
            scoring_func="sqrtsoftplus",
            norm_topk_prob=True,
            routed_scaling_factor=1.5,
            swiglu_limit=10.0,
            num_hidden_layers=1,
            mlp_layer_types=["moe"],
        ),
        block_args=(0,),  # layer 0, a top-k ("moe") layer
        spec=_sizes(16, shared=FFN)
        | {
            "top_k": 6,
            "score": "sqrtsoftplus",
            "renormalize": True,
            "routed_scaling": 1.5,
            "routing_bias": True,
            "glu": {"gate_limit": 10.0, "up_limit": 10.0},  # swiglu_limit, routed and shared
        },
        weights=lambda b: {
            "router": linear_t(b.gate.weight),
            "routing_bias": b.gate.e_score_correction_bias,
            **fused_experts(b.experts),
            **shared_mlp(b.shared_experts),
        },
        clamp=(10.0, concatenated),
    ),
    # ---- the families below need the spec features of issue 18 ----
    # transformers/models/gpt_oss/modeling_gpt_oss.py (GptOssMLP: router + experts)
    Family(
        name="gpt_oss",
        block=M + "gpt_oss.modeling_gpt_oss.GptOssMLP",
        config=M + "gpt_oss.configuration_gpt_oss.GptOssConfig",
        config_kwargs=dict(
            hidden_size=EMBED,
            intermediate_size=FFN,
            num_local_experts=16,
            num_experts_per_tok=4,
            swiglu_limit=7.0,  # the published config's, = the gpt_oss preset
            swiglu_alpha=1.702,
        ),
        spec=_sizes(16)
        | {
            "glu": "gpt_oss",
            "ffn_bias": True,
            "top_k": 4,
            "score": "softmax",
            "score_after_top_k": True,
            "linear_bias": True,
        },
        weights=lambda b: {
            "router": linear_t(b.router.weight),
            "router_bias": b.router.bias,
            **gpt_oss_experts(b.experts),
        },
        clamp=(7.0, interleaved),
    ),
    # transformers/models/llama4/modeling_llama4.py (Llama4TextMoe)
    Family(
        name="llama4",
        block=M + "llama4.modeling_llama4.Llama4TextMoe",
        config=M + "llama4.configuration_llama4.Llama4TextConfig",
        # the shared expert is intermediate_size wide, like each routed one
        config_kwargs=dict(
            hidden_size=EMBED, intermediate_size=FFN, num_local_experts=16, num_experts_per_tok=1
        ),
        spec=_sizes(16, shared=FFN) | {"top_k": 1, "score": "sigmoid", "weighting": "input"},
        weights=lambda b: {
            "router": linear_t(b.router.weight),
            **llama4_experts(b.experts),
            **shared_mlp(b.shared_expert),
        },
        # at 8x the two best logits of 2 tokens pass ~17, where float32 sigmoid is 1.0 for
        # both: Llama4Router chooses by logit, and so must moegen (a top-k of the saturated
        # scores would take the lower expert index)
    ),
    # transformers/models/qwen2_moe/modeling_qwen2_moe.py
    Family(
        name="qwen2_moe",
        block=M + "qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
        config=M + "qwen2_moe.configuration_qwen2_moe.Qwen2MoeConfig",
        # Qwen1.5-MoE-A2.7B: 60 experts, top-4, not renormalised, shared expert 4 x 1408 wide
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,
            shared_expert_intermediate_size=4 * FFN,
            num_experts=16,
            num_experts_per_tok=4,
            norm_topk_prob=False,
        ),
        spec=_sizes(16, shared=4 * FFN)
        | {"shared_expert_gate": True, "top_k": 4, "score": "softmax"},
        weights=lambda b: {
            "router": linear_t(b.gate.weight),
            **fused_experts(b.experts),
            **shared_mlp(b.shared_expert),
            "shared_expert_gate": b.shared_expert_gate.weight[0],  # nn.Linear(D, 1): [1, D]
        },
    ),
    # transformers/models/ernie4_5_moe/modeling_ernie4_5_moe.py
    Family(
        name="ernie4_5_moe",
        block=M + "ernie4_5_moe.modeling_ernie4_5_moe.Ernie4_5_MoeSparseMoeBlock",
        config=M + "ernie4_5_moe.configuration_ernie4_5_moe.Ernie4_5_MoeConfig",
        # ERNIE-4.5-21B-A3B: 64 experts, top-6, moe_statics bias on the softmax, 2 shared
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,
            moe_num_experts=16,
            moe_k=6,
            moe_num_shared_experts=2,
            use_bias=False,
        ),
        spec=_sizes(16, shared=2 * FFN)
        | {"top_k": 6, "score": "softmax", "renormalize": True, "routing_bias": True},
        weights=lambda b: {
            "router": linear_t(b.gate.weight),
            "routing_bias": b.gate.moe_statics.e_score_correction_bias[0],  # [1, E]
            **fused_experts(b.experts),
            **shared_mlp(b.shared_experts),
        },
        # softmax probabilities are about 1 / 16 each: a bias of that order steers selection
        init=Init(selection_bias=0.03),
    ),
    # transformers/models/deepseek_v2/modeling_deepseek_v2.py (topk_method
    # "group_limited_greedy": groups ranked by their best score)
    Family(
        name="deepseek_v2",
        block=M + "deepseek_v2.modeling_deepseek_v2.DeepseekV2Moe",
        config=M + "deepseek_v2.configuration_deepseek_v2.DeepseekV2Config",
        # DeepSeek-V2: 160 experts in 8 groups, keep 3, top-6, scaling 16, 2 shared
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,
            n_routed_experts=32,
            num_experts_per_tok=6,
            topk_method="group_limited_greedy",
            n_group=8,
            topk_group=3,
            routed_scaling_factor=16.0,
            norm_topk_prob=False,
            n_shared_experts=2,
        ),
        spec=_sizes(32, shared=2 * FFN)
        | {
            "top_k": 6,
            "score": "softmax",
            "routed_scaling": 16.0,
            "group_limit": {"groups": 8, "keep": 3, "top_per_group": 1},
        },
        weights=lambda b: {
            "router": linear_t(b.gate.weight),
            **fused_experts(b.experts),
            **shared_mlp(b.shared_experts),
        },
    ),
    # transformers/models/deepseek_v3/modeling_deepseek_v3.py, synthetic: top-6 of 4 kept
    # groups (not a multiple): groups are still ranked by the sum of their top 2
    Family(
        name="deepseek_v3_top6_keep4",
        block=M + "deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE",
        config=M + "deepseek_v3.configuration_deepseek_v3.DeepseekV3Config",
        config_kwargs=dict(
            hidden_size=EMBED,
            moe_intermediate_size=FFN,
            n_routed_experts=32,
            num_experts_per_tok=6,
            n_group=8,
            topk_group=4,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            n_shared_experts=1,
        ),
        spec=_sizes(32, shared=FFN)
        | {
            "top_k": 6,
            "score": "sigmoid",
            "renormalize": True,
            "routed_scaling": 2.5,
            "group_limit": {"groups": 8, "keep": 4},  # top_per_group: the default 2
            "routing_bias": True,
        },
        weights=lambda b: {
            "router": linear_t(b.gate.weight),
            "routing_bias": b.gate.e_score_correction_bias,
            **fused_experts(b.experts),
            **shared_mlp(b.shared_experts),
        },
    ),
]

BY_NAME = {family.name: family for family in FAMILIES}
assert len(BY_NAME) == len(FAMILIES)
