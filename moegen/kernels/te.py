"""Kernel te: NVIDIA Transformer Engine's grouped GEMM (JAX), CUDA GPUs only.

It owns target.quantization: fp8 and mxfp8 are TE recipes (the landscape's rule 13: FP8
grouped GEMMs need Hopper or newer, MXFP8 Blackwell). The recipe each quantization means
(scaling mode, forward and gradient dtypes) is decided here; templates/kernels/te.jinja only
lays it out. Verification lowers it for CUDA without a GPU, so Transformer Engine must be
installed; the CPU twin runs kernel xla in its place.

Lowering without a GPU or a driver (`prepare_te`): TE is imported against a stub libcuda.so.1
(every driver call fails), its compute-capability query answers the target's SM, and the
program is lowered for CUDA to StableHLO, where TE's kernels show as FFI custom calls. That
changes process-wide state: call it in a process of its own (the verify worker, a test).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
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
from moegen.kernels.tiling import round_up
from moegen.kernels.widths import widths_multiple_of
from moegen.load import LoadedSpec

TE_VERSION = "2.20.2"
TE_GROUPED_GEMM = "te_grouped_gemm_ffi"  # one Transformer Engine grouped GEMM
TE_FIX = "`make te` (scripts/install-te .venv) in a moegen checkout"
TE_INSTALL_HINT = (
    f"Transformer Engine {TE_VERSION} (JAX) is needed to lower GPU targets without a GPU. "
    "Install it into this venv with `scripts/install-te [VENV]` (from a moegen checkout; "
    "~7 min the first time, then cached), or by hand: `pip install 'moegen[te]'`, then build "
    f"`pip wheel --no-build-isolation --no-deps transformer_engine_jax=={TE_VERSION}` with "
    "NVTE_BUILD_USE_NVIDIA_WHEELS=1 NVTE_FRAMEWORK=jax and CUDA_HOME unset, install that wheel, "
    "and compile moegen/kernels/libcuda_stub.c to VENV/lib/moegen-te/libcuda.so.1 "
    "(`gcc -shared -fPIC -Wl,-soname,libcuda.so.1`)."
)
# compute capability (x10) each quantization needs, and its name
QUANTIZATION_SM = {"fp8": (90, "Hopper"), "mxfp8": (100, "Blackwell")}
# the contraction and output widths a quantized GEMM takes: whole 16-byte rows for fp8, whole
# 32-element scaling blocks for mxfp8
QUANTIZED_MULTIPLE = {"fp8": 16, "mxfp8": 32}
# every expert's rows fill a multiple of this many rows when quantized (cuBLAS FP8 contracts
# over rows in the weight gradient in 16s; TE's SM 100 MXFP8 kernels scale 32-row blocks and
# want 128 when every dimension is a multiple of 128)
TE_GROUP_ALIGN = {"none": 1, "fp8": 16, "mxfp8": 128}


@dataclass(frozen=True)
class TeRecipe:
    """What a quantization means to TE: its quantizers' scaling mode and dtypes."""

    scaling_mode: str | None  # a te_quantize.ScalingMode member; None: no quantizers
    forward_dtype: str | None  # jnp dtype of the forward GEMMs' operands
    backward_dtype: str | None  # jnp dtype of the gradients' operands
    precision: str  # how the module's docstring says the GEMMs compute


TE_RECIPES = {
    "none": TeRecipe(None, None, None, "in the compute dtype"),
    # Float8CurrentScaling: each tensor scaled by its own current amax, E4M3 forward, E5M2
    # gradients (their range matters more than their precision)
    "fp8": TeRecipe(
        "CURRENT_TENSOR_SCALING",
        "float8_e4m3fn",
        "float8_e5m2",
        "in FP8 with current scaling (E4M3 forward, E5M2 gradients)",
    ),
    # MXFP8BlockScaling: one scale per 32 elements, fine enough for E4M3 throughout
    "mxfp8": TeRecipe(
        "MXFP8_1D_SCALING",
        "float8_e4m3fn",
        "float8_e4m3fn",
        "in MXFP8 (1x32 block scaling, E4M3)",
    ),
}


@dataclass(frozen=True)
class TeConfig(KernelConfig):
    """Transformer Engine's grouped GEMM (kernel te, CUDA GPUs)."""

    quantization: str  # "none" | "fp8" | "mxfp8"
    group_align: int  # every expert's rows fill a multiple of this in the GEMM
    aligned_rows: int  # rows of the group-aligned GEMM buffer (quantized)
    cuda_sm: int | None  # compute capability x 10 (TE is traced for it)

    @property
    def recipe(self) -> TeRecipe:
        """The quantizers' recipe (a property: derived, so not part of the plan's record)."""
        return TE_RECIPES[self.quantization]


def te_config(loaded: LoadedSpec, quantities: MatmulQuantities) -> TeConfig:
    """The quantization, its group alignment and the aligned buffer's rows."""
    spec = loaded.spec
    chip = hardware(spec.target.hardware)
    align = TE_GROUP_ALIGN[spec.target.quantization]
    aligned = quantities.rows + quantities.local_experts * (align - 1)
    return TeConfig(
        quantization=spec.target.quantization,
        group_align=align,
        aligned_rows=round_up(aligned, align),
        cuda_sm=chip.sm if chip.platform == "gpu" else None,
    )


def te_runs_on_nvidia_gpus(loaded: LoadedSpec) -> list[Diagnostic]:
    """kernel te is Transformer Engine's CUDA grouped GEMM."""
    target = loaded.spec.target
    if target.kernel != "te" or hardware(target.hardware).platform == "gpu":
        return []
    gpus = ", ".join(name for name, hw in CATALOGUE.items() if hw.platform == "gpu")
    other = "pallas or xla" if hardware(target.hardware).platform == "tpu" else "xla"
    return [
        loaded.diagnostic(
            ("target", "kernel"),
            f"kernel te (Transformer Engine) runs on NVIDIA GPU targets only ({gpus}), not "
            f"{target.hardware}; use kernel: {other}",
        )
    ]


def quantization_needs_te(loaded: LoadedSpec) -> list[Diagnostic]:
    """fp8 and mxfp8 are Transformer Engine recipes; the other kernels compute in dtypes.compute."""
    target = loaded.spec.target
    if target.quantization == "none" or target.kernel == "te":
        return []
    return [
        loaded.diagnostic(
            ("target", "quantization"),
            f"quantization {target.quantization} needs kernel: te (an NVIDIA GPU target); "
            f"kernel {target.kernel} computes in dtypes.compute: set quantization: none",
        )
    ]


def quantization_fits_the_gpu(loaded: LoadedSpec) -> list[Diagnostic]:
    """FP8 needs SM 9.0 (Hopper) or newer, MXFP8 SM 10.0 (Blackwell)."""
    target = loaded.spec.target
    chip = hardware(target.hardware)
    if target.kernel != "te" or chip.platform != "gpu" or target.quantization == "none":
        return []
    need, generation = QUANTIZATION_SM[target.quantization]
    if chip.sm >= need:
        return []
    able = [n for n, hw in CATALOGUE.items() if hw.platform == "gpu" and hw.sm >= need]
    fallback = [q for q, (sm, _) in QUANTIZATION_SM.items() if chip.sm >= sm] + ["none"]
    return [
        loaded.diagnostic(
            ("target", "quantization"),
            f"{target.quantization} needs {generation} (SM {need // 10}.{need % 10}) or newer; "
            f"{target.hardware} is SM {chip.sm // 10}.{chip.sm % 10}: use quantization "
            f"{' or '.join(fallback)}, or target {' or '.join(able)}",
        )
    ]


def quantized_widths_fit(loaded: LoadedSpec) -> list[Diagnostic]:
    """Quantized GEMMs take embed and FFN widths in whole 16-byte rows (fp8) or 32-element
    scaling blocks (mxfp8)."""
    spec = loaded.spec
    quantization = spec.target.quantization
    if spec.target.kernel != "te" or quantization == "none":
        return []
    need = f"{quantization} GEMMs need"
    return widths_multiple_of(loaded, QUANTIZED_MULTIPLE[quantization], need)


# --- lowering for CUDA without a GPU (verification)

STUB_ENV = "MOEGEN_CUDA_STUB"  # overrides where the stub libcuda.so.1 is looked for
STUB_RELATIVE = Path("lib/moegen-te/libcuda.so.1")  # under the venv (sys.prefix)
# Libraries TE's loader would look for under folder names the cu12 wheels do not use.
_PRELOAD = (
    "cuda_runtime/lib/libcudart.so.12",
    "cublas/lib/libcublasLt.so.12",
    "cublas/lib/libcublas.so.12",
    "nccl/lib/libnccl.so.2",
)
_target_sm = 0
_handles: list[ctypes.CDLL] = []


class TENotInstalled(KernelNotInstalled):
    """Transformer Engine (JAX) or the stub libcuda is missing; the message says how to install."""


def stub_libcuda_path() -> Path:
    """Where the stub libcuda.so.1 built by scripts/install-te is (it may not exist)."""
    override = os.environ.get(STUB_ENV)
    return Path(override) if override else Path(sys.prefix) / STUB_RELATIVE


def _te_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for dist in ("transformer_engine", "transformer_engine_cu12", "transformer_engine_jax"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def missing_te() -> list[str]:
    """What keeps TE from loading here, without importing it (empty when all is in place)."""
    missing = [
        f"{dist}=={TE_VERSION} (found {found or 'none'})"
        for dist, found in _te_versions().items()
        if found != TE_VERSION
    ]
    if importlib.util.find_spec("nvidia") is None:
        missing.append("the nvidia-*-cu12 wheels (jax[cuda12])")
    if not stub_libcuda_path().is_file():
        missing.append(f"the stub libcuda.so.1 at {stub_libcuda_path()}")
    return missing


def te_available() -> bool:
    """Whether `prepare_te` can work here; cheap: reads package metadata, imports nothing."""
    return not missing_te()


def require_te() -> None:
    """Raise TENotInstalled, saying what is missing and how to install it, unless TE is usable."""
    missing = missing_te()
    if missing:
        raise TENotInstalled(f"missing: {'; '.join(missing)}.\n{TE_INSTALL_HINT}")


def _nvidia_dir() -> Path:
    spec = importlib.util.find_spec("nvidia")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def _load_libraries() -> None:
    """The stub driver first, then the CUDA 12 libraries TE's loader cannot find by itself.

    NVRTC_HOME/CURAND_HOME point TE's loader at the pip wheels: it searches those before
    CUDA_HOME and /usr/local/cuda, where a toolkit of another CUDA version may be; finding them
    also stops it looking for cudart under folder names the cu12 wheels do not use.
    """
    if _handles:
        return
    nvidia = _nvidia_dir()
    for name, folder in (("NVRTC", "cuda_nvrtc"), ("CURAND", "curand")):
        os.environ.setdefault(f"{name}_HOME", str(nvidia / folder))
    _handles.append(ctypes.CDLL(str(stub_libcuda_path()), mode=ctypes.RTLD_GLOBAL))
    for library in _PRELOAD:
        _handles.append(ctypes.CDLL(str(nvidia / library), mode=ctypes.RTLD_GLOBAL))


def _compute_capability(gpu_id: int = 0) -> int:
    """Stands in for transformer_engine_jax.get_device_compute_capability (needs a driver)."""
    del gpu_id
    return _target_sm


def prepare_te(sm: int) -> ModuleType:
    """Import transformer_engine.jax without a GPU, as if every device had compute capability `sm`.

    `sm` is 90 for H100/H200 (Hopper), 100 for B200 (Blackwell). TE asks the driver for it while
    tracing (cuBLAS workspace size, FP8 layouts, which kernel versions exist); here it is the
    target's. Callable again with another SM: TE's cached answers are cleared.
    """
    global _target_sm
    require_te()
    if _target_sm and _target_sm != sm:
        import jax

        jax.clear_caches()  # traces made for the previous SM must not be reused
    _target_sm = int(sm)
    try:
        _load_libraries()
        import transformer_engine.jax as te
        import transformer_engine_jax
    except (ImportError, OSError) as error:
        raise TENotInstalled(
            f"Transformer Engine is installed but does not load: {error}\n{TE_INSTALL_HINT}"
        ) from error

    # By module path: cpp_extensions re-exports a function named `gemm` over its submodule.
    gemm = importlib.import_module("transformer_engine.jax.cpp_extensions.gemm")
    device_utils = importlib.import_module("transformer_engine.jax.quantize.device_utils")
    helper = importlib.import_module("transformer_engine.jax.quantize.helper")

    # misc.py and device_utils look the query up on the extension module at call time;
    # gemm.py imported it by name.
    transformer_engine_jax.get_device_compute_capability = _compute_capability
    gemm.get_device_compute_capability = _compute_capability
    for cached in (
        device_utils.get_device_compute_capability,
        device_utils.is_fp8_gemm_with_all_layouts_supported,
        gemm._v2_grouped_gemm_supports_per_group_alpha_beta,
    ):
        cached.cache_clear()
    helper._is_scaling_mode_supported = None  # its own per-process cache of the SM checks
    return te


QUANTIZATIONS = ("none", "fp8", "mxfp8")


def te_supports(quantization: str) -> tuple[bool, str]:
    """Whether TE allows `quantization` on the SM given to `prepare_te`, and why not.

    TE's own rule (is_scaling_mode_supported): "fp8" (current scaling) needs SM 89+, "mxfp8"
    (block scaling) SM 100+. Lowering does not check it: an MXFP8 program lowers for SM 90 too,
    and would fail only on the GPU.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    from transformer_engine.jax.quantize import ScalingMode, helper

    mode = {
        "none": ScalingMode.NO_SCALING,
        "fp8": ScalingMode.CURRENT_TENSOR_SCALING,
        "mxfp8": ScalingMode.MXFP8_1D_SCALING,
    }[quantization]
    return helper.is_scaling_mode_supported(mode, gpu_id=0)


TE = Kernel(
    name="te",
    summary="Transformer Engine grouped GEMM (NVIDIA GPU)",
    aliases=("transformer_engine", "transformer-engine"),
    platforms=frozenset({"gpu"}),
    rules=(
        te_runs_on_nvidia_gpus,
        quantization_needs_te,
        quantization_fits_the_gpu,
        quantized_widths_fit,
    ),  # fmt: skip
    config=te_config,
    # TE's GEMMs run on a GPU only: the twin runs the same module with the portable grouped
    # matmul in their place (same call signature), in the compute dtype
    twin_overrides=MappingProxyType(
        {("target", "kernel"): "xla", ("target", "quantization"): "none"}
    ),
    vma_unchecked_reason="Transformer Engine's custom VJPs carry no varying-axes types",
    preflight=Preflight(
        "transformer_engine",
        f"Run {TE_FIX}; otherwise: {TE_INSTALL_HINT}",
        missing=lambda: missing_te(),  # looked up at each call (tests replace it)
    ),
    # one forward GEMM per site; the VJP adds the input- and weight-gradient GEMMs
    cuda_lowering=CudaLowering(
        custom_call=TE_GROUPED_GEMM,
        calls_per_site=2,
        quantizes=True,
        distributions=("transformer_engine", "transformer_engine_cu12", "transformer_engine_jax"),
        call_prefix="te_",
        prepare=lambda sm: prepare_te(sm),
    ),
)
