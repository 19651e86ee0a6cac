"""What a named case of the dense reference's tests is (tests/support/reference_cases.py holds the
table): its shapes, its config and which optional parameters it has, and its seeded
parameters and input."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moegen.verify.reference.layer import ReferenceConfig

GATED = ("swiglu", "geglu")


@dataclass(frozen=True)
class Case:
    shape: tuple[int, int, int, int, int]  # batch, seq_len, embed_dim, ffn_dim, num_experts
    cfg: ReferenceConfig
    routing_bias: bool = False
    router_bias: bool = False  # the router's linear bias (gpt-oss)
    ffn_biases: bool = False
    shared: int = 0  # shared expert width; 0 = none
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert
    shared_biases: bool = False  # a bias after each shared projection (ERNIE 4.5 use_bias)
    gemma4_norms: bool = False  # router_input_scale, per_expert_scale, expert_input_norm
    zero_router_columns: tuple[int, ...] = ()  # experts whose logits are exactly 0 (ties)
    repeat_tokens: bool = False  # every odd token repeats the one before it (ties)
    drops: bool | None = None  # capacity really drops something (True) or nothing (False)
    latent: int = 0  # the experts' latent width (Nemotron-H); 0 = they run on embed_dim
    latent_biases: bool = False  # a bias after each latent projection
    output_norm: bool = False  # the output's RMSNorm weight (A.X-K1's post_mlp_layernorm)
    # Ergo's norms of each expert's output (a weight row per expert) and the shared expert's
    output_norms: bool = False


# Few shapes, so that op-by-op dispatch compiles each operation once for many cases.
S4 = (2, 8, 6, 5, 4)  # 16 tokens, 4 experts
S8 = (2, 4, 8, 6, 8)  # 8 tokens, 8 experts
S16 = (2, 4, 8, 4, 16)  # 8 tokens, 16 experts


def C(**kw) -> ReferenceConfig:
    return ReferenceConfig(**kw)


def make_params(case: Case, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    batch, seq, embed, ffn, experts = case.shape
    rng = np.random.default_rng(seed)

    def normal(scale, shape):
        return rng.normal(0, scale, shape).astype(np.float32)

    router = normal(1.0, (embed, experts))
    router[:, list(case.zero_router_columns)] = 0.0
    params = {"router": router}
    if case.router_bias:
        params["router_bias"] = normal(0.5, (experts,))
    if case.routing_bias:
        params["routing_bias"] = normal(0.3, (experts,))
    gated = case.cfg.activation in GATED
    routed = case.latent or embed  # the width the experts run in
    if case.latent:
        params["latent_in"] = normal(embed**-0.5, (embed, routed))
        params["latent_out"] = normal(routed**-0.5, (routed, embed))
        if case.latent_biases:
            params["latent_in_bias"] = normal(0.2, (routed,))
            params["latent_out_bias"] = normal(0.2, (embed,))
    if gated:
        params["w_gate"] = normal(routed**-0.5, (experts, routed, ffn))
    params["w_up"] = normal(routed**-0.5, (experts, routed, ffn))
    params["w_down"] = normal(ffn**-0.5, (experts, ffn, routed))
    if case.ffn_biases:
        if gated:
            params["b_gate"] = normal(0.2, (experts, ffn))
        params["b_up"] = normal(0.2, (experts, ffn))
        params["b_down"] = normal(0.2, (experts, routed))
    if case.shared:
        if gated:
            params["shared_gate"] = normal(embed**-0.5, (embed, case.shared))
        params["shared_up"] = normal(embed**-0.5, (embed, case.shared))
        params["shared_down"] = normal(case.shared**-0.5, (case.shared, embed))
        if case.shared_expert_gate:
            params["shared_expert_gate"] = normal(embed**-0.5, (embed,))
        if case.gemma4_norms:  # around one, as trained norms and scales are
            params["router_input_scale"] = 1.0 + normal(0.3, (embed,))
            params["per_expert_scale"] = 1.0 + normal(0.3, (experts,))
            params["expert_input_norm"] = 1.0 + normal(0.3, (embed,))
        if case.shared_biases:
            for name in ("gate", "up") if gated else ("up",):
                params[f"shared_b_{name}"] = normal(0.1, (case.shared,))
            params["shared_b_down"] = normal(0.1, (embed,))
    if case.output_norm:  # around one, as a trained norm weight is
        params["output_norm"] = 1.0 + normal(0.3, (embed,))
    if case.output_norms:  # around one too
        params["expert_output_norm"] = 1.0 + normal(0.3, (experts, routed))
        if case.shared:
            params["shared_output_norm"] = 1.0 + normal(0.3, (embed,))
    x = normal(1.0, (batch, seq, embed))
    if case.repeat_tokens:
        flat = x.reshape(batch * seq, embed)
        flat[1::2] = flat[0::2]
        x = flat.reshape(batch, seq, embed)
    return params, x
