"""The model families `moegen init --from-hf` maps: one entry per config.json model_type.

An entry says, as rules (moegen/hf/rules.py), which config.json key gives each spec field,
with the default of the family's transformers config class where the key is absent. The
sizes (experts, embed, ffn, top-k) are the config keys moegen.checkpoints.layouts already
reads for the family, plus the names transformers 5 writes where they differ
(`size_aliases`). Each choice is what the family's transformers MoE block does (transformers
5.25, models/<family>/modeling_<family>.py), so that the written spec routes as the model
does; tests/test_init_hf.py holds every entry against the oracle's families. Which decoder
layers are MoE layers is not an entry's: one table says it for this command and the
checkpoint loader alike (moegen.checkpoints.schedules, by model_type).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from moegen.hf.families_deepseek import DEEPSEEK_FAMILIES
from moegen.hf.families_more import MORE_FAMILIES
from moegen.hf.families_options import OPTION_FAMILIES
from moegen.hf.family_base import (
    ACTIVATION,
    DEEPSEEK_V2,
    GATED,
    GPT_OSS_EXPERTS,
    GRANITE,
    GRANITE_SHARED,
    NO_JITTER,
    SELECTION_BIAS,
    SHARED_BIAS,
    HfFamily,
    balance,
    deepseek_v3_style,
    norm_topk,
    qwen,
    renormalized,
    scaling,
    softmax,
)
from moegen.hf.rules import (
    Choose,
    Clamp,
    Expect,
    Fixed,
    LoadBalance,
    SharedWidth,
)
from moegen.spec import UNSUPPORTED_CHOICES

_LLAMA4 = HfFamily(
    "Llama 4",
    "llama4",
    (
        ACTIVATION,
        Fixed("router.score", "sigmoid", "Llama4Router: sigmoid of the top-k logits"),
        Fixed("router.weighting", "input", "Llama4TextMoe scales each expert's input"),
        SharedWidth((), ("intermediate_size",)),
        NO_JITTER,
    ),
)

_QWEN3_VL = HfFamily(
    "Qwen3-VL-MoE",
    "qwen3_moe",
    (
        ACTIVATION,
        softmax("Qwen3VLMoeTextSparseMoeBlock"),
        renormalized("Qwen3VLMoeTextSparseMoeBlock"),
        balance(0.001),
    ),
    {"experts": ("num_local_experts",)},  # what transformers 5 writes for num_experts
)

_BASE: Mapping[str, HfFamily] = {
    "mixtral": HfFamily(
        "Mixtral",
        "mixtral",
        (
            ACTIVATION,
            softmax("MixtralSparseMoeBlock"),
            renormalized("MixtralSparseMoeBlock"),
            NO_JITTER,
            balance(0.001),
        ),
    ),
    "qwen3_moe": HfFamily(
        "Qwen3-MoE",
        "qwen3_moe",
        qwen("Qwen3MoeSparseMoeBlock", 0.001),
        {"experts": ("num_local_experts",)},  # what transformers 5 writes for num_experts
    ),
    "olmoe": HfFamily("OLMoE", "olmoe", qwen("OlmoeSparseMoeBlock", 0.01)),
    "deepseek_v3": HfFamily(
        "DeepSeek-V3",
        "deepseek_v3",
        deepseek_v3_style("DeepseekV3MoE", True, 2.5, (8, 4), 1),
    ),
    "glm4_moe": HfFamily(
        "GLM-4.5",
        "glm4_moe",
        deepseek_v3_style("Glm4MoeMoE", True, 1.0, (1, 1), 1),
    ),
    "dots1": HfFamily(
        "dots.llm1",
        "dots1",
        deepseek_v3_style("Dots1MoE", False, 1.0, (1, 1), None),
    ),
    "deepseek_v2": HfFamily("DeepSeek-V2", "deepseek_v2", DEEPSEEK_V2),
    "dbrx": HfFamily(
        "DBRX",
        "dbrx",
        (
            Choose("layer.activation", ("ffn_config.ffn_act_fn.name",), GATED, "silu"),
            softmax("DbrxRouter"),
            # the top-k weights divided by their p-norm: p = 1 sums them to 1
            Choose(
                "router.renormalize",
                ("ffn_config.moe_normalize_expert_weights",),
                {1: True, None: False},
                1.0,
                "; another p-norm of the weights has no moegen router",
            ),
            Expect(
                "ffn_config.moe_jitter_eps",
                (None, 0, 0.0),
                "moegen's router adds no noise (DbrxRouter jitters its input in training)",
            ),
            LoadBalance(("ffn_config.moe_loss_weight",), 0.01),
        ),
    ),
    "jamba": HfFamily(
        "Jamba",
        "jamba",
        (
            ACTIVATION,
            softmax("JambaSparseMoeBlock"),
            renormalized("JambaSparseMoeBlock", False),
            balance(0.001),
        ),
    ),
    "granitemoe": HfFamily("Granite-MoE", "granitemoe", GRANITE),
    "granitemoeshared": HfFamily(
        "Granite-MoE-Shared",
        "granitemoe",
        GRANITE_SHARED,
    ),
    "flex_olmo": HfFamily("FlexOlmo", "olmoe", qwen("FlexOlmoSparseMoeBlock", 0.01)),
    "qwen3_vl_moe_text": _QWEN3_VL,
    "qwen3_vl_moe": replace(_QWEN3_VL, text_config=True),
    "hunyuan_v1_moe": HfFamily(
        "Hunyuan-A13B",
        "hunyuan_v1_moe",
        (
            ACTIVATION,
            softmax("HunYuanMoEV1Gate"),
            renormalized("HunYuanMoEV1Gate"),
            SharedWidth((), ("intermediate_size",)),  # HunYuanMoEV1Moe.shared_mlp
            Expect("num_shared_expert", (1,), "HunYuanMoEV1Moe has one shared MLP"),
        ),
    ),
    "minimax": HfFamily(
        "MiniMax-Text-01",
        "minimax",
        (
            ACTIVATION,
            softmax("MiniMaxSparseMoeBlock"),
            renormalized("MiniMaxSparseMoeBlock"),
            NO_JITTER,
            balance(0.001),
        ),
    ),
    "deepseek_v4": HfFamily(
        "DeepSeek-V4",
        "deepseek_v4",
        (
            ACTIVATION,
            Choose(
                "router.score",
                ("scoring_func",),
                {"sqrtsoftplus": "sqrtsoftplus", "sigmoid": "sigmoid"},
                "sqrtsoftplus",
            ),
            norm_topk(True),
            SELECTION_BIAS,
            scaling(1.5),
            SharedWidth(("n_shared_experts",), ("moe_intermediate_size",), 1),
            Clamp("swiglu_limit"),
            NO_JITTER,
            balance(0.001),
        ),
    ),
    "gpt_oss": HfFamily(
        "gpt-oss",
        "gpt_oss",
        (*GPT_OSS_EXPERTS, balance(0.001)),
    ),
    "llama4_text": _LLAMA4,
    "llama4": replace(_LLAMA4, text_config=True),
    "qwen2_moe": HfFamily(
        "Qwen1.5/2-MoE",
        "qwen2_moe",
        (
            *qwen("Qwen2MoeSparseMoeBlock", 0.001),
            SharedWidth((), ("shared_expert_intermediate_size",)),
            Fixed("layer.shared_expert_gate", True, "Qwen2MoeSparseMoeBlock.shared_expert_gate"),
        ),
    ),
    "ernie4_5_moe": HfFamily(
        "ERNIE 4.5",
        "ernie4_5_moe",
        (
            ACTIVATION,
            softmax("Ernie4_5_MoeSparseMoeBlock"),
            renormalized("Ernie4_5_MoeSparseMoeBlock"),
            Fixed("router.routing_bias", True, "moe_statics: chooses, does not weigh"),
            SharedWidth(("moe_num_shared_experts",), ("moe_intermediate_size",), 0),
            SHARED_BIAS,
            balance(0.001),
        ),
    ),
}


_PARTS = (_BASE, DEEPSEEK_FAMILIES, MORE_FAMILIES, OPTION_FAMILIES)
FAMILIES: Mapping[str, HfFamily] = {k: v for part in _PARTS for k, v in part.items()}
assert len(FAMILIES) == sum(map(len, _PARTS))  # no model_type in two parts

# model_type -> why moegen refuses it (checked before the table; the reason names the difference)
REFUSED: Mapping[str, str] = {
    "switch_transformers": "Switch Transformers is an encoder-decoder model, and --from-hf maps "
    "the MoE layers of decoder-only models. Its sparse layer can be written by hand: top_k: 1, "
    "score: softmax, activation: relu, router.linear_bias: <router_bias>, router.capacity: "
    "{copies: <expert_capacity>, per: sequence, drop: position}, router.load_balance_form: "
    "sequence (moegen's router adds no router_jitter_noise).",
    "ergo": "Ergo RMS-normalises each routed expert's output with that expert's own learned "
    "weight (ErgoExpertNorm) before weighting it, and its shared expert's output with another: "
    "moegen has no per-expert output norm (layer.output_norm_eps normalises the layer's output, "
    "routed and shared summed).",
    "phimoe": "Phi-3.5-MoE routes with sparsemixer (router_jitter_noise as its epsilon). "
    + UNSUPPORTED_CHOICES[(("router", "score"), "sparsemixer")],
}
