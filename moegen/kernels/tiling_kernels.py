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
    DTYPE_BYTES,
    KERNELS,
    LANES,
    Tile,
    VmemBudget,
    kernel_limits,
    kernel_vmem,
    lane_tiles,
    scratch_bytes,
    usable_vmem,
    widest_lane_tile,
)
from moegen.kernels.tiling_cost import GRID_STEP_SECONDS, kernel_cost


def kernel_tiles(
    tile: Tile,
    rows: int,
    contraction: int,
    output: int,
    dtype: str,
    vmem_budget: VmemBudget,
    out_dtype: str | None = None,
    weight_dtype: str | None = None,
    *,
    groups: int,
    peak_flops: float,
    hbm_bytes_per_s: float,
) -> Tile:
    """The forward kernel's fastest tiles at `tile`'s row tile, carrying the two gradient
    kernels' (Tile.backward), each the fastest whose own grid step fits its own scoped VMEM
    limit (`kernel_limits`); `tile` itself where no other beats it."""
    limits = [usable_vmem(limit) for limit in kernel_limits(vmem_budget)]
    widest = widest_lane_tile(dtype, vmem_budget, out_dtype, weight_dtype)
    widths = sorted(set(lane_tiles(contraction, widest)) | set(lane_tiles(output, widest)))
    sizes = (DTYPE_BYTES[dtype], DTYPE_BYTES[weight_dtype or dtype])

    def rank(kernel: int, candidate: Tile) -> tuple[float, int, int]:
        cost = kernel_cost(candidate, rows, contraction, output, groups, *sizes)
        flops, moved = cost.calls[kernel]
        steps = _steps(kernel, candidate, contraction, output) * _visits(candidate, rows, groups)
        seconds = max(flops / peak_flops, moved / hbm_bytes_per_s) + steps * GRID_STEP_SECONDS
        return (seconds, steps, -candidate.contraction)

    def fits(kernel: int, candidate: Tile) -> bool:
        need = kernel_vmem(candidate, dtype, out_dtype, weight_dtype)[kernel]
        return need <= limits[kernel]

    def best(kernel: int) -> Tile:
        candidates = (Tile(tile.rows, k, n) for k in widths for n in widths)
        fitting = [candidate for candidate in candidates if fits(kernel, candidate)]
        return min([Tile(*tile.as_tuple()), *fitting], key=lambda t: rank(kernel, t))

    forward, input_gradient, weight_gradient = (best(kernel) for kernel in range(len(KERNELS)))
    return dataclasses.replace(forward, backward=(input_gradient, weight_gradient))


def _steps(kernel: int, tile: Tile, contraction: int, output: int) -> int:
    """Grid steps of one row tile: the input gradient tiles the output width as its
    contraction and the contraction width as its output."""
    if kernel == 1:
        return -(-output // tile.contraction) * -(-contraction // tile.output)
    return -(-contraction // tile.contraction) * -(-output // tile.output)


def _visits(tile: Tile, rows: int, groups: int) -> int:
    return -(-rows // tile.rows) + groups - 1


def accumulate_tile(
    gate_up: Tile, contraction: int, output: int, dtype: str, vmem_budget: int
) -> Tile:
    """Tiles of the kernel that adds a chunk's gate/up product into the running float32 sum
    (the overlapped ring): the gate/up call's, with lane tiles that divide the chunk's widths
    exactly (that kernel masks no ragged last tile; a width under one lane tile is one whole
    block), narrowed while its blocks do not fit VMEM. It holds the sum twice (read and
    written, both float32 and double-buffered) beside the rows, the weights and its
    accumulator."""

    def divisors(width: int, widest: int) -> list[int]:
        return lane_tiles(width, widest) if width % LANES == 0 else [width]

    def need(m: int, k: int, n: int) -> int:
        c = DTYPE_BYTES[dtype]
        return (
            2 * (m * k * c + k * n * c + 2 * m * n * 4) + m * n * 4 + scratch_bytes(Tile(m, k, n))
        )

    ks = divisors(contraction, gate_up.contraction)
    ns = divisors(output, gate_up.output)
    m, k, n = gate_up.rows, ks[-1], ns[-1]
    while need(m, k, n) > usable_vmem(vmem_budget) and (len(ks) > 1 or len(ns) > 1):
        if len(ns) > 1 and (n >= k or len(ks) == 1):
            ns.pop()
        else:
            ks.pop()
        k, n = ks[-1], ns[-1]
    return Tile(m, k, n)
