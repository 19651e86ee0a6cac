"""Each megablox kernel of one projection with lane tiles of its own.

A projection runs three kernels: the forward gmm (rows @ weights), the input gradient's gmm
(the result's gradient @ weights transposed: it contracts the output's width) and the weight
gradient's tgmm (rows transposed @ the result's gradient). megablox's own VJP runs all three
with the forward's tiles; their widths differ, so each is fastest with lane tiles of its own.
Measured on one v5e chip (bench/tpu_explore/run3, Qwen3-30B-A3B shapes): a layer with each
kernel's tiles ran forward+backward in 44.4 ms against 49.4 with one tiling for all three.

Every kernel keeps the row tile the plan chose (`choose_tile`), so the rows each call is
padded to are the same; only the lane tiles are each kernel's own, by the same roofline
(`kernel_cost`) and within the same scoped VMEM (`kernel_vmem`).
"""

from __future__ import annotations

import dataclasses

from moegen.kernels.tiling import (
    GRID_STEP_SECONDS,
    KERNELS,
    Tile,
    kernel_cost,
    kernel_vmem,
    lane_tiles,
    usable_vmem,
    widest_lane_tile,
)


def kernel_tiles(
    tile: Tile,
    rows: int,
    contraction: int,
    output: int,
    dtype: str,
    vmem_budget: int,
    out_dtype: str | None = None,
    *,
    groups: int,
    peak_flops: float,
    hbm_bytes_per_s: float,
) -> Tile:
    """The forward kernel's fastest tiles at `tile`'s row tile, carrying the two gradient
    kernels' (Tile.backward), each the fastest whose own grid step fits VMEM; `tile` itself
    where no other beats it."""
    usable = usable_vmem(vmem_budget)
    widest = widest_lane_tile(dtype, usable, out_dtype)
    widths = sorted(set(lane_tiles(contraction, widest)) | set(lane_tiles(output, widest)))

    def rank(kernel: int, candidate: Tile) -> tuple[float, int, int]:
        cost = kernel_cost(candidate, rows, contraction, output, groups, _bytes(dtype))
        flops, moved = cost.calls[kernel]
        steps = _steps(kernel, candidate, contraction, output) * _visits(candidate, rows, groups)
        seconds = max(flops / peak_flops, moved / hbm_bytes_per_s) + steps * GRID_STEP_SECONDS
        return (seconds, steps, -candidate.contraction)

    def best(kernel: int) -> Tile:
        fitting = [
            Tile(tile.rows, k, n)
            for k in widths
            for n in widths
            if kernel_vmem(Tile(tile.rows, k, n), dtype, out_dtype)[kernel] <= usable
        ]
        return min([Tile(*tile.as_tuple()), *fitting], key=lambda t: rank(kernel, t))

    forward, input_gradient, weight_gradient = (best(kernel) for kernel in range(len(KERNELS)))
    return dataclasses.replace(forward, backward=(input_gradient, weight_gradient))


def _bytes(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2}[dtype]


def _steps(kernel: int, tile: Tile, contraction: int, output: int) -> int:
    """Grid steps of one row tile: the input gradient tiles the output width as its
    contraction and the contraction width as its output."""
    if kernel == 1:
        return -(-output // tile.contraction) * -(-contraction // tile.output)
    return -(-contraction // tile.contraction) * -(-output // tile.output)


def _visits(tile: Tile, rows: int, groups: int) -> int:
    return -(-rows // tile.rows) + groups - 1
