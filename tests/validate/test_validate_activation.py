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

GATE_SOFTCAP = (
    "gate_softcap caps the linear factor g of swiglu's g * sigmoid(g), with the sigmoid "
    "unscaled; {}, or remove gate_softcap"
)
GATE_SOFTCAP_ON_SCALED_SWIGLU = GATE_SOFTCAP.format("remove sigmoid_scale")
GATE_SOFTCAP_ON_GEGLU = GATE_SOFTCAP.format("use activation: swiglu without sigmoid_scale")
CLAMP_WITHOUT_LIMIT = (
    "gate_clamp says where gate_limit clamps, and this {} has no gate_limit; set gate_limit "
    "or remove gate_clamp"
)
NO_SHARED = (
    "there is no shared expert; set layer.shared_ffn_dim (its hidden width) or remove shared_glu"
)
SAME_GLU = "the shared expert already uses these parameters (those of layer.glu); remove shared_glu"

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
        ({"glu": {"gate_limit": 7.0, "gate_clamp": "after_activation"}}, []),
        ({"glu": {"gate_softcap": 10.0, "up_softcap": 10.0}}, []),  # Inkling2
        (
            {"glu": {"gate_softcap": 10.0, "sigmoid_scale": 1.702}},
            [("layer.glu.gate_softcap", VALUE, GATE_SOFTCAP_ON_SCALED_SWIGLU)],
        ),
        (
            {"activation": "geglu", "glu": {"gate_softcap": 10.0}},
            [("layer.glu.gate_softcap", VALUE, GATE_SOFTCAP_ON_GEGLU)],
        ),
        (
            {"glu": {"up_limit": 7.0, "gate_clamp": "after_activation"}},
            [("layer.glu.gate_clamp", VALUE, CLAMP_WITHOUT_LIMIT.format("glu"))],
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
    "shared_glu_has_a_shared_expert_to_change": [
        ({"shared_ffn": 64, "glu": "gpt_oss", "shared_glu": "plain"}, []),  # HY-V4
        (  # Step 3.7: routed at 7, shared at 16, both after the activation
            {
                "shared_ffn": 64,
                "glu": {"gate_limit": 7.0, "up_limit": 7.0, "gate_clamp": "after_activation"},
                "shared_glu": {
                    "gate_limit": 16.0,
                    "up_limit": 16.0,
                    "gate_clamp": "after_activation",
                },
            },
            [],
        ),
        ({"shared_ffn": 64, "shared_glu": {"up_limit": 3.0}}, []),  # the shared one alone
        ({"glu": "gpt_oss", "shared_glu": "plain"}, [("layer.shared_glu", KEY, NO_SHARED)]),
        ({"shared_ffn": 64, "shared_glu": "plain"}, [("layer.shared_glu", KEY, SAME_GLU)]),
        (
            {"shared_ffn": 64, "glu": "gpt_oss", "shared_glu": "gpt_oss"},
            [("layer.shared_glu", KEY, SAME_GLU)],
        ),
        (
            {"shared_ffn": 64, "activation": "relu", "shared_glu": {"up_limit": 3.0}},
            [
                (
                    "layer.shared_glu",
                    KEY,
                    "activation relu has no gate to clamp or scale; remove shared_glu",
                )
            ],
        ),
        (
            {"shared_ffn": 64, "shared_glu": {"gate_clamp": "after_activation"}},
            [("layer.shared_glu.gate_clamp", VALUE, CLAMP_WITHOUT_LIMIT.format("shared_glu"))],
        ),
    ],
    "gelu_approximation_needs_a_gelu": [
        ({"activation": "geglu", "gelu_approximation": "tanh"}, []),
        ({"activation": "gelu", "gelu_approximation": "tanh"}, []),
        ({"gelu_approximation": "none"}, []),
        (
            {"gelu_approximation": "tanh"},
            [
                (
                    "layer.gelu_approximation",
                    VALUE,
                    "activation swiglu has no GELU to approximate; use activation: geglu (or "
                    "gelu) with it, or remove gelu_approximation",
                )
            ],
        ),
    ],
    "shared_expert_gate_needs_a_shared_expert": [
        ({}, []),
        ({"shared_ffn": 64, "shared_expert_gate": True}, []),
        ({"shared_expert_gate": False}, []),
        ({"shared_ffn": 64, "shared_ffn_bias": True}, []),
        (
            {"shared_ffn_bias": True},
            [
                (
                    "layer.shared_ffn_bias",
                    VALUE,
                    (
                        "there is no shared expert to give biases to; set layer.shared_ffn_dim "
                        "(its hidden width) or remove shared_ffn_bias"
                    ),
                )
            ],
        ),
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
