"""Rules of NVIDIA GPU targets: where Transformer Engine's grouped GEMM runs, and in what
precision (the landscape's rule 13: FP8 grouped GEMMs need Hopper or newer, MXFP8 Blackwell);
where tokamax's Pallas Mosaic GPU ragged_dot runs, on which operands and widths."""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.hardware import CATALOGUE, hardware
from moegen.load import LoadedSpec

# compute capability (x10) each quantization needs, and its name
QUANTIZATION_SM = {"fp8": (90, "Hopper"), "mxfp8": (100, "Blackwell")}
# kernel tokamax: the compute capability (x10) of the one kernel family that has a forward and
# both backward kernels in tokamax 0.0.17 (its SM 10.0 and SM 8.0 families have no ragged-
# contracting kernel, the weight gradient), the operands it multiplies, and the multiple of its
# SM 9.0 tiles (block_k 128, block_n 64) every contraction and output width is held to
TOKAMAX_SM = 90
TOKAMAX_DTYPES = ("bfloat16",)
TOKAMAX_WIDTH_MULTIPLE = 128
# the contraction and output widths a quantized GEMM takes: whole 16-byte rows for fp8, whole
# 32-element scaling blocks for mxfp8
QUANTIZED_MULTIPLE = {"fp8": 16, "mxfp8": 32}


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
    return _widths_multiple_of(loaded, QUANTIZED_MULTIPLE[quantization], need)


def _local_width_note(tensor: int, chunks: int) -> str:
    """How the FFN width a GEMM sees is cut: " / 2 tensor shards / 4 slices"."""
    note = f" / {tensor} tensor shards" if tensor > 1 else ""
    return note + (f" / {chunks} slices" if chunks > 1 else "")


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
    return _widths_multiple_of(loaded, TOKAMAX_WIDTH_MULTIPLE, "kernel tokamax's tiles need")


def _widths_multiple_of(loaded: LoadedSpec, multiple: int, need: str) -> list[Diagnostic]:
    """embed_dim and the FFN width one grouped matmul sees, each a multiple of `multiple`."""
    spec = loaded.spec
    chunks = spec.memory.ffn_chunks or 1
    out = []
    for path, name, width in (
        (("layer", "embed_dim"), "embed_dim", spec.layer.embed_dim),
        (("layer", "ffn_dim"), "ffn_dim" + _local_width_note(spec.tensor_shards, chunks),
         spec.layer.ffn_dim // spec.tensor_shards // chunks),
    ):  # fmt: skip
        if width % multiple:
            below = width // multiple * multiple
            out.append(
                loaded.diagnostic(
                    path,
                    f"{name} = {width} is not a multiple of {multiple}, as {need}; "
                    f"nearest: {below or multiple} or {below + multiple}",
                )
            )
    return out


GPU_RULES = (
    te_runs_on_nvidia_gpus,
    tokamax_runs_on_hopper,
    tokamax_multiplies_bfloat16,
    tokamax_widths_fit,
    quantization_needs_te,
    quantization_fits_the_gpu,
    quantized_widths_fit,
)
