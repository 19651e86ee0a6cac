"""`moegen.kernels.tiling.choose_tile` over realistic MoE projections (gate/up D -> F and down F -> D), routed row counts from 1 to 100k, both compute dtypes and every TPU's VMEM budget, against the kernel cost model."""

from __future__ import annotations

import pytest
from tiling_cases import BUDGETS, DTYPES, MIB, choose

from moegen.hardware import CATALOGUE
from moegen.kernels.tiling import (
    DEFAULT_TILE,
    DTYPE_BYTES,
    LANES,
    MIN_ROW_TILE,
    ROW_MULTIPLE,
    SHORTER_ROW_TILE_GAIN,
    Tile,
    lane_tiles,
    tile_problems,
    usable_vmem,
    vmem_bytes,
)
from moegen.kernels.tiling_cost import GRID_STEP_SECONDS, kernel_cost, round_up

# name -> (embed_dim D, ffn_dim F) of one routed expert
NAMED_SHAPES = {
    "mixtral-8x7b": (4096, 14336),
    "qwen3-30b-a3b": (2048, 768),
    "deepseek-v3": (7168, 2048),
    "mixtral-small": (512, 1792),
    "tiny": (64, 128),
    "odd": (96, 200),  # neither dimension a multiple of the 128 lanes
}
ROUTED_ROWS = [8192, 20, 80, 1, 100000, 16384, 513]


CHOOSE_CASES = [
    pytest.param(shape, rows, dtype, hw, id=f"{shape}-rows{rows}-{dtype}-{hw}")
    for shape in NAMED_SHAPES
    for rows in ROUTED_ROWS
    for dtype in DTYPES
    for hw in BUDGETS
]


def seconds(tile: Tile, rows: int, k: int, n: int, dtype: str, hw: str, groups: int = 8):
    chip = CATALOGUE[hw]
    cost = kernel_cost(tile, rows, k, n, groups, DTYPE_BYTES[dtype])
    return cost.seconds(chip.peak_bf16_flops_per_chip, chip.hbm_bytes_per_s_per_chip)


def _best_of_rows(row_tile: int, rows: int, k: int, n: int, dtype: str, hw: str) -> float:
    """The model's time of the fastest lane tiles at `row_tile` rows that fit VMEM."""
    widths = sorted(set(lane_tiles(k)) | set(lane_tiles(n)))
    fitting = [
        Tile(row_tile, a, b)
        for a in widths
        for b in widths
        if vmem_bytes(Tile(row_tile, a, b), dtype) <= usable_vmem(BUDGETS[hw])
    ]
    return min(seconds(t, rows, k, n, dtype, hw) for t in fitting)


@pytest.mark.parametrize(("shape", "rows", "dtype", "hw"), CHOOSE_CASES)
def test_choose_tile_is_aligned_and_fits(shape: str, rows: int, dtype: str, hw: str) -> None:
    embed, ffn = NAMED_SHAPES[shape]
    budget = BUDGETS[hw]
    for contraction, output in ((embed, ffn), (ffn, embed), (embed, 2 * ffn)):  # gate/up, down
        tile = choose(rows, contraction, output, dtype, hw)
        assert tile.rows % ROW_MULTIPLE[dtype] == 0, tile
        assert tile.contraction % LANES == 0, tile
        assert tile.output % LANES == 0, tile
        assert vmem_bytes(tile, dtype) <= usable_vmem(budget), tile  # forward and backward
        assert tile_problems(tile, dtype, budget) == []
        # megablox's row tile (or the whole call when it is shorter), or a shorter one of at
        # least MIN_ROW_TILE that the model has clearly faster than every tile of the taller
        top = min(DEFAULT_TILE[0], round_up(rows, ROW_MULTIPLE[dtype]))
        if tile.rows != top:
            assert MIN_ROW_TILE <= tile.rows < top and top % tile.rows == 0, tile
            taller = _best_of_rows(top, rows, contraction, output, dtype, hw)
            chosen = seconds(tile, rows, contraction, output, dtype, hw)
            assert chosen <= SHORTER_ROW_TILE_GAIN * taller, (tile, chosen, taller)
        # a lane tile never spans more than the wider of the two widths it tiles
        widest = round_up(max(contraction, output), LANES)
        assert max(tile.contraction, tile.output) <= widest, tile


@pytest.mark.parametrize(("shape", "rows", "dtype", "hw"), CHOOSE_CASES)
def test_choose_tile_is_never_slower_than_megablox_default(shape, rows, dtype, hw) -> None:
    """By the kernel cost model, the chosen tiles beat (or equal) every tile of the lanes
    megablox's default would use, wherever those fit."""
    embed, ffn = NAMED_SHAPES[shape]
    budget = BUDGETS[hw]
    for contraction, output in ((embed, ffn), (ffn, embed)):
        tile = choose(rows, contraction, output, dtype, hw)
        chosen = seconds(tile, rows, contraction, output, dtype, hw)
        for k in (128, 256, 512, 1024):
            for n in (128, 256, 512, 1024):
                other = Tile(tile.rows, k, n)
                if vmem_bytes(other, dtype) <= usable_vmem(budget) and (
                    contraction % k == 0 and output % n == 0
                ):
                    assert chosen <= seconds(other, rows, contraction, output, dtype, hw), other


def test_kernel_cost_by_hand() -> None:
    # 1024 rows in 2 groups, K = 256, N = 384, tiles (512, 128, 256), 2-byte values.
    # Row tiles visited: 1024/512 + 2 - 1 = 3 (the tile two groups share runs twice): 1536
    # rows computed. N = 384 in tiles of 256 covers 512 lanes (2 tiles); K = 256 in tiles of
    # 128 covers 256 (2 tiles); as the input gradient's contraction N is 3 tiles of 128 and
    # its output K one tile of 256.
    cost = kernel_cost(Tile(512, 128, 256), 1024, 256, 384, 2, 2)
    forward, input_gradient, weight_gradient = cost.calls
    # forward: rows read once per output tile (2), one expert's weights per row tile (3)
    assert forward == (2 * 1536 * 256 * 512, (1024 * 256 * 2 + 256 * 384 * 3 + 1024 * 384) * 2)
    # input gradient: output gradient read once per tile of K (1)
    assert input_gradient == (
        2 * 1536 * 384 * 256,
        (1024 * 384 * 1 + 256 * 384 * 3 + 1024 * 256) * 2,
    )
    # weight gradient: input once per output tile (2), output gradient once per contraction
    # tile (2), one [K, N] result per group
    assert weight_gradient == (
        2 * 1536 * 256 * 512,
        (1024 * 256 * 2 + 1024 * 384 * 2 + 2 * 256 * 384) * 2,
    )
    # grid steps: (forward and weight gradient 2*2, input gradient 3*1) per row tile visited
    assert cost.grid_steps == (2 * 2 * 2 + 3 * 1) * 3
    # 1 TFLOP/s and 1 GB/s: each call bound by its bytes here, plus 0.35 us a step
    bound = sum(b / 1e9 for _, b in cost.calls)
    assert cost.seconds(1e12, 1e9) == pytest.approx(bound + 33 * 0.35e-6)
    assert GRID_STEP_SECONDS == 0.35e-6


@pytest.mark.parametrize(
    ("width", "tiles"),
    [
        (768, [128, 256, 384, 768]),  # qwen3 ffn: the lane tiles that divide it
        (1792, [128, 256, 896, 1792]),  # one of 8 slices of mixtral's ffn
        (200, [128, 256]),  # not whole lanes: 2 tiles of 128 (the last masked), or one of 256
        # gpt-oss, not whole lanes: for 23 tiles down to 1, the narrowest of each count
        (2880, [128, 256, 384, 512, 640, 768, 1024, 1536, 2944]),
    ],
)
def test_lane_tiles(width: int, tiles: list[int]) -> None:
    assert lane_tiles(width) == tiles


@pytest.mark.parametrize(
    ("rows", "contraction", "output", "dtype", "hw", "groups", "expected", "out_dtype"),
    [
        # qwen3-30b-a3b ring of experts on v6e: gate and up side by side (N = 2 x 768), 32768
        # rows, 16 local experts. Memory-bound at 512 rows a tile (v6e: 918 TFLOP/s, 1638
        # GB/s, 560 FLOPs a byte), so a wide output tile that reads the 2048-wide rows once,
        # forward and in the weight gradient, wins: 24.5 MiB of v6e's 32 (tgmm).
        (32768, 2048, 1536, "bfloat16", "tpu-v6e", 16, (512, 1024, 2048), None),
        # mixtral-8x7b gate/up on v5e (197 TFLOP/s, 819 GB/s): compute-bound, so (512, 1024,
        # 1024) and (512, 512, 2048) take the same modelled time and grid steps (both 14.5 MiB);
        # the wider contraction adds half as many blocks into the accumulators: megablox's
        # default
        (8192, 4096, 14336, "bfloat16", "tpu-v5e", 8, (512, 1024, 1024), None),
        # float32 on v5e: (512, 1024, 1024) needs 22.5 MiB > 16; half the contraction fits
        (8192, 4096, 14336, "float32", "tpu-v5e", 8, (512, 512, 1024), None),
        # the down projection of mixtral in 2 FFN slices writes float32: (512, 1024, 1024)
        # needs 16.5 MiB in the weight gradient; 896 of the 7168 columns a step, 15 MiB
        (8192, 7168, 4096, "bfloat16", "tpu-v5e", 2, (512, 896, 1024), "float32"),
        # deepseek-v3 routed expert, one routed row: 16 rows (the bfloat16 row group), and with
        # 16 rows the 2048-wide output tile fits: one output tile reads the row once
        (1, 7168, 2048, "bfloat16", "tpu-v5e", 8, (16, 896, 2048), None),
        # tiny: one lane tile each way, 80 rows
        (80, 64, 128, "bfloat16", "tpu-v5e", 8, (80, 128, 128), None),
    ],
)
def test_choose_tile_known_values(
    rows, contraction, output, dtype, hw, groups, expected, out_dtype
):
    tile = choose(rows, contraction, output, dtype, hw, groups, out_dtype=out_dtype)
    assert tile.as_tuple() == expected
    assert tile_problems(tile, dtype, BUDGETS[hw], out_dtype) == []


def test_choose_tile_ring_beats_the_old_default_by_the_model() -> None:
    """The ring's fused gate/up: megablox's (512, 1024, 768), read over 2 output tiles, against
    the chosen (512, 1024, 2048)."""
    old = seconds(Tile(512, 1024, 768), 32768, 2048, 1536, "bfloat16", "tpu-v6e", 16)
    new = seconds(Tile(512, 1024, 2048), 32768, 2048, 1536, "bfloat16", "tpu-v6e", 16)
    assert new < 0.9 * old


@pytest.mark.parametrize(
    ("rows", "contraction", "output", "dtype", "budget"),
    [
        (512, 384, 384, "float32", 4 * MIB),
        (512, 640, 128, "bfloat16", 2 * MIB),
        (512, 1152, 1152, "bfloat16", 8 * MIB),
        (1000, 640, 896, "float32", 1 * MIB),  # no lanes fit beside 512 rows: (256, 128, 128)
    ],
)
def test_choose_tile_stays_aligned_under_small_budgets(rows, contraction, output, dtype, budget):
    tile = choose(rows, contraction, output, dtype, "tpu-v5e", budget=budget)
    assert tile_problems(tile, dtype, budget) == [], tile
    assert tile.contraction % LANES == 0 and tile.output % LANES == 0, tile
    assert tile.rows % ROW_MULTIPLE[dtype] == 0, tile
