"""Stage 2, `moegen.validate`: the router rules (top_k, renormalisation, routing bias, score order, capacity balancing), passing and failing, located."""

from __future__ import annotations

import pytest
from validate_cases import (
    BIAS_ON_WITHOUT_BIAS,
    CAPACITY_PER_SPLIT_SEQUENCE,
    CAPACITY_TWICE,
    CAPACITY_WITHOUT_SIZE,
    DEEPSEEK_V3,
    EPSILON_WITHOUT_RENORMALIZE,
    FORM_WITHOUT_LOSS,
    KEY,
    NOTHING_BALANCES,
    ROUTING_BIAS_ON_LOGITS,
    VALUE,
    Cases,
    case_yaml,
    position,
    rule_tests,
)

from moegen.load import load_spec_bytes
from moegen.validate import check_rules

CAPACITY_FIX = "remove capacity (LongCat-Flash is dropless)"
LOSS_FIX = (
    "balance with routing_bias (LongCat-Flash's e_score_correction_bias) and set "
    "load_balance_loss: 0"
)
GROUPS_FIX = "remove group_limit"
SCALE_FIX = "set per_expert_scale: false"


def identity_clash(identity: int, what: str, fix: str, zero: int = 0) -> str:
    past = [f"router.identity_experts ({identity})"] if identity else []
    past += [f"router.zero_experts ({zero})"] if zero else []
    return (
        f"{' and '.join(past)}: router columns past the experts are not supported with {what}, "
        f"which is defined over the 8 computing experts only; {fix}"
    )


# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "top_k_within_experts": [
        ({}, []),
        ({"experts": 8, "top_k": 8}, []),  # boundary: every expert
        (
            {"experts": 8, "top_k": 9},
            [("router.top_k", VALUE, "must be <= layer.num_experts (8), got 9")],
        ),
        (
            {"experts": 1, "top_k": 2},
            [("router.top_k", VALUE, "must be <= layer.num_experts (1), got 2")],
        ),
    ],
    "single_expert_not_renormalized": [
        ({"top_k": 1, "renormalize": False}, []),
        ({"top_k": 2, "renormalize": True}, []),
        (
            {"top_k": 1, "renormalize": True},
            [
                (
                    "router.renormalize",
                    VALUE,
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
        ({"score": "sigmoid", "routing_bias": True}, []),
        ({"score": "sqrtsoftplus", "routing_bias": True}, []),
        ({"score": "softmax", "routing_bias": False}, []),
        (DEEPSEEK_V3, []),
        # ERNIE 4.5: the bias is added to the softmax probabilities to choose
        ({"renormalize": True, "routing_bias": True}, []),
        ({"score": "softmax", "routing_bias": True}, []),
        # by raw logits there is no score to add it to: refused where it is written
        (
            {"score_after_top_k": True, "routing_bias": True},
            [("router.routing_bias", VALUE, ROUTING_BIAS_ON_LOGITS)],
        ),
    ],
    "score_after_top_k_is_meaningful": [
        ({}, []),
        ({"score_after_top_k": True}, []),  # Mixtral: top-2 softmax over 2 logits
        # gpt-oss: 128 experts, softmax over the top-4 logits
        ({"experts": 128, "top_k": 4, "score": "softmax", "score_after_top_k": True}, []),
        ({"score": "sigmoid", "score_after_top_k": False}, []),
        (
            {"score": "sigmoid", "score_after_top_k": True},
            [
                (
                    "router.score_after_top_k",
                    VALUE,
                    (
                        "sigmoid scores each expert on its own, so applying it after top-k gives the "
                        "same weights; remove score_after_top_k"
                    ),
                )
            ],
        ),
        # the score is the whole story: renormalize (fine with sigmoid) is not looked at
        (
            {"renormalize": True, "score": "sqrtsoftplus", "score_after_top_k": True},
            [
                (
                    "router.score_after_top_k",
                    VALUE,
                    (
                        "sqrtsoftplus scores each expert on its own, so applying it after top-k "
                        "gives the same weights; remove score_after_top_k"
                    ),
                )
            ],
        ),
        (
            {"top_k": 1, "score_after_top_k": True},
            [
                (
                    "router.score_after_top_k",
                    VALUE,
                    (
                        "a softmax over one chosen logit is always 1.0: the router would get zero "
                        "gradient; set score_after_top_k: false (softmax over all experts)"
                    ),
                )
            ],
        ),
        (
            {"renormalize": True, "score_after_top_k": True},
            [
                (
                    "router.renormalize",
                    VALUE,
                    "the softmax over the chosen logits already sums to 1; set renormalize: false",
                )
            ],
        ),
        (
            {"group_limit": (4, 2), "score_after_top_k": True},
            [
                (
                    "router.group_limit",
                    KEY,
                    (
                        "group-limited routing ranks groups by scores over all experts, which "
                        "score_after_top_k does not compute; use score_after_top_k: false with it"
                    ),
                )
            ],
        ),
        # both problems of a softmax written with what score_after_top_k already does
        (
            {"renormalize": True, "group_limit": (4, 2), "score_after_top_k": True},
            [
                (
                    "router.renormalize",
                    VALUE,
                    "the softmax over the chosen logits already sums to 1; set renormalize: false",
                ),
                (
                    "router.group_limit",
                    KEY,
                    (
                        "group-limited routing ranks groups by scores over all experts, which "
                        "score_after_top_k does not compute; use score_after_top_k: false with it"
                    ),
                ),
            ],
        ),
    ],
    "capacity_has_a_balancer": [
        ({}, []),  # dropless
        ({"load_balance_loss": 0.01, "capacity": {"factor": 1.25}}, []),
        (
            {"score": "sigmoid", "routing_bias": True, "capacity": (1.0, "position")},
            [],
        ),
        ({"load_balance_loss": 0.0}, []),  # no capacity, no balancer: dropless
        (
            {"capacity": {"factor": 1.25}},
            [("router.capacity", KEY, NOTHING_BALANCES)],
        ),
        # written out as off, and a z-loss (which only keeps logits small) does not balance
        (
            {
                "capacity": (2.0, "position"),
                "load_balance_loss": 0,
                "routing_bias": False,
                "z_loss": 0.001,
            },
            [("router.capacity", KEY, NOTHING_BALANCES)],
        ),
    ],
    "capacity_counts_one_way": [
        ({}, []),  # dropless
        ({"load_balance_loss": 0.01, "capacity": {"factor": 1.25}}, []),
        # Switch Transformers: expert_capacity copies of each sequence's tokens
        (
            {
                "top_k": 1,
                "load_balance_loss": 0.001,
                "capacity": {"copies": 64, "per": "sequence", "drop": "position"},
            },
            [],
        ),
        (
            {"load_balance_loss": 0.01, "capacity": {"factor": 1.25, "per": "sequence"}},
            [],
        ),
        (
            {"load_balance_loss": 0.01, "capacity": {"factor": 1.25, "copies": 4}},
            [("router.capacity.copies", VALUE, CAPACITY_TWICE)],
        ),
        (
            {"load_balance_loss": 0.01, "capacity": {"drop": "position"}},
            [("router.capacity", KEY, CAPACITY_WITHOUT_SIZE)],
        ),
        (
            {
                "load_balance_loss": 0.01,
                "capacity": {"factor": 1.0, "per": "sequence"},
                "axes": {"data": 2, "sequence": 2},
                "batch_axes": ["data"],
            },
            [("router.capacity.per", VALUE, CAPACITY_PER_SPLIT_SEQUENCE)],
        ),
    ],
    "routing_options_have_their_feature": [
        ({"renormalize": True, "renormalize_epsilon": 0.001}, []),
        ({"score": "sigmoid", "routing_bias": True, "routing_bias_on": "logits"}, []),
        ({"renormalize_epsilon": 0.0, "routing_bias_on": "scores"}, []),  # the defaults
        (
            {"renormalize_epsilon": 0.001},
            [("router.renormalize_epsilon", VALUE, EPSILON_WITHOUT_RENORMALIZE)],
        ),
        (
            {"score": "sigmoid", "routing_bias_on": "logits", "renormalize_epsilon": 0.001},
            [
                ("router.renormalize_epsilon", VALUE, EPSILON_WITHOUT_RENORMALIZE),
                ("router.routing_bias_on", VALUE, BIAS_ON_WITHOUT_BIAS),
            ],
        ),
    ],
    "load_balance_form_has_a_loss": [
        ({"load_balance_loss": 0.01, "load_balance_form": "transformers"}, []),
        ({"load_balance_loss": 0.01, "load_balance_form": "switch"}, []),
        ({"load_balance_form": "switch"}, []),  # the default written out, no loss: fine
        (
            {"load_balance_form": "transformers"},
            [("router.load_balance_form", VALUE, FORM_WITHOUT_LOSS)],
        ),
        (
            {"load_balance_form": "transformers", "load_balance_loss": 0, "z_loss": 0.001},
            [("router.load_balance_form", VALUE, FORM_WITHOUT_LOSS)],
        ),
    ],
    "zero_computation_experts_stand_alone": [
        ({"identity_experts": 4, "routing_bias": True, "routed_scaling": 6.0}, []),  # LongCat
        ({"identity_experts": 2, "z_loss": 0.001, "score": "sigmoid"}, []),
        ({"capacity": (1.25, "position"), "load_balance_loss": 0.01}, []),  # no identity experts
        (
            {"identity_experts": 4, "capacity": (1.25, "position"), "routing_bias": True},
            [("router.capacity", KEY, identity_clash(4, "a capacity", CAPACITY_FIX))],
        ),
        (
            {
                "zero_experts": 3,
                "identity_experts": 1,
                "z_loss": 0.001,
                "capacity": (1.0, "position"),
                "routing_bias": True,
            },
            [("router.capacity", KEY, identity_clash(1, "a capacity", CAPACITY_FIX, zero=3))],
        ),
        (
            {"zero_experts": 2, "load_balance_loss": 0.01},
            [
                (
                    "router.load_balance_loss",
                    VALUE,
                    identity_clash(0, "a balance loss", LOSS_FIX, zero=2),
                )
            ],
        ),
        (
            {"identity_experts": 2, "load_balance_loss": 0.01},
            [("router.load_balance_loss", VALUE, identity_clash(2, "a balance loss", LOSS_FIX))],
        ),
        (
            {"identity_experts": 2, "per_expert_scale": True, "group_limit": (4, 2)},
            [
                ("router.group_limit", KEY, identity_clash(2, "group-limited routing", GROUPS_FIX)),
                (
                    "router.per_expert_scale",
                    VALUE,
                    identity_clash(2, "per-expert scales", SCALE_FIX),
                ),
            ],
        ),
    ],
}
test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


# Written as YAML text: the point is where a mapping value, block or flow, is reported.
@pytest.mark.parametrize(
    "router_lines",
    [
        ("capacity:", "  factor: 1.25"),
        ("capacity: {factor: 1.25}",),
        ("group_limit:", "  groups: 4", "  keep: 2", "score_after_top_k: true"),
    ],
    ids=["capacity-block", "capacity-flow", "group_limit-block"],
)
def test_mapping_valued_router_fields_are_reported_at_their_key(
    router_lines: tuple[str, ...],
) -> None:
    text = case_yaml()
    assert "\nrouter:\n" in text
    added = "".join(f"  {line}\n" for line in router_lines)
    text = text.replace("\nrouter:\n", f"\nrouter:\n{added}", 1)
    [diagnostic] = check_rules(load_spec_bytes(text.encode(), "rule.yaml", "rule"))
    first_added_line = position({}, "router", KEY)[0] + 1
    assert (diagnostic.line, diagnostic.column) == (first_added_line, 3), diagnostic
