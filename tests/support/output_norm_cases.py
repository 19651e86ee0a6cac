"""The layer's output norm (A.X-K1's post_mlp_layernorm) in tests/verify/test_router_features.py:
the sum of the routed and shared experts RMS-normalised, times a learned weight. One case per
way a token's output is put together before the norm sees it: whole on its device (replicated,
the all-to-all under fsdp), after the tensor sum (with a shared expert's bias kept on one
shard), the ring, token chunks and FFN slices, identity experts' tokens added, bfloat16; and
the Pallas kernel, where shard_map's varying-axes check is off."""

from __future__ import annotations

from router_feature_cases import A2A, RING

NORM = 'y = (_rms_norm(y.astype(jnp.float32), OUTPUT_NORM_EPS) * weights["output_norm"])'
AXK1 = {
    "num_experts": 16,
    "embed_dim": 32,
    "ffn_dim": 48,
    "shared_ffn_dim": 48,
    "output_norm_eps": 0.01,  # large enough to count at the twins' sizes
}
V3_ROUTER = {
    "top_k": 4,
    "score": "sigmoid",
    "renormalize": True,
    "routed_scaling": 2.5,
    "group_limit": {"groups": 4, "keep": 2},
    "routing_bias": True,
}

OUTPUT_NORM_CASES: dict[str, tuple[dict, list[str]]] = {
    "output_norm_axk1_a2a_fsdp": (
        {"layer": AXK1, "router": V3_ROUTER, "mesh": {"axes": {"fsdp": 2, "expert": 2}}, **A2A},
        [NORM, "OUTPUT_NORM_EPS = 0.01", 'INIT_ONES = ("output_norm",)'],
    ),
    "output_norm_tensor_shared_biases_losses": (
        {
            "layer": {**AXK1, "shared_ffn_bias": True},
            "router": {**V3_ROUTER, "load_balance_loss": 0.01, "z_loss": 0.001},
            "mesh": {"axes": {"data": 2, "tensor": 2}},
        },
        [NORM, "complete here (after the tensor sum)"],
    ),
    "output_norm_ring_token_chunks_ffn_slices": (
        {
            "layer": AXK1,
            "router": V3_ROUTER,
            "mesh": {"axes": {"expert": 2}},
            "memory": {"token_chunks": 2, "ffn_chunks": 2},
            **RING,
        },
        [NORM, "TOKEN_CHUNKS = 2"],
    ),
    # identity experts' tokens added to the routed output: the norm sees the sum
    "output_norm_identity_experts_no_shared": (
        {
            "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "output_norm_eps": 1e-6},
            "router": {"top_k": 2, "identity_experts": 2, "routing_bias": True},
        },
        [NORM, "identity = identity_weights[:, None] * tokens"],
    ),
    "output_norm_bfloat16_sequence": (
        {
            "layer": AXK1,
            "router": V3_ROUTER,
            "dtypes": {"params": "float32", "compute": "bfloat16"},
            "mesh": {"axes": {"sequence": 2, "expert": 2}},
            **A2A,
        },
        [NORM],
    ),
    "output_norm_pallas_tensor": (
        {
            "layer": AXK1,
            "router": V3_ROUTER,
            "mesh": {"axes": {"expert": 2, "tensor": 2}},
            "target": {"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"},
            **A2A,
        },
        [NORM, "check_vma=False"],
    ),
}
