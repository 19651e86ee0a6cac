"""Stage 2, `moegen.validate`: the kernel a target runs, pinned Pallas tiles, and the VMEM advice."""

from __future__ import annotations

import pytest
from validate_cases import (
    KEY,
    PALLAS_V5E,
    PALLAS_V6E,
    VALUE,
    Cases,
    loaded_spec,
    rule_tests,
)

from moegen.validate import check_rules

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "kernel_runs_on_target": [
        ({}, []),  # cpu, xla
        ({"hardware": "tpu-v5e", "topology": "2x2"}, []),  # ragged_dot runs on TPU too
        ({"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"}, []),
        (
            {
                "hardware": "tpu-v5e",
                "topology": "2x2",
                "kernel": "pallas",
                "tiles": {"gate_up": [512, 1024, 1024]},
            },
            [],
        ),
        (
            {"kernel": "pallas"},
            [
                (
                    "target.kernel",
                    VALUE,
                    "kernel pallas (megablox) runs on TPU targets only, not cpu; use kernel: xla",
                )
            ],
        ),
        (
            {"hardware": "tpu-v5e", "topology": "2x2", "tiles": {"down": [512, 1024, 1024]}},
            [("target.tiles", KEY, "tiles apply to kernel pallas only")],
        ),
        (
            {"tiles": {"gate_up": [512, 1024, 1024]}},  # cpu, xla
            [("target.tiles", KEY, "tiles apply to kernel pallas only")],
        ),
    ],
    "pinned_tiles_run": [
        ({}, []),
        # v5e's scoped VMEM is 16 MiB. [512, 1024, 1024] needs 14.5 in its weight gradient
        # (blocks 2*(0.5 + 0.5 + 1)Mi*2, accumulator 4*1Mi, scratch 2.5 MiB; gmm 12.5).
        # [256, 512, 2048]: m*k = 128 Ki, k*n = 1 Mi, m*n = 512 Ki; scratch 0.5 + 0.09 + 0.125;
        # gmm 2*1664Ki*2 + 4*512Ki = 8.5 MiB + scratch, tgmm 2*1664Ki*2 + 4*1Mi = 10.5 + 0.72
        ({**PALLAS_V5E, "tiles": {"gate_up": [512, 1024, 1024], "down": [256, 512, 2048]}}, []),
        ({**PALLAS_V5E, "tiles": {"gate_up": [16, 128, 128]}}, []),  # the smallest bfloat16 tile
        (
            {**PALLAS_V5E, "tiles": {"gate_up": [8, 128, 128]}, "compute_dtype": "float32"},
            [],
        ),  # float32: 8 rows
        (
            {**PALLAS_V5E, "kernel": "xla", "tiles": {"gate_up": [8, 128, 127]}},
            [],
        ),  # kernel_runs_on_target
        # [512, 1024, 2048] bfloat16: m*k = 0.5 Mi, k*n = 2 Mi, m*n = 1 Mi; gmm 2*3.5*2 + 4 +
        # 2.5 = 20.5 MiB, tgmm 2*3.5*2 + 8 + 2.5 = 24.5 MiB: too much for v5e's 16, fine in
        # v6e's 32
        ({**PALLAS_V6E, "tiles": {"gate_up": [512, 1024, 2048]}}, []),
        (
            {**PALLAS_V5E, "tiles": {"gate_up": [8, 128, 128]}},
            [
                (
                    "target.tiles.gate_up",
                    VALUE,
                    "row tile 8 must be a multiple of 16 for bfloat16; nearest valid: 16",
                )
            ],
        ),
        (
            {**PALLAS_V5E, "tiles": {"down": [500, 1024, 1024]}},
            [
                (
                    "target.tiles.down",
                    VALUE,
                    "row tile 500 must be a multiple of 16 for bfloat16; nearest valid: 496 or 512",
                )
            ],
        ),
        (
            {**PALLAS_V5E, "tiles": {"gate_up": [12, 128, 128]}, "compute_dtype": "float32"},
            [
                (
                    "target.tiles.gate_up",
                    VALUE,
                    "row tile 12 must be a multiple of 8 for float32; nearest valid: 8 or 16",
                )
            ],
        ),
        (
            {**PALLAS_V5E, "tiles": {"gate_up": [512, 100, 1000]}},
            [
                (
                    "target.tiles.gate_up",
                    VALUE,
                    "contraction tile 100 must be a multiple of 128 lanes; nearest valid: 128",
                ),
                (
                    "target.tiles.gate_up",
                    VALUE,
                    "output tile 1000 must be a multiple of 128 lanes; nearest valid: 896 or 1024",
                ),
            ],
        ),
        (
            {**PALLAS_V5E, "tiles": {"gate_up": [512, 2048, 2048]}},
            [
                (
                    "target.tiles.gate_up",
                    VALUE,
                    (
                        "tiles [512, 2048, 2048] need 46.5 MiB of VMEM in the weight-gradient "
                        "tgmm, more than the 16 MiB scoped VMEM; for example [512, 1024, 1024] fits"
                    ),
                )
            ],
        ),
        # float32 doubles the blocks (the accumulator is float32 anyway): the default tile
        # (14.5 MiB in bfloat16) needs 22.5: tgmm 2*2Mi*4 + 4*1Mi + 2.5. Halving the
        # contraction, [512, 512, 1024] needs 14.5 MiB forward (2*1.25Mi*4 + 4*0.5Mi + 0.5 +
        # 1.5 scratch)
        (
            {**PALLAS_V5E, "tiles": {"down": [512, 1024, 1024]}, "compute_dtype": "float32"},
            [
                (
                    "target.tiles.down",
                    VALUE,
                    (
                        "tiles [512, 1024, 1024] need 22.5 MiB of VMEM in the weight-gradient "
                        "tgmm, more than the 16 MiB scoped VMEM; for example [512, 512, 1024] fits"
                    ),
                )
            ],
        ),
        # FFN slices: down writes float32 (the slices are summed), and so does the gradient
        # its two backward kernels read. megablox's default needs 16.5 MiB in the weight
        # gradient then (libtpu: 16.12 MiB, CompileTimeScopedVmemOom): refused where it is
        # pinned; gate/up still write bfloat16 and keep it
        (
            {
                **PALLAS_V5E,
                "tiles": {"gate_up": [512, 1024, 1024], "down": [512, 1024, 1024]},
                "ffn_chunks": 2,
                "ffn": 256,
            },
            [
                (
                    "target.tiles.down",
                    VALUE,
                    (
                        "tiles [512, 1024, 1024] need 16.5 MiB of VMEM in the weight-gradient tgmm "
                        "of a call writing float32, more than the 16 MiB scoped VMEM; for example "
                        "[512, 512, 1024] fits"
                    ),
                )
            ],
        ),
        ({**PALLAS_V5E, "tiles": {"down": [512, 1024, 1024]}}, []),  # whole: bfloat16, 14.5 MiB
        # the overlapped ring sums gate and up over embedding chunks in float32
        (
            {
                **PALLAS_V5E,
                "tiles": {"gate_up": [512, 1024, 1024]},
                "overlap_chunks": 2,
                "axes": {"expert": 4},
                "strategy": "ring_of_experts",
                "embed": 256,
            },
            [
                (
                    "target.tiles.gate_up",
                    VALUE,
                    (
                        "tiles [512, 1024, 1024] need 16.5 MiB of VMEM in the weight-gradient tgmm "
                        "of a call writing float32, more than the 16 MiB scoped VMEM; for example "
                        "[512, 512, 1024] fits"
                    ),
                )
            ],
        ),
        # every problem of both projections, in order
        (
            {**PALLAS_V5E, "tiles": {"gate_up": [24, 4096, 2050], "down": [16, 128, 256]}},
            [
                (
                    "target.tiles.gate_up",
                    VALUE,
                    "row tile 24 must be a multiple of 16 for bfloat16; nearest valid: 16 or 32",
                ),
                (
                    "target.tiles.gate_up",
                    VALUE,
                    "output tile 2050 must be a multiple of 128 lanes; nearest valid: 2048 or 2176",
                ),
                (
                    "target.tiles.gate_up",
                    VALUE,
                    # m*k = 98304, k*n = 8396800, m*n = 49200; tgmm 2*(98304 + 49200)*2 +
                    # 2*8396800*2 + 4*8396800 = 67764416 B, scratch 6*98304 + 864 + 131072
                    # = 721760 B: 65.3 MiB. Aligned down to [16, 4096, 2048] and halved k,
                    # k, n: [16, 1024, 1024], tgmm 8.125 MiB + scratch 0.19
                    (
                        "tiles [24, 4096, 2050] need 65.3 MiB of VMEM in the weight-gradient "
                        "tgmm, more than the 16 MiB scoped VMEM; for example [16, 1024, 1024] fits"
                    ),
                ),
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


def _gate_up(tile: str) -> dict:
    """The choices pinning target.tiles.gate_up to `tile`, written "[m, k, n]" as the
    messages name tiles."""
    return {"tiles": {"gate_up": [int(v) for v in tile.strip("[]").split(", ")]}}


def test_pallas_on_cpu_with_tiles_reports_only_the_kernel() -> None:
    loaded = loaded_spec({"kernel": "pallas", "tiles": {"gate_up": [512, 1024, 1024]}})
    assert [(d.field, d.message) for d in check_rules(loaded)] == [
        (
            "target.kernel",
            "kernel pallas (megablox) runs on TPU targets only, not cpu; use kernel: xla",
        )
    ]


@pytest.mark.parametrize(
    ("tile", "gmm_mib", "tgmm_mib"),
    [
        # tiles whose forward (gmm) step fits v5e's 16 MiB, and whose weight-gradient (tgmm)
        # step does not. [16, 1024, 2048]: m*k = 16 Ki, k*n = 2 Mi, m*n = 32 Ki, scratch 64 Ki
        # + 384 + 128 Ki; gmm 2*(16Ki + 2Mi + 32Ki)*2 + 4*32Ki = 8.3125 MiB, tgmm 2*(16Ki +
        # 32Ki + 2Mi)*2 + 4*2Mi = 16.1875 MiB, each with the scratch beside
        ("[16, 1024, 2048]", 8.3125, 16.1875),
        # [32, 2048, 1024]: m*k = 64 Ki, k*n = 2 Mi, m*n = 32 Ki; gmm 2*(64Ki + 2Mi + 32Ki)*2 +
        # 4*32Ki = 8.5 MiB, tgmm 2*(64Ki + 32Ki + 2Mi)*2 + 4*2Mi = 16.375 MiB
        ("[32, 2048, 1024]", 8.5, 16.375),
    ],
)
def test_pinned_tile_whose_weight_gradient_overflows_vmem_is_refused(
    tile: str, gmm_mib: float, tgmm_mib: float
) -> None:
    from moegen.kernels.tiling import Tile, kernel_vmem, scratch_bytes

    m, k, n = (int(v) for v in tile.strip("[]").split(", "))
    b = 2  # bfloat16
    scratch = scratch_bytes(Tile(m, k, n))
    assert scratch == (4 if k <= 1024 else 6) * m * k + 3 * m * m // 2 + 128 * 2**10
    forward, _, weight_gradient = kernel_vmem(Tile(m, k, n), "bfloat16")
    assert 2 * (m * k + k * n + m * n) * b + 4 * m * n == gmm_mib * 2**20 == forward - scratch
    assert 2 * (m * k + m * n + k * n) * b + 4 * k * n == tgmm_mib * 2**20
    assert weight_gradient == tgmm_mib * 2**20 + scratch > 16 * 2**20 >= forward
    loaded = loaded_spec({**PALLAS_V5E, **_gate_up(tile)})
    [problem] = [d for d in check_rules(loaded) if d.field == "target.tiles.gate_up"]
    assert problem.message.startswith(
        f"tiles {tile} need {weight_gradient / 2**20:.1f} MiB of VMEM in the weight-gradient "
        "tgmm, more than the 16 MiB scoped VMEM; for example "
    )


@pytest.mark.parametrize(
    ("tile", "compute"),
    [
        ("[512, 2048, 2048]", "bfloat16"),
        ("[512, 1024, 1024]", "float32"),
        ("[24, 4096, 2050]", "bfloat16"),
        ("[512, 1024, 1536]", "bfloat16"),  # 16.5 MiB: just over v5e's 16 in the tgmm
        ("[16, 1024, 2048]", "bfloat16"),
        ("[1024, 1024, 1024]", "bfloat16"),
        ("[8, 4096, 4096]", "float32"),
    ],
)
@pytest.mark.parametrize("target", [PALLAS_V5E, PALLAS_V6E], ids=["v5e", "v6e"])
def test_vmem_advice_followed_once_fits(tile: str, compute: str, target: dict) -> None:
    """The tile the VMEM message names passes every tile check when pinned instead."""
    loaded = loaded_spec({**target, **_gate_up(tile), "compute_dtype": compute})
    messages = [d.message for d in check_rules(loaded) if "VMEM" in d.message]
    if target is PALLAS_V6E and not messages:
        return  # fits v6e's 32 MiB
    [message] = messages
    assert message.endswith(" fits")
    suggested = message.rsplit("; for example ", 1)[1].removesuffix(" fits")
    assert (
        check_rules(loaded_spec({**target, **_gate_up(suggested), "compute_dtype": compute})) == []
    )
