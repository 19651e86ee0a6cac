"""The family table, continued (moegen/families/table.py merges it): the Qwen-, Granite-, gpt-oss-
and ERNIE-like families of transformers 5.25 (modeling_<family>.py), the multimodal models'
text models (a top-level config maps its text_config's model_type), and the families whose
config class transformers runs with another family's modeling code (Sarvam and Param2: GLM-4.5's
or DeepSeek-V3's). The defaults are each config class's.
"""

from __future__ import annotations

from collections.abc import Mapping

from moegen.families.entry import (
    DEEPSEEK_SIZES,
    ERNIE_SIZES,
    GPT_OSS_SIZES,
    MIXTRAL_SIZES,
    OLMOE_SIZES,
    QWEN_SIZES,
    Family,
    Rule,
    Transformers,
)
from moegen.families.layer_rules import (
    AllLayers,
    FirstDense,
    SparseStep,
)
from moegen.families.rules import Choose, Copy, Expect, Fixed, SharedWidth, Switch
from moegen.families.schedules import (
    FIRST_K,
    mlp_types,
    sparse_after,
    sparse_after_first_k,
)
from moegen.families.shared_rules import (
    ACTIVATION,
    GATED,
    GPT_OSS_EXPERTS,
    GRANITE_SHARED,
    SHARED_BIAS,
    after_top_k,
    balance,
    deepseek_v3_style,
    norm_topk,
    renormalized,
    sigmoid,
    silu_experts,
    softmax,
)

_SHARED = SharedWidth((), ("shared_expert_intermediate_size",))


def _gated_shared(block: str) -> tuple[SharedWidth, Fixed]:
    """Qwen2-MoE's shared expert, scaled by sigmoid(x @ shared_expert_gate)."""
    return (_SHARED, Fixed("layer.shared_expert_gate", True, f"{block}.shared_expert_gate"))


_QWEN3_NEXT = (
    ACTIVATION,
    softmax("Qwen3NextTopKRouter"),
    norm_topk(True),
    *_gated_shared("Qwen3NextSparseMoeBlock"),
    balance(0.001),
)
# Cohere2-MoE: top-k by logit, then a softmax over those (sigmoid: the same experts, as
# sigmoid keeps the order, each weight sigmoid(logit), renormalised by norm_topk_prob)
_COHERE2_SCORE = Switch(
    "expert_selection_fn",
    {
        "softmax": after_top_k("Cohere2MoeTopKRouter"),
        "sigmoid": (sigmoid("Cohere2MoeTopKRouter"), norm_topk(True)),
    },
    "softmax",
)
_COHERE2_SHARED = Switch(
    "shared_expert_combination_strategy",
    {
        "sum": (SharedWidth(("num_shared_experts",), ("intermediate_size",), 0),),
        "average": (
            Expect(
                "num_shared_experts",
                (0, None),
                "'average' halves the routed and shared sum, which moegen's layer does not do",
            ),
        ),
    },
    "average",
)
_ERNIE_VL: tuple[Rule, ...] = (
    ACTIVATION,
    softmax("Ernie4_5_VLMoeMoeTopKRouter"),
    renormalized("Ernie4_5_VLMoeMoeTopKRouter"),
    Fixed("router.routing_bias", True, "moe_statics: chooses, does not weigh"),
    # the shared experts are moe_num_shared_experts text experts wide
    SharedWidth(("moe_num_shared_experts",), ("moe_intermediate_size[0]",), 2),
    SHARED_BIAS,
    balance(0.001),
)
_LOCAL = {"experts": ("num_local_experts",)}  # what these configs save for num_experts
# GLM-4.5's block, its causal LM and where transformers defines them
_GLM4_MOE = ("Glm4MoeMoE", "Glm4MoeForCausalLM", "glm4_moe")
_ORIGINAL_SHARED = ("n_shared_experts", "num_shared_experts")  # as the original configs write


def _run_as(title: str, shared: int, transformers: Transformers) -> Family:
    """A family transformers runs with GLM-4.5's or DeepSeek-V3's modeling code (its block,
    one group, routed scaling 2.5, the first layer dense) under a config class of its own,
    which also reads the original configs' names (num_experts, num_shared_experts)."""
    return Family(
        title,
        DEEPSEEK_SIZES.also(experts=("num_experts", "num_local_experts")),
        deepseek_v3_style(transformers.block, True, 2.5, (1, 1), shared, _ORIGINAL_SHARED),
        layers=FirstDense(FIRST_K, 1, "moe_layer_freq"),
        transformers=transformers,
    )


MORE_FAMILIES: Mapping[str, Family] = {
    "mellum": Family(
        "Mellum",
        QWEN_SIZES.also(**_LOCAL),
        (ACTIVATION, softmax("MellumTopKRouter"), norm_topk(True), balance(0.001)),
        layers=mlp_types(AllLayers()),
        transformers=Transformers(
            "mellum", "MellumConfig", "MellumSparseMoeBlock", "MellumForCausalLM"
        ),
    ),
    "qwen3_omni_moe_text": Family(
        "Qwen3-Omni thinker",
        QWEN_SIZES,
        (ACTIVATION, softmax("Qwen3OmniMoeThinkerTextTopKRouter"), norm_topk(True), balance(0.001)),
        layers=SparseStep(),
        transformers=Transformers(
            "qwen3_omni_moe",
            "Qwen3OmniMoeTextConfig",
            "Qwen3OmniMoeThinkerTextSparseMoeBlock",
            "Qwen3OmniMoeThinkerForConditionalGeneration",
        ),
    ),
    "qwen3_omni_moe_talker_text": Family(
        "Qwen3-Omni talker",
        QWEN_SIZES.also(**_LOCAL),
        (
            ACTIVATION,
            softmax("Qwen3OmniMoeTalkerTextTopKRouter"),
            norm_topk(False),
            *_gated_shared("Qwen3OmniMoeTalkerTextSparseMoeBlock"),
            balance(0.001),
        ),
        layers=AllLayers(),
        transformers=Transformers(
            "qwen3_omni_moe",
            "Qwen3OmniMoeTalkerTextConfig",
            "Qwen3OmniMoeTalkerTextSparseMoeBlock",
            "Qwen3OmniMoeTalkerForConditionalGeneration",
        ),
    ),
    "qwen3_5_moe_text": Family(
        "Qwen3.5-MoE",
        QWEN_SIZES,
        (
            ACTIVATION,
            softmax("Qwen3_5MoeTopKRouter"),
            renormalized("Qwen3_5MoeTopKRouter"),
            *_gated_shared("Qwen3_5MoeSparseMoeBlock"),
            balance(0.001),
        ),
        layers=AllLayers(),
        transformers=Transformers(
            "qwen3_5_moe",
            "Qwen3_5MoeTextConfig",
            "Qwen3_5MoeSparseMoeBlock",
            "Qwen3_5MoeForCausalLM",
        ),
    ),
    "qwen3_next": Family(
        "Qwen3-Next",
        QWEN_SIZES,
        _QWEN3_NEXT,
        layers=SparseStep(),
        transformers=Transformers(
            "qwen3_next", "Qwen3NextConfig", "Qwen3NextSparseMoeBlock", "Qwen3NextForCausalLM"
        ),
    ),
    # Qwen3-Next's block in every decoder layer
    "qwen4_exp_text": Family(
        "Qwen4-Exp text",
        QWEN_SIZES,
        _QWEN3_NEXT,
        layers=AllLayers(),
        transformers=Transformers(
            "qwen4_exp", "Qwen4ExpTextConfig", "Qwen4ExpTextSparseMoeBlock", "Qwen4ExpForCausalLM"
        ),
    ),
    "lara_mini": Family(
        "Lara-Mini",
        QWEN_SIZES,
        (ACTIVATION, softmax("LaraMiniTopKRouter"), norm_topk(True), _SHARED, balance(0.001)),
        layers=AllLayers(),
        transformers=Transformers(
            "lara_mini", "LaraMiniConfig", "LaraMiniSparseMoeBlock", "LaraMiniForCausalLM"
        ),
    ),
    "flint": Family(
        "Flint",
        QWEN_SIZES,
        (ACTIVATION, sigmoid("FlintTopKRouter"), norm_topk(True), _SHARED, balance(0.0005)),
        layers=SparseStep(),
        transformers=Transformers(
            "flint", "FlintConfig", "FlintSparseMoeBlock", "FlintForCausalLM"
        ),
    ),
    "granitemoe_swa": Family(
        "Granite-MoE SWA",
        MIXTRAL_SIZES,
        GRANITE_SHARED,
        layers=AllLayers(),
        transformers=Transformers(
            "granitemoe_swa", "GraniteMoeSWAConfig", "GraniteMoeSWAMoE", "GraniteMoeSWAForCausalLM"
        ),
    ),
    # its decoder layer always adds its shared MLP (shared_intermediate_size) to the block's
    "granitemoehybrid": Family(
        "Granite-MoE hybrid",
        MIXTRAL_SIZES,
        GRANITE_SHARED,
        layers=AllLayers(),
        transformers=Transformers(
            "granitemoehybrid",
            "GraniteMoeHybridConfig",
            "GraniteMoeHybridMoE",
            "GraniteMoeHybridForCausalLM",
        ),
    ),
    "cohere2_moe": Family(
        "Cohere2-MoE",
        OLMOE_SIZES,
        (ACTIVATION, _COHERE2_SCORE, _COHERE2_SHARED),
        layers=sparse_after_first_k(0),
        transformers=Transformers(
            "cohere2_moe", "Cohere2MoeConfig", "Cohere2MoeSparseMoeBlock", "Cohere2MoeForCausalLM"
        ),
    ),
    "aria_text": Family(
        "Aria text",
        ERNIE_SIZES.but(ffn=("intermediate_size",), top_k=("moe_topk",)),
        (
            *silu_experts("AriaExperts"),
            *after_top_k("AriaTextTopKRouter"),
            SharedWidth(("moe_num_shared_experts",), ("intermediate_size",), 2),
            Copy("layer.shared_ffn_bias", ("mlp_bias",), False, "flag"),
        ),
        layers=AllLayers(),
        transformers=Transformers(
            "aria", "AriaTextConfig", "AriaTextMoELayer", "AriaTextForCausalLM"
        ),
    ),
    # gpt-oss's experts with gate and up concatenated; its router's division by top_k is
    # undone by the block's product with it. A token classifier: no balancing loss
    "openai_privacy_filter": Family(
        "OpenAI privacy filter",
        GPT_OSS_SIZES,
        GPT_OSS_EXPERTS,
        layers=AllLayers(),
        transformers=Transformers(
            "openai_privacy_filter",
            "OpenAIPrivacyFilterConfig",
            "OpenAIPrivacyFilterMLP",
            "OpenAIPrivacyFilterForTokenClassification",
        ),
    ),
    "jetmoe": Family(
        "JetMoE",
        MIXTRAL_SIZES,
        (
            Choose("layer.activation", ("activation_function",), GATED, "silu"),
            *after_top_k("JetMoeTopKGating"),
            # one output bias after the combine: the top-k softmax weights sum to 1, so the
            # same bias as each expert's down bias adds it once
            Fixed("layer.ffn_bias", True, "JetMoeMoE.bias, added once after the combine"),
            balance(0.01, "aux_loss_coef"),
        ),
        layers=AllLayers(),
        transformers=Transformers("jetmoe", "JetMoeConfig", "JetMoeMoE", "JetMoeForCausalLM"),
    ),
    # the MoE layer on text tokens: the text experts (moe_intermediate_size[0] wide) and
    # the shared experts; image and video tokens go to the vision experts instead
    "ernie4_5_vl_moe_text": Family(
        "ERNIE-4.5-VL text tokens",
        ERNIE_SIZES.but(ffn=("moe_intermediate_size[0]",)),
        _ERNIE_VL,
        layers=sparse_after(1),
        transformers=Transformers(
            "ernie4_5_vl_moe",
            "Ernie4_5_VLMoeTextConfig",
            "Ernie4_5_VLMoeMoeBlock",
            "Ernie4_5_VLMoeForConditionalGeneration",
        ),
    ),
    # Sarvam-30B and Param2: transformers runs them as GLM-4.5 (Glm4MoeForCausalLM), their
    # config classes changing its defaults (routed scaling 2.5; Param2's 2 shared experts)
    "sarvam_moe": _run_as(
        "Sarvam-MoE", 1, Transformers("sarvam_moe", "SarvamMoEConfig", *_GLM4_MOE)
    ),
    "param2moe": _run_as("Param2-MoE", 2, Transformers("param2moe", "Param2MoeConfig", *_GLM4_MOE)),
    # Sarvam-105B: run as DeepSeek-V3 (DeepseekV3ForCausalLM), one group, 1 dense layer first
    "sarvam_mla": _run_as(
        "Sarvam-MLA",
        1,
        Transformers(
            "sarvam_mla", "SarvamMLAConfig", "DeepseekV3MoE", "DeepseekV3ForCausalLM", "deepseek_v3"
        ),
    ),
}
