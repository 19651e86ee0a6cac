"""The dense reference MoE layer, written independently of the templates.

Every token goes through every expert (one einsum per projection) and a dense [tokens, experts]
combine matrix keeps the routed outputs: the GShard-style formulation, O(tokens * experts) work,
only for small twins. It shares no code with the generated module, and it sorts nothing: top-k,
group limits and capacity are all written as pairwise comparisons ("how many entries beat this
one"), so that it shares no method with a sort- or top_k-based implementation either (the
router is in `moegen.verify.reference.routing`).

Features follow from `ReferenceConfig` and from which keys `params` holds:

- router [D, E]; router_bias [E] (optional: added to the logits); routing_bias [E] (optional,
  selection only: aux-loss-free balancing); with I identity and Z zero experts the three
  have E + I + Z columns, the experts first; router [D, E + S] where the router weighs S
  shared experts (its last columns); router_scale [1] (optional: every weight times it);
- w_gate [E, D, F] (gated activations only), w_up [E, D, F], w_down [E, F, D];
- b_gate [E, F] (gated only), b_up [E, F], b_down [E, D]: optional FFN biases, all or none;
- shared_gate [D, S] (gated only), shared_up [D, S], shared_down [S, D]: optional shared expert;
  shared_expert_gate [D] (optional with it): its output times sigmoid(x . shared_expert_gate);
  shared_b_gate [S] (gated only), shared_b_up [S], shared_b_down [D]: its biases, all or none;
- router_input_scale [D], per_expert_scale [E], expert_input_norm [D]: Gemma 4's router input
  norm weight, per-expert weight scales and expert input norm weight (each optional; the norms
  come with their epsilons in the config);
- output_norm [D] (optional, with its epsilon in the config): the output, routed and shared
  experts summed, is RMS-normalised and times it (A.X-K1's post_mlp_layernorm);
- expert_output_norm [E, D] (optional, with its epsilon): each expert's output, before its
  weight, is RMS-normalised and times that expert's row (Ergo's ErgoExpertNorm);
  shared_output_norm [D] (optional, with its epsilon): the shared expert's output, before its
  gate, is RMS-normalised and times it (Ergo's shared expert norm);
- latent_in [D, L], latent_out [L, D] (optional, together): the routed experts run in width L
  (their weights [E, L, F] and [E, F, L]): each token is projected down before its experts,
  their weighted sum back up; latent_in_bias [L], latent_out_bias [D]: their biases (optional).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from moegen.verify.reference.checks import check_reference_args
from moegen.verify.reference.fields import (
    ACTIVATIONS,
    DROP_POLICIES,
    GATED_ACTIVATIONS,
    SCORES,
    ReferenceConfig,
    RouterConfig,
    SharedGlu,
)
from moegen.verify.reference.routing import (
    Routing,
    highest_einsum,
    rank,
    route,
    router_combine,
)

__all__ = [
    "ACTIVATIONS", "DROP_POLICIES", "GATED_ACTIVATIONS", "SCORES", "ReferenceAux",
    "ReferenceConfig", "RouterConfig", "Routing", "SharedGlu", "dense_moe", "route",
    "router_combine", "tokens_per_expert",
]  # fmt: skip


class ReferenceAux(NamedTuple):
    tokens_per_expert: jax.Array  # int32 [E]: copies chosen by the router (before any dropping)
    dropped_per_expert: jax.Array  # int32 [E]: copies dropped by capacity (zeros when dropless)
    load_balance_loss: jax.Array  # float32 [] (0.0 when the weight is 0)
    router_z_loss: jax.Array  # float32 [] (0.0 when the weight is 0)


def _gelu(cfg: ReferenceConfig, v: jax.Array) -> jax.Array:
    """GELU: exact, or its tanh approximation where the spec asks for it."""
    if cfg.gelu_tanh:
        inner = math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)
        return 0.5 * v * (1.0 + jnp.tanh(inner))
    return jax.nn.gelu(v, approximate=False)


def glu_of(cfg: ReferenceConfig, shared: bool) -> SharedGlu:
    """The gated activation's parameters of the routed experts, or of the shared expert."""
    if shared and cfg.shared_glu is not None:
        return cfg.shared_glu
    return SharedGlu(
        cfg.gate_limit,
        cfg.up_limit,
        cfg.sigmoid_scale,
        cfg.up_offset,
        cfg.gate_clamp_after,
        cfg.gate_softcap,
        cfg.up_softcap,
    )


def _hidden(
    cfg: ReferenceConfig, gate: jax.Array | None, up: jax.Array, shared: bool = False
) -> jax.Array:
    """The activation: act(up) plain; gated, with the clamps, sigmoid scale and up offset."""
    if cfg.activation == "gelu":
        return _gelu(cfg, up)
    if cfg.activation == "relu":
        return jnp.maximum(up, 0.0)
    if cfg.activation == "relu2":
        return jnp.maximum(up, 0.0) ** 2
    glu = glu_of(cfg, shared)
    clamp_gate = glu.gate_limit is not None
    if clamp_gate and not glu.gate_clamp_after:
        gate = jnp.where(gate > glu.gate_limit, glu.gate_limit, gate)
    if glu.up_limit is not None:
        up = jnp.where(jnp.abs(up) > glu.up_limit, jnp.sign(up) * glu.up_limit, up)
    if glu.up_softcap is not None:
        up = glu.up_softcap * jnp.tanh(up / glu.up_softcap)
    if cfg.activation == "swiglu" and glu.gate_softcap is not None:
        activated = glu.gate_softcap * jnp.tanh(gate / glu.gate_softcap) * jax.nn.sigmoid(gate)
    elif cfg.activation == "swiglu":
        activated = gate * jax.nn.sigmoid(glu.sigmoid_scale * gate)
    else:
        activated = _gelu(cfg, gate)
    if clamp_gate and glu.gate_clamp_after:
        activated = jnp.where(activated > glu.gate_limit, glu.gate_limit, activated)
    return activated * (up + glu.up_offset)


def _rms_norm(tokens: jax.Array, eps: float) -> jax.Array:
    return tokens * (jnp.mean(tokens**2, axis=-1, keepdims=True) + eps) ** -0.5


def _router_input(cfg: ReferenceConfig, tokens: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    """The tokens as the router sees them: normalised, scaled and over sqrt(D) (Gemma 4)."""
    if cfg.router_norm_eps is None:
        return tokens
    normed = _rms_norm(tokens, cfg.router_norm_eps) * p["router_input_scale"][None]
    return normed * tokens.shape[-1] ** -0.5


def dense_moe(
    params: dict[str, jax.Array], x: jax.Array, cfg: ReferenceConfig
) -> tuple[jax.Array, ReferenceAux]:
    """y [batch, seq, embed] float32 and aux: y[t] = sum_e combine[t, e] * expert_e(x[t])
    (+ shared(x[t])), every token through every expert."""
    batch, seq, embed = x.shape
    num_tokens = batch * seq
    check_reference_args(cfg, params, num_tokens)
    tokens = x.reshape(num_tokens, embed).astype(jnp.float32)
    p = {name: value.astype(jnp.float32) for name, value in params.items()}
    gated = cfg.activation in GATED_ACTIVATIONS
    biased = "b_up" in p

    r = route(
        _router_input(cfg, tokens, p),
        p["router"],
        cfg,
        p.get("routing_bias"),
        p.get("router_bias"),
        p.get("per_expert_scale"),
        p.get("router_scale"),
    )
    weights = jnp.where(r.kept, r.weights, 0.0)
    # Identity experts, the router's columns past the experts, return the token, weighted;
    # zero experts, the columns after them, contribute nothing.
    experts = p["w_up"].shape[0]
    identity_weights = weights[:, experts : experts + cfg.identity_experts]
    identity = highest_einsum("tx,td->td", identity_weights, tokens)
    weights, kept = weights[:, :experts], r.kept[:, :experts]
    if cfg.expert_norm_eps is not None:  # the experts run on the normalised tokens
        tokens = _rms_norm(tokens, cfg.expert_norm_eps) * p["expert_input_norm"][None]
    routed = _latent(tokens, p, "in")
    # Weighting the input scales x before the bias of each projection: w * (x @ W) + b.
    input_scale = weights[:, :, None] if cfg.weights_on_input else 1.0

    def projection(name: str) -> jax.Array:
        value = highest_einsum("td,edf->tef", routed, p[f"w_{name}"]) * input_scale
        return value + p[f"b_{name}"][None] if biased else value

    hidden = _hidden(cfg, projection("gate") if gated else None, projection("up"))
    out = highest_einsum("tef,efd->ted", hidden, p["w_down"])
    if biased:
        out = out + p["b_down"][None]
    if cfg.expert_output_norm_eps is not None:  # each expert's own output, by its own weight
        out = _rms_norm(out, cfg.expert_output_norm_eps) * p["expert_output_norm"][None]
    combine = jnp.where(kept, 1.0, 0.0) if cfg.weights_on_input else weights
    y = _latent(highest_einsum("txd,tx->td", out, combine), p, "out") + identity

    if "shared_up" in p:
        y = y + _shared_expert(cfg, tokens, p, gated, r.shared)
    if cfg.output_norm_eps is not None:  # the whole output, normalised
        y = _rms_norm(y, cfg.output_norm_eps) * p["output_norm"][None]

    aux = _reference_aux(cfg, r, batch)
    return y.reshape(batch, seq, embed), aux


def _reference_aux(cfg: ReferenceConfig, r: Routing, batch: int) -> ReferenceAux:
    """Copies chosen and dropped per expert, and the router's weighted losses."""
    counts = r.chosen.sum(axis=0).astype(jnp.int32)
    dropped = (r.chosen & ~r.kept).sum(axis=0).astype(jnp.int32)
    load_balance = jnp.zeros((), jnp.float32)
    if cfg.load_balance_weight:
        load_balance = cfg.load_balance_weight * _balance_term(cfg, r, counts, batch)
    z_loss = jnp.zeros((), jnp.float32)
    if cfg.z_loss_weight:
        z_loss = cfg.z_loss_weight * jnp.mean(jax.nn.logsumexp(r.logits, axis=-1) ** 2)
    return ReferenceAux(counts, dropped, load_balance.astype(jnp.float32), z_loss)


def _latent(values: jax.Array, p: dict[str, jax.Array], way: str) -> jax.Array:
    """`values` through latent_in or latent_out ("in", "out") and its bias, where the params
    have them; unchanged where they have none."""
    if "latent_in" not in p:
        return values
    projected = highest_einsum("td,dl->tl", values, p[f"latent_{way}"])
    bias = p.get(f"latent_{way}_bias")
    return projected if bias is None else projected + bias[None]


def _shared_expert(
    cfg: ReferenceConfig,
    tokens: jax.Array,
    p: dict[str, jax.Array],
    gated: bool,
    router_weights: jax.Array,
) -> jax.Array:
    """The always-on shared expert, with its biases and output gate where it has them; where
    the router weighs the shared experts (router_weights [T, S], S > 0), each of the S equal
    blocks of its hidden units times its weight."""
    biased = "shared_b_up" in p

    def projection(name: str) -> jax.Array:
        value = highest_einsum("td,ds->ts", tokens, p[f"shared_{name}"])
        return value + p[f"shared_b_{name}"][None] if biased else value

    hidden = _hidden(cfg, projection("gate") if gated else None, projection("up"), shared=True)
    if cfg.weighed_shared_experts:
        count = cfg.weighed_shared_experts
        blocks = hidden.reshape(hidden.shape[0], count, -1) * router_weights[:, :, None]
        hidden = blocks.reshape(hidden.shape)
    shared = highest_einsum("ts,sd->td", hidden, p["shared_down"])
    if biased:
        shared = shared + p["shared_b_down"][None]
    if cfg.shared_output_norm_eps is not None:
        shared = _rms_norm(shared, cfg.shared_output_norm_eps) * p["shared_output_norm"][None]
    if "shared_expert_gate" in p:
        share = jax.nn.sigmoid(highest_einsum("td,d->t", tokens, p["shared_expert_gate"]))
        shared = shared * share[:, None]
    return shared


def _balance_term(cfg: ReferenceConfig, r: Routing, counts: jax.Array, batch: int) -> jax.Array:
    """E * sum_e f_e * P_e, the counts constant (no gradient). switch: f_e the share of the
    copies, P_e the mean softmax (or normalised score); transformers: f_e the top-k of the
    softmax of the logits per token (whatever the layer selects), P_e the mean softmax;
    sequence: per sequence, f_e its share of the sequence's picks times E / k, P_e its mean
    normalised score there, averaged over the sequences."""
    tokens, experts = r.logits.shape
    if cfg.load_balance_form == "sequence":
        normalised = r.scores / r.scores.sum(axis=-1, keepdims=True)
        probs = normalised.reshape(batch, -1, experts).mean(axis=1)
        picks = r.chosen.reshape(batch, -1, experts).astype(jnp.float32).mean(axis=1)
        return experts / cfg.top_k * jnp.mean(jnp.sum(picks * probs, axis=-1))
    if cfg.load_balance_form == "transformers":
        probs = jax.nn.softmax(r.logits, axis=-1)
        # the logits' top-k, whatever the layer selected (pairwise, as everything here)
        picks = (rank(r.logits) < cfg.top_k).sum(axis=0).astype(jnp.float32)
        return experts * jnp.sum(picks / tokens * probs.mean(axis=0))
    if cfg.score == "softmax":
        probs = jax.nn.softmax(r.logits, axis=-1)
    else:
        probs = r.scores / r.scores.sum(axis=-1, keepdims=True)
    fraction = counts.astype(jnp.float32) / (tokens * cfg.top_k)
    return experts * jnp.sum(fraction * probs.mean(axis=0))


def tokens_per_expert(
    params: dict[str, jax.Array], x: jax.Array, cfg: ReferenceConfig
) -> jax.Array:
    """How many token copies the router sends each expert (before dropping), [experts] int32."""
    check_reference_args(cfg, params, x.shape[0] * x.shape[1])
    tokens = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    p = {name: value.astype(jnp.float32) for name, value in params.items()}
    tokens = _router_input(cfg, tokens, p)
    biases = [p.get(name) for name in ("routing_bias", "router_bias")]
    return router_combine(tokens, p["router"], cfg, *biases)[1]
