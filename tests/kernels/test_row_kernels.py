"""The DMA row kernels of bench/tpu_explore/row_kernels.py (issue 52's next chip run times
them) hold their contract in Pallas interpret mode on CPU: the gather is exact and the
weighted combine equals jnp's float32 sum, over dtypes, top-k and block sizes, with repeated
and unused source rows. Their compile for a v5e chip is `python row_kernels.py` (libtpu)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

PATH = Path(__file__).resolve().parents[2] / "bench" / "tpu_explore" / "row_kernels.py"


def _kernels():
    spec = importlib.util.spec_from_file_location("tpu_explore_row_kernels", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ROW_KERNELS = _kernels()

# (tokens, top_k, width, dtype, block): Qwen3-like top-8, Mixtral-like top-2, top-1, float32
CASES = [
    (64, 8, 256, jnp.bfloat16, 16),
    (128, 2, 384, jnp.bfloat16, 64),
    (32, 1, 128, jnp.float32, 32),
    (64, 4, 256, jnp.float32, 8),
]


@pytest.mark.parametrize(("tokens", "top_k", "width", "dtype", "block"), CASES)
def test_gather_rows_is_exact(tokens, top_k, width, dtype, block):
    keys = jax.random.split(jax.random.key(tokens + top_k), 2)
    x = jax.random.normal(keys[0], (tokens, width), jnp.float32).astype(dtype)
    src = jax.random.randint(keys[1], (tokens * top_k,), 0, tokens)  # repeats, gaps
    got = ROW_KERNELS.gather_rows(x, src, block_rows=block * top_k, interpret=True)
    assert got.dtype == x.dtype and bool(jnp.all(got == x[src]))


@pytest.mark.parametrize(("tokens", "top_k", "width", "dtype", "block"), CASES)
def test_combine_rows_is_the_weighted_sum(tokens, top_k, width, dtype, block):
    keys = jax.random.split(jax.random.key(tokens * top_k), 3)
    rows = jax.random.normal(keys[0], (tokens * top_k, width), jnp.float32).astype(dtype)
    dest = jax.random.permutation(keys[1], tokens * top_k).reshape(tokens, top_k)
    weights = jax.random.uniform(keys[2], (tokens, top_k), jnp.float32)
    want = jnp.einsum("tkd,tk->td", rows[dest].astype(jnp.float32), weights)
    got = ROW_KERNELS.combine_rows(rows, dest, weights, block_tokens=block, interpret=True)
    err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
    assert got.shape == want.shape and err < 1e-6, err


def test_a_layer_with_the_dma_kernels_equals_the_xla_one():
    """bench/tpu_explore/variants.layer(dma=True), interpreted: the same output and weight
    gradients as the XLA gathers (bit for bit), the input gradient within bf16 rounding (the
    router's gradient sums over D in another order)."""
    sys.path.insert(0, str(PATH.parent))
    import variants

    variants.INTERPRET = True
    tokens, embed, ffn, experts, top_k = 64, 256, 256, 8, 2
    keys = jax.random.split(jax.random.key(0), 6)
    params = {
        "router": jax.random.normal(keys[0], (embed, experts)) * embed**-0.5,
        "w_gate": jax.random.normal(keys[1], (experts, embed, ffn)) * embed**-0.5,
        "w_up": jax.random.normal(keys[2], (experts, embed, ffn)) * embed**-0.5,
        "w_down": jax.random.normal(keys[3], (experts, ffn, embed)) * ffn**-0.5,
    }
    x = jax.random.normal(keys[4], (tokens, embed)).astype(jnp.bfloat16)
    cotangent = jax.random.normal(keys[5], (tokens, embed))
    tile = (32, 128, 128)
    kw = dict(top_k=top_k, align=0, gu_tiles=tile, down_tiles=tile, fuse=False)
    kw |= dict(cast_weights=True, rows_total=tokens * top_k, fast=True)

    def grads(dma: bool):
        def loss(p, x):
            y = variants.layer(p, x, dma=dma, **kw)
            return jnp.sum(y.astype(jnp.float32) * cotangent), y

        return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)

    (xla_params, xla_x), xla_y = grads(False)
    (dma_params, dma_x), dma_y = grads(True)
    assert bool(jnp.all(xla_y == dma_y))
    for name in ("w_gate", "w_up", "w_down"):
        assert bool(jnp.all(xla_params[name] == dma_params[name])), name
    diff = jnp.linalg.norm((xla_x - dma_x).astype(jnp.float32))
    assert float(diff / jnp.linalg.norm(xla_x.astype(jnp.float32))) < 1e-2
