"""The model families `moegen init --from-hf` maps: one entry per config.json model_type.

An entry says which decoder layers are MoE layers and, as rules (moegen/hf/rules.py), which
config.json key gives each spec field, with the default of the family's transformers config
class where the key is absent. The sizes (experts, embed, ffn, top-k) are the config keys
moegen.checkpoints.layouts already reads for the family, plus the names transformers 5
writes where they differ (`size_aliases`). Each choice is what the family's transformers MoE
block does (transformers 5.24, models/<family>/modeling_<family>.py), so that the written
spec routes as the model does; tests/test_init_hf.py holds every entry against the oracle's
families.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from moegen.hf.layers import (
    AllLayers,
    FirstDense,
    LayerRule,
    Listed,
    Period,
    SparseStep,
    Typed,
    Window,
)
from moegen.hf.rules import (
    Choose,
    Clamp,
    Copy,
    Expect,
    Fixed,
    GptOssGlu,
    Groups,
    LoadBalance,
    SharedWidth,
)
from moegen.spec import UNSUPPORTED_CHOICES

Rule = Choose | Clamp | Copy | Expect | Fixed | GptOssGlu | Groups | LoadBalance | SharedWidth


@dataclass(frozen=True)
class HfFamily:
    title: str
    sizes: str  # the moegen.checkpoints.layouts family whose size keys this one reads
    layers: LayerRule
    rules: tuple[Rule, ...]
    size_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    text_config: bool = False  # multimodal: the text model's keys are under text_config


# The experts' act_fn(gate) * up: silu is SwiGLU, exact gelu GeGLU. gelu_pytorch_tanh and the
# others have no moegen activation.
GATED = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu"}
ACTIVATION = Choose(
    "layer.activation", ("hidden_act",), GATED, "silu", "; the experts run act(gate) * up"
)
NO_JITTER = Expect(
    "router_jitter_noise",
    (0, 0.0, None),
    "moegen's router adds no noise (transformers multiplies the input by it in training)",
)


def softmax(block: str) -> Fixed:
    return Fixed("router.score", "softmax", f"{block}: softmax over all experts")


def renormalized(block: str, value: bool = True) -> Fixed:
    how = "rescales the top-k weights to sum to 1" if value else "keeps the top-k weights as are"
    return Fixed("router.renormalize", value, f"{block} always {how}")


def norm_topk(default: bool) -> Copy:
    return Copy("router.renormalize", ("norm_topk_prob",), default, "flag")


def balance(default: float) -> LoadBalance:
    return LoadBalance(("router_aux_loss_coef",), default)


def _qwen(block: str, balance_default: float) -> tuple[Rule, ...]:
    return (ACTIVATION, softmax(block), norm_topk(False), balance(balance_default))


def _deepseek_v3_style(
    block: str, norm: bool, scaling: float, groups: tuple[int, int], shared: int | None
) -> tuple[Rule, ...]:
    """DeepSeek-V3's router (GLM-4.5 and dots.llm1 copy it): sigmoid scores, a selection
    bias, groups ranked by the sum of their best two, the shared experts beside."""
    return (
        ACTIVATION,
        Fixed("router.score", "sigmoid", f"{block}: sigmoid scores"),
        Expect("scoring_func", ("sigmoid",), f"{block} always scores with sigmoid"),
        Expect("topk_method", ("noaux_tc",), f"{block} always routes as noaux_tc"),
        Expect("moe_layer_freq", (1,), "transformers makes every layer after the dense ones MoE"),
        norm_topk(norm),
        Copy("router.routed_scaling", ("routed_scaling_factor",), scaling, "number"),
        Groups("n_group", "topk_group", groups[0], groups[1]),
        Fixed("router.routing_bias", True, "e_score_correction_bias: chooses, does not weigh"),
        SharedWidth(("n_shared_experts",), ("moe_intermediate_size",), shared),
    )


_DEEPSEEK_V2 = (
    ACTIVATION,
    softmax("DeepseekV2Moe"),
    Expect("scoring_func", ("softmax",), "DeepseekV2Moe always scores with softmax"),
    Expect("moe_layer_freq", (1,), "transformers makes every layer after the dense ones MoE"),
    renormalized("DeepseekV2Moe", False),
    Expect("norm_topk_prob", (False,), "DeepseekV2Moe never renormalises"),
    Copy("router.routed_scaling", ("routed_scaling_factor",), 1.0, "number"),
    # group_limited_greedy ranks each group by its best score; greedy has no groups
    Groups(
        "n_group",
        "topk_group",
        None,
        None,
        method="topk_method",
        methods={"greedy": None, "group_limited_greedy": 1},
        method_default="greedy",
    ),
    SharedWidth(("n_shared_experts",), ("moe_intermediate_size",), 2),
)
_HASH_LAYERS = "hash-routed (a fixed token-to-expert table, tid2eid), not a moegen router"
_LLAMA4 = HfFamily(
    "Llama 4",
    "llama4",
    Listed(),
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
    SparseStep(),
    (
        ACTIVATION,
        softmax("Qwen3VLMoeTextSparseMoeBlock"),
        renormalized("Qwen3VLMoeTextSparseMoeBlock"),
        balance(0.001),
    ),
    {"experts": ("num_local_experts",)},  # what transformers 5 writes for num_experts
)
_GRANITE = (
    ACTIVATION,
    Fixed("router.score", "softmax", "GraniteMoeTopKGating: softmax"),
    Fixed("router.score_after_top_k", True, "over the top-k logits alone"),
    balance(0.001),
)

FAMILIES: Mapping[str, HfFamily] = {
    "mixtral": HfFamily(
        "Mixtral",
        "mixtral",
        AllLayers(),
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
        SparseStep(),
        _qwen("Qwen3MoeSparseMoeBlock", 0.001),
        {"experts": ("num_local_experts",)},  # what transformers 5 writes for num_experts
    ),
    "olmoe": HfFamily("OLMoE", "olmoe", AllLayers(), _qwen("OlmoeSparseMoeBlock", 0.01)),
    "deepseek_v3": HfFamily(
        "DeepSeek-V3",
        "deepseek_v3",
        FirstDense("first_k_dense_replace", 3),
        _deepseek_v3_style("DeepseekV3MoE", True, 2.5, (8, 4), 1),
    ),
    "glm4_moe": HfFamily(
        "GLM-4.5",
        "glm4_moe",
        FirstDense("first_k_dense_replace", 1),
        _deepseek_v3_style("Glm4MoeMoE", True, 1.0, (1, 1), 1),
    ),
    "dots1": HfFamily(
        "dots.llm1",
        "dots1",
        FirstDense("first_k_dense_replace", 0),
        _deepseek_v3_style("Dots1MoE", False, 1.0, (1, 1), None),
    ),
    "deepseek_v2": HfFamily(
        "DeepSeek-V2", "deepseek_v2", FirstDense("first_k_dense_replace", 0), _DEEPSEEK_V2
    ),
    "dbrx": HfFamily(
        "DBRX",
        "dbrx",
        AllLayers("n_layers"),
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
        Period(),
        (
            ACTIVATION,
            softmax("JambaSparseMoeBlock"),
            renormalized("JambaSparseMoeBlock", False),
            balance(0.001),
        ),
    ),
    "granitemoe": HfFamily("Granite-MoE", "granitemoe", AllLayers(), _GRANITE),
    "granitemoeshared": HfFamily(
        "Granite-MoE-Shared",
        "granitemoe",
        AllLayers(),
        (*_GRANITE, SharedWidth((), ("shared_intermediate_size",))),
    ),
    "flex_olmo": HfFamily("FlexOlmo", "olmoe", AllLayers(), _qwen("FlexOlmoSparseMoeBlock", 0.01)),
    "qwen3_vl_moe_text": _QWEN3_VL,
    "qwen3_vl_moe": replace(_QWEN3_VL, text_config=True),
    "hunyuan_v1_moe": HfFamily(
        "Hunyuan-A13B",
        "hunyuan_v1_moe",
        AllLayers(),
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
        AllLayers(),
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
        Typed("mlp_layer_types", "moe", (("hash_moe", _HASH_LAYERS),)),
        (
            ACTIVATION,
            Choose(
                "router.score",
                ("scoring_func",),
                {"sqrtsoftplus": "sqrtsoftplus", "sigmoid": "sigmoid"},
                "sqrtsoftplus",
            ),
            norm_topk(True),
            Fixed("router.routing_bias", True, "e_score_correction_bias: chooses, does not weigh"),
            Copy("router.routed_scaling", ("routed_scaling_factor",), 1.5, "number"),
            SharedWidth(("n_shared_experts",), ("moe_intermediate_size",), 1),
            Clamp("swiglu_limit"),
            NO_JITTER,
            balance(0.001),
        ),
    ),
    "gpt_oss": HfFamily(
        "gpt-oss",
        "gpt_oss",
        AllLayers(),
        (
            Fixed("layer.activation", "swiglu", "GptOssExperts: clamped SwiGLU (not hidden_act)"),
            GptOssGlu("swiglu_limit", "swiglu_alpha"),
            Fixed("layer.ffn_bias", True, "GptOssExperts: a bias on each projection"),
            Fixed("router.score", "softmax", "GptOssTopKRouter: softmax"),
            Fixed("router.score_after_top_k", True, "over the top-k logits alone"),
            Fixed("router.linear_bias", True, "GptOssTopKRouter: a linear layer with a bias"),
            balance(0.001),
        ),
    ),
    "llama4_text": _LLAMA4,
    "llama4": replace(_LLAMA4, text_config=True),
    "qwen2_moe": HfFamily(
        "Qwen1.5/2-MoE",
        "qwen2_moe",
        SparseStep(),
        (
            *_qwen("Qwen2MoeSparseMoeBlock", 0.001),
            SharedWidth((), ("shared_expert_intermediate_size",)),
            Fixed("layer.shared_expert_gate", True, "Qwen2MoeSparseMoeBlock.shared_expert_gate"),
        ),
    ),
    "ernie4_5_moe": HfFamily(
        "ERNIE 4.5",
        "ernie4_5_moe",
        Window(),
        (
            ACTIVATION,
            softmax("Ernie4_5_MoeSparseMoeBlock"),
            renormalized("Ernie4_5_MoeSparseMoeBlock"),
            Fixed("router.routing_bias", True, "moe_statics: chooses, does not weigh"),
            SharedWidth(("moe_num_shared_experts",), ("moe_intermediate_size",), 0),
            Expect(
                "use_bias", (False,), "the shared experts would have biases; moegen's have none"
            ),
            balance(0.001),
        ),
    ),
}


# model_type -> why moegen refuses it (checked before the table; the reason names the difference)
REFUSED: Mapping[str, str] = {
    "phimoe": "Phi-3.5-MoE routes with sparsemixer (router_jitter_noise as its epsilon). "
    + UNSUPPORTED_CHOICES[(("router", "score"), "sparsemixer")],
}
