"""Kernel te: NVIDIA Transformer Engine's grouped GEMM (JAX), CUDA GPUs only.

It owns target.quantization: fp8 and mxfp8 are TE recipes (the landscape's rule 13: FP8
grouped GEMMs need Hopper or newer, MXFP8 Blackwell). The recipe each quantization means
(scaling mode, forward and gradient dtypes) is decided here; templates/kernels/te.jinja only
lays it out. Verification lowers it for CUDA without a GPU, so Transformer Engine must be
installed; the CPU twin runs kernel xla in its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from moegen.diagnostics import Diagnostic
from moegen.hardware import CATALOGUE, hardware
from moegen.kernels.base import CudaLowering, Kernel, MatmulQuantities, Preflight
from moegen.kernels.widths import widths_multiple_of
from moegen.load import LoadedSpec
from moegen.kernels.tiling import round_up

TE_VERSION = "2.20.2"
TE_GROUPED_GEMM = "te_grouped_gemm_ffi"  # one Transformer Engine grouped GEMM
TE_FIX = "`make te` (scripts/install-te .venv) in a moegen checkout"
TE_INSTALL_HINT = (
    f"Transformer Engine {TE_VERSION} (JAX) is needed to lower GPU targets without a GPU. "
    "Install it into this venv with `scripts/install-te [VENV]` (from a moegen checkout; "
    "~7 min the first time, then cached), or by hand: `pip install 'moegen[te]'`, then build "
    f"`pip wheel --no-build-isolation --no-deps transformer_engine_jax=={TE_VERSION}` with "
    "NVTE_BUILD_USE_NVIDIA_WHEELS=1 NVTE_FRAMEWORK=jax and CUDA_HOME unset, install that wheel, "
    "and compile moegen/verify/libcuda_stub.c to VENV/lib/moegen-te/libcuda.so.1 "
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
class TeConfig:
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


TE = Kernel(
    name="te",
    summary="Transformer Engine grouped GEMM (NVIDIA GPU)",
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
    preflight=Preflight("transformer_engine", f"Run {TE_FIX}; otherwise: {TE_INSTALL_HINT}"),
    # one forward GEMM per site; the VJP adds the input- and weight-gradient GEMMs
    cuda_lowering=CudaLowering(
        custom_call=TE_GROUPED_GEMM,
        calls_per_site=2,
        quantizes=True,
        distributions=("transformer_engine", "transformer_engine_cu12", "transformer_engine_jax"),
        call_prefix="te_",
    ),
)
