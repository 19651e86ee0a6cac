"""The experts' latent width (Nemotron-H's moe_latent_size) in tests/verify/test_router_features.py:
each token projected down before it is routed, its experts' weighted sum projected back. One
case per path the latent tokens take: every strategy (the ring overlapped in chunks of the
latent width), the kernels that run on CPU twins, fsdp-gathered projections, a tensor split
(the output bias on one tensor shard), FFN slices, token chunks, redundant experts, the
shared expert, identity experts and input weighting beside it, bfloat16."""

from __future__ import annotations

from router_feature_cases import A2A, RING

IN, OUT = "latent = _latent_in(tokens, weights)", "y = _latent_out(y, weights)"
NEMOTRON = {
    "num_experts": 8,
    "embed_dim": 32,
    "ffn_dim": 48,
    "latent_dim": 16,
    "activation": "relu2",
}
SIGMOID = {"top_k": 2, "score": "sigmoid", "renormalize": True, "routing_bias": True}

LATENT_CASES: dict[str, tuple[dict, list[str]]] = {
    # Nemotron-H itself: relu^2 experts in the latent width, biases, a shared expert on x
    "latent_nemotron_h_a2a_biases_shared": (
        {
            "layer": {**NEMOTRON, "latent_bias": True, "shared_ffn_dim": 40},
            "router": SIGMOID,
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **A2A,
        },
        [IN, OUT, "LATENT_DIM = 16", 'weights["latent_out_bias"]', "(ROUTED_ROWS, LATENT_DIM)"],
    ),
    "latent_replicated_fsdp_ffn_slices": (
        {
            "layer": {**NEMOTRON, "activation": "swiglu"},
            "mesh": {"axes": {"data": 2, "fsdp": 2}},
            "memory": {"ffn_chunks": 2},
        },
        [IN, OUT, "jax.lax.all_gather("],
    ),
    # the ring overlapped: the latent tokens travel in chunks of the latent width
    "latent_ring_overlapped": (
        {
            "layer": {**NEMOTRON, "embed_dim": 24},
            "mesh": {"axes": {"expert": 2}},
            "parallelism": {**RING["parallelism"], "overlap_chunks": 2},
        },
        [IN, OUT, "CHUNK_WIDTH = 8  # LATENT_DIM / OVERLAP_CHUNKS"],
    ),
    # megablox interpreted (lane-wide latent), the output bias on tensor shard 0 only
    "latent_pallas_tensor_biases": (
        {
            "layer": {
                **NEMOTRON,
                "embed_dim": 256,
                "latent_dim": 128,
                "ffn_dim": 512,
                "latent_bias": True,
                "shared_ffn_dim": 256,
            },
            "mesh": {"axes": {"expert": 2, "tensor": 2}},
            "target": {"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"},
            **A2A,
        },
        [IN, OUT, 'weights["latent_out_bias"] = jnp.where('],
    ),
    "latent_token_chunks_sequence_identity_input_weights": (
        {
            "layer": NEMOTRON,
            "router": {"top_k": 2, "identity_experts": 2, "weighting": "input"},
            "mesh": {"axes": {"sequence": 2, "expert": 2}},
            "memory": {"token_chunks": 2},
            **A2A,
        },
        [IN, OUT, "TOKEN_CHUNKS = 2", "return y.reshape(LOCAL_TOKENS, LATENT_DIM)"],
    ),
    "latent_replicas_bfloat16": (
        {
            "layer": NEMOTRON,
            "dtypes": {"params": "float32", "compute": "bfloat16"},
            "mesh": {"axes": {"expert": 2}},
            "parallelism": {
                **A2A["parallelism"],
                "redundant_experts": 2,
                "placement": [[{"expert": 5, "share": 0.5}], [{"expert": 0, "share": 0.5}]],
            },
        },
        [IN, OUT, "weights = _with_replicas(weights)"],
    ),
}
