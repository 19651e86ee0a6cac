"""Stage 2, `moegen.validate`: the experts' activation parameters (layer.glu) and the shared
expert's gate, each refused where it would silently do nothing."""

from __future__ import annotations

from validate_cases import (
    KEY,
    VALUE,
    Cases,
    rule_tests,
)

GLU_ON_RELU = (
    "activation relu has no gate: glu's clamps, scale and offset shape act(gate) * (up + "
    "offset) of swiglu or geglu; remove glu or use activation: swiglu"
)

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "glu_needs_a_gated_activation": [
        ({}, []),
        ({"glu": "gpt_oss"}, []),  # swiglu by default
        ({"activation": "geglu", "glu": {"gate_limit": 10.0, "up_limit": 10.0}}, []),
        ({"glu": {"sigmoid_scale": 1.702}}, []),
        (
            {"activation": "relu", "glu": "gpt_oss"},
            [("layer.glu", KEY, GLU_ON_RELU)],
        ),
        (
            {"activation": "geglu", "glu": {"sigmoid_scale": 1.702}},
            [
                (
                    "layer.glu.sigmoid_scale",
                    VALUE,
                    (
                        "geglu's gelu has no sigmoid to scale (it is swiglu's silu(g) = g * "
                        "sigmoid(g)); remove sigmoid_scale or use activation: swiglu"
                    ),
                )
            ],
        ),
        (
            {"glu": {"sigmoid_scale": 1.0, "up_offset": 0.0}},
            [
                (
                    "layer.glu",
                    KEY,
                    (
                        "this glu changes nothing (no clamp, sigmoid_scale 1, up_offset 0); remove "
                        "it, or set gate_limit, up_limit, sigmoid_scale or up_offset"
                    ),
                )
            ],
        ),
    ],
    "shared_expert_gate_needs_a_shared_expert": [
        ({}, []),
        ({"shared_ffn": 64, "shared_expert_gate": True}, []),
        ({"shared_expert_gate": False}, []),
        (
            {"shared_expert_gate": True},
            [
                (
                    "layer.shared_expert_gate",
                    VALUE,
                    (
                        "there is no shared expert to gate; set layer.shared_ffn_dim (its hidden "
                        "width) or remove shared_expert_gate"
                    ),
                )
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
