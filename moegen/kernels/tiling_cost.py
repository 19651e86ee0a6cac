"""What one projection's megablox kernels cost with a given tile: a roofline of the MXU's work
over its padded tiles and megablox's own HBM traffic, plus a fixed cost per grid step. The
plan ranks the tiles that fit VMEM by it (moegen.kernels.tiling, tiling_kernels)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Tile(Protocol):
    """A (rows, contraction, output) tile: moegen.kernels.tiling.Tile."""

    def as_tuple(self) -> tuple[int, int, int]: ...

# A Pallas TPU grid step costs about 0.35 us beside its work (the Pallas TPU matmul guide,
# "Performance of pipelined kernels"): many narrow tiles are slower than fewer wide ones.
GRID_STEP_SECONDS = 0.35e-6


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class KernelCost:
    """One projection's three kernels (gmm forward, gmm input gradient, tgmm weight gradient)
    over a worst-case call, each as (FLOPs the MXU runs, HBM bytes moved)."""

    calls: tuple[tuple[int, int], ...]
    grid_steps: int
    # float32 elements added into the gmm accumulators: each contraction step adds a [rows,
    # output] block. Vector work beside the MXU's, which the time above leaves out: it only
    # breaks ties (a compute-bound call whose lane tiles trade contraction for output width).
    accumulations: int = 0

    def seconds(self, peak_flops: float, hbm_bytes_per_s: float) -> float:
        """Each kernel bound by its compute or its traffic, whichever is longer, plus the fixed
        cost of every grid step."""
        bound = sum(max(f / peak_flops, b / hbm_bytes_per_s) for f, b in self.calls)
        return bound + self.grid_steps * GRID_STEP_SECONDS


def kernel_cost(
    tile: Tile,
    rows: int,
    contraction: int,
    output: int,
    groups: int,
    size: int,
    weight_size: int | None = None,
) -> KernelCost:
    """megablox's traffic model with the work of its padded tiles: a kernel visits
    rows/tm + groups - 1 row tiles (a tile shared by two groups runs for each), reads one
    expert's weights per row tile, and re-reads its row input once per output tile. Rows and
    gradients are `size` bytes an element, weights and their gradients `weight_size`
    (default `size`: float32 weights read as stored move twice a bfloat16 one's bytes).

    The input gradient is gmm with the roles of K and N swapped (same tile tuple); the weight
    gradient (tgmm) reads the input once per output tile and the output gradient once per
    contraction tile.
    """
    m, k, n, g = rows, contraction, output, groups
    tm, tk, tn = tile.as_tuple()
    w = size if weight_size is None else weight_size
    # lanes computed over a width: whole tiles (round_up), the last one masked
    visits = tile_count(m, tm) + g - 1
    computed_rows = visits * tm
    forward = (
        2 * computed_rows * round_up(k, tk) * round_up(n, tn),
        (m * k * tile_count(n, tn) + m * n) * size + k * n * visits * w,
    )
    input_gradient = (
        2 * computed_rows * round_up(n, tk) * round_up(k, tn),
        (m * n * tile_count(k, tn) + m * k) * size + k * n * visits * w,
    )
    weight_gradient = (
        2 * computed_rows * round_up(k, tk) * round_up(n, tn),
        (m * k * tile_count(n, tn) + m * n * tile_count(k, tk)) * size + g * k * n * w,
    )
    steps = 2 * tile_count(k, tk) * tile_count(n, tn) + tile_count(n, tk) * tile_count(k, tn)
    # the weight gradient's [k, n] accumulator takes one block per row tile whatever the tiles
    added = computed_rows * (
        round_up(n, tn) * tile_count(k, tk) + round_up(k, tn) * tile_count(n, tk)
    )
    return KernelCost((forward, input_gradient, weight_gradient), steps * visits, added)


def tile_count(width: int, tile: int) -> int:
    return -(-width // tile)
