"""Pallas TPU kernels that move routed rows by DMA, one row a copy (exploration for issue 52:
not product code, not yet timed on a chip).

On one v5e chip XLA's row gather moved the 268 MB of Qwen3-30B-A3B's routed rows at 143 GB/s
of the chip's 819, and the weighted combine (gather of the sorted expert outputs, then the
sum over each token's copies) took 3.5 ms forward and 6.4 ms backward (run2_breakdown.json).
These kernels issue one DMA per row straight from HBM into the VMEM block the pipeline writes
back, and sum a token's copies in VMEM, so each routed row crosses HBM once:

- `gather_rows(x, src)`: out[i] = x[src[i]] (the sort's gather; also the combine's backward,
  the output gradient gathered back to the sorted rows);
- `combine_rows(rows, dest, weights)`: y[t] = sum_k weights[t, k] * rows[dest[t, k]] in
  float32 (the combine; with unit weights, the sort's backward).

`python row_kernels.py` checks both against jnp in interpret mode on CPU and compiles them for
a v5e chip with libtpu's compile-only devices (the Mosaic lowering); timing them is the next
chip run's (explore.py `rows`).
"""

# ruff: noqa: E731

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LANES = 128


def _copy_row(src_hbm, src_row, dst, dst_row, sem):
    """One row's DMA. Rows are viewed as [rows, D / 128, 128]: a TPU array is laid out in
    (8 or 16, 128) tiles over its last two dimensions, and Mosaic refuses a copy that starts
    inside a tile ("offsets along tiled dimensions must be aligned to tiles": one row of a
    [rows, D] bf16 array is 1/16 of a tile row), so the row index must be a leading,
    untiled dimension. The view costs XLA a relayout copy of the array on each side."""
    return pltpu.make_async_copy(
        src_hbm.at[pl.ds(src_row, 1)], dst.at[pl.ds(dst_row, 1)], sem.at[0]
    )


def _gather_block(dest_ref, rows_hbm, scratch, sem, block_tokens: int, top_k: int) -> None:
    """This grid step's tokens' copies from HBM into scratch, copy k of every token in the
    k-th block of block_tokens rows (k static: no integer division in the kernel)."""
    base = pl.program_id(0) * block_tokens

    def start(k: int):
        def one(t, carry):
            row = dest_ref[(base + t) * top_k + k]
            _copy_row(rows_hbm, row, scratch, k * block_tokens + t, sem).start()
            return carry

        return one

    def wait(j, carry):  # every copy is one row: each wait takes one row's bytes
        _copy_row(rows_hbm, 0, scratch, j, sem).wait()
        return carry

    for k in range(top_k):
        jax.lax.fori_loop(0, block_tokens, start(k), 0, unroll=8)
    jax.lax.fori_loop(0, block_tokens * top_k, wait, 0, unroll=8)


def _per_token_block(
    kernel, dest, blocked, rows, block_tokens: int, out_block, out_dtype, interpret
):
    """pallas_call of a kernel that gathers each token block's copies (dest, scalar-prefetched)
    into VMEM scratch: `blocked` [T, *inner] comes in [block_tokens, *inner] blocks, the rows
    stay in HBM, the output is [T, *out_block] in out_dtype."""
    tokens, top_k = dest.shape
    inner = blocked.shape[1:]
    zeros = (0,) * len(inner)
    out_zeros = (0,) * len(out_block)
    lane_tiles = rows.shape[1] // LANES
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((tokens, *out_block), out_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(tokens // block_tokens,),
            in_specs=[
                pl.BlockSpec((block_tokens, *inner), lambda i, dest: (i, *zeros)),
                pl.BlockSpec(memory_space=pl.ANY),
            ],
            out_specs=pl.BlockSpec((block_tokens, *out_block), lambda i, dest: (i, *out_zeros)),
            scratch_shapes=[
                pltpu.VMEM((block_tokens * top_k, lane_tiles, LANES), rows.dtype),
                pltpu.SemaphoreType.DMA((1,)),
            ],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=interpret,
    )(dest.reshape(-1).astype(jnp.int32), blocked, _rows_view(rows))


def _rows_view(x: jax.Array) -> jax.Array:
    rows, width = x.shape
    assert width % LANES == 0, width
    return x.reshape(rows, width // LANES, LANES)


@functools.partial(jax.jit, static_argnames=("block_rows", "interpret"))
def gather_rows(x: jax.Array, src: jax.Array, *, block_rows: int = 256, interpret=False):
    """out[i] = x[src[i]], [len(src), D]: block_rows DMAs a grid step, all in flight at once."""
    rows, width = src.shape[0], x.shape[1]
    block_rows = min(block_rows, rows)
    assert rows % block_rows == 0, (rows, block_rows)

    def kernel(src_ref, x_hbm, out_ref, sem):
        base = pl.program_id(0) * block_rows

        def start(j, carry):
            _copy_row(x_hbm, src_ref[base + j], out_ref, j, sem).start()
            return carry

        def wait(j, carry):  # every copy is one row: each wait takes one row's bytes
            _copy_row(x_hbm, 0, out_ref, j, sem).wait()
            return carry

        jax.lax.fori_loop(0, block_rows, start, 0, unroll=8)
        jax.lax.fori_loop(0, block_rows, wait, 0, unroll=8)

    lane_tiles = width // LANES
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, lane_tiles, LANES), x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(rows // block_rows,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((block_rows, lane_tiles, LANES), lambda i, src: (i, 0, 0)),
            scratch_shapes=[pltpu.SemaphoreType.DMA((1,))],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=interpret,
    )(src.astype(jnp.int32), _rows_view(x))
    return out.reshape(rows, width)


@functools.partial(jax.jit, static_argnames=("block_tokens", "out_dtype", "interpret"))
def combine_rows(
    rows: jax.Array,
    dest: jax.Array,
    weights: jax.Array,
    *,
    block_tokens: int = 128,
    out_dtype=jnp.float32,
    interpret=False,
):
    """y[t] = sum_k weights[t, k] * rows[dest[t, k]], [T, D] in out_dtype (sums in float32).

    A grid step gathers its block_tokens x K rows into VMEM, copy k of every token in the
    k-th block of block_tokens rows (static slices, no reshape), then adds them up."""
    tokens, top_k = dest.shape
    width = rows.shape[1]
    block_tokens = min(block_tokens, tokens)
    assert tokens % block_tokens == 0, (tokens, block_tokens)

    def kernel(dest_ref, weights_ref, rows_hbm, out_ref, scratch, sem):
        _gather_block(dest_ref, rows_hbm, scratch, sem, block_tokens, top_k)
        total = jnp.zeros((block_tokens, lane_tiles, LANES), jnp.float32)
        for k in range(top_k):
            copy = scratch[pl.ds(k * block_tokens, block_tokens)].astype(jnp.float32)
            total = total + copy * weights_ref[:, k : k + 1, :]
        out_ref[...] = total.astype(out_ref.dtype)

    lane_tiles = width // LANES
    # each token's weights as [T, K, 128] (lanes repeated): a [block, 1, 128] slice broadcasts
    # over a [block, D / 128, 128] block without a relayout in the kernel
    lane_weights = jnp.broadcast_to(
        weights.astype(jnp.float32)[:, :, None], (*weights.shape, LANES)
    )
    out = _per_token_block(
        kernel, dest, lane_weights, rows, block_tokens, (lane_tiles, LANES), out_dtype, interpret
    )
    return out.reshape(tokens, width)


@functools.partial(jax.jit, static_argnames=("block_tokens", "interpret"))
def dot_rows(
    rows: jax.Array, dest: jax.Array, grad: jax.Array, *, block_tokens: int = 128, interpret=False
):
    """out[t, k] = <rows[dest[t, k]], grad[t]> in float32, [T, K]: the combine's weight
    gradient (grad: y's gradient), the rows gathered as combine_rows gathers them."""
    tokens, top_k = dest.shape
    block_tokens = min(block_tokens, tokens)
    assert tokens % block_tokens == 0, (tokens, block_tokens)

    def kernel(dest_ref, grad_ref, rows_hbm, out_ref, scratch, sem):
        _gather_block(dest_ref, rows_hbm, scratch, sem, block_tokens, top_k)
        g = grad_ref[...].astype(jnp.float32)
        for k in range(top_k):
            copy = scratch[pl.ds(k * block_tokens, block_tokens)].astype(jnp.float32)
            out_ref[:, k : k + 1] = jnp.sum(jnp.sum(copy * g, axis=2), axis=1, keepdims=True)

    return _per_token_block(
        kernel, dest, _rows_view(grad), rows, block_tokens, (top_k,), jnp.float32, interpret
    )


def _check_on_cpu() -> None:
    """Both kernels against jnp, interpreted (a permutation and a gather with repeats)."""
    tokens, top_k, width = 256, 4, 256
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (tokens, width), jnp.float32).astype(jnp.bfloat16)
    src = jax.random.randint(keys[1], (tokens * top_k,), 0, tokens)
    got = gather_rows(x, src, block_rows=128, interpret=True)
    assert bool(jnp.all(got == x[src])), "gather_rows"
    rows = jax.random.normal(keys[2], (tokens * top_k, width), jnp.float32).astype(jnp.bfloat16)
    dest = jax.random.permutation(keys[3], tokens * top_k).reshape(tokens, top_k)
    weights = jax.random.uniform(keys[3], (tokens, top_k), jnp.float32)
    want = jnp.einsum("tkd,tk->td", rows[dest].astype(jnp.float32), weights)
    got = combine_rows(rows, dest, weights, block_tokens=64, interpret=True)
    err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
    assert err < 1e-6, f"combine_rows: {err}"
    grad = jax.random.normal(keys[1], (tokens, width), jnp.float32)
    want_dot = jnp.einsum("tkd,td->tk", rows[dest].astype(jnp.float32), grad)
    got_dot = dot_rows(rows, dest, grad, block_tokens=64, interpret=True)
    dot_err = float(jnp.max(jnp.abs(got_dot - want_dot)) / jnp.max(jnp.abs(want_dot)))
    assert dot_err < 1e-5, f"dot_rows: {dot_err}"
    print(
        f"interpret mode on CPU: gather_rows exact, combine_rows max error {err:.1e}, "
        f"dot_rows {dot_err:.1e}"
    )


def _compile_for_v5e(tokens: int = 8192, top_k: int = 8, width: int = 2048) -> None:
    """Lower and compile both kernels for one v5e chip (Qwen3-30B-A3B's shapes), no TPU."""
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    devices = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
        chips_per_host_bounds=(1, 1, 1), num_slices=1,
    ).devices  # fmt: skip
    mesh = jax.sharding.Mesh(devices, ("x",))
    on = lambda shape, dtype: jax.ShapeDtypeStruct(
        shape, dtype, sharding=NamedSharding(mesh, PartitionSpec())
    )
    rows = tokens * top_k
    for name, fn, args in (
        ("gather_rows", gather_rows, (on((tokens, width), jnp.bfloat16), on((rows,), jnp.int32))),
        (
            "combine_rows",
            combine_rows,
            (
                on((rows, width), jnp.bfloat16),
                on((tokens, top_k), jnp.int32),
                on((tokens, top_k), jnp.float32),
            ),
        ),
        (
            "dot_rows",
            dot_rows,
            (
                on((rows, width), jnp.bfloat16),
                on((tokens, top_k), jnp.int32),
                on((tokens, width), jnp.float32),
            ),
        ),
    ):
        text = fn.lower(*args).compile().as_text()
        # the [rows, D / 128, 128] views: relayout copies XLA adds on each side of the kernel
        copies = text.count(" copy(")
        mosaic = "tpu_custom_call" in text
        print(f"{name}: compiled for v5e (Mosaic kernel {mosaic}, {copies} copies)")


if __name__ == "__main__":
    _check_on_cpu()
    if "--no-compile" not in sys.argv:
        _compile_for_v5e()
