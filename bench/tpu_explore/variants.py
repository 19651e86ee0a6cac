"""Hand-written MoE layer variants for one chip, to find where time goes (exploration only:
not product code; jax alone). Peers (MaxText path, ragged_dot, dense ceiling) and a float32
reference as in scripts/tpu_check_peers.py."""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import megablox

backend = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import tpu_check_peers as peers  # noqa: E402

F32 = jnp.float32
BF16 = jnp.bfloat16
INTERPRET = False  # megablox interpreted (CPU tests)


def _router(top_k):
    """The layer the exploration times: softmax top-k, renormalised, SwiGLU (Qwen3, Mixtral)."""
    return {"score": "softmax", "renormalize": True, "top_k": top_k, "activation": "swiglu"}


def route(x, router, top_k):
    return peers.route(x, router, _router(top_k))


# ---------- grouped matmul with per-kernel tiles ----------
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def gmm3(lhs, rhs, sizes, fwd_tile, dlhs_tile, drhs_tile):
    return backend.gmm(lhs, rhs, sizes, BF16, fwd_tile, interpret=INTERPRET)


def _gmm3_fwd(lhs, rhs, sizes, fwd_tile, dlhs_tile, drhs_tile):
    return backend.gmm(lhs, rhs, sizes, BF16, fwd_tile, interpret=INTERPRET), (lhs, rhs, sizes)


def _gmm3_bwd(fwd_tile, dlhs_tile, drhs_tile, res, grad):
    lhs, rhs, sizes = res
    dlhs = backend.gmm(
        grad, rhs, sizes, lhs.dtype, dlhs_tile, transpose_rhs=True, interpret=INTERPRET
    )
    drhs = backend.tgmm(
        lhs.swapaxes(0, 1),
        grad,
        sizes,
        rhs.dtype,
        drhs_tile,
        num_actual_groups=rhs.shape[0],
        interpret=INTERPRET,
    )
    return dlhs, drhs, None


gmm3.defvjp(_gmm3_fwd, _gmm3_bwd)


def gmm_t(lhs, rhs, sizes, tiles):
    """tiles: one tuple (megablox's own VJP) or a triple of tuples (fwd, dlhs, drhs)."""
    if isinstance(tiles[0], int):
        return megablox.gmm(lhs, rhs, sizes, BF16, tiles, None, None, False, INTERPRET)
    return gmm3(lhs, rhs, sizes, *tiles)


# ---------- permutation without scatter ----------
@jax.custom_vjp
def gather_rows(x, src, dest):
    """out[i] = x[src[i]] (src == T: a zero row); dest[t, k]: the rows holding token t."""
    xz = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])
    return xz[src]


def _gather_rows_fwd(x, src, dest):
    return gather_rows(x, src, dest), (src, dest)


def _gather_rows_bwd(res, g):
    src, dest = res
    gx = jnp.sum(g[dest].astype(F32), axis=1).astype(g.dtype)
    return gx, None, None


gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)


@jax.custom_vjp
def combine(out, w, dest, src_copy):
    """y[t] = sum_k w[t,k] out[dest[t,k]]; src_copy[i]: the flat copy t*K+k of row i (or T*K)."""
    return jnp.einsum("tkd,tk->td", out[dest], w, preferred_element_type=F32)


def _combine_fwd(out, w, dest, src_copy):
    return combine(out, w, dest, src_copy), (out, w, dest, src_copy)


def _combine_bwd(res, gy):
    out, w, dest, src_copy = res
    t, k = w.shape
    gyz = jnp.concatenate([gy, jnp.zeros((1, gy.shape[1]), gy.dtype)])
    wz = jnp.concatenate([w.reshape(t * k), jnp.zeros((1,), w.dtype)])
    tok = jnp.minimum(src_copy // k, t)
    tok = jnp.where(src_copy >= t * k, t, tok)
    gout = (gyz[tok] * wz[src_copy][:, None]).astype(out.dtype)
    gw = jnp.einsum("tkd,td->tk", out[dest], gy.astype(out.dtype), preferred_element_type=F32)
    return gout, gw.astype(w.dtype), None, None


combine.defvjp(_combine_fwd, _combine_bwd)


# ---------- the same two steps by the DMA row kernels (row_kernels.py) ----------
def _row_kernels():
    import row_kernels  # beside this file (explore.py puts its folder on sys.path)

    return row_kernels


@jax.custom_vjp
def dma_gather_rows(x, src, dest):
    """x[src] by one DMA a row; the backward sums each token's copies (combine_rows, unit
    weights) instead of XLA's scatter-add."""
    return _row_kernels().gather_rows(x, src, interpret=INTERPRET)


def _dma_gather_fwd(x, src, dest):
    return dma_gather_rows(x, src, dest), (src, dest)


def _dma_gather_bwd(res, g):
    src, dest = res
    ones = jnp.ones(dest.shape, F32)
    gx = _row_kernels().combine_rows(g, dest, ones, interpret=INTERPRET)
    return gx.astype(g.dtype), None, None


dma_gather_rows.defvjp(_dma_gather_fwd, _dma_gather_bwd)


@jax.custom_vjp
def dma_combine(out, w, dest, order):
    """y[t] = sum_k w[t, k] out[dest[t, k]] in float32, by DMA; order: the sort (row i holds
    copy order[i])."""
    return _row_kernels().combine_rows(out, dest, w, interpret=INTERPRET)


def _dma_combine_fwd(out, w, dest, order):
    return dma_combine(out, w, dest, order), (out, w, dest, order)


def _dma_combine_bwd(res, gy):
    out, w, dest, order = res
    k = w.shape[1]
    kernels = _row_kernels()
    rows_gy = kernels.gather_rows(gy.astype(out.dtype), order // k, interpret=INTERPRET)
    # y's gradient holds bf16 values (y is cast to bf16): gathered in bf16 it is exact; the
    # product in float32, rounded once, as the XLA combine's backward
    gout = (rows_gy.astype(F32) * w.reshape(-1)[order][:, None]).astype(out.dtype)
    gw = kernels.dot_rows(out, dest, gy, interpret=INTERPRET)
    return gout, gw.astype(w.dtype), None, None


dma_combine.defvjp(_dma_combine_fwd, _dma_combine_bwd)


def plan_rows(ids, num_experts, align, rows_total):
    """Destination of each copy with every group padded to `align` rows.

    Returns src [rows_total] (token of each row, T for padding), src_copy [rows_total],
    dest [T, K], sizes [E] (padded group sizes, int32)."""
    t, k = ids.shape
    flat = ids.reshape(t * k)
    counts = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    padded = (counts + align - 1) // align * align
    starts = jnp.cumsum(padded) - padded
    order = jnp.argsort(flat, stable=True)
    sorted_e = flat[order]
    raw_starts = jnp.cumsum(counts) - counts
    rank = jnp.arange(t * k, dtype=jnp.int32) - raw_starts[sorted_e]
    pos_sorted = starts[sorted_e] + rank  # destination row of the i-th sorted copy
    dest_flat = jnp.zeros((t * k,), jnp.int32).at[order].set(pos_sorted, unique_indices=True)
    src_copy = (
        jnp.full((rows_total,), t * k, jnp.int32)
        .at[pos_sorted]
        .set(order.astype(jnp.int32), unique_indices=True)
    )
    src = jnp.where(src_copy < t * k, src_copy // k, t)
    # sizes: padded, but the last group absorbs what is left so sum == rows_total
    sizes = padded.at[num_experts - 1].add(rows_total - jnp.sum(padded))
    return src, src_copy, dest_flat.reshape(t, k), sizes


def plan_rows_fast(ids, num_experts):
    """No scatter: sizes from a one-hot sum, the inverse permutation from a second argsort."""
    t, k = ids.shape
    flat = ids.reshape(t * k)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    sizes = jnp.sum(
        flat[:, None] == jnp.arange(num_experts, dtype=flat.dtype), axis=0, dtype=jnp.int32
    )
    dest_flat = jnp.argsort(order).astype(jnp.int32)
    return order // k, order, dest_flat.reshape(t, k), sizes


def plan_rows_plain(ids, num_experts):
    t, k = ids.shape
    flat = ids.reshape(t * k)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    dest_flat = (
        jnp.zeros((t * k,), jnp.int32)
        .at[order]
        .set(jnp.arange(t * k, dtype=jnp.int32), unique_indices=True)
    )
    return order // k, order, dest_flat.reshape(t, k), sizes


def layer(
    params,
    x,
    *,
    top_k,
    align,
    gu_tiles,
    down_tiles,
    fuse,
    cast_weights,
    rows_total,
    fast=False,
    dma=False,
):
    """x [T, D] bf16. align: 0 = groups not padded (today's sort); else pad groups to align.
    dma: rows gathered and combined by the DMA kernels (align 0 only)."""
    t, d = x.shape
    e = params["router"].shape[1]
    w, ids = route(x, params["router"], top_k)
    if align:
        src, src_copy, dest, sizes = plan_rows(ids, e, align, rows_total)
    elif fast:
        src, src_copy, dest, sizes = plan_rows_fast(ids, e)
    else:
        src, src_copy, dest, sizes = plan_rows_plain(ids, e)
    rows = dma_gather_rows(x, src, dest) if dma else gather_rows(x, src, dest)
    cast = (lambda a: a.astype(BF16)) if cast_weights else (lambda a: a)
    if fuse:
        wgu = jnp.concatenate([cast(params["w_gate"]), cast(params["w_up"])], axis=2)
        gu = gmm_t(rows, wgu, sizes, gu_tiles)
        gate, up = jnp.split(gu, 2, axis=1)
    else:
        gate = gmm_t(rows, cast(params["w_gate"]), sizes, gu_tiles)
        up = gmm_t(rows, cast(params["w_up"]), sizes, gu_tiles)
    hidden = jax.nn.silu(gate) * up
    out = gmm_t(hidden, cast(params["w_down"]), sizes, down_tiles)
    y = dma_combine(out, w, dest, src_copy) if dma else combine(out, w, dest, src_copy)
    return y.astype(BF16)


# The peers are the device check's own (scripts/tpu_check_peers.py), at this layer's router.
def maxtext_peer(params, x, *, top_k):
    return peers.maxtext_peer(params, x, _router(top_k))


def ragged_peer(params, x, *, top_k):
    return peers.ragged_peer(params, x, _router(top_k))


def dense_ceiling(params, x, *, top_k):
    return peers.dense_ceiling(params, x, _router(top_k))


def reference(params, x, *, top_k):
    """float32 reference: each expert on every token (a scan over experts), masked by weights."""
    with jax.default_matmul_precision("highest"):
        xf = x.astype(F32)
        w, ids = route(x, params["router"], top_k)
        e = params["router"].shape[1]
        cw = jnp.zeros((x.shape[0], e), F32).at[jnp.arange(x.shape[0])[:, None], ids].set(w)

        @jax.checkpoint
        def one(y, inputs):
            wg, wu, wd, c = inputs
            h = jax.nn.silu(xf @ wg.astype(F32)) * (xf @ wu.astype(F32))
            return y + (h @ wd.astype(F32)) * c[:, None], None

        y0 = jnp.zeros(x.shape, F32)
        y, _ = jax.lax.scan(one, y0, (params["w_gate"], params["w_up"], params["w_down"], cw.T))
        return y
