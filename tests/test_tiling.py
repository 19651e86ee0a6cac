"""`moegen.tiling`: megablox tile arithmetic, and THE TILE RULE of pallas plans.

choose_tile is checked over realistic MoE projections (both directions: gate/up D -> F and
down F -> D), routed row counts from one row to 100k, both compute dtypes and the VMEM budget
of every TPU generation in the catalogue. The tile rule is checked on whole plans: every row
tile the kernel uses, forward and backward, divides the padded row count, which exceeds the
routed rows by less than one alignment step.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from moegen.hardware import CATALOGUE
from moegen.load import load_spec_bytes
from moegen.plan import Plan, make_plan
from moegen.tiling import (
    DEFAULT_TILE,
    DTYPE_BYTES,
    GRID_STEP_SECONDS,
    LANES,
    ROW_MULTIPLE,
    VMEM_HEADROOM,
    Tile,
    choose_tile,
    kernel_cost,
    lane_tiles,
    padded_rows,
    round_up,
    shrink_to_fit,
    tile_problems,
    usable_vmem,
    vmem_bytes,
)
from moegen.validate import check_rules

MIB = 2**20

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
DTYPES = ["bfloat16", "float32"]
BUDGETS = {name: hw.vmem_bytes_for_tiles for name, hw in CATALOGUE.items() if hw.platform == "tpu"}


# ---------------------------------------------------------------------------------------
# Helpers


def test_round_up() -> None:
    assert [round_up(v, 16) for v in (1, 15, 16, 17, 32, 100000)] == [16, 16, 16, 32, 32, 100000]
    assert round_up(100000, 512) == 100352
    assert round_up(20, 8) == 24


def gmm_step(m: int, k: int, n: int, size: int) -> int:
    """gmm (forward and input gradient): double-buffered [m, k] and [k, n] inputs and [m, n]
    output, [m, n] float32 accumulator."""
    return 2 * (m * k + k * n) * size + 2 * m * n * size + 4 * m * n


def tgmm_step(m: int, k: int, n: int, size: int) -> int:
    """tgmm (weight gradient): double-buffered [k, m] and [m, n] inputs and [k, n] output,
    [k, n] float32 accumulator."""
    return 2 * (k * m + m * n) * size + 2 * k * n * size + 4 * k * n


def test_vmem_bytes_by_hand() -> None:
    # bfloat16 (512, 1024, 1024); m*k = 0.5 Mi, k*n = 1 Mi, m*n = 0.5 Mi elements.
    #   gmm:  inputs 2*(0.5 + 1)*2 B = 6 MiB, output 2*0.5*2 B = 2 MiB, acc 0.5*4 B = 2 MiB: 10
    #   tgmm: inputs 2*(0.5 + 0.5)*2 B = 4 MiB, output 2*1*2 B = 4 MiB, acc 1*4 B = 4 MiB: 12
    assert vmem_bytes(Tile(*DEFAULT_TILE), "bfloat16") == 12 * MIB
    # float32: gmm 2*1.5*4 + 2*0.5*4 + 0.5*4 = 12 + 4 + 2 = 18; tgmm 2*1*4 + 2*1*4 + 1*4 = 20
    assert vmem_bytes(Tile(*DEFAULT_TILE), "float32") == 20 * MIB
    # (16, 128, 128) bfloat16: gmm 2*(2048 + 16384)*2 + 2*2048*2 + 4*2048 = 73728 + 8192 + 8192
    # = 90112; tgmm 2*(2048 + 2048)*2 + 2*16384*2 + 4*16384 = 16384 + 65536 + 65536 = 147456
    assert vmem_bytes(Tile(16, 128, 128), "bfloat16") == 147456
    # the formulas spelled out above agree with these hand totals
    assert (gmm_step(16, 128, 128, 2), tgmm_step(16, 128, 128, 2)) == (90112, 147456)
    # (128, 1024, 1024) bfloat16: m*k = m*n = 128 Ki, k*n = 1 Mi elements.
    #   gmm:  2*(0.125 + 1)*2 + 2*0.125*2 + 0.125*4 = 4.5 + 0.5 + 0.5 = 5.5 MiB
    #   tgmm: 2*(0.125 + 0.125)*2 + 2*1*2 + 1*4 = 1 + 4 + 4 = 9 MiB: the weight gradient decides
    assert vmem_bytes(Tile(128, 1024, 1024), "bfloat16") == 9 * MIB
    # (1024, 512, 1024) bfloat16: m*k = k*n = 0.5 Mi, m*n = 1 Mi elements.
    #   gmm:  2*(0.5 + 0.5)*2 + 2*1*2 + 1*4 = 4 + 4 + 4 = 12 MiB: the forward step decides
    #   tgmm: 2*(0.5 + 1)*2 + 2*0.5*2 + 0.5*4 = 6 + 2 + 2 = 10 MiB
    assert vmem_bytes(Tile(1024, 512, 1024), "bfloat16") == 12 * MIB
    # Asymmetric in contraction and output. (512, 128, 1024): m*k = 64 Ki, k*n = 128 Ki,
    # m*n = 512 Ki; gmm 2*192Ki*2 + 2*512Ki*2 + 4*512Ki = 768 + 2048 + 2048 Ki = 4864 Ki,
    # tgmm 2*576Ki*2 + 2*128Ki*2 + 4*128Ki = 2304 + 512 + 512 Ki = 3328 Ki.
    # (512, 1024, 128): m*k = 512 Ki, k*n = 128 Ki, m*n = 64 Ki; gmm 2*640Ki*2 + 256Ki + 256Ki
    # = 3072 Ki, tgmm 2*576Ki*2 + 512Ki + 512Ki = 3328 Ki.
    assert vmem_bytes(Tile(512, 128, 1024), "bfloat16") == 4864 * 2**10
    assert vmem_bytes(Tile(512, 1024, 128), "bfloat16") == 3328 * 2**10


@pytest.mark.parametrize(
    "tile",
    [(512, 1024, 1024), (16, 128, 128), (128, 1024, 1024), (1024, 512, 1024), (24, 4096, 2050)],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_vmem_bytes_is_the_larger_step(tile: tuple[int, int, int], dtype: str) -> None:
    size = DTYPE_BYTES[dtype]
    assert vmem_bytes(Tile(*tile), dtype) == max(gmm_step(*tile, size), tgmm_step(*tile, size))


def test_usable_vmem_keeps_a_quarter_free() -> None:
    assert VMEM_HEADROOM == 0.75
    assert usable_vmem(16 * MIB) == 12 * MIB  # v5e, v5p
    assert usable_vmem(32 * MIB) == 24 * MIB  # v6e, tpu7x
    assert usable_vmem(0) == 0
    # 0.75 * 27962027 = 20971520.25 -> 20 MiB; 0.75 * 27962026 = 20971519.5 -> one byte less
    assert usable_vmem(27962027) == 20 * MIB
    assert usable_vmem(27962026) == 20 * MIB - 1


def test_tile_as_tuple() -> None:
    assert Tile(16, 128, 256).as_tuple() == (16, 128, 256)


@pytest.mark.parametrize(
    ("tile", "dtype", "budget", "problems"),
    [
        (Tile(512, 1024, 1024), "bfloat16", 16 * MIB, []),  # 12 MiB: exactly v5e's usable 12
        (Tile(8, 128, 128), "float32", 16 * MIB, []),
        (
            Tile(8, 128, 128),
            "bfloat16",
            16 * MIB,
            ["row tile 8 must be a multiple of 16 for bfloat16; nearest valid: 16"],
        ),
        (
            Tile(100, 128, 128),
            "float32",
            16 * MIB,
            ["row tile 100 must be a multiple of 8 for float32; nearest valid: 96 or 104"],
        ),
        (
            Tile(16, 64, 129),
            "bfloat16",
            16 * MIB,
            [
                "contraction tile 64 must be a multiple of 128 lanes; nearest valid: 128",
                "output tile 129 must be a multiple of 128 lanes; nearest valid: 128 or 256",
            ],
        ),
        # float32 default: 20 MiB (tgmm) > 0.75 * 16 = 12. Halving the contraction (1024 >=
        # 1024) gives (512, 512, 1024): m*k = 0.25 Mi, k*n = m*n = 0.5 Mi; gmm 2*0.75*4 +
        # 2*0.5*4 + 0.5*4 = 6 + 4 + 2 = 12, tgmm 2*0.75*4 + 2*0.5*4 + 0.5*4 = 12: fits.
        (
            Tile(512, 1024, 1024),
            "float32",
            16 * MIB,
            [
                "tiles [512, 1024, 1024] need 20.0 MiB of VMEM forward or backward, more than "
                "the 12 MiB tiles may use; for example [512, 512, 1024] fits"
            ],
        ),
        (Tile(512, 1024, 1024), "float32", 32 * MIB, []),  # 20 MiB of 24 usable
        # 18 MiB used to be "exactly the budget" (gmm step only, no headroom): now 20 > 13.5
        # (0.75 * 18; the message rounds it to 14)
        (
            Tile(512, 1024, 1024),
            "float32",
            18 * MIB,
            [
                "tiles [512, 1024, 1024] need 20.0 MiB of VMEM forward or backward, more than "
                "the 14 MiB tiles may use; for example [512, 512, 1024] fits"
            ],
        ),
        # exactly the usable budget fits: 0.75 * 27962027 B = 20 MiB (and a byte less does not)
        (Tile(512, 1024, 1024), "float32", 27962027, []),
        (
            Tile(512, 1024, 1024),
            "float32",
            27962026,
            [
                "tiles [512, 1024, 1024] need 20.0 MiB of VMEM forward or backward, more than "
                "the 20 MiB tiles may use; for example [512, 512, 1024] fits"
            ],
        ),
        # the weight gradient decides: gmm 5.5 MiB fits 0.75 * 8 = 6, tgmm 9 MiB does not.
        # (128, 512, 1024): m*k = 64 Ki, k*n = 512 Ki, m*n = 128 Ki; gmm 2*576Ki*2 + 2*128Ki*2
        # + 4*128Ki = 2304 + 512 + 512 Ki = 3.25 MiB, tgmm 2*192Ki*2 + 2*512Ki*2 + 4*512Ki =
        # 768 + 2048 + 2048 Ki = 4.75 MiB: fits.
        (
            Tile(128, 1024, 1024),
            "bfloat16",
            8 * MIB,
            [
                "tiles [128, 1024, 1024] need 9.0 MiB of VMEM forward or backward, more than "
                "the 6 MiB tiles may use; for example [128, 512, 1024] fits"
            ],
        ),
        # misaligned and too large: the example is aligned. (512, 1100, 1024): m*k = 563200,
        # k*n = 1126400, m*n = 524288; tgmm 2*(563200 + 524288)*2 + 2*1126400*2 + 4*1126400
        # = 4349952 + 4505600 + 4505600 = 13361152 B = 12.74 MiB (gmm 10952704 B). Aligned
        # down to (512, 1024, 1024) it needs 12 MiB: fits.
        (
            Tile(512, 1100, 1024),
            "bfloat16",
            16 * MIB,
            [
                "contraction tile 1100 must be a multiple of 128 lanes; nearest valid: 1024 or "
                "1152",
                "tiles [512, 1100, 1024] need 12.7 MiB of VMEM forward or backward, more than "
                "the 12 MiB tiles may use; for example [512, 1024, 1024] fits",
            ],
        ),
    ],
)
def test_tile_problems(tile: Tile, dtype: str, budget: int, problems: list[str]) -> None:
    assert tile_problems(tile, dtype, budget) == problems


@pytest.mark.parametrize(
    ("tile", "dtype", "budget", "expected"),
    [
        # already fits: unchanged
        ((512, 1024, 1024), "bfloat16", 16 * MIB, (512, 1024, 1024)),
        # (512, 2048, 2048) bfloat16: 40 MiB -> k (2048 >= 2048) -> (512, 1024, 2048): gmm
        # 2*2.5*2 + 2*1*2 + 4 = 18, tgmm 2*1.5*2 + 2*2*2 + 8 = 22 -> n -> (512, 1024, 1024): 12
        ((512, 2048, 2048), "bfloat16", 16 * MIB, (512, 1024, 1024)),
        # an odd number of lanes halves to a multiple of 128: 1152 -> 512 (576 rounded down).
        # (512, 1024, 1152): gmm 2*1.625*2 + 2*0.5625*2 + 4*0.5625 = 6.5 + 2.25 + 2.25 = 11,
        # tgmm 2*1.0625*2 + 2*1.125*2 + 4*1.125 = 4.25 + 4.5 + 4.5 = 13.25 MiB > 12.
        # (512, 1024, 512): gmm 2*1*2 + 2*0.25*2 + 0.25*4 = 6, tgmm 2*0.75*2 + 2 + 2 = 7: fits
        ((512, 1024, 1152), "bfloat16", 16 * MIB, (512, 1024, 512)),
        # (512, 640, 128) bfloat16 under 2 MiB (1.5 usable): 640 -> 256 (320 rounded down).
        # (512, 640, 128): gmm 2*(327680 + 81920)*2 + 2*65536*2 + 4*65536 = 1638400 + 262144
        # + 262144 = 2162688 > 1572864. (512, 256, 128): gmm 2*(131072 + 32768)*2 + 262144 +
        # 262144 = 1179648, tgmm 2*(131072 + 65536)*2 + 2*32768*2 + 4*32768 = 786432 + 131072
        # + 131072 = 1048576: fits
        ((512, 640, 128), "bfloat16", 2 * MIB, (512, 256, 128)),
        # misaligned: rounded down to alignment first, (24, 4096, 2050) -> (16, 4096, 2048);
        # then k 4096 -> 2048 (tgmm 2*(32+32)Ki*2 + 2*4Mi*2 + 4*4Mi = 32.25 MiB), k 2048 ->
        # 1024 (tgmm 2*(16+32)Ki*2 + 2*2Mi*2 + 4*2Mi = 16.19 MiB), n 2048 -> 1024: tgmm
        # 2*(16+16)Ki*2 + 2*1Mi*2 + 4*1Mi = 8.125 MiB fits
        ((24, 4096, 2050), "bfloat16", 16 * MIB, (16, 1024, 1024)),
        # lanes at 128, then the rows halve: (512, 128, 128) float32 under 1 MiB (0.75 usable):
        # gmm 2*(64 + 16)Ki*4 + 2*64Ki*4 + 4*64Ki = 640 + 512 + 256 Ki = 1408 Ki > 768 Ki;
        # (256, 128, 128): 2*(32 + 16)Ki*4 + 2*32Ki*4 + 4*32Ki = 384 + 256 + 128 = 768 Ki fits
        ((512, 128, 128), "float32", 1 * MIB, (256, 128, 128)),
    ],
)
def test_shrink_to_fit_known_values(tile, dtype, budget, expected) -> None:
    fitted = shrink_to_fit(Tile(*tile), dtype, budget)
    assert fitted.as_tuple() == expected
    assert tile_problems(fitted, dtype, budget) == []


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hw", list(BUDGETS))
def test_vmem_advice_names_a_tile_that_fits(dtype: str, hw: str) -> None:
    """Every overflowing tile is answered with an aligned, no larger tile that passes."""
    budget = BUDGETS[hw]
    sizes = [16, 24, 128, 384, 512, 1000, 1024, 1152, 2048, 4096]
    advised = 0
    for tile in (Tile(m, k, n) for m in sizes for k in sizes for n in sizes):
        problems = tile_problems(tile, dtype, budget)
        if not problems or "VMEM" not in problems[-1]:
            continue
        advised += 1
        suggestion = problems[-1].rsplit("for example ", 1)[1].removesuffix(" fits")
        fitted = Tile(*(int(v) for v in suggestion.strip("[]").split(", ")))
        assert tile_problems(fitted, dtype, budget) == [], (tile, fitted)
        # never larger, except a tile below one row group / one lane rounds up to it
        floors = (ROW_MULTIPLE[dtype], LANES, LANES)
        for f, t, floor in zip(fitted.as_tuple(), tile.as_tuple(), floors, strict=True):
            assert f <= max(t, floor), (tile, fitted)
    assert advised > 100


def test_padded_rows() -> None:
    assert padded_rows(8192, [Tile(512, 1024, 1024), Tile(512, 1024, 1024)]) == 8192
    assert padded_rows(100000, [Tile(512, 1024, 1024), Tile(512, 1024, 1024)]) == 100352
    assert padded_rows(20, [Tile(32, 1024, 768), Tile(32, 768, 1024)]) == 32
    # different row tiles: their least common multiple
    assert padded_rows(1, [Tile(256, 128, 128), Tile(384, 128, 128)]) == 768
    assert padded_rows(769, [Tile(256, 128, 128), Tile(384, 128, 128)]) == 1536
    assert padded_rows(48, [Tile(16, 128, 128), Tile(48, 128, 128)]) == 48


# ---------------------------------------------------------------------------------------
# choose_tile over realistic projections


CHOOSE_CASES = [
    pytest.param(shape, rows, dtype, hw, id=f"{shape}-rows{rows}-{dtype}-{hw}")
    for shape in NAMED_SHAPES
    for rows in ROUTED_ROWS
    for dtype in DTYPES
    for hw in BUDGETS
]


def choose(rows: int, k: int, n: int, dtype: str, hw: str, groups: int = 8, **kw) -> Tile:
    chip = CATALOGUE[hw]
    return choose_tile(
        rows,
        k,
        n,
        dtype,
        kw.pop("budget", chip.vmem_bytes_for_tiles),
        groups=groups,
        peak_flops=chip.peak_bf16_flops_per_chip,
        hbm_bytes_per_s=chip.hbm_bytes_per_s_per_chip,
        **kw,
    )


def seconds(tile: Tile, rows: int, k: int, n: int, dtype: str, hw: str, groups: int = 8):
    chip = CATALOGUE[hw]
    cost = kernel_cost(tile, rows, k, n, groups, DTYPE_BYTES[dtype])
    return cost.seconds(chip.peak_bf16_flops_per_chip, chip.hbm_bytes_per_s_per_chip)


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
        # megablox's row tile, or the whole call when it is shorter
        assert tile.rows == min(DEFAULT_TILE[0], round_up(rows, ROW_MULTIPLE[dtype])), tile
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
    ("rows", "contraction", "output", "dtype", "hw", "groups", "expected"),
    [
        # qwen3-30b-a3b ring of experts on v6e: gate and up side by side (N = 2 x 768), 32768
        # rows, 16 local experts. Memory-bound at 512 rows a tile (v6e: 918 TFLOP/s, 1638
        # GB/s, 560 FLOPs a byte), so a wide output tile that reads the 2048-wide rows once,
        # forward and in the weight gradient, wins: 22 MiB of the 24 usable.
        (32768, 2048, 1536, "bfloat16", "tpu-v6e", 16, (512, 1024, 2048)),
        # mixtral-8x7b gate/up on v5e (197 TFLOP/s, 819 GB/s): compute-bound, megablox's
        # default is the fastest that fits
        (8192, 4096, 14336, "bfloat16", "tpu-v5e", 8, (512, 1024, 1024)),
        # float32 on v5e: (512, 1024, 1024) needs 20 MiB > 12; half the contraction fits
        (8192, 4096, 14336, "float32", "tpu-v5e", 8, (512, 512, 1024)),
        # deepseek-v3 routed expert, one routed row: 16 rows (the bfloat16 row group)
        (1, 7168, 2048, "bfloat16", "tpu-v5e", 8, (16, 1024, 1024)),
        # tiny: one lane tile each way, 80 rows
        (80, 64, 128, "bfloat16", "tpu-v5e", 8, (80, 128, 128)),
    ],
)
def test_choose_tile_known_values(rows, contraction, output, dtype, hw, groups, expected):
    assert choose(rows, contraction, output, dtype, hw, groups).as_tuple() == expected


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


# ---------------------------------------------------------------------------------------
# THE TILE RULE, on plans of pallas specs


def pallas_spec(
    *,
    experts: int,
    embed: int,
    ffn: int,
    top_k: int,
    batch: int,
    seq: int,
    axes: dict[str, int],
    hardware: str,
    topology: str,
    compute: str = "bfloat16",
    gate_up: tuple[int, int, int] | None = None,
    down: tuple[int, int, int] | None = None,
) -> str:
    mesh = "\n".join(f"    {name}: {size}" for name, size in axes.items())
    tiles = ""
    if gate_up or down:
        tiles = "  tiles:\n"
        tiles += f"    gate_up: {list(gate_up)}\n" if gate_up else ""
        tiles += f"    down: {list(down)}\n" if down else ""
    return f"""\
version: 1
layer:
  num_experts: {experts}
  embed_dim: {embed}
  ffn_dim: {ffn}
router:
  top_k: {top_k}
shapes:
  batch: {batch}
  seq_len: {seq}
dtypes:
  compute: {compute}
mesh:
  axes:
{mesh}
target:
  hardware: {hardware}
  topology: {topology}
  kernel: pallas
{tiles}"""


# name -> pallas_spec keyword arguments; every one is a valid spec
TILE_RULE_CASES = {
    "mixtral-v5e-2x4-fsdp8": dict(
        experts=8, embed=4096, ffn=14336, top_k=2, batch=8, seq=4096,
        axes={"fsdp": 8}, hardware="tpu-v5e", topology="2x4",
    ),
    "mixtral-v5e-2x4-odd-seq": dict(
        experts=8, embed=4096, ffn=14336, top_k=2, batch=8, seq=4095,
        axes={"data": 2, "fsdp": 4}, hardware="tpu-v5e", topology="2x4",
    ),
    "qwen3-v6e-4x4-top8": dict(
        experts=128, embed=2048, ffn=768, top_k=8, batch=16, seq=1000,
        axes={"data": 4, "fsdp": 4}, hardware="tpu-v6e", topology="4x4",
    ),
    "deepseek-v5p-2x2x2-one-token": dict(
        experts=256, embed=7168, ffn=2048, top_k=8, batch=8, seq=1,
        axes={"data": 8}, hardware="tpu-v5p", topology="2x2x2",
    ),
    "deepseek-tpu7x-2x2x1-float32": dict(
        experts=256, embed=7168, ffn=2048, top_k=8, batch=8, seq=100,
        axes={"fsdp": 8}, hardware="tpu7x", topology="2x2x1", compute="float32",
    ),
    "tiny-v5e-1x1-top1-20rows": dict(
        experts=4, embed=64, ffn=128, top_k=1, batch=1, seq=20,
        axes={"data": 1}, hardware="tpu-v5e", topology="1x1",
    ),
    "tiny-v5e-1x1-top1-float32-one-row": dict(
        experts=4, embed=64, ffn=128, top_k=1, batch=1, seq=1,
        axes={"data": 1}, hardware="tpu-v5e", topology="1x1", compute="float32",
    ),
    "many-rows-v6e-2x2": dict(
        experts=16, embed=1024, ffn=4096, top_k=2, batch=4, seq=50000,
        axes={"data": 4}, hardware="tpu-v6e", topology="2x2",
    ),
    "pinned-both-different-rows": dict(
        experts=8, embed=512, ffn=1792, top_k=2, batch=4, seq=333,
        axes={"data": 4}, hardware="tpu-v5e", topology="2x2",
        gate_up=(256, 512, 512), down=(384, 256, 512),
    ),
    "pinned-both-small-rows": dict(
        experts=8, embed=512, ffn=1792, top_k=3, batch=4, seq=17,
        axes={"data": 2, "fsdp": 2}, hardware="tpu-v5p", topology="2x2x1",
        gate_up=(16, 128, 128), down=(48, 128, 256),
    ),
    "pinned-gate-up-only": dict(
        experts=8, embed=4096, ffn=14336, top_k=2, batch=8, seq=4096,
        axes={"fsdp": 8}, hardware="tpu-v5e", topology="2x4",
        gate_up=(128, 256, 256),
    ),
    "pinned-down-only-float32": dict(
        experts=8, embed=4096, ffn=14336, top_k=2, batch=8, seq=999,
        axes={"data": 8}, hardware="tpu7x", topology="2x2x1", compute="float32",
        down=(40, 512, 512),
    ),
}  # fmt: skip


def tile_rule_plan(name: str) -> tuple[dict, Plan]:
    kwargs = TILE_RULE_CASES[name]
    loaded = load_spec_bytes(pallas_spec(**kwargs).encode(), f"{name}.yaml", "tile_rule")
    assert check_rules(loaded) == [], name
    return kwargs, make_plan(loaded)


@pytest.mark.parametrize("name", list(TILE_RULE_CASES))
def test_the_tile_rule(name: str) -> None:
    kwargs, plan = tile_rule_plan(name)
    devices = math.prod(kwargs["axes"].values())
    assert plan.routed_rows == kwargs["batch"] // devices * kwargs["seq"] * kwargs["top_k"]
    assert plan.gate_up_tile is not None and plan.down_tile is not None
    # The custom VJP reuses each projection's tiling for gmm (forward and input gradient)
    # and tgmm (weight gradient): every row tile used must divide the padded row count.
    row_tiles = [plan.gate_up_tile[0], plan.down_tile[0]]
    for row_tile in row_tiles:
        assert plan.padded_rows % row_tile == 0, (row_tile, plan.padded_rows)
    assert plan.row_alignment == math.lcm(*row_tiles)
    assert plan.padded_rows % plan.row_alignment == 0
    assert plan.padded_rows >= plan.routed_rows
    assert plan.padded_rows - plan.routed_rows < plan.row_alignment
    assert plan.pads_rows == (plan.padded_rows > plan.routed_rows)
    # Pinned tiles are used as pinned; the others are choose_tile's, which always run.
    hw = kwargs["hardware"]
    budget = CATALOGUE[hw].vmem_bytes_for_tiles
    dtype = kwargs.get("compute", "bfloat16")
    embed, ffn = kwargs["embed"], kwargs["ffn"]
    rows, groups = plan.experts.ffn_rows, plan.local_experts
    gate_up_width = 2 * ffn if plan.fuses_gate_up else ffn  # one call computes both
    expected = {
        "gate_up": kwargs.get("gate_up")
        or choose(rows, embed, gate_up_width, dtype, hw, groups).as_tuple(),
        "down": kwargs.get("down") or choose(rows, ffn, embed, dtype, hw, groups).as_tuple(),
    }
    assert (plan.gate_up_tile, plan.down_tile) == (expected["gate_up"], expected["down"])
    for tile in (plan.gate_up_tile, plan.down_tile):
        assert tile_problems(Tile(*tile), dtype, budget) == []


@pytest.mark.parametrize(
    ("name", "routed", "padded", "alignment"),
    [
        ("mixtral-v5e-2x4-fsdp8", 8192, 8192, 512),
        ("mixtral-v5e-2x4-odd-seq", 8190, 8192, 512),
        ("deepseek-v5p-2x2x2-one-token", 8, 16, 16),
        ("deepseek-tpu7x-2x2x1-float32", 800, 1024, 512),
        ("tiny-v5e-1x1-top1-20rows", 20, 32, 32),
        ("tiny-v5e-1x1-top1-float32-one-row", 1, 8, 8),
        ("many-rows-v6e-2x2", 100000, 100352, 512),
        ("pinned-both-different-rows", 666, 768, 768),
        ("pinned-both-small-rows", 51, 96, 48),
        ("pinned-gate-up-only", 8192, 8192, 512),  # lcm(128, 512)
        ("pinned-down-only-float32", 1998, 2560, 2560),  # lcm(512 chosen, 40 pinned)
    ],
)
def test_the_tile_rule_known_values(name: str, routed: int, padded: int, alignment: int):
    _, plan = tile_rule_plan(name)
    assert (plan.routed_rows, plan.padded_rows, plan.row_alignment) == (routed, padded, alignment)
    assert plan.pads_rows == (padded != routed)


def test_xla_plans_do_not_tile_or_pad() -> None:
    kwargs = dict(TILE_RULE_CASES["mixtral-v5e-2x4-odd-seq"])
    text = pallas_spec(**kwargs).replace("kernel: pallas", "kernel: xla")
    plan = make_plan(load_spec_bytes(text.encode(), "xla.yaml", "xla"))
    assert (plan.gate_up_tile, plan.down_tile) == (None, None)
    assert (plan.row_alignment, plan.padded_rows, plan.pads_rows) == (1, plan.routed_rows, False)


def test_dtype_tables_agree() -> None:
    assert set(ROW_MULTIPLE) == set(DTYPE_BYTES) == {"float32", "bfloat16"}
    # a 32-bit vreg holds 8 float32 sublanes, and bfloat16 packs two rows per sublane
    assert ROW_MULTIPLE["bfloat16"] == 2 * ROW_MULTIPLE["float32"] == 16


# ---------------------------------------------------------------------------------------
# libtpu agrees: the VMEM model's tiles compile, forward and backward (no TPU needed)

_COMPILE_PROBE = """
import json, sys
import jax
import jax.numpy as jnp
from jax.experimental import topologies
from jax.experimental.pallas.ops.tpu import megablox
from jax.sharding import SingleDeviceSharding

topology, (m, k, n, groups), tilings = json.loads(sys.argv[1])
device = topologies.get_topology_desc(
    platform="tpu",
    topology_name=topology,
    chip_config_name="default",
    chips_per_host_bounds=(1, 1, 1),
    num_slices=1,
).devices[0]
on_device = SingleDeviceSharding(device)
args = (
    jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=on_device),
    jax.ShapeDtypeStruct((groups, k, n), jnp.bfloat16, sharding=on_device),
    jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=on_device),
)
result = {}
for tiling in tilings:
    def loss(lhs, rhs, group_sizes, tiling=tuple(tiling)):
        out = megablox.gmm(lhs, rhs, group_sizes, jnp.bfloat16, tiling)
        return out.astype(jnp.float32).sum()

    # forward (gmm), input gradient (gmm) and weight gradient (tgmm) in one module
    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    try:
        step.lower(*args).compile()
        result[str(tiling)] = "ok"
    except Exception as error:  # CompileTimeScopedVmemOom and the like
        result[str(tiling)] = f"{type(error).__name__}: {str(error)[:400]}"
print("MOEGEN-COMPILE " + json.dumps(result))
"""


def test_v5e_tiles_compile_forward_and_backward() -> None:
    """Mixtral-like gate/up projection (8192 rows, 4096 -> 14336, 8 experts) on v5e.

    Two tiles at the very edge of v5e's usable 12 MiB: choose_tile's (512, 1024, 1024), whose
    weight-gradient (tgmm) step needs exactly 12 MiB, and (1024, 512, 1024), whose forward
    (gmm) step does (see test_vmem_bytes_by_hand). Both must compile, gradients included, for
    libtpu's compile-only v5e device (about 5 s each).
    """
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install 'moegen[tpu]')")
    m, k, n, groups = 8192, 4096, 14336, 8
    budget = CATALOGUE["tpu-v5e"].vmem_bytes_for_tiles
    assert budget == 16 * MIB
    chosen = choose(m, k, n, "bfloat16", "tpu-v5e", groups)
    assert chosen.as_tuple() == (512, 1024, 1024)
    edge = Tile(1024, 512, 1024)
    for tile in (chosen, edge):
        assert tile_problems(tile, "bfloat16", budget) == []
        assert vmem_bytes(tile, "bfloat16") == usable_vmem(budget) == 12 * MIB
        # both divide the problem: no partial tiles
        assert (m % tile.rows, k % tile.contraction, n % tile.output) == (0, 0, 0)
    assert _compile_verdicts("v5e:1x1", (m, k, n, groups), [chosen, edge]) == ["ok", "ok"]


def test_v6e_wide_ring_tile_compiles_forward_and_backward() -> None:
    """The qwen3 ring's gate and up side by side on v6e (32768 rows, 2048 -> 1536, 16 experts):
    the chosen (512, 1024, 2048), a 2048-lane output tile over a 1536-wide output (masked) and
    22 MiB of the 24 usable, compiles, gradients included."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install 'moegen[tpu]')")
    problem = (32768, 2048, 1536, 16)
    chosen = choose(*problem[:3], "bfloat16", "tpu-v6e", problem[3])
    assert chosen.as_tuple() == (512, 1024, 2048)
    assert vmem_bytes(chosen, "bfloat16") == 22 * MIB
    assert _compile_verdicts("v6e:1x1", problem, [chosen]) == ["ok"]


def _compile_verdicts(topology: str, problem: tuple[int, ...], tiles: list[Tile]) -> list[str]:
    """Compile megablox forward and backward for one compile-only TPU chip, per tile."""
    tilings = [list(tile.as_tuple()) for tile in tiles]
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"  # compile-only TPU devices need no TPU backend
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # share libtpu with a concurrent verify
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_PROBE, json.dumps([topology, list(problem), tilings])],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("MOEGEN-COMPILE ")]
    assert result.returncode == 0 and len(lines) == 1, result.stdout + result.stderr[-4000:]
    compiled = json.loads(lines[0].removeprefix("MOEGEN-COMPILE "))
    return [compiled[str(tiling)] for tiling in tilings]
