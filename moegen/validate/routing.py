"""Rules of the router and expert features: scores, groups, balancing, capacity.

Each combination refused here is one the anchors accept and then compute something other
than what the user wrote (a bias nobody applies, a router that never learns, a group rule
that cannot pick top_k experts), or one that is a no-op the user did not mean.
"""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.sizes import divisors, listed


def routing_bias_chooses_by_scores(loaded: LoadedSpec) -> list[Diagnostic]:
    """The selection bias is added to the scores the router chooses by (sigmoid type, or
    softmax probabilities as ERNIE 4.5 does); score_after_top_k chooses by raw logits, where no
    score exists to add it to."""
    router = loaded.spec.router
    if not (router.routing_bias and router.score_after_top_k):
        return []
    return [
        loaded.diagnostic(
            ("router", "routing_bias"),
            "score_after_top_k chooses experts by their raw logits, before any score exists "
            "to add the balancing bias to; set score_after_top_k: false (the bias is then "
            "added to the softmax probabilities, as ERNIE 4.5 does) or routing_bias: false",
        )
    ]


def score_after_top_k_is_meaningful(loaded: LoadedSpec) -> list[Diagnostic]:
    """Softmax over the chosen logits: only for softmax, k > 1, and not with what it implies."""
    router = loaded.spec.router
    if not router.score_after_top_k:
        return []
    path = ("router", "score_after_top_k")
    if router.score != "softmax":
        return [
            loaded.diagnostic(
                path,
                f"{router.score} scores each expert on its own, so applying it after top-k "
                "gives the same weights; remove score_after_top_k",
            )
        ]
    out = []
    if router.top_k == 1:
        out.append(
            loaded.diagnostic(
                path,
                "a softmax over one chosen logit is always 1.0: the router would get zero "
                "gradient; set score_after_top_k: false (softmax over all experts)",
            )
        )
    if router.renormalize:
        out.append(
            loaded.diagnostic(
                ("router", "renormalize"),
                "the softmax over the chosen logits already sums to 1; set renormalize: false",
            )
        )
    if router.group_limit is not None:
        out.append(
            loaded.diagnostic(
                ("router", "group_limit"),
                at_key=True,
                message="group-limited routing ranks groups by scores over all experts, which "
                "score_after_top_k does not compute; use score_after_top_k: false with it",
            )
        )
    return out


def group_limit_can_pick_top_k(loaded: LoadedSpec) -> list[Diagnostic]:
    """Whole groups; a group score its experts can supply; kept groups that limit something
    and hold at least top_k experts."""
    spec = loaded.spec
    limit = spec.router.group_limit
    if limit is None:
        return []
    experts, top_k = spec.layer.num_experts, spec.router.top_k
    if experts % limit.groups or limit.groups == 1:
        # Group counts are divisors: enumerated by pairs up to the square root, as a count of
        # experts can be any size up to 2**31 here.
        group_counts = [g for g in divisors(experts) if g > 1]
        problem = (
            "one group holds every expert and limits nothing"
            if limit.groups == 1
            else f"{experts} experts do not split into {limit.groups} equal groups"
        )
        return [
            loaded.diagnostic(
                ("router", "group_limit", "groups"),
                f"{problem}; valid: {listed(group_counts, limit.groups) or 'none (one expert)'}",
            )
        ]
    per_group = experts // limit.groups
    out = []
    if limit.top_per_group > per_group:
        out.append(
            loaded.diagnostic(
                ("router", "group_limit", "top_per_group"),
                f"a group of {per_group} experts has no best {limit.top_per_group} to sum; "
                f"use 1 to {per_group}, or fewer groups",
            )
        )
    fewest = -(-top_k // per_group)  # kept groups that hold top_k experts
    if not fewest <= limit.keep < limit.groups:
        if limit.keep >= limit.groups:
            problem = f"keeping {limit.keep} of {limit.groups} groups limits nothing"
        else:
            problem = (
                f"{limit.keep} kept groups of {per_group} experts cannot supply top_k = {top_k}"
            )
        out.append(
            loaded.diagnostic(
                ("router", "group_limit", "keep"),
                f"{problem}; {_keep_fix(experts, top_k, limit.groups, limit.top_per_group)}; "
                "or remove group_limit",
            )
        )
    return out


def _keep_fix(experts: int, top_k: int, groups: int, top_per_group: int) -> str:
    """The keeps that work (a range: from the fewest groups holding top_k experts up to one
    below all of them), else the group counts for which some keep works (with groups of at
    least top_per_group experts)."""
    fewest = -(-top_k // (experts // groups))
    if fewest < groups:
        return f"valid keep: {fewest}" + (f" to {groups - 1}" if fewest < groups - 1 else "")
    workable = [
        g
        for g in divisors(experts)
        if 1 < g and -(-top_k // (experts // g)) < g and experts // g >= top_per_group
    ]
    works = (
        f"groups that work: {listed(workable, groups)}"
        if workable
        else f"no number of groups works for top_k = {top_k} of {experts} experts"
    )
    return f"no keep works for top_k = {top_k} with {groups} groups of {experts // groups}; {works}"


def capacity_has_a_balancer(loaded: LoadedSpec) -> list[Diagnostic]:
    """Dropping without a balancing force drops the same hot experts' tokens forever."""
    router = loaded.spec.router
    if router.capacity is None or router.load_balance_loss > 0 or router.routing_bias:
        return []
    return [
        loaded.diagnostic(
            ("router", "capacity"),
            at_key=True,
            message="a capacity drops what unbalanced routing sends past it, and nothing here "
            "balances the routing; set router.load_balance_loss (e.g. 0.01) or "
            "router.routing_bias: true, or remove capacity (dropless)",
        )
    ]


def capacity_counts_one_way(loaded: LoadedSpec) -> list[Diagnostic]:
    """A capacity is a factor or a count, over each device's tokens or each whole sequence."""
    spec = loaded.spec
    capacity = spec.router.capacity
    if capacity is None:
        return []
    out = []
    if capacity.factor is not None and capacity.copies is not None:
        out.append(
            loaded.diagnostic(
                ("router", "capacity", "copies"),
                "capacity.factor and capacity.copies both give the copies each expert keeps; "
                "remove one",
            )
        )
    if capacity.factor is None and capacity.copies is None:
        out.append(
            loaded.diagnostic(
                ("router", "capacity"),
                at_key=True,
                message="a capacity needs its size: factor (copies per expert = ceil(factor * "
                "tokens * top_k / num_experts), e.g. 1.25) or copies (a fixed count)",
            )
        )
    sequence = spec.mesh.axes.get("sequence", 1)
    if capacity.per == "sequence" and sequence > 1:
        out.append(
            loaded.diagnostic(
                ("router", "capacity", "per"),
                f"capacity per sequence counts a sequence's copies in token order, and the "
                f"sequence axis splits each sequence over {sequence} devices, which would have "
                "to count each other's; use per: device, or drop the sequence axis",
            )
        )
    return out


def routing_options_have_their_feature(loaded: LoadedSpec) -> list[Diagnostic]:
    """An option of a feature that is off changes nothing: the spec meant the feature."""
    router = loaded.spec.router
    out = []
    if router.renormalize_epsilon > 0 and not router.renormalize:
        out.append(
            loaded.diagnostic(
                ("router", "renormalize_epsilon"),
                "renormalize_epsilon is added to the sum the top-k weights are divided by, and "
                "renormalize is false, so nothing is divided; set renormalize: true or remove "
                "renormalize_epsilon",
            )
        )
    if router.routing_bias_on != "scores" and not router.routing_bias:
        out.append(
            loaded.diagnostic(
                ("router", "routing_bias_on"),
                "routing_bias_on says where the selection bias is added, and routing_bias is "
                "false; set routing_bias: true or remove routing_bias_on",
            )
        )
    return out


def load_balance_form_has_a_loss(loaded: LoadedSpec) -> list[Diagnostic]:
    """A form chosen for a loss that is not computed says nothing: the spec meant a weight."""
    router = loaded.spec.router
    if router.load_balance_form == "switch" or router.load_balance_loss > 0:
        return []
    return [
        loaded.diagnostic(
            ("router", "load_balance_form"),
            message=f"load_balance_form: {router.load_balance_form} defines a loss that is not "
            "computed (router.load_balance_loss is 0); set router.load_balance_loss to its "
            "weight (a model config's router_aux_loss_coef, e.g. 0.001), or remove "
            "load_balance_form",
        )
    ]


PAST_THE_EXPERTS = ("identity_experts", "zero_experts")  # zero-computation experts' fields


def zero_computation_experts_stand_alone(loaded: LoadedSpec) -> list[Diagnostic]:
    """Identity and zero experts are router columns past the experts: the features that count
    or scale per expert (capacity, groups, per-expert scales, the balance losses) are defined
    over the num_experts experts and would have to say what such a column counts as."""
    spec = loaded.spec
    router = spec.router
    past = [f"router.{n} ({getattr(router, n)})" for n in PAST_THE_EXPERTS if getattr(router, n)]
    if not past:
        return []
    clashes = [
        (("router", "capacity"), router.capacity is not None, "a capacity",
         "remove capacity (LongCat-Flash is dropless)"),
        (("router", "group_limit"), router.group_limit is not None, "group-limited routing",
         "remove group_limit"),
        (("router", "per_expert_scale"), router.per_expert_scale, "per-expert scales",
         "set per_expert_scale: false"),
        (("router", "load_balance_loss"), router.load_balance_loss > 0, "a balance loss",
         "balance with routing_bias (LongCat-Flash's e_score_correction_bias) and set "
         "load_balance_loss: 0"),
        (("layer", "expert_input_norm_eps"), spec.layer.expert_input_norm_eps is not None,
         "an expert input norm", "remove expert_input_norm_eps"),
    ]  # fmt: skip
    # a mapping-valued field (capacity, group_limit) is reported at its key
    return [
        loaded.diagnostic(
            path,
            f"{' and '.join(past)}: router columns past the experts are not supported with "
            f"{what}, which is defined over the {spec.layer.num_experts} computing experts "
            f"only; {fix}",
            at_key=path[-1] in ("capacity", "group_limit"),
        )
        for path, clashes_here, what, fix in clashes
        if clashes_here
    ]


ROUTING_RULES = (
    routing_bias_chooses_by_scores,
    score_after_top_k_is_meaningful,
    group_limit_can_pick_top_k,
    capacity_has_a_balancer,
    capacity_counts_one_way,
    load_balance_form_has_a_loss,
    routing_options_have_their_feature,
    zero_computation_experts_stand_alone,
)
