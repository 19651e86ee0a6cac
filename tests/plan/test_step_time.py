"""moegen.plan.step_time: the plan's time of each memory trade, as the routed path runs it,
against the chip's (bench/trade_time: one-chip layers timed on a TPU v5e)."""

from __future__ import annotations

import json

import pytest

from bench.trade_time.layers import VARIANTS, layer_tree, planned
from bench.trade_time.report import HERE, TOLERANCE, measured, rows
from moegen.plan.step_time import StepShape, step_time

V5E = (197e12, 819e9)
# (family, params dtype) one chip holds at 4096 tokens with its trades
LAYERS = [
    ("qwen3_30b_a3b", "float32"),
    ("qwen3_30b_a3b", "bfloat16"),
    ("olmoe", "float32"),
    ("mixtral_8x7b", "bfloat16"),
    ("qwen15_moe_a27b", "bfloat16"),
]


def _plan(family: str, params: str, variant: str, tokens: int = 4096):
    got = planned(f"{family}_{variant}", layer_tree(family, params, tokens, VARIANTS[variant]))
    assert got is not None, (family, params, variant)
    return got[1]


def _shape(**changes) -> StepShape:
    base = dict(
        tokens=4096,
        routed_rows=32768,
        kernel_rows=32768,
        calls=1,
        experts=64,
        embed=2048,
        ffn=1024,
        matmuls=3,
        compute_bytes=2,
        param_bytes=4,
        token_chunks=1,
        ffn_slices=1,
        whole_forward=False,
        fused_gate_up=True,
        tiles=((512, 1024, 1024), (512, 1024, 1024)),
    )
    return StepShape(**{**base, **changes})


def test_a_target_without_figures_has_no_time() -> None:
    assert step_time(_shape(), 0.0, 0.0).train_s == 0.0


@pytest.mark.parametrize(("family", "params"), LAYERS)
def test_every_trade_costs_more_than_the_layer_whole(family: str, params: str) -> None:
    whole = _plan(family, params, "whole")
    assert whole.roofline.step == whole.roofline.whole_step
    assert 0 < whole.roofline.step.forward_s < whole.roofline.step.train_s
    for variant in ("tc2", "tc4", "fs2", "tc2fs2"):
        if planned(variant, layer_tree(family, params, 4096, VARIANTS[variant])) is None:
            continue  # FFN widths that do not slice (Qwen1.5's 1408 over the lanes)
        plan = _plan(family, params, variant)
        assert plan.roofline.whole_step == whole.roofline.step
        assert plan.roofline.step.train_s > 1.2 * whole.roofline.step.train_s, variant


def test_more_chunks_cost_more_and_each_trade_names_its_steps() -> None:
    two = dict(step_time(_shape(token_chunks=2, calls=2), *V5E).parts)
    four = dict(step_time(_shape(token_chunks=4, calls=4), *V5E).parts)
    whole = dict(step_time(_shape(), *V5E).parts)
    assert sum(four.values()) > sum(two.values()) > sum(whole.values())
    assert "weight gradients summed over chunks" in two and "rows gathered, recomputed" in two
    assert not any("chunks" in name or "recomputed" in name for name in whole)
    sliced = dict(step_time(_shape(ffn_slices=2), *V5E).parts)
    assert {"FFN slices summed", "FFN slices cut out", "gate/up, recomputed"} <= set(sliced)
    backward_only = dict(step_time(_shape(ffn_slices=2, whole_forward=True), *V5E).parts)
    assert "FFN slices summed" not in backward_only  # the forward pass runs whole
    assert "FFN slices summed, backward" in backward_only


def test_bfloat16_weights_used_in_place_need_no_cast() -> None:
    parts = dict(step_time(_shape(param_bytes=2, fused_gate_up=False), *V5E).parts)
    assert parts["weights cast"] == 0.0
    assert dict(step_time(_shape(), *V5E).parts)["weights cast"] > 0.0


def test_a_run_is_read_as_untrusted_input(tmp_path) -> None:
    good = {"layer": "olmoe_f32_t2048", "variant": "tc2", "fwd_ms": 8.5, "fwdbwd_ms": 33.4}
    run = tmp_path / "run.json"
    run.write_text(
        json.dumps(
            {
                "rows": [
                    good,
                    "not a row",
                    {**good, "variant": "tc3"},  # no such trade: left out by rows()
                    {**good, "layer": "x", "fwd_ms": -1.0, "fwdbwd_ms": 2.0},
                    {**good, "layer": "y", "fwd_ms": "8", "fwdbwd_ms": 2.0},
                    {**good, "layer": "../../etc_t9", "variant": "whole"},
                ]
            }
        )
    )
    found = measured([run])
    assert set(found) == {
        ("olmoe_f32_t2048", "tc2"),
        ("olmoe_f32_t2048", "tc3"),
        ("../../etc_t9", "whole"),
    }
    assert rows(found) == []  # no whole layer of olmoe measured; the rest name nothing


def test_the_plan_is_within_its_tolerance_on_the_fresh_hold_out() -> None:
    """Run 3 timed layers no term of the model was read on (other token counts), after the
    model was committed (23ee7b9), with each megablox kernel's own tiles, as the plan now
    chooses them: 19 of its 20 trades within 25% of the measured multiple of the layer
    whole (worst -26%). A change that makes it worse fails here."""
    table = [
        r for r in rows(measured([HERE / "run3_fresh_holdout.json"])) if r["variant"] != "whole"
    ]
    errors = [r["planned_multiple"] / r["measured_multiple"] - 1 for r in table]
    assert len(errors) == 20
    assert sum(abs(e) <= TOLERANCE for e in errors) >= 19
    assert max(abs(e) for e in errors) <= 0.27
