"""Megablox tile arithmetic: which (rows, contraction, output) tiles a projection may use.

Plain integer rules shared by validation (a pinned tile that breaks one is a located error)
and by the plan (which picks tiles when the spec does not: the fastest that fit VMEM, by a
roofline of the kernels' work and megablox's own traffic model). `gmm` needs the row count to be
a whole number of row tiles, and the gradient kernels (`gmm` again for the input gradient,
`tgmm` for the weights) keep the forward's row tile with lane tiles of their own
(`moegen.kernels.tiling_kernels`), so every row tile of every projection must divide the
padded row count: the plan pads to the least common multiple of them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from moegen.kernels.tiling_cost import kernel_cost, round_up, tile_count

LANES = 128  # contraction and output tiles are whole vector lanes
ROW_MULTIPLE = {"float32": 8, "bfloat16": 16}  # sublanes of one vreg per dtype
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# megablox's usual tiling for large MoE layers (rows, k, n); the plan keeps its row tile
DEFAULT_TILE = (512, 1024, 1024)


@dataclass(frozen=True)
class Tile:
    rows: int
    contraction: int
    output: int
    # The gradient kernels' own tiles (input gradient, weight gradient) where the plan chose
    # them (moegen.kernels.tiling_kernels); None: all three kernels run with this one.
    backward: tuple[Tile, Tile] | None = field(default=None, compare=False, repr=False)

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.rows, self.contraction, self.output)


# The compiler's own scratch in a megablox kernel, beside its blocks and accumulator, as
# measured (libtpu 0.0.51, 1,250 kernels on v5e, v5p, v6e and tpu7x: the scoped VMEM each
# compiled kernel reports, tests/kernels/test_tiling_libtpu.py) and bounded from above here: 4 bytes
# per element of the [rows, contraction] block (a float32 copy of it), 6 past 512 rows or 1024
# contraction lanes (v6e's weight gradient at 1024 rows, tpu7x's at 2048 lanes), 1.5 bytes per
# (row tile)^2 (the weight gradient's transposes and masks grow with it), and 128 KiB.
SCRATCH_FIXED_BYTES = 128 * 2**10


def scratch_bytes(tile: Tile) -> int:
    rows, contraction = tile.rows, tile.contraction
    per_element = 4 if rows <= 512 and contraction <= 1024 else 6
    return per_element * rows * contraction + 3 * rows**2 // 2 + SCRATCH_FIXED_BYTES


KERNELS = ("forward gmm", "input-gradient gmm", "weight-gradient tgmm")


def projection_out_dtypes(compute: str, overlap_chunks: int, ffn_chunks: int) -> tuple[str, str]:
    """What the gate/up and the down grouped matmuls write: the compute dtype, or float32 where
    the module adds results up (the overlapped ring's gate and up over embedding chunks, the
    FFN slices' down projections). The gradient reaching each kernel has that type too."""
    gate_up = "float32" if overlap_chunks > 1 else compute
    down = "float32" if ffn_chunks > 1 else compute
    return gate_up, down


VmemBudget = int | tuple[int, int, int]  # one scoped VMEM limit, or each kernel's (KERNELS)


def kernel_limits(vmem_budget: VmemBudget) -> tuple[int, int, int]:
    """Each kernel's scoped VMEM limit (KERNELS order): one budget for all three, or each its
    own (a grouped matmul that sets its own limit, moegen.kernels.pallas.kernel_budgets)."""
    if isinstance(vmem_budget, int):
        return (vmem_budget,) * len(KERNELS)
    return vmem_budget


def kernel_vmem(
    tile: Tile, dtype: str, out_dtype: str | None = None, weight_dtype: str | None = None
) -> tuple[int, int, int]:
    """Scoped VMEM of one grid step of each kernel the custom VJP runs with these tiles
    (KERNELS order), for rows in `dtype`, weights in `weight_dtype` (default `dtype`) and a
    result in `out_dtype`.

    Each holds its input and output blocks double-buffered, in their own dtypes, a float32
    accumulator of its output block, and the compiler's scratch. The forward gmm reads [m, k]
    rows and [k, n] weights and writes [m, n]. The input gradient is gmm again with k and n
    swapped: it reads [m, k] blocks of the result's gradient (`out_dtype`) and [n, k] weights
    and writes [m, n] row gradients. The weight gradient (tgmm) reads [m, k] rows and [m, n]
    blocks of the result's gradient and writes [k, n] weight gradients in the weights' dtype.
    Weights read as stored (float32) and cast block by block hold their cast copy in the
    compiler's scratch: the compiled kernel used 15.96 MiB where this counts 17.8 (v5e,
    (256, 2048, 768), float32 weights), so it stays an upper bound without a term of its own.
    """
    c = DTYPE_BYTES[dtype]
    o = DTYPE_BYTES[out_dtype or dtype]
    w = DTYPE_BYTES[weight_dtype or dtype]
    m, k, n = tile.as_tuple()
    scratch = scratch_bytes(tile)
    return (
        2 * (m * k * c + k * n * w + m * n * o) + m * n * 4 + scratch,
        2 * (m * k * o + n * k * w + m * n * c) + m * n * 4 + scratch,
        2 * (m * k * c + m * n * o + k * n * w) + k * n * 4 + scratch,
    )


def vmem_bytes(
    tile: Tile, dtype: str, out_dtype: str | None = None, weight_dtype: str | None = None
) -> int:
    """Scoped VMEM of the largest grid step of the three kernels (kernel_vmem)."""
    return max(kernel_vmem(tile, dtype, out_dtype, weight_dtype))


def fits_vmem(
    tile: Tile,
    dtype: str,
    vmem_budget: VmemBudget,
    out_dtype: str | None = None,
    weight_dtype: str | None = None,
) -> bool:
    """Every kernel's grid step within its own scoped VMEM limit."""
    steps = kernel_vmem(tile, dtype, out_dtype, weight_dtype)
    limits = kernel_limits(vmem_budget)
    return all(need <= usable_vmem(limit) for need, limit in zip(steps, limits, strict=True))


def usable_vmem(vmem_budget: int) -> int:
    """What the tiles may use of the scoped VMEM: all of it. kernel_vmem is an upper bound of
    what the compiler allocates (scratch included), so the limit itself is the test."""
    return vmem_budget


def tile_problems(
    tile: Tile,
    dtype: str,
    vmem_budget: VmemBudget,
    out_dtype: str | None = None,
    weight_dtype: str | None = None,
) -> list[str]:
    """Why `tile` cannot run (empty when it can), for a result in `out_dtype`."""
    problems = []
    rows_multiple = ROW_MULTIPLE[dtype]
    if tile.rows % rows_multiple:
        problems.append(
            f"row tile {tile.rows} must be a multiple of {rows_multiple} for {dtype}; "
            f"nearest valid: {_nearest(tile.rows, rows_multiple)}"
        )
    for name, value in (("contraction", tile.contraction), ("output", tile.output)):
        if value % LANES:
            problems.append(
                f"{name} tile {value} must be a multiple of {LANES} lanes; "
                f"nearest valid: {_nearest(value, LANES)}"
            )
    steps = kernel_vmem(tile, dtype, out_dtype, weight_dtype)
    limits = [usable_vmem(limit) for limit in kernel_limits(vmem_budget)]
    over = [i for i, (need, limit) in enumerate(zip(steps, limits, strict=True)) if need > limit]
    if over:
        kernel = max(over, key=lambda i: steps[i] - limits[i])
        written = f" of a call writing {out_dtype}" if out_dtype and out_dtype != dtype else ""
        fitting = shrink_to_fit(tile, dtype, vmem_budget, out_dtype, weight_dtype)
        problems.append(
            f"tiles {list(tile.as_tuple())} need {steps[kernel] / 2**20:.1f} MiB of VMEM in the "
            f"{KERNELS[kernel]}{written}, more than the {limits[kernel] / 2**20:.0f} MiB "
            f"scoped VMEM; for example {list(fitting.as_tuple())} fits"
        )
    return problems


def _nearest(value: int, multiple: int) -> str:
    below = value // multiple * multiple
    options = [m for m in (below, below + multiple) if 0 < m < 2**31]  # what a spec may hold
    return " or ".join(map(str, options))


@functools.lru_cache(maxsize=4096)
def choose_tile(
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
    """The tiles whose kernels take the least time (`kernel_cost`) among those that fit VMEM
    (every kernel within its own limit, `kernel_limits`).

    The row tile is searched too, from megablox's 512 (fewer rows when the call has fewer) down
    to MIN_ROW_TILE: a row tile shared by two expert groups runs once for each, so where groups
    are a few row tiles long (fine-grained layers: Qwen3-30B-A3B's 128 experts of ~512 rows)
    a smaller tile wastes less, while a coarse layer keeps 512 (measured on one v5e chip,
    bench/TPU_CHECK.md: Qwen3's six kernels 5-18% faster at 256 rows, Mixtral's best at 512).
    The lane tiles decide how often the rows are read and how many masked lanes the MXU
    computes, and give way first when VMEM is short. Ties go to fewer grid steps, then to fewer
    accumulator additions (the wider contraction tile); a shorter row tile must be clearly
    faster (SHORTER_ROW_TILE_GAIN).
    """
    row_multiple = ROW_MULTIPLE[dtype]
    fit = functools.partial(
        fits_vmem,
        dtype=dtype,
        vmem_budget=vmem_budget,
        out_dtype=out_dtype,
        weight_dtype=weight_dtype,
    )
    # Only widths that fit VMEM in some tile are tried: a few dozen whatever the layer's widths
    # (a width of 2**31 has 2**24 lane tiles, which the search would otherwise walk).
    widest = widest_lane_tile(dtype, vmem_budget, out_dtype, weight_dtype)
    widths = sorted(set(lane_tiles(contraction, widest)) | set(lane_tiles(output, widest)))
    sizes = (DTYPE_BYTES[dtype], DTYPE_BYTES[weight_dtype or dtype])
    row_tile = max(row_multiple, min(DEFAULT_TILE[0], round_up(rows, row_multiple)))

    def rank(tile: Tile) -> tuple[float, int, int]:
        cost = kernel_cost(tile, rows, contraction, output, groups, *sizes)
        return (cost.seconds(peak_flops, hbm_bytes_per_s), cost.grid_steps, cost.accumulations)

    def best(row_tile: int) -> Tile | None:
        fitting = _fitting_tiles(row_tile, widths, fit)
        return min(fitting, key=rank) if fitting else None

    searched = _row_tiles(row_tile, row_multiple)
    chosen = None
    for candidate in filter(None, map(best, searched)):
        # a shorter row tile only where it is clearly faster than the taller one chosen
        if chosen is None or rank(candidate)[0] <= SHORTER_ROW_TILE_GAIN * rank(chosen)[0]:
            chosen = candidate
    row_tile = searched[-1]
    while chosen is None and row_tile > row_multiple:  # lane tiles too wide for VMEM: fewer rows
        row_tile = _half(row_tile, row_multiple)
        chosen = best(row_tile)
    return chosen or Tile(row_multiple, LANES, LANES)  # tile_problems says why it cannot run


# A shorter row tile is taken only where the roofline has it this much faster than the taller
# one: on one v5e chip the model's ratio of 256 to 512 rows was within 7% of the measured one
# (Qwen3-30B-A3B's six kernels, bench/TPU_CHECK.md), so a smaller predicted gain is noise.
SHORTER_ROW_TILE_GAIN = 0.90


# The smallest row tile the search offers: one MXU pass of rows (128 on every TPU generation);
# below it the MXU runs part-empty, which the roofline does not model.
MIN_ROW_TILE = 128


def _row_tiles(top: int, row_multiple: int) -> list[int]:
    """Row tiles to search: `top`, then halved while at least MIN_ROW_TILE and aligned."""
    tiles = [top]
    while tiles[-1] // 2 >= MIN_ROW_TILE and tiles[-1] // 2 % row_multiple == 0:
        tiles.append(tiles[-1] // 2)
    return tiles


def _fitting_tiles(row_tile: int, widths: list[int], fit: Callable[[Tile], bool]) -> list[Tile]:
    fitting = []
    for k in widths:
        for n in widths:
            tile = Tile(row_tile, k, n)
            if not fit(tile):
                break  # VMEM grows with the output tile: the wider ones do not fit either
            fitting.append(tile)
    return fitting


def lane_tiles(width: int, widest: int | None = None) -> list[int]:
    """Lane tiles worth trying over `width`, up to `widest` lanes: those that divide it when it
    is whole lanes (no masked last tile), else for every tile count the narrowest tile of that
    count (the narrowest of the count that a tile t needs, ceil(width / t), for each t)."""
    top = round_up(width, LANES)
    if widest is not None:
        top = min(top, max(LANES, widest))
    candidates = range(LANES, top + 1, LANES)
    if width % LANES == 0:
        return [t for t in candidates if width % t == 0]
    return sorted({round_up(tile_count(width, tile_count(width, t)), LANES) for t in candidates})


def widest_lane_tile(
    dtype: str,
    vmem_budget: VmemBudget,
    out_dtype: str | None = None,
    weight_dtype: str | None = None,
) -> int:
    """The widest lane tile (contraction or output) that fits the VMEM budget in any tile:
    beside one lane tile the other way and the fewest rows (VMEM grows with every side)."""
    rows = ROW_MULTIPLE[dtype]

    def fits(width: int) -> bool:
        return any(
            fits_vmem(tile, dtype, vmem_budget, out_dtype, weight_dtype)
            for tile in (Tile(rows, width, LANES), Tile(rows, LANES, width))
        )

    low, high = LANES, 2 * LANES  # low fits (or nothing does), high does not: bisect between
    while fits(high):
        low, high = high, 2 * high
    while high - low > LANES:
        middle = round_up((low + high) // 2, LANES)
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def shrink_to_fit(
    tile: Tile,
    dtype: str,
    vmem_budget: VmemBudget,
    out_dtype: str | None = None,
    weight_dtype: str | None = None,
) -> Tile:
    """Halve the largest lane tile (then the row tile) until the tiles fit VMEM, aligned."""
    rows_multiple = ROW_MULTIPLE[dtype]
    tile = Tile(
        max(rows_multiple, tile.rows // rows_multiple * rows_multiple),
        max(LANES, tile.contraction // LANES * LANES),
        max(LANES, tile.output // LANES * LANES),
    )
    while not fits_vmem(tile, dtype, vmem_budget, out_dtype, weight_dtype):
        if max(tile.contraction, tile.output) > LANES:
            if tile.contraction >= tile.output:
                tile = Tile(tile.rows, _half(tile.contraction, LANES), tile.output)
            else:
                tile = Tile(tile.rows, tile.contraction, _half(tile.output, LANES))
        elif tile.rows > rows_multiple:
            tile = Tile(_half(tile.rows, rows_multiple), tile.contraction, tile.output)
        else:
            break
    return tile


def _half(value: int, multiple: int) -> int:
    """About half of `value`, still a positive multiple of `multiple`."""
    return max(multiple, value // 2 // multiple * multiple)


def padded_rows(rows: int, tiles: list[Tile]) -> int:
    """Rows rounded up so that every row tile used, forward and backward, divides them."""
    return round_up(rows, math.lcm(*(t.rows for t in tiles)))
