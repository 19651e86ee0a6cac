"""`moegen.tiling` arithmetic: VMEM per grid step, the tile problems and shrink_to_fit behind the VMEM advice, padded rows."""

from __future__ import annotations

import pytest
from tiling_cases import BUDGETS, DTYPES, MIB

from moegen.tiling import (
    DEFAULT_TILE,
    DTYPE_BYTES,
    LANES,
    ROW_MULTIPLE,
    VMEM_HEADROOM,
    Tile,
    padded_rows,
    round_up,
    shrink_to_fit,
    tile_problems,
    usable_vmem,
    vmem_bytes,
)


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
