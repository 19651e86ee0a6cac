"""Stage 3, `moegen.plan` on TPU targets: target fields, Pallas tiles, the memory ledger, and the widest layers the rules allow."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from plan_cases import BYTES, REPO_ROOT, SHAPES, TPU_EXAMPLE, TPU_TARGETS, tpu_spec
from spec_builder import spec_yaml
from tiling_cases import choose_per_kernel

from moegen.hardware import CATALOGUE
from moegen.kernels.tiling import (
    LANES,
    ROW_MULTIPLE,
    Tile,
    kernel_vmem,
    lane_tiles,
    usable_vmem,
    vmem_bytes,
    widest_lane_tile,
)
from moegen.load import LoadedSpec, load_spec_bytes
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.plan.memory import HELD_WEIGHT_GRADIENTS
from moegen.render import render
from moegen.validate import validate


@pytest.mark.parametrize("target", list(TPU_TARGETS))
def test_tpu_target_fields(target: str) -> None:
    from moegen.hardware import hardware

    name, topology, axes, libtpu_name, host_bounds = TPU_TARGETS[target]
    plan = make_plan(tpu_spec(name, topology, axes))
    assert (plan.hardware, plan.mesh.topology, plan.kernel.name) == (name, topology, "pallas")
    assert plan.mesh.tpu_topology_name == libtpu_name
    assert plan.mesh.chips_per_host_bounds == host_bounds
    assert plan.mesh.num_devices == hardware(name).devices(topology)
    assert plan.memory.hbm_bytes_per_device == hardware(name).hbm_bytes_per_device > 0
    assert plan.summary.endswith(f", kernel pallas, target {name} {topology}.")
    # pallas: tiles chosen, shard_map's varying-axes check off, compiled (not interpreted)
    assert plan.kernel.config.gate_up_tile is not None and plan.kernel.config.down_tile is not None
    assert plan.kernel.check_vma is False
    assert plan.kernel.config.interpret is False
    assert make_plan(tpu_spec(name, topology, axes), interpret=True).kernel.config.interpret is True


@pytest.mark.parametrize("target", list(TPU_TARGETS))
def test_xla_kernel_on_tpu(target: str) -> None:
    name, topology, axes, libtpu_name, host_bounds = TPU_TARGETS[target]
    plan = make_plan(tpu_spec(name, topology, axes, kernel="xla"), interpret=True)
    assert (plan.mesh.tpu_topology_name, plan.mesh.chips_per_host_bounds) == (
        libtpu_name,
        host_bounds,
    )
    # no tiles, no padding, nothing to interpret: ragged_dot is XLA's own
    assert (plan.kernel.name, plan.kernel.config) == ("xla", None)
    assert plan.kernel.check_vma is True
    assert plan.experts.ffn_rows == plan.routed_rows


def test_pallas_tiles_chosen_for_the_v5e_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    plan = make_plan(load_valid(Path(TPU_EXAMPLE)))
    # megablox's default fits v5e exactly: its tgmm (weight-gradient) step needs
    # 2*(0.5 + 0.5) Mi*2 B + 2*1 Mi*2 B + 4*1 Mi = 12 MiB = 0.75 * 16 MiB (gmm step 10 MiB)
    pallas = plan.kernel.config
    assert (pallas.gate_up_tile, pallas.down_tile) == ((512, 1024, 1024), (512, 1024, 1024))
    assert (plan.routed_rows, pallas.padded_rows, pallas.row_alignment) == (8192, 8192, 512)
    assert pallas.pads_rows is False
    assert plan.mesh.tpu_topology_name == "v5e:2x4"
    assert plan.mesh.chips_per_host_bounds == (2, 4, 1)


def test_pinned_tiles_are_used_and_rows_padded() -> None:
    tiles = {"gate_up": [256, 512, 512], "down": [384, 256, 512]}
    shape = dataclasses.replace(SHAPES["qwen3-30b-a3b"], batch=8, seq=1000)
    plan = make_plan(tpu_spec("tpu-v5e", "2x4", {"fsdp": 8}, shape=shape, tiles=tiles))
    pallas = plan.kernel.config
    assert (pallas.gate_up_tile, pallas.down_tile) == ((256, 512, 512), (384, 256, 512))
    # 1000 tokens x top-8 = 8000 rows, padded to a multiple of lcm(256, 384) = 768
    assert (plan.routed_rows, pallas.row_alignment, pallas.padded_rows) == (8000, 768, 8448)
    assert pallas.pads_rows is True
    # the memory estimate counts the padded buffer, the cost estimate only real rows
    D, F, cb = shape.embed, shape.ffn, BYTES[shape.compute]
    ledger = dict(plan.memory.ledger)
    # fsdp: the peak is at the weight gradients, beside the (padded) activations
    assert "gathered expert weights and one weight's gradient, at the weight gradients" in ledger
    assert ledger["FFN activations and gradients at the backward peak (3 x [rows, 768])"] == (
        3 * 8448 * F * cb
    )
    assert plan.cost.routed_buffer_bytes == 8000 * (2 * D + 3 * F) * cb


def _memory_cases() -> list[LoadedSpec]:
    return [
        tpu_spec(name, topology, axes, shape=shape)
        for name, topology, axes, *_ in TPU_TARGETS.values()
        for shape in SHAPES.values()
    ]


def test_memory_ledger_sorted_and_summed() -> None:
    for loaded_spec in _memory_cases():
        plan = make_plan(loaded_spec)
        m = plan.memory
        sizes = [size for _, size in m.ledger]
        assert sizes == sorted(sizes, reverse=True), m.ledger
        assert sum(sizes) == m.train_peak
        # whole: 4 fixed items, the peak's buffers (1 at the row gradient, 2 at the weight
        # gradients), the activations and the packing; sliced: 11; on a target whose
        # compiler holds more float32 weight gradients (tpu7x), one item more
        held = int(plan.hardware in HELD_WEIGHT_GRADIENTS)
        expected = {7 + held, 8 + held} if plan.ffn.chunks == 1 else {11 + held}
        assert len({name for name, _ in m.ledger}) == len(m.ledger)
        assert len(m.ledger) in expected
        assert all(size > 0 for size in sizes)
        assert 0 < m.forward_peak < m.train_peak


def test_memory_known_numbers_v5e_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixtral 8x7B, 8192 rows per device on fsdp=8, by hand: the backward peak is at the
    weight gradients (the gathered weights outweigh seven [rows, D] buffers)."""
    monkeypatch.chdir(REPO_ROOT)
    plan = make_plan(load_valid(Path(TPU_EXAMPLE)))
    m = plan.memory
    assert plan.ffn.chunks == 1  # 5.4 GiB fits the 16 GiB of a v5e: nothing to recompute
    params = (4096 * 8 + 3 * 8 * 4096 * 14336) // 8 * 4  # float32 shards
    gathered = 4096 * 8 * 4 + 3 * 8 * 4096 * 14336 * 2  # bfloat16 experts, float32 router
    row_block = 8192 * 4096 * 2  # [rows, D] bfloat16
    activation = 8192 * 14336 * 2  # [rows, F] bfloat16
    x = 4096 * 4096 * 2
    router = 4096 * 8 * 4 * 3
    assert 7 * row_block < gathered
    assert dict(m.ledger) == {
        "parameters (stored shards)": params,
        "parameter gradients (stored shards)": params,
        "gathered expert weights and one weight's gradient, at the weight gradients": gathered,
        "one weight's float32 gradient shard, before it is copied out": params // 3,
        "FFN activations and gradients at the backward peak (3 x [rows, 14336])": 3 * activation,
        "XLA's packing of the temporaries (+15%)": int(
            0.15 * (gathered + params // 3 + 3 * activation)
        ),
        "layer input and its gradient": 2 * x,
        "router logits, scores and their gradients": router,
    }
    assert m.train_peak == 5_798_788_846
    # forward: an activation is wider than [rows, D], so XLA stacks them: gate and up (the
    # hidden written over gate) on two [rows, D] and two gathered weights' slots, no packing
    temporaries = 2 * activation + 2 * row_block + 2 * (gathered // 3)
    assert m.forward_peak == params + 2 * x + router // 3 + temporaries


def test_memory_ledger_of_ffn_slices_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory reference (Mixtral 8x7B, fsdp 2 x expert 4, ragged all-to-all) in 8 FFN
    slices: the ledger the compiled peak (3.476e9 bytes, libtpu 0.0.51) is checked against."""
    monkeypatch.chdir(REPO_ROOT)
    plan = make_plan(load_valid(Path("specs/mixtral_8x7b_ep_a2a_v5e.yaml")))
    assert (plan.ffn.chunks, plan.ffn.chunk_width, plan.ffn.regathers_weights) == (8, 1792, True)
    assert plan.ffn.sliced_params == ("w_gate", "w_up", "w_down")
    rows, D, F = 32768, 4096, 14336  # the certified receive buffer
    params = 2048 * 8 * 4 + 3 * 2 * 2048 * 14336 * 4  # router over fsdp, experts over both
    experts_bf16 = 3 * 2 * 4096 * 14336 * 2  # 2 local experts, whole embed, bfloat16
    assert dict(plan.memory.ledger) == {
        "parameters (stored shards)": params,
        "parameter gradients (stored shards)": params,
        "stored expert weights cast to the compute dtype once": experts_bf16 // 2,
        "one FFN slice's weights, gathered": (4096 * 8 * 4 + experts_bf16) // 8,
        "routed rows, kept for the backward pass": rows * D * 2,
        "gradient of the routed experts' output": rows * D * 2,
        "row gradient, summed over the slices in float32": rows * D * 4,
        "the slice's row gradients": rows * D * 2,  # one: gate and up are one call
        "FFN activations and gradients at the backward peak (4 x [rows, 1792])": (
            4 * rows * (F // 8) * 2
        ),
        "layer input and its gradient": 2 * 4096 * 4096 * 2,
        "router logits, scores and their gradients": 4096 * 8 * 4 * 3,
    }
    compiled_peak = 3_475_997_184  # memory_analysis(), forward+backward, libtpu 0.0.51
    assert abs(plan.memory.train_peak / compiled_peak - 1) < 0.10
    # gate and up run again in the backward pass: 2 x 2 x rows x D x F more FLOPs
    assert plan.cost.recompute_flops == 2 * 2 * rows * D * F
    by_count = {o.chunks: o for o in plan.ffn.chunk_options}
    assert sorted(by_count) == [1, 2, 4, 8, 16]
    assert by_count[1].recompute_flops == 0
    peaks = [by_count[c].train_peak for c in sorted(by_count)]
    assert peaks == sorted(peaks, reverse=True)  # more slices, less memory, here


def test_gate_and_up_side_by_side_are_tiled_as_one_call_of_twice_the_width() -> None:
    """The qwen3 ring on v6e with bfloat16 params fuses gate and up: its gate/up tile is
    chosen for the [2048 -> 1536] call, so the output tile may span both halves (one read of
    the rows forward). (With its float32 params the weights are read as stored, apart.)"""
    path = REPO_ROOT / "specs" / "qwen3_30b_a3b_ring_v6e.yaml"
    text = path.read_bytes().replace(b"params: float32", b"params: bfloat16")
    assert text != path.read_bytes()
    plan = make_plan(validate(load_spec_bytes(text, str(path), path.stem)))
    assert plan.ffn.fuses_gate_up
    expected = choose_per_kernel(
        plan.experts.ffn_rows, 2048, 2 * 768, "bfloat16", "tpu-v6e", plan.local_experts
    )
    assert plan.kernel.config.gate_up_tile == expected.as_tuple() == (512, 2048, 1536)
    assert plan.kernel.config.gate_up_tile[2] > plan.ffn_dim  # wider than gate or up alone


# ---------------------------------------------------------------------------------------
# The widest layers the rules allow (one token on one v5e chip, widths up to 2**31) plan at
# once: the tile search tries only lane tiles that can fit VMEM, and its tiles run.


def _one_chip_pallas(embed: int, ffn: int, compute: str = "bfloat16") -> str:
    return spec_yaml(
        {
            "experts": 1,
            "embed": embed,
            "ffn": ffn,
            "top_k": 1,
            "batch": 1,
            "seq_len": 1,
            "params_dtype": "float32",
            "compute_dtype": compute,
            "axes": {"data": 1},
            "hardware": "tpu-v5e",
            "topology": "1x1",
            "kernel": "pallas",
        }
    )


@pytest.mark.parametrize(
    ("embed", "ffn", "compute"),
    [
        (128, 2**31 - 128, "bfloat16"),  # whole lanes: 2**24 lane tiles divide it
        (128, 2**31 - 1, "float32"),  # ragged: 2**24 tile counts
        (2**31 - 128, 384, "bfloat16"),
        (1408, 367567104, "bfloat16"),  # whole lanes with many divisors
    ],
)
def test_widest_layers_plan_runnable_tiles(embed: int, ffn: int, compute: str) -> None:
    text = _one_chip_pallas(embed, ffn, compute)
    plan = make_plan(validate(load_spec_bytes(text.encode(), "wide.yaml", "wide")))
    budget = CATALOGUE["tpu-v5e"].vmem_bytes_for_tiles
    config = plan.kernel.config
    for forward, backward in (
        (config.gate_up_tile, config.gate_up_backward),
        (config.down_tile, config.down_backward),
    ):
        # each kernel's own tile: whole lanes, and its own grid step within VMEM
        for kernel, tile in enumerate((forward, *backward)):
            assert tile[1] % LANES == 0 and tile[2] % LANES == 0, tile
            assert kernel_vmem(Tile(*tile), compute)[kernel] <= budget, (kernel, tile)
    assert plan.ffn.chunks == 1  # too large for HBM in any number of slices: whole
    assert len(render(plan)) > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("out_dtype", [None, "float32"])
@pytest.mark.parametrize("budget", [2**20, 16 * 2**20, 32 * 2**20])
def test_widest_lane_tile_is_the_widest_that_fits(dtype: str, out_dtype, budget: int) -> None:
    usable = usable_vmem(budget)
    widest = widest_lane_tile(dtype, usable, out_dtype)
    rows = ROW_MULTIPLE[dtype]

    def least(width: int) -> int:
        return min(
            vmem_bytes(Tile(rows, width, LANES), dtype, out_dtype),
            vmem_bytes(Tile(rows, LANES, width), dtype, out_dtype),
        )

    assert widest % LANES == 0 and least(widest) <= usable < least(widest + LANES)
    # lane tiles past it are never tried, and those below are as before
    assert lane_tiles(2880, widest) == [t for t in lane_tiles(2880) if t <= widest]
    assert lane_tiles(2**20 * 128, widest) == [
        t for t in range(LANES, widest + 1, LANES) if 2**27 % t == 0
    ]
