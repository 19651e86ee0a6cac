"""Stage 2, `moegen.validate`: group-limited routing (groups and keep against top_k), and the keeps and group counts its messages offer."""

from __future__ import annotations

import re

import pytest
from validate_cases import (
    DEEPSEEK_V3,
    group_limit,
    loaded_spec,
    rule_tests,
)

from moegen.validate import check_rules

# rule name -> [(spec overrides, expected diagnostics: (line, column, field, message))].
CASES: dict[str, list[tuple[dict, list[tuple[int, int, str, str]]]]] = {
    "group_limit_can_pick_top_k": [
        ({}, []),
        (DEEPSEEK_V3, []),
        # DeepSeek-V2: 160 experts in 8 groups of 20, the best 3 kept, top 6
        ({"experts": 160, "top_k": 6, "router": group_limit(8, 3)}, []),
        # boundary: each kept group supplies all its experts (16 in 8 groups of 2, 2 of 4 kept)
        ({"experts": 16, "top_k": 4, "router": group_limit(8, 2)}, []),
        ({"experts": 32, "top_k": 8, "router": group_limit(4, 1)}, []),  # 8 of one group of 8
        ({"experts": 8, "top_k": 2, "router": group_limit(8, 2)}, []),  # groups of one expert
        (
            dict(DEEPSEEK_V3, router=(*group_limit(7, 4), "score: sigmoid")),
            [
                (
                    10,
                    13,
                    "router.group_limit.groups",
                    "256 experts do not split into 7 equal groups; "
                    "valid: 2, 4, 8, 16, 32, 64, 128, 256",
                )
            ],
        ),
        # more groups than experts; and when groups are wrong, keep is not judged
        (
            {"experts": 8, "top_k": 2, "router": group_limit(16, 16)},
            [
                (
                    10,
                    13,
                    "router.group_limit.groups",
                    "8 experts do not split into 16 equal groups; valid: 2, 4, 8",
                )
            ],
        ),
        (
            {"experts": 1, "top_k": 1, "router": group_limit(2, 1)},
            [
                (
                    10,
                    13,
                    "router.group_limit.groups",
                    "1 experts do not split into 2 equal groups; valid: none (one expert)",
                )
            ],
        ),
        (
            dict(DEEPSEEK_V3, router=(*group_limit(8, 3), "score: sigmoid")),
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "top_k = 8 is not a multiple of keep = 3 (a group's score is the sum of its "
                    "top top_k / keep scores); valid keep: 1, 2, 4; or remove group_limit",
                )
            ],
        ),
        (
            dict(DEEPSEEK_V3, router=(*group_limit(8, 8), "score: sigmoid")),
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "keeping 8 of 8 groups limits nothing; valid keep: 1, 2, 4; "
                    "or remove group_limit",
                )
            ],
        ),
        (
            {"experts": 8, "top_k": 2, "router": group_limit(2, 3)},
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "keeping 3 of 2 groups limits nothing; valid keep: 1; or remove group_limit",
                )
            ],
        ),
        # 16 experts in 8 groups of 2: top 8 from 2 kept groups needs 4 from each
        (
            {"experts": 16, "top_k": 8, "router": group_limit(8, 2)},
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "each kept group must supply top_k / keep = 4 experts but holds 2; "
                    "valid keep: 4; or remove group_limit",
                )
            ],
        ),
        (
            {"experts": 32, "top_k": 8, "router": group_limit(8, 1)},
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "each kept group must supply top_k / keep = 8 experts but holds 4; "
                    "valid keep: 2, 4; or remove group_limit",
                )
            ],
        ),
        # 16 experts in 4 groups of 4, top 10: keep 1 or 2 would need 10 or 5 from a group of 4
        (
            {"experts": 16, "top_k": 10, "router": group_limit(4, 2)},
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "each kept group must supply top_k / keep = 5 experts but holds 4; "
                    "no keep works for top_k = 10 with 4 groups of 4; groups that work: 8, 16; "
                    "or remove group_limit",
                )
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


def _keep_message(experts: int, top_k: int, groups: int, keep: int) -> str:
    loaded = loaded_spec(experts=experts, top_k=top_k, router=group_limit(groups, keep))
    [diagnostic] = check_rules(loaded)
    assert diagnostic.field == "router.group_limit.keep", diagnostic
    return diagnostic.message


def _listed_keeps(message: str) -> list[int]:
    """The values of "...; valid keep: a, b; or remove group_limit"."""
    match = re.search(r"; valid keep: (\d+(?:, \d+)*); or remove group_limit$", message)
    assert match, message
    return [int(value) for value in match.group(1).split(", ")]


def _assert_listed_keeps_are_exactly_the_passing_ones(
    experts: int, top_k: int, groups: int, message: str
) -> None:
    listed = _listed_keeps(message)
    for value in range(1, groups + 2):
        again = loaded_spec(experts=experts, top_k=top_k, router=group_limit(groups, value))
        if value in listed:  # every keep the message calls valid passes every rule
            assert check_rules(again) == [], (value, message)
        else:  # and it leaves none out
            assert check_rules(again) != [], (value, message)


@pytest.mark.parametrize(
    ("experts", "top_k", "groups", "keep"),
    [
        pytest.param(256, 8, 8, 3, id="deepseek-v3-keep-3"),
        pytest.param(160, 6, 8, 4, id="deepseek-v2-keep-4"),
        # 16 experts in 8 groups of 2: keep 1 or 2 would need 6 or 3 experts from a group of 2
        pytest.param(16, 6, 8, 4, id="small-groups"),
        pytest.param(256, 8, 8, 8, id="keeps-every-group"),
    ],
)
def test_group_keep_advice_followed_passes(experts: int, top_k: int, groups: int, keep: int):
    message = _keep_message(experts, top_k, groups, keep)
    _assert_listed_keeps_are_exactly_the_passing_ones(experts, top_k, groups, message)


@pytest.mark.parametrize(
    ("experts", "top_k", "groups", "keep", "listed"),
    [
        pytest.param(16, 8, 8, 2, [4], id="16-experts-top-8"),
        pytest.param(32, 8, 8, 1, [2, 4], id="32-experts-top-8"),
    ],
)
def test_group_keep_too_few_groups_advice_followed_passes(
    experts: int, top_k: int, groups: int, keep: int, listed: list[int]
) -> None:
    message = _keep_message(experts, top_k, groups, keep)
    assert _listed_keeps(message) == listed, message
    _assert_listed_keeps_are_exactly_the_passing_ones(experts, top_k, groups, message)


def test_group_keep_says_when_no_keep_works() -> None:
    # 16 experts in 4 groups of 4, top 10: no keep below 4 divides 10 and supplies <= 4 a group
    message = _keep_message(16, 10, 4, 2)
    assert "valid keep:" not in message, message
    assert message.endswith(
        "; no keep works for top_k = 10 with 4 groups of 4; groups that work: 8, 16; "
        "or remove group_limit"
    ), message
    for keep in range(1, 6):  # and indeed none does
        again = loaded_spec(experts=16, top_k=10, router=group_limit(4, keep))
        assert check_rules(again) != [], keep


def test_group_counts_named_when_no_keep_works_do_work() -> None:
    message = _keep_message(16, 10, 4, 2)
    named = [int(g) for g in message.split("groups that work: ")[1].split(";")[0].split(", ")]
    assert named == [8, 16]
    for groups in named:
        keeps = [
            keep
            for keep in range(1, groups)
            if check_rules(loaded_spec(experts=16, top_k=10, router=group_limit(groups, keep)))
            == []
        ]
        assert keeps, groups
