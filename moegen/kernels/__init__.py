"""The grouped-matmul kernels (target.kernel): one module each, one registry of them.

The logic lives in moegen.kernels.registry, moegen.kernels.base and each kernel's module; this
package face only re-exports.
"""

from __future__ import annotations

from moegen.kernels.base import (
    CudaLowering,
    Kernel,
    KernelConfig,
    KernelNotInstalled,
    KernelRule,
    MatmulQuantities,
    Preflight,
    RowPadding,
    TileRequest,
    TileShape,
)
from moegen.kernels.registry import (
    KERNEL_ALIASES,
    KERNEL_NAMES,
    KERNEL_RULES,
    KERNELS,
    kernel,
    kernel_is_registered,
    kernels_on,
)
from moegen.kernels.tiling import LANES, Tile, padded_rows

__all__ = [
    "KERNELS",
    "LANES",
    "KERNEL_ALIASES",
    "KERNEL_NAMES",
    "KERNEL_RULES",
    "CudaLowering",
    "Kernel",
    "KernelConfig",
    "KernelNotInstalled",
    "KernelRule",
    "MatmulQuantities",
    "Preflight",
    "RowPadding",
    "TileRequest",
    "Tile",
    "TileShape",
    "kernel",
    "kernel_is_registered",
    "kernels_on",
    "padded_rows",
]
