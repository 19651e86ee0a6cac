"""Stage 3, `moegen.plan`: the router in the plan: capacity and drop policy per expert strategy, group-limited routing, scaling, bias and losses, and their defaults."""

from __future__ import annotations

import pytest
from plan_cases import A2A, RING, capacity, feature_plan, tokens_line

from moegen.plan import format_plan


def test_dropless_plan_has_no_capacity() -> None:
    plan = feature_plan()
    assert (plan.router.capacity, plan.router.drop_policy, plan.experts.capacity) == (
        None,
        None,
        None,
    )
    # data=2: 8 of 16 sequences of 64 tokens per device, top-2
    assert (plan.local_tokens, plan.routed_rows, plan.experts.ffn_rows) == (512, 1024, 1024)
    assert "(x top_2, dropless)" in tokens_line(plan)


@pytest.mark.parametrize(
    ("factor", "expected_capacity", "expected_rows"),
    [
        # 512 tokens x top-2 = 1024 copies over 8 experts: 128 copies an expert on average
        (1.25, 160, 1024),  # 8 * 160 = 1280 slots > 1024 copies: nothing to cut
        (1.0, 128, 1024),  # exactly as many slots as copies
        (0.5, 64, 512),  # 8 * 64
        (0.3, 39, 312),  # ceil(38.4) = 39; 8 * 39
        (0.001, 1, 8),  # ceil(0.128): at least one copy an expert
    ],
)
def test_capacity_replicated(factor: float, expected_capacity: int, expected_rows: int) -> None:
    plan = feature_plan(router=capacity(factor, "position"))
    assert plan.router.capacity == plan.experts.capacity == expected_capacity
    assert plan.router.drop_policy == "position"
    assert (plan.experts.ffn_rows, plan.kernel.config) == (expected_rows, None)  # no padding
    # routed_rows counts every chosen copy, before dropping; so do the FLOPs (an upper bound)
    assert plan.routed_rows == 1024
    assert plan.cost.expert_flops == 6 * 1024 * 64 * 32
    assert (
        f"(x top_2, at most {expected_capacity} per expert kept, drop by position)"
        in tokens_line(plan)
    )
    assert f"capacity factor {factor:g} (drop by position)" in plan.summary


def test_capacity_drop_policy_defaults_to_probability() -> None:
    plan = feature_plan(router={"load_balance_loss": 0.01, "capacity": {"factor": 2}})
    assert (plan.router.capacity, plan.router.drop_policy) == (
        256,
        "probability",
    )  # ceil(2 * 1024 / 8)


@pytest.mark.parametrize(
    ("factor", "expected_capacity", "expected_rows"),
    [
        # data 2 x expert 4: 128 tokens a device, 256 copies over 8 experts: C = ceil(32 f).
        # Dropless bound: 4 devices' 512 tokens, each sending min(top 2, 2 local experts) = 2
        # copies to this device: 1024 rows. With C: 4 source devices x 2 experts x C.
        (1.0, 32, 256),
        (0.3, 10, 80),  # ceil(9.6) = 10
        (4.0, 128, 1024),  # 4 * 2 * 128 = 1024: both bounds meet
        (5.0, 160, 1024),  # 1280 > 1024: the dropless bound holds
    ],
)
def test_capacity_ragged_all_to_all(
    factor: float, expected_capacity: int, expected_rows: int
) -> None:
    plan = feature_plan(axes={"data": 2, "expert": 4}, router=capacity(factor), parallelism=A2A)
    e = plan.experts
    assert (plan.local_tokens, e.local_experts, e.group_tokens) == (128, 2, 512)
    assert e.capacity == expected_capacity
    assert (e.ffn_rows, e.receive_rows, e.ffn_calls) == (expected_rows, expected_rows, 1)
    assert (plan.experts.ffn_rows, plan.kernel.config) == (expected_rows, None)


@pytest.mark.parametrize(
    ("factor", "expected_capacity", "expected_rows"),
    [
        # expert 4 alone: 256 tokens a device, top-4 of 16 experts: 1024 copies, C = ceil(64 f).
        # Dropless: 4 x 256 tokens x min(4, 4 local experts) = 4096 rows; with C, 4 x 4 x C.
        (1.0, 64, 1024),
        (2.0, 128, 2048),
        (0.1, 7, 112),  # ceil(6.4) = 7
        (20.0, 1280, 4096),
    ],
)
def test_capacity_ring_of_experts(factor: float, expected_capacity: int, expected_rows: int):
    plan = feature_plan(
        experts=16, top_k=4, axes={"expert": 4}, router=capacity(factor), parallelism=RING
    )
    e = plan.experts
    assert (plan.local_tokens, e.local_experts, e.group_tokens) == (256, 4, 1024)
    assert (e.capacity, e.ffn_rows, e.ffn_calls, e.receive_rows) == (
        expected_capacity,
        expected_rows,
        1,
        0,
    )


@pytest.mark.parametrize(
    ("experts", "top_k", "factor", "expected_capacity", "expected_rows"),
    [
        # expert 4, 2 chunks: each ring step runs one device's 256 tokens. 16 experts, top 4:
        # 4 local, 256 x 4 = 1024 rows dropless; C = ceil(64 f), 4 local experts x C
        (16, 4, 1.0, 64, 256),
        (16, 4, 0.1, 7, 28),
        (16, 4, 8.0, 512, 1024),  # 4 x 512 = 2048 > 1024
        # 8 experts, top 4: 2 local, so a token sends at most 2 copies: 512 rows;
        # C = ceil(f * 1024 / 8) = ceil(128 f), 2 x C
        (8, 4, 1.0, 128, 256),
        (8, 4, 3.0, 384, 512),
    ],
)
def test_capacity_chunked_ring_of_experts(
    experts: int, top_k: int, factor: float, expected_capacity: int, expected_rows: int
) -> None:
    plan = feature_plan(
        experts=experts,
        top_k=top_k,
        axes={"expert": 4},
        router=capacity(factor),
        parallelism={**RING, "overlap_chunks": 2},
    )
    e = plan.experts
    assert plan.local_tokens == 256
    assert (e.capacity, e.ffn_rows, e.ffn_calls) == (expected_capacity, expected_rows, 4)


def test_capacity_is_exact_for_decimal_factors() -> None:
    # data 2: 8 sequences of 375 tokens = 3000 tokens a device, top-2: 6000 copies
    plan = feature_plan(seq=375, router=capacity(1.1))
    assert plan.local_tokens == 3000
    assert plan.router.capacity == 825  # 1.1 * 6000 / 8 = 11 * 600 / 8 = 825 exactly


def test_plan_text_under_a_capacity_does_not_say_dropless() -> None:
    # data 2 x expert 4, factor 1: C = 32, rows 4 x 2 x 32 = 256 (dropless bound 1024)
    plan = feature_plan(axes={"data": 2, "expert": 4}, router=capacity(1.0), parallelism=A2A)
    assert plan.experts.ffn_rows == 256
    text = format_plan(plan)
    [rows_line] = [line for line in text.splitlines() if "expert FFN rows" in line]
    [receive_line] = [line for line in text.splitlines() if "receive buffer" in line]
    assert "dropless" not in rows_line, rows_line
    assert "every token of the expert group" not in receive_line, receive_line


def test_router_settings_reach_the_plan() -> None:
    """DeepSeek-V3's router on 64 experts: 8 groups of 8, the best 4 kept, each ranked by
    the sum of its top 8 / 4 = 2 scores."""
    plan = feature_plan(
        experts=64,
        top_k=8,
        layer={"shared_ffn_dim": 64},
        router={
            "score": "sigmoid",
            "renormalize": True,
            "routed_scaling": 2.5,
            "group_limit": {"groups": 8, "keep": 4},
            "routing_bias": True,
            "z_loss": 0.001,
        },
    )
    assert (plan.router.expert_groups, plan.router.kept_groups) == (8, 4)
    assert (plan.router.group_top_k, plan.router.experts_per_group) == (2, 8)
    assert (plan.router.routed_scaling, plan.router.routing_bias) == (2.5, True)
    assert (plan.router.load_balance_weight, plan.router.z_loss_weight) == (0.0, 0.001)
    assert plan.router.score_after_top_k is False
    assert plan.global_tokens == 16 * 64
    assert plan.summary.startswith(
        "MoE layer: 64 swiglu experts (embed 64, ffn 32, shared expert ffn 64), top-8 sigmoid "
        "routing in 4 of 8 groups, renormalised, scaled by 2.5, balancing bias, z-loss 0.001, "
        "replicated experts, on a data 2 mesh"
    )


def test_router_defaults_in_the_plan() -> None:
    plan = feature_plan()
    assert (
        plan.router.expert_groups,
        plan.router.kept_groups,
        plan.router.group_top_k,
        plan.router.experts_per_group,
    ) == (
        None,
        None,
        None,
        None,
    )
    assert (
        plan.router.routed_scaling,
        plan.router.routing_bias,
        plan.router.score_after_top_k,
    ) == (1.0, False, False)
    assert (plan.router.load_balance_weight, plan.router.z_loss_weight) == (0.0, 0.0)
    assert (plan.ffn.bias, plan.ffn.shared_ffn_dim, plan.ffn.gated) == (False, None, True)
