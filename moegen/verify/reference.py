"""The dense reference MoE layer, written independently of the templates.

Every token goes through every expert (one einsum per projection) and a one-hot combine
matrix keeps the top-k outputs: the GShard-style formulation, O(tokens * experts) work,
only for small twins. It shares no code with the generated module.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class RouterConfig:
    top_k: int
    score: str  # "softmax" | "sigmoid"
    renormalize: bool


def router_combine(
    tokens: jax.Array, router: jax.Array, cfg: RouterConfig
) -> tuple[jax.Array, jax.Array]:
    """Dense [tokens, experts] combine weights (top-k scores, zero elsewhere) and the
    number of token copies each expert receives."""
    logits = jnp.einsum("td,de->te", tokens, router, precision="highest")
    if cfg.score == "softmax":
        scores = jnp.exp(logits - logits.max(axis=-1, keepdims=True))
        scores = scores / scores.sum(axis=-1, keepdims=True)
    elif cfg.score == "sigmoid":
        scores = 1.0 / (1.0 + jnp.exp(-logits))
    else:
        raise ValueError(f"unknown score function {cfg.score!r}")
    top_scores, top_ids = jax.lax.top_k(scores, cfg.top_k)
    if cfg.renormalize:
        top_scores = top_scores / top_scores.sum(axis=-1, keepdims=True)
    one_hot = jax.nn.one_hot(top_ids, router.shape[1], dtype=tokens.dtype)  # [t, k, e]
    counts = one_hot.sum(axis=(0, 1)).astype(jnp.int32)
    return jnp.einsum("tk,tke->te", top_scores, one_hot), counts


def dense_moe(params: dict[str, jax.Array], x: jax.Array, cfg: RouterConfig) -> jax.Array:
    """y = sum_e combine[t, e] * swiglu_e(x[t]) for every token, in float32."""
    batch, seq, embed = x.shape
    tokens = x.reshape(batch * seq, embed).astype(jnp.float32)
    p = {name: value.astype(jnp.float32) for name, value in params.items()}
    combine, _ = router_combine(tokens, p["router"], cfg)
    gate = jnp.einsum("td,edf->tef", tokens, p["w_gate"], precision="highest")
    up = jnp.einsum("td,edf->tef", tokens, p["w_up"], precision="highest")
    hidden = gate * jax.nn.sigmoid(gate) * up
    out = jnp.einsum("tef,efd->ted", hidden, p["w_down"], precision="highest")
    y = jnp.einsum("ted,te->td", out, combine, precision="highest")
    return y.reshape(batch, seq, embed)


def tokens_per_expert(params: dict[str, jax.Array], x: jax.Array, cfg: RouterConfig) -> jax.Array:
    """How many token copies each expert receives, [experts] int32."""
    tokens = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    return router_combine(tokens, params["router"].astype(jnp.float32), cfg)[1]
