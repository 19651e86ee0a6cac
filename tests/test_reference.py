"""The dense reference the twin is checked against, checked against a slow per-token loop.

The loop is written from the definition (route each token on its own, run its chosen experts
one by one) in float64 numpy, sharing nothing with `moegen.verify.reference`.
"""

from __future__ import annotations

import zlib

import jax.numpy as jnp
import numpy as np
import pytest

from moegen.verify.reference import (
    RouterConfig,
    dense_moe,
    router_combine,
    tokens_per_expert,
)

# name -> (batch, seq_len, embed_dim, ffn_dim, num_experts)
SHAPES = {
    "one_token": (1, 1, 4, 3, 2),
    "tiny": (1, 3, 4, 5, 3),
    "rectangular": (2, 5, 8, 6, 4),
    "ffn_wider": (2, 4, 6, 16, 5),
    "many_experts": (2, 4, 6, 3, 16),
}
SCORES = ["softmax", "sigmoid"]
TOP_KS = [1, 2]
RENORMALIZE = [False, True]


def make_case(shape: tuple[int, ...], seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    batch, seq, embed, ffn, experts = shape
    rng = np.random.default_rng(seed)
    params = {
        "router": rng.normal(0, 1.0, (embed, experts)).astype(np.float32),
        "w_gate": rng.normal(0, embed**-0.5, (experts, embed, ffn)).astype(np.float32),
        "w_up": rng.normal(0, embed**-0.5, (experts, embed, ffn)).astype(np.float32),
        "w_down": rng.normal(0, ffn**-0.5, (experts, ffn, embed)).astype(np.float32),
    }
    x = rng.normal(0, 1.0, (batch, seq, embed)).astype(np.float32)
    return params, x


def slow_route(token: np.ndarray, router: np.ndarray, score: str, top_k: int, renorm: bool):
    """One token: (expert ids, their weights), in the order of decreasing score."""
    logits = [
        float(sum(token[d] * router[d, e] for d in range(len(token))))
        for e in range(router.shape[1])
    ]
    if score == "softmax":
        peak = max(logits)
        exps = [np.exp(v - peak) for v in logits]
        scores = [v / sum(exps) for v in exps]
    else:
        scores = [1.0 / (1.0 + np.exp(-v)) for v in logits]
    # Highest score first; on a tie the lower expert id wins (as jax.lax.top_k).
    chosen = sorted(range(len(scores)), key=lambda e: (-scores[e], e))[:top_k]
    weights = [scores[e] for e in chosen]
    if renorm:
        total = sum(weights)
        weights = [w / total for w in weights]
    return chosen, weights


def slow_expert(token: np.ndarray, params: dict[str, np.ndarray], e: int) -> np.ndarray:
    """swiglu expert e on one token: down(silu(x @ gate) * (x @ up))."""
    gate = token @ params["w_gate"][e].astype(np.float64)
    up = token @ params["w_up"][e].astype(np.float64)
    silu = gate / (1.0 + np.exp(-gate))
    return (silu * up) @ params["w_down"][e].astype(np.float64)


def slow_moe(params, x, score, top_k, renorm):
    batch, seq, embed = x.shape
    y = np.zeros((batch, seq, embed), np.float64)
    counts = np.zeros(params["router"].shape[1], np.int64)
    router = params["router"].astype(np.float64)
    for b in range(batch):
        for s in range(seq):
            token = x[b, s].astype(np.float64)
            chosen, weights = slow_route(token, router, score, top_k, renorm)
            for e, w in zip(chosen, weights, strict=True):
                y[b, s] += w * slow_expert(token, params, e)
                counts[e] += 1
    return y, counts


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


@pytest.mark.parametrize("renorm", RENORMALIZE, ids=["plain", "renormalized"])
@pytest.mark.parametrize("top_k", TOP_KS, ids=lambda k: f"top{k}")
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_dense_moe_equals_per_token_loop(shape, score, top_k, renorm):
    if top_k > SHAPES[shape][4]:
        pytest.skip("top_k > num_experts")
    params, x = make_case(
        SHAPES[shape], seed=zlib.crc32(f"{shape}-{score}-{top_k}-{renorm}".encode())
    )
    cfg = RouterConfig(top_k=top_k, score=score, renormalize=renorm)
    want, want_counts = slow_moe(params, x, score, top_k, renorm)
    got = np.asarray(dense_moe(params, x, cfg))
    assert got.shape == x.shape and got.dtype == np.float32
    assert relative_error(got, want) < 1e-5
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    counts = np.asarray(tokens_per_expert(params, x, cfg))
    assert counts.dtype == np.int32
    np.testing.assert_array_equal(counts, want_counts)
    assert counts.sum() == x.shape[0] * x.shape[1] * top_k


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


def test_dense_moe_computes_in_float32_from_bfloat16_inputs():
    params, x = make_case(SHAPES["tiny"], seed=11)
    cfg = RouterConfig(top_k=2, score="softmax", renormalize=True)
    low = {k: jnp.asarray(v, jnp.bfloat16) for k, v in params.items()}
    low_x = jnp.asarray(x, jnp.bfloat16)
    got = np.asarray(dense_moe(low, low_x, cfg))
    assert got.dtype == np.float32
    rounded = {k: np.asarray(v, np.float32) for k, v in low.items()}
    want, _ = slow_moe(rounded, np.asarray(low_x, np.float32), "softmax", 2, True)
    assert relative_error(got, want) < 1e-5


def test_unknown_score_function_is_refused():
    params, x = make_case(SHAPES["tiny"], seed=1)
    with pytest.raises(ValueError, match="unknown score function 'relu'"):
        dense_moe(params, x, RouterConfig(top_k=1, score="relu", renormalize=False))
