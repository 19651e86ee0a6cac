"""THE TILE RULE on whole Pallas plans: every row tile the kernel uses, forward and backward, divides the padded row count, which exceeds the routed rows by less than one alignment step."""

from __future__ import annotations

import math

import pytest
from spec_builder import spec_yaml
from tiling_cases import budgets_of, choose_per_kernel

from moegen.hardware import CATALOGUE
from moegen.kernels.tiling import (
    DTYPE_BYTES,
    ROW_MULTIPLE,
    Tile,
    kernel_limits,
    kernel_vmem,
    tile_problems,
)
from moegen.load import load_spec_bytes
from moegen.plan import Plan, make_plan
from moegen.validate import check_rules


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
    kernel: str = "pallas",
) -> str:
    choices = {
        "experts": experts,
        "embed": embed,
        "ffn": ffn,
        "top_k": top_k,
        "batch": batch,
        "seq_len": seq,
        "compute_dtype": compute,
        "axes": axes,
        "hardware": hardware,
        "topology": topology,
        "kernel": kernel,
    }
    tiles = {"gate_up": gate_up, "down": down}
    if gate_up or down:
        choices["tiles"] = {name: list(tile) for name, tile in tiles.items() if tile}
    return spec_yaml(choices)


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
    pallas = plan.kernel.config
    assert pallas is not None
    # The custom VJP reuses each projection's tiling for gmm (forward and input gradient)
    # and tgmm (weight gradient): every row tile used must divide the padded row count.
    row_tiles = [pallas.gate_up_tile[0], pallas.down_tile[0]]
    for row_tile in row_tiles:
        assert pallas.padded_rows % row_tile == 0, (row_tile, pallas.padded_rows)
    assert pallas.row_alignment == math.lcm(*row_tiles)
    assert pallas.padded_rows % pallas.row_alignment == 0
    assert pallas.padded_rows >= plan.routed_rows
    assert pallas.padded_rows - plan.routed_rows < pallas.row_alignment
    assert pallas.pads_rows == (pallas.padded_rows > plan.routed_rows)
    # Pinned tiles are used as pinned; the others are choose_tile's, which always run.
    hw = kwargs["hardware"]
    budget = CATALOGUE[hw].vmem_bytes_for_tiles
    dtype = kwargs.get("compute", "bfloat16")
    embed, ffn = kwargs["embed"], kwargs["ffn"]
    rows, groups = plan.experts.ffn_rows, plan.local_experts
    gate_up_width = 2 * ffn if plan.ffn.fuses_gate_up else ffn  # one call computes both
    # the weights as the kernels read them: float32 as stored where the module casts blocks
    weights = "float32" if pallas.casts_weights else dtype
    limits = kernel_limits(budgets_of(hw, dtype, weights))
    chosen = {
        "gate_up": choose_per_kernel(rows, embed, gate_up_width, dtype, hw, groups, weights),
        "down": choose_per_kernel(rows, ffn, embed, dtype, hw, groups, weights),
    }
    for name in ("gate_up", "down"):
        forward = getattr(pallas, f"{name}_tile")
        backward = getattr(pallas, f"{name}_backward")
        if kwargs.get(name):  # pinned: all three kernels run with it (but float32 tgmm)
            input_gradient, weight_gradient = backward
            assert forward == kwargs[name] and input_gradient == forward
            assert tile_problems(Tile(*forward), dtype, budget) == []
            if not pallas.casts_weights:
                assert weight_gradient == forward
            assert weight_gradient[0] == forward[0]  # the same rows, narrower lanes at most
            for kernel, own in enumerate((forward, input_gradient, weight_gradient)):
                need = kernel_vmem(Tile(*own), dtype, None, weights)[kernel]
                assert need <= limits[kernel], (name, kernel, own)
            continue
        tile = chosen[name]
        assert tile.backward is not None
        assert (forward, backward) == (tile.as_tuple(), tuple(t.as_tuple() for t in tile.backward))
        # each kernel keeps the row tile and fits VMEM in its own grid step
        for kernel, own in enumerate((tile, *tile.backward)):
            assert own.rows == tile.rows == forward[0]
            need = kernel_vmem(own, dtype, None, weights)[kernel]
            assert need <= limits[kernel], (name, kernel, own)


@pytest.mark.parametrize(
    ("name", "routed", "padded", "alignment"),
    [
        ("mixtral-v5e-2x4-fsdp8", 8192, 8192, 512),
        ("mixtral-v5e-2x4-odd-seq", 8190, 8192, 512),
        ("deepseek-v5p-2x2x2-one-token", 8, 16, 16),
        # 800 rows over 256 experts: 256-row tiles straddle half as many rows (the search)
        ("deepseek-tpu7x-2x2x1-float32", 800, 1024, 256),
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
    assert (plan.routed_rows, plan.kernel.config.padded_rows, plan.kernel.config.row_alignment) == (
        routed,
        padded,
        alignment,
    )
    assert plan.kernel.config.pads_rows == (padded != routed)


def test_xla_plans_do_not_tile_or_pad() -> None:
    kwargs = dict(TILE_RULE_CASES["mixtral-v5e-2x4-odd-seq"])
    text = pallas_spec(**kwargs, kernel="xla")
    plan = make_plan(load_spec_bytes(text.encode(), "xla.yaml", "xla"))
    assert (plan.kernel.config, plan.experts.ffn_rows) == (None, plan.routed_rows)


def test_dtype_tables_agree() -> None:
    assert set(ROW_MULTIPLE) == set(DTYPE_BYTES) == {"float32", "bfloat16"}
    # a 32-bit vreg holds 8 float32 sublanes, and bfloat16 packs two rows per sublane
    assert ROW_MULTIPLE["bfloat16"] == 2 * ROW_MULTIPLE["float32"] == 16
