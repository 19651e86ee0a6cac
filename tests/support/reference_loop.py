"""The slow per-token loop the dense reference is checked against: float64 numpy, one token and one expert at a time, written from the definition."""

from __future__ import annotations

import math

import numpy as np
from reference_cases import GATED

from moegen.verify.reference.layer import ReferenceAux, ReferenceConfig, dense_moe


def slow_score(logits: list[float], score: str) -> list[float]:
    if score == "softmax":
        peak = max(logits)
        exps = [math.exp(v - peak) for v in logits]
        return [v / sum(exps) for v in exps]
    if score == "sigmoid":
        return [1.0 / (1.0 + math.exp(-v)) for v in logits]
    if score == "sqrtsoftplus":
        return [math.sqrt(math.log1p(math.exp(v))) for v in logits]
    raise AssertionError(score)


def slow_route(token: np.ndarray, params: dict[str, np.ndarray], cfg: ReferenceConfig):
    """One token: (logits, scores, chosen expert ids in k-slot order, their final weights)."""
    router = params["router"].astype(np.float64)
    embed, experts = router.shape
    logits = [float(sum(token[d] * router[d, e] for d in range(embed))) for e in range(experts)]
    if "router_bias" in params:
        logits = [v + float(b) for v, b in zip(logits, params["router_bias"], strict=True)]
    if cfg.logit_softcap is not None:
        cap = cfg.logit_softcap
        logits = [cap * math.tanh(v / cap) for v in logits]
    scores = slow_score(logits, cfg.score)
    by_logit = cfg.score in ("sigmoid", "sqrtsoftplus") and "routing_bias" not in params
    if cfg.score_after_top_k or (by_logit and cfg.num_groups == 1):
        selection = list(logits)
    elif "routing_bias" in params:
        biased = logits if cfg.bias_on_logits else scores
        selection = [s + float(b) for s, b in zip(biased, params["routing_bias"], strict=True)]
    else:
        selection = list(scores)

    candidates = list(range(experts))
    if cfg.num_groups > 1:
        size = experts // cfg.num_groups
        per_group = cfg.group_top_n
        group_score = [
            sum(sorted(selection[g * size : (g + 1) * size], reverse=True)[:per_group])
            for g in range(cfg.num_groups)
        ]
        # Highest first; on a tie the lower index wins (as jax.lax.top_k).
        groups = sorted(range(cfg.num_groups), key=lambda g: (-group_score[g], g))
        candidates = [e for e in candidates if e // size in groups[: cfg.top_groups]]
    chosen = sorted(candidates, key=lambda e: (-selection[e], e))[: cfg.top_k]

    if cfg.score_after_top_k:
        peak = max(logits[e] for e in chosen)
        exps = [math.exp(logits[e] - peak) for e in chosen]
        weights = [v / sum(exps) for v in exps]
    else:
        weights = [scores[e] for e in chosen]
    if cfg.renormalize:
        total = sum(weights) + cfg.renormalize_epsilon
        weights = [w / total for w in weights]
    if "per_expert_scale" in params:
        weights = [
            w * float(params["per_expert_scale"][e]) for w, e in zip(weights, chosen, strict=True)
        ]
    weights = [w * cfg.routed_scaling for w in weights]
    return logits, scores, chosen, weights


def act_name(cfg: ReferenceConfig) -> str:
    """The activation's name, with _tanh where GELU is the tanh approximation."""
    tanh = cfg.gelu_tanh and cfg.activation in ("geglu", "gelu")
    return f"{cfg.activation}_tanh" if tanh else cfg.activation


def slow_act(name: str, v: np.ndarray) -> np.ndarray:
    if name == "swiglu":
        return v / (1.0 + np.exp(-v))
    if name in ("geglu_tanh", "gelu_tanh"):  # GELU's tanh approximation
        inner = math.sqrt(2.0 / math.pi)
        return np.array([0.5 * u * (1.0 + math.tanh(inner * (u + 0.044715 * u**3))) for u in v])
    if name in ("geglu", "gelu"):
        return np.array([0.5 * u * (1.0 + math.erf(u / math.sqrt(2.0))) for u in v])
    if name == "relu2":
        return np.maximum(v, 0.0) ** 2
    if name == "relu":
        return np.maximum(v, 0.0)
    raise AssertionError(name)


def slow_glu(
    cfg: ReferenceConfig, gate: np.ndarray, up: np.ndarray, shared: bool = False
) -> np.ndarray:
    """act(gate) * (up + offset), with the clamps (the gate's before or after the activation);
    swiglu's sigmoid scaled. The shared expert's own parameters where it has them."""
    own = cfg.shared_glu if shared and cfg.shared_glu is not None else None
    glu = own if own is not None else cfg
    gate_limit = glu.gate_limit
    after = glu.gate_clamp_after
    if gate_limit is not None and not after:
        gate = np.array([min(g, gate_limit) for g in gate])
    if glu.up_limit is not None:
        up = np.array([max(-glu.up_limit, min(u, glu.up_limit)) for u in up])
    if glu.up_softcap is not None:
        up = np.array([glu.up_softcap * math.tanh(u / glu.up_softcap) for u in up])
    if cfg.activation == "swiglu" and glu.gate_softcap is not None:
        cap = glu.gate_softcap
        activated = np.array([cap * math.tanh(g / cap) / (1.0 + math.exp(-g)) for g in gate])
    elif cfg.activation == "swiglu":
        activated = np.array([g / (1.0 + math.exp(-glu.sigmoid_scale * g)) for g in gate])
    else:
        activated = slow_act(act_name(cfg), gate)
    if gate_limit is not None and after:
        activated = np.array([min(a, gate_limit) for a in activated])
    return activated * (up + glu.up_offset)


def slow_expert(
    token: np.ndarray, p: dict[str, np.ndarray], e: int, cfg: ReferenceConfig
) -> np.ndarray:
    act = cfg.activation
    up = token @ p["w_up"][e]
    if "b_up" in p:
        up = up + p["b_up"][e]
    if act in GATED:
        gate = token @ p["w_gate"][e]
        if "b_gate" in p:
            gate = gate + p["b_gate"][e]
        hidden = slow_glu(cfg, gate, up)
    else:
        hidden = slow_act(act_name(cfg), up)
    out = hidden @ p["w_down"][e]
    if "b_down" in p:
        out = out + p["b_down"][e]
    if cfg.expert_output_norm_eps is not None:  # this expert's own norm, before its weight
        out = slow_rms_norm(out, cfg.expert_output_norm_eps) * p["expert_output_norm"][e]
    return out


def slow_shared(token: np.ndarray, p: dict[str, np.ndarray], cfg: ReferenceConfig) -> np.ndarray:
    biases = "shared_b_up" in p
    up = token @ p["shared_up"] + (p["shared_b_up"] if biases else 0.0)
    if cfg.activation in GATED:
        gate = token @ p["shared_gate"] + (p["shared_b_gate"] if biases else 0.0)
        hidden = slow_glu(cfg, gate, up, shared=True)
    else:
        hidden = slow_act(act_name(cfg), up)
    out = hidden @ p["shared_down"] + (p["shared_b_down"] if biases else 0.0)
    if cfg.shared_output_norm_eps is not None:  # its own norm, before its gate
        out = slow_rms_norm(out, cfg.shared_output_norm_eps) * p["shared_output_norm"]
    if "shared_expert_gate" in p:
        out = out / (1.0 + math.exp(-float(token @ p["shared_expert_gate"])))
    return out


def slow_latent(token: np.ndarray, p: dict[str, np.ndarray], way: str) -> np.ndarray:
    """One token (or one token's expert output) through latent_in or latent_out, and its
    bias where there is one."""
    out = token @ p[f"latent_{way}"]
    return out + p[f"latent_{way}_bias"] if f"latent_{way}_bias" in p else out


def slow_rms_norm(token: np.ndarray, eps: float) -> np.ndarray:
    return token / math.sqrt(sum(v * v for v in token) / len(token) + eps)


def slow_router_input(token: np.ndarray, p: dict[str, np.ndarray], cfg: ReferenceConfig):
    """The token as the router sees it (Gemma 4: normalised, scaled, over sqrt(D))."""
    if cfg.router_norm_eps is None:
        return token
    scaled = slow_rms_norm(token, cfg.router_norm_eps) * p["router_input_scale"]
    return scaled / math.sqrt(len(token))


def slow_copies(routes: list) -> list[tuple[int, int, int, float]]:
    """Every routed copy as (token, k-slot, expert, weight), token by token, slot by slot."""
    return [
        (t, k, e, w)
        for t, (_, _, chosen, weights) in enumerate(routes)
        for k, (e, w) in enumerate(zip(chosen, weights, strict=True))
    ]


def slow_kept(copies: list, num_tokens: int, experts: int, cfg: ReferenceConfig) -> set:
    """The copies that fit each (device, expert)'s capacity; all of them without a capacity."""
    kept = set(copies)
    if cfg.capacity is not None:
        shard_of = [slow_device_of(t, num_tokens, cfg) for t in range(num_tokens)]
        for shard in range(cfg.token_shards * cfg.sequence_shards):
            for e in range(experts):
                mine = [c for c in copies if c[2] == e and shard_of[c[0]] == shard]
                if cfg.drop_policy == "position":
                    mine.sort(key=lambda c: (c[0], c[1]))
                else:
                    mine.sort(key=lambda c: (-c[3], c[0], c[1]))
                kept -= set(mine[cfg.capacity :])
    return kept


def slow_combine(
    tokens: np.ndarray, p: dict[str, np.ndarray], copies: list, kept: set, cfg: ReferenceConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, counts, dropped): every kept copy's weighted expert output summed into its token's
    row, plus the shared expert; every copy counted, kept or dropped."""
    num_tokens, experts = len(tokens), p["router"].shape[1]
    # Nemotron-H: the experts run in a latent width, between two projections of the token
    latent = "latent_in" in p
    routed = [slow_latent(token, p, "in") for token in tokens] if latent else tokens
    y = np.zeros((num_tokens, p["w_up"].shape[1]))
    counts = np.zeros(experts, np.int64)
    dropped = np.zeros(experts, np.int64)
    for t, k, e, w in copies:
        counts[e] += 1
        if (t, k, e, w) in kept:
            if cfg.weights_on_input:
                y[t] += slow_expert(w * routed[t], p, e, cfg)
            else:
                y[t] += w * slow_expert(routed[t], p, e, cfg)
        else:
            dropped[e] += 1
    if latent:
        y = np.array([slow_latent(row, p, "out") for row in y])
    if "shared_up" in p:
        for t in range(num_tokens):
            y[t] += slow_shared(tokens[t], p, cfg)
    return y, counts, dropped


def slow_losses(
    routes: list, counts: np.ndarray, batch: int, cfg: ReferenceConfig
) -> tuple[float, float]:
    """(load balance, router z-loss), both before their weights."""
    num_tokens, experts = len(routes), len(counts)
    fraction = counts / (num_tokens * cfg.top_k)
    transformers_form = cfg.load_balance_form == "transformers"
    if transformers_form:  # each token's top-k logits, per token, whatever the layer selects
        fraction = np.zeros(experts)
        for logits, _, _, _ in routes:
            for e in sorted(range(experts), key=lambda e: -logits[e])[: cfg.top_k]:
                fraction[e] += 1 / num_tokens
    mean_prob = np.zeros(experts)
    z_loss = 0.0
    for logits, scores, _, _ in routes:
        softmax = cfg.score == "softmax" or transformers_form
        probs = slow_score(logits, "softmax") if softmax else scores
        mean_prob += np.array(probs) / sum(probs) / num_tokens
        peak = max(logits)
        z_loss += (peak + math.log(sum(math.exp(v - peak) for v in logits))) ** 2 / num_tokens
    balance = experts * float(fraction @ mean_prob)
    if cfg.load_balance_form == "sequence":
        balance = slow_sequence_balance(routes, batch, experts, cfg.top_k)
    return balance, z_loss


def slow_moe(params: dict[str, np.ndarray], x: np.ndarray, cfg: ReferenceConfig) -> dict:
    """y, counts, dropped and both losses from the definition."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    batch, seq, embed = x.shape
    tokens = np.asarray(x, np.float64).reshape(batch * seq, embed)
    num_tokens, experts = len(tokens), p["router"].shape[1]
    routes = [slow_route(slow_router_input(token, p, cfg), p, cfg) for token in tokens]
    if cfg.expert_norm_eps is not None:  # the experts run on the normalised tokens
        tokens = np.array([slow_rms_norm(t, cfg.expert_norm_eps) for t in tokens])
        tokens = tokens * p["expert_input_norm"]
    copies = slow_copies(routes)
    kept = slow_kept(copies, num_tokens, experts, cfg)
    y, counts, dropped = slow_combine(tokens, p, copies, kept, cfg)
    if cfg.output_norm_eps is not None:  # the whole output, routed and shared, normalised
        y = np.array([slow_rms_norm(t, cfg.output_norm_eps) for t in y]) * p["output_norm"]
    balance, z_loss = slow_losses(routes, counts, batch, cfg)
    return {
        "y": y.reshape(batch, seq, embed),
        "counts": counts,
        "dropped": dropped,
        "load_balance": cfg.load_balance_weight * balance,
        "z_loss": cfg.z_loss_weight * z_loss,
    }


def slow_device_of(token: int, num_tokens: int, cfg: ReferenceConfig) -> int:
    """Which device holds this token: its sequence's batch shard, and with a sequence axis
    which part of the sequence."""
    seq_len = cfg.seq_len or num_tokens // cfg.token_shards
    sequence, position = divmod(token, seq_len)
    sequences_per_shard = num_tokens // seq_len // cfg.token_shards
    part = position * cfg.sequence_shards // seq_len
    return sequence // sequences_per_shard * cfg.sequence_shards + part


def slow_sequence_balance(routes: list, batch: int, experts: int, top_k: int) -> float:
    """DeepSeek-V3's sequence-wise balance loss from its definition, averaged over sequences:
    per sequence, sum_i f_i P_i, f_i = E / (k T) * picks of i, P_i = mean of s_i / sum_j s_j."""
    seq = len(routes) // batch
    total = 0.0
    for b in range(batch):
        mine = routes[b * seq : (b + 1) * seq]
        for i in range(experts):
            f = experts / (top_k * seq) * sum(i in chosen for _, _, chosen, _ in mine)
            p = sum(scores[i] / sum(scores) for _, scores, _, _ in mine) / seq
            total += f * p
    return total / batch


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def check_against_loop(params, x, cfg, want=None) -> tuple[np.ndarray, ReferenceAux, dict]:
    want = slow_moe(params, x, cfg) if want is None else want
    y, aux = dense_moe(params, x, cfg)
    got = np.asarray(y)
    assert got.shape == x.shape and got.dtype == np.float32
    assert relative_error(got, want["y"]) < 1e-5
    np.testing.assert_allclose(got, want["y"], rtol=1e-4, atol=1e-5)
    for field in aux:
        assert field.shape == (() if field.ndim == 0 else (params["router"].shape[1],))
    assert aux.tokens_per_expert.dtype == np.int32 and aux.dropped_per_expert.dtype == np.int32
    assert aux.load_balance_loss.dtype == np.float32 and aux.router_z_loss.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(aux.tokens_per_expert), want["counts"])
    np.testing.assert_array_equal(np.asarray(aux.dropped_per_expert), want["dropped"])
    np.testing.assert_allclose(float(aux.load_balance_loss), want["load_balance"], rtol=1e-5)
    np.testing.assert_allclose(float(aux.router_z_loss), want["z_loss"], rtol=1e-5)
    return got, aux, want
