"""Stage 2, `moegen.validate`: shared experts the router weighs (Inkling), passing and
failing, located."""

from __future__ import annotations

from validate_cases import VALUE, Cases, rule_tests

# Inkling's router over BASE's 8 experts, two shared experts of 32 each
INKLING = {
    "score": "sigmoid",
    "renormalize": True,
    "routing_bias": True,
    "weighs_shared_experts": True,
    "learned_scale": True,
    "shared_ffn": 64,
    "shared_experts": 2,
}


def clash(what: str, fix: str) -> str:
    return f"router.weighs_shared_experts is not supported with {what}; {fix}"


CASES: Cases = {
    "shared_experts_are_weighed": [
        ({}, []),
        (INKLING, []),
        ({"shared_ffn": 64, "shared_experts": 1}, []),  # one, unweighed: the default
        (
            {"shared_ffn": 64, "shared_experts": 2},
            [
                (
                    "layer.shared_experts",
                    VALUE,
                    "2 shared experts added unweighed are one of width shared_ffn_dim; remove "
                    "shared_experts, or set router.weighs_shared_experts: true (the router "
                    "weighs each, as Inkling's does)",
                )
            ],
        ),
        (
            {k: v for k, v in INKLING.items() if k not in ("shared_ffn", "shared_experts")},
            [
                (
                    "router.weighs_shared_experts",
                    VALUE,
                    "weighs_shared_experts needs shared experts to weigh: set "
                    "layer.shared_ffn_dim (their total width) and layer.shared_experts (how "
                    "many)",
                )
            ],
        ),
        (
            INKLING | {"shared_experts": 3},
            [
                (
                    "layer.shared_experts",
                    VALUE,
                    "shared_ffn_dim 64 does not split into 3 shared experts of equal width",
                )
            ],
        ),
    ],
    "weighed_shared_experts_stand_alone": [
        (INKLING | {"score": "sqrtsoftplus", "capacity": (1.25, "position")}, []),
        (
            INKLING | {"score": "softmax"},
            [
                (
                    "router.score",
                    VALUE,
                    clash(
                        "softmax scores",
                        "the shared scores are normalised with the chosen ones, which needs a "
                        "score of each logit alone: set score: sigmoid (Inkling) or "
                        "sqrtsoftplus",
                    ),
                )
            ],
        ),
        (
            INKLING | {"z_loss": 0.001, "shared_expert_gate": True},
            [
                ("router.z_loss", VALUE, clash("a z-loss", "set z_loss: 0")),
                (
                    "layer.shared_expert_gate",
                    VALUE,
                    clash(
                        "a shared expert gate",
                        "set shared_expert_gate: false (the router's weights gate the shared "
                        "experts)",
                    ),
                ),
            ],
        ),
        (
            INKLING | {"axes": {"data": 2, "tensor": 2}},
            [
                (
                    "mesh.axes.tensor",
                    VALUE,
                    clash(
                        "a tensor axis",
                        "drop the tensor axis (it would split the shared experts' widths)",
                    ),
                )
            ],
        ),
    ],
}
test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
