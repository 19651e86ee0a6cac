"""`moegen.kernels.tiling` arithmetic: VMEM per grid step of each kernel, the dtypes each call writes, the tile problems and shrink_to_fit behind the VMEM advice, padded rows."""

from __future__ import annotations

import pytest
from tiling_cases import BUDGETS, DTYPES, MIB

from moegen.kernels.tiling import (
    DEFAULT_TILE,
    DTYPE_BYTES,
    KERNELS,
    LANES,
    ROW_MULTIPLE,
    Tile,
    kernel_vmem,
    padded_rows,
    projection_out_dtypes,
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


def steps(m: int, k: int, n: int, c: int, o: int) -> tuple[int, int, int]:
    """The three kernels' grid steps spelled out (c: bytes of rows and weights, o: of the
    result and its gradient): double-buffered blocks, a float32 accumulator, and the scratch
    bound 4*m*k (6*m*k past 512 rows or 1024 contraction lanes) + 1.5*m*m + 128 KiB."""
    scratch = (4 if m <= 512 and k <= 1024 else 6) * m * k + 3 * m * m // 2 + 128 * 2**10
    forward = 2 * (m * k * c + k * n * c + m * n * o) + 4 * m * n  # rows, weights -> [m, n]
    input_gradient = 2 * (m * k * o + n * k * c + m * n * c) + 4 * m * n  # grad, w^T -> [m, n]
    weight_gradient = 2 * (m * k * c + m * n * o + k * n * c) + 4 * k * n  # rows, grad -> [k, n]
    return (forward + scratch, input_gradient + scratch, weight_gradient + scratch)


def test_vmem_bytes_by_hand() -> None:
    # bfloat16 (512, 1024, 1024); m*k = 0.5 Mi, k*n = 1 Mi, m*n = 0.5 Mi elements; scratch
    # 4*0.5 + 1.5*0.25 + 0.125 = 2.5 MiB.
    #   gmm:  blocks 2*(0.5 + 1 + 0.5)*2 B = 8 MiB, acc 0.5*4 B = 2 MiB: 12.5 with scratch
    #   tgmm: blocks 2*(0.5 + 0.5 + 1)*2 B = 8 MiB, acc 1*4 B = 4 MiB: 14.5 with scratch
    assert kernel_vmem(Tile(*DEFAULT_TILE), "bfloat16") == (12.5 * MIB, 12.5 * MIB, 14.5 * MIB)
    assert vmem_bytes(Tile(*DEFAULT_TILE), "bfloat16") == 14.5 * MIB
    # writing float32 (the FFN slices' down projection): the result block doubles forward, the
    # gradient's block doubles in both backward kernels. tgmm 2*(0.5*2 + 0.5*4 + 1*2) + 4 +
    # 2.5 = 16.5 MiB: over v5e's 16 (libtpu measures 16.12 and refuses it: the Mixtral
    # fsdp 2 x expert 4 layer in 2 slices, issue 17)
    assert kernel_vmem(Tile(*DEFAULT_TILE), "bfloat16", "float32") == (
        14.5 * MIB,
        14.5 * MIB,
        16.5 * MIB,
    )
    # float32 throughout: gmm 2*(2 + 4 + 2) + 2 + 2.5 = 20.5, tgmm 2*(2 + 2 + 4) + 4 + 2.5
    assert vmem_bytes(Tile(*DEFAULT_TILE), "float32") == 22.5 * MIB
    # (1024, 512, 1024) bfloat16: m*k = k*n = 0.5 Mi, m*n = 1 Mi elements; scratch 6*0.5 +
    # 1.5 + 0.125 = 4.625 MiB. gmm 2*(1 + 1 + 2) + 4 = 12 -> 16.625: the forward step decides
    # (tgmm 2*(1 + 2 + 1) + 2 = 10 -> 14.625)
    assert kernel_vmem(Tile(1024, 512, 1024), "bfloat16")[0] == 16.625 * MIB
    assert vmem_bytes(Tile(1024, 512, 1024), "bfloat16") == 16.625 * MIB
    # (16, 128, 128) bfloat16: m*k = m*n = 2048, k*n = 16384; scratch 8192 + 384 + 131072.
    # gmm 2*(4096 + 32768 + 4096) + 8192 = 90112, tgmm 2*(4096 + 4096 + 32768) + 65536
    assert vmem_bytes(Tile(16, 128, 128), "bfloat16") == 147456 + 139648
    # the input gradient reads the result's gradient, writes row gradients in the rows' dtype
    m, k, n = 512, 1024, 128
    assert kernel_vmem(Tile(m, k, n), "bfloat16", "float32")[1] == (
        2 * (m * k * 4 + n * k * 2 + m * n * 2) + 4 * m * n + 4 * m * k + 3 * m * m // 2 + 131072
    )


@pytest.mark.parametrize(
    "tile",
    [(512, 1024, 1024), (16, 128, 128), (128, 1024, 1024), (1024, 512, 1024), (24, 4096, 2050)],
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", [None, "float32"])
def test_kernel_vmem_matches_the_spelled_out_steps(tile, dtype: str, out_dtype) -> None:
    c = DTYPE_BYTES[dtype]
    o = DTYPE_BYTES[out_dtype or dtype]
    assert kernel_vmem(Tile(*tile), dtype, out_dtype) == steps(*tile, c, o)
    assert vmem_bytes(Tile(*tile), dtype, out_dtype) == max(steps(*tile, c, o))


def test_the_whole_scoped_vmem_is_usable() -> None:
    """kernel_vmem bounds what the compiler allocates from above (test_tiling_libtpu), so the
    tiles may use the generation's whole scoped VMEM: no headroom on top."""
    assert usable_vmem(16 * MIB) == 16 * MIB  # v5e, v5p
    assert usable_vmem(32 * MIB) == 32 * MIB  # v6e, tpu7x
    assert usable_vmem(0) == 0
    assert KERNELS == ("forward gmm", "input-gradient gmm", "weight-gradient tgmm")


@pytest.mark.parametrize(
    ("overlap", "slices", "expected"),
    [
        (1, 1, ("bfloat16", "bfloat16")),
        (1, 4, ("bfloat16", "float32")),  # FFN slices: down's results are summed
        (4, 1, ("float32", "bfloat16")),  # overlapped ring: gate/up summed over chunks
    ],
)
def test_projection_out_dtypes(overlap: int, slices: int, expected) -> None:
    assert projection_out_dtypes("bfloat16", overlap, slices) == expected
    assert projection_out_dtypes("float32", overlap, slices) == ("float32", "float32")


def test_tile_as_tuple() -> None:
    assert Tile(16, 128, 256).as_tuple() == (16, 128, 256)


def _over(tile: list[int], need: float, kernel: str, budget: int, example: list[int]) -> str:
    return (
        f"tiles {tile} need {need:.1f} MiB of VMEM in the {kernel}, more than the {budget} MiB "
        f"scoped VMEM; for example {example} fits"
    )


@pytest.mark.parametrize(
    ("tile", "dtype", "budget", "out_dtype", "problems"),
    [
        (Tile(512, 1024, 1024), "bfloat16", 16 * MIB, None, []),  # 14.5 MiB of v5e's 16
        (Tile(8, 128, 128), "float32", 16 * MIB, None, []),
        (
            Tile(8, 128, 128),
            "bfloat16",
            16 * MIB,
            None,
            ["row tile 8 must be a multiple of 16 for bfloat16; nearest valid: 16"],
        ),
        (
            Tile(100, 128, 128),
            "float32",
            16 * MIB,
            None,
            ["row tile 100 must be a multiple of 8 for float32; nearest valid: 96 or 104"],
        ),
        (
            Tile(16, 64, 129),
            "bfloat16",
            16 * MIB,
            None,
            [
                "contraction tile 64 must be a multiple of 128 lanes; nearest valid: 128",
                "output tile 129 must be a multiple of 128 lanes; nearest valid: 128 or 256",
            ],
        ),
        # float32: 22.5 MiB (tgmm) > 16. Halving the contraction (1024 >= 1024) gives (512, 512,
        # 1024): gmm 2*(1 + 2 + 2) + 2 + 2 + 0.375 + 0.125 = 14.5, tgmm 2*(1 + 2 + 2) + 2 +
        # 2.5 - 1 = 13.5: fits
        (
            Tile(512, 1024, 1024),
            "float32",
            16 * MIB,
            None,
            [_over([512, 1024, 1024], 22.5, "weight-gradient tgmm", 16, [512, 512, 1024])],
        ),
        (Tile(512, 1024, 1024), "float32", 32 * MIB, None, []),  # 22.5 MiB of v6e's 32
        # the down projection of FFN slices writes float32: megablox's default no longer fits
        (
            Tile(512, 1024, 1024),
            "bfloat16",
            16 * MIB,
            "float32",
            [
                "tiles [512, 1024, 1024] need 16.5 MiB of VMEM in the weight-gradient tgmm of a "
                "call writing float32, more than the 16 MiB scoped VMEM; for example [512, 512, "
                "1024] fits"
            ],
        ),
        # exactly the budget fits, a byte less does not (the message rounds 14.49 MiB to 14)
        (Tile(512, 1024, 1024), "bfloat16", 15204352, None, []),
        (
            Tile(512, 1024, 1024),
            "bfloat16",
            15204351,
            None,
            [_over([512, 1024, 1024], 14.5, "weight-gradient tgmm", 14, [512, 512, 1024])],
        ),
        # the weight gradient decides: gmm 6.1 MiB fits 8, tgmm 9.6 does not
        (
            Tile(128, 1024, 1024),
            "bfloat16",
            8 * MIB,
            None,
            [_over([128, 1024, 1024], 9.6, "weight-gradient tgmm", 8, [128, 512, 1024])],
        ),
        # the forward step decides: 1024 rows (16.6 MiB) over v5e's 16
        (
            Tile(1024, 512, 1024),
            "bfloat16",
            16 * MIB,
            None,
            [_over([1024, 512, 1024], 16.6, "forward gmm", 16, [1024, 512, 512])],
        ),
        # misaligned and too large: the example is aligned
        (
            Tile(512, 2100, 1024),
            "bfloat16",
            16 * MIB,
            None,
            [
                "contraction tile 2100 must be a multiple of 128 lanes; nearest valid: 2048 or "
                "2176",
                _over([512, 2100, 1024], 29.2, "weight-gradient tgmm", 16, [512, 1024, 1024]),
            ],
        ),
    ],
)
def test_tile_problems(tile: Tile, dtype: str, budget: int, out_dtype, problems) -> None:
    assert tile_problems(tile, dtype, budget, out_dtype) == problems


@pytest.mark.parametrize(
    ("tile", "dtype", "budget", "expected"),
    [
        # already fits: unchanged
        ((512, 1024, 1024), "bfloat16", 16 * MIB, (512, 1024, 1024)),
        # (512, 2048, 2048) bfloat16: 46.5 MiB -> k (2048 >= 2048) -> (512, 1024, 2048): tgmm
        # 2*(1 + 2 + 4) + 8 + 2.5 = 24.5 -> n -> (512, 1024, 1024): 14.5 fits
        ((512, 2048, 2048), "bfloat16", 16 * MIB, (512, 1024, 1024)),
        # an odd number of lanes halves to a multiple of 128: 1152 -> 512 (576 rounded down).
        # (512, 1024, 1152) bfloat16 under 15 MiB: tgmm 2*(1 + 1.125 + 2.25) + 4.5 + 2.5 =
        # 15.75 > 15; (512, 1024, 512): tgmm 2*(1 + 0.5 + 1) + 2 + 2.5 = 9.5 fits
        ((512, 1024, 1152), "bfloat16", 15 * MIB, (512, 1024, 512)),
        # (512, 640, 128) bfloat16 under 2 MiB: the scratch alone of 512 rows is 0.5 MiB beside
        # the [512, k] block's float32 copy. (512, 256, 128): gmm 2*(0.25 + 0.0625 + 0.125) +
        # 0.25 + 0.5 + 0.5 = 2.125 > 2; (512, 128, 128): 2*(0.125 + 0.03 + 0.125) + 0.25 +
        # 0.25 + 0.5 = 1.5625 fits
        ((512, 640, 128), "bfloat16", 2 * MIB, (512, 128, 128)),
        # misaligned: rounded down to alignment first, (24, 4096, 2050) -> (16, 4096, 2048);
        # then k 4096 -> 2048 -> 1024, n 2048 -> 1024: tgmm 2*(16*1024*2 + 16*1024*2 +
        # 1024*1024*2) + 4 MiB + scratch 64 Ki + 384 + 128 Ki = 8.31 MiB fits
        ((24, 4096, 2050), "bfloat16", 16 * MIB, (16, 1024, 1024)),
        # lanes at 128, then the rows halve: (512, 128, 128) float32 under 1 MiB: scratch 0.25
        # + 0.375 + 0.125 already 0.75; (256, 128, 128): gmm 2*(128 + 64 + 128) Ki + 128 Ki +
        # scratch (128 + 96 + 128) Ki = 1120 Ki > 1 MiB; (128, 128, 128): 2*(64 + 64 + 64) +
        # 64 + (64 + 24 + 128) = 664 Ki fits
        ((512, 128, 128), "float32", 1 * MIB, (128, 128, 128)),
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
