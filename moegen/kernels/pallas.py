"""Kernel pallas: megablox gmm/tgmm, Pallas TPU kernels.

It owns the pinned tiles (target.tiles) and the megablox kernel model's use: the tile
arithmetic itself stays in moegen.tiling, a base module, because integer helpers below the
stages (moegen.sizes) read its lane width too. Its config lays out the tiles the plan chose
and the row padding they force; its CPU twin runs megablox interpreted with small tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

from moegen.diagnostics import Diagnostic
from moegen.hardware import hardware
from moegen.kernels.base import Kernel, MatmulQuantities
from moegen.load import LoadedSpec
from moegen.spec import Tiles
from moegen.tiling import LANES, Tile, accumulate_tile, projection_out_dtypes, tile_problems

# The twin runs megablox interpreted with small tiles: rows padded past a ragged last tile,
# contraction and output dimensions smaller than one tile (both masked by the kernel).
TWIN_TILE = [32, 128, 128]


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


def pallas_config(loaded: LoadedSpec, quantities: MatmulQuantities) -> PallasConfig:
    """The tiles the plan chose, the rows they pad to, and the in-place sum's tile."""
    assert quantities.tiles is not None  # the layout tiles every pallas call
    gate_up, down = quantities.tiles
    forward = quantities.forward_tiles
    return PallasConfig(
        gate_up_tile=gate_up.as_tuple(),
        down_tile=down.as_tuple(),
        forward_gate_up_tile=forward[0].as_tuple() if forward else None,
        forward_down_tile=forward[1].as_tuple() if forward else None,
        interpret=quantities.interpret,
        row_alignment=math.lcm(*(tile.rows for tile in (gate_up, down, *(forward or ())))),
        padded_rows=quantities.rows,
        pads_rows=quantities.rows > quantities.ffn_rows,
        accumulate_tile=_accumulate_tile(loaded, quantities, gate_up),
    )


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
    """A pinned tile must be lane/sublane aligned and fit the generation's scoped VMEM in each
    kernel it runs in (forward gmm, input-gradient gmm, weight-gradient tgmm), with the dtype
    its call writes: float32 for down in FFN slices and for gate/up in the overlapped ring."""
    spec = loaded.spec
    target = spec.target
    chip = hardware(target.hardware)
    if target.tiles is None or target.kernel != "pallas" or chip.platform != "tpu":
        return []  # kernel_runs_on_target reports tiles and pallas off TPU
    budget = chip.vmem_bytes_for_tiles
    outs = projection_out_dtypes(
        spec.dtypes.compute, spec.parallelism.overlap_chunks, spec.memory.ffn_chunks or 1
    )
    out = []
    for name, out_dtype in zip(("gate_up", "down"), outs, strict=True):
        values = getattr(target.tiles, name)
        if values is None:
            continue
        for problem in tile_problems(Tile(*values), spec.dtypes.compute, budget, out_dtype):
            out.append(loaded.diagnostic(("target", "tiles", name), problem))
    return out


PALLAS = Kernel(
    name="pallas",
    summary="megablox gmm/tgmm (TPU)",
    platforms=frozenset({"tpu"}),
    rules=(kernel_runs_on_target, pinned_tiles_run),
    config=pallas_config,
    takes_tiles=True,
    # a chunk of the embedding is a contraction block, a slice of the FFN an output block
    width_multiple=LANES,
    twin_overrides=MappingProxyType(
        {("target", "tiles"): Tiles(gate_up=TWIN_TILE, down=TWIN_TILE)}
    ),
    interpreted_on_cpu=True,
    vma_unchecked_reason="Pallas kernels carry no varying-axes types",
    # megablox leaves the rows past its groups unwritten, in the input gradient too (stale
    # memory on a TPU, NaN interpreted)
    leaves_rows_unwritten=True,
)
