"""Stage 2, `moegen.validate`: the router rules (top_k, renormalisation, routing bias, score order, capacity balancing), passing and failing, located."""

from __future__ import annotations

import pytest
from validate_cases import (
    DEEPSEEK_V3,
    NOTHING_BALANCES,
    ROUTING_BIAS_ON_LOGITS,
    group_limit,
    loaded_spec,
    rule_tests,
)

from moegen.validate import check_rules

# rule name -> [(spec overrides, expected diagnostics: (line, column, field, message))].
CASES: dict[str, list[tuple[dict, list[tuple[int, int, str, str]]]]] = {
    "top_k_within_experts": [
        ({}, []),
        ({"experts": 8, "top_k": 8}, []),  # boundary: every expert
        (
            {"experts": 8, "top_k": 9},
            [(7, 10, "router.top_k", "must be <= layer.num_experts (8), got 9")],
        ),
        (
            {"experts": 1, "top_k": 2},
            [(7, 10, "router.top_k", "must be <= layer.num_experts (1), got 2")],
        ),
    ],
    "single_expert_not_renormalized": [
        ({"top_k": 1, "renormalize": False}, []),
        ({"top_k": 2, "renormalize": True}, []),
        (
            {"top_k": 1, "renormalize": True},
            [
                (
                    8,
                    16,
                    "router.renormalize",
                    (
                        "with top_k = 1 the renormalised weight is always 1.0 and the router gets "
                        "zero gradient; set renormalize: false"
                    ),
                )
            ],
        ),
    ],
    "routing_bias_chooses_by_scores": [
        ({}, []),
        ({"router": ("score: sigmoid", "routing_bias: true")}, []),
        ({"router": ("score: sqrtsoftplus", "routing_bias: true")}, []),
        ({"router": ("score: softmax", "routing_bias: false")}, []),
        (DEEPSEEK_V3, []),
        # ERNIE 4.5: the bias is added to the softmax probabilities to choose
        ({"renormalize": True, "router": ("routing_bias: true",)}, []),
        ({"router": ("score: softmax", "routing_bias: true")}, []),
        # by raw logits there is no score to add it to: refused where it is written
        (
            {"router": ("score_after_top_k: true", "routing_bias: true")},
            [(10, 17, "router.routing_bias", ROUTING_BIAS_ON_LOGITS)],
        ),
    ],
    "score_after_top_k_is_meaningful": [
        ({}, []),
        ({"router": ("score_after_top_k: true",)}, []),  # Mixtral: top-2 softmax over 2 logits
        # gpt-oss: 128 experts, softmax over the top-4 logits
        ({"experts": 128, "top_k": 4, "router": ("score: softmax", "score_after_top_k: true")}, []),
        ({"router": ("score: sigmoid", "score_after_top_k: false")}, []),
        (
            {"router": ("score: sigmoid", "score_after_top_k: true")},
            [
                (
                    10,
                    22,
                    "router.score_after_top_k",
                    "sigmoid scores each expert on its own, so applying it after top-k gives the "
                    "same weights; remove score_after_top_k",
                )
            ],
        ),
        # the score is the whole story: renormalize (fine with sigmoid) is not looked at
        (
            {"renormalize": True, "router": ("score: sqrtsoftplus", "score_after_top_k: true")},
            [
                (
                    10,
                    22,
                    "router.score_after_top_k",
                    "sqrtsoftplus scores each expert on its own, so applying it after top-k "
                    "gives the same weights; remove score_after_top_k",
                )
            ],
        ),
        (
            {"top_k": 1, "router": ("score_after_top_k: true",)},
            [
                (
                    9,
                    22,
                    "router.score_after_top_k",
                    "a softmax over one chosen logit is always 1.0: the router would get zero "
                    "gradient; set score_after_top_k: false (softmax over all experts)",
                )
            ],
        ),
        (
            {"renormalize": True, "router": ("score_after_top_k: true",)},
            [
                (
                    8,
                    16,
                    "router.renormalize",
                    "the softmax over the chosen logits already sums to 1; set renormalize: false",
                )
            ],
        ),
        (
            {"router": (*group_limit(4, 2), "score_after_top_k: true")},
            [
                (
                    9,
                    3,
                    "router.group_limit",
                    "group-limited routing ranks groups by scores over all experts, which "
                    "score_after_top_k does not compute; use score_after_top_k: false with it",
                )
            ],
        ),
        # both problems of a softmax written with what score_after_top_k already does
        (
            {"renormalize": True, "router": (*group_limit(4, 2), "score_after_top_k: true")},
            [
                (
                    8,
                    16,
                    "router.renormalize",
                    "the softmax over the chosen logits already sums to 1; set renormalize: false",
                ),
                (
                    9,
                    3,
                    "router.group_limit",
                    "group-limited routing ranks groups by scores over all experts, which "
                    "score_after_top_k does not compute; use score_after_top_k: false with it",
                ),
            ],
        ),
    ],
    "capacity_has_a_balancer": [
        ({}, []),  # dropless
        ({"router": ("load_balance_loss: 0.01", "capacity: {factor: 1.25}")}, []),
        (
            {
                "router": (
                    "score: sigmoid",
                    "routing_bias: true",
                    "capacity: {factor: 1.0, drop: position}",
                )
            },
            [],
        ),
        ({"router": ("load_balance_loss: 0.0",)}, []),  # no capacity, no balancer: dropless
        (
            {"router": ("capacity: {factor: 1.25}",)},
            [(9, 3, "router.capacity", NOTHING_BALANCES)],
        ),
        # written out as off, and a z-loss (which only keeps logits small) does not balance
        (
            {
                "router": (
                    "capacity: {factor: 2.0, drop: position}",
                    "load_balance_loss: 0",
                    "routing_bias: false",
                    "z_loss: 0.001",
                )
            },
            [(9, 3, "router.capacity", NOTHING_BALANCES)],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


@pytest.mark.parametrize(
    "router",
    [
        ("capacity:", "  factor: 1.25"),
        ("capacity: {factor: 1.25}",),
        (*group_limit(4, 2), "score_after_top_k: true"),
    ],
    ids=["capacity-block", "capacity-flow", "group_limit-block"],
)
def test_mapping_valued_router_fields_are_reported_at_their_key(router: tuple[str, ...]) -> None:
    [diagnostic] = check_rules(loaded_spec(router=router))
    assert (diagnostic.line, diagnostic.column) == (9, 3), diagnostic
