"""The family table: every model family moegen knows, one entry per config.json model_type
(moegen.families.entry says what an entry holds), merged here from its parts:
this file (the families moegen's checkpoint loader started with, and their kin),
table_deepseek.py (DeepSeek's block and its relatives), table_more.py (Qwen-, Granite-,
gpt-oss- and ERNIE-like blocks, multimodal models' text models) and table_options.py (blocks
that need the spec's rarer options).

Each rule is what the family's transformers MoE block does (transformers 5.25,
models/<family>/modeling_<family>.py), with the default of its config class where a key is
absent, so that the spec `moegen init --from-hf` writes routes as the model does;
tests/model_families/test_init_hf.py holds every entry against the oracle's families, and
tests/model_families/test_checkpoints.py every entry with a checkpoint against a saved
transformers model.
A multimodal config's entry (`text_config`) is its text model's, made with
dataclasses.replace: the same family, not a second declaration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from moegen.families.entry import (
    DBRX_SIZES,
    DEEPSEEK_SIZES,
    ERNIE_SIZES,
    GPT_OSS_SIZES,
    HUNYUAN_SIZES,
    MIXTRAL_SIZES,
    OLMOE_SIZES,
    QWEN_SIZES,
    CheckpointKeys,
    Family,
    Transformers,
)
from moegen.families.layer_rules import (
    AllLayers,
    FirstDense,
    Listed,
    Period,
    SparseStep,
    Window,
)
from moegen.families.layouts import (
    DBRX_LAYOUTS,
    DEEPSEEK_V2_LAYOUTS,
    DEEPSEEK_V3_LAYOUTS,
    DEEPSEEK_V4_LAYOUTS,
    ERNIE_LAYOUTS,
    GPT_OSS_LAYOUTS,
    GRANITE_LAYOUTS,
    HASH_ROUTED,
    HUNYUAN_LAYOUTS,
    JAMBA_LAYOUTS,
    LLAMA4_LAYOUTS,
    MIXTRAL_LAYOUTS,
    QWEN2_LAYOUTS,
    QWEN_LAYOUTS,
)
from moegen.families.rules import (
    Choose,
    Clamp,
    Expect,
    Fixed,
    LoadBalance,
    SharedWidth,
)
from moegen.families.schedules import (
    DEEPSEEK_V4_LAYERS,
    FIRST_K,
)
from moegen.families.shared_rules import (
    ACTIVATION,
    DEEPSEEK_V2,
    GATED,
    GPT_OSS_EXPERTS,
    GRANITE,
    GRANITE_SHARED,
    NO_JITTER,
    SELECTION_BIAS,
    SHARED_BIAS,
    balance,
    deepseek_v3_style,
    norm_topk,
    qwen,
    renormalized,
    scaling,
    softmax,
)
from moegen.families.table_deepseek import DEEPSEEK_FAMILIES
from moegen.families.table_more import MORE_FAMILIES
from moegen.families.table_options import OPTION_FAMILIES

_LLAMA4 = Family(
    "Llama 4",
    MIXTRAL_SIZES,
    (
        ACTIVATION,
        Fixed("router.score", "sigmoid", "Llama4Router: sigmoid of the top-k logits"),
        Fixed("router.weighting", "input", "Llama4TextMoe scales each expert's input"),
        SharedWidth((), ("intermediate_size",)),
        NO_JITTER,
    ),
    layers=Listed(),
    checkpoint=CheckpointKeys(LLAMA4_LAYOUTS),
    transformers=Transformers("llama4", "Llama4TextConfig", "Llama4TextMoe", "Llama4ForCausalLM"),
)

_QWEN3_VL = Family(
    "Qwen3-VL-MoE",
    QWEN_SIZES.also(experts=("num_local_experts",)),
    (
        ACTIVATION,
        softmax("Qwen3VLMoeTextSparseMoeBlock"),
        renormalized("Qwen3VLMoeTextSparseMoeBlock"),
        balance(0.001),
    ),
    layers=SparseStep(),
    transformers=Transformers(
        "qwen3_vl_moe",
        "Qwen3VLMoeTextConfig",
        "Qwen3VLMoeTextSparseMoeBlock",
        "Qwen3VLMoeForConditionalGeneration",
    ),
)

_BASE: Mapping[str, Family] = {
    "mixtral": Family(
        "Mixtral",
        MIXTRAL_SIZES,
        (
            ACTIVATION,
            softmax("MixtralSparseMoeBlock"),
            renormalized("MixtralSparseMoeBlock"),
            NO_JITTER,
            balance(0.001),
        ),
        layers=AllLayers(),
        checkpoint=CheckpointKeys(MIXTRAL_LAYOUTS),
        transformers=Transformers(
            "mixtral", "MixtralConfig", "MixtralSparseMoeBlock", "MixtralForCausalLM"
        ),
    ),
    "qwen3_moe": Family(
        "Qwen3-MoE",
        QWEN_SIZES.also(experts=("num_local_experts",)),
        qwen("Qwen3MoeSparseMoeBlock", 0.001),
        layers=SparseStep(experts="num_experts"),
        checkpoint=CheckpointKeys(QWEN_LAYOUTS),
        transformers=Transformers(
            "qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeSparseMoeBlock", "Qwen3MoeForCausalLM"
        ),
    ),
    "olmoe": Family(
        "OLMoE",
        OLMOE_SIZES,
        qwen("OlmoeSparseMoeBlock", 0.01),
        layers=AllLayers(),
        checkpoint=CheckpointKeys(QWEN_LAYOUTS),
        transformers=Transformers(
            "olmoe", "OlmoeConfig", "OlmoeSparseMoeBlock", "OlmoeForCausalLM"
        ),
    ),
    "deepseek_v3": Family(
        "DeepSeek-V3",
        DEEPSEEK_SIZES,
        deepseek_v3_style("DeepseekV3MoE", True, 2.5, (8, 4), 1),
        layers=FirstDense(FIRST_K, 3, "moe_layer_freq"),
        checkpoint=CheckpointKeys(DEEPSEEK_V3_LAYOUTS),
        transformers=Transformers(
            "deepseek_v3", "DeepseekV3Config", "DeepseekV3MoE", "DeepseekV3ForCausalLM"
        ),
    ),
    "glm4_moe": Family(
        "GLM-4.5",
        DEEPSEEK_SIZES,
        deepseek_v3_style("Glm4MoeMoE", True, 1.0, (1, 1), 1),
        layers=FirstDense(FIRST_K, 1, "moe_layer_freq"),
        checkpoint=CheckpointKeys(DEEPSEEK_V3_LAYOUTS),
        transformers=Transformers("glm4_moe", "Glm4MoeConfig", "Glm4MoeMoE", "Glm4MoeForCausalLM"),
    ),
    "dots1": Family(
        "dots.llm1",
        DEEPSEEK_SIZES,
        deepseek_v3_style("Dots1MoE", False, 1.0, (1, 1), None),
        layers=FirstDense(FIRST_K, 0, "moe_layer_freq"),
        checkpoint=CheckpointKeys(DEEPSEEK_V3_LAYOUTS),
        transformers=Transformers("dots1", "Dots1Config", "Dots1MoE", "Dots1ForCausalLM"),
    ),
    "deepseek_v2": Family(
        "DeepSeek-V2",
        DEEPSEEK_SIZES,
        DEEPSEEK_V2,
        layers=FirstDense(FIRST_K, 0, "moe_layer_freq"),
        checkpoint=CheckpointKeys(DEEPSEEK_V2_LAYOUTS),
        transformers=Transformers(
            "deepseek_v2", "DeepseekV2Config", "DeepseekV2Moe", "DeepseekV2ForCausalLM"
        ),
    ),
    "dbrx": Family(
        "DBRX",
        DBRX_SIZES,
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
        layers=AllLayers("n_layers"),
        checkpoint=CheckpointKeys(DBRX_LAYOUTS, ("transformer.blocks.{L}.",)),
        transformers=Transformers("dbrx", "DbrxConfig", "DbrxFFN", "DbrxForCausalLM"),
    ),
    "jamba": Family(
        "Jamba",
        OLMOE_SIZES,
        (
            ACTIVATION,
            softmax("JambaSparseMoeBlock"),
            renormalized("JambaSparseMoeBlock", False),
            balance(0.001),
        ),
        layers=Period(),
        checkpoint=CheckpointKeys(JAMBA_LAYOUTS),
        transformers=Transformers(
            "jamba", "JambaConfig", "JambaSparseMoeBlock", "JambaForCausalLM"
        ),
    ),
    "granitemoe": Family(
        "Granite-MoE",
        MIXTRAL_SIZES,
        GRANITE,
        layers=AllLayers(),
        checkpoint=CheckpointKeys(GRANITE_LAYOUTS),
        transformers=Transformers(
            "granitemoe", "GraniteMoeConfig", "GraniteMoeMoE", "GraniteMoeForCausalLM"
        ),
    ),
    "granitemoeshared": Family(
        "Granite-MoE-Shared",
        MIXTRAL_SIZES,
        GRANITE_SHARED,
        layers=AllLayers(),
        transformers=Transformers(
            "granitemoeshared",
            "GraniteMoeSharedConfig",
            "GraniteMoeSharedMoE",
            "GraniteMoeSharedForCausalLM",
        ),
    ),
    "flex_olmo": Family(
        "FlexOlmo",
        OLMOE_SIZES,
        qwen("FlexOlmoSparseMoeBlock", 0.01),
        layers=AllLayers(),
        transformers=Transformers(
            "flex_olmo", "FlexOlmoConfig", "FlexOlmoSparseMoeBlock", "FlexOlmoForCausalLM"
        ),
    ),
    "qwen3_vl_moe_text": _QWEN3_VL,
    "qwen3_vl_moe": replace(_QWEN3_VL, text_config=True),
    "hunyuan_v1_moe": Family(
        "Hunyuan-A13B",
        HUNYUAN_SIZES,
        (
            ACTIVATION,
            softmax("HunYuanMoEV1Gate"),
            renormalized("HunYuanMoEV1Gate"),
            SharedWidth((), ("intermediate_size",)),  # HunYuanMoEV1Moe.shared_mlp
            Expect("num_shared_expert", (1,), "HunYuanMoEV1Moe has one shared MLP"),
        ),
        layers=AllLayers(),
        checkpoint=CheckpointKeys(HUNYUAN_LAYOUTS),
        transformers=Transformers(
            "hunyuan_v1_moe", "HunYuanMoEV1Config", "HunYuanMoEV1Moe", "HunYuanMoEV1ForCausalLM"
        ),
    ),
    "minimax": Family(
        "MiniMax-Text-01",
        MIXTRAL_SIZES,
        (
            ACTIVATION,
            softmax("MiniMaxSparseMoeBlock"),
            renormalized("MiniMaxSparseMoeBlock"),
            NO_JITTER,
            balance(0.001),
        ),
        layers=AllLayers(),
        checkpoint=CheckpointKeys(MIXTRAL_LAYOUTS),
        transformers=Transformers(
            "minimax", "MiniMaxConfig", "MiniMaxSparseMoeBlock", "MiniMaxForCausalLM"
        ),
    ),
    "deepseek_v4": Family(
        "DeepSeek-V4",
        DEEPSEEK_SIZES,
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
        layers=DEEPSEEK_V4_LAYERS,
        checkpoint=CheckpointKeys(DEEPSEEK_V4_LAYOUTS, refuse={"gate.tid2eid": HASH_ROUTED}),
        transformers=Transformers(
            "deepseek_v4", "DeepseekV4Config", "DeepseekV4SparseMoeBlock", "DeepseekV4ForCausalLM"
        ),
    ),
    "gpt_oss": Family(
        "gpt-oss",
        GPT_OSS_SIZES,
        (*GPT_OSS_EXPERTS, balance(0.001)),
        layers=AllLayers(),
        checkpoint=CheckpointKeys(GPT_OSS_LAYOUTS),
        transformers=Transformers("gpt_oss", "GptOssConfig", "GptOssMLP", "GptOssForCausalLM"),
    ),
    "llama4_text": _LLAMA4,
    "llama4": replace(_LLAMA4, text_config=True),
    "qwen2_moe": Family(
        "Qwen1.5/2-MoE",
        QWEN_SIZES,
        (
            *qwen("Qwen2MoeSparseMoeBlock", 0.001),
            SharedWidth((), ("shared_expert_intermediate_size",)),
            Fixed("layer.shared_expert_gate", True, "Qwen2MoeSparseMoeBlock.shared_expert_gate"),
        ),
        layers=SparseStep(experts="num_experts"),
        checkpoint=CheckpointKeys(QWEN2_LAYOUTS),
        transformers=Transformers(
            "qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeSparseMoeBlock", "Qwen2MoeForCausalLM"
        ),
    ),
    "ernie4_5_moe": Family(
        "ERNIE 4.5",
        ERNIE_SIZES,
        (
            ACTIVATION,
            softmax("Ernie4_5_MoeSparseMoeBlock"),
            renormalized("Ernie4_5_MoeSparseMoeBlock"),
            Fixed("router.routing_bias", True, "moe_statics: chooses, does not weigh"),
            SharedWidth(("moe_num_shared_experts",), ("moe_intermediate_size",), 0),
            SHARED_BIAS,
            balance(0.001),
        ),
        layers=Window(),
        checkpoint=CheckpointKeys(ERNIE_LAYOUTS),
        transformers=Transformers(
            "ernie4_5_moe",
            "Ernie4_5_MoeConfig",
            "Ernie4_5_MoeSparseMoeBlock",
            "Ernie4_5_MoeForCausalLM",
        ),
    ),
}


_PARTS = (_BASE, DEEPSEEK_FAMILIES, MORE_FAMILIES, OPTION_FAMILIES)
FAMILIES: Mapping[str, Family] = {k: v for part in _PARTS for k, v in part.items()}
assert len(FAMILIES) == sum(map(len, _PARTS))  # no model_type in two parts
