"""Kernel pallas: megablox gmm/tgmm, Pallas TPU kernels.

It owns the pinned tiles (target.tiles) and the megablox kernel model's use: the tile
arithmetic itself is moegen.kernels.tiling (what a tile costs, whether it fits VMEM), which
the plan also asks when it slices the FFN. Its config lays out the tiles the plan chose
and the row padding they force; its CPU twin runs megablox interpreted with small tiles.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from moegen.diagnostics import Diagnostic
from moegen.hardware import hardware
from moegen.kernels.base import (
    Kernel,
    KernelConfig,
    MatmulQuantities,
    RowPadding,
    TileRequest,
    TileShape,
)
from moegen.kernels.tiling import (
    LANES,
    Tile,
    VmemBudget,
    choose_tile,
    projection_out_dtypes,
    shrink_to_fit,
    tile_problems,
)
from moegen.kernels.tiling_kernels import accumulate_tile, kernel_tiles
from moegen.load import LoadedSpec
from moegen.spec import Tiles

# The twin runs megablox interpreted with small tiles: rows padded past a ragged last tile,
# contraction and output dimensions smaller than one tile (both masked by the kernel).
TWIN_TILE = [32, 128, 128]

# The module's own gmm, reading float32 weights as stored, sets its scoped VMEM limit to this
# many times the compiler's default: at the default its contraction tile is cut and every
# row tile reads the float32 weights again (measured on one v5e chip, Qwen3-30B-A3B shapes:
# 14.80 / 43.75 ms forward / forward+backward within the default, 13.01 / 40.58 at twice it;
# bench/TPU_CHECK.md, run 4). Every TPU generation's VMEM holds twice the default limit.
CAST_VMEM_FACTOR = 2


def cast_vmem_limit(default_limit: int) -> int:
    """The scoped VMEM limit of the gmm that casts float32 weight blocks in VMEM."""
    return CAST_VMEM_FACTOR * default_limit


def kernel_budgets(default_limit: int, weight_dtype: str, compute_dtype: str) -> VmemBudget:
    """Each kernel's scoped VMEM limit (forward gmm, input-gradient gmm, weight-gradient
    tgmm): the compiler's default for all three, except where the weights are read as stored
    in another dtype than the compute one: the module's own gmm (forward and input gradient)
    then runs at its own limit, megablox's tgmm at the default."""
    if weight_dtype == compute_dtype:
        return default_limit
    cast = cast_vmem_limit(default_limit)
    return (cast, cast, default_limit)


@dataclass(frozen=True)
class PallasConfig(KernelConfig):
    """megablox gmm/tgmm (kernel pallas)."""

    gate_up_tile: tuple[int, int, int]  # (rows, contraction, output) of the forward gmm
    down_tile: tuple[int, int, int]
    # each projection's (input-gradient gmm, weight-gradient tgmm) tiles
    gate_up_backward: tuple[tuple[int, int, int], tuple[int, int, int]]
    down_backward: tuple[tuple[int, int, int], tuple[int, int, int]]
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
    # the float32 weights read as stored by the module's own gmm (_gmm_cast), which casts each
    # block in VMEM under this scoped VMEM limit, in bytes; None: megablox's gmm reads weights
    # in the compute dtype
    cast_vmem_limit: int | None = None

    @property
    def casts_weights(self) -> bool:
        return self.cast_vmem_limit is not None

    @property
    def defines_own_kernels(self) -> bool:
        """The module defines Pallas kernels of its own (_gmm_add, _gmm_cast) beside megablox's."""
        return self.accumulates_in_kernel or self.casts_weights

    @property
    def cast_vmem_limit_mib(self) -> int:
        """The cast gmm's scoped VMEM limit in MiB (0 where there is none)."""
        return (self.cast_vmem_limit or 0) // 2**20

    @property
    def kernel_tiles(self) -> dict[str, tuple[TileShape, TileShape, TileShape]]:
        """Each tiling constant the module defines: its projection's (forward, input-gradient,
        weight-gradient) tiles; a whole forward pass's (FFN slices) runs all three with its
        forward's (its gradient runs slice by slice, with the others)."""
        tiles = {
            "GATE_UP_TILING": (self.gate_up_tile, *self.gate_up_backward),
            "DOWN_TILING": (self.down_tile, *self.down_backward),
        }
        for name, tile in (
            ("FORWARD_GATE_UP_TILING", self.forward_gate_up_tile),
            ("FORWARD_DOWN_TILING", self.forward_down_tile),
        ):
            if tile is not None:
                tiles[name] = (tile, tile, tile)
        return tiles

    @property
    def call_tiles(self) -> tuple[TileShape, TileShape]:
        return self.gate_up_tile, self.down_tile

    @property
    def row_padding(self) -> RowPadding:
        return RowPadding(self.padded_rows, self.row_alignment)

    @property
    def accumulates_in_kernel(self) -> bool:
        return self.accumulate_tile is not None


def pallas_config(loaded: LoadedSpec, quantities: MatmulQuantities) -> PallasConfig:
    """The tiles the plan chose, the rows they pad to, and the in-place sum's tile."""
    assert quantities.tiles is not None  # the layout tiles every pallas call
    gate_up, down = quantities.tiles
    forward = quantities.forward_tiles
    return PallasConfig(
        gate_up_tile=gate_up.as_tuple(),
        down_tile=down.as_tuple(),
        gate_up_backward=_backward(gate_up),
        down_backward=_backward(down),
        forward_gate_up_tile=forward[0].as_tuple() if forward else None,
        forward_down_tile=forward[1].as_tuple() if forward else None,
        interpret=quantities.interpret,
        row_alignment=math.lcm(*(tile.rows for tile in (gate_up, down, *(forward or ())))),
        padded_rows=quantities.rows,
        pads_rows=quantities.rows > quantities.ffn_rows,
        accumulate_tile=_accumulate_tile(loaded, quantities, gate_up),
        cast_vmem_limit=_cast_vmem_limit(loaded, quantities),
    )


def _cast_vmem_limit(loaded: LoadedSpec, quantities: MatmulQuantities) -> int | None:
    """The cast gmm's scoped VMEM limit, where the kernels read the weights as stored."""
    spec = loaded.spec
    if quantities.weight_dtype == spec.dtypes.compute:
        return None
    return cast_vmem_limit(hardware(spec.target.hardware).vmem_bytes_for_tiles)


def _backward(tile: Tile) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The gradient kernels' tiles: the plan's own, else the forward's (pinned tiles)."""
    input_gradient, weight_gradient = tile.backward or (tile, tile)
    return input_gradient.as_tuple(), weight_gradient.as_tuple()


def pallas_report_lines(config: PallasConfig) -> list[str]:
    """`moegen plan`'s line of the tiles, and of the whole forward pass's where it has its own."""
    forward = (
        f"; the whole forward pass gate/up {list(config.forward_gate_up_tile)}, "
        f"down {list(config.forward_down_tile or ())}"
        if config.forward_gate_up_tile
        else ""
    )
    gradients = (
        f"; gradients: gate/up {_pair(config.gate_up_backward)}, down {_pair(config.down_backward)}"
        " (input gmm, weight tgmm)"
    )
    lines = [
        f"  megablox tiles  gate/up {list(config.gate_up_tile)}, down {list(config.down_tile)} "
        f"(rows, contraction, output){forward}{gradients}"
    ]
    if config.casts_weights:
        lines.append(
            "  weights        float32 read as stored: the module's own gmm casts each block in "
            f"VMEM ({config.cast_vmem_limit_mib} MiB scoped), tgmm writes float32 gradients"
        )
    return lines


def _pair(tiles: tuple[tuple[int, int, int], ...]) -> str:
    return " and ".join(str(list(tile)) for tile in tiles)


def _accumulate_tile(
    loaded: LoadedSpec, quantities: MatmulQuantities, gate_up: Tile
) -> tuple[int, int, int] | None:
    """Tiles of the in-place partial sums, where the ring sums gate/up over embedding chunks."""
    if quantities.overlap_chunks == 1:  # the "ring_overlapped" layout only
        return None
    spec = loaded.spec
    chip = hardware(spec.target.hardware)
    tile = accumulate_tile(
        gate_up,
        quantities.chunk_width,
        quantities.accumulated_width,
        spec.dtypes.compute,
        chip.vmem_bytes_for_tiles,
    )
    return tile.as_tuple()


def pallas_tiles(loaded: LoadedSpec, request: TileRequest) -> tuple[Tile, Tile]:
    """Megablox tiles for the gate/up calls and for down: pinned by the spec, else chosen.

    With overlap chunks the gate and up matmuls contract over one chunk of the embedding and
    write float32 (the chunks are summed); with FFN slices each matmul covers one slice of the
    FFN width, and the down projection writes float32 (the slices are summed). Gate and up side
    by side are one call of twice the width.
    """
    spec = loaded.spec
    chip = hardware(spec.target.hardware)
    compute = spec.dtypes.compute
    gate_up_out, down_out = projection_out_dtypes(
        compute, spec.parallelism.overlap_chunks, request.ffn_chunks
    )
    budgets = kernel_budgets(chip.vmem_bytes_for_tiles, request.weight_dtype, compute)
    choose = functools.partial(
        _choose_kernel_tiles,
        request.rows,
        dtype=compute,
        vmem_budget=budgets,
        weight_dtype=request.weight_dtype,
        groups=request.groups,
        peak_flops=chip.peak_bf16_flops_per_chip,
        hbm_bytes_per_s=chip.hbm_bytes_per_s_per_chip,
    )
    pinned = functools.partial(
        _pinned, dtype=compute, vmem_budget=budgets, weight_dtype=request.weight_dtype
    )
    tiles = spec.target.tiles
    gate_up = (
        pinned(tiles.gate_up, gate_up_out)
        if tiles and tiles.gate_up
        else choose(request.gate_up_contraction, request.gate_up_width, out_dtype=gate_up_out)
    )
    down = (
        pinned(tiles.down, down_out)
        if tiles and tiles.down
        else choose(request.down_contraction, spec.layer.routed_dim, out_dtype=down_out)
    )
    return gate_up, down


def _choose_kernel_tiles(
    rows: int, contraction: int, output: int, out_dtype: str, **chip: Any
) -> Tile:
    """The plan's row tile (choose_tile), then each kernel's own lane tiles at it."""
    tile = choose_tile(rows, contraction, output, out_dtype=out_dtype, **chip)
    return kernel_tiles(tile, rows, contraction, output, out_dtype=out_dtype, **chip)


def _pinned(
    tile: list[int], out_dtype: str, *, dtype: str, vmem_budget: VmemBudget, weight_dtype: str
) -> Tile:
    """A pinned tile, for all three kernels. Where the weights are read as stored in float32,
    the gmm calls run it at their own (doubled) limit, where it fits whenever it fits the
    default in the compute dtype; the weight gradient, written in float32, is narrowed until
    it fits the default limit (`shrink_to_fit`)."""
    pinned = Tile(*tile)
    if weight_dtype == dtype:
        return pinned
    weight_gradient = shrink_to_fit(pinned, dtype, vmem_budget, out_dtype, weight_dtype)
    return dataclasses.replace(pinned, backward=(pinned, weight_gradient))


def pinned_tile_problems(loaded: LoadedSpec, ffn_chunks: int) -> list[tuple[str, str]]:
    """(projection, problem) for each pinned tile that cannot run with `ffn_chunks` slices:
    lane/sublane aligned and within the generation's scoped VMEM in each kernel it runs in
    (forward gmm, input-gradient gmm, weight-gradient tgmm), with the dtype its call writes:
    float32 for down in FFN slices and for gate/up in the overlapped ring."""
    spec = loaded.spec
    pinned = spec.target.tiles
    if pinned is None:
        return []
    budget = hardware(spec.target.hardware).vmem_bytes_for_tiles
    outs = projection_out_dtypes(spec.dtypes.compute, spec.parallelism.overlap_chunks, ffn_chunks)
    problems = []
    for name, out in zip(("gate_up", "down"), outs, strict=True):
        tile = getattr(pinned, name)
        if tile:
            for problem in tile_problems(Tile(*tile), spec.dtypes.compute, budget, out):
                problems.append((name, problem))
    return problems


def kernel_runs_on_target(loaded: LoadedSpec) -> list[Diagnostic]:
    """Pallas megablox kernels are TPU kernels; pinned tiles only mean something to them."""
    target = loaded.spec.target
    out = []
    if target.kernel == "pallas" and hardware(target.hardware).platform != "tpu":
        out.append(
            loaded.diagnostic(
                ("target", "kernel"),
                f"kernel pallas (megablox) runs on TPU targets only, not {target.hardware}; "
                "use kernel: xla",
            )
        )
    if target.tiles is not None and target.kernel != "pallas":
        out.append(
            loaded.diagnostic(
                ("target", "tiles"), at_key=True, message="tiles apply to kernel pallas only"
            )
        )
    return out


def pinned_tiles_run(loaded: LoadedSpec) -> list[Diagnostic]:
    """A pinned tile runs in every kernel of the spec's FFN slices (pinned_tile_problems)."""
    spec = loaded.spec
    target = spec.target
    if target.tiles is None or target.kernel != "pallas":
        return []  # kernel_runs_on_target reports tiles under another kernel
    if hardware(target.hardware).platform != "tpu":
        return []  # and pallas off TPU
    return [
        loaded.diagnostic(("target", "tiles", name), problem)
        for name, problem in pinned_tile_problems(loaded, spec.memory.ffn_chunks or 1)
    ]


PALLAS = Kernel(
    name="pallas",
    summary="megablox gmm/tgmm (TPU)",
    aliases=("megablox",),
    platforms=frozenset({"tpu"}),
    rules=(kernel_runs_on_target, pinned_tiles_run),
    config=pallas_config,
    report_lines=pallas_report_lines,
    tiles=pallas_tiles,
    pinned_tile_problems=pinned_tile_problems,
    # a chunk of the embedding is a contraction block, a slice of the FFN an output block
    width_multiple=LANES,
    twin_overrides=MappingProxyType(
        {("target", "tiles"): Tiles(gate_up=TWIN_TILE, down=TWIN_TILE)}
    ),
    interpreted_on_cpu=True,
    casts_weight_blocks=True,
    vma_unchecked_reason="Pallas kernels carry no varying-axes types",
    # megablox leaves the rows past its groups unwritten, in the input gradient too (stale
    # memory on a TPU, NaN interpreted)
    leaves_rows_unwritten=True,
    reads_weights_in_place=True,
)
