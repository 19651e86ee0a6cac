"""The rules many entries of the family table (moegen/families/table*.py) share: a block that
several model families run keeps one rule list here, which each of them names."""

from __future__ import annotations

from moegen.families.entry import Rule
from moegen.families.rules import (
    Choose,
    Copy,
    Expect,
    Fixed,
    GptOssGlu,
    Groups,
    LoadBalance,
    SharedWidth,
)

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
SELECTION_BIAS = Fixed("router.routing_bias", True, "e_score_correction_bias: chooses, not weighs")
# ERNIE 4.5's use_bias gives its shared experts' projections biases (the routed ones have none)
SHARED_BIAS = Copy("layer.shared_ffn_bias", ("use_bias",), False, "flag")


def softmax(block: str) -> Fixed:
    return Fixed("router.score", "softmax", f"{block}: softmax over all experts")


def sigmoid(block: str) -> Fixed:
    return Fixed("router.score", "sigmoid", f"{block}: sigmoid scores")


def after_top_k(block: str) -> tuple[Fixed, Fixed]:
    """Softmax over the chosen logits alone (Mixtral's form as Granite and JetMoE write it)."""
    return (
        Fixed("router.score", "softmax", f"{block}: softmax"),
        Fixed("router.score_after_top_k", True, "over the top-k logits alone"),
    )


def renormalized(block: str, value: bool = True) -> Fixed:
    how = "rescales the top-k weights to sum to 1" if value else "keeps the top-k weights as are"
    return Fixed("router.renormalize", value, f"{block} always {how}")


def norm_topk(default: bool, key: str = "norm_topk_prob") -> Copy:
    return Copy("router.renormalize", (key,), default, "flag")


def balance(default: float, key: str = "router_aux_loss_coef") -> LoadBalance:
    return LoadBalance((key,), default)


def scaling(default: float, key: str = "routed_scaling_factor") -> Copy:
    return Copy("router.routed_scaling", (key,), default, "number")


def qwen(block: str, balance_default: float) -> tuple[Rule, ...]:
    return (ACTIVATION, softmax(block), norm_topk(False), balance(balance_default))


def silu_experts(block: str) -> tuple[Fixed, Expect]:
    """Routed experts that always run SiLU while the shared ones run hidden_act: one
    activation for both only where hidden_act is SiLU too."""
    return (
        Fixed("layer.activation", "swiglu", f"{block}: always silu(gate) * up"),
        Expect("hidden_act", ("silu", "swish"), "the shared experts would run another act"),
    )


def v3_router(block: str, norm: bool, scale: float, groups: tuple[int, int]) -> tuple[Rule, ...]:
    """DeepSeek-V3's router (GLM-4.5 and dots.llm1 copy it): sigmoid scores, a selection
    bias, groups ranked by the sum of their best two."""
    return (
        ACTIVATION,
        sigmoid(block),
        Expect("scoring_func", ("sigmoid",), f"{block} always scores with sigmoid"),
        Expect("topk_method", ("noaux_tc",), f"{block} always routes as noaux_tc"),
        norm_topk(norm),
        scaling(scale),
        Groups("n_group", "topk_group", groups[0], groups[1]),
        SELECTION_BIAS,
    )


def deepseek_v3_style(
    block: str,
    norm: bool,
    scale: float,
    groups: tuple[int, int],
    shared: int | None,
    shared_counts: tuple[str, ...] = ("n_shared_experts",),
) -> tuple[Rule, ...]:
    """DeepSeek-V3's block: its router, the shared experts beside (their count the first of
    `shared_counts` present)."""
    return (
        *v3_router(block, norm, scale, groups),
        Expect("moe_layer_freq", (1,), "transformers makes every layer after the dense ones MoE"),
        SharedWidth(shared_counts, ("moe_intermediate_size",), shared),
    )


DEEPSEEK_V2 = (
    ACTIVATION,
    softmax("DeepseekV2Moe"),
    Expect("scoring_func", ("softmax",), "DeepseekV2Moe always scores with softmax"),
    Expect("moe_layer_freq", (1,), "transformers makes every layer after the dense ones MoE"),
    renormalized("DeepseekV2Moe", False),
    Expect("norm_topk_prob", (False,), "DeepseekV2Moe never renormalises"),
    scaling(1.0),
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
GRANITE = (*after_top_k("GraniteMoeTopKGating"), ACTIVATION, balance(0.001))
# Granite-MoE-Shared's decoder layer adds its shared MLP (shared_intermediate_size wide, 0:
# none) to the block's output on the same input: a shared expert
GRANITE_SHARED = (*GRANITE, SharedWidth((), ("shared_intermediate_size",)))
GPT_OSS_EXPERTS = (
    Fixed("layer.activation", "swiglu", "GptOssExperts: clamped SwiGLU (not hidden_act)"),
    GptOssGlu("swiglu_limit", "swiglu_alpha"),
    Fixed("layer.ffn_bias", True, "GptOssExperts: a bias on each projection"),
    *after_top_k("GptOssTopKRouter"),
    Fixed("router.linear_bias", True, "GptOssTopKRouter: a linear layer with a bias"),
)
