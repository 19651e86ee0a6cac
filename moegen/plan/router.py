"""The router's plan: how each token chooses its experts and weighs their outputs, what it keeps
under a capacity, and which balance losses the layer reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moegen.load import LoadedSpec
from moegen.plan.experts import capacity_groups, group_capacity
from moegen.spec import Spec

# Scores that are an increasing function of each logit alone: their top-k is the logits' top-k,
# which is exact where the score saturates (a float32 sigmoid is 1.0 past a logit of ~17).
ELEMENTWISE_SCORES = ("sigmoid", "sqrtsoftplus")


@dataclass(frozen=True)
class CapacityCounter:
    """What the capacity drop counts copies by: each expert's (a device's copies), or each
    (sequence, expert) pair's, as the module's code names them."""

    array: str  # the array of keys: flat_ids, or counters
    length: str  # how many keys there are
    sorted_by: str  # the word the module's comments use for a key


EXPERT_COUNTER = CapacityCounter("flat_ids", "NUM_EXPERTS", "expert")
SEQUENCE_COUNTER = CapacityCounter("counters", "LOCAL_BATCH * NUM_EXPERTS", "counter")


@dataclass(frozen=True)
class RouterPlan:
    """The routing of one token: scores, the experts chosen, their weights, the losses."""

    top_k: int
    score: str
    score_after_top_k: bool
    renormalize: bool
    renormalize_epsilon: float | None  # added to the sum renormalising divides by; None: 0
    routed_scaling: float
    scales_routing: bool  # routed_scaling != 1: the combine weights are scaled
    expert_groups: int | None  # group-limited routing, None when off
    kept_groups: int | None
    group_top_k: int | None  # a group's best selection scores summed to rank it
    ranks_groups_by_max: bool  # group_top_k == 1: a group's score is its best one
    experts_per_group: int | None
    identity_experts: int  # router columns past the experts whose copies return the token
    zero_experts: int  # router columns after those whose copies contribute nothing
    zero_computation: bool  # identity or zero experts: copies routed past the experts
    weighs_shared: bool  # the router's last columns weigh the shared experts (Inkling)
    shared_experts: int  # the shared experts it weighs (0 when it weighs none)
    learned_scale: bool  # every weight times params["router_scale"] (Inkling's global_scale)
    columns: int  # router columns: NUM_EXPERTS + identity_experts + shared_experts
    columns_name: str  # the module constant naming them: NUM_EXPERTS or ROUTER_COLUMNS
    columns_rule: str | None  # what ROUTER_COLUMNS holds, for the module's comment
    choices_name: str  # what a copy can be routed to: NUM_EXPERTS, or with zero-computation
    # experts ROUTER_COLUMNS (aux.tokens_per_expert counts each)
    routing_bias: bool
    bias_on_logits: bool  # the selection bias is added to the logits, not the scores
    linear_bias: bool  # logits = x @ router + router_bias
    logit_softcap: float | None  # logits = cap * tanh(logits / cap); None: as they are
    input_norm_eps: float | None  # the router's input RMS-normalised (Gemma 4); None: x
    input_multiplier: float | None  # 1 / sqrt(EMBED_DIM), after that norm
    rms_norm: bool  # the router's or the experts' input, or an output, is RMS-normalised:
    # _rms_norm exists
    per_expert_scale: bool  # each chosen weight times its expert's learned scale
    weights_on_input: bool  # combine weights scale each copy's input (Llama 4), not its output
    selection_is_score: bool  # experts chosen by score alone: no bias, no groups, no after-top-k
    chooses_by_logit: bool  # so, by an elementwise increasing score: top-k of the logits
    returns_logits: bool  # the balance losses need the router logits
    load_balance_weight: float
    z_loss_weight: float
    has_load_balance_loss: bool  # load_balance_weight > 0: aux has the loss
    load_balance_form: str  # "switch" | "transformers" | "sequence" (router.load_balance_form)
    balance_per_sequence: bool  # the sequence form: computed from the selection before drops
    # transformers' form counts the top-k of softmax(logits); where the layer selects
    # otherwise (a selection bias, groups) the loss takes that top-k of its own
    balance_counts_own_top_k: bool
    has_z_loss: bool  # z_loss_weight > 0: aux has the router z-loss
    drops_copies: bool  # some copies go to no expert (NUM_EXPERTS): capacity, identity experts
    capacity: int | None  # copies per expert per group (a device's tokens); None: dropless
    capacity_groups: int  # groups a device's tokens count their copies in: 1, or its sequences
    capacity_per_sequence: bool  # capacity_groups > 1: each sequence counts its own
    counter: CapacityCounter  # what the drop counts copies by
    group_rows: int | None  # routed rows of one group (a sequence's tokens x top_k); None: dropless
    capacity_rule: str | None  # how capacity was counted, for the module's comment
    drop_policy: str | None  # "probability" | "position" under a capacity


def _normalises(spec: Spec) -> bool:
    """Whether an RMSNorm runs anywhere in the layer: the router's input, the experts' input,
    an expert's, the shared expert's or the layer's output."""
    layer = spec.layer
    epsilons = (
        spec.router.input_norm_eps,
        layer.expert_input_norm_eps,
        layer.output_norm_eps,
        layer.expert_output_norm_eps,
        layer.shared_output_norm_eps,
    )
    return any(eps is not None for eps in epsilons)


def router_plan(loaded: LoadedSpec, local_tokens: int) -> RouterPlan:
    """The router of a validated spec, for a device holding `local_tokens` tokens."""
    spec = loaded.spec
    groups = capacity_groups(loaded, local_tokens)
    router = spec.router
    group_limit = router.group_limit
    past = router.identity_experts + router.zero_experts  # zero-computation columns
    return RouterPlan(
        top_k=router.top_k,
        score=router.score,
        score_after_top_k=router.score_after_top_k,
        renormalize=router.renormalize,
        renormalize_epsilon=router.renormalize_epsilon if router.renormalize_epsilon else None,
        routed_scaling=router.routed_scaling,
        scales_routing=router.routed_scaling != 1.0,
        expert_groups=group_limit.groups if group_limit else None,
        kept_groups=group_limit.keep if group_limit else None,
        group_top_k=group_limit.top_per_group if group_limit else None,
        ranks_groups_by_max=group_limit is not None and group_limit.top_per_group == 1,
        experts_per_group=spec.layer.num_experts // group_limit.groups if group_limit else None,
        **_columns(loaded),
        learned_scale=router.learned_scale,
        routing_bias=router.routing_bias,
        bias_on_logits=router.routing_bias and router.routing_bias_on == "logits",
        linear_bias=router.linear_bias,
        logit_softcap=router.logit_softcap,
        input_norm_eps=router.input_norm_eps,
        input_multiplier=spec.layer.embed_dim**-0.5 if router.input_norm_eps else None,
        rms_norm=_normalises(spec),
        per_expert_scale=router.per_expert_scale,
        weights_on_input=router.weighting == "input",
        selection_is_score=not (router.score_after_top_k or router.routing_bias or group_limit),
        chooses_by_logit=router.score in ELEMENTWISE_SCORES
        and not (router.routing_bias or group_limit),
        returns_logits=router.load_balance_loss > 0 or router.z_loss > 0,
        load_balance_weight=router.load_balance_loss,
        z_loss_weight=router.z_loss,
        has_load_balance_loss=router.load_balance_loss > 0,
        load_balance_form=router.load_balance_form,
        balance_per_sequence=router.load_balance_loss > 0
        and router.load_balance_form == "sequence",
        balance_counts_own_top_k=router.load_balance_form == "transformers"
        and bool(router.routing_bias or group_limit),
        has_z_loss=router.z_loss > 0,
        drops_copies=router.capacity is not None or past > 0,
        capacity=group_capacity(loaded, local_tokens),
        capacity_groups=groups,
        capacity_per_sequence=groups > 1,
        counter=SEQUENCE_COUNTER if groups > 1 else EXPERT_COUNTER,
        group_rows=local_tokens // groups * router.top_k if router.capacity else None,
        capacity_rule=_capacity_rule(loaded, groups > 1),
        drop_policy=router.capacity.drop if router.capacity else None,
    )


def _capacity_rule(loaded: LoadedSpec, per_sequence: bool) -> str | None:
    capacity = loaded.spec.router.capacity
    if capacity is None:
        return None
    rows = "SEQUENCE_ROWS" if per_sequence else "ROUTED_ROWS"
    count = (
        "the spec's capacity.copies"
        if capacity.copies is not None
        else f"ceil(factor * {rows} / NUM_EXPERTS)"
    )
    return f"per {'sequence' if per_sequence else 'device'}: {count}"


def _columns(loaded: LoadedSpec) -> dict[str, Any]:
    """The router's columns: the experts, the zero-computation ones (identity, then zero),
    then the shared experts it weighs."""
    spec = loaded.spec
    router = spec.router
    weighed = spec.layer.shared_experts if router.weighs_shared_experts else 0
    past = router.identity_experts + router.zero_experts
    return {
        "identity_experts": router.identity_experts,
        "zero_experts": router.zero_experts,
        "zero_computation": past > 0,
        "weighs_shared": router.weighs_shared_experts,
        "shared_experts": weighed,
        "columns": spec.layer.num_experts + past + weighed,
        "columns_name": "ROUTER_COLUMNS" if past or weighed else "NUM_EXPERTS",
        "columns_rule": _columns_rule(router.identity_experts, router.zero_experts, weighed),
        "choices_name": "ROUTER_COLUMNS" if past else "NUM_EXPERTS",
    }


def _columns_rule(identity_experts: int, zero_experts: int, weighed_shared: int) -> str | None:
    if identity_experts and zero_experts:
        return "NUM_EXPERTS + IDENTITY_EXPERTS + ZERO_EXPERTS: the experts, identity, zero ones"
    if identity_experts:
        return "NUM_EXPERTS + IDENTITY_EXPERTS: the experts, then the identity ones"
    if zero_experts:
        return "NUM_EXPERTS + ZERO_EXPERTS: the experts, then the zero ones"
    if weighed_shared:
        return "NUM_EXPERTS + SHARED_EXPERTS: the experts, then the shared ones (weighed only)"
    return None
