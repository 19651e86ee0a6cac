"""The mesh's plan (`MeshPlan`), and how the logical mesh lays out on a TPU slice's torus:
whether each axis gets whole physical axes.

`jax.make_mesh` maps every logical axis, most communication-heavy (last) first, onto a set of
whole physical axes of the slice whose sizes multiply to it (jax.experimental.mesh_utils,
`_create_device_mesh_for_nd_torus`); where the greedy search finds none it raises
NotImplementedError, except on v5e, where it lets axes share ("split") a physical axis. A
data 2 x fsdp 2 x expert 4 mesh on a v6e 4x4 slice is such a mesh: expert takes one physical 4,
and no whole physical axis of 2 is left for fsdp. The plan runs the same search here, in plain
integers, and when it fails the module builds its mesh with `mesh_utils.create_device_mesh(...,
allow_split_physical_axes=True)`.

With splitting allowed every mesh that spans the slice lays out: mesh_utils then assigns each
prime factor of a logical axis to a physical axis that still has that factor left, and a mesh
with as many devices as the slice has exactly the slice's prime factors. So no spanning mesh is
refused for its layout; only the bandwidth of the shared physical axes differs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from moegen.hardware import Hardware, hardware
from moegen.load import LoadedSpec
from moegen.plan.network import NetworkPlan
from moegen.sizes import axes_product


@dataclass(frozen=True)
class MeshPlan:
    """The device mesh: its axes, what each shards, the slices and how they lay out."""

    axes: tuple[tuple[str, int], ...]
    num_devices: int
    batch_axes: tuple[str, ...]
    token_axes: tuple[str, ...]  # every axis the tokens are split over: batch, then sequence
    fsdp_axis: str | None
    tensor_axis: str | None  # splits the experts' FFN width; None: whole on every device
    tensor_shards: int
    sequence_axis: str | None  # splits each sequence (x's dimension 1); None: whole
    sequence_shards: int
    token_axes_name: str  # the module constant naming token_axes: BATCH_AXES or TOKEN_AXES
    local_seq_len_name: str  # the constant of a device's sequence length: SEQ_LEN or LOCAL_SEQ_LEN
    routing_axes_name: str  # the constant of the axes routing varies over: MESH_AXES, or
    # ROUTING_AXES (all but tensor: every tensor shard routes the same tokens)
    expert_axis: str | None  # seam for expert parallelism; None: experts replicated
    topology: str | None
    tpu_topology_name: str | None  # libtpu's name, e.g. "v5e:2x4"
    slices: int  # TPU slices joined by the data-center network (1: one slice)
    multislice: bool  # slices > 1: the mesh is built per slice and across slices
    devices_per_slice: int
    splits_physical_axes: bool  # some mesh axis shares a physical axis of the torus with another
    chips_per_host_bounds: tuple[int, int, int] | None


def mesh_plan(loaded: LoadedSpec, expert_axis: str | None, network: NetworkPlan) -> MeshPlan:
    """The mesh of a validated spec (`expert_axis` from the expert plan, the in-slice mesh
    shape from the network plan)."""
    spec = loaded.spec
    chip = hardware(spec.target.hardware)
    axes = dict(spec.mesh.axes)
    devices = axes_product(axes, axes)
    tpu = chip.platform == "tpu"
    topology = spec.target.topology
    return MeshPlan(
        axes=tuple(axes.items()),
        num_devices=devices,
        batch_axes=spec.batch_axes,
        token_axes=spec.batch_axes + (("sequence",) if "sequence" in axes else ()),
        fsdp_axis="fsdp" if "fsdp" in axes else None,
        tensor_axis="tensor" if "tensor" in axes else None,
        tensor_shards=spec.tensor_shards,
        sequence_axis="sequence" if "sequence" in axes else None,
        sequence_shards=spec.sequence_shards,
        token_axes_name="TOKEN_AXES" if "sequence" in axes else "BATCH_AXES",
        local_seq_len_name="LOCAL_SEQ_LEN" if "sequence" in axes else "SEQ_LEN",
        routing_axes_name="ROUTING_AXES" if "tensor" in axes else "MESH_AXES",
        expert_axis=expert_axis,
        topology=topology,
        tpu_topology_name=f"{chip.topology_prefix}:{topology}" if tpu else None,
        slices=spec.target.slices,
        multislice=spec.target.slices > 1,
        devices_per_slice=devices // spec.target.slices,
        splits_physical_axes=tpu
        and topology is not None
        and not lays_out_on_whole_axes(physical_mesh_shape(chip, topology), network.ici_mesh_shape),
        chips_per_host_bounds=chip.chips_per_host_bounds(topology) if tpu else None,
    )


def physical_mesh_shape(chip: Hardware, topology: str) -> tuple[int, ...]:
    """The slice's devices as mesh_utils arranges them: (x, y, z), and a core axis where a chip
    shows JAX two devices (tpu7x). A planar topology "AxB" is (A, B, 1)."""
    dims = [int(d) for d in topology.split("x")]
    dims += [1] * (3 - len(dims))
    return tuple(dims) + ((chip.devices_per_chip,) if chip.devices_per_chip > 1 else ())


def lays_out_on_whole_axes(physical: tuple[int, ...], mesh_shape: tuple[int, ...]) -> bool:
    """Whether mesh_utils' greedy search gives every logical axis a set of whole physical axes.

    Logical axes from the last (most communication) to the first; for each, subsets of the
    physical axes not yet taken, the most axes first and in itertools' order (on a chip with a
    core axis, subsets holding it first: mesh_utils ranks that axis's bandwidth highest); the
    first subset whose sizes multiply to the axis's size takes it. A logical axis of size 1
    needs none.
    """
    free = list(physical)
    with_cores = len(physical) == 4
    for size in reversed(mesh_shape):
        found = None
        for count in range(len(free), 0, -1):
            subsets = list(itertools.combinations(range(len(free)), count))
            if with_cores:
                # mesh_utils' priorities: core axis 0, then x, y, z (1, 2, 3)
                rank = {0: 1, 1: 2, 2: 3, 3: 0}
                subsets.sort(key=lambda s: (min(rank[i] for i in s), sum(rank[i] for i in s)))
            found = next((s for s in subsets if math.prod(free[i] for i in s) == size), None)
            if found is not None:
                break
        if found is None:
            if size > 1:
                return False
            continue
        for i in found:
            free[i] = 0  # taken: no later product can use it
    return True
