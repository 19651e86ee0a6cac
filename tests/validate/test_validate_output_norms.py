"""Stage 2, `moegen.validate`: the experts' output norms (layer.expert_output_norm_eps,
layer.shared_output_norm_eps), passing and failing, located; their epsilons' bounds."""

from __future__ import annotations

import pytest
from validate_cases import VALUE, Cases, case_yaml, position, rule_tests

from moegen.diagnostics import SpecError
from moegen.load import load_spec_bytes
from moegen.validate import validate


def _tensor_split(field: str) -> str:
    return (
        "an expert's output norm needs that expert's whole output, but mesh.axes.tensor (2) "
        "splits each expert's FFN columns over 2 devices, each holding a partial sum of the "
        "output until the combined outputs are summed; use an expert or fsdp axis instead of "
        f"tensor (both keep each expert's output whole), or remove layer.{field}"
    )


BOTH = {"expert_output_norm_eps": 1e-6, "shared_output_norm_eps": 1e-6, "shared_ffn": 64}
TENSOR = {"axes": {"data": 2, "tensor": 2}}

CASES: Cases = {
    "shared_output_norm_needs_a_shared_expert": [
        ({}, []),
        (BOTH, []),
        (
            {"shared_output_norm_eps": 1e-6},
            [
                (
                    "layer.shared_output_norm_eps",
                    VALUE,
                    "there is no shared expert whose output it would normalise; set "
                    "layer.shared_ffn_dim (the shared expert's width) or remove "
                    "shared_output_norm_eps",
                )
            ],
        ),
    ],
    "output_norms_see_whole_outputs": [
        (BOTH | {"axes": {"data": 2, "fsdp": 2, "expert": 2}}, []),
        ({"output_norm_eps": 1e-6} | TENSOR, []),  # the layer's output norm runs after the sum
        (
            BOTH | TENSOR,
            [
                ("layer.expert_output_norm_eps", VALUE, _tensor_split("expert_output_norm_eps")),
                ("layer.shared_output_norm_eps", VALUE, _tensor_split("shared_output_norm_eps")),
            ],
        ),
        (
            {"expert_output_norm_eps": 1e-6} | TENSOR,
            [("layer.expert_output_norm_eps", VALUE, _tensor_split("expert_output_norm_eps"))],
        ),
    ],
}

test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


@pytest.mark.parametrize("field", ["expert_output_norm_eps", "shared_output_norm_eps"])
@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("0", "must be > 0, got 0"),
        ("1.5", "must be <= 1, got 1.5"),
        (".nan", "must be a finite number, got nan"),
        ("small", "must be a number, got 'small'"),
    ],
)
def test_a_bad_output_norm_epsilon_is_refused_where_it_is_written(field, written, message):
    choices = BOTH | {field: 0.5}
    text = case_yaml(choices).replace(f"{field}: 0.5", f"{field}: {written}")
    line, column = position(choices, f"layer.{field}")
    with pytest.raises(SpecError) as info:
        validate(load_spec_bytes(text.encode(), "specs/layer.yaml", "layer"))
    assert [d.text() for d in info.value.diagnostics] == [
        f"specs/layer.yaml:{line}:{column}: layer.{field}: {message}"
    ]
