"""Kernel tokamax: tokamax's ragged_dot through its Pallas Mosaic GPU kernels, forward and both
backward products (tokamax's own VJP), in bfloat16 on Hopper.

Verification lowers it for CUDA without a GPU, so tokamax must be installed at its pin; the
CPU twin runs kernel xla in its place (Mosaic GPU's interpret mode runs tokamax's forward
kernel on CPU but not its weight-gradient kernel).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from types import MappingProxyType, ModuleType

from moegen.diagnostics import Diagnostic
from moegen.hardware import CATALOGUE, hardware
from moegen.kernels.base import (
    CudaLowering,
    Kernel,
    KernelConfig,
    KernelNotInstalled,
    MatmulQuantities,
    Preflight,
)
from moegen.kernels.widths import widths_multiple_of
from moegen.load import LoadedSpec

TOKAMAX_VERSION = "0.0.17"
TOKAMAX_CUSTOM_CALL = "mosaic_gpu_v2"  # one Pallas Mosaic GPU kernel launch
TOKAMAX_INSTALL_HINT = (
    f"tokamax {TOKAMAX_VERSION} is needed to lower kernel tokamax without a GPU: `make "
    "gpu-kernels` in a moegen checkout, or `pip install 'moegen[gpu-kernels]'` with jax held "
    "at its pin (pip's -c constraints file: jax==0.12.0.1, jaxlib==0.12.0.1)."
)
# the compute capability (x10) of the one kernel family that has a forward and both backward
# kernels in tokamax 0.0.17 (its SM 10.0 and SM 8.0 families have no ragged-contracting
# kernel, the weight gradient), the operands it multiplies, and the multiple of its SM 9.0
# tiles (block_k 128, block_n 64) every contraction and output width is held to
TOKAMAX_SM = 90
TOKAMAX_DTYPES = ("bfloat16",)
TOKAMAX_WIDTH_MULTIPLE = 128


@dataclass(frozen=True)
class TokamaxConfig(KernelConfig):
    """tokamax's ragged_dot (kernel tokamax, CUDA GPUs): its Pallas Mosaic GPU kernels, forward
    and both backward products (tokamax's own VJP), in the compute dtype."""

    implementation: str  # tokamax's name of the kernel family: "mosaic_gpu"
    cuda_sm: int  # compute capability x 10 the kernels are traced for (validated: 90)


def tokamax_config(loaded: LoadedSpec, quantities: MatmulQuantities) -> TokamaxConfig:
    # Named explicitly: tokamax's "mosaic" picks the TPU kernels unless the default device is
    # an NVIDIA GPU, and its default list falls back to XLA where the GPU kernel refuses.
    return TokamaxConfig(
        implementation="mosaic_gpu", cuda_sm=hardware(loaded.spec.target.hardware).sm
    )


def tokamax_runs_on_hopper(loaded: LoadedSpec) -> list[Diagnostic]:
    """kernel tokamax trains on SM 9.0 (H100, H200) only: tokamax 0.0.17 has a Mosaic GPU
    weight-gradient kernel for Hopper alone."""
    target = loaded.spec.target
    chip = hardware(target.hardware)
    if target.kernel != "tokamax" or chip.sm == TOKAMAX_SM:
        return []
    able = " or ".join(n for n, hw in CATALOGUE.items() if hw.sm == TOKAMAX_SM)
    if chip.platform != "gpu":
        other = "pallas or xla" if chip.platform == "tpu" else "xla"
        why = f"runs on NVIDIA Hopper targets only ({able}), not {target.hardware}"
        fix = f"use kernel: {other}"
    else:
        why = (
            f"trains on Hopper (SM 9.0: {able}) only: tokamax 0.0.17's Mosaic GPU ragged_dot "
            f"has no weight-gradient (ragged-contracting) kernel for SM {chip.sm // 10}."
            f"{chip.sm % 10}, so the backward pass of {target.hardware} cannot be built"
        )
        fix = f"use kernel: te or xla, or target {able}"
    return [
        loaded.diagnostic(
            ("target", "kernel"),
            f"kernel tokamax (tokamax's Pallas Mosaic GPU ragged_dot) {why}; {fix}",
        )
    ]


def tokamax_multiplies_bfloat16(loaded: LoadedSpec) -> list[Diagnostic]:
    """tokamax's SM 9.0 kernels take bfloat16 (or float16) operands, both of one dtype."""
    spec = loaded.spec
    if spec.target.kernel != "tokamax" or spec.dtypes.compute in TOKAMAX_DTYPES:
        return []
    return [
        loaded.diagnostic(
            ("dtypes", "compute"),
            f"kernel tokamax multiplies bfloat16 operands only (its Mosaic GPU kernels are "
            f"bf16 x bf16 with float32 accumulation), not {spec.dtypes.compute}; set "
            "compute: bfloat16, or use kernel: xla or te",
        )
    ]


def tokamax_widths_fit(loaded: LoadedSpec) -> list[Diagnostic]:
    """Contraction and output widths in whole SM 9.0 tiles (multiples of 128)."""
    spec = loaded.spec
    if spec.target.kernel != "tokamax":
        return []
    return widths_multiple_of(loaded, TOKAMAX_WIDTH_MULTIPLE, "kernel tokamax's tiles need")


# --- lowering for CUDA without a GPU (verification)


class TokamaxNotInstalled(KernelNotInstalled):
    """tokamax is missing or of another version; the message says how to install it."""


def missing_tokamax() -> list[str]:
    """What keeps kernel tokamax from lowering here, without importing it (empty: nothing)."""
    try:
        found = importlib.metadata.version("tokamax")
    except importlib.metadata.PackageNotFoundError:
        found = None
    return (
        []
        if found == TOKAMAX_VERSION
        else [f"tokamax=={TOKAMAX_VERSION} (found {found or 'none'})"]
    )


def tokamax_available() -> bool:
    """Whether `prepare_tokamax` can work here; cheap: reads package metadata."""
    return not missing_tokamax()


def prepare_tokamax(sm: int) -> ModuleType:
    """Import tokamax to trace its GPU kernels here, as if every device had compute capability
    `sm` (90: Hopper). Process-wide, like `prepare_te`: call it in a process of its own.

    tokamax picks the kernel family by the default device's compute capability (private
    `gpu_utils._compute_capability`, None on CPU) and refuses devices without Mosaic GPU unless
    its `cross_compile` option is on (the backward kernels are built without a device bypass).
    """
    missing = missing_tokamax()
    if missing:
        raise TokamaxNotInstalled(f"missing: {'; '.join(missing)}.\n{TOKAMAX_INSTALL_HINT}")
    try:
        import tokamax
        from tokamax._src import gpu_utils
    except ImportError as error:
        raise TokamaxNotInstalled(
            f"tokamax is installed but does not load: {error}\n{TOKAMAX_INSTALL_HINT}"
        ) from error
    capability = sm / 10
    gpu_utils._compute_capability = lambda device=None: capability
    tokamax.config.cross_compile.config.set_global(True)
    return tokamax


TOKAMAX = Kernel(
    name="tokamax",
    summary="tokamax's Pallas Mosaic GPU ragged_dot (Hopper: H100, H200; bfloat16)",
    aliases=("mosaic_gpu", "mosaic-gpu"),
    platforms=frozenset({"gpu"}),
    cuda_sms=frozenset({TOKAMAX_SM}),
    rules=(tokamax_runs_on_hopper, tokamax_multiplies_bfloat16, tokamax_widths_fit),
    config=tokamax_config,
    twin_overrides=MappingProxyType(
        {("target", "kernel"): "xla", ("target", "quantization"): "none"}
    ),
    vma_unchecked_reason="tokamax's Pallas Mosaic GPU kernels carry no varying-axes types",
    preflight=Preflight(
        "tokamax",
        TOKAMAX_INSTALL_HINT,
        missing=lambda: missing_tokamax(),  # looked up at each call (tests replace it)
    ),
    # one Mosaic GPU kernel per site forward, three with tokamax's own VJP
    cuda_lowering=CudaLowering(
        custom_call=TOKAMAX_CUSTOM_CALL,
        calls_per_site=3,
        quantizes=False,
        distributions=("tokamax",),
        call_prefix=TOKAMAX_CUSTOM_CALL,
        excludes_ragged_dot=True,
        prepare=lambda sm: prepare_tokamax(sm),
    ),
)
