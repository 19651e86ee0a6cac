"""moegen.plan.combine: where the combine weights apply (the hidden rows before the down
projection, or the output rows after it) and which paths take gather gradients."""

from __future__ import annotations

import pytest
from spec_builder import spec_yaml, tiny, validated

from moegen.plan import make_plan
from moegen.render import render

# Fine-grained (FFN narrower than embed), replicated, every copy kept: weights on the hidden rows.
NARROW = {"embed": 128, "ffn": 64, "axes": {"data": 2}}


def _plan(**changes):
    return make_plan(validated(spec_yaml(tiny(**(NARROW | changes))), "spec.yaml", "spec"))


def test_a_narrow_ffn_weighs_its_hidden_rows_and_sums_the_copies() -> None:
    plan = _plan()
    assert (plan.experts.combine.weights_on_hidden, plan.experts.combine.gather_gradients) == (
        True,
        True,
    )
    source = render(plan)
    assert "hidden = _weigh_hidden(" in source
    assert "y = out.sum(axis=1, dtype=jnp.float32)" in source
    assert "jnp.einsum(" not in source
    assert "_permute(out, inverse, order)" in source


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"ffn": 256}, "the hidden rows (256) are wider than the output rows (128)"),
        ({"ffn_bias": True}, "a down bias is added after the projection"),
        ({"weighting": "input"}, "the combine weights scale the experts' input"),
        ({"expert_output_norm_eps": 1e-6}, "each expert's output is normalised"),
        ({"ffn_chunks": 2}, "the FFN runs in slices"),
        (
            {"hardware": "gpu-h100", "topology": 2, "kernel": "xla"},
            "measured on TPU only",
        ),
    ],
)
def test_the_weights_stay_on_the_outputs_where_moving_them_changes_or_costs(changes, why):
    plan = _plan(**changes)
    assert not plan.experts.combine.weights_on_hidden
    assert why in plan.experts.combine.why
    assert not plan.experts.combine.gather_gradients  # they go with the weights
    source = render(plan)
    assert "_weigh_hidden" not in source and "_permute(" not in source
    assert 'jnp.einsum("tkd,tk->td", out, combine_weights' in source


@pytest.mark.parametrize(
    "changes",
    [
        {"strategy": "ragged_all_to_all", "axes": {"data": 2, "expert": 2}},
        {"capacity": (1.0, "probability"), "load_balance_loss": 0.01},
    ],
    ids=["another strategy", "copies dropped"],
)
def test_other_paths_keep_their_combine(changes) -> None:
    plan = _plan(**changes)
    combine = plan.experts.combine
    assert not combine.weights_on_hidden and not combine.gather_gradients
    assert "_permute(" not in render(plan)


def test_a_pin_moves_the_weights_only_where_the_sum_is_the_same() -> None:
    wide = validated(spec_yaml(tiny(**(NARROW | {"ffn": 256}))), "spec.yaml", "spec")
    assert make_plan(wide, weights_on_hidden=True).experts.combine.weights_on_hidden
    narrow = validated(spec_yaml(tiny(**NARROW)), "spec.yaml", "spec")
    assert not make_plan(narrow, weights_on_hidden=False).experts.combine.weights_on_hidden
    biased = validated(spec_yaml(tiny(**(NARROW | {"ffn_bias": True}))), "spec.yaml", "spec")
    assert not make_plan(biased, weights_on_hidden=True).experts.combine.weights_on_hidden
