"""Stage 2, `moegen.validate`: group-limited routing (groups and keep against top_k), and the keeps and group counts its messages offer."""

from __future__ import annotations

import re

import pytest
from validate_cases import (
    DEEPSEEK_V3,
    VALUE,
    Cases,
    loaded_spec,
    rule_tests,
)

from moegen.validate import check_rules

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "group_limit_can_pick_top_k": [
        ({}, []),
        (DEEPSEEK_V3, []),
        # DeepSeek-V2: 160 experts in 8 groups of 20, the best 3 kept, top 6
        ({"experts": 160, "top_k": 6, "group_limit": (8, 3)}, []),
        # boundary: each kept group supplies all its experts (16 in 8 groups of 2, 2 of 4 kept)
        ({"experts": 16, "top_k": 4, "group_limit": (8, 2)}, []),
        ({"experts": 32, "top_k": 8, "group_limit": (4, 1)}, []),  # 8 of one group of 8
        # groups of one expert: each group's score is its one expert's
        (
            {"experts": 8, "top_k": 2, "group_limit": {"groups": 8, "keep": 2, "top_per_group": 1}},
            [],
        ),
        (
            {**DEEPSEEK_V3, "group_limit": (7, 4), "routed_scaling": None, "routing_bias": None},
            [
                (
                    "router.group_limit.groups",
                    VALUE,
                    (
                        "256 experts do not split into 7 equal groups; "
                        "valid: 2, 4, 8, 16, 32, 64, 128, 256"
                    ),
                )
            ],
        ),
        # more groups than experts; and when groups are wrong, keep is not judged
        (
            {"experts": 8, "top_k": 2, "group_limit": (16, 16)},
            [
                (
                    "router.group_limit.groups",
                    VALUE,
                    "8 experts do not split into 16 equal groups; valid: 2, 4, 8",
                )
            ],
        ),
        (
            {"experts": 1, "top_k": 1, "group_limit": (2, 1)},
            [
                (
                    "router.group_limit.groups",
                    VALUE,
                    "1 experts do not split into 2 equal groups; valid: none (one expert)",
                )
            ],
        ),
        # top_k need not be a multiple of keep: DeepSeek-V3 keeps 3 of 8 as well as 4
        ({**DEEPSEEK_V3, "group_limit": (8, 3), "routed_scaling": None, "routing_bias": None}, []),
        ({"experts": 16, "top_k": 3, "group_limit": (4, 2)}, []),
        (
            {**DEEPSEEK_V3, "group_limit": (8, 8), "routed_scaling": None, "routing_bias": None},
            [
                (
                    "router.group_limit.keep",
                    VALUE,
                    (
                        "keeping 8 of 8 groups limits nothing; valid keep: 1 to 7; "
                        "or remove group_limit"
                    ),
                )
            ],
        ),
        (
            {"experts": 8, "top_k": 2, "group_limit": (2, 3)},
            [
                (
                    "router.group_limit.keep",
                    VALUE,
                    "keeping 3 of 2 groups limits nothing; valid keep: 1; or remove group_limit",
                )
            ],
        ),
        # 16 experts in 8 groups of 2: top 8 needs 4 kept groups
        (
            {"experts": 16, "top_k": 8, "group_limit": (8, 2)},
            [
                (
                    "router.group_limit.keep",
                    VALUE,
                    (
                        "2 kept groups of 2 experts cannot supply top_k = 8; valid keep: 4 to 7; "
                        "or remove group_limit"
                    ),
                )
            ],
        ),
        # 16 experts in 4 groups of 4, top 13: 4 groups are needed, and keeping 4 limits nothing
        (
            {"experts": 16, "top_k": 13, "group_limit": (4, 2)},
            [
                (
                    "router.group_limit.keep",
                    VALUE,
                    (
                        "2 kept groups of 4 experts cannot supply top_k = 13; no keep works for "
                        "top_k = 13 with 4 groups of 4; groups that work: 8; or remove group_limit"
                    ),
                )
            ],
        ),
        # every expert is needed: no group count leaves one out
        (
            {"experts": 4, "top_k": 4, "group_limit": (2, 1)},
            [
                (
                    "router.group_limit.keep",
                    VALUE,
                    (
                        "1 kept groups of 2 experts cannot supply top_k = 4; no keep works for "
                        "top_k = 4 with 2 groups of 2; no number of groups works for top_k = 4 "
                        "of 4 experts; or remove group_limit"
                    ),
                )
            ],
        ),
        (
            {"experts": 8, "top_k": 2, "group_limit": (1, 1)},
            [
                (
                    "router.group_limit.groups",
                    VALUE,
                    "one group holds every expert and limits nothing; valid: 2, 4, 8",
                )
            ],
        ),
        # a group's score sums its best top_per_group: a group of 2 has no best 3
        (
            {
                "experts": 16,
                "top_k": 4,
                "group_limit": {"groups": 8, "keep": 2, "top_per_group": 3},
            },
            [
                (
                    "router.group_limit.top_per_group",
                    VALUE,
                    "a group of 2 experts has no best 3 to sum; use 1 to 2, or fewer groups",
                )
            ],
        ),
        (
            {
                "experts": 16,
                "top_k": 4,
                "group_limit": {"groups": 8, "keep": 2, "top_per_group": 1},
            },
            [],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


def _keep_message(experts: int, top_k: int, groups: int, keep: int) -> str:
    loaded = loaded_spec({"experts": experts, "top_k": top_k, "group_limit": (groups, keep)})
    [diagnostic] = check_rules(loaded)
    assert diagnostic.field == "router.group_limit.keep", diagnostic
    return diagnostic.message


def _listed_keeps(message: str) -> list[int]:
    """The values of "...; valid keep: a to b; or remove group_limit" (or "valid keep: a")."""
    match = re.search(r"; valid keep: (\d+)(?: to (\d+))?; or remove group_limit$", message)
    assert match, message
    low, high = int(match.group(1)), int(match.group(2) or match.group(1))
    return list(range(low, high + 1))


@pytest.mark.parametrize(
    ("experts", "top_k", "groups", "keep"),
    [
        pytest.param(256, 8, 8, 8, id="deepseek-v3-keeps-every-group"),
        pytest.param(160, 6, 8, 9, id="deepseek-v2-keep-past-groups"),
        # 16 experts in 8 groups of 2: top 6 needs 3 of them
        pytest.param(16, 6, 8, 2, id="small-groups"),
        pytest.param(16, 8, 8, 2, id="16-experts-top-8"),
        pytest.param(32, 8, 8, 1, id="32-experts-top-8"),
    ],
)
def test_group_keep_advice_is_exactly_the_passing_keeps(
    experts: int, top_k: int, groups: int, keep: int
) -> None:
    listed = _listed_keeps(_keep_message(experts, top_k, groups, keep))
    for value in range(1, groups + 2):
        again = loaded_spec({"experts": experts, "top_k": top_k, "group_limit": (groups, value)})
        assert (check_rules(again) == []) == (value in listed), (value, listed)


def test_group_counts_named_when_no_keep_works_do_work() -> None:
    message = _keep_message(16, 13, 4, 2)
    named = [int(g) for g in message.split("groups that work: ")[1].split(";")[0].split(", ")]
    assert named == [8]  # 16 groups of one expert have no best 2 (top_per_group)
    for groups in named:
        keeps = [
            keep
            for keep in range(1, groups)
            if check_rules(loaded_spec({"experts": 16, "top_k": 13, "group_limit": (groups, keep)}))
            == []
        ]
        assert keeps, groups
    for keep in range(1, 6):  # and with 4 groups none does
        assert check_rules(loaded_spec({"experts": 16, "top_k": 13, "group_limit": (4, keep)})), (
            keep
        )
