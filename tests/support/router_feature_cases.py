"""The specs of tests/verify/test_router_features.py: one per router or expert feature, or
realistic combination, on the smallest mesh that exercises its code path, with code the
rendered module must contain."""

from __future__ import annotations

BASE = {
    "version": 1,
    "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48},
    "router": {"top_k": 2},
    "shapes": {"batch": 8, "seq_len": 8},
    "dtypes": {"params": "float32", "compute": "float32"},
    "mesh": {"axes": {"data": 2}},
}
A2A = {"parallelism": {"experts": "ragged_all_to_all"}}
RING = {"parallelism": {"experts": "ring_of_experts"}}

# name -> (overrides merged into BASE, code the rendered module must contain)
CASES: dict[str, tuple[dict, list[str]]] = {
    "softmax_renormalised_scaled": (
        {"router": {"top_k": 2, "renormalize": True, "routed_scaling": 2.5}},
        ["ROUTED_SCALING = 2.5"],
    ),
    "gpt_oss_like_softmax_after_top_k_with_bias": (
        {
            "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "ffn_bias": True},
            "router": {"top_k": 4, "score_after_top_k": True},
            "mesh": {"axes": {"data": 2, "fsdp": 2}},
        },
        ["jax.nn.softmax(top_logits", 'weights["b_down"]'],
    ),
    "deepseek_v3_like_groups_bias_shared_a2a": (
        {
            "layer": {"num_experts": 16, "embed_dim": 32, "ffn_dim": 48, "shared_ffn_dim": 40},
            "router": {
                "top_k": 4,
                "score": "sigmoid",
                "renormalize": True,
                "routed_scaling": 2.5,
                "group_limit": {"groups": 4, "keep": 2},
                "routing_bias": True,
            },
            "mesh": {"axes": {"fsdp": 2, "expert": 2}},
            **A2A,
        },
        ["_limit_to_groups(selection)", "_shared_expert(tokens, weights)", "update_routing_bias"],
    ),
    "sqrtsoftplus_bias_ring": (
        {
            "router": {
                "top_k": 2,
                "score": "sqrtsoftplus",
                "renormalize": True,
                "routing_bias": True,
            },
            "mesh": {"axes": {"expert": 2}},
            **RING,
        },
        ["jnp.sqrt(jax.nn.softplus(logits))"],
    ),
    "balance_and_z_losses": (
        {
            "router": {"top_k": 2, "load_balance_loss": 0.01, "z_loss": 0.001},
            "mesh": {"axes": {"data": 2, "fsdp": 2}},
        },
        ["_load_balance_loss(logits, tokens_per_expert)", "_router_z_loss(logits)"],
    ),
    "capacity_by_probability_replicated": (
        {"router": {"top_k": 2, "load_balance_loss": 0.01, "capacity": {"factor": 1.0}}},
        ["_drop_over_capacity", "jnp.argsort(-combine_weights"],
    ),
    "capacity_by_position_a2a": (
        {
            "router": {
                "top_k": 2,
                "load_balance_loss": 0.01,
                "capacity": {"factor": 1.0, "drop": "position"},
            },
            "mesh": {"axes": {"expert": 4}},
            **A2A,
        },
        ["_drop_over_capacity"],
    ),
    "capacity_sigmoid_bias_ring": (
        {
            "router": {
                "top_k": 2,
                "score": "sigmoid",
                "routing_bias": True,
                "capacity": {"factor": 0.75},
            },
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **RING,
        },
        ["_drop_over_capacity"],
    ),
    # Switch Transformers' count: each sequence's copies, in token order
    "capacity_per_sequence_copies_replicated": (
        {
            "router": {
                "top_k": 1,
                "load_balance_loss": 0.01,
                "capacity": {"copies": 1, "per": "sequence", "drop": "position"},
            },
        },
        ["LOCAL_BATCH = 4", "// SEQUENCE_ROWS * NUM_EXPERTS + flat_ids"],
    ),
    "capacity_per_sequence_factor_a2a": (
        {
            "router": {
                "top_k": 2,
                "load_balance_loss": 0.01,
                "capacity": {"factor": 1.0, "per": "sequence"},
            },
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **A2A,
        },
        ["jnp.argsort(-combine_weights", "jnp.argsort(counters[priority]"],
    ),
    "capacity_per_sequence_copies_ring": (
        {
            "router": {
                "top_k": 2,
                "score": "sigmoid",
                "routing_bias": True,
                "capacity": {"copies": 2, "per": "sequence"},
            },
            "mesh": {"axes": {"expert": 2}},
            **RING,
        },
        ["length=LOCAL_BATCH * NUM_EXPERTS"],
    ),
    "geglu_replicated": (
        {"layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "activation": "geglu"}},
        ["_gelu(gate) * up"],
    ),
    "gelu_with_bias_a2a": (
        {
            "layer": {
                "num_experts": 8,
                "embed_dim": 32,
                "ffn_dim": 48,
                "activation": "gelu",
                "ffn_bias": True,
            },
            "mesh": {"axes": {"expert": 2}},
            **A2A,
        },
        ["_gelu(up)"],
    ),
    "relu_with_bias_ring_overlap": (
        {
            "layer": {
                "num_experts": 8,
                "embed_dim": 32,
                "ffn_dim": 48,
                "activation": "relu",
                "ffn_bias": True,
                "shared_ffn_dim": 24,
            },
            "mesh": {"axes": {"expert": 2}},
            "parallelism": {"experts": "ring_of_experts", "overlap_chunks": 2},
        },
        [
            'block_up = up[step] + weights["b_up"][row_experts]',
            "hidden = jax.nn.relu(block_up).astype(COMPUTE_DTYPE)",  # a call needs no parentheses
        ],
    ),
    "llama4_like_top1_sigmoid_shared": (
        {
            "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "shared_ffn_dim": 48},
            "router": {"top_k": 1, "score": "sigmoid"},
        },
        ["SHARED_FFN_DIM = 48"],
    ),
    # transformers' load_balancing_loss_func: the layer's top-k is the logits' (Mixtral-like),
    # and beside a selection bias and groups, where the loss takes the logits' top-k itself
    "balance_loss_transformers_form_ring": (
        {
            "router": {
                "top_k": 2,
                "score_after_top_k": True,
                "load_balance_loss": 0.02,
                "load_balance_form": "transformers",
            },
            "mesh": {"axes": {"expert": 2}},
            **RING,
        },
        ["load_balancing_loss_func", "picks = tokens_per_expert"],
    ),
    "balance_loss_transformers_form_biased_groups_a2a": (
        {
            "layer": {"num_experts": 16, "embed_dim": 32, "ffn_dim": 48},
            "router": {
                "top_k": 4,
                "score": "sigmoid",
                "renormalize": True,
                "group_limit": {"groups": 4, "keep": 2},
                "routing_bias": True,
                "load_balance_loss": 0.01,
                "load_balance_form": "transformers",
            },
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **A2A,
        },
        ["_, picked = jax.lax.top_k(logits, TOP_K)"],
    ),
    # LFM2-MoE's renormalisation epsilon and Kolibri1's selection bias on the logits
    "renormalize_epsilon_bias_on_logits_a2a": (
        {
            "router": {
                "top_k": 2,
                "score": "sigmoid",
                "renormalize": True,
                "renormalize_epsilon": 0.01,
                "routing_bias": True,
                "routing_bias_on": "logits",
            },
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **A2A,
        },
        ["RENORMALIZE_EPSILON = 0.01", 'selection = logits + weights["routing_bias"]'],
    ),
    # Step 3.7's clamps: the activated gate clamped, the shared expert at its own limits; the
    # limits low enough to bite on the twin's inputs (ring: the overlapped FFN's activation)
    "step3p7_clamp_after_activation_shared_own_limits_ring": (
        {
            "layer": {
                "num_experts": 8,
                "embed_dim": 32,
                "ffn_dim": 48,
                "shared_ffn_dim": 40,
                "glu": {"gate_limit": 0.05, "up_limit": 0.3, "gate_clamp": "after_activation"},
                "shared_glu": {
                    "gate_limit": 0.1,
                    "up_limit": 0.5,
                    "gate_clamp": "after_activation",
                },
            },
            "router": {"top_k": 2, "score": "sigmoid", "renormalize": True},
            "mesh": {"axes": {"expert": 2}},
            "parallelism": {"experts": "ring_of_experts", "overlap_chunks": 2},
        },
        [
            "SHARED_GATE_LIMIT = 0.1",
            "def _shared_glu(",
            "jnp.minimum(jax.nn.silu(gate), GATE_LIMIT)",
        ],
    ),
    # HY-V4: the routed experts clamped, the shared expert plain; FFN slices
    "hy_v4_routed_clamps_shared_plain_slices_a2a": (
        {
            "layer": {
                "num_experts": 8,
                "embed_dim": 32,
                "ffn_dim": 48,
                "shared_ffn_dim": 40,
                "glu": {"gate_limit": 0.2, "up_limit": 0.3},
                "shared_glu": "plain",
            },
            "router": {"top_k": 2},
            "mesh": {"axes": {"data": 2, "expert": 2}},
            "memory": {"ffn_chunks": 2},
            **A2A,
        },
        ["hidden = jax.nn.silu(gate) * up", "def _glu("],
    ),
    # Nemotron-H: ungated relu^2 routed and shared experts, on the ragged all-to-all
    "nemotron_h_relu2_shared_a2a": (
        {
            "layer": {
                "num_experts": 8,
                "embed_dim": 32,
                "ffn_dim": 48,
                "activation": "relu2",
                "shared_ffn_dim": 40,
            },
            "router": {"top_k": 2, "score": "sigmoid", "renormalize": True, "routing_bias": True},
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **A2A,
        },
        ["jnp.square(jax.nn.relu(up))"],
    ),
    # ERNIE 4.5 with use_bias: the shared expert's biases, over a tensor axis (its down bias
    # added on one tensor shard) and fsdp
    "ernie_shared_biases_tensor_fsdp": (
        {
            "layer": {
                "num_experts": 8,
                "embed_dim": 32,
                "ffn_dim": 48,
                "shared_ffn_dim": 40,
                "shared_ffn_bias": True,
            },
            "router": {"top_k": 2, "renormalize": True, "routing_bias": True},
            "mesh": {"axes": {"fsdp": 2, "tensor": 2}},
        },
        ['weights["shared_b_gate"]', 'weights["shared_b_down"] = jnp.where('],
    ),
    # Laguna: soft-capped router logits, with the balance and z losses over them
    "laguna_logit_softcap_losses_a2a": (
        {
            "router": {
                "top_k": 2,
                "score": "sigmoid",
                "renormalize": True,
                "routing_bias": True,
                "logit_softcap": 0.5,
                "load_balance_loss": 0.01,
                "z_loss": 0.001,
            },
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **A2A,
        },
        ["logits = LOGIT_SOFTCAP * jnp.tanh(logits / LOGIT_SOFTCAP)"],
    ),
    # Gemma 4: the router's normalised input, per-expert scales, the experts' own input norm;
    # token chunks over fsdp x expert
    "gemma4_norms_token_chunks_a2a": (
        {
            "layer": {
                "num_experts": 8,
                "embed_dim": 32,
                "ffn_dim": 48,
                "activation": "geglu",
                "gelu_approximation": "tanh",
                "expert_input_norm_eps": 1e-06,
            },
            "router": {
                "top_k": 2,
                "renormalize": True,
                "input_norm_eps": 1e-06,
                "per_expert_scale": True,
            },
            "mesh": {"axes": {"fsdp": 2, "expert": 2}},
            "memory": {"token_chunks": 2},
            **A2A,
        },
        ['weights["per_expert_scale"][expert_ids]', "INIT_ONES = (", "approximate=True"],
    ),
    # DeepSeek-V3's sequence-wise balance loss: sequences split over the sequence axis, a
    # capacity that drops (the loss counts the choice before drops)
    "sequence_balance_loss_sequence_axis_capacity": (
        {
            "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48},
            "router": {
                "top_k": 2,
                "score": "sigmoid",
                "renormalize": True,
                "routing_bias": True,
                "load_balance_loss": 0.01,
                "load_balance_form": "sequence",
                "capacity": {"factor": 1.0},
            },
            "mesh": {"axes": {"data": 2, "sequence": 2}},
        },
        ["prob_sums, picks = jax.lax.psum((prob_sums, picks), SEQUENCE_AXIS)"],
    ),
    "sequence_balance_loss_a2a": (
        {
            "router": {
                "top_k": 2,
                "load_balance_loss": 0.01,
                "load_balance_form": "sequence",
            },
            "mesh": {"axes": {"data": 2, "expert": 2}},
            **A2A,
        },
        ["DeepSeek-V3's sequence-wise balance loss"],
    ),
    "bf16_compute_all_features": (
        {
            "layer": {
                "num_experts": 8,
                "embed_dim": 32,
                "ffn_dim": 48,
                "ffn_bias": True,
                "shared_ffn_dim": 16,
            },
            "router": {
                "top_k": 2,
                "score": "sigmoid",
                "renormalize": True,
                "routing_bias": True,
                "group_limit": {"groups": 4, "keep": 2},
                "load_balance_loss": 0.01,
                "z_loss": 0.001,
                "capacity": {"factor": 1.25},
            },
            "dtypes": {"params": "float32", "compute": "bfloat16"},
            "mesh": {"axes": {"fsdp": 2, "expert": 2}},
            **A2A,
        },
        ["_drop_over_capacity", "_limit_to_groups"],
    ),
}
