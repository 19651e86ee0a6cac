"""The hardware catalogue: plain data about every compile target moegen knows.

Figures are the datasheet leads (bf16 dense peak) collected in the project's hardware reference
(shared/reference/hardware-and-roofline.md); the per-generation pages of Google Cloud's TPU
documentation (cloud.google.com/tpu/docs/v5e, v5p, v6e, tpu7x) are where they come from.
Topologies are the slice shapes Google Cloud offers for each generation; tpu7x shows JAX two
devices per chip. NVIDIA GPUs (datasheet SXM figures: dense bf16 peak, HBM, NVLink) come with
their CUDA compute capability (`sm`: 80 Ampere, 90 Hopper, 100 Blackwell), which decides the
Transformer Engine features they have; their topologies are GPU counts, "N" inside one
NVLink node of up to 8, or "NODESx8". Scoped VMEM budgets are the compiler's default limit
of one kernel per generation (libtpu 0.0.51's CompileTimeScopedVmemOom names it: 16 MiB on v5e
and v5p, 32 MiB on v6e and tpu7x). TPU HBM is counted in GiB, as the TPU compiler counts it
(datasheets write "16 GB" for v5e's 16 GiB; libtpu reports 15.75 GiB of it available to a
program); GPU HBM in the datasheets' GB.

What the TPU compiler grants one program is less than the HBM (a reserve of its own): the
figure its out-of-HBM refusal names, "exceeds available HBM (15.75G)", read from libtpu 0.0.51
(the pinned version) on a layer too big for each generation (COMPILER_HBM_GIB).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    """One compile target."""

    name: str  # as written in specs: target.hardware
    platform: str  # "cpu" | "tpu" | "gpu"
    topology_prefix: str  # libtpu's name for the generation, as in "v5e:2x4"
    devices_per_chip: int
    hbm_bytes_per_chip: int
    peak_bf16_flops_per_chip: float
    hbm_bytes_per_s_per_chip: float
    ici_bytes_per_s_per_chip: float  # bidirectional
    topologies: tuple[str, ...]  # valid slice shapes, e.g. "2x4" or "2x2x1"
    vmem_bytes_for_tiles: int  # the compiler's scoped VMEM limit of one kernel (libtpu names it)
    sm: int = 0  # CUDA compute capability x 10 (GPUs only)

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.hbm_bytes_per_chip // max(self.devices_per_chip, 1)

    @property
    def compiler_hbm_bytes_per_device(self) -> int:
        """The HBM the compiler lets one program use (TPU), else all of it."""
        granted = COMPILER_HBM_GIB.get(self.name)
        return int(granted * GIB) if granted else self.hbm_bytes_per_device

    def chips(self, topology: str) -> int:
        count = 1
        for dim in topology.split("x"):
            count *= int(dim)
        return count

    def devices(self, topology: str) -> int:
        return self.chips(topology) * self.devices_per_chip

    def chips_per_host_bounds(self, topology: str) -> tuple[int, int, int]:
        """How libtpu splits the slice into hosts (compile-only devices need it)."""
        dims = [int(d) for d in topology.split("x")] + [1]
        if len(topology.split("x")) == 2:  # v5e / v6e: hosts of up to 2x4 chips
            return (min(dims[0], 2), min(dims[1], 4), 1)
        return (min(dims[0], 2), min(dims[1], 2), 1)  # v5p / tpu7x: hosts of 2x2x1 chips


_PLANAR = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
_CUBIC = (
    "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8",
    "8x8x16", "8x16x16", "16x16x16", "16x16x24",
)  # fmt: skip
_MIB = 2**20

CATALOGUE: dict[str, Hardware] = {
    "cpu": Hardware("cpu", "cpu", "", 1, 0, 0.0, 0.0, 0.0, (), 0),
    "tpu-v5e": Hardware(
        "tpu-v5e", "tpu", "v5e", 1, 16 * GIB, 197e12, 819e9, 400e9, _PLANAR, 16 * _MIB
    ),
    "tpu-v5p": Hardware(
        "tpu-v5p", "tpu", "v5p", 1, 95 * GIB, 459e12, 2765e9, 1200e9, _CUBIC, 16 * _MIB
    ),
    "tpu-v6e": Hardware(
        "tpu-v6e", "tpu", "v6e", 1, 32 * GIB, 918e12, 1638e9, 800e9, _PLANAR, 32 * _MIB
    ),
    "tpu7x": Hardware(
        "tpu7x", "tpu", "tpu7x", 2, 192 * GIB, 2307e12, 7380e9, 1200e9, _CUBIC[:9], 32 * _MIB
    ),
}

# What the TPU compiler grants one program, GiB per device (libtpu 0.0.51's own figure).
COMPILER_HBM_GIB = {"tpu-v5e": 15.75, "tpu-v5p": 95.73, "tpu-v6e": 31.24, "tpu7x": 94.74}


_GPU_TOPOLOGIES = ("1", "2", "4", "8", "2x8", "4x8", "8x8", "16x8", "32x8")
CATALOGUE |= {
    "gpu-a100": Hardware(
        "gpu-a100", "gpu", "", 1, 80 * GB, 312e12, 2039e9, 600e9, _GPU_TOPOLOGIES, 0, sm=80
    ),
    "gpu-h100": Hardware(
        "gpu-h100", "gpu", "", 1, 80 * GB, 989e12, 3350e9, 900e9, _GPU_TOPOLOGIES, 0, sm=90
    ),
    "gpu-h200": Hardware(
        "gpu-h200", "gpu", "", 1, 141 * GB, 989e12, 4800e9, 900e9, _GPU_TOPOLOGIES, 0, sm=90
    ),
    "gpu-b200": Hardware(
        "gpu-b200", "gpu", "", 1, 192 * GB, 2250e12, 8000e9, 1800e9, _GPU_TOPOLOGIES, 0, sm=100
    ),
}


def hardware(name: str) -> Hardware:
    return CATALOGUE[name]
