"""Stage 2, `moegen.validate`: the experts' latent width and its biases, passing and failing,
located."""

from __future__ import annotations

from validate_cases import VALUE, Cases, rule_tests

CASES: Cases = {
    "latent_bias_needs_a_latent_width": [
        ({}, []),
        ({"latent": 16, "latent_bias": True}, []),
        (
            {"latent_bias": True},
            [
                (
                    "layer.latent_bias",
                    VALUE,
                    "there are no latent projections to give biases to; set layer.latent_dim "
                    "(the experts' latent width) or remove latent_bias",
                )
            ],
        ),
    ],
    "latent_divisible_by_fsdp": [
        ({"latent": 16, "axes": {"fsdp": 4}}, []),
        (
            {"latent": 18, "axes": {"fsdp": 4}},
            [
                (
                    "layer.latent_dim",
                    VALUE,
                    "18 is not divisible by fsdp = 4 (the expert weights are sharded along "
                    "their latent width); nearest valid: 16 or 20",
                )
            ],
        ),
    ],
}

test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
