"""The experts' output norms (Ergo's ErgoExpertNorm and its shared expert's norm) in
tests/verify/test_router_features.py: each routed expert's output RMS-normalised with that
expert's own weight row before its combine weight, the shared expert's with its own weight.
One case per way an expert's rows reach the norm and its weight reaches the device: Ergo itself
over the all-to-all under fsdp (the weight's rows gathered), replicated with biases and a gated
shared expert in bfloat16, the ring in token chunks and FFN slices, the ring overlapped,
redundant expert slots (the weight's rows fetched with the replicas), a latent width, the
router weighing the shared experts, and megablox, which leaves rows past the groups unwritten
(their weight row is read as 0)."""

from __future__ import annotations

from replica_cases import replicas
from router_feature_cases import A2A, RING

ROUTED = "out = _expert_output_norm(out, weights, row_experts)"
SHARED = 'out = _rms_norm(out, SHARED_OUTPUT_NORM_EPS) * weights["shared_output_norm"]'
FILLED = 'scale = weights["expert_output_norm"].at[row_experts].get(mode="fill", fill_value=0)'
# Ergo's layer at the twins' sizes: relu^2 experts and shared expert, both outputs normalised;
# the epsilon large enough to count at these sizes (Ergo's own is 1e-12)
ERGO = {
    "num_experts": 16,
    "embed_dim": 32,
    "ffn_dim": 48,
    "activation": "relu2",
    "shared_ffn_dim": 40,
    "expert_output_norm_eps": 0.01,
    "shared_output_norm_eps": 0.01,
}
ERGO_ROUTER = {
    "top_k": 4,
    "score": "sigmoid",
    "renormalize": True,
    "routing_bias": True,
    "routed_scaling": 2.828,
}
ROUTED_ONLY = {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "expert_output_norm_eps": 0.01}

EXPERT_OUTPUT_NORM_CASES: dict[str, tuple[dict, list[str]]] = {
    "output_norms_ergo_a2a_fsdp": (
        {"layer": ERGO, "router": ERGO_ROUTER, "mesh": {"axes": {"fsdp": 2, "expert": 2}}, **A2A},
        [ROUTED, SHARED, "EXPERT_OUTPUT_NORM_EPS = 0.01", "SHARED_OUTPUT_NORM_EPS = 0.01"],
    ),
    "output_norms_replicated_biases_gated_shared_bfloat16": (
        {
            "layer": ERGO
            | {"activation": "swiglu", "ffn_bias": True, "shared_ffn_bias": True}
            | {"shared_expert_gate": True},
            "router": ERGO_ROUTER,
            "dtypes": {"params": "float32", "compute": "bfloat16"},
            "mesh": {"axes": {"data": 2}},
        },
        [ROUTED, SHARED, "return out * jax.nn.sigmoid(share)[:, None]"],
    ),
    "output_norms_ring_token_chunks_ffn_slices": (
        {
            "layer": ERGO,
            "router": ERGO_ROUTER,
            "mesh": {"axes": {"expert": 2}},
            "memory": {"token_chunks": 2, "ffn_chunks": 2},
            **RING,
        },
        [ROUTED, "TOKEN_CHUNKS = 2", "FFN_CHUNKS = 2"],
    ),
    "output_norms_ring_overlapped": (
        {
            "layer": ROUTED_ONLY,
            "mesh": {"axes": {"expert": 2}},
            "parallelism": {**RING["parallelism"], "overlap_chunks": 2},
        },
        ["        out = _expert_output_norm(out, weights, row_experts)"],
    ),
    "output_norms_redundant_experts": (
        {
            "layer": ROUTED_ONLY,
            "mesh": {"axes": {"expert": 4}},
            **replicas([[(2, 0.5)], [(0, 0.3)], [(0, 0.3)], [(3, 0.25)]]),
        },
        [
            ROUTED,
            "weights = _with_replicas(weights)",
            '    "expert_output_norm",\n)  # the expert weights',
        ],
    ),
    "output_norms_latent": (
        {
            "layer": ROUTED_ONLY | {"latent_dim": 16, "activation": "relu2"},
            "mesh": {"axes": {"expert": 2}},
            **A2A,
        },
        [ROUTED, "y = _latent_out(y, weights)"],
    ),
    "output_norms_weighed_shared_experts": (
        {
            "layer": ERGO | {"shared_experts": 2},
            "router": ERGO_ROUTER | {"weighs_shared_experts": True},
        },
        [ROUTED, SHARED, "SHARED_EXPERTS = 2"],
    ),
    "output_norms_pallas": (
        {
            "layer": {**ERGO, "embed_dim": 128, "ffn_dim": 256, "shared_ffn_dim": 128},
            "router": ERGO_ROUTER,
            "mesh": {"axes": {"data": 2, "expert": 2}},
            "target": {"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"},
            **A2A,
        },
        [ROUTED, SHARED, FILLED],
    ),
}
