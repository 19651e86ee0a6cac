"""Names the loader's messages and key checks use: what a spec must say for a module to have
each parameter, and the key endings of quantized weights."""

from __future__ import annotations

from collections.abc import Mapping

# What the spec must say for a module to have each parameter (refusal messages name it).
SPEC_FIELD: Mapping[str, str] = {
    "router": "router",
    "router_bias": "router.linear_bias: true",
    "routing_bias": "router.routing_bias: true",
    "w_gate": "layer.activation: swiglu (a gated activation)",
    "w_up": "layer.ffn_dim",
    "w_down": "layer.ffn_dim",
    "b_gate": "layer.ffn_bias: true",
    "b_up": "layer.ffn_bias: true",
    "b_down": "layer.ffn_bias: true",
    "shared_gate": "layer.shared_ffn_dim",
    "shared_up": "layer.shared_ffn_dim",
    "shared_down": "layer.shared_ffn_dim",
    "shared_expert_gate": "layer.shared_expert_gate: true",
    "shared_b_gate": "layer.shared_ffn_bias: true",
    "shared_b_up": "layer.shared_ffn_bias: true",
    "shared_b_down": "layer.shared_ffn_bias: true",
    "latent_in": "layer.latent_dim",
    "latent_out": "layer.latent_dim",
    "latent_in_bias": "layer.latent_bias: true",
    "latent_out_bias": "layer.latent_bias: true",
    "output_norm": "layer.output_norm_eps",
    "expert_output_norm": "layer.expert_output_norm_eps",
    "shared_output_norm": "layer.shared_output_norm_eps",
}

# Key endings of quantized weights, which this loader does not dequantize.
QUANTIZED_SUFFIXES = (
    "_blocks",  # gpt-oss MXFP4 (with _scales)
    "_scales",
    ".weight_scale_inv",  # DeepSeek-V3 / V4 FP8 block scales
    ".weight_scale",
    ".input_scale",
    ".scale",
    ".qweight",  # GPTQ / AWQ
    ".qzeros",
    ".scales",
    ".g_idx",
    ".absmax",  # bitsandbytes
    ".quant_map",
    ".quant_state.bitsandbytes__nf4",
    ".SCB",
)
