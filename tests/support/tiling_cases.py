"""The VMEM budgets, dtypes and the choose_tile call shared by the tests of `moegen.kernels.tiling`."""

from __future__ import annotations

from moegen.hardware import CATALOGUE
from moegen.kernels.pallas import kernel_budgets
from moegen.kernels.tiling import Tile, VmemBudget, choose_tile
from moegen.kernels.tiling_kernels import kernel_tiles

MIB = 2**20
DTYPES = ["bfloat16", "float32"]
BUDGETS = {name: hw.vmem_bytes_for_tiles for name, hw in CATALOGUE.items() if hw.platform == "tpu"}


def budgets_of(hw: str, dtype: str, weight_dtype: str | None = None) -> VmemBudget:
    """Each kernel's scoped VMEM limit on `hw`, as the pallas kernel's module sets them."""
    return kernel_budgets(CATALOGUE[hw].vmem_bytes_for_tiles, weight_dtype or dtype, dtype)


def choose_per_kernel(
    rows: int, k: int, n: int, dtype: str, hw: str, groups: int = 8, weight_dtype: str | None = None
) -> Tile:
    """What the plan takes where nothing is pinned: choose_tile's row tile, then each
    kernel's own lane tiles at it (the forward's, carrying the gradients' as Tile.backward),
    with the weights read in `weight_dtype` (default `dtype`)."""
    chip = CATALOGUE[hw]
    budgets = budgets_of(hw, dtype, weight_dtype)
    return kernel_tiles(
        choose(rows, k, n, dtype, hw, groups, budget=budgets, weight_dtype=weight_dtype),
        rows,
        k,
        n,
        dtype,
        budgets,
        weight_dtype=weight_dtype,
        groups=groups,
        peak_flops=chip.peak_bf16_flops_per_chip,
        hbm_bytes_per_s=chip.hbm_bytes_per_s_per_chip,
    )


def choose(rows: int, k: int, n: int, dtype: str, hw: str, groups: int = 8, **kw) -> Tile:
    chip = CATALOGUE[hw]
    return choose_tile(
        rows,
        k,
        n,
        dtype,
        kw.pop("budget", chip.vmem_bytes_for_tiles),
        groups=groups,
        peak_flops=chip.peak_bf16_flops_per_chip,
        hbm_bytes_per_s=chip.hbm_bytes_per_s_per_chip,
        **kw,
    )
