"""Stage 2, `moegen.validate`: shape variants (shapes.variants), their names, their shapes,
and every shape rule run on each variant, reported at the variant's own line."""

from __future__ import annotations

from validate_cases import (
    KEY,
    VALUE,
    Cases,
    rule_tests,
)

EVAL = {"eval": {"batch": 32, "seq_len": 8}}
NAME_FIX = (
    "a shape variant's name must be a lowercase identifier (letters, digits, _; a letter "
    "first): it names moe_layer_NAME; write "
)

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "variant_names_are_identifiers": [
        ({}, []),
        ({"variants": {"eval": {"batch": 32, "seq_len": 8}}}, []),
        ({"variants": {"prefill_32k": {"batch": 4, "seq_len": 8}}}, []),
        (
            {"variants": {"Eval-1": {"batch": 32, "seq_len": 8}}},
            [("shapes.variants['Eval-1']", KEY, NAME_FIX + "eval_1")],
        ),
        (
            {"variants": {"2k": {"batch": 32, "seq_len": 8}}},
            [("shapes.variants['2k']", KEY, NAME_FIX + "v_2k")],
        ),
        (
            {"variants": {"class": {"batch": 32, "seq_len": 8}}},
            [
                (
                    "shapes.variants.class",
                    KEY,
                    "'class' is reserved in the generated module; name it e.g. class_shape",
                )
            ],
        ),
    ],
    "variant_shapes_are_distinct": [
        (
            {
                "variants": {
                    "eval": {"batch": 32, "seq_len": 8},
                    "prefill": {"batch": 4, "seq_len": 64},
                }
            },
            [],
        ),
        (
            {"variants": {"eval": {"batch": 16, "seq_len": 32}}},
            [
                (
                    "shapes.variants.eval",
                    KEY,
                    (
                        "batch 16, seq_len 32 is already the main shape (shapes.batch, "
                        "shapes.seq_len): moe_layer dispatches on x.shape; change batch or "
                        "seq_len, or remove it"
                    ),
                )
            ],
        ),
        (
            {"variants": {"a": {"batch": 8, "seq_len": 8}, "b": {"batch": 8, "seq_len": 8}}},
            [
                (
                    "shapes.variants.b",
                    KEY,
                    (
                        "batch 8, seq_len 8 is already variant a: moe_layer dispatches on x.shape; "
                        "change batch or seq_len, or remove it"
                    ),
                )
            ],
        ),
    ],
    "variants_obey_every_shape_rule": [
        ({"variants": {"eval": {"batch": 32, "seq_len": 8}}}, []),
        # the main shape's own violations are reported once, by the rule itself
        ({"variants": {"eval": {"batch": 32, "seq_len": 8}}, "batch": 6}, []),
        (
            {"variants": {"eval": {"batch": 6, "seq_len": 8}}},
            [
                (
                    "shapes.variants.eval.batch",
                    VALUE,
                    "6 is not divisible by data*fsdp = 4; nearest valid: 4 or 8",
                )
            ],
        ),
    ],
}

test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
