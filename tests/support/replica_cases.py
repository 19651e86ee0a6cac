"""Redundant expert slots in tests/verify/test_router_features.py: replicas of hot experts on
other devices, the copies of an expert split over its slots, the replicas' weights fetched
from their home devices and their gradients summed back. One case per path a split copy and
a fetched weight take: the kernels that run on CPU twins, fsdp-gathered weights, biases, a
shared expert, a tensor split, token chunks, a sequence axis, identity experts, input
weighting, a capacity, bfloat16. Verification adds a routing skewed to the replicated
experts (moegen.verify.reference.parity.skewed_case) to the random and starved ones."""

from __future__ import annotations

from router_feature_cases import A2A

FETCH = "weights = _with_replicas(weights)"
SPLIT = "slots = _replica_slots(flat_ids[by_expert]"


def replicas(slots: list[list[tuple[int, float]]]) -> dict:
    """parallelism: the ragged all-to-all with these extra slots per device."""
    placement = [[{"expert": e, "share": s} for e, s in device] for device in slots]
    extra = sum(len(device) for device in slots)
    return {
        "parallelism": {**A2A["parallelism"], "redundant_experts": extra, "placement": placement}
    }


REPLICA_CASES: dict[str, tuple[dict, list[str]]] = {
    "replicas_a2a_xla": (
        {
            "mesh": {"axes": {"expert": 4}},
            **replicas([[(2, 0.5)], [(0, 0.3)], [(0, 0.3)], [(3, 0.25)]]),
        },
        [FETCH, SPLIT, "EXTRA_SLOTS = 1", "LOCAL_SLOTS = 3"],
    ),
    # megablox interpreted, weights gathered over fsdp before their replicas move, biases per
    # slot, a shared expert beside
    "replicas_pallas_fsdp_biases_shared": (
        {
            "layer": {
                "num_experts": 8,
                "embed_dim": 128,
                "ffn_dim": 256,
                "ffn_bias": True,
                "shared_ffn_dim": 128,
            },
            "mesh": {"axes": {"fsdp": 2, "expert": 2}},
            "target": {"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"},
            **replicas([[(5, 0.5)], [(1, 0.75)]]),
        },
        [FETCH, SPLIT, '"b_down"'],
    ),
    # two extra slots a device, token chunks over a sequence axis, identity copies that
    # leave before any slot is chosen
    "replicas_token_chunks_sequence_identity": (
        {
            "router": {"top_k": 2, "identity_experts": 2},
            "mesh": {"axes": {"sequence": 2, "expert": 2}},
            "memory": {"token_chunks": 2},
            **replicas([[(4, 0.25), (7, 0.5)], [(0, 0.5), (1, 0.125)]]),
        },
        [FETCH, SPLIT, "TOKEN_CHUNKS = 2", "EXTRA_SLOTS = 2"],
    ),
    # the tensor split of every slot's FFN, input weighting, bfloat16
    "replicas_tensor_input_weighting_bf16": (
        {
            "router": {"top_k": 2, "weighting": "input", "routing_bias": True},
            "mesh": {"axes": {"tensor": 2, "expert": 2}},
            "dtypes": {"params": "float32", "compute": "bfloat16"},
            **replicas([[(6, 0.5)], [(2, 0.5)]]),
        },
        [FETCH, SPLIT],
    ),
    # an expert's replicas on every other device (its home keeps a share), with a capacity
    "replicas_everywhere_capacity_sigmoid": (
        {
            "router": {
                "top_k": 2,
                "score": "sigmoid",
                "renormalize": True,
                "capacity": {"factor": 1.5},
                "load_balance_loss": 0.01,
            },
            "mesh": {"axes": {"expert": 4}},
            **replicas([[(7, 0.25)], [(7, 0.25)], [(7, 0.25)], [(0, 0.5)]]),
        },
        [FETCH, SPLIT],
    ),
}
