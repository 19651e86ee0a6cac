"""Stage 2, `moegen.validate`: the experts' activation parameters (layer.glu) and the shared
expert's gate, each refused where it would silently do nothing."""

from __future__ import annotations

from validate_cases import rule_tests

GLU_ON_RELU = (
    "activation relu has no gate: glu's clamps, scale and offset shape act(gate) * (up + "
    "offset) of swiglu or geglu; remove glu or use activation: swiglu"
)

# rule name -> [(spec overrides, expected diagnostics: (line, column, field, message))];
# `layer` lines start at line 6, column 3.
CASES: dict[str, list[tuple[dict, list[tuple[int, int, str, str]]]]] = {
    "glu_needs_a_gated_activation": [
        ({}, []),
        ({"layer": ("glu: gpt_oss",)}, []),  # swiglu by default
        ({"layer": ("activation: geglu", "glu: {gate_limit: 10.0, up_limit: 10.0}")}, []),
        ({"layer": ("glu: {sigmoid_scale: 1.702}",)}, []),
        (
            {"layer": ("activation: relu", "glu: gpt_oss")},
            [(7, 3, "layer.glu", GLU_ON_RELU)],
        ),
        (
            {"layer": ("activation: geglu", "glu: {sigmoid_scale: 1.702}")},
            [
                (
                    7,
                    24,
                    "layer.glu.sigmoid_scale",
                    "geglu's gelu has no sigmoid to scale (it is swiglu's silu(g) = g * "
                    "sigmoid(g)); remove sigmoid_scale or use activation: swiglu",
                )
            ],
        ),
        (
            {"layer": ("glu: {sigmoid_scale: 1.0, up_offset: 0.0}",)},
            [
                (
                    6,
                    3,
                    "layer.glu",
                    "this glu changes nothing (no clamp, sigmoid_scale 1, up_offset 0); remove "
                    "it, or set gate_limit, up_limit, sigmoid_scale or up_offset",
                )
            ],
        ),
    ],
    "shared_expert_gate_needs_a_shared_expert": [
        ({}, []),
        ({"layer": ("shared_ffn_dim: 64", "shared_expert_gate: true")}, []),
        ({"layer": ("shared_expert_gate: false",)}, []),
        (
            {"layer": ("shared_expert_gate: true",)},
            [
                (
                    6,
                    23,
                    "layer.shared_expert_gate",
                    "there is no shared expert to gate; set layer.shared_ffn_dim (its hidden "
                    "width) or remove shared_expert_gate",
                )
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
