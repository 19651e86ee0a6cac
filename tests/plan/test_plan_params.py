"""Stage 3, `moegen.plan`: the parameter set of each layer feature (gates, biases, shared expert, routing bias) and its FLOPs, bytes, memory and gather traffic, by hand."""

from __future__ import annotations

import math

import pytest
from plan_cases import A2A, RING, feature_plan, param_rows

from moegen.plan import format_plan
from moegen.render import render


def test_params_non_gated_biased_shared_routing_bias_on_fsdp_and_expert() -> None:
    """gelu (no gate), biases, a shared expert of width 96 and a routing bias, with fsdp 2
    and expert 2: expert weights and biases are split along experts (dim 0); every embed
    dim (the router's, b_down's, the shared expert's) along fsdp; routing_bias, b_up (no
    embed dim) are split by neither fsdp nor, for routing_bias, expert."""
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "gelu", "ffn_bias": True, "shared_ffn_dim": 96},
        router={"score": "sigmoid", "routing_bias": True},
        parallelism=A2A,
        compute="bfloat16",
    )
    bf16, f32 = "bfloat16", "float32"
    assert param_rows(plan) == {
        "router": ((64, 8), (32, 8), ("fsdp", None), 0, f32, 1 / 8),
        "routing_bias": ((8,), (8,), (None,), None, f32, 0.0),
        "w_up": ((8, 64, 32), (4, 32, 32), ("expert", "fsdp", None), 1, bf16, 1 / 8),
        "w_down": ((8, 32, 64), (4, 32, 32), ("expert", None, "fsdp"), 2, bf16, 1 / math.sqrt(32)),
        "b_up": ((8, 32), (4, 32), ("expert", None), None, bf16, 0.0),
        "b_down": ((8, 64), (4, 32), ("expert", "fsdp"), 1, bf16, 0.0),
        "shared_up": ((64, 96), (32, 96), ("fsdp", None), 0, bf16, 1 / 8),
        "shared_down": ((96, 64), (96, 32), (None, "fsdp"), 1, bf16, 1 / math.sqrt(96)),
    }
    names = {p.name: p.shape_names for p in plan.params}
    assert names["routing_bias"] == ("NUM_EXPERTS",)
    assert names["b_up"] == ("NUM_EXPERTS", "FFN_DIM")
    assert names["b_down"] == ("NUM_EXPERTS", "EMBED_DIM")
    assert names["shared_up"] == ("EMBED_DIM", "SHARED_FFN_DIM")
    assert names["shared_down"] == ("SHARED_FFN_DIM", "EMBED_DIM")
    assert (plan.ffn.activation, plan.ffn.gated, plan.ffn.bias, plan.ffn.shared_ffn_dim) == (
        "gelu",
        False,
        True,
        96,
    )
    assert plan.router.routing_bias is True
    text = format_plan(plan)
    for p in plan.params:
        spec = "P(" + ", ".join(repr(e) for e in p.partition) + ")"
        assert f"{p.name} " in text
        assert f"spec {spec} -> per device {list(p.local_shape)}" in text


def test_params_gated_biased_shared_on_data_and_fsdp() -> None:
    """swiglu with biases and a shared expert, experts replicated: gate beside up, in the
    routed and in the shared expert; nothing is split along experts."""
    plan = feature_plan(
        axes={"data": 2, "fsdp": 2},
        layer={"activation": "swiglu", "ffn_bias": True, "shared_ffn_dim": 96},
    )
    f32 = "float32"
    expert_in = ((8, 64, 32), (8, 32, 32), (None, "fsdp", None), 1, f32, 1 / 8)
    ffn_bias = ((8, 32), (8, 32), (None, None), None, f32, 0.0)
    shared_in = ((64, 96), (32, 96), ("fsdp", None), 0, f32, 1 / 8)
    assert param_rows(plan) == {
        "router": ((64, 8), (32, 8), ("fsdp", None), 0, f32, 1 / 8),
        "w_gate": expert_in,
        "w_up": expert_in,
        "w_down": ((8, 32, 64), (8, 32, 32), (None, None, "fsdp"), 2, f32, 1 / math.sqrt(32)),
        "b_gate": ffn_bias,
        "b_up": ffn_bias,
        "b_down": ((8, 64), (8, 32), (None, "fsdp"), 1, f32, 0.0),
        "shared_gate": shared_in,
        "shared_up": shared_in,
        "shared_down": ((96, 64), (96, 32), (None, "fsdp"), 1, f32, 1 / math.sqrt(96)),
    }
    assert plan.ffn.gated is True


@pytest.mark.parametrize(
    ("activation", "names"),
    [
        ("swiglu", ["router", "w_gate", "w_up", "w_down"]),
        ("geglu", ["router", "w_gate", "w_up", "w_down"]),
        ("gelu", ["router", "w_up", "w_down"]),
        ("relu", ["router", "w_up", "w_down"]),
    ],
)
def test_only_gated_activations_have_a_gate(activation: str, names: list[str]) -> None:
    plan = feature_plan(layer={"activation": activation})
    assert [p.name for p in plan.params] == names
    assert plan.ffn.gated is (activation in ("swiglu", "geglu"))
    assert plan.summary.startswith(f"MoE layer: 8 {activation} experts ")


@pytest.mark.parametrize(
    ("activation", "ffn", "fused"),
    [
        ("swiglu", 256, True),  # whole 128-lane tiles: up starts on a tile
        ("geglu", 384, True),
        ("swiglu", 2880, False),  # gpt-oss: up would start mid-tile, XLA would copy it out
        ("swiglu", 32, False),
        ("gelu", 256, False),  # no gate
        ("relu", 256, False),
    ],
)
def test_gate_and_up_side_by_side_when_up_starts_on_a_lane_tile(
    activation: str, ffn: int, fused: bool
) -> None:
    plan = feature_plan(ffn=ffn, layer={"activation": activation})  # no fsdp
    assert plan.ffn.fuses_gate_up is fused
    gated = activation in ("swiglu", "geglu")
    assert plan.ffn.grouped_matmul_sites == (3 if gated and not fused else 2)
    source = render(plan)
    assert ('weights["w_gate_up"]' in source) is fused
    assert ('weights["w_gate"]' in source) is (gated and not fused)


def test_gate_and_up_stay_apart_when_fsdp_gathers_the_whole_weights() -> None:
    """Gathered whole, fused gate and up weights and gradients are one buffer each (measured
    heavier); gathered per FFN slice they are small, and one row gradient per slice is not."""
    whole = feature_plan(ffn=256, axes={"fsdp": 2})
    assert (whole.ffn.fuses_gate_up, whole.ffn.grouped_matmul_sites) == (False, 3)
    assert 'weights["w_gate"]' in render(whole)
    sliced = feature_plan(ffn=256, axes={"fsdp": 2}, memory={"ffn_chunks": 2})
    assert (sliced.ffn.fuses_gate_up, sliced.ffn.grouped_matmul_sites) == (True, 2)
    source = render(sliced)
    assert '"w_gate_up": jax.lax.all_gather(' in source
    assert 'jnp.concatenate([columns("w_gate", 2), columns("w_up", 2)], axis=2)' in source
    ledger = dict(sliced.memory.ledger)
    row_block = sliced.experts.ffn_rows * 64 * 4  # kernel xla: no row padding
    assert ledger["the slice's row gradients"] == row_block  # one call reads the rows
    apart = feature_plan(ffn=64, axes={"fsdp": 2}, memory={"ffn_chunks": 2})  # 32-lane slices
    assert not apart.ffn.fuses_gate_up
    assert (
        dict(apart.memory.ledger)["the slice's row gradients"]
        == 2 * apart.experts.ffn_rows * 64 * 4
    )


def test_params_relu_on_the_expert_axis_alone() -> None:
    """No fsdp: nothing is gathered; the expert axis splits only the routed experts."""
    plan = feature_plan(
        axes={"expert": 4},
        layer={"activation": "relu", "ffn_bias": True, "shared_ffn_dim": 48},
        parallelism=RING,
    )
    f32 = "float32"
    assert param_rows(plan) == {
        "router": ((64, 8), (64, 8), (None, None), None, f32, 1 / 8),
        "w_up": ((8, 64, 32), (2, 64, 32), ("expert", None, None), None, f32, 1 / 8),
        "w_down": ((8, 32, 64), (2, 32, 64), ("expert", None, None), None, f32, 1 / math.sqrt(32)),
        "b_up": ((8, 32), (2, 32), ("expert", None), None, f32, 0.0),
        "b_down": ((8, 64), (2, 64), ("expert", None), None, f32, 0.0),
        "shared_up": ((64, 48), (64, 48), (None, None), None, f32, 1 / 8),
        "shared_down": ((48, 64), (48, 64), (None, None), None, f32, 1 / math.sqrt(48)),
    }


def test_costs_non_gated_with_shared_expert_by_hand() -> None:
    """gelu experts (up, down), a shared expert of width 96, fsdp 2 x expert 2, bfloat16
    compute, float32 storage: 4 sequences of 64 = 256 tokens a device, 512 routed copies."""
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "gelu", "ffn_bias": True, "shared_ffn_dim": 96},
        router={"score": "sigmoid", "routing_bias": True},
        parallelism=A2A,
        compute="bfloat16",
    )
    c = plan.cost
    assert (plan.local_tokens, plan.routed_rows) == (256, 512)
    assert c.router_flops == 262_144  # 2 * 256 * 64 * 8
    assert c.expert_flops == 4_194_304  # 2 matmuls x 2 * 512 * 64 * 32
    assert c.shared_expert_flops == 6_291_456  # 2 matmuls x 2 * 256 * 64 * 96
    assert c.forward_flops == 10_747_904
    assert c.train_flops == 32_243_712
    # a row and its output [64] each, up and hidden [32] each, 2 bytes: 384
    assert c.routed_row_bytes == 384
    assert c.routed_buffer_bytes == 512 * 384
    assert c.shared_activation_bytes == 98_304  # 256 tokens x (up, hidden) x 96 x 2 bytes
    # local elements: router 256, routing_bias 8, w_up 4096, w_down 4096, b_up 128,
    # b_down 128, shared_up 3072, shared_down 3072 = 14856, float32
    assert c.param_bytes == 59_424
    # in use: router 2 * 256 * 4, routing_bias 8 * 4, w_up and w_down 2 * 4096 * 2 each,
    # b_up 128 * 2, b_down 2 * 128 * 2, shared_up and shared_down 2 * 3072 * 2 each
    assert c.gathered_weight_bytes == 60_192
    assert c.activation_bytes == 65_536  # input and output, 256 x 64 x 2 bytes
    assert "shared expert 6.291e+06, " in format_plan(plan)


def test_costs_gated_with_shared_expert_by_hand() -> None:
    """The same layer with swiglu: a third matmul, in the routed and the shared expert."""
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "swiglu", "shared_ffn_dim": 96},
        parallelism=A2A,
        compute="bfloat16",
    )
    c = plan.cost
    assert c.expert_flops == 6_291_456  # 3 x 2 * 512 * 64 * 32
    assert c.shared_expert_flops == 9_437_184  # 3 x 2 * 256 * 64 * 96
    assert c.forward_flops == 262_144 + 6_291_456 + 9_437_184
    assert c.routed_row_bytes == 448  # (2 * 64 + 3 * 32) * 2
    assert c.shared_activation_bytes == 147_456  # 256 x (gate, up, hidden) x 96 x 2


def test_costs_without_shared_expert_have_none() -> None:
    plan = feature_plan(layer={"activation": "relu"})
    c = plan.cost
    assert (c.shared_expert_flops, c.shared_activation_bytes) == (0, 0)
    assert c.expert_flops == 4 * 1024 * 64 * 32  # up and down only
    assert c.forward_flops == c.router_flops + c.expert_flops
    assert "shared expert" not in format_plan(plan)
    # the fixed 4, the peak's buffers, activations, packing, the weights kept for the backward
    assert len(plan.memory.ledger) == 8
    assert "expert weights in the compute dtype, kept for the backward pass" in dict(
        plan.memory.ledger
    )


def test_memory_ledger_with_shared_expert_by_hand() -> None:
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "gelu", "ffn_bias": True, "shared_ffn_dim": 96},
        router={"score": "sigmoid", "routing_bias": True},
        parallelism=A2A,
        compute="bfloat16",
    )
    # ragged_all_to_all: 2 devices' 512 tokens x min(top 2, 4 local experts) = 1024 rows
    assert (plan.experts.ffn_rows, plan.kernel.config) == (1024, None)
    row_block = 1024 * 64 * 2  # [rows, D] bfloat16
    activation = 1024 * 32 * 2  # [rows, F] bfloat16
    x = 256 * 64 * 2
    router = 256 * 8 * 4 * 3
    params, gathered = 59_424, 60_192
    # the shared expert is inside the packing (bench/LEDGER.md); exchanged, one up call:
    # 4 + 1 [rows, D] at the row gradient, more than the weights at the weight gradients
    assert 5 * row_block > gathered + params // 2
    temporaries = 5 * row_block + 2 * activation  # gelu: up kept, the hidden gradient
    assert dict(plan.memory.ledger) == {
        "parameters (stored shards)": params,
        "parameter gradients (stored shards)": params,
        "[rows, D] buffers at the row gradient (5 x [rows, 64])": 5 * row_block,
        "FFN activations and gradients at the backward peak (2 x [rows, 32])": 2 * activation,
        "XLA's packing of the temporaries (+15%)": int(0.15 * temporaries),
        "layer input and its gradient": 2 * x,
        "router logits, scores and their gradients": router,
    }
    # forward: the FFN is narrower than D, so its activations fit where rows were; two
    # [rows, D] are as large as the rows beside up and the up bias per row (the hidden is
    # written over up); one gathered weight beside them, +14%
    assert 2 * row_block == row_block + 2 * activation
    forward = int(1.14 * (2 * row_block + gathered // 2))
    assert plan.memory.forward_peak == params + 2 * x + router // 3 + forward
    assert plan.memory.train_peak == sum(dict(plan.memory.ledger).values())


def test_gather_traffic_counts_only_gathered_parameters() -> None:
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "gelu", "ffn_bias": True, "shared_ffn_dim": 96},
        router={"score": "sigmoid", "routing_bias": True},
        parallelism=A2A,
        compute="bfloat16",
    )
    # the other fsdp shard of: router 256 x 4 B, w_up and w_down 4096 x 2 B each,
    # b_down 128 x 2 B, shared_up and shared_down 3072 x 2 B each
    assert plan.cost.gather_bytes_received == 29_952


@pytest.mark.parametrize(
    ("activation", "check_vma"),
    [("swiglu", True), ("relu", True), ("gelu", False), ("geglu", False)],
)
def test_erf_activations_turn_the_varying_axes_check_off(activation: str, check_vma: bool):
    plan = feature_plan(layer={"activation": activation})
    assert plan.kernel.check_vma is check_vma
    assert plan.kernel.vma_unchecked_reason == (
        "" if check_vma else "XLA's erf polynomial carries no varying-axes types"
    )


def test_output_norm_is_a_replicated_weight_applied_to_the_whole_output() -> None:
    """layer.output_norm_eps (A.X-K1's post_mlp_layernorm): one [D] weight, last, replicated
    over fsdp and tensor alike, float32, starting at one; the module normalises y after the
    tensor sum, in float32. A spec without it has none of this."""
    choices = dict(axes={"fsdp": 2, "tensor": 2}, compute="bfloat16")
    layer = {"shared_ffn_dim": 32}
    plan = feature_plan(layer=layer | {"output_norm_eps": 1e-5}, **choices)
    assert plan.params[-1].name == "output_norm"
    assert param_rows(plan)["output_norm"] == ((64,), (64,), (None,), None, "float32", 0.0)
    assert plan.init.ones == ("output_norm",) and plan.params[-1].init_ones
    assert plan.ffn.output_norm_eps == 1e-5 and plan.router.rms_norm
    source = render(plan)
    assert "OUTPUT_NORM_EPS = 1e-05  # the layer's output RMSNorm" in source
    tensor_sum = source.index("y = jax.lax.psum(y, TENSOR_AXIS)")
    norm = source.index("y = (_rms_norm(y.astype(jnp.float32), OUTPUT_NORM_EPS)")
    assert tensor_sum < norm < source.index("aux = Aux(")
    assert "def _rms_norm(" in source

    plain = feature_plan(layer=layer, **choices)
    assert "output_norm" not in {p.name for p in plain.params}
    assert plain.ffn.output_norm_eps is None and not plain.router.rms_norm
    assert "OUTPUT_NORM" not in render(plain) and "_rms_norm" not in render(plain)
