"""The dense reference the twin is checked against, checked against a slow per-token loop.

The loop is written from the definition (route each token on its own, sort the copies of each
expert to apply its capacity, run the chosen experts one by one) in float64 numpy, sharing
nothing with `moegen.verify.reference` but the config dataclass it reads.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moegen.verify.reference import (
    ReferenceAux,
    ReferenceConfig,
    RouterConfig,
    dense_moe,
    router_combine,
    tokens_per_expert,
)

GATED = ("swiglu", "geglu")


@dataclass(frozen=True)
class Case:
    shape: tuple[int, int, int, int, int]  # batch, seq_len, embed_dim, ffn_dim, num_experts
    cfg: ReferenceConfig
    routing_bias: bool = False
    ffn_biases: bool = False
    shared: int = 0  # shared expert width; 0 = none
    zero_router_columns: tuple[int, ...] = ()  # experts whose logits are exactly 0 (ties)
    repeat_tokens: bool = False  # every odd token repeats the one before it (ties)
    drops: bool | None = None  # capacity really drops something (True) or nothing (False)


# Few shapes, so that op-by-op dispatch compiles each operation once for many cases.
S4 = (2, 8, 6, 5, 4)  # 16 tokens, 4 experts
S8 = (2, 4, 8, 6, 8)  # 8 tokens, 8 experts
S16 = (2, 4, 8, 4, 16)  # 8 tokens, 16 experts


def C(**kw) -> ReferenceConfig:
    return ReferenceConfig(**kw)


CASES = {
    "mixtral": Case(S8, C(top_k=2, score="softmax", renormalize=True)),
    "switch_top1": Case(S4, C(top_k=1, score="softmax")),
    "softmax_top4_plain": Case(S8, C(top_k=4, score="softmax")),
    "sqrtsoftplus": Case(
        S8,
        C(
            top_k=2,
            score="sqrtsoftplus",
            renormalize=True,
            load_balance_weight=0.3,
            z_loss_weight=0.05,
        ),
    ),
    "sigmoid_bias": Case(S8, C(top_k=2, score="sigmoid", renormalize=True), routing_bias=True),
    "sigmoid_scaled_plain": Case(S8, C(top_k=3, score="sigmoid", routed_scaling=1.5)),
    "deepseek_v2_groups": Case(
        S16,
        C(top_k=4, score="softmax", num_groups=4, top_groups=2, routed_scaling=16.0),
    ),
    "deepseek_v3": Case(
        S16,
        C(
            top_k=4,
            score="sigmoid",
            renormalize=True,
            routed_scaling=2.5,
            num_groups=4,
            top_groups=2,
            load_balance_weight=0.2,
            z_loss_weight=0.01,
        ),
        routing_bias=True,
        shared=6,
    ),
    "gpt_oss": Case(
        S8,
        C(
            top_k=4,
            score="softmax",
            score_after_top_k=True,
            load_balance_weight=0.1,
            z_loss_weight=0.02,
        ),
        ffn_biases=True,
    ),
    "llama4": Case(S8, C(top_k=1, score="sigmoid"), shared=6),
    "geglu": Case(S4, C(top_k=2, score="softmax", activation="geglu")),
    "gelu": Case(S4, C(top_k=2, score="softmax", activation="gelu")),
    "relu_biases_shared": Case(
        S4,
        C(top_k=2, score="sigmoid", renormalize=True, activation="relu", load_balance_weight=1.0),
        ffn_biases=True,
        shared=6,
    ),
    "swiglu_biases": Case(S4, C(top_k=2, score="softmax"), ffn_biases=True),
    "capacity_position": Case(
        S4,
        C(top_k=2, score="softmax", renormalize=True, capacity=3, drop_policy="position"),
        drops=True,
    ),
    "capacity_probability": Case(
        S4,
        C(
            top_k=2,
            score="softmax",
            renormalize=True,
            capacity=3,
            token_shards=2,
            load_balance_weight=0.5,
            z_loss_weight=0.1,
        ),
        drops=True,
    ),
    "capacity_position_shards": Case(
        S4,
        C(top_k=2, score="sigmoid", capacity=2, drop_policy="position", token_shards=4),
        drops=True,
    ),
    "capacity_probability_top1": Case(
        S4, C(top_k=1, score="softmax", capacity=2, token_shards=2), drops=True
    ),
    "capacity_roomy": Case(
        S4, C(top_k=2, score="softmax", capacity=8, token_shards=2), drops=False
    ),
    "capacity_zero_shared": Case(S4, C(top_k=2, score="softmax", capacity=0), shared=6, drops=True),
    "ties": Case(
        S4,
        C(top_k=2, score="sigmoid", capacity=3, token_shards=2),
        zero_router_columns=(1, 2),
        repeat_tokens=True,
        drops=True,
    ),
    "group_ties": Case(
        S8,
        C(top_k=2, score="sigmoid", num_groups=4, top_groups=2),
        zero_router_columns=(2, 3, 6, 7),
    ),
    "deepseek_v3_capacity": Case(
        S16,
        C(
            top_k=4,
            score="sigmoid",
            renormalize=True,
            routed_scaling=2.5,
            num_groups=4,
            top_groups=2,
            capacity=1,
            token_shards=2,
            load_balance_weight=0.2,
        ),
        routing_bias=True,
        shared=6,
        drops=True,
    ),
    "gpt_oss_capacity_position": Case(
        S8,
        C(
            top_k=4,
            score="softmax",
            score_after_top_k=True,
            capacity=1,
            drop_policy="position",
            token_shards=4,
            z_loss_weight=0.02,
        ),
        ffn_biases=True,
        drops=True,
    ),
}
GRADIENT_CASES = [
    "deepseek_v3",
    "gpt_oss",
    "capacity_probability",
    "relu_biases_shared",
    "sqrtsoftplus",
]


def make_params(case: Case, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    batch, seq, embed, ffn, experts = case.shape
    rng = np.random.default_rng(seed)

    def normal(scale, shape):
        return rng.normal(0, scale, shape).astype(np.float32)

    router = normal(1.0, (embed, experts))
    router[:, list(case.zero_router_columns)] = 0.0
    params = {"router": router}
    if case.routing_bias:
        params["routing_bias"] = normal(0.3, (experts,))
    gated = case.cfg.activation in GATED
    if gated:
        params["w_gate"] = normal(embed**-0.5, (experts, embed, ffn))
    params["w_up"] = normal(embed**-0.5, (experts, embed, ffn))
    params["w_down"] = normal(ffn**-0.5, (experts, ffn, embed))
    if case.ffn_biases:
        if gated:
            params["b_gate"] = normal(0.2, (experts, ffn))
        params["b_up"] = normal(0.2, (experts, ffn))
        params["b_down"] = normal(0.2, (experts, embed))
    if case.shared:
        if gated:
            params["shared_gate"] = normal(embed**-0.5, (embed, case.shared))
        params["shared_up"] = normal(embed**-0.5, (embed, case.shared))
        params["shared_down"] = normal(case.shared**-0.5, (case.shared, embed))
    x = normal(1.0, (batch, seq, embed))
    if case.repeat_tokens:
        flat = x.reshape(batch * seq, embed)
        flat[1::2] = flat[0::2]
        x = flat.reshape(batch, seq, embed)
    return params, x


def case_data(name: str) -> tuple[Case, dict[str, np.ndarray], np.ndarray]:
    case = CASES[name]
    params, x = make_params(case, seed=zlib.crc32(name.encode()))
    return case, params, x


# ----------------------------------------------------------------------------------------------
# The slow loop, float64, one token and one expert at a time.


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
    scores = slow_score(logits, cfg.score)
    if cfg.score_after_top_k:
        selection = list(logits)
    elif "routing_bias" in params:
        selection = [s + float(b) for s, b in zip(scores, params["routing_bias"], strict=True)]
    else:
        selection = list(scores)

    candidates = list(range(experts))
    if cfg.num_groups > 1:
        size = experts // cfg.num_groups
        per_group = cfg.top_k // cfg.top_groups
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
        total = sum(weights)
        weights = [w / total for w in weights]
    weights = [w * cfg.routed_scaling for w in weights]
    return logits, scores, chosen, weights


def slow_act(name: str, v: np.ndarray) -> np.ndarray:
    if name == "swiglu":
        return v / (1.0 + np.exp(-v))
    if name in ("geglu", "gelu"):
        return np.array([0.5 * u * (1.0 + math.erf(u / math.sqrt(2.0))) for u in v])
    if name == "relu":
        return np.maximum(v, 0.0)
    raise AssertionError(name)


def slow_expert(token: np.ndarray, p: dict[str, np.ndarray], e: int, act: str) -> np.ndarray:
    up = token @ p["w_up"][e]
    if "b_up" in p:
        up = up + p["b_up"][e]
    if act in GATED:
        gate = token @ p["w_gate"][e]
        if "b_gate" in p:
            gate = gate + p["b_gate"][e]
        hidden = slow_act(act, gate) * up
    else:
        hidden = slow_act(act, up)
    out = hidden @ p["w_down"][e]
    if "b_down" in p:
        out = out + p["b_down"][e]
    return out


def slow_shared(token: np.ndarray, p: dict[str, np.ndarray], act: str) -> np.ndarray:
    up = token @ p["shared_up"]
    hidden = slow_act(act, token @ p["shared_gate"]) * up if act in GATED else slow_act(act, up)
    return hidden @ p["shared_down"]


def slow_moe(params: dict[str, np.ndarray], x: np.ndarray, cfg: ReferenceConfig) -> dict:
    """y, counts, dropped and both losses from the definition."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    batch, seq, embed = x.shape
    tokens = np.asarray(x, np.float64).reshape(batch * seq, embed)
    num_tokens, experts = len(tokens), p["router"].shape[1]
    routes = [slow_route(token, p, cfg) for token in tokens]
    copies = [  # (token, k-slot, expert, weight)
        (t, k, e, w)
        for t, (_, _, chosen, weights) in enumerate(routes)
        for k, (e, w) in enumerate(zip(chosen, weights, strict=True))
    ]

    kept = set(copies)
    if cfg.capacity is not None:
        shard_size = num_tokens // cfg.token_shards
        for shard in range(cfg.token_shards):
            for e in range(experts):
                mine = [c for c in copies if c[2] == e and c[0] // shard_size == shard]
                if cfg.drop_policy == "position":
                    mine.sort(key=lambda c: (c[0], c[1]))
                else:
                    mine.sort(key=lambda c: (-c[3], c[0], c[1]))
                kept -= set(mine[cfg.capacity :])

    y = np.zeros((num_tokens, embed))
    counts = np.zeros(experts, np.int64)
    dropped = np.zeros(experts, np.int64)
    for t, k, e, w in copies:
        counts[e] += 1
        if (t, k, e, w) in kept:
            y[t] += w * slow_expert(tokens[t], p, e, cfg.activation)
        else:
            dropped[e] += 1
    if "shared_up" in p:
        for t in range(num_tokens):
            y[t] += slow_shared(tokens[t], p, cfg.activation)

    fraction = counts / (num_tokens * cfg.top_k)
    mean_prob = np.zeros(experts)
    z_loss = 0.0
    for logits, scores, _, _ in routes:
        probs = slow_score(logits, "softmax") if cfg.score == "softmax" else scores
        mean_prob += np.array(probs) / sum(probs) / num_tokens
        peak = max(logits)
        z_loss += (peak + math.log(sum(math.exp(v - peak) for v in logits))) ** 2 / num_tokens
    return {
        "y": y.reshape(batch, seq, embed),
        "counts": counts,
        "dropped": dropped,
        "load_balance": cfg.load_balance_weight * experts * float(fraction @ mean_prob),
        "z_loss": cfg.z_loss_weight * z_loss,
    }


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


# ----------------------------------------------------------------------------------------------
# The plain router over a grid of shapes (the original coverage).

# name -> (batch, seq_len, embed_dim, ffn_dim, num_experts)
SHAPES = {
    "one_token": (1, 1, 4, 3, 2),
    "tiny": (1, 3, 4, 5, 3),
    "rectangular": (2, 5, 8, 6, 4),
    "ffn_wider": (2, 4, 6, 16, 5),
    "many_experts": (2, 4, 6, 3, 16),
}
SCORES = ["softmax", "sigmoid", "sqrtsoftplus"]


def make_case(shape: tuple[int, ...], seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    return make_params(Case(shape, C(top_k=1, score="softmax")), seed)


@pytest.mark.parametrize("renorm", [False, True], ids=["plain", "renormalized"])
@pytest.mark.parametrize("top_k", [1, 2], ids=lambda k: f"top{k}")
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_dense_moe_equals_per_token_loop(shape, score, top_k, renorm):
    if top_k > SHAPES[shape][4]:
        pytest.skip("top_k > num_experts")
    params, x = make_case(
        SHAPES[shape], seed=zlib.crc32(f"{shape}-{score}-{top_k}-{renorm}".encode())
    )
    cfg = RouterConfig(top_k=top_k, score=score, renormalize=renorm)
    _, aux, _ = check_against_loop(params, x, cfg)
    counts = np.asarray(tokens_per_expert(params, x, cfg))
    assert counts.dtype == np.int32
    np.testing.assert_array_equal(counts, np.asarray(aux.tokens_per_expert))
    assert counts.sum() == x.shape[0] * x.shape[1] * top_k
    assert not np.asarray(aux.dropped_per_expert).any()
    assert float(aux.load_balance_loss) == 0.0 and float(aux.router_z_loss) == 0.0


# ----------------------------------------------------------------------------------------------
# Named, realistic cases: each feature alone and a few together.


@pytest.mark.parametrize("name", sorted(CASES))
def test_named_case_equals_per_token_loop(name):
    case, params, x = case_data(name)
    _, aux, want = check_against_loop(params, x, case.cfg)
    dropped = int(np.asarray(aux.dropped_per_expert).sum())
    if case.drops is True:
        assert dropped > 0
        # Capacity is per expert and per token shard: no shard keeps more than that.
        assert (want["counts"] - want["dropped"] <= case.cfg.capacity * case.cfg.token_shards).all()
    elif case.drops is False:
        assert dropped == 0
    if case.cfg.load_balance_weight:
        assert float(aux.load_balance_loss) > 0
    if case.cfg.z_loss_weight:
        assert float(aux.router_z_loss) > 0
    np.testing.assert_array_equal(
        np.asarray(tokens_per_expert(params, x, case.cfg)), np.asarray(aux.tokens_per_expert)
    )


def test_group_limit_and_bias_change_the_routing():
    """The group limit, the bias and the drop policy are not no-ops on these cases."""
    case, params, x = case_data("deepseek_v3")
    base = slow_moe(params, x, case.cfg)["counts"]
    ungrouped = replace(case.cfg, num_groups=1, top_groups=1)
    assert not np.array_equal(np.asarray(tokens_per_expert(params, x, ungrouped)), base)
    unbiased = {k: v for k, v in params.items() if k != "routing_bias"}
    assert not np.array_equal(np.asarray(tokens_per_expert(unbiased, x, case.cfg)), base)
    case, params, x = case_data("capacity_probability")
    by_position = replace(case.cfg, drop_policy="position")
    one_shard = replace(case.cfg, token_shards=1)
    ys = [np.asarray(dense_moe(params, x, c)[0]) for c in (case.cfg, by_position, one_shard)]
    assert not np.allclose(ys[0], ys[1]) and not np.allclose(ys[0], ys[2])


def test_ties_break_towards_lower_ids_and_earlier_tokens():
    case, params, x = case_data("ties")
    # Zero router columns give exactly equal scores (lower id first); each odd token repeats the
    # one before it, with exactly equal weights (the earlier token keeps its place first).
    tokens = jnp.asarray(x.reshape(-1, x.shape[-1]))
    router = jnp.asarray(params["router"])
    kept = np.asarray(router_combine(tokens, router, case.cfg)[0]) > 0
    chosen = np.asarray(router_combine(tokens, router, replace(case.cfg, capacity=None))[0]) > 0
    tied = list(case.zero_router_columns)
    for row in chosen[:, tied]:
        assert (np.sort(row)[::-1] == row).all()  # a tied expert only if the lower ones too
    assert 0 < chosen[:, tied].sum() < chosen[:, tied].size
    assert (kept[1::2] <= kept[0::2]).all()  # the repeat loses to the original
    assert (kept[1::2] != kept[0::2]).any() and (kept != chosen).any()


def test_capacity_zero_leaves_only_the_shared_expert():
    case, params, x = case_data("capacity_zero_shared")
    y, aux = dense_moe(params, x, case.cfg)
    np.testing.assert_array_equal(
        np.asarray(aux.dropped_per_expert), np.asarray(aux.tokens_per_expert)
    )
    routed_only = {k: v for k, v in params.items() if not k.startswith("shared_")}
    assert not np.asarray(dense_moe(routed_only, x, case.cfg)[0]).any()
    assert np.abs(np.asarray(y)).max() > 0


def test_jit_matches_eager():
    case, params, x = case_data("deepseek_v3_capacity")
    eager = dense_moe(params, x, case.cfg)
    jitted = jax.jit(dense_moe, static_argnums=2)(params, x, case.cfg)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------------
# Gradients: the float32 reference against central differences of the float64 loop.


@pytest.mark.parametrize("name", GRADIENT_CASES)
def test_gradients_equal_finite_differences_of_the_loop(name):
    case, params, x = case_data(name)
    cfg = case.cfg
    rng = np.random.default_rng(zlib.crc32(f"grad-{name}".encode()))
    cotangent = rng.normal(size=x.shape)

    parts = ["y"] + [k for k in ("load_balance", "z_loss") if getattr(cfg, f"{k}_weight")]
    assert len(parts) > 1

    def losses(p, xs):
        y, aux = dense_moe(p, xs, cfg)
        every = {
            "y": jnp.sum(y * jnp.asarray(cotangent, jnp.float32)),
            "load_balance": aux.load_balance_loss,
            "z_loss": aux.router_z_loss,
        }
        return jnp.stack([every[k] for k in parts])

    jacobian, jacobian_x = jax.jit(jax.jacrev(losses, argnums=(0, 1)))(params, x)
    jacobian = {k: np.asarray(v, np.float64) for k, v in jacobian.items()}
    jacobian["x"] = np.asarray(jacobian_x, np.float64)
    if "routing_bias" in params:
        assert not jacobian["routing_bias"].any()  # the bias selects, it never weighs

    def slow_losses(inputs) -> np.ndarray:
        out = slow_moe({k: v for k, v in inputs.items() if k != "x"}, inputs["x"], cfg)
        every = out | {"y": float(np.sum(out["y"] * cotangent))}
        return np.array([every[k] for k in parts])

    inputs = {"x": x.astype(np.float64)} | {k: v.astype(np.float64) for k, v in params.items()}
    eps = 1e-5
    for key, value in inputs.items():
        if key == "routing_bias":
            continue
        direction = rng.normal(size=value.shape)
        plus, minus = (
            slow_losses(inputs | {key: value + sign * eps * direction}) for sign in (1.0, -1.0)
        )
        want = (plus - minus) / (2 * eps)
        terms = jacobian[key] * direction  # [parts, *shape]
        got = terms.reshape(len(parts), -1).sum(-1)
        scale = np.abs(terms).reshape(len(parts), -1).sum(-1)
        tolerance = 1e-4 * np.maximum(np.abs(want), scale) + 1e-9
        assert (np.abs(got - want) <= tolerance).all(), (key, parts, got, want)


def test_routing_bias_gets_exactly_zero_gradient_through_everything():
    case, params, x = case_data("deepseek_v3_capacity")
    cfg = replace(case.cfg, z_loss_weight=0.1)

    def loss(p):
        y, aux = dense_moe(p, x, cfg)
        return jnp.sum(y) + aux.load_balance_loss + aux.router_z_loss

    grads = jax.jit(jax.grad(loss))(params)
    assert not np.asarray(grads["routing_bias"]).any()
    assert all(np.isfinite(np.asarray(g)).all() for g in grads.values())


# ----------------------------------------------------------------------------------------------
# Smaller properties.


def test_tokens_per_expert_equals_numpy_count():
    params, x = make_case(SHAPES["many_experts"], seed=7)
    for top_k in (1, 2, 4):
        cfg = RouterConfig(top_k=top_k, score="softmax", renormalize=False)
        logits = x.reshape(-1, x.shape[-1]).astype(np.float64) @ params["router"].astype(np.float64)
        top = np.argsort(-logits, axis=-1, kind="stable")[:, :top_k]  # softmax keeps the order
        want = np.bincount(top.reshape(-1), minlength=params["router"].shape[1])
        np.testing.assert_array_equal(np.asarray(tokens_per_expert(params, x, cfg)), want)


def test_renormalized_weights_sum_to_one_and_plain_ones_do_not():
    params, x = make_case(SHAPES["rectangular"], seed=3)
    tokens = jnp.asarray(x.reshape(-1, x.shape[-1]))
    for score in SCORES:
        renormed, _ = router_combine(
            tokens, jnp.asarray(params["router"]), RouterConfig(2, score, True)
        )
        np.testing.assert_allclose(np.asarray(renormed).sum(-1), 1.0, rtol=1e-6)
        plain, _ = router_combine(
            tokens, jnp.asarray(params["router"]), RouterConfig(2, score, False)
        )
        assert not np.allclose(np.asarray(plain).sum(-1), 1.0)
        assert ((np.asarray(plain) > 0).sum(-1) == 2).all()  # exactly top_k nonzero weights
        scaled, _ = router_combine(
            tokens,
            jnp.asarray(params["router"]),
            RouterConfig(2, score, True, routed_scaling=2.5),
        )
        np.testing.assert_allclose(np.asarray(scaled).sum(-1), 2.5, rtol=1e-6)


def test_dense_moe_computes_in_float32_from_bfloat16_inputs():
    case, params, x = case_data("deepseek_v3")
    low = {k: jnp.asarray(v, jnp.bfloat16) for k, v in params.items()}
    low_x = jnp.asarray(x, jnp.bfloat16)
    rounded = {k: np.asarray(v, np.float32) for k, v in low.items()}
    check_against_loop(low, low_x, case.cfg, want=slow_moe(rounded, np.asarray(low_x), case.cfg))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"score": "relu"}, "unknown score function 'relu'"),
        ({"activation": "tanh"}, "unknown activation 'tanh'"),
        ({"drop_policy": "random"}, "unknown drop policy 'random'"),
        ({"score": "sigmoid", "score_after_top_k": True}, "score_after_top_k needs"),
        ({"num_groups": 3}, "do not split into 3 groups"),
        ({"num_groups": 4, "top_groups": 5}, "top_groups 5 not in"),
        ({"num_groups": 4, "top_groups": 3, "top_k": 2}, "top_k 2 needs"),
        ({"capacity": 2, "token_shards": 5}, "tokens do not split into 5 shards"),
        ({"activation": "relu"}, "unexpected parameters for relu: \\['w_gate'\\]"),
    ],
)
def test_bad_configs_are_refused(change, message):
    _, params, x = case_data("mixtral")
    cfg = replace(CASES["mixtral"].cfg, **change)
    with pytest.raises(ValueError, match=message):
        dense_moe(params, x, cfg)


def test_incomplete_parameter_sets_are_refused():
    _, params, x = case_data("swiglu_biases")
    cfg = CASES["swiglu_biases"].cfg
    with pytest.raises(ValueError, match="come all together"):
        dense_moe({k: v for k, v in params.items() if k != "b_gate"}, x, cfg)
    with pytest.raises(ValueError, match="missing parameters \\['w_gate'\\]"):
        dense_moe({k: v for k, v in params.items() if k != "w_gate"}, x, cfg)
