"""The named cases (shapes, router and expert features) and their seeded parameters, shared by the tests of the dense reference."""

from __future__ import annotations

import zlib
from dataclasses import replace

import numpy as np
from reference_case_model import GATED, S4, S8, S16, C, Case, make_params

from moegen.verify.reference.layer import SharedGlu

__all__ = ["CASES", "GATED", "GRADIENT_CASES", "C", "Case", "case_data", "make_params"]

CASES = {
    "mixtral": Case(S8, C(top_k=2, score="softmax", renormalize=True)),
    "switch_top1": Case(S4, C(top_k=1, score="softmax")),
    "softmax_top4_plain": Case(S8, C(top_k=4, score="softmax")),
    "sqrtsoftplus": Case(
        S8,
        C(
            top_k=2,
            score="sqrtsoftplus",
            renormalize=True,
            load_balance_weight=0.3,
            z_loss_weight=0.05,
        ),
    ),
    "sigmoid_bias": Case(S8, C(top_k=2, score="sigmoid", renormalize=True), routing_bias=True),
    "sigmoid_scaled_plain": Case(S8, C(top_k=3, score="sigmoid", routed_scaling=1.5)),
    "deepseek_v2_groups": Case(
        S16,
        C(top_k=4, score="softmax", num_groups=4, top_groups=2, routed_scaling=16.0),
    ),
    "deepseek_v3": Case(
        S16,
        C(
            top_k=4,
            score="sigmoid",
            renormalize=True,
            routed_scaling=2.5,
            num_groups=4,
            top_groups=2,
            load_balance_weight=0.2,
            z_loss_weight=0.01,
        ),
        routing_bias=True,
        shared=6,
    ),
    # gpt-oss's clamped SwiGLU, with limits low enough that the clamps bite at this scale
    "gpt_oss": Case(
        S8,
        C(
            top_k=4,
            score="softmax",
            score_after_top_k=True,
            load_balance_weight=0.1,
            z_loss_weight=0.02,
            gate_limit=0.6,
            up_limit=0.6,
            sigmoid_scale=1.702,
            up_offset=1.0,
        ),
        router_bias=True,
        ffn_biases=True,
    ),
    "llama4": Case(
        S8, C(top_k=1, score="sigmoid", weights_on_input=True, z_loss_weight=0.05), shared=6
    ),
    "input_weighting_top2_biases": Case(
        S4, C(top_k=2, score="softmax", renormalize=True, weights_on_input=True), ffn_biases=True
    ),
    "qwen2_moe": Case(
        S8,
        C(top_k=2, score="softmax", load_balance_weight=0.1),
        shared=6,
        shared_expert_gate=True,
    ),
    "ernie_softmax_bias": Case(
        S8, C(top_k=2, score="softmax", renormalize=True), routing_bias=True
    ),
    "deepseek_v2_group_max": Case(
        S16, C(top_k=3, score="softmax", num_groups=4, top_groups=2, group_top_n=1)
    ),
    "deepseek_v4_clamped_shared": Case(
        S8,
        C(
            top_k=2,
            score="sqrtsoftplus",
            renormalize=True,
            gate_limit=0.5,
            up_limit=0.4,
            z_loss_weight=0.02,
        ),
        shared=6,
    ),
    # transformers' load_balancing_loss_func: on the layer's own selection (Mixtral), and
    # beside a selection bias with groups (the loss counts the logits' top-k, not the layer's)
    "balance_transformers_mixtral": Case(
        S8,
        C(
            top_k=2,
            score="softmax",
            score_after_top_k=True,
            load_balance_weight=0.3,
            load_balance_form="transformers",
        ),
    ),
    "balance_transformers_biased_groups": Case(
        S16,
        C(
            top_k=4,
            score="sigmoid",
            renormalize=True,
            num_groups=4,
            top_groups=2,
            load_balance_weight=0.2,
            load_balance_form="transformers",
        ),
        routing_bias=True,
    ),
    # LFM2-MoE: renormalised by (sum + 1e-6), with a selection bias; Kolibri1: the bias on the
    # logits before the sigmoid (an epsilon large enough to show in float32)
    "lfm2_epsilon": Case(
        S8,
        C(
            top_k=2,
            score="sigmoid",
            renormalize=True,
            renormalize_epsilon=0.25,
            routed_scaling=2.0,
            z_loss_weight=0.02,
        ),
        routing_bias=True,
    ),
    "kolibri1_bias_on_logits": Case(
        S8,
        C(top_k=3, score="sigmoid", renormalize=True, bias_on_logits=True, load_balance_weight=0.2),
        routing_bias=True,
    ),
    # Step 3.7: the gate clamped after the activation, the shared expert at its own limit;
    # HY-V4: the routed experts clamped, the shared one plain
    "step3p7_clamp_after_shared_limit": Case(
        S8,
        C(
            top_k=2,
            score="sigmoid",
            renormalize=True,
            gate_limit=0.3,
            up_limit=0.4,
            gate_clamp_after=True,
            shared_glu=SharedGlu(gate_limit=0.5, up_limit=0.6, gate_clamp_after=True),
            z_loss_weight=0.01,
        ),
        routing_bias=True,
        shared=6,
    ),
    "hy_v4_routed_clamped_shared_plain": Case(
        S8,
        C(top_k=2, score="sigmoid", gate_limit=0.3, up_limit=0.4, shared_glu=SharedGlu()),
        shared=6,
    ),
    # Nemotron-H: ungated relu^2 experts and shared expert, sigmoid with a selection bias
    "nemotron_h_relu2": Case(
        S8,
        C(
            top_k=2,
            score="sigmoid",
            renormalize=True,
            routed_scaling=2.5,
            activation="relu2",
            load_balance_weight=0.1,
            load_balance_form="transformers",
        ),
        routing_bias=True,
        shared=6,
    ),
    # Nemotron-H with moe_latent_size and mlp_bias: the experts in a latent width, biases
    "nemotron_h_latent": Case(
        S8,
        C(
            top_k=2,
            score="sigmoid",
            renormalize=True,
            routed_scaling=2.5,
            activation="relu2",
            z_loss_weight=0.01,
        ),
        routing_bias=True,
        shared=6,
        latent=5,
        latent_biases=True,
    ),
    # ERNIE 4.5 with use_bias: the shared experts' projections have biases
    "ernie_shared_biases": Case(
        S8,
        C(top_k=2, score="softmax", renormalize=True, z_loss_weight=0.01),
        routing_bias=True,
        shared=6,
        shared_biases=True,
    ),
    # Laguna: router logits soft-capped (low enough to bend these logits), sigmoid + bias
    "laguna_logit_softcap": Case(
        S8,
        C(
            top_k=2,
            score="sigmoid",
            renormalize=True,
            logit_softcap=0.5,
            load_balance_weight=0.1,
            z_loss_weight=0.02,
        ),
        routing_bias=True,
    ),
    # Gemma 4: the router's input RMS-normalised and scaled, per-expert scales on the weights,
    # the experts on their own normalised input (epsilons large enough to matter)
    "gemma4_norms": Case(
        S8,
        C(
            top_k=2,
            score="softmax",
            renormalize=True,
            router_norm_eps=0.01,
            expert_norm_eps=0.02,
            activation="geglu",
            gelu_tanh=True,
            z_loss_weight=0.02,
        ),
        gemma4_norms=True,
        shared=6,
    ),
    # DeepSeek-V3's sequence-wise balance loss (sigmoid scores, a selection bias, groups), and
    # with a capacity (the picks are the choice before drops)
    "deepseek_v3_sequence_balance": Case(
        S16,
        C(
            top_k=4,
            score="sigmoid",
            renormalize=True,
            num_groups=4,
            top_groups=2,
            load_balance_weight=0.3,
            load_balance_form="sequence",
        ),
        routing_bias=True,
    ),
    # Inkling2: soft-capped SwiGLU (the linear gate factor and up), sigmoid + bias
    "inkling2_softcapped_swiglu": Case(
        S8,
        C(
            top_k=2,
            score="sigmoid",
            renormalize=True,
            gate_softcap=0.4,
            up_softcap=0.5,
            z_loss_weight=0.02,
        ),
        routing_bias=True,
        shared=6,
    ),
    "geglu": Case(S4, C(top_k=2, score="softmax", activation="geglu")),
    "gelu": Case(S4, C(top_k=2, score="softmax", activation="gelu")),
    "relu_biases_shared": Case(
        S4,
        C(top_k=2, score="sigmoid", renormalize=True, activation="relu", load_balance_weight=1.0),
        ffn_biases=True,
        shared=6,
    ),
    "swiglu_biases": Case(S4, C(top_k=2, score="softmax"), ffn_biases=True),
    "capacity_position": Case(
        S4,
        C(top_k=2, score="softmax", renormalize=True, capacity=3, drop_policy="position"),
        drops=True,
    ),
    # sequences split over a sequence axis: each device drops among a part of each of its
    # sequences (2 batch shards x 2 sequence parts)
    "capacity_sequence_parts": Case(
        S4,
        C(
            top_k=2,
            score="softmax",
            capacity=2,
            drop_policy="position",
            token_shards=2,
            sequence_shards=2,
            seq_len=8,
            load_balance_weight=0.2,
            load_balance_form="sequence",
        ),
        drops=True,
    ),
    "capacity_probability": Case(
        S4,
        C(
            top_k=2,
            score="softmax",
            renormalize=True,
            capacity=3,
            token_shards=2,
            load_balance_weight=0.5,
            z_loss_weight=0.1,
        ),
        drops=True,
    ),
    "capacity_position_shards": Case(
        S4,
        C(top_k=2, score="sigmoid", capacity=2, drop_policy="position", token_shards=4),
        drops=True,
    ),
    "capacity_probability_top1": Case(
        S4, C(top_k=1, score="softmax", capacity=2, token_shards=2), drops=True
    ),
    "capacity_roomy": Case(
        S4, C(top_k=2, score="softmax", capacity=8, token_shards=2), drops=False
    ),
    "capacity_zero_shared": Case(S4, C(top_k=2, score="softmax", capacity=0), shared=6, drops=True),
    "ties": Case(
        S4,
        C(top_k=2, score="sigmoid", capacity=3, token_shards=2),
        zero_router_columns=(1, 2),
        repeat_tokens=True,
        drops=True,
    ),
    "group_ties": Case(
        S8,
        C(top_k=2, score="sigmoid", num_groups=4, top_groups=2, group_top_n=1),
        zero_router_columns=(2, 3, 6, 7),
    ),
    "deepseek_v3_capacity": Case(
        S16,
        C(
            top_k=4,
            score="sigmoid",
            renormalize=True,
            routed_scaling=2.5,
            num_groups=4,
            top_groups=2,
            capacity=1,
            token_shards=2,
            load_balance_weight=0.2,
        ),
        routing_bias=True,
        shared=6,
        drops=True,
    ),
    "gpt_oss_capacity_position": Case(
        S8,
        C(
            top_k=4,
            score="softmax",
            score_after_top_k=True,
            capacity=1,
            drop_policy="position",
            token_shards=4,
            z_loss_weight=0.02,
        ),
        ffn_biases=True,
        drops=True,
    ),
}
# A.X-K1: DeepSeek-V3's layer, then an RMSNorm of its whole output (an epsilon that counts)
_V3 = CASES["deepseek_v3"]
CASES["axk1_output_norm"] = replace(
    _V3, cfg=replace(_V3.cfg, output_norm_eps=0.05), output_norm=True
)
# Ergo: Nemotron-H's relu^2 layer, each expert's output and the shared expert's normalised
_RELU2 = CASES["nemotron_h_relu2"]
_ERGO_CFG = replace(_RELU2.cfg, expert_output_norm_eps=0.05, shared_output_norm_eps=0.05)
CASES["ergo_output_norms"] = replace(_RELU2, cfg=_ERGO_CFG, output_norms=True)
GRADIENT_CASES = [
    "deepseek_v3",
    "gpt_oss",
    "llama4",
    "qwen2_moe",
    "deepseek_v4_clamped_shared",
    "capacity_probability",
    "relu_biases_shared",
    "sqrtsoftplus",
    "nemotron_h_relu2",
    "nemotron_h_latent",
    "step3p7_clamp_after_shared_limit",
    "lfm2_epsilon",
    "kolibri1_bias_on_logits",
    "ernie_shared_biases",
    "laguna_logit_softcap",
    "gemma4_norms",
    "axk1_output_norm",
    "ergo_output_norms",
    "deepseek_v3_sequence_balance",
    "inkling2_softcapped_swiglu",
]


def case_data(name: str) -> tuple[Case, dict[str, np.ndarray], np.ndarray]:
    case = CASES[name]
    params, x = make_params(case, seed=zlib.crc32(name.encode()))
    return case, params, x
