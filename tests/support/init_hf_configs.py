"""The hand-written config.json sizes of tests/support/init_hf_cases.py, in each family's key names."""

from __future__ import annotations

# sizes every case shares, in each family's key names
LLAMA4_TEXT = {
    "model_type": "llama4_text",
    "num_local_experts": 8,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 6,
    "interleave_moe_layer_step": 2,
}
MIXTRAL = {
    "model_type": "mixtral",
    "num_local_experts": 8,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
}
DEEPSEEK = {
    "n_routed_experts": 16,
    "hidden_size": 32,
    "moe_intermediate_size": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 5,
}
QWEN2 = {
    "model_type": "qwen2_moe",
    "num_experts": 8,
    "hidden_size": 32,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 8,
}


# Step 3.7 in the published config's form: its MoE layers in the legacy moe_layers_enum, the
# last two layers clamped (routed experts at 7, the shared one at 16), the others not
STEP3P7 = {
    "model_type": "step3p5",
    "moe_num_experts": 16,
    "moe_top_k": 4,
    "hidden_size": 32,
    "moe_intermediate_size": 16,
    "share_expert_dim": 32,
    "num_hidden_layers": 6,
    "moe_layers_enum": "2,3,4,5",
    "swiglu_limits": [0.0, 0.0, 0.0, 0.0, 7, 7],
    "swiglu_limits_shared": [0, 0, 0, 0, 16, 16],
    "moe_router_scaling_factor": 3.0,
}
# google/gemma-4-26B-A4B's text model: 128 experts of 704, top-8, beside a 2112-wide MLP
GEMMA4_26B = {
    "model_type": "gemma4",
    "text_config": {
        "model_type": "gemma4_text",
        "hidden_size": 2816,
        "intermediate_size": 2112,
        "num_hidden_layers": 30,
        "enable_moe_block": True,
        "num_experts": 128,
        "top_k_experts": 8,
        "moe_intermediate_size": 704,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-06,
    },
}
NEMOTRON_H = {
    "model_type": "nemotron_h",
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "hidden_size": 32,
    "moe_intermediate_size": 16,
    "moe_shared_expert_intermediate_size": 32,
    "routed_scaling_factor": 2.5,
}
# Ergo, its config class's defaults but the sizes (rms_norm_eps 1e-12, 8**0.5 scaling) and a
# shared expert 0 wide: none in the spec, so no norm of its output either
ERGO_UNSHARED = {
    "model_type": "ergo",
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "hidden_size": 32,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 4,
    "shared_intermediate_size": 0,
}
ERGO_UNSHARED_FIELDS = {
    "moe.yaml": {
        "layer.shared_ffn_dim": None,
        "layer.shared_output_norm_eps": None,
        "layer.expert_output_norm_eps": 1e-12,
        "router.routed_scaling": 8**0.5,
    }
}
ERNIE = {
    "model_type": "ernie4_5_moe",
    "moe_num_experts": 8,
    "moe_k": 2,
    "hidden_size": 32,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 6,
    "moe_layer_start_index": 1,
    "moe_layer_end_index": 4,
    "moe_num_shared_experts": 0,
}
CLAMP7 = {"gate_limit": 7.0, "up_limit": 7.0, "gate_clamp": "after_activation"}


LONGCAT = {
    "model_type": "longcat_flash",
    "hidden_size": 64,
    "n_routed_experts": 8,
    "moe_topk": 2,
    "expert_ffn_hidden_size": 32,
    "num_layers": 3,
}


INKLING = {
    "model_type": "inkling_text",
    "hidden_size": 64,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
}
