"""Stage 2, `moegen.validate`: redundant expert slots and their placement, passing and
failing, located."""

from __future__ import annotations

from validate_cases import VALUE, Cases, rule_tests

# BASE's 8 experts over expert 4 (2 a device), copies exchanged by ragged all-to-all
A2A = {"axes": {"expert": 4}, "strategy": "ragged_all_to_all"}


def one_each(*experts: int, share: float = 0.5) -> list[list[dict]]:
    """A placement of one extra slot per device holding `experts[d]`."""
    return [[{"expert": e, "share": share}] for e in experts]


REPLICAS = {**A2A, "redundant_experts": 4, "placement": one_each(2, 4, 6, 0)}
AT = "parallelism.placement"

CASES: Cases = {
    "redundant_experts_have_somewhere_to_go": [
        ({}, []),
        (REPLICAS, []),
        (
            {**REPLICAS, "strategy": "ring_of_experts"},
            [
                (
                    "parallelism.redundant_experts",
                    VALUE,
                    "strategy ring_of_experts cannot carry redundant experts yet: set "
                    "parallelism.experts: ragged_all_to_all, or remove redundant_experts",
                )
            ],
        ),
        (
            {**REPLICAS, "redundant_experts": 6},
            [
                (
                    "parallelism.redundant_experts",
                    VALUE,
                    "6 redundant experts do not split evenly over expert 4: every device gets "
                    "the same number of extra slots; use 4 or 8",
                )
            ],
        ),
        (
            {**REPLICAS, "ffn_chunks": 2},
            [
                (
                    "memory.ffn_chunks",
                    VALUE,
                    "FFN slices cannot carry redundant experts yet (each slice gathers its "
                    "weights again): remove ffn_chunks, or remove redundant_experts",
                )
            ],
        ),
    ],
    "placement_matches_the_slots": [
        (REPLICAS, []),
        (
            {**A2A, "placement": one_each(2, 4, 6, 0)},
            [
                (
                    AT,
                    VALUE,
                    "a placement without redundant experts places nothing: remove it, or set "
                    "parallelism.redundant_experts",
                )
            ],
        ),
        (
            {**REPLICAS, "placement": None},
            [
                (
                    "parallelism.redundant_experts",
                    VALUE,
                    "redundant experts need a placement: which experts the extra slots hold "
                    "and on which devices (`moegen rebalance SPEC --load FILE --out "
                    "placement.json`, then placement: placement.json)",
                )
            ],
        ),
        (
            {**REPLICAS, "placement": one_each(2, 4, 6)},
            [(AT, VALUE, "3 devices for expert 4")],
        ),
        (
            {**REPLICAS, "placement": [*one_each(2, 4, 6), []]},
            [
                (
                    f"{AT}[3]",
                    VALUE,
                    "device 3 has 0 extra slots; redundant_experts 4 over expert 4 gives each 1",
                )
            ],
        ),
    ],
    "replicas_are_new_experts": [
        (REPLICAS, []),
        (
            {**REPLICAS, "placement": one_each(2, 4, 9, 0)},
            [(f"{AT}[2][0].expert", VALUE, "expert 9: the layer has experts 0..7")],
        ),
        (
            {**REPLICAS, "placement": one_each(1, 4, 6, 0)},
            [
                (
                    f"{AT}[0][0].expert",
                    VALUE,
                    "expert 1 is already on device 0 (it holds experts 0..1): a replica there "
                    "splits nothing; place it on another device",
                )
            ],
        ),
        (
            {
                **REPLICAS,
                "redundant_experts": 8,
                "placement": [
                    [{"expert": 2, "share": 0.2}, {"expert": 2, "share": 0.2}],
                    [{"expert": 0, "share": 0.1}, {"expert": 4, "share": 0.1}],
                    [{"expert": 0, "share": 0.1}, {"expert": 1, "share": 0.1}],
                    [{"expert": 1, "share": 0.1}, {"expert": 3, "share": 0.1}],
                ],
            },
            [(f"{AT}[0][1].expert", VALUE, "expert 2 twice on device 0: one slot suffices")],
        ),
    ],
    "shares_leave_a_home_share": [
        (REPLICAS, []),
        (
            {**REPLICAS, "placement": one_each(2, 4, 6, 0, share=0.0001)},
            [
                (
                    f"{AT}[{d}][0].share",
                    VALUE,
                    "share 0.0001 rounds to 0 of 1024ths: at least 0.000977",
                )
                for d in range(4)
            ],
        ),
        (
            {**REPLICAS, "placement": one_each(2, 0, 0, 0, share=0.4)},
            [
                (
                    AT,
                    VALUE,
                    "expert 0's replicas take 1.2012 of its copies together; at most 1 (its "
                    "home slot keeps the rest)",
                )
            ],
        ),
    ],
}

test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
