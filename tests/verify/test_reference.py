"""The dense reference the twin is checked against, checked against a slow per-token loop.

The loop is written from the definition (route each token on its own, sort the copies of each
expert to apply its capacity, run the chosen experts one by one) in float64 numpy, sharing
nothing with `moegen.verify.reference.layer` but the config dataclass it reads.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_cases import CASES, GRADIENT_CASES, C, Case, case_data, make_params
from reference_loop import check_against_loop, slow_moe

from moegen.verify.reference.layer import RouterConfig, dense_moe, router_combine, tokens_per_expert

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
        devices = case.cfg.token_shards * case.cfg.sequence_shards
        assert (want["counts"] - want["dropped"] <= case.cfg.capacity * devices).all()
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


def test_transformers_balance_form_is_top_k_times_switch_on_the_same_selection():
    """What the spec's load_balance_form says: where the layer chooses the logits' top-k
    (softmax), transformers' form is top_k times the switch form; with a selection bias and
    groups it counts other experts than the layer chose, so it is not."""
    case, params, x = case_data("balance_transformers_mixtral")
    switch = replace(case.cfg, load_balance_form="switch")
    both = [float(dense_moe(params, x, c)[1].load_balance_loss) for c in (case.cfg, switch)]
    np.testing.assert_allclose(both[0], case.cfg.top_k * both[1], rtol=1e-6)
    case, params, x = case_data("balance_transformers_biased_groups")
    as_switch = replace(case.cfg, load_balance_form="switch", score="softmax")
    as_transformers = replace(case.cfg, score="softmax")
    losses = [
        float(dense_moe(params, x, c)[1].load_balance_loss) for c in (as_transformers, as_switch)
    ]
    assert abs(losses[0] - case.cfg.top_k * losses[1]) > 1e-4 * losses[0]


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
        ({"num_groups": 4, "top_groups": 1, "top_k": 3}, "top_k 3 exceeds the experts"),
        ({"num_groups": 4, "top_groups": 2, "group_top_n": 3}, "group_top_n 3 not in"),
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


@pytest.mark.parametrize(
    ("name", "weight", "epsilon"),
    [
        ("axk1_output_norm", "output_norm", "output_norm_eps"),
        ("ergo_output_norms", "expert_output_norm", "expert_output_norm_eps"),
        ("ergo_output_norms", "shared_output_norm", "shared_output_norm_eps"),
    ],
)
def test_a_norm_weight_comes_with_its_epsilon(name, weight, epsilon):
    case, params, x = case_data(name)
    message = f"'{weight}'\\] and its epsilon come together"
    with pytest.raises(ValueError, match=message):
        dense_moe(params, x, replace(case.cfg, **{epsilon: None}))
    without = {k: v for k, v in params.items() if k != weight}
    with pytest.raises(ValueError, match=message):
        dense_moe(without, x, case.cfg)


def test_a_shared_output_norm_needs_a_shared_expert():
    case, params, x = case_data("ergo_output_norms")
    shared = ("shared_up", "shared_down")
    alone = {k: v for k, v in params.items() if k not in shared}
    with pytest.raises(ValueError, match="shared_output_norm needs shared_up"):
        dense_moe(alone, x, case.cfg)
