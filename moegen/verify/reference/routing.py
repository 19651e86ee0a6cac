"""The dense reference's router: every routing decision a [tokens, experts] mask.

Top-k, group limits and capacity are written as pairwise comparisons ("how many entries beat
this one"), so that the reference shares no method with a sort- or top_k-based implementation.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from moegen.verify.reference.fields import ReferenceConfig


class Routing(NamedTuple):
    logits: jax.Array  # [T, E]
    scores: jax.Array  # [T, E] the score function of the logits (no bias)
    chosen: jax.Array  # bool [T, E]: the top-k experts of each token
    weights: jax.Array  # [T, E]: final weight of each chosen copy (after renormalize, scaling)
    kept: jax.Array  # bool [T, E]: chosen and not dropped by capacity
    shared: jax.Array | None = None  # [T, S]: the weights of the shared experts it weighs


def highest_einsum(spec: str, *operands: jax.Array) -> jax.Array:
    return jnp.einsum(spec, *operands, precision="highest")


def rank(values: jax.Array) -> jax.Array:
    """rank[..., i]: how many entries along the last axis come before entry i in descending
    order, a larger value or an equal one at a lower index (the order of jax.lax.top_k)."""
    n = values.shape[-1]
    mine = values[..., :, None]
    other = values[..., None, :]
    lower_index = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]  # [i, j]: j < i
    before = (other > mine) | ((other == mine) & lower_index)
    return before.sum(axis=-1)


def route(
    tokens: jax.Array,
    router: jax.Array,
    cfg: ReferenceConfig,
    routing_bias: jax.Array | None = None,
    router_bias: jax.Array | None = None,
    per_expert_scale: jax.Array | None = None,
    router_scale: jax.Array | None = None,
) -> Routing:
    """Dense routing of float32 tokens [T, D]: every decision a [T, E] mask."""
    logits = highest_einsum("td,dx->tx", tokens, router)  # x: the experts
    if router_bias is not None:
        logits = logits + router_bias[None, :]
    if cfg.logit_softcap is not None:
        logits = cfg.logit_softcap * jnp.tanh(logits / cfg.logit_softcap)
    # The last columns may score shared experts: they weigh them, never get chosen.
    experts = router.shape[1] - cfg.weighed_shared_experts
    logits, shared_logits = logits[:, :experts], logits[:, experts:]
    scores = _score(cfg, logits)

    # Selection decides which experts, never how much: no gradient flows through it.
    elementwise = cfg.score in ("sigmoid", "sqrtsoftplus")
    if cfg.score_after_top_k or (elementwise and routing_bias is None and cfg.num_groups == 1):
        selection = logits  # an elementwise increasing score keeps the logits' order exactly
    elif routing_bias is not None:
        biased = logits if cfg.bias_on_logits else scores
        selection = biased + routing_bias[None, :]
    else:
        selection = scores
    selection = jax.lax.stop_gradient(selection)

    if cfg.num_groups > 1:
        selection = _limit_to_groups(cfg, selection)
    chosen = rank(selection) < cfg.top_k  # [T, E]

    if cfg.score_after_top_k:
        weights = jax.nn.softmax(jnp.where(chosen, logits, -jnp.inf), axis=-1)
    else:
        weights = jnp.where(chosen, scores, 0.0)
    shared = _score(cfg, shared_logits)  # [T, S]: S may be 0
    if cfg.renormalize:  # the shared experts' scores are normalised with the chosen ones'
        total = weights.sum(axis=-1, keepdims=True) + shared.sum(axis=-1, keepdims=True)
        weights = weights / (total + cfg.renormalize_epsilon)
        shared = shared / (total + cfg.renormalize_epsilon)
    if per_expert_scale is not None:
        weights = weights * per_expert_scale[None, :]
    weights, shared = weights * cfg.routed_scaling, shared * cfg.routed_scaling
    if router_scale is not None:
        weights, shared = weights * router_scale[0], shared * router_scale[0]

    kept = chosen if cfg.capacity is None else _kept_under_capacity(cfg, chosen, weights)
    return Routing(logits, scores, chosen, weights, kept, shared)


def _limit_to_groups(cfg: ReferenceConfig, selection: jax.Array) -> jax.Array:
    """Only the experts of each token's top_groups best groups stay selectable (-inf elsewhere);
    a group's score is the sum of its group_top_n best selection scores."""
    num_tokens, experts = selection.shape
    size = experts // cfg.num_groups
    grouped = selection.reshape(num_tokens, cfg.num_groups, size)
    best_in_group = rank(grouped) < cfg.group_top_n
    group_score = jnp.where(best_in_group, grouped, 0.0).sum(axis=-1)  # [T, G]
    kept_group = rank(group_score) < cfg.top_groups
    return jnp.where(jnp.repeat(kept_group, size, axis=1), selection, -jnp.inf)


def _kept_under_capacity(cfg: ReferenceConfig, chosen: jax.Array, weights: jax.Array) -> jax.Array:
    """The chosen copies each expert keeps: those fewer than `capacity` copies of its shard
    (device, or sequence) come before, by weight or by position."""
    num_tokens, experts = chosen.shape
    # A token routes to an expert at most once, so among the copies of one expert the
    # (token, k-slot) order is the token order. ahead[t, u, e]: u's copy of e goes first.
    index = jnp.arange(num_tokens)
    shard = _capacity_shard(cfg, index, num_tokens)
    same_shard = shard[:, None] == shard[None, :]  # [t, u]
    earlier = index[None, :] < index[:, None]  # [t, u]: u < t
    if cfg.drop_policy == "position":
        ahead = jnp.broadcast_to(earlier[:, :, None], (num_tokens, num_tokens, experts))
    else:
        w = jax.lax.stop_gradient(weights)
        mine, other = w[:, None, :], w[None, :, :]
        ahead = (other > mine) | ((other == mine) & earlier[:, :, None])
    competing = ahead & same_shard[:, :, None] & chosen[None, :, :]
    return chosen & (competing.sum(axis=1) < cfg.capacity)


def _score(cfg: ReferenceConfig, logits: jax.Array) -> jax.Array:
    if cfg.score == "softmax":
        return jax.nn.softmax(logits, axis=-1)
    if cfg.score == "sigmoid":
        return jax.nn.sigmoid(logits)
    if cfg.score == "sqrtsoftplus":
        return jnp.sqrt(jax.nn.softplus(logits))
    raise ValueError(f"unknown score function {cfg.score!r}")


def _capacity_shard(cfg: ReferenceConfig, index: jax.Array, num_tokens: int) -> jax.Array:
    """The device each token is on, whose capacity it competes for: contiguous groups of
    sequences (batch shards), and with a sequence axis a part of each sequence."""
    if cfg.sequence_shards == 1:
        return index // (num_tokens // cfg.token_shards)
    if cfg.seq_len is None:
        raise ValueError("sequence_shards needs seq_len")
    sequence, position = index // cfg.seq_len, index % cfg.seq_len
    batch_shard = sequence // (num_tokens // cfg.seq_len // cfg.token_shards)
    return batch_shard * cfg.sequence_shards + position // (cfg.seq_len // cfg.sequence_shards)


def router_combine(
    tokens: jax.Array,
    router: jax.Array,
    cfg: ReferenceConfig,
    routing_bias: jax.Array | None = None,
    router_bias: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Dense [tokens, experts] combine weights (kept copies, zero elsewhere) and the number of
    token copies the router sends each expert (before dropping)."""
    r = route(tokens, router, cfg, routing_bias, router_bias)
    return jnp.where(r.kept, r.weights, 0.0), r.chosen.sum(axis=0).astype(jnp.int32)
