"""`moegen.plan.mesh`: the plan predicts when jax.make_mesh cannot lay a mesh out on a TPU
slice's torus (its greedy search, mirrored in plain integers, against mesh_utils itself on every
mesh of every catalogued slice shape), and the module then builds the mesh with physical axes
split, which jax lays out for every mesh that spans the slice."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from conftest import EXAMPLE_SPECS
from jax._src import mesh_utils
from spec_builder import spec_yaml, validated

from moegen.hardware import CATALOGUE, hardware
from moegen.load import load_spec
from moegen.plan import format_plan, make_plan
from moegen.plan.mesh import lays_out_on_whole_axes, physical_mesh_shape
from moegen.render import render
from moegen.validate import validate


class FakeDevice:
    """What mesh_utils reads of a device while it assigns axes: its kind (tpu7x's core axis
    ranks first)."""

    def __init__(self, kind: str) -> None:
        self.device_kind = kind


def meshes(devices: int, max_axes: int = 3) -> list[tuple[int, ...]]:
    """Every mesh shape of 1 to `max_axes` axes of size > 1 with `devices` devices."""
    factors = [d for d in range(2, devices + 1) if devices % d == 0]
    shapes = []
    for count in range(1, max_axes + 1):
        for shape in itertools.product(factors, repeat=count):
            if math.prod(shape) == devices:
                shapes.append(shape)
    return shapes


def jax_lays_out(physical: tuple[int, ...], shape: tuple[int, ...], kind: str) -> bool:
    grid = np.empty(physical, dtype=object)
    for index in np.ndindex(physical):
        grid[index] = FakeDevice(kind)
    try:
        mesh_utils._create_device_mesh_for_nd_torus(grid, shape, allow_split_physical_axes=False)
    except NotImplementedError:
        return False
    return True


def jax_lays_out_split(physical: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    grid = np.arange(math.prod(physical)).reshape(physical)
    mesh, _ = mesh_utils._create_device_mesh_for_nd_torus(
        grid, shape, allow_split_physical_axes=True
    )
    return sorted(mesh.flat) == list(range(grid.size))  # every device once


SLICES = [
    (name, topology)
    for name, chip in CATALOGUE.items()
    if chip.platform == "tpu"
    for topology in chip.topologies
    if chip.devices(topology) <= 256
]


@pytest.mark.parametrize(("name", "topology"), SLICES)
def test_whole_axes_search_agrees_with_mesh_utils(name: str, topology: str) -> None:
    chip = hardware(name)
    physical = physical_mesh_shape(chip, topology)
    kind = "TPU7x" if name == "tpu7x" else "TPU v6 lite"
    for shape in meshes(chip.devices(topology)):
        expected = jax_lays_out(physical, shape, kind)
        assert lays_out_on_whole_axes(physical, shape) == expected, (physical, shape)
        # split allowed, mesh_utils lays out every mesh of the slice's size (the module docstring
        # of moegen.plan.mesh says why): no spanning mesh has to be refused for its layout
        assert jax_lays_out_split(physical, shape), (physical, shape)


def test_physical_shapes() -> None:
    assert physical_mesh_shape(hardware("tpu-v6e"), "4x4") == (4, 4, 1)
    assert physical_mesh_shape(hardware("tpu-v5p"), "2x2x4") == (2, 2, 4)
    assert physical_mesh_shape(hardware("tpu7x"), "2x2x1") == (2, 2, 1, 2)  # two cores a chip


def test_the_reported_mesh_needs_a_split() -> None:
    """data 2 x fsdp 2 x expert 4 on a 4x4 torus: expert takes one physical 4, no whole 2 left."""
    assert not lays_out_on_whole_axes((4, 4, 1), (2, 2, 4))
    assert lays_out_on_whole_axes((4, 4, 1), (4, 4))
    assert lays_out_on_whole_axes((2, 4, 1), (2, 4))


def v6e_4x4(**choices) -> str:
    base = {
        "experts": 16,
        "embed": 4096,
        "ffn": 6400,
        "top_k": 2,
        "batch": 16,
        "seq_len": 4096,
        "compute_dtype": "bfloat16",
        "axes": {"data": 2, "fsdp": 2, "expert": 4},
        "strategy": "ragged_all_to_all",
        "hardware": "tpu-v6e",
        "topology": "4x4",
        "kernel": "pallas",
    }
    return spec_yaml(base | choices)


def test_plan_splits_where_make_mesh_would_raise_and_the_module_says_so() -> None:
    loaded = validated(v6e_4x4(), "phi.yaml", "phi")
    plan = make_plan(loaded)
    assert plan.mesh.splits_physical_axes
    source = render(plan)
    assert "mesh_utils.create_device_mesh(MESH_SHAPE, devices, allow_split_physical_axes=True)" in (
        source
    )
    assert "jax.make_mesh(" not in source
    assert "; physical axes split (no whole ones fit)" in format_plan(plan)  # moegen plan
    # the same layer on a mesh of whole physical axes keeps jax.make_mesh
    whole = make_plan(validated(v6e_4x4(axes={"fsdp": 4, "expert": 4}), "w.yaml", "w"))
    assert not whole.mesh.splits_physical_axes
    assert "jax.make_mesh(MESH_SHAPE, MESH_AXES, devices=devices)" in render(whole)


def test_multislice_meshes_split_inside_each_slice() -> None:
    """Two v6e 4x4 slices, data over the data-center network: each slice holds fsdp 2 x expert
    4 x data 2 (the in-slice part of data), which needs a split as well."""
    text = v6e_4x4(
        axes={"data": 4, "fsdp": 2, "expert": 4},
        dcn_axes={"data": 2},
        slices=2,
        batch=32,
    )
    plan = make_plan(validated(text, "two.yaml", "two"))
    assert plan.network.ici_mesh_shape == (2, 2, 4)
    assert plan.mesh.splits_physical_axes and plan.mesh.multislice
    assert "allow_split_physical_axes=True" in render(plan)


@pytest.mark.parametrize("path", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_example_meshes_lay_out_on_whole_axes(path) -> None:
    """No committed example needs a split (their modules keep jax.make_mesh)."""
    assert not make_plan(validate(load_spec(path))).mesh.splits_physical_axes
