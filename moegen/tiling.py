"""Megablox tile arithmetic: which (rows, contraction, output) tiles a projection may use.

Plain integer rules shared by validation (a pinned tile that breaks one is a located error)
and by the plan (which picks tiles when the spec does not). `gmm` needs the row count to be
a whole number of row tiles, and its custom VJP reuses the same tiling for the input gradient
(`gmm` again) and the weight gradient (`tgmm`), so every row tile of every projection must
divide the padded row count: the plan pads to the least common multiple of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LANES = 128  # contraction and output tiles are whole vector lanes
ROW_MULTIPLE = {"float32": 8, "bfloat16": 16}  # sublanes of one vreg per dtype
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
DEFAULT_TILE = (512, 1024, 1024)  # megablox's sweet spot for large MoE layers (rows, k, n)


@dataclass(frozen=True)
class Tile:
    rows: int
    contraction: int
    output: int

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.rows, self.contraction, self.output)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# The compiler needs room of its own beside the tiles: keep a quarter of the scoped VMEM free
# (on v5e a gmm step of exactly 16 MiB, [512, 1024, 1792] in bfloat16, does not compile;
# 14 MiB does, 15 MiB does not).
VMEM_HEADROOM = 0.75


def vmem_bytes(tile: Tile, dtype: str, out_dtype: str | None = None) -> int:
    """Scoped VMEM of the largest grid step the custom VJP runs with these tiles.

    Each step holds double-buffered input and output blocks and a float32 accumulator.
    gmm (forward, and the input gradient with the roles of k and n swapped) keeps a
    [rows, output] result; tgmm (weight gradient) keeps a [contraction, output] result.
    """
    size = DTYPE_BYTES[dtype]
    out = DTYPE_BYTES[out_dtype or dtype]  # gmm's result (float32 when summed afterwards)
    m, k, n = tile.as_tuple()
    gmm = 2 * (m * k + k * n) * size + 2 * m * n * out + m * n * 4
    tgmm = 2 * (k * m + m * n) * size + 2 * k * n * size + k * n * 4
    return max(gmm, tgmm)


def usable_vmem(vmem_budget: int) -> int:
    return int(vmem_budget * VMEM_HEADROOM)


def tile_problems(tile: Tile, dtype: str, vmem_budget: int) -> list[str]:
    """Why `tile` cannot run (empty when it can)."""
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
    need = vmem_bytes(tile, dtype)
    if need > usable_vmem(vmem_budget):
        fitting = shrink_to_fit(tile, dtype, vmem_budget)
        problems.append(
            f"tiles {list(tile.as_tuple())} need {need / 2**20:.1f} MiB of VMEM forward or "
            f"backward, more than the {usable_vmem(vmem_budget) / 2**20:.0f} MiB tiles may use; "
            f"for example {list(fitting.as_tuple())} fits"
        )
    return problems


def _nearest(value: int, multiple: int) -> str:
    below = value // multiple * multiple
    options = [m for m in (below, below + multiple) if m > 0]
    return " or ".join(map(str, options))


def choose_tile(
    rows: int,
    contraction: int,
    output: int,
    dtype: str,
    vmem_budget: int,
    out_dtype: str | None = None,
) -> Tile:
    """The largest tiles up to DEFAULT_TILE that fit the problem and the VMEM budget."""
    row_cap, k_cap, n_cap = DEFAULT_TILE
    tile = Tile(
        rows=min(row_cap, round_up(rows, ROW_MULTIPLE[dtype])),
        contraction=lane_tile(contraction, k_cap),
        output=lane_tile(output, n_cap),
    )
    return shrink_to_fit(tile, dtype, vmem_budget, out_dtype)


def lane_tile(width: int, cap: int) -> int:
    """The widest lane tile up to `cap` that divides `width` (no masked last tile), when the
    width is whole lanes; else `width` rounded up to lanes, capped."""
    if width % LANES == 0:
        return max(t for t in range(LANES, min(cap, width) + 1, LANES) if width % t == 0)
    return min(cap, round_up(width, LANES))


def shrink_to_fit(tile: Tile, dtype: str, vmem_budget: int, out_dtype: str | None = None) -> Tile:
    """Halve the largest lane tile (then the row tile) until the tiles fit VMEM, aligned."""
    rows_multiple = ROW_MULTIPLE[dtype]
    tile = Tile(
        max(rows_multiple, tile.rows // rows_multiple * rows_multiple),
        max(LANES, tile.contraction // LANES * LANES),
        max(LANES, tile.output // LANES * LANES),
    )
    while vmem_bytes(tile, dtype, out_dtype) > usable_vmem(vmem_budget):
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
