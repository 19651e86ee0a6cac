"""The width rule GPU kernels share: the contraction and output widths their grouped matmuls
see must be whole multiples of a kernel's block (tiles, quantization blocks)."""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.spec import Spec


def _local_width_note(tensor: int, chunks: int) -> str:
    """How the FFN width a GEMM sees is cut: " / 2 tensor shards / 4 slices"."""
    note = f" / {tensor} tensor shards" if tensor > 1 else ""
    return note + (f" / {chunks} slices" if chunks > 1 else "")


def _routed_width(spec: Spec) -> tuple[tuple[str, ...], str, int]:
    """(path, name, width) of the width the experts' matmuls contract and produce."""
    field = spec.layer.routed_field
    return ("layer", field), field, spec.layer.routed_dim


def widths_multiple_of(loaded: LoadedSpec, multiple: int, need: str) -> list[Diagnostic]:
    """embed_dim and the FFN width one grouped matmul sees, each a multiple of `multiple`."""
    spec = loaded.spec
    chunks = spec.memory.ffn_chunks or 1
    out = []
    for path, name, width in (
        _routed_width(spec),
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
