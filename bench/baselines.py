"""Two MoE layers written the obvious way in plain JAX, for the shapes and mesh of a generated
module: what a user would write without moegen, to compare the generated layer against.

- `dense_dispatch`: every token through every expert, a one-hot [tokens, experts] combine
  matrix folded into the down projection (the dropless form of the GShard-style dense layers,
  e.g. MaxText's dense_matmul without a capacity). E/K times the routed FLOPs, no sorting.
- `ragged_dot`: token copies sorted by expert over the whole (global) batch, the three
  projections with `jax.lax.ragged_dot`, unsorted and combined; no row padding, no tiles.

Both are functions of (params, x) with the module's parameter names, shapes and dtypes, run
under a plain `jax.jit` with the parameters and x placed by NamedShardings of the module's
PARAM_SPECS and INPUT_SPEC: GSPMD partitions them (no shard_map, no sharding constraints),
which is what obvious user code gets. Parameters are cast to the compute dtype inside (the
router stays float32), as the module does.

They cover the router and expert features of the example specs: softmax / sigmoid /
sqrtsoftplus scores, softmax after top-k, renormalisation, routed scaling, a routing bias,
every activation, FFN biases and a shared expert. Group-limited routing, capacity (token
dropping) and the auxiliary losses are not covered: `unsupported(...)` names them and the
bench skips such specs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp

from moegen.verify.reference.layer import GATED_ACTIVATIONS, ReferenceConfig

Params = dict[str, jax.Array]
Layer = Callable[[Params, jax.Array], jax.Array]

BASELINES = ("dense_dispatch", "ragged_dot")


@dataclass(frozen=True)
class LayerConfig:
    """What a baseline needs to know about a layer beyond its parameters."""

    top_k: int
    score: str
    renormalize: bool
    score_after_top_k: bool
    routed_scaling: float
    activation: str
    compute_dtype: Any
    router_dtype: Any = jnp.float32

    @classmethod
    def of(cls, module: ModuleType, cfg: ReferenceConfig) -> LayerConfig:
        return cls(
            top_k=module.TOP_K,
            score=cfg.score,
            renormalize=cfg.renormalize,
            score_after_top_k=cfg.score_after_top_k,
            routed_scaling=cfg.routed_scaling,
            activation=cfg.activation,
            compute_dtype=module.COMPUTE_DTYPE,
            router_dtype=getattr(module, "ROUTER_DTYPE", jnp.float32),
        )


def unsupported(cfg: ReferenceConfig) -> str | None:
    """Why the baselines cannot compute this layer (None when they can)."""
    reasons = []
    if cfg.num_groups > 1:
        reasons.append("group-limited routing")
    if cfg.capacity is not None:
        reasons.append("capacity (token dropping)")
    if cfg.load_balance_weight or cfg.z_loss_weight:
        reasons.append("auxiliary losses")
    if cfg.weights_on_input:
        reasons.append("combine weights on the expert input")
    if (cfg.gate_limit, cfg.up_limit, cfg.sigmoid_scale, cfg.up_offset) != (None, None, 1.0, 0.0):
        reasons.append("a clamped or scaled gated activation")
    return ", ".join(reasons) or None


def _activation(name: str) -> Callable[[jax.Array], jax.Array]:
    exact_gelu = lambda v: jax.nn.gelu(v, approximate=False)  # noqa: E731
    return {"swiglu": jax.nn.silu, "geglu": exact_gelu, "gelu": exact_gelu, "relu": jax.nn.relu}[
        name
    ]


def _cast(params: Params, layer: LayerConfig) -> Params:
    return {
        name: value.astype(
            layer.router_dtype
            if name in ("router", "routing_bias", "router_bias", "shared_expert_gate")
            else layer.compute_dtype
        )
        for name, value in params.items()
    }


def route(tokens: jax.Array, p: Params, layer: LayerConfig) -> tuple[jax.Array, jax.Array]:
    """Combine weights [T, K] (float32) and expert ids [T, K] of each token."""
    logits = jnp.dot(
        tokens.astype(layer.router_dtype), p["router"], precision=jax.lax.Precision.HIGHEST
    )
    if "router_bias" in p:
        logits = logits + p["router_bias"]
    if layer.score_after_top_k:
        chosen, ids = jax.lax.top_k(logits, layer.top_k)
        weights = jax.nn.softmax(chosen, axis=-1)
    else:
        if layer.score == "softmax":
            scores = jax.nn.softmax(logits, axis=-1)
        elif layer.score == "sigmoid":
            scores = jax.nn.sigmoid(logits)
        else:  # sqrtsoftplus
            scores = jnp.sqrt(jax.nn.softplus(logits))
        selection = scores + p["routing_bias"] if "routing_bias" in p else scores
        _, ids = jax.lax.top_k(jax.lax.stop_gradient(selection), layer.top_k)
        weights = jnp.take_along_axis(scores, ids, axis=-1)
    if layer.renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return (weights * layer.routed_scaling).astype(jnp.float32), ids


def _shared(tokens: jax.Array, p: Params, layer: LayerConfig) -> jax.Array:
    act = _activation(layer.activation)
    up = tokens @ p["shared_up"]
    hidden = act(tokens @ p["shared_gate"]) * up if "shared_gate" in p else act(up)
    out = jnp.dot(hidden, p["shared_down"], preferred_element_type=jnp.float32)
    if "shared_expert_gate" not in p:
        return out
    gate = jnp.dot(
        tokens.astype(layer.router_dtype),
        p["shared_expert_gate"],
        precision=jax.lax.Precision.HIGHEST,
    )
    return out * jax.nn.sigmoid(gate)[:, None]


def dense_dispatch(layer: LayerConfig) -> Layer:
    """Every token through every expert; a one-hot combine matrix keeps the routed outputs."""
    act = _activation(layer.activation)
    gated = layer.activation in GATED_ACTIVATIONS

    def moe(params: Params, x: jax.Array) -> jax.Array:
        p = _cast(params, layer)
        tokens = x.reshape(-1, x.shape[-1]).astype(layer.compute_dtype)
        weights, ids = route(tokens, p, layer)
        experts = p["w_up"].shape[0]
        combine = jnp.einsum("tk,tke->te", weights, jax.nn.one_hot(ids, experts, dtype=jnp.float32))
        up = jnp.einsum("td,edf->tef", tokens, p["w_up"])
        if "b_up" in p:
            up = up + p["b_up"]
        if gated:
            gate = jnp.einsum("td,edf->tef", tokens, p["w_gate"])
            if "b_gate" in p:
                gate = gate + p["b_gate"]
            hidden = act(gate) * up
        else:
            hidden = act(up)
        hidden = hidden * combine[:, :, None].astype(hidden.dtype)
        y = jnp.einsum("tef,efd->td", hidden, p["w_down"], preferred_element_type=jnp.float32)
        if "b_down" in p:
            y = y + combine @ p["b_down"].astype(jnp.float32)
        if "shared_up" in p:
            y = y + _shared(tokens, p, layer)
        return y.astype(layer.compute_dtype).reshape(x.shape)

    return moe


def ragged_dot(layer: LayerConfig) -> Layer:
    """Token copies sorted by expert, jax.lax.ragged_dot per projection, unsorted, combined."""
    act = _activation(layer.activation)
    gated = layer.activation in GATED_ACTIVATIONS
    k = layer.top_k

    def moe(params: Params, x: jax.Array) -> jax.Array:
        p = _cast(params, layer)
        tokens = x.reshape(-1, x.shape[-1]).astype(layer.compute_dtype)
        num_tokens = tokens.shape[0]
        weights, ids = route(tokens, p, layer)
        experts = p["w_up"].shape[0]
        flat_ids = ids.reshape(num_tokens * k)
        order = jnp.argsort(flat_ids, stable=True)
        rows = tokens[order // k]
        row_experts = flat_ids[order]
        sizes = jnp.bincount(flat_ids, length=experts).astype(jnp.int32)
        up = jax.lax.ragged_dot(rows, p["w_up"], sizes)
        if "b_up" in p:
            up = up + p["b_up"][row_experts]
        if gated:
            gate = jax.lax.ragged_dot(rows, p["w_gate"], sizes)
            if "b_gate" in p:
                gate = gate + p["b_gate"][row_experts]
            hidden = act(gate) * up
        else:
            hidden = act(up)
        out = jax.lax.ragged_dot(hidden, p["w_down"], sizes)
        if "b_down" in p:
            out = out + p["b_down"][row_experts]
        copies = out[jnp.argsort(order)].reshape(num_tokens, k, -1)
        y = jnp.einsum("tkd,tk->td", copies, weights, preferred_element_type=jnp.float32)
        if "shared_up" in p:
            y = y + _shared(tokens, p, layer)
        return y.astype(layer.compute_dtype).reshape(x.shape)

    return moe


def baseline(name: str, module: ModuleType, cfg: ReferenceConfig) -> Layer:
    """The baseline `name` ("dense_dispatch" or "ragged_dot") for a generated module."""
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose from {BASELINES}")
    reason = unsupported(cfg)
    if reason:
        raise ValueError(f"the baselines do not cover {reason}")
    layer = LayerConfig.of(module, cfg)
    return {"dense_dispatch": dense_dispatch, "ragged_dot": ragged_dot}[name](layer)


def abstract_inputs(
    module: ModuleType, mesh: jax.sharding.Mesh
) -> tuple[dict, jax.ShapeDtypeStruct]:
    """The module's parameter and input shapes with their NamedShardings (for AOT lowering)."""
    return module.param_shapes(mesh), module.input_shape(mesh)


def training_step(layer: Callable[[Params, jax.Array], Any], *, returns_aux: bool) -> Callable:
    """Gradients of sum(y) with respect to params and x: the forward+backward that is compared."""

    def loss(params: Params, x: jax.Array) -> jax.Array:
        y = layer(params, x)
        if returns_aux:
            y = y[0]
        return jnp.sum(y.astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1))
