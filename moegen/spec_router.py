"""The spec's router section: how each token picks its experts (scores, top-k, groups,
biases, the combine weights), the balance losses and the capacity. `moegen.spec` builds the
whole schema from it (and re-exports it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from moegen.spec_placement import Size, _Section


class GroupLimit(_Section):
    """Group-limited routing (DeepSeek-V3): pick experts only from the best groups."""

    groups: Size = Field(description="Experts are split into this many equal groups, in order.")
    keep: Size = Field(description="Groups kept per token, the best by group score.")
    top_per_group: Size = Field(
        2,
        description="A group's score is the sum of its best this-many selection scores "
        "(DeepSeek-V3: 2; 1 is the group's max, DeepSeek-V2's group_limited_greedy).",
    )


class Capacity(_Section):
    """Token dropping: each expert takes at most a fixed number of copies of each device's
    (or each sequence's) tokens."""

    factor: Annotated[float, Field(gt=0, le=1024, allow_inf_nan=False)] | None = Field(
        None,
        description="Copies per expert = ceil(factor * tokens * top_k / num_experts), the "
        "tokens those of one device (or one sequence, per: sequence); the rest are dropped "
        "(their weight becomes 0). Give factor or copies.",
    )
    copies: Size | None = Field(
        None,
        description="Copies per expert as a fixed count instead of a factor (a model "
        "config's expert_capacity: Switch Transformers).",
    )
    per: Literal["device", "sequence"] = Field(
        "device",
        description="Whose tokens an expert's copies are counted over: each device's, or "
        "each sequence's (Switch Transformers: a sequence's tokens over the count skip the "
        "experts, whatever the batch and mesh).",
    )
    drop: Literal["probability", "position"] = Field(
        "probability",
        description="Which copies an expert keeps when over capacity: the highest combine "
        "weights (probability) or the earliest tokens (position).",
    )


class Router(_Section):
    """How each token picks its experts."""

    top_k: Size = Field(description="Experts per token.")
    score: Literal["softmax", "sigmoid", "sqrtsoftplus"] = Field(
        "softmax", description="Score function applied to the router logits."
    )
    score_after_top_k: bool = Field(
        False,
        description="softmax only: choose the top-k experts by logit and take the softmax over "
        "the chosen logits alone (Mixtral, gpt-oss), instead of over all experts.",
    )
    input_norm_eps: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = Field(
        None,
        description="RMS-normalise the router's input with this epsilon (Gemma 4): logits = "
        "(rms_norm(x) * router_input_scale / sqrt(embed_dim)) @ router, router_input_scale a "
        "learned [embed_dim] parameter (ones at init). Omit: the router sees x.",
    )
    per_expert_scale: bool = Field(
        False,
        description="Multiply each chosen weight by its expert's learned scale, a [num_experts] "
        "parameter (ones at init), after renormalising (Gemma 4).",
    )
    logit_softcap: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] | None = Field(
        None,
        description="Soft-cap the router logits: logits = cap * tanh(logits / cap), before the "
        "score function and the losses (Laguna's moe_router_logit_softcapping). Omit: none.",
    )
    linear_bias: bool = Field(
        False,
        description="The router is a linear layer with a bias: logits = x @ router + "
        "router_bias (gpt-oss). Unlike routing_bias it moves both selection and weights.",
    )
    renormalize: bool = Field(False, description="Rescale the top-k weights to sum to 1.")
    renormalize_epsilon: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = Field(
        0.0,
        description="renormalize only: divide by (sum + this) instead of the sum (LFM2-MoE: "
        "1e-6); 0 = the exact sum.",
    )
    routed_scaling: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = Field(
        1.0, description="Multiply the combine weights by this factor (DeepSeek-V3: 2.5)."
    )
    group_limit: GroupLimit | None = Field(None, description="Group-limited routing.")
    identity_experts: Annotated[int, Field(ge=0, le=1 << 20)] = Field(
        0,
        description="Zero-computation experts (LongCat-Flash's zero_expert_num): the router "
        "scores num_experts + this many columns, and a copy routed to one of the extra "
        "columns returns its token unchanged, times its weight, computing no FFN and "
        "travelling nowhere. Dropless only. 0 = none.",
    )
    zero_experts: Annotated[int, Field(ge=0, le=1 << 20)] = Field(
        0,
        description="Zero experts (MoE++): this many router columns after the identity "
        "experts; a copy routed to one contributes nothing (its weight still counts where the "
        "weights are renormalised), computing no FFN and travelling nowhere. Dropless only. "
        "0 = none.",
    )
    weighs_shared_experts: bool = Field(
        False,
        description="The router scores the shared experts too (Inkling): its last "
        "layer.shared_experts columns are theirs, never chosen; their scores are normalised "
        "together with the chosen experts' (renormalize), scaled as they are, and each shared "
        "expert's hidden units are multiplied by its weight.",
    )
    learned_scale: bool = Field(
        False,
        description="Multiply every combine weight (a weighed shared expert's too) by a "
        "learned scalar, params['router_scale'] [1], ones at init (Inkling's global_scale).",
    )
    routing_bias: bool = Field(
        False,
        description="Aux-loss-free balancing: a per-expert bias added to the scores (sigmoid "
        "type, or softmax probabilities as in ERNIE 4.5) for choosing experts only; the "
        "weights stay the unbiased scores. Update it with update_routing_bias.",
    )
    routing_bias_on: Literal["scores", "logits"] = Field(
        "scores",
        description="routing_bias only: what the selection bias is added to, the scores "
        "(DeepSeek-V3, ERNIE 4.5) or the raw logits before the score function (Kolibri1); "
        "either way it chooses experts only.",
    )
    weighting: Literal["output", "input"] = Field(
        "output",
        description="What each copy's combine weight multiplies: the expert's output (most "
        "models) or its input (Llama 4: the expert runs on x * weight).",
    )
    load_balance_loss: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] = Field(
        0.0,
        description="Weight of the load-balancing loss in aux (0 = none); its form: "
        "load_balance_form.",
    )
    load_balance_form: Literal["switch", "transformers", "sequence"] = Field(
        "switch",
        description="How load_balance_loss is defined. switch: NUM_EXPERTS * sum over experts "
        "of (share of the token copies it takes) * (its mean probability: the softmax, or the "
        "scores normalised to sum to 1), the Switch Transformer's form. transformers: Hugging "
        "Face transformers' load_balancing_loss_func for this layer, the convention of the "
        "models that train with router_aux_loss_coef (Mixtral, Qwen-MoE, OLMoE, ...): counts "
        "from the top-k of softmax(logits) per token, not per copy, times the mean softmax "
        "probability, i.e. top_k times the switch form where both pick the same experts. "
        "sequence: DeepSeek-V3's sequence-wise balance loss, NUM_EXPERTS / top_k * sum over "
        "experts of (its share of a sequence's picks) * (its mean score normalised over all "
        "experts in that sequence), averaged over the sequences.",
    )
    z_loss: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] = Field(
        0.0, description="Weight of the router z-loss in aux (0 = none)."
    )
    capacity: Capacity | None = Field(
        None, description="Drop token copies over a per-expert capacity (omit: dropless)."
    )
