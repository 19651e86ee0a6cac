"""TPU check, run phase: the layers a generated module is measured against, and its references.

Imports only jax (and tokamax where installed): this runs on the TPU machine, where moegen is
not installed. Adapted from the prototype that ran on a TPU v5e chip (.tpu_exp/exp_layer.py):

- `dense_ceiling`: the same FLOPs perfectly balanced (every expert gets tokens*top_k/experts
  rows; one einsum per projection): what a grouped matmul could reach at best;
- `maxtext_peer`: MaxText's one-chip path: route, argsort, gather, megablox gmm (tiles 512 /
  1024 / 1024 clipped to the shapes), unsort, weighted sum;
- `ragged_peer`, `tokamax_peer`: the same with jax.lax.ragged_dot / tokamax.ragged_dot;
- `reference`: float32 at matmul precision "highest", every expert on every token (a
  checkpointed scan over experts) masked by the routing weights: no sort, no grouped matmul;
- `dense_reference`: moegen's dense reference (copied by prepare), over chunks of tokens.

The peers route like the layer (score, top_k, renormalize) but have no other feature of it:
they time a plain layer of the same shape.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

F32, BF16 = jnp.float32, jnp.bfloat16
Params = dict[str, jax.Array]
MAXTEXT_TILES = (512, 1024, 1024)


def interpret() -> bool:
    """Pallas kernels run interpreted off TPU (the CPU run of CI)."""
    return jax.devices()[0].platform != "tpu"


def route(x: jax.Array, router: jax.Array, cfg: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
    """Combine weights [T, K] and expert ids [T, K]: softmax or sigmoid scores, top-k,
    renormalised where the layer does, times routed_scaling; float32 at "highest"."""
    logits = jnp.dot(x.astype(F32), router.astype(F32), precision=jax.lax.Precision.HIGHEST)
    if cfg["score"] == "softmax":
        scores = jax.nn.softmax(logits, axis=-1)
    else:
        scores = jax.nn.sigmoid(logits)
    w, ids = jax.lax.top_k(scores, cfg["top_k"])
    if cfg.get("renormalize"):
        w = w / jnp.sum(w, axis=-1, keepdims=True)
    return w * cfg.get("routed_scaling", 1.0), ids


def activate(activation: str, gate: jax.Array | None, up: jax.Array) -> jax.Array:
    """The expert's hidden values, as moegen's plain activations define them."""
    if activation == "swiglu":
        return jax.nn.silu(gate) * up
    if activation == "geglu":
        return jax.nn.gelu(gate, approximate=False) * up
    if activation == "gelu":
        return jax.nn.gelu(up, approximate=False)
    if activation == "relu":
        return jax.nn.relu(up)
    if activation == "relu2":
        return jax.nn.relu(up) ** 2
    raise ValueError(f"activation {activation!r} is not one the simple reference knows")


def reference(params: Params, x: jax.Array, cfg: dict[str, Any]) -> jax.Array:
    """y [T, D] float32 of a plain layer (router, w_gate?, w_up, w_down): each expert on every
    token, masked by its combine weight, a checkpointed scan over experts."""
    with jax.default_matmul_precision("highest"):
        xf = x.astype(F32)
        w, ids = route(x, params["router"], cfg)
        experts = params["w_up"].shape[0]
        rows = jnp.arange(x.shape[0])[:, None]
        combine = jnp.zeros((x.shape[0], experts), F32).at[rows, ids].add(w)
        gated = "w_gate" in params
        gates = params["w_gate"] if gated else jnp.zeros((experts, 0, 0), F32)

        @jax.checkpoint
        def one(y: jax.Array, inputs: tuple[jax.Array, ...]) -> tuple[jax.Array, None]:
            wg, wu, wd, c = inputs
            gate = xf @ wg.astype(F32) if gated else None
            hidden = activate(cfg["activation"], gate, xf @ wu.astype(F32))
            return y + (hidden @ wd.astype(F32)) * c[:, None], None

        y0 = jnp.zeros(x.shape, F32)
        y, _ = jax.lax.scan(one, y0, (gates, params["w_up"], params["w_down"], combine.T))
        return y


def dense_reference(
    ref: Any, params: Params, x: jax.Array, cfg: dict[str, Any], chunk: int
) -> jax.Array:
    """moegen's dense reference on x [B, S, D], `chunk` tokens at a time (its [tokens, experts,
    ffn] intermediates would not fit at 8192 tokens; routing is per token when there is no
    capacity, so chunks change nothing). y [B, S, D] float32."""
    config = ref.ReferenceConfig(**cfg)
    batch, seq, embed = x.shape
    with jax.default_matmul_precision("highest"):
        if chunk >= batch * seq:
            return ref.dense_moe(params, x, config)[0]
        pieces = x.reshape(batch * seq // chunk, 1, chunk, embed)

        @jax.checkpoint
        def one(piece: jax.Array) -> jax.Array:
            return ref.dense_moe(params, piece, config)[0]

        return jax.lax.map(one, pieces).reshape(batch, seq, embed)


def peer_params(key: jax.Array, s: dict[str, Any], dtype: Any) -> Params:
    """A plain layer's parameters of the module's shape, stored in its parameter dtype."""
    e, d, f = s["experts"], s["embed"], s["ffn"]
    ks = jax.random.split(key, 4)
    params = {
        "router": jax.random.normal(ks[0], (d, e), F32) * d**-0.5,
        "w_up": (jax.random.normal(ks[1], (e, d, f), F32) * d**-0.5).astype(dtype),
        "w_down": (jax.random.normal(ks[2], (e, f, d), F32) * f**-0.5).astype(dtype),
    }
    if s["gated"]:
        params["w_gate"] = (jax.random.normal(ks[3], (e, d, f), F32) * d**-0.5).astype(dtype)
    return params


def _sorted_layer(
    params: Params, x: jax.Array, cfg: dict[str, Any], matmul: Callable[..., jax.Array]
) -> jax.Array:
    """Route, sort the token copies by expert, three grouped matmuls, unsort, weighted sum."""
    t, d = x.shape
    k = cfg["top_k"]
    e = params["w_up"].shape[0]
    w, ids = route(x, params["router"], cfg)
    flat = ids.reshape(-1)
    order = jnp.argsort(flat)
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
    rows = x.astype(BF16)[order // k]
    gate = matmul(rows, params["w_gate"].astype(BF16), sizes) if "w_gate" in params else None
    up = matmul(rows, params["w_up"].astype(BF16), sizes)
    hidden = activate(cfg["activation"], gate, up)
    out = matmul(hidden.astype(BF16), params["w_down"].astype(BF16), sizes)
    out = out[jnp.argsort(order)].reshape(t, k, d)
    return jnp.einsum("tkd,tk->td", out, w.astype(BF16)).astype(BF16)


def maxtext_peer(params: Params, x: jax.Array, cfg: dict[str, Any]) -> jax.Array:
    """MaxText's path on one chip: megablox gmm, tiles 512/1024/1024 clipped to the shapes."""
    megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox")
    rows = x.shape[0] * cfg["top_k"]

    def matmul(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array) -> jax.Array:
        tiles = (  # clipped to the shapes, as the prototype that ran on a v5e chip
            min(MAXTEXT_TILES[0], rows),
            min(MAXTEXT_TILES[1], rhs.shape[1]),
            min(MAXTEXT_TILES[2], rhs.shape[2]),
        )
        return megablox.gmm(lhs, rhs, sizes, BF16, tiles, None, None, False, interpret())

    return _sorted_layer(params, x, cfg, matmul)


def ragged_peer(params: Params, x: jax.Array, cfg: dict[str, Any]) -> jax.Array:
    """The same layer with jax.lax.ragged_dot (XLA's own grouped matmul)."""
    return _sorted_layer(params, x, cfg, jax.lax.ragged_dot)


def tokamax_peer(params: Params, x: jax.Array, cfg: dict[str, Any]) -> jax.Array:
    """The same layer with tokamax.ragged_dot (only where tokamax imports)."""
    tokamax = importlib.import_module("tokamax")
    return _sorted_layer(params, x, cfg, tokamax.ragged_dot)


def dense_ceiling(params: Params, x: jax.Array, cfg: dict[str, Any]) -> jax.Array:
    """The layer's FLOPs perfectly balanced: every expert on tokens*top_k/experts rows."""
    t, d = x.shape
    k = cfg["top_k"]
    e = params["w_up"].shape[0]
    copies = jnp.broadcast_to(x.astype(BF16)[None], (k, t, d)).reshape(t * k, d)
    per_expert = -(-t * k // e)
    rows = jnp.pad(copies, ((0, per_expert * e - t * k), (0, 0))).reshape(e, per_expert, d)
    gate = None
    if "w_gate" in params:
        gate = jnp.einsum("erd,edf->erf", rows, params["w_gate"].astype(BF16))
    up = jnp.einsum("erd,edf->erf", rows, params["w_up"].astype(BF16))
    hidden = activate(cfg["activation"], gate, up)
    out = jnp.einsum("erf,efd->erd", hidden, params["w_down"].astype(BF16))
    out = out.reshape(e * per_expert, d)[: t * k].reshape(k, t, d)
    return out.sum(0).astype(BF16)


PEERS: dict[str, Callable[[Params, jax.Array, dict[str, Any]], jax.Array]] = {
    "ceiling": dense_ceiling,
    "maxtext": maxtext_peer,
    "ragged_dot": ragged_peer,
    "tokamax": tokamax_peer,
}
