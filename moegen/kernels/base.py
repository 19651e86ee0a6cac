"""What every grouped-matmul kernel states about itself, in one typed record.

A kernel (spec field target.kernel) is one module of moegen/kernels/ holding a `Kernel`: the
rules that refuse specs it cannot run, the config the plan hands its template, what the CPU
twin runs in its place, what verification needs installed, and where it runs. The stages ask
the registry (moegen.kernels.registry) for these instead of comparing kernel names, so a new
kernel is one module, one line of the registry's table and its template.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from moegen.diagnostics import Diagnostic
from moegen.kernels.tiling import Tile
from moegen.load import FieldPath, LoadedSpec

KernelRule = Callable[[LoadedSpec], list[Diagnostic]]


@dataclass(frozen=True)
class MatmulQuantities:
    """The plan's numbers a kernel's config is built from: the plan decides them (rows, tiles,
    chunks), the kernel only lays them out as its template needs them."""

    rows: int  # rows of one grouped-matmul call, padding included
    ffn_rows: int  # rows of the expert groups in one call (the rest is padding)
    local_experts: int  # groups of one call
    tiles: tuple[Tile, Tile] | None  # (gate/up, down), where the layout tiles its calls
    forward_tiles: tuple[Tile, Tile] | None  # the whole forward pass's tiles of FFN slices
    overlap_chunks: int  # the ring's embedding chunks (1: nothing summed over chunks)
    chunk_width: int  # embedding columns of one overlap chunk
    accumulated_width: int  # gate/up output columns summed in place over the chunks
    interpret: bool  # kernels interpreted on CPU (the shrunken twin only)
    # the routed weights' dtype as the kernel reads them: the compute dtype, or float32 where
    # the kernel reads them as stored and casts each block (moegen.plan.weight_reads)
    weight_dtype: str


TileShape = tuple[int, int, int]  # (rows, contraction, output)


@dataclass(frozen=True)
class RowPadding:
    """How a kernel that runs in row tiles pads each call's rows."""

    padded_rows: int  # rows of one call, padding included
    row_alignment: int  # the row count is a multiple of this (every row tile)


@dataclass(frozen=True)
class KernelConfig:
    """What the plan hands a kernel's template, built by the kernel's module from the plan's
    numbers. Each kernel with a config subclasses it; the defaults below are a kernel's that
    takes groups of any size, untiled, summing nothing inside itself."""

    @property
    def call_tiles(self) -> tuple[TileShape, TileShape] | None:
        """The (gate/up, down) tiles of a kernel that runs in tiles."""
        return None

    @property
    def row_padding(self) -> RowPadding | None:
        """The row padding of a kernel that pads each call to whole row tiles."""
        return None

    @property
    def accumulates_in_kernel(self) -> bool:
        """The overlapped ring's partial sums are added inside the kernel, in place."""
        return False


@dataclass(frozen=True)
class TileRequest:
    """What a tiled kernel's tiles are chosen for: one call's rows and groups, and the widths
    of the gate/up and down projections as each call sees them."""

    rows: int  # rows of the expert groups in one call
    groups: int  # experts of one call
    gate_up_contraction: int  # embedding columns one gate/up call contracts (an overlap chunk)
    gate_up_width: int  # its output columns (gate and up side by side: twice one)
    down_contraction: int  # FFN columns one down call contracts (an FFN slice)
    ffn_chunks: int  # FFN slices (their down projections write float32, to be summed)
    # the weights' dtype as the kernels read them (float32: as stored, cast block by block)
    weight_dtype: str


@dataclass(frozen=True)
class Preflight:
    """What verification of the kernel needs installed, checked before any twin runs."""

    package: str  # the Python distribution that lowers the kernel
    fix: str  # how to install it: appended to the located message
    # what is missing for it, found without importing anything (empty: nothing)
    missing: Callable[[], list[str]] = lambda: []


class KernelNotInstalled(RuntimeError):
    """A kernel's package is missing or does not load; the message says how to install it."""


def _nothing_to_prepare(sm: int) -> None:
    return None


@dataclass(frozen=True)
class CudaLowering:
    """How verification finds the kernel in a program lowered for CUDA (no GPU needed)."""

    custom_call: str  # the custom call target of one launch of the kernel
    calls_per_site: int  # launches per grouped-matmul site with the backward (forward: one)
    quantizes: bool  # quantized programs hold its grouped quantize calls
    distributions: tuple[str, ...]  # whose versions a verdict on it depends on
    # the custom calls a verdict lists as the kernel's (its launches and their helpers)
    call_prefix: str = ""
    # XLA's own ragged dot beside it means an expert matmul bypassed the kernel
    excludes_ragged_dot: bool = False
    # imports its package as if every device had compute capability `sm` (process-wide: the
    # verify worker calls it in a process of its own); KernelNotInstalled where it cannot
    prepare: Callable[[int], Any] = _nothing_to_prepare


def _no_config(loaded: LoadedSpec, quantities: MatmulQuantities) -> None:
    return None


def _no_report_lines(config: KernelConfig) -> list[str]:
    return []


def _no_pinned_tile_problems(loaded: LoadedSpec, ffn_chunks: int) -> list[tuple[str, str]]:
    return []  # a kernel without tiles: validation refuses target.tiles for it


@dataclass(frozen=True)
class Kernel:
    """One grouped-matmul kernel, as every stage sees it."""

    name: str  # the value of target.kernel
    summary: str  # what it is, in a few words
    platforms: frozenset[str]  # hardware platforms it runs on ("cpu", "tpu", "gpu")
    # other tools' names for it: a spec that writes one is told this kernel's name
    aliases: tuple[str, ...] = ()
    # GPU compute capabilities (x10) it is built for; None: any the platforms allow
    cuda_sms: frozenset[int] | None = None
    # located refusals of specs it cannot run; validation runs every kernel's rules on every
    # spec (a rule may concern other kernels: the fields this one owns)
    rules: tuple[KernelRule, ...] = ()
    # its plan config (None: it needs none); plan.kernel.config holds it
    config: Callable[[LoadedSpec, MatmulQuantities], KernelConfig | None] = _no_config
    # the lines `moegen plan` prints about its config (none: nothing beyond its name)
    report_lines: Callable[[Any], list[str]] = _no_report_lines
    # its calls run in tiles: the plan asks for them (pinned by target.tiles, else chosen)
    # and pads rows to them; None: it takes groups of any size
    tiles: Callable[[LoadedSpec, TileRequest], tuple[Tile, Tile]] | None = None
    # (projection, problem) of each pinned tile that cannot run with so many FFN slices
    pinned_tile_problems: Callable[[LoadedSpec, int], list[tuple[str, str]]] = (
        _no_pinned_tile_problems
    )
    # embedding chunks and FFN slices are blocks of its calls: each a multiple of this width
    width_multiple: int = 1
    # the fields the CPU twin changes so that it runs (another kernel, smaller tiles)
    twin_overrides: Mapping[FieldPath, Any] = field(default_factory=lambda: MappingProxyType({}))
    # the CPU twin runs it itself, interpreted (Pallas's interpret mode), though it is no CPU
    # kernel
    interpreted_on_cpu: bool = False
    vma_unchecked_reason: str = ""  # why shard_map's varying-axes check is off around it
    # its calls leave the rows past the groups unwritten (no such row may reach a gradient)
    leaves_rows_unwritten: bool = False
    # it reads weights stored in the compute dtype where they lie (megablox's gmm): sliced,
    # no whole copy of them is made; XLA lays out ragged_dot's weights anew, a copy of every
    # one (the memory ledger, bench/LEDGER.md)
    reads_weights_in_place: bool = False
    # its forward and input-gradient calls can read float32 weights as stored and cast each
    # block to the compute dtype in VMEM (no compute-dtype copy of the weights is written);
    # its weight gradient then comes out in float32 (moegen.plan.weight_reads decides)
    casts_weight_blocks: bool = False
    preflight: Preflight | None = None  # what verification needs installed (None: nothing)
    # verified by lowering for CUDA without a GPU (None: compiled, or run, instead)
    cuda_lowering: CudaLowering | None = None

    @property
    def twin_kernel(self) -> str:
        """The kernel the CPU twin runs in this one's place (itself when it runs on CPU or is
        interpreted there)."""
        return self.twin_overrides.get(("target", "kernel"), self.name)

    def runs_on(self, platform: str, sm: int = 0) -> bool:
        """Whether it runs on a chip of `platform` (and compute capability `sm`, on a GPU)."""
        if platform not in self.platforms:
            return False
        return platform != "gpu" or self.cuda_sms is None or sm in self.cuda_sms
