"""Shared experts the router weighs, in tests/verify/test_router_features.py: Inkling's router scores
its shared experts in columns after the experts, normalises their sigmoid scores with the
chosen experts', and each weight scales its own shared expert; a learned scalar scales every
weight. One case per strategy, plus token chunks, a sequence axis, fsdp and bfloat16."""

from __future__ import annotations

from router_feature_cases import A2A, RING

# Inkling's router: sigmoid, a selection bias, normalised over the chosen and the shared
# experts, times route_scale and a learned global scale
INKLING = {
    "top_k": 2,
    "score": "sigmoid",
    "renormalize": True,
    "routing_bias": True,
    "routed_scaling": 8.0,
    "weighs_shared_experts": True,
    "learned_scale": True,
}
SHARED = {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "shared_ffn_dim": 40}
WEIGHED = "shared_weights = shared_weights * ROUTED_SCALING"

SHARED_WEIGHTING_CASES: dict[str, tuple[dict, list[str]]] = {
    "weighed_shared_experts_replicated": (
        {"layer": SHARED | {"shared_experts": 2}, "router": INKLING},
        [WEIGHED, "SHARED_EXPERTS = 2", 'weights["router_scale"]'],
    ),
    "weighed_shared_experts_a2a_fsdp_token_chunks": (
        {
            "layer": SHARED | {"shared_experts": 4},
            "router": INKLING,
            "mesh": {"axes": {"fsdp": 2, "expert": 2}},
            "memory": {"token_chunks": 2},
            **A2A,
        },
        [WEIGHED, "SHARED_EXPERTS = 4"],
    ),
    "weighed_shared_experts_ring_sequence": (
        {
            "layer": SHARED | {"shared_experts": 2},
            "router": {**INKLING, "routing_bias": False, "top_k": 3},
            "mesh": {"axes": {"sequence": 2, "expert": 2}},
            **RING,
        },
        [WEIGHED],
    ),
    # one shared expert, weighed, and no renormalisation: the raw score weighs it
    "weighed_shared_expert_unnormalised_bf16": (
        {
            "layer": SHARED,
            "router": {**INKLING, "renormalize": False, "learned_scale": False},
            "dtypes": {"params": "float32", "compute": "bfloat16"},
        },
        [WEIGHED, "SHARED_EXPERTS = 1"],
    ),
    # group-limited routing over the experts' columns only (the shared experts' columns are
    # never chosen, so they belong to no group); the reference once counted them in
    "weighed_shared_experts_group_limit": (
        {
            "layer": SHARED,
            "router": {**INKLING, "group_limit": {"groups": 4, "keep": 3, "top_per_group": 1}},
        },
        [WEIGHED, "EXPERT_GROUPS = 4"],
    ),
    "learned_scale_alone_softmax": (
        {"router": {"top_k": 2, "renormalize": True, "learned_scale": True}},
        ['combine_weights = combine_weights * weights["router_scale"]'],
    ),
}
