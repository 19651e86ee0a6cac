"""The kernel's plan: which grouped matmul runs the experts, with its typed config (built by the
kernel's module from the plan's numbers: tiles and row padding, quantization, the GPU it is
traced for; a kernel without any has none), and whether shard_map checks varying axes
around it."""

from __future__ import annotations

from dataclasses import dataclass

from moegen.kernels import KernelConfig, MatmulQuantities, RowPadding, TileShape, kernel
from moegen.load import LoadedSpec
from moegen.plan.experts import ExpertPlan
from moegen.plan.ffn import FfnLayout
from moegen.plan.ffn_buffers import local_ffn_dim
from moegen.plan.prose import tested_with, vma_unchecked_reason


@dataclass(frozen=True)
class KernelPlan:
    """The grouped-matmul kernel and its module's config (templates read p.kernel.config)."""

    name: str  # a registered kernel (moegen.kernels.KERNEL_NAMES)
    check_vma: bool  # shard_map's varying-axes check; off around Pallas calls and erf
    vma_unchecked_reason: str  # why it is off ('' when on)
    config: KernelConfig | None = None  # None: the kernel needs none
    # megablox leaves the rows past its groups unwritten, in the input gradient too (stale
    # memory on a TPU, NaN interpreted): nothing of those rows may reach a gradient. Rows
    # gathered from the tokens are selected away, and the rows' biases are gathered with an
    # index past the experts (filled with 0, its gradient dropped), or the gathers'
    # transposes add that memory into the tokens' and the biases' gradients.
    leaves_rows_unwritten: bool = False
    # the versions a module of this kernel on this target is tested with (its docstring)
    tested_with: str = ""

    @property
    def tiles(self) -> tuple[TileShape, TileShape] | None:
        """The (gate/up, down) tiles of a kernel that runs in tiles (None: groups of any size)."""
        return self.config.call_tiles if self.config else None

    @property
    def row_padding(self) -> RowPadding | None:
        """How a kernel that pads each call's rows to whole row tiles pads them; None where
        the kernel takes groups of any size."""
        return self.config.row_padding if self.config else None

    @property
    def accumulates_in_kernel(self) -> bool:
        """The overlapped ring's partial sums are added inside the kernel, in place."""
        return self.config is not None and self.config.accumulates_in_kernel


def kernel_plan(
    loaded: LoadedSpec, layout: FfnLayout, experts: ExpertPlan, *, interpret: bool
) -> KernelPlan:
    """The kernel of a validated spec for its chosen FFN layout (`interpret`: Pallas on CPU)."""
    chosen = kernel(loaded.spec.target.kernel)
    reason = vma_unchecked_reason(loaded)
    config = chosen.config(loaded, _quantities(loaded, layout, experts, interpret))
    return KernelPlan(
        name=chosen.name,
        check_vma=not reason,
        vma_unchecked_reason=reason,
        config=config,
        leaves_rows_unwritten=chosen.leaves_rows_unwritten,
        tested_with=tested_with(loaded.spec.target.hardware),
    )


def _quantities(
    loaded: LoadedSpec, layout: FfnLayout, experts: ExpertPlan, interpret: bool
) -> MatmulQuantities:
    """The plan's numbers a kernel's config is built from."""
    forward = layout.forward_layout.tiles if layout.forward_layout else None
    return MatmulQuantities(
        rows=layout.rows,
        ffn_rows=experts.ffn_rows,
        local_experts=experts.local_slots,
        tiles=layout.tiles,
        forward_tiles=forward,
        overlap_chunks=experts.overlap_chunks,
        chunk_width=experts.chunk_width,
        # the gate/up output summed in place: one FFN slice's columns, twice side by side
        accumulated_width=local_ffn_dim(loaded.spec) // layout.chunks * (2 if layout.fused else 1),
        interpret=interpret,
        weight_dtype=layout.weight_dtype,
    )
