"""Identity (zero-computation) experts in tests/verify/test_router_features.py: LongCat-Flash's
router scores more columns than there are experts, and a copy routed past the experts returns
its token. One case per path a copy of "no expert" takes: each strategy, the tensor sum it
must stay out of, token chunks, input weighting, a sequence axis, bfloat16."""

from __future__ import annotations

from router_feature_cases import A2A, RING

# LongCat-Flash's router: softmax over experts and identity experts, a selection bias on the
# scores, no renormalisation, the weights scaled
LONGCAT = {"top_k": 3, "identity_experts": 4, "routing_bias": True, "routed_scaling": 6.0}
ZERO = "_split_zero_computation(combine_weights, expert_ids)"
SPLIT = "identity = identity_weights[:, None] * tokens"  # and the identity copies' tokens

IDENTITY_CASES: dict[str, tuple[dict, list[str]]] = {
    "identity_experts_replicated": ({"router": LONGCAT}, [SPLIT, "ROUTER_COLUMNS = 12"]),
    "identity_experts_tensor_shared_replicated": (
        {
            "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "shared_ffn_dim": 16},
            "router": LONGCAT,
            "mesh": {"axes": {"data": 2, "tensor": 2}},
        },
        [SPLIT, "(once: after the tensor sum)"],
    ),
    "identity_experts_a2a_sequence_sigmoid": (
        {
            "router": {
                "top_k": 2,
                "score": "sigmoid",
                "renormalize": True,
                "identity_experts": 2,
                "z_loss": 0.001,
            },
            "mesh": {"axes": {"sequence": 2, "expert": 2}},
            **A2A,
        },
        [SPLIT],
    ),
    "identity_experts_ring_input_weighting_token_chunks": (
        {
            "router": {"top_k": 2, "identity_experts": 8, "weighting": "input"},
            "mesh": {"axes": {"expert": 2}},
            "memory": {"token_chunks": 2},
            **RING,
        },
        [SPLIT, "TOKEN_CHUNKS = 2"],
    ),
    # zero experts (MoE++): their copies contribute nothing, their weights still renormalise
    "zero_experts_replicated_renormalised": (
        {"router": {"top_k": 2, "renormalize": True, "zero_experts": 4}},
        [ZERO, "ZERO_EXPERTS = 4"],
    ),
    "identity_and_zero_experts_ring_sigmoid": (
        {
            "router": {
                "top_k": 3,
                "score": "sigmoid",
                "renormalize": True,
                "routing_bias": True,
                "identity_experts": 2,
                "zero_experts": 2,
            },
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **RING,
        },
        [SPLIT, "IDENTITY_EXPERTS + ZERO_EXPERTS"],
    ),
    "identity_experts_a2a_bf16_biases": (
        {
            "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "ffn_bias": True},
            "router": {**LONGCAT, "linear_bias": True},
            "dtypes": {"params": "float32", "compute": "bfloat16"},
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **A2A,
        },
        [SPLIT, 'weights["router_bias"]'],
    ),
}
