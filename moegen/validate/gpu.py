"""Rules of NVIDIA GPU targets: where Transformer Engine's grouped GEMM runs, and in what
precision (the landscape's rule 13: FP8 grouped GEMMs need Hopper or newer, MXFP8 Blackwell)."""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.hardware import CATALOGUE, hardware
from moegen.load import LoadedSpec

# compute capability (x10) each quantization needs, and its name
QUANTIZATION_SM = {"fp8": (90, "Hopper"), "mxfp8": (100, "Blackwell")}
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
    multiple = QUANTIZED_MULTIPLE[quantization]
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
                    f"{name} = {width} is not a multiple of {multiple}, as {quantization} "
                    f"GEMMs need; nearest: {below or multiple} or {below + multiple}",
                )
            )
    return out


def _local_width_note(tensor: int, chunks: int) -> str:
    """How the FFN width a GEMM sees is cut: " / 2 tensor shards / 4 slices"."""
    note = f" / {tensor} tensor shards" if tensor > 1 else ""
    return note + (f" / {chunks} slices" if chunks > 1 else "")


GPU_RULES = (
    te_runs_on_nvidia_gpus,
    quantization_needs_te,
    quantization_fits_the_gpu,
    quantized_widths_fit,
)
