"""Stage 3, `moegen.plan`: per-device shapes, partitions, FLOPs and bytes of realistic
MoE layers on several meshes, checked against the formulas, plus `moegen plan` itself."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from moegen.hardware import CATALOGUE
from moegen.load import LoadedSpec, load_spec_bytes
from moegen.pipeline import load_valid
from moegen.plan import Plan, format_plan, make_plan
from moegen.render import render
from moegen.tiling import (
    LANES,
    ROW_MULTIPLE,
    Tile,
    choose_tile,
    lane_tiles,
    tile_problems,
    usable_vmem,
    vmem_bytes,
    widest_lane_tile,
)
from moegen.validate import validate

REPO_ROOT = Path(__file__).resolve().parent.parent
BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class Shape:
    experts: int
    embed: int
    ffn: int
    top_k: int
    batch: int
    seq: int
    params: str
    compute: str
    score: str = "softmax"
    renormalize: bool = True


SHAPES = {
    "mixtral-8x7b": Shape(8, 4096, 14336, 2, 16, 4096, "float32", "bfloat16"),
    "qwen3-30b-a3b": Shape(128, 2048, 768, 8, 16, 4096, "bfloat16", "bfloat16"),
    "deepseek-v3-routed": Shape(256, 7168, 2048, 8, 16, 4096, "float32", "bfloat16", "sigmoid"),
    "tiny-top1": Shape(4, 64, 128, 1, 16, 128, "float32", "float32", "sigmoid", False),
}

# name -> (mesh axes in order, explicit batch_axes or None for the default)
MESHES = {
    "data8": ({"data": 8}, None),
    "fsdp8": ({"fsdp": 8}, None),
    "data2xfsdp4": ({"data": 2, "fsdp": 4}, None),
    "fsdp4xdata2-batch-fsdp-data": ({"fsdp": 4, "data": 2}, ["fsdp", "data"]),
}


def spec_text(shape: Shape, axes: dict[str, int], batch_axes: list[str] | None) -> str:
    mesh = "\n".join(f"    {name}: {size}" for name, size in axes.items())
    listed = f"  batch_axes: [{', '.join(batch_axes)}]\n" if batch_axes is not None else ""
    return f"""\
version: 1
description: plan test
layer:
  num_experts: {shape.experts}
  embed_dim: {shape.embed}
  ffn_dim: {shape.ffn}
router:
  top_k: {shape.top_k}
  score: {shape.score}
  renormalize: {"true" if shape.renormalize else "false"}
shapes:
  batch: {shape.batch}
  seq_len: {shape.seq}
dtypes:
  params: {shape.params}
  compute: {shape.compute}
mesh:
  axes:
{mesh}
{listed}"""


def loaded(shape: Shape, axes: dict[str, int], batch_axes: list[str] | None) -> LoadedSpec:
    raw = spec_text(shape, axes, batch_axes).encode()
    return validate(load_spec_bytes(raw, "specs/plan_case.yaml", "plan_case"))


CASES = [
    pytest.param((shape_name, mesh_name), id=f"{shape_name}-{mesh_name}")
    for shape_name in SHAPES
    for mesh_name in MESHES
]


@pytest.fixture(params=CASES)
def case(request) -> tuple[Shape, dict[str, int], list[str] | None, Plan]:
    shape_name, mesh_name = request.param
    shape = SHAPES[shape_name]
    axes, batch_axes = MESHES[mesh_name]
    return shape, axes, batch_axes, make_plan(loaded(shape, axes, batch_axes))


def test_global_and_per_device_sizes(case) -> None:
    s, axes, batch_axes, plan = case
    devices = math.prod(axes.values())
    assert plan.mesh_axes == tuple(axes.items())
    assert plan.num_devices == devices
    assert plan.batch_axes == tuple(batch_axes or axes)
    assert plan.input_partition == (tuple(batch_axes or axes), None, None)
    assert plan.fsdp_axis == ("fsdp" if "fsdp" in axes else None)
    assert plan.expert_axis is None
    assert plan.expert_strategy == "replicated"
    assert (plan.batch, plan.seq_len, plan.embed_dim, plan.ffn_dim) == (
        s.batch,
        s.seq,
        s.embed,
        s.ffn,
    )
    assert (plan.num_experts, plan.local_experts, plan.top_k) == (s.experts, s.experts, s.top_k)
    # Every batch axis shards the batch (all of them here), so each device gets 1/devices.
    assert plan.batch_shards == devices
    assert plan.local_batch == s.batch // devices
    assert plan.local_tokens == s.batch // devices * s.seq
    assert plan.routed_rows == s.batch // devices * s.seq * s.top_k
    assert plan.local_tokens * plan.batch_shards == s.batch * s.seq
    assert plan.routed_rows * plan.batch_shards == s.batch * s.seq * s.top_k
    # ragged_dot (kernel xla) takes groups of any size: nothing is padded.
    assert plan.row_alignment == 1
    assert plan.padded_rows == plan.routed_rows
    assert (plan.score, plan.renormalize, plan.activation) == (s.score, s.renormalize, "swiglu")
    assert (plan.param_dtype, plan.compute_dtype, plan.router_dtype) == (
        s.params,
        s.compute,
        "float32",
    )
    assert (plan.hardware, plan.kernel) == ("cpu", "xla")
    assert plan.module_name == "plan_case"
    assert plan.spec_display == "specs/plan_case.yaml"
    assert len(plan.spec_sha256) == 64
    assert plan.description == "plan test"


def test_param_shapes_and_partitions(case) -> None:
    s, axes, _, plan = case
    fsdp = axes.get("fsdp", 1)
    f = "fsdp" if "fsdp" in axes else None
    E, D, F = s.experts, s.embed, s.ffn
    expected = {
        # name: (shape, local shape, partition, gathered dim, use dtype, fan_in)
        "router": ((D, E), (D // fsdp, E), (f, None), 0, "float32", D),
        "w_gate": ((E, D, F), (E, D // fsdp, F), (None, f, None), 1, s.compute, D),
        "w_up": ((E, D, F), (E, D // fsdp, F), (None, f, None), 1, s.compute, D),
        "w_down": ((E, F, D), (E, F, D // fsdp), (None, None, f), 2, s.compute, F),
    }
    assert [p.name for p in plan.params] == list(expected)
    for p in plan.params:
        shape, local, partition, gather_axis, use_dtype, fan_in = expected[p.name]
        assert p.shape == shape, p.name
        assert p.local_shape == local, p.name
        assert p.partition == partition, p.name
        assert p.gather_axis == (gather_axis if f else None), p.name
        assert p.use_dtype == use_dtype, p.name
        assert p.init_scale == pytest.approx(1 / math.sqrt(fan_in)), p.name
        assert len(p.shape_names) == len(p.shape)
        assert p.doc == "[" + ", ".join(p.shape_names) + "]"
    names = {p.name: p.shape_names for p in plan.params}
    assert names["router"] == ("EMBED_DIM", "NUM_EXPERTS")
    assert names["w_down"] == ("NUM_EXPERTS", "FFN_DIM", "EMBED_DIM")
    # The local shards tile the global parameter exactly.
    for p in plan.params:
        assert math.prod(p.local_shape) * fsdp == math.prod(p.shape)


def test_flops_against_formulas(case) -> None:
    s, axes, _, plan = case
    t = s.batch // math.prod(axes.values()) * s.seq  # tokens per device
    c = plan.cost
    assert c.router_flops == 2 * t * s.embed * s.experts
    assert c.expert_flops == 6 * t * s.top_k * s.embed * s.ffn
    assert c.forward_flops == c.router_flops + c.expert_flops
    assert c.train_flops == 3 * c.forward_flops
    # Router FLOPs are negligible next to the experts' for every realistic shape.
    assert c.router_flops < c.expert_flops


def test_bytes_against_formulas(case) -> None:
    s, axes, _, plan = case
    fsdp = axes.get("fsdp", 1)
    t = s.batch // math.prod(axes.values()) * s.seq
    rows = t * s.top_k
    E, D, F = s.experts, s.embed, s.ffn
    pb, cb = BYTES[s.params], BYTES[s.compute]
    c = plan.cost
    assert c.param_bytes == (D * E + 3 * E * D * F) // fsdp * pb
    gathered = D * E * 4 + 3 * E * D * F * cb  # router always float32
    assert c.gathered_weight_bytes == gathered
    assert c.routed_buffer_bytes == rows * (2 * D + 3 * F) * cb
    assert c.activation_bytes == 2 * t * D * cb
    assert c.gather_bytes_received == gathered * (fsdp - 1) // fsdp
    if fsdp == 1:
        assert c.gather_bytes_received == 0


def test_known_numbers_mixtral_on_data2_fsdp4() -> None:
    """Hand-computed values for one case, independent of the generic formulas above."""
    plan = make_plan(loaded(SHAPES["mixtral-8x7b"], {"data": 2, "fsdp": 4}, None))
    assert (plan.local_batch, plan.local_tokens, plan.routed_rows) == (2, 8192, 16384)
    assert {p.name: p.local_shape for p in plan.params} == {
        "router": (1024, 8),
        "w_gate": (8, 1024, 14336),
        "w_up": (8, 1024, 14336),
        "w_down": (8, 14336, 1024),
    }
    assert plan.cost.router_flops == 536_870_912
    assert plan.cost.expert_flops == 5_772_436_045_824
    # 3 * 8 * 1024 * 14336 + 1024 * 8 parameters per device, float32
    assert plan.cost.param_bytes == 1_409_318_912


def test_summary_states_the_spec(case) -> None:
    s, axes, _, plan = case
    mesh = " x ".join(f"{name} {size}" for name, size in axes.items())
    assert plan.summary.startswith(f"MoE layer: {s.experts} swiglu experts ")
    assert f"(embed {s.embed}, ffn {s.ffn}), top-{s.top_k} {s.score} routing" in plan.summary
    assert ("renormalised" in plan.summary) == s.renormalize
    assert f"on a {mesh} mesh" in plan.summary


def test_plan_is_frozen(case) -> None:
    *_, plan = case
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.batch = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.cost.router_flops = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.params[0].local_shape = ()  # type: ignore[misc]
    assert isinstance(plan.params, tuple)
    assert isinstance(plan.mesh_axes, tuple)
    assert hash(plan) == hash(plan)  # every field is immutable, so the plan hashes


def test_to_dict_is_json_serialisable(case) -> None:
    *_, plan = case
    data = plan.to_dict()
    text = json.dumps(data)
    back = json.loads(text)
    assert back["routed_rows"] == plan.routed_rows
    assert back["cost"]["expert_flops"] == plan.cost.expert_flops
    assert [p["name"] for p in back["params"]] == ["router", "w_gate", "w_up", "w_down"]
    assert back["params"][1]["partition"] == list(plan.params[1].partition)
    assert back["mesh_axes"] == [list(item) for item in plan.mesh_axes]
    assert set(back) == {f.name for f in dataclasses.fields(Plan)}
    # to_dict is a copy: changing it leaves the plan alone.
    data["batch"] = -1
    assert plan.batch != -1


def test_format_plan_lists_every_parameter(case) -> None:
    *_, plan = case
    text = format_plan(plan)
    assert text.splitlines()[0] == "specs/plan_case.yaml -> plan_case.py"
    assert f"tokens/device   {plan.local_tokens}; routed rows {plan.routed_rows} " in text
    for p in plan.params:
        spec = "P(" + ", ".join(repr(e) for e in p.partition) + ")"
        assert f"spec {spec} -> per device {list(p.local_shape)}" in text
    assert f"router {plan.cost.router_flops:.3e}" in text


def test_plan_is_deterministic() -> None:
    shape, (axes, batch_axes) = SHAPES["qwen3-30b-a3b"], MESHES["data2xfsdp4"]
    first = make_plan(loaded(shape, axes, batch_axes))
    second = make_plan(loaded(shape, axes, batch_axes))
    assert first == second
    assert json.dumps(first.to_dict()) == json.dumps(second.to_dict())


# ---------------------------------------------------------------------------------------
# moegen plan SPEC [--json]

EXAMPLE = "specs/mixtral_small_cpu.yaml"


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MOEGEN_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "moegen", *args],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_plan_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = _run_cli("plan", EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert result.stdout == format_plan(make_plan(load_valid(Path(EXAMPLE)))) + "\n"
    lines = result.stdout.splitlines()
    assert lines[0] == f"{EXAMPLE} -> mixtral_small_cpu.py"
    assert "  mesh            data=2 x fsdp=4 (8 devices); batch over ('data', 'fsdp')" in lines
    assert "  input           [16, 256, 512] bfloat16 -> per device [2, 256, 512]" in lines
    assert any(line.startswith("  tokens/device   512; routed rows 1024 ") for line in lines)
    assert (
        "    w_down   [8, 1792, 512] float32 spec P(None, None, 'fsdp') -> per device [8, 1792, 128]"
        in lines
    )


def test_cli_plan_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = _run_cli("plan", EXAMPLE, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    expected = json.loads(json.dumps(make_plan(load_valid(Path(EXAMPLE))).to_dict()))
    # without --compile, nothing was compiled
    assert data == expected | {"compiled": []}
    assert data["module_name"] == "mixtral_small_cpu"
    assert data["spec_display"] == EXAMPLE
    assert data["local_tokens"] == 512
    assert data["routed_rows"] == 1024
    assert data["cost"]["router_flops"] == 2 * 512 * 512 * 8
    assert data["cost"]["expert_flops"] == 6 * 512 * 2 * 512 * 1792


def test_cli_plan_invalid_spec_exits_3() -> None:
    path = "tests/invalid_specs/top_k_above_num_experts.yaml"
    result = _run_cli("plan", path)
    assert result.returncode == 3
    assert f"{path}:8:10: router.top_k: must be <= layer.num_experts (8), got 9" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout == ""


# ---------------------------------------------------------------------------------------
# TPU targets and the pallas kernel

TPU_EXAMPLE = "specs/mixtral_8x7b_v5e.yaml"


def tpu_spec(
    hardware: str,
    topology: str,
    axes: dict[str, int],
    *,
    kernel: str = "pallas",
    shape: Shape = SHAPES["mixtral-8x7b"],
    tiles: str = "",
) -> LoadedSpec:
    target = f"target:\n  hardware: {hardware}\n  topology: {topology}\n  kernel: {kernel}\n"
    raw = (spec_text(shape, axes, None) + target + tiles).encode()
    return validate(load_spec_bytes(raw, "specs/plan_case.yaml", "plan_case"))


# name -> (hardware, topology, mesh axes, libtpu topology name, chips per host)
TPU_TARGETS = {
    "v5e-2x4": ("tpu-v5e", "2x4", {"fsdp": 8}, "v5e:2x4", (2, 4, 1)),
    "v6e-4x4": ("tpu-v6e", "4x4", {"data": 4, "fsdp": 4}, "v6e:4x4", (2, 4, 1)),
    "v5p-2x2x2": ("tpu-v5p", "2x2x2", {"data": 2, "fsdp": 4}, "v5p:2x2x2", (2, 2, 1)),
    "tpu7x-2x2x1": ("tpu7x", "2x2x1", {"fsdp": 8}, "tpu7x:2x2x1", (2, 2, 1)),
}


@pytest.mark.parametrize("target", list(TPU_TARGETS))
def test_tpu_target_fields(target: str) -> None:
    from moegen.hardware import hardware

    name, topology, axes, libtpu_name, host_bounds = TPU_TARGETS[target]
    plan = make_plan(tpu_spec(name, topology, axes))
    assert (plan.hardware, plan.topology, plan.kernel) == (name, topology, "pallas")
    assert plan.tpu_topology_name == libtpu_name
    assert plan.chips_per_host_bounds == host_bounds
    assert plan.num_devices == hardware(name).devices(topology)
    assert plan.memory.hbm_bytes_per_device == hardware(name).hbm_bytes_per_device > 0
    assert plan.summary.endswith(f", kernel pallas, target {name} {topology}.")
    # pallas: tiles chosen, shard_map's varying-axes check off, compiled (not interpreted)
    assert plan.gate_up_tile is not None and plan.down_tile is not None
    assert plan.check_vma is False
    assert plan.kernel_interpret is False
    assert make_plan(tpu_spec(name, topology, axes), interpret=True).kernel_interpret is True


@pytest.mark.parametrize("target", list(TPU_TARGETS))
def test_xla_kernel_on_tpu(target: str) -> None:
    name, topology, axes, libtpu_name, host_bounds = TPU_TARGETS[target]
    plan = make_plan(tpu_spec(name, topology, axes, kernel="xla"), interpret=True)
    assert (plan.tpu_topology_name, plan.chips_per_host_bounds) == (libtpu_name, host_bounds)
    assert (plan.gate_up_tile, plan.down_tile) == (None, None)
    assert plan.check_vma is True
    assert plan.kernel_interpret is False  # nothing to interpret: ragged_dot is XLA's own
    assert (plan.row_alignment, plan.padded_rows, plan.pads_rows) == (1, plan.routed_rows, False)


def test_cpu_plan_has_no_tpu_fields(case) -> None:
    *_, plan = case
    assert (plan.hardware, plan.topology) == ("cpu", None)
    assert (plan.tpu_topology_name, plan.chips_per_host_bounds) == (None, None)
    assert (plan.gate_up_tile, plan.down_tile) == (None, None)
    assert (plan.kernel_interpret, plan.check_vma, plan.pads_rows) == (False, True, False)
    assert plan.memory.hbm_bytes_per_device == 0


def test_pallas_tiles_chosen_for_the_v5e_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    plan = make_plan(load_valid(Path(TPU_EXAMPLE)))
    # megablox's default fits v5e exactly: its tgmm (weight-gradient) step needs
    # 2*(0.5 + 0.5) Mi*2 B + 2*1 Mi*2 B + 4*1 Mi = 12 MiB = 0.75 * 16 MiB (gmm step 10 MiB)
    assert (plan.gate_up_tile, plan.down_tile) == ((512, 1024, 1024), (512, 1024, 1024))
    assert (plan.routed_rows, plan.padded_rows, plan.row_alignment) == (8192, 8192, 512)
    assert plan.pads_rows is False
    assert plan.tpu_topology_name == "v5e:2x4"
    assert plan.chips_per_host_bounds == (2, 4, 1)


def test_pinned_tiles_are_used_and_rows_padded() -> None:
    tiles = "  tiles:\n    gate_up: [256, 512, 512]\n    down: [384, 256, 512]\n"
    shape = dataclasses.replace(SHAPES["qwen3-30b-a3b"], batch=8, seq=1000)
    plan = make_plan(tpu_spec("tpu-v5e", "2x4", {"data": 8}, shape=shape, tiles=tiles))
    assert (plan.gate_up_tile, plan.down_tile) == ((256, 512, 512), (384, 256, 512))
    # 1000 tokens x top-8 = 8000 rows, padded to a multiple of lcm(256, 384) = 768
    assert (plan.routed_rows, plan.row_alignment, plan.padded_rows) == (8000, 768, 8448)
    assert plan.pads_rows is True
    # the memory estimate counts the padded buffer, the cost estimate only real rows
    D, F, cb = shape.embed, shape.ffn, BYTES[shape.compute]
    ledger = dict(plan.memory.ledger)
    assert ledger["routed rows, kept for the backward pass"] == 8448 * D * cb
    assert ledger["FFN activations and gradients at the backward peak (4 x [rows, 768])"] == (
        4 * 8448 * F * cb
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
        expected = 8 if plan.ffn_chunks == 1 else 11
        assert len({name for name, _ in m.ledger}) == len(m.ledger) == expected
        assert all(size > 0 for size in sizes)
        assert 0 < m.forward_peak < m.train_peak


def test_memory_known_numbers_v5e_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixtral 8x7B, 8192 rows per device on fsdp=8, by hand: the backward peak of the FFN."""
    monkeypatch.chdir(REPO_ROOT)
    plan = make_plan(load_valid(Path(TPU_EXAMPLE)))
    m = plan.memory
    assert plan.ffn_chunks == 1  # 5 GiB fits the 16 GiB of a v5e: nothing to recompute
    params = (4096 * 8 + 3 * 8 * 4096 * 14336) // 8 * 4  # float32 shards
    gathered = 4096 * 8 * 4 + 3 * 8 * 4096 * 14336 * 2  # bfloat16 experts, float32 router
    row_block = 8192 * 4096 * 2  # [rows, D] bfloat16
    activation = 8192 * 14336 * 2  # [rows, F] bfloat16
    x = 4096 * 4096 * 2
    router = 4096 * 8 * 4 * 3
    assert dict(m.ledger) == {
        "parameters (stored shards)": params,
        "parameter gradients (stored shards)": params,
        "gathered expert weights, kept for the backward pass": gathered,
        "routed rows, kept for the backward pass": row_block,
        "gradient of the routed experts' output": row_block,
        "FFN activations and gradients at the backward peak (4 x [rows, 14336])": 4 * activation,
        "layer input and its gradient": 2 * x,
        "router logits, scores and their gradients": router,
    }
    assert m.train_peak == 5_369_266_176
    assert m.forward_peak == (
        params + 2 * x + gathered + 2 * row_block + 2 * activation + router // 3
    )


def test_memory_ledger_of_ffn_slices_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory reference (Mixtral 8x7B, fsdp 2 x expert 4, ragged all-to-all) in 8 FFN
    slices: the ledger the compiled peak (3.476e9 bytes, libtpu 0.0.51) is checked against."""
    monkeypatch.chdir(REPO_ROOT)
    plan = make_plan(load_valid(Path("specs/mixtral_8x7b_ep_a2a_v5e.yaml")))
    assert (plan.ffn_chunks, plan.ffn_chunk_width, plan.regathers_weights) == (8, 1792, True)
    assert plan.sliced_params == ("w_gate", "w_up", "w_down")
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
    by_count = {o.chunks: o for o in plan.ffn_chunk_options}
    assert sorted(by_count) == [1, 2, 4, 8, 16]
    assert by_count[1].recompute_flops == 0
    peaks = [by_count[c].train_peak for c in sorted(by_count)]
    assert peaks == sorted(peaks, reverse=True)  # more slices, less memory, here


def test_cli_plan_tpu_example(monkeypatch: pytest.MonkeyPatch) -> None:
    from moegen.hardware import hardware

    monkeypatch.chdir(REPO_ROOT)
    result = _run_cli("plan", TPU_EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert result.stdout == format_plan(make_plan(load_valid(Path(TPU_EXAMPLE)))) + "\n"
    lines = result.stdout.splitlines()
    assert lines[0] == f"{TPU_EXAMPLE} -> mixtral_8x7b_v5e.py"
    assert (
        "  megablox tiles  gate/up [512, 1024, 1024], down [512, 1024, 1024] "
        "(rows, contraction, output)"
    ) in lines
    hbm = hardware("tpu-v5e").hbm_bytes_per_device / 2**30
    assert (
        f"  memory estimate forward 3.907 GiB, forward+backward 5.001 GiB of {hbm:.3f} GiB HBM "
        "per device"
    ) in lines
    # the ledger follows, largest first, then what FFN slices would cost
    start = lines.index(next(line for line in lines if line.startswith("  memory estimate")))
    assert (
        lines[start + 1 :]
        == [
            "       2.625 GiB  gathered expert weights, kept for the backward pass",
            "       0.875 GiB  FFN activations and gradients at the backward peak (4 x [rows, 14336])",
            "       0.656 GiB  parameters (stored shards)",
            "       0.656 GiB  parameter gradients (stored shards)",
            "       0.062 GiB  layer input and its gradient",
            "       0.062 GiB  routed rows, kept for the backward pass",
            "       0.062 GiB  gradient of the routed experts' output",
            "       384.0 KiB  router logits, scores and their gradients",
            "  FFN slices      1 (14336 columns each); memory.ffn_chunks options, forward+backward:",
            "      1 slices  peak  5.001 GiB  recomputed FLOPs 0.000e+00  <- this spec",
            "      2 slices  peak  3.766 GiB  recomputed FLOPs 1.924e+12",
        ]
        + lines[start + 12 :]
    )
    assert "  experts         8 (8 per device, replicated); kernel pallas; target tpu-v5e 2x4" in (
        lines
    )


def test_cli_plan_json_tpu_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = _run_cli("plan", TPU_EXAMPLE, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["gate_up_tile"] == data["down_tile"] == [512, 1024, 1024]
    assert data["tpu_topology_name"] == "v5e:2x4"
    assert data["chips_per_host_bounds"] == [2, 4, 1]
    assert (data["kernel_interpret"], data["check_vma"]) == (False, False)
    assert sum(size for _, size in data["memory"]["ledger"]) == data["memory"]["train_peak"]


def test_cli_plan_cpu_has_no_tile_line() -> None:
    result = _run_cli("plan", EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert "megablox tiles" not in result.stdout
    assert any(line.startswith("  memory estimate forward ") for line in result.stdout.splitlines())
    assert " HBM per device" not in result.stdout  # cpu has no fixed memory to compare with


def test_plan_text_says_what_is_padded() -> None:
    tiles = "  tiles:\n    gate_up: [256, 512, 512]\n    down: [384, 256, 512]\n"
    shape = dataclasses.replace(SHAPES["qwen3-30b-a3b"], batch=8, seq=1000)
    text = format_plan(make_plan(tpu_spec("tpu-v5e", "2x4", {"data": 8}, shape=shape, tiles=tiles)))
    # Only the total row count is rounded up (1000 tokens x top-8 = 8000 rows, to a multiple
    # of lcm(256, 384) = 768: 11 * 768 = 8448); expert groups start anywhere, megablox masks
    # partial row tiles. The text says so, not that groups are aligned.
    assert "groups aligned" not in text
    assert (
        "  tokens/device   1000; routed rows 8000 (x top_8, dropless); grouped-matmul calls "
        "of 8000 rows padded to 8448 (a multiple of 768: whole row tiles)"
    ) in text.splitlines()


def test_xla_plan_text_does_not_speak_of_row_tiles() -> None:
    name, topology, axes, *_ = TPU_TARGETS["v5e-2x4"]
    plan = make_plan(tpu_spec(name, topology, axes, kernel="xla"))
    assert (plan.row_alignment, plan.padded_rows) == (1, plan.routed_rows)
    text = format_plan(plan)
    assert "row tiles" not in text
    assert "padded to" not in text
    assert "no padding (groups of any size)" in _tokens_line(plan)


def _tokens_line(plan: Plan) -> str:
    [line] = [
        line for line in format_plan(plan).splitlines() if line.startswith("  tokens/device ")
    ]
    return line


@pytest.mark.parametrize("experts", ["replicated", "ragged_all_to_all"])
def test_plan_text_says_padded_only_when_rows_are_padded(experts: str) -> None:
    axes = {"fsdp": 8} if experts == "replicated" else {"fsdp": 2, "expert": 4}
    raw = (
        spec_text(SHAPES["mixtral-8x7b"], axes, None)
        + f"parallelism:\n  experts: {experts}\n"
        + "target:\n  hardware: tpu-v5e\n  topology: 2x4\n  kernel: pallas\n"
    )
    plan = make_plan(validate(load_spec_bytes(raw.encode(), "specs/plan_case.yaml", "plan_case")))
    assert plan.row_alignment > 1 and not plan.pads_rows
    assert plan.padded_rows == plan.experts.ffn_rows
    assert "padded to" not in _tokens_line(plan)


# ---------------------------------------------------------------------------------------
# Router and expert features: capacity, the parameter set, FLOPs and bytes, by hand


def feature_plan(
    *,
    experts: int = 8,
    embed: int = 64,
    ffn: int = 32,
    top_k: int = 2,
    batch: int = 16,
    seq: int = 64,
    axes: dict[str, int] | None = None,
    layer: dict | None = None,
    router: dict | None = None,
    parallelism: dict | None = None,
    compute: str = "float32",
    memory: dict | None = None,
) -> Plan:
    """The plan of a spec written as JSON (a YAML flow mapping), float32 parameters."""
    data = {
        "version": 1,
        "layer": {"num_experts": experts, "embed_dim": embed, "ffn_dim": ffn, **(layer or {})},
        "router": {"top_k": top_k, **(router or {})},
        "shapes": {"batch": batch, "seq_len": seq},
        "dtypes": {"params": "float32", "compute": compute},
        "mesh": {"axes": axes or {"data": 2}},
    }
    if parallelism:
        data["parallelism"] = parallelism
    if memory:
        data["memory"] = memory
    raw = json.dumps(data).encode()
    return make_plan(validate(load_spec_bytes(raw, "specs/plan_case.yaml", "plan_case")))


def capacity(factor: float, drop: str = "probability") -> dict:
    """Router settings for a capacity, with the load-balancing loss validation asks for."""
    return {"load_balance_loss": 0.01, "capacity": {"factor": factor, "drop": drop}}


A2A = {"experts": "ragged_all_to_all"}
RING = {"experts": "ring_of_experts"}


def test_dropless_plan_has_no_capacity() -> None:
    plan = feature_plan()
    assert (plan.capacity, plan.drop_policy, plan.experts.capacity) == (None, None, None)
    # data=2: 8 of 16 sequences of 64 tokens per device, top-2
    assert (plan.local_tokens, plan.routed_rows, plan.experts.ffn_rows) == (512, 1024, 1024)
    assert "(x top_2, dropless)" in _tokens_line(plan)


@pytest.mark.parametrize(
    ("factor", "expected_capacity", "expected_rows"),
    [
        # 512 tokens x top-2 = 1024 copies over 8 experts: 128 copies an expert on average
        (1.25, 160, 1024),  # 8 * 160 = 1280 slots > 1024 copies: nothing to cut
        (1.0, 128, 1024),  # exactly as many slots as copies
        (0.5, 64, 512),  # 8 * 64
        (0.3, 39, 312),  # ceil(38.4) = 39; 8 * 39
        (0.001, 1, 8),  # ceil(0.128): at least one copy an expert
    ],
)
def test_capacity_replicated(factor: float, expected_capacity: int, expected_rows: int) -> None:
    plan = feature_plan(router=capacity(factor, "position"))
    assert plan.capacity == plan.experts.capacity == expected_capacity
    assert plan.drop_policy == "position"
    assert plan.experts.ffn_rows == plan.padded_rows == expected_rows
    # routed_rows counts every chosen copy, before dropping; so do the FLOPs (an upper bound)
    assert plan.routed_rows == 1024
    assert plan.cost.expert_flops == 6 * 1024 * 64 * 32
    assert (
        f"(x top_2, at most {expected_capacity} per expert kept, drop by position)"
        in _tokens_line(plan)
    )
    assert f"capacity factor {factor:g} (drop by position)" in plan.summary


def test_capacity_drop_policy_defaults_to_probability() -> None:
    plan = feature_plan(router={"load_balance_loss": 0.01, "capacity": {"factor": 2}})
    assert (plan.capacity, plan.drop_policy) == (256, "probability")  # ceil(2 * 1024 / 8)


@pytest.mark.parametrize(
    ("factor", "expected_capacity", "expected_rows"),
    [
        # data 2 x expert 4: 128 tokens a device, 256 copies over 8 experts: C = ceil(32 f).
        # Dropless bound: 4 devices' 512 tokens, each sending min(top 2, 2 local experts) = 2
        # copies to this device: 1024 rows. With C: 4 source devices x 2 experts x C.
        (1.0, 32, 256),
        (0.3, 10, 80),  # ceil(9.6) = 10
        (4.0, 128, 1024),  # 4 * 2 * 128 = 1024: both bounds meet
        (5.0, 160, 1024),  # 1280 > 1024: the dropless bound holds
    ],
)
def test_capacity_ragged_all_to_all(
    factor: float, expected_capacity: int, expected_rows: int
) -> None:
    plan = feature_plan(axes={"data": 2, "expert": 4}, router=capacity(factor), parallelism=A2A)
    e = plan.experts
    assert (plan.local_tokens, e.local_experts, e.group_tokens) == (128, 2, 512)
    assert e.capacity == expected_capacity
    assert (e.ffn_rows, e.receive_rows, e.ffn_calls) == (expected_rows, expected_rows, 1)
    assert plan.padded_rows == expected_rows


@pytest.mark.parametrize(
    ("factor", "expected_capacity", "expected_rows"),
    [
        # expert 4 alone: 256 tokens a device, top-4 of 16 experts: 1024 copies, C = ceil(64 f).
        # Dropless: 4 x 256 tokens x min(4, 4 local experts) = 4096 rows; with C, 4 x 4 x C.
        (1.0, 64, 1024),
        (2.0, 128, 2048),
        (0.1, 7, 112),  # ceil(6.4) = 7
        (20.0, 1280, 4096),
    ],
)
def test_capacity_ring_of_experts(factor: float, expected_capacity: int, expected_rows: int):
    plan = feature_plan(
        experts=16, top_k=4, axes={"expert": 4}, router=capacity(factor), parallelism=RING
    )
    e = plan.experts
    assert (plan.local_tokens, e.local_experts, e.group_tokens) == (256, 4, 1024)
    assert (e.capacity, e.ffn_rows, e.ffn_calls, e.receive_rows) == (
        expected_capacity,
        expected_rows,
        1,
        0,
    )


@pytest.mark.parametrize(
    ("experts", "top_k", "factor", "expected_capacity", "expected_rows"),
    [
        # expert 4, 2 chunks: each ring step runs one device's 256 tokens. 16 experts, top 4:
        # 4 local, 256 x 4 = 1024 rows dropless; C = ceil(64 f), 4 local experts x C
        (16, 4, 1.0, 64, 256),
        (16, 4, 0.1, 7, 28),
        (16, 4, 8.0, 512, 1024),  # 4 x 512 = 2048 > 1024
        # 8 experts, top 4: 2 local, so a token sends at most 2 copies: 512 rows;
        # C = ceil(f * 1024 / 8) = ceil(128 f), 2 x C
        (8, 4, 1.0, 128, 256),
        (8, 4, 3.0, 384, 512),
    ],
)
def test_capacity_chunked_ring_of_experts(
    experts: int, top_k: int, factor: float, expected_capacity: int, expected_rows: int
) -> None:
    plan = feature_plan(
        experts=experts,
        top_k=top_k,
        axes={"expert": 4},
        router=capacity(factor),
        parallelism={**RING, "overlap_chunks": 2},
    )
    e = plan.experts
    assert plan.local_tokens == 256
    assert (e.capacity, e.ffn_rows, e.ffn_calls) == (expected_capacity, expected_rows, 4)


def test_capacity_is_exact_for_decimal_factors() -> None:
    # data 2: 8 sequences of 375 tokens = 3000 tokens a device, top-2: 6000 copies
    plan = feature_plan(seq=375, router=capacity(1.1))
    assert plan.local_tokens == 3000
    assert plan.capacity == 825  # 1.1 * 6000 / 8 = 11 * 600 / 8 = 825 exactly


# name: (shape, local shape, partition, gathered dim, use dtype, init std)
ParamRow = tuple[tuple[int, ...], tuple[int, ...], tuple, int | None, str, float]


def _params(plan: Plan) -> dict[str, ParamRow]:
    return {
        p.name: (p.shape, p.local_shape, p.partition, p.gather_axis, p.use_dtype, p.init_scale)
        for p in plan.params
    }


def test_params_non_gated_biased_shared_routing_bias_on_fsdp_and_expert() -> None:
    """gelu (no gate), biases, a shared expert of width 96 and a routing bias, with fsdp 2
    and expert 2: expert weights and biases are split along experts (dim 0); every embed
    dim (the router's, b_down's, the shared expert's) along fsdp; routing_bias, b_up (no
    embed dim) are split by neither fsdp nor, for routing_bias, expert."""
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "gelu", "ffn_bias": True, "shared_ffn_dim": 96},
        router={"score": "sigmoid", "routing_bias": True},
        parallelism=A2A,
        compute="bfloat16",
    )
    bf16, f32 = "bfloat16", "float32"
    assert _params(plan) == {
        "router": ((64, 8), (32, 8), ("fsdp", None), 0, f32, 1 / 8),
        "routing_bias": ((8,), (8,), (None,), None, f32, 0.0),
        "w_up": ((8, 64, 32), (4, 32, 32), ("expert", "fsdp", None), 1, bf16, 1 / 8),
        "w_down": ((8, 32, 64), (4, 32, 32), ("expert", None, "fsdp"), 2, bf16, 1 / math.sqrt(32)),
        "b_up": ((8, 32), (4, 32), ("expert", None), None, bf16, 0.0),
        "b_down": ((8, 64), (4, 32), ("expert", "fsdp"), 1, bf16, 0.0),
        "shared_up": ((64, 96), (32, 96), ("fsdp", None), 0, bf16, 1 / 8),
        "shared_down": ((96, 64), (96, 32), (None, "fsdp"), 1, bf16, 1 / math.sqrt(96)),
    }
    names = {p.name: p.shape_names for p in plan.params}
    assert names["routing_bias"] == ("NUM_EXPERTS",)
    assert names["b_up"] == ("NUM_EXPERTS", "FFN_DIM")
    assert names["b_down"] == ("NUM_EXPERTS", "EMBED_DIM")
    assert names["shared_up"] == ("EMBED_DIM", "SHARED_FFN_DIM")
    assert names["shared_down"] == ("SHARED_FFN_DIM", "EMBED_DIM")
    assert (plan.activation, plan.gated, plan.ffn_bias, plan.shared_ffn_dim) == (
        "gelu",
        False,
        True,
        96,
    )
    assert plan.routing_bias is True
    text = format_plan(plan)
    for p in plan.params:
        spec = "P(" + ", ".join(repr(e) for e in p.partition) + ")"
        assert f"{p.name} " in text
        assert f"spec {spec} -> per device {list(p.local_shape)}" in text


def test_params_gated_biased_shared_on_data_and_fsdp() -> None:
    """swiglu with biases and a shared expert, experts replicated: gate beside up, in the
    routed and in the shared expert; nothing is split along experts."""
    plan = feature_plan(
        axes={"data": 2, "fsdp": 2},
        layer={"activation": "swiglu", "ffn_bias": True, "shared_ffn_dim": 96},
    )
    f32 = "float32"
    expert_in = ((8, 64, 32), (8, 32, 32), (None, "fsdp", None), 1, f32, 1 / 8)
    ffn_bias = ((8, 32), (8, 32), (None, None), None, f32, 0.0)
    shared_in = ((64, 96), (32, 96), ("fsdp", None), 0, f32, 1 / 8)
    assert _params(plan) == {
        "router": ((64, 8), (32, 8), ("fsdp", None), 0, f32, 1 / 8),
        "w_gate": expert_in,
        "w_up": expert_in,
        "w_down": ((8, 32, 64), (8, 32, 32), (None, None, "fsdp"), 2, f32, 1 / math.sqrt(32)),
        "b_gate": ffn_bias,
        "b_up": ffn_bias,
        "b_down": ((8, 64), (8, 32), (None, "fsdp"), 1, f32, 0.0),
        "shared_gate": shared_in,
        "shared_up": shared_in,
        "shared_down": ((96, 64), (96, 32), (None, "fsdp"), 1, f32, 1 / math.sqrt(96)),
    }
    assert plan.gated is True


@pytest.mark.parametrize(
    ("activation", "names"),
    [
        ("swiglu", ["router", "w_gate", "w_up", "w_down"]),
        ("geglu", ["router", "w_gate", "w_up", "w_down"]),
        ("gelu", ["router", "w_up", "w_down"]),
        ("relu", ["router", "w_up", "w_down"]),
    ],
)
def test_only_gated_activations_have_a_gate(activation: str, names: list[str]) -> None:
    plan = feature_plan(layer={"activation": activation})
    assert [p.name for p in plan.params] == names
    assert plan.gated is (activation in ("swiglu", "geglu"))
    assert plan.summary.startswith(f"MoE layer: 8 {activation} experts ")


@pytest.mark.parametrize(
    ("activation", "ffn", "fused"),
    [
        ("swiglu", 256, True),  # whole 128-lane tiles: up starts on a tile
        ("geglu", 384, True),
        ("swiglu", 2880, False),  # gpt-oss: up would start mid-tile, XLA would copy it out
        ("swiglu", 32, False),
        ("gelu", 256, False),  # no gate
        ("relu", 256, False),
    ],
)
def test_gate_and_up_side_by_side_when_up_starts_on_a_lane_tile(
    activation: str, ffn: int, fused: bool
) -> None:
    plan = feature_plan(ffn=ffn, layer={"activation": activation})  # no fsdp
    assert plan.fuses_gate_up is fused
    gated = activation in ("swiglu", "geglu")
    assert plan.grouped_matmul_sites == (3 if gated and not fused else 2)
    source = render(plan)
    assert ('weights["w_gate_up"]' in source) is fused
    assert ('weights["w_gate"]' in source) is (gated and not fused)


def test_gate_and_up_stay_apart_when_fsdp_gathers_the_whole_weights() -> None:
    """Gathered whole, fused gate and up weights and gradients are one buffer each (measured
    heavier); gathered per FFN slice they are small, and one row gradient per slice is not."""
    whole = feature_plan(ffn=256, axes={"fsdp": 2})
    assert (whole.fuses_gate_up, whole.grouped_matmul_sites) == (False, 3)
    assert 'weights["w_gate"]' in render(whole)
    sliced = feature_plan(ffn=256, axes={"fsdp": 2}, memory={"ffn_chunks": 2})
    assert (sliced.fuses_gate_up, sliced.grouped_matmul_sites) == (True, 2)
    source = render(sliced)
    assert '"w_gate_up": jax.lax.all_gather(' in source
    assert 'jnp.concatenate([columns("w_gate", 2), columns("w_up", 2)], axis=2)' in source
    ledger = dict(sliced.memory.ledger)
    row_block = sliced.padded_rows * 64 * 4
    assert ledger["the slice's row gradients"] == row_block  # one call reads the rows
    apart = feature_plan(ffn=64, axes={"fsdp": 2}, memory={"ffn_chunks": 2})  # 32-lane slices
    assert not apart.fuses_gate_up
    assert dict(apart.memory.ledger)["the slice's row gradients"] == 2 * apart.padded_rows * 64 * 4


def test_params_relu_on_the_expert_axis_alone() -> None:
    """No fsdp: nothing is gathered; the expert axis splits only the routed experts."""
    plan = feature_plan(
        axes={"expert": 4},
        layer={"activation": "relu", "ffn_bias": True, "shared_ffn_dim": 48},
        parallelism=RING,
    )
    f32 = "float32"
    assert _params(plan) == {
        "router": ((64, 8), (64, 8), (None, None), None, f32, 1 / 8),
        "w_up": ((8, 64, 32), (2, 64, 32), ("expert", None, None), None, f32, 1 / 8),
        "w_down": ((8, 32, 64), (2, 32, 64), ("expert", None, None), None, f32, 1 / math.sqrt(32)),
        "b_up": ((8, 32), (2, 32), ("expert", None), None, f32, 0.0),
        "b_down": ((8, 64), (2, 64), ("expert", None), None, f32, 0.0),
        "shared_up": ((64, 48), (64, 48), (None, None), None, f32, 1 / 8),
        "shared_down": ((48, 64), (48, 64), (None, None), None, f32, 1 / math.sqrt(48)),
    }


def test_costs_non_gated_with_shared_expert_by_hand() -> None:
    """gelu experts (up, down), a shared expert of width 96, fsdp 2 x expert 2, bfloat16
    compute, float32 storage: 4 sequences of 64 = 256 tokens a device, 512 routed copies."""
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "gelu", "ffn_bias": True, "shared_ffn_dim": 96},
        router={"score": "sigmoid", "routing_bias": True},
        parallelism=A2A,
        compute="bfloat16",
    )
    c = plan.cost
    assert (plan.local_tokens, plan.routed_rows) == (256, 512)
    assert c.router_flops == 262_144  # 2 * 256 * 64 * 8
    assert c.expert_flops == 4_194_304  # 2 matmuls x 2 * 512 * 64 * 32
    assert c.shared_expert_flops == 6_291_456  # 2 matmuls x 2 * 256 * 64 * 96
    assert c.forward_flops == 10_747_904
    assert c.train_flops == 32_243_712
    # a row and its output [64] each, up and hidden [32] each, 2 bytes: 384
    assert c.routed_row_bytes == 384
    assert c.routed_buffer_bytes == 512 * 384
    assert c.shared_activation_bytes == 98_304  # 256 tokens x (up, hidden) x 96 x 2 bytes
    # local elements: router 256, routing_bias 8, w_up 4096, w_down 4096, b_up 128,
    # b_down 128, shared_up 3072, shared_down 3072 = 14856, float32
    assert c.param_bytes == 59_424
    # in use: router 2 * 256 * 4, routing_bias 8 * 4, w_up and w_down 2 * 4096 * 2 each,
    # b_up 128 * 2, b_down 2 * 128 * 2, shared_up and shared_down 2 * 3072 * 2 each
    assert c.gathered_weight_bytes == 60_192
    assert c.activation_bytes == 65_536  # input and output, 256 x 64 x 2 bytes
    assert "shared expert 6.291e+06, " in format_plan(plan)


def test_costs_gated_with_shared_expert_by_hand() -> None:
    """The same layer with swiglu: a third matmul, in the routed and the shared expert."""
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "swiglu", "shared_ffn_dim": 96},
        parallelism=A2A,
        compute="bfloat16",
    )
    c = plan.cost
    assert c.expert_flops == 6_291_456  # 3 x 2 * 512 * 64 * 32
    assert c.shared_expert_flops == 9_437_184  # 3 x 2 * 256 * 64 * 96
    assert c.forward_flops == 262_144 + 6_291_456 + 9_437_184
    assert c.routed_row_bytes == 448  # (2 * 64 + 3 * 32) * 2
    assert c.shared_activation_bytes == 147_456  # 256 x (gate, up, hidden) x 96 x 2


def test_costs_without_shared_expert_have_none() -> None:
    plan = feature_plan(layer={"activation": "relu"})
    c = plan.cost
    assert (c.shared_expert_flops, c.shared_activation_bytes) == (0, 0)
    assert c.expert_flops == 4 * 1024 * 64 * 32  # up and down only
    assert c.forward_flops == c.router_flops + c.expert_flops
    assert "shared expert" not in format_plan(plan)
    assert len(plan.memory.ledger) == 8


def test_memory_ledger_with_shared_expert_by_hand() -> None:
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "gelu", "ffn_bias": True, "shared_ffn_dim": 96},
        router={"score": "sigmoid", "routing_bias": True},
        parallelism=A2A,
        compute="bfloat16",
    )
    # ragged_all_to_all: 2 devices' 512 tokens x min(top 2, 4 local experts) = 1024 rows
    assert plan.padded_rows == 1024
    row_block = 1024 * 64 * 2  # [rows, D] bfloat16
    activation = 1024 * 32 * 2  # [rows, F] bfloat16
    x = 256 * 64 * 2
    router = 256 * 8 * 4 * 3
    assert dict(plan.memory.ledger) == {
        "parameters (stored shards)": 59_424,
        "parameter gradients (stored shards)": 59_424,
        "gathered expert weights, kept for the backward pass": 60_192,
        "routed rows, kept for the backward pass": row_block,
        "gradient of the routed experts' output": row_block,
        # gelu: up, the hidden gradient and the up gradient
        "FFN activations and gradients at the backward peak (3 x [rows, 32])": 3 * activation,
        "layer input and its gradient": 2 * x,
        "router logits, scores and their gradients": router,
        "shared expert activations and their gradients": 2 * 98_304,
    }
    assert plan.memory.forward_peak == (
        59_424 + 2 * x + 60_192 + 2 * row_block + 2 * activation + 98_304 + router // 3
    )
    assert plan.memory.train_peak == sum(dict(plan.memory.ledger).values())


def test_gather_traffic_counts_only_gathered_parameters() -> None:
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2},
        layer={"activation": "gelu", "ffn_bias": True, "shared_ffn_dim": 96},
        router={"score": "sigmoid", "routing_bias": True},
        parallelism=A2A,
        compute="bfloat16",
    )
    # the other fsdp shard of: router 256 x 4 B, w_up and w_down 4096 x 2 B each,
    # b_down 128 x 2 B, shared_up and shared_down 3072 x 2 B each
    assert plan.cost.gather_bytes_received == 29_952


def test_plan_text_under_a_capacity_does_not_say_dropless() -> None:
    # data 2 x expert 4, factor 1: C = 32, rows 4 x 2 x 32 = 256 (dropless bound 1024)
    plan = feature_plan(axes={"data": 2, "expert": 4}, router=capacity(1.0), parallelism=A2A)
    assert plan.experts.ffn_rows == 256
    text = format_plan(plan)
    [rows_line] = [line for line in text.splitlines() if "expert FFN rows" in line]
    [receive_line] = [line for line in text.splitlines() if "receive buffer" in line]
    assert "dropless" not in rows_line, rows_line
    assert "every token of the expert group" not in receive_line, receive_line


def test_router_settings_reach_the_plan() -> None:
    """DeepSeek-V3's router on 64 experts: 8 groups of 8, the best 4 kept, each ranked by
    the sum of its top 8 / 4 = 2 scores."""
    plan = feature_plan(
        experts=64,
        top_k=8,
        layer={"shared_ffn_dim": 64},
        router={
            "score": "sigmoid",
            "renormalize": True,
            "routed_scaling": 2.5,
            "group_limit": {"groups": 8, "keep": 4},
            "routing_bias": True,
            "z_loss": 0.001,
        },
    )
    assert (plan.expert_groups, plan.kept_groups) == (8, 4)
    assert (plan.group_top_k, plan.experts_per_group) == (2, 8)
    assert (plan.routed_scaling, plan.routing_bias) == (2.5, True)
    assert (plan.load_balance_weight, plan.z_loss_weight) == (0.0, 0.001)
    assert plan.score_after_top_k is False
    assert plan.global_tokens == 16 * 64
    assert plan.summary.startswith(
        "MoE layer: 64 swiglu experts (embed 64, ffn 32, shared expert ffn 64), top-8 sigmoid "
        "routing in 4 of 8 groups, renormalised, scaled by 2.5, balancing bias, z-loss 0.001, "
        "replicated experts, on a data 2 mesh"
    )


def test_router_defaults_in_the_plan() -> None:
    plan = feature_plan()
    assert (plan.expert_groups, plan.kept_groups, plan.group_top_k, plan.experts_per_group) == (
        None,
        None,
        None,
        None,
    )
    assert (plan.routed_scaling, plan.routing_bias, plan.score_after_top_k) == (1.0, False, False)
    assert (plan.load_balance_weight, plan.z_loss_weight) == (0.0, 0.0)
    assert (plan.ffn_bias, plan.shared_ffn_dim, plan.gated) == (False, None, True)


@pytest.mark.parametrize(
    ("activation", "check_vma"),
    [("swiglu", True), ("relu", True), ("gelu", False), ("geglu", False)],
)
def test_erf_activations_turn_the_varying_axes_check_off(activation: str, check_vma: bool):
    plan = feature_plan(layer={"activation": activation})
    assert plan.check_vma is check_vma
    assert plan.vma_unchecked_reason == (
        "" if check_vma else "XLA's erf polynomial carries no varying-axes types"
    )


def test_one_slice_network_is_all_ici(case) -> None:
    """Without target.slices the mesh lies in one slice: every byte moves over ICI."""
    _, axes, _, plan = case
    net = plan.network
    assert plan.slices == net.slices == 1
    assert net.ici_mesh_shape == tuple(axes.values())
    assert net.dcn_mesh_shape == (1,) * len(axes)
    assert net.dcn_bytes == 0 and all(t.dcn_bytes == 0 for t in net.transfers)
    assert net.ici_bytes == sum(t.ici_bytes for t in net.transfers)
    # the fsdp all-gather is the cost plan's gather, and its reduce-scatter mirrors it
    fsdp = [t.ici_bytes for t in net.transfers if t.axis == "fsdp"]
    gathered = plan.cost.gather_bytes_received
    assert fsdp == ([gathered, gathered] if "fsdp" in axes else [])
    text = format_plan(plan)
    assert "over DCN" not in text
    assert "communication per device, forward+backward: ICI " in text


def test_gate_and_up_side_by_side_are_tiled_as_one_call_of_twice_the_width() -> None:
    """The qwen3 ring on v6e fuses gate and up: its gate/up tile is chosen for the [2048 ->
    1536] call, so the output tile may span both halves (one read of the rows forward)."""
    path = REPO_ROOT / "specs" / "qwen3_30b_a3b_ring_v6e.yaml"
    plan = make_plan(validate(load_spec_bytes(path.read_bytes(), str(path), path.stem)))
    assert plan.fuses_gate_up
    chip = CATALOGUE["tpu-v6e"]
    expected = choose_tile(
        plan.experts.ffn_rows,
        2048,
        2 * 768,
        "bfloat16",
        chip.vmem_bytes_for_tiles,
        groups=plan.local_experts,
        peak_flops=chip.peak_bf16_flops_per_chip,
        hbm_bytes_per_s=chip.hbm_bytes_per_s_per_chip,
    )
    assert plan.gate_up_tile == expected.as_tuple() == (512, 1024, 2048)
    assert plan.gate_up_tile[2] > plan.ffn_dim  # wider than gate or up alone


# ---------------------------------------------------------------------------------------
# The widest layers the rules allow (one token on one v5e chip, widths up to 2**31) plan at
# once: the tile search tries only lane tiles that can fit VMEM, and its tiles run.


def _one_chip_pallas(embed: int, ffn: int, compute: str = "bfloat16") -> str:
    return f"""\
version: 1
layer: {{num_experts: 1, embed_dim: {embed}, ffn_dim: {ffn}}}
router: {{top_k: 1}}
shapes: {{batch: 1, seq_len: 1}}
dtypes: {{params: float32, compute: {compute}}}
mesh: {{axes: {{data: 1}}}}
target: {{hardware: tpu-v5e, topology: 1x1, kernel: pallas}}
"""


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
    for tile in (plan.gate_up_tile, plan.down_tile):
        assert tile_problems(Tile(*tile), compute, budget) == [], tile
    assert plan.ffn_chunks == 1  # too large for HBM in any number of slices: whole
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
