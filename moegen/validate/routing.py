"""Rules of the router and expert features: scores, groups, balancing, capacity.

Each combination refused here is one the anchors accept and then compute something other
than what the user wrote (a bias nobody applies, a router that never learns, a group rule
that cannot pick top_k experts), or one that is a no-op the user did not mean.
"""

from __future__ import annotations

import bisect

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.sizes import divisors, listed

SIGMOID_TYPE_SCORES = ("sigmoid", "sqrtsoftplus")


def routing_bias_needs_sigmoid_scores(loaded: LoadedSpec) -> list[Diagnostic]:
    """The aux-loss-free bias is defined on independent per-expert scores (DeepSeek-V3);
    TE's block accepts it under softmax, where its kernel ignores it."""
    router = loaded.spec.router
    if not router.routing_bias or router.score in SIGMOID_TYPE_SCORES:
        return []
    return [
        loaded.diagnostic(
            ("router", "routing_bias"),
            f"a routing bias balances sigmoid-type scores; with score: {router.score} the "
            "experts compete inside one softmax and the bias has no defined effect; set "
            "score: sigmoid (or sqrtsoftplus), or routing_bias: false",
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
    """DeepSeek-V3's rules: whole groups, kept groups divide top_k, and hold enough experts."""
    spec = loaded.spec
    limit = spec.router.group_limit
    if limit is None:
        return []
    experts, top_k = spec.layer.num_experts, spec.router.top_k
    # Group counts and keeps are divisors: enumerated by pairs up to the square root, as a
    # count of experts or a top_k can be any size up to 2**31 here.
    group_counts = [g for g in divisors(experts) if g > 1]
    if experts % limit.groups:
        return [
            loaded.diagnostic(
                ("router", "group_limit", "groups"),
                f"{experts} experts do not split into {limit.groups} equal groups; "
                f"valid: {listed(group_counts, limit.groups) or 'none (one expert)'}",
            )
        ]
    per_group = experts // limit.groups
    keeps = divisors(top_k)
    valid = _valid_keeps(keeps, experts, limit.groups, top_k)
    if limit.keep in valid:
        return []
    if limit.keep >= limit.groups:
        problem = f"keeping {limit.keep} of {limit.groups} groups limits nothing"
    elif top_k % limit.keep:
        problem = (
            f"top_k = {top_k} is not a multiple of keep = {limit.keep} (a group's score is "
            "the sum of its top top_k / keep scores)"
        )
    else:
        problem = (
            f"each kept group must supply top_k / keep = {top_k // limit.keep} experts but "
            f"holds {per_group}"
        )
    if valid:
        fix = f"valid keep: {listed(valid, limit.keep)}"
    else:
        workable = [g for g in group_counts if _some_keep(keeps, experts, g, top_k)]
        works = f"groups that work: {listed(workable, limit.groups)}" if workable else "none works"
        fix = (
            f"no keep works for top_k = {top_k} with {limit.groups} groups of {per_group}; {works}"
        )
    return [
        loaded.diagnostic(
            ("router", "group_limit", "keep"), f"{problem}; {fix}; or remove group_limit"
        )
    ]


def _valid_keeps(keeps: list[int], experts: int, groups: int, top_k: int) -> list[int]:
    """Kept-group counts that limit something and can supply top_k experts; `keeps`: the
    divisors of top_k, ascending (a keep must divide it)."""
    per_group = experts // groups
    return [k for k in keeps if k < groups and top_k // k <= per_group]


def _some_keep(keeps: list[int], experts: int, groups: int, top_k: int) -> bool:
    """Whether `_valid_keeps` has any: the smallest divisor k of top_k with top_k / k <= the
    group size (k >= top_k / size) must limit something (k < groups). One bisection, not a
    scan of every keep for every group count."""
    need = -(-top_k // (experts // groups))
    index = bisect.bisect_left(keeps, need)
    return index < len(keeps) and keeps[index] < groups


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
            "router.routing_bias: true (sigmoid-type scores), or remove capacity (dropless)",
        )
    ]


ROUTING_RULES = (
    routing_bias_needs_sigmoid_scores,
    score_after_top_k_is_meaningful,
    group_limit_can_pick_top_k,
    capacity_has_a_balancer,
)
