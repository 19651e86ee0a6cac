"""One tiny transformers model per family moegen.checkpoints covers, and the spec of the moegen
layer that computes the same MoE block (tests/test_checkpoints.py).

Each case: the family, a function that builds a 2-layer float32 model of that family with layer 1
an MoE layer, the path from the model to layer 1's MoE block, and the spec of the matching moegen
layer (tests/spec_builder.py choices). Sizes: 8 experts (16 where groups need them), embed 32,
FFN 16, so every test runs in seconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EMBED, FFN, EXPERTS = 32, 16, 8
COMMON = {
    "vocab_size": 64,
    "hidden_size": EMBED,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
# the moegen side: one CPU device, float32 throughout, 2 x 8 tokens
SPEC_BASE = {
    "experts": EXPERTS,
    "embed": EMBED,
    "ffn": FFN,
    "top_k": 2,
    "batch": 2,
    "seq_len": 8,
    "params_dtype": "float32",
    "compute_dtype": "float32",
    "axes": {"data": 1},
}


@dataclass(frozen=True)
class Case:
    family: str
    model: str  # transformers class
    config: Callable[[Any], Any]  # transformers module -> config
    spec: dict[str, Any]  # spec_builder choices, merged into SPEC_BASE
    block: Callable[[Any], Any] = lambda model: model.model.layers[1].mlp
    fused_differs: bool = True  # the in-memory (state_dict) names differ from save_pretrained's


def _qwen_like(t: Any, cls: str, **kw: Any) -> Any:
    return getattr(t, cls)(**COMMON, **kw)


def _deepseek_v3(t: Any) -> Any:
    return t.DeepseekV3Config(
        **COMMON,
        moe_intermediate_size=FFN,
        intermediate_size=64,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
    )


def _deepseek_v2(t: Any, **kw: Any) -> Any:
    return t.DeepseekV2Config(
        **COMMON,
        moe_intermediate_size=FFN,
        intermediate_size=64,
        n_routed_experts=EXPERTS,
        num_experts_per_tok=2,
        n_shared_experts=2,
        first_k_dense_replace=1,
        routed_scaling_factor=2.0,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        **kw,
    )


def _dbrx(t: Any) -> Any:
    config = t.DbrxConfig(
        d_model=EMBED,
        n_layers=2,
        n_heads=2,
        vocab_size=64,
        ffn_config={"ffn_hidden_size": FFN, "moe_num_experts": EXPERTS, "moe_top_k": 2},
        attn_config={"kv_n_heads": 2},
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config.attn_config.rope_theta = 10000.0  # DbrxAttention reads it there (transformers 5.24)
    return config


_SIGMOID_BIAS = {"score": "sigmoid", "routing_bias": True, "renormalize": True}

CASES: dict[str, Case] = {
    c.family: c
    for c in (
        Case(
            "mixtral",
            "MixtralForCausalLM",
            lambda t: t.MixtralConfig(
                **COMMON, intermediate_size=FFN, num_local_experts=EXPERTS, num_experts_per_tok=2
            ),
            {"renormalize": True},
        ),
        Case(
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
            lambda t: _qwen_like(
                t,
                "Qwen3MoeConfig",
                moe_intermediate_size=FFN,
                intermediate_size=64,
                num_experts=EXPERTS,
                num_experts_per_tok=2,
                norm_topk_prob=True,
            ),
            {"renormalize": True},
        ),
        Case(
            "olmoe",
            "OlmoeForCausalLM",
            lambda t: _qwen_like(
                t, "OlmoeConfig", intermediate_size=FFN, num_experts=EXPERTS, num_experts_per_tok=2
            ),
            {},
        ),
        Case(
            "deepseek_v3",
            "DeepseekV3ForCausalLM",
            _deepseek_v3,
            _SIGMOID_BIAS
            | {
                "experts": 16,
                "top_k": 4,
                "group_limit": (4, 2),
                "routed_scaling": 2.5,
                "shared_ffn": FFN,
            },
        ),
        Case(
            "glm4_moe",
            "Glm4MoeForCausalLM",
            lambda t: _qwen_like(
                t,
                "Glm4MoeConfig",
                moe_intermediate_size=FFN,
                intermediate_size=64,
                n_routed_experts=EXPERTS,
                num_experts_per_tok=2,
                n_shared_experts=1,
                first_k_dense_replace=1,
                routed_scaling_factor=1.5,
            ),
            _SIGMOID_BIAS | {"routed_scaling": 1.5, "shared_ffn": FFN},
        ),
        Case(
            "dots1",
            "Dots1ForCausalLM",
            lambda t: _qwen_like(
                t,
                "Dots1Config",
                moe_intermediate_size=FFN,
                intermediate_size=64,
                n_routed_experts=EXPERTS,
                num_experts_per_tok=2,
                n_shared_experts=2,
                first_k_dense_replace=1,
                norm_topk_prob=True,
                routed_scaling_factor=2.0,
            ),
            _SIGMOID_BIAS | {"routed_scaling": 2.0, "shared_ffn": 2 * FFN},
        ),
        Case(
            "deepseek_v2",  # V2-Lite: greedy top-k, no groups
            "DeepseekV2ForCausalLM",
            _deepseek_v2,
            {"routed_scaling": 2.0, "shared_ffn": 2 * FFN},
        ),
        Case(
            "dbrx",
            "DbrxForCausalLM",
            _dbrx,
            {"renormalize": True},
            block=lambda model: model.transformer.blocks[1].ffn,
            fused_differs=False,
        ),
        Case(
            "jamba",
            "JambaForCausalLM",
            lambda t: _qwen_like(
                t,
                "JambaConfig",
                intermediate_size=FFN,
                num_experts=EXPERTS,
                num_experts_per_tok=2,
                mamba_d_state=4,
                mamba_dt_rank=4,
                mamba_d_conv=2,
                mamba_expand=1,
                attn_layer_period=2,
                attn_layer_offset=0,
            ),
            {},
            block=lambda model: model.model.layers[1].feed_forward,
        ),
        Case(
            "granitemoe",
            "GraniteMoeForCausalLM",
            lambda t: _qwen_like(
                t,
                "GraniteMoeConfig",
                intermediate_size=FFN,
                num_local_experts=EXPERTS,
                num_experts_per_tok=2,
            ),
            {"score_after_top_k": True},
            block=lambda model: model.model.layers[1].block_sparse_moe,
        ),
        Case(
            "hunyuan_v1_moe",
            "HunYuanMoEV1ForCausalLM",
            lambda t: _qwen_like(
                t, "HunYuanMoEV1Config", intermediate_size=FFN, num_experts=EXPERTS, moe_topk=2
            ),
            {"renormalize": True, "shared_ffn": FFN},
        ),
        Case(
            "minimax",
            "MiniMaxForCausalLM",
            lambda t: _qwen_like(
                t,
                "MiniMaxConfig",
                intermediate_size=FFN,
                num_local_experts=EXPERTS,
                num_experts_per_tok=2,
                layer_types=["full_attention", "full_attention"],
            ),
            {"renormalize": True},
        ),
        Case(
            "deepseek_v4",
            "DeepseekV4ForCausalLM",
            lambda t: _qwen_like(
                t,
                "DeepseekV4Config",
                moe_intermediate_size=FFN,
                n_routed_experts=EXPERTS,
                num_experts_per_tok=2,
                mlp_layer_types=["moe", "moe"],
                routed_scaling_factor=1.5,
            ),
            {
                "score": "sqrtsoftplus",
                "routing_bias": True,
                "renormalize": True,
                "routed_scaling": 1.5,
                "shared_ffn": FFN,
            },
        ),
        Case(
            "gpt_oss",
            "GptOssForCausalLM",
            lambda t: _qwen_like(
                t,
                "GptOssConfig",
                intermediate_size=FFN,
                num_local_experts=EXPERTS,
                num_experts_per_tok=2,
            ),
            {"ffn_bias": True, "glu": "gpt_oss", "score_after_top_k": True, "linear_bias": True},
            fused_differs=False,
        ),
        Case(
            "llama4",
            "Llama4ForCausalLM",
            lambda t: _qwen_like(
                t,
                "Llama4TextConfig",
                intermediate_size=FFN,
                intermediate_size_mlp=64,
                num_local_experts=EXPERTS,
                num_experts_per_tok=1,
            ),
            {"shared_ffn": FFN, "top_k": 1, "score": "sigmoid", "weighting": "input"},
            block=lambda model: model.model.layers[1].feed_forward,
            fused_differs=False,
        ),
        Case(
            "qwen2_moe",
            "Qwen2MoeForCausalLM",
            lambda t: _qwen_like(
                t,
                "Qwen2MoeConfig",
                moe_intermediate_size=FFN,
                intermediate_size=64,
                shared_expert_intermediate_size=24,
                num_experts=EXPERTS,
                num_experts_per_tok=2,
            ),
            {"shared_ffn": 24, "shared_expert_gate": True},
        ),
        Case(
            "ernie4_5_moe",
            "Ernie4_5_MoeForCausalLM",
            lambda t: _qwen_like(
                t,
                "Ernie4_5_MoeConfig",
                moe_intermediate_size=FFN,
                intermediate_size=64,
                moe_num_experts=EXPERTS,
                moe_k=2,
                moe_num_shared_experts=1,
            ),
            {"shared_ffn": FFN, "renormalize": True, "routing_bias": True},
        ),
    )
}

# DeepSeek-V2 proper: group-limited greedy, groups ranked by their best expert
DEEPSEEK_V2_GROUPS = Case(
    "deepseek_v2",
    "DeepseekV2ForCausalLM",
    lambda t: _deepseek_v2(t, topk_method="group_limited_greedy", n_group=4, topk_group=2),
    {
        "shared_ffn": 2 * FFN,
        "routed_scaling": 2.0,
        "group_limit": {"groups": 4, "keep": 2, "top_per_group": 1},
    },
)
