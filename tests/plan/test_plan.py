"""Stage 3, `moegen.plan`: per-device shapes, partitions, FLOPs and bytes of realistic MoE layers on several CPU meshes, checked against the formulas."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from conftest import EXAMPLE_SPECS
from plan_cases import BYTES, SHAPES, Shape, loaded

from moegen.pipeline import load_valid
from moegen.plan import Plan, format_plan, make_plan

# name -> (mesh axes in order, explicit batch_axes or None for the default)
MESHES = {
    "data8": ({"data": 8}, None),
    "fsdp8": ({"fsdp": 8}, None),
    "data2xfsdp4": ({"data": 2, "fsdp": 4}, None),
    "fsdp4xdata2-batch-fsdp-data": ({"fsdp": 4, "data": 2}, ["fsdp", "data"]),
}


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
    assert plan.mesh.axes == tuple(axes.items())
    assert plan.mesh.num_devices == devices
    assert plan.mesh.batch_axes == tuple(batch_axes or axes)
    assert plan.input_partition == (tuple(batch_axes or axes), None, None)
    assert plan.mesh.fsdp_axis == ("fsdp" if "fsdp" in axes else None)
    assert plan.mesh.expert_axis is None
    assert plan.experts.strategy == "replicated"
    assert (plan.batch, plan.seq_len, plan.embed_dim, plan.ffn_dim) == (
        s.batch,
        s.seq,
        s.embed,
        s.ffn,
    )
    assert (plan.num_experts, plan.local_experts, plan.router.top_k) == (
        s.experts,
        s.experts,
        s.top_k,
    )
    # Every batch axis shards the batch (all of them here), so each device gets 1/devices.
    assert plan.batch_shards == devices
    assert plan.local_batch == s.batch // devices
    assert plan.local_tokens == s.batch // devices * s.seq
    assert plan.routed_rows == s.batch // devices * s.seq * s.top_k
    assert plan.local_tokens * plan.batch_shards == s.batch * s.seq
    assert plan.routed_rows * plan.batch_shards == s.batch * s.seq * s.top_k
    # ragged_dot (kernel xla) takes groups of any size: nothing is padded.
    assert plan.kernel.config is None and plan.experts.ffn_rows == plan.routed_rows
    assert (plan.router.score, plan.router.renormalize, plan.ffn.activation) == (
        s.score,
        s.renormalize,
        "swiglu",
    )
    assert (plan.param_dtype, plan.compute_dtype, plan.router_dtype) == (
        s.params,
        s.compute,
        "float32",
    )
    assert (plan.hardware, plan.kernel.name) == ("cpu", "xla")
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
    assert isinstance(plan.mesh.axes, tuple)
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
    assert back["mesh"]["axes"] == [list(item) for item in plan.mesh.axes]
    assert (back["kernel"]["name"], back["kernel"]["config"]) == ("xla", None)
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


def test_cpu_plan_has_no_tpu_fields(case) -> None:
    *_, plan = case
    assert (plan.hardware, plan.mesh.topology) == ("cpu", None)
    assert (plan.mesh.tpu_topology_name, plan.mesh.chips_per_host_bounds) == (None, None)
    assert (plan.kernel.name, plan.kernel.config) == ("xla", None)
    assert plan.kernel.check_vma
    assert plan.memory.hbm_bytes_per_device == 0


def test_one_slice_network_is_all_ici(case) -> None:
    """Without target.slices the mesh lies in one slice: every byte moves over ICI."""
    _, axes, _, plan = case
    net = plan.network
    assert plan.mesh.slices == net.slices == 1
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


@pytest.mark.parametrize("path", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_each_sub_plan_is_typed_and_the_kernel_has_only_its_backend_config(path) -> None:
    """Plan keeps identity and shapes; the router, FFN, mesh and kernel are sub-plans, and the
    kernel carries the config of its own backend only (pallas tiles, TE quantization)."""
    plan = make_plan(load_valid(path))
    kernel = plan.kernel
    # the config is its own kernel's type, built by that kernel's module (xla needs none)
    config = kernel.config
    assert (config is None) == (kernel.name == "xla")
    assert config is None or type(config).__module__ == f"moegen.kernels.{kernel.name}"
    for sub_plan in (plan.router, plan.ffn, plan.mesh, kernel):
        assert dataclasses.is_dataclass(sub_plan)
        with pytest.raises(dataclasses.FrozenInstanceError):
            sub_plan.__setattr__(dataclasses.fields(sub_plan)[0].name, None)
    assert len(dataclasses.fields(Plan)) < 40
