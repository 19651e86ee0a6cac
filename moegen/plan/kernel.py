"""The kernel's plan: which grouped matmul runs the experts, with a typed config per backend
(megablox tiles and row padding for pallas; quantization and group alignment for Transformer
Engine; the Mosaic GPU implementation and SM of tokamax; the portable xla kernel has none), and
whether shard_map checks varying axes around it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from moegen.hardware import hardware
from moegen.load import LoadedSpec
from moegen.plan.experts import ExpertPlan
from moegen.plan.ffn import FfnLayout, local_ffn_dim
from moegen.plan.prose import vma_unchecked_reason
from moegen.tiling import Tile, accumulate_tile, round_up

# Transformer Engine's grouped GEMM: every expert's rows fill a multiple of this many rows
# when quantized (cuBLAS FP8 contracts over rows in the weight gradient in 16s; TE's SM 100
# MXFP8 kernels scale 32-row blocks and want 128 when every dimension is a multiple of 128).
TE_GROUP_ALIGN = {"none": 1, "fp8": 16, "mxfp8": 128}


@dataclass(frozen=True)
class PallasConfig:
    """megablox gmm/tgmm (kernel pallas)."""

    gate_up_tile: tuple[int, int, int]  # (rows, contraction, output)
    down_tile: tuple[int, int, int]
    # FFN slices whose forward pass runs whole: that pass's tiles (None otherwise)
    forward_gate_up_tile: tuple[int, int, int] | None
    forward_down_tile: tuple[int, int, int] | None
    interpret: bool  # kernels interpreted on CPU (the shrunken twin only)
    row_alignment: int  # a call's row count is a multiple of this (every row tile)
    padded_rows: int  # rows of one grouped-matmul call including the padding
    pads_rows: bool  # padded_rows > FFN_ROWS: the kernel gets rows of no expert group
    # the overlapped ring's kernel that adds a chunk's gate/up product into the float32 sum in
    # place (input_output_aliases); None where nothing is summed over chunks
    accumulate_tile: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class TeConfig:
    """Transformer Engine's grouped GEMM (kernel te, CUDA GPUs)."""

    quantization: str  # "none" | "fp8" | "mxfp8"
    group_align: int  # every expert's rows fill a multiple of this in the GEMM
    aligned_rows: int  # rows of the group-aligned GEMM buffer (quantized)
    cuda_sm: int | None  # compute capability x 10 (TE is traced for it)


@dataclass(frozen=True)
class TokamaxConfig:
    """tokamax's ragged_dot (kernel tokamax, CUDA GPUs): its Pallas Mosaic GPU kernels, forward
    and both backward products (tokamax's own VJP), in the compute dtype."""

    implementation: str  # tokamax's name of the kernel family: "mosaic_gpu"
    cuda_sm: int  # compute capability x 10 the kernels are traced for (validated: 90)


@dataclass(frozen=True)
class KernelPlan:
    """The grouped-matmul kernel; exactly the config of its backend is set."""

    name: str  # "xla" | "pallas" | "te" | "tokamax"
    check_vma: bool  # shard_map's varying-axes check; off around Pallas calls and erf
    vma_unchecked_reason: str  # why it is off ('' when on)
    pallas: PallasConfig | None
    te: TeConfig | None
    tokamax: TokamaxConfig | None = None
    # megablox leaves the rows past its groups unwritten, in the input gradient too (stale
    # memory on a TPU, NaN interpreted): nothing of those rows may reach a gradient. Rows
    # gathered from the tokens are selected away, and the rows' biases are gathered with an
    # index past the experts (filled with 0, its gradient dropped), or the gathers'
    # transposes add that memory into the tokens' and the biases' gradients.
    leaves_rows_unwritten: bool = False

    @property
    def accumulates_in_kernel(self) -> bool:
        """The overlapped ring's partial sums are added inside the kernel, in place."""
        return self.pallas is not None and self.pallas.accumulate_tile is not None


def kernel_plan(
    loaded: LoadedSpec, layout: FfnLayout, experts: ExpertPlan, *, interpret: bool
) -> KernelPlan:
    """The kernel of a validated spec for its chosen FFN layout (`interpret`: Pallas on CPU)."""
    spec = loaded.spec
    name = spec.target.kernel
    reason = vma_unchecked_reason(loaded)
    return KernelPlan(
        name=name,
        check_vma=not reason,
        vma_unchecked_reason=reason,
        pallas=_pallas_config(loaded, layout, experts, interpret) if name == "pallas" else None,
        te=_te_config(loaded, layout, experts) if name == "te" else None,
        tokamax=_tokamax_config(loaded) if name == "tokamax" else None,
        leaves_rows_unwritten=name == "pallas",
    )


def _pallas_config(
    loaded: LoadedSpec, layout: FfnLayout, experts: ExpertPlan, interpret: bool
) -> PallasConfig:
    assert layout.tiles is not None  # the layout tiles every pallas call
    gate_up, down = layout.tiles
    forward = layout.forward_layout.tiles if layout.forward_layout else None
    return PallasConfig(
        gate_up_tile=gate_up.as_tuple(),
        down_tile=down.as_tuple(),
        forward_gate_up_tile=forward[0].as_tuple() if forward else None,
        forward_down_tile=forward[1].as_tuple() if forward else None,
        interpret=interpret,
        row_alignment=math.lcm(*(tile.rows for tile in (*layout.tiles, *(forward or ())))),
        padded_rows=layout.rows,
        pads_rows=layout.rows > experts.ffn_rows,
        accumulate_tile=_accumulate_tile(loaded, layout, experts, gate_up),
    )


def _accumulate_tile(
    loaded: LoadedSpec, layout: FfnLayout, experts: ExpertPlan, gate_up: Tile
) -> tuple[int, int, int] | None:
    """Tiles of the in-place partial sums, where the ring sums gate/up over embedding chunks."""
    spec = loaded.spec
    if experts.overlap_chunks == 1:  # the "ring_overlapped" layout only
        return None
    width = local_ffn_dim(spec) // layout.chunks * (2 if layout.fused else 1)
    chip = hardware(spec.target.hardware)
    tile = accumulate_tile(
        gate_up, experts.chunk_width, width, spec.dtypes.compute, chip.vmem_bytes_for_tiles
    )
    return tile.as_tuple()


def _te_config(loaded: LoadedSpec, layout: FfnLayout, experts: ExpertPlan) -> TeConfig:
    spec = loaded.spec
    chip = hardware(spec.target.hardware)
    align = TE_GROUP_ALIGN[spec.target.quantization]
    return TeConfig(
        quantization=spec.target.quantization,
        group_align=align,
        aligned_rows=round_up(layout.rows + experts.local_experts * (align - 1), align),
        cuda_sm=chip.sm if chip.platform == "gpu" else None,
    )


def _tokamax_config(loaded: LoadedSpec) -> TokamaxConfig:
    # Named explicitly: tokamax's "mosaic" picks the TPU kernels unless the default device is
    # an NVIDIA GPU, and its default list falls back to XLA where the GPU kernel refuses.
    return TokamaxConfig(
        implementation="mosaic_gpu", cuda_sm=hardware(loaded.spec.target.hardware).sm
    )
