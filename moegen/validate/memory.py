"""Rules of the memory options: how the expert FFN may be sliced to run one slice at a time."""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.kernels import kernel
from moegen.load import LoadedSpec
from moegen.sizes import axes_product, ffn_slice_problem
from moegen.validate.bounds import MAX_CHUNKS, known_batch_axes


def ffn_chunk_width(loaded: LoadedSpec, chunks: int) -> str:
    """Why the FFN width cannot be cut into `chunks` slices ('' when it can)."""
    spec = loaded.spec
    name = spec.target.kernel
    width = spec.layer.ffn_dim // spec.tensor_shards
    return ffn_slice_problem(width, chunks, name, kernel(name).width_multiple)


def ffn_chunks_fit(loaded: LoadedSpec) -> list[Diagnostic]:
    """FFN slices are equal and, where a slice is a block of the kernel's calls, whole blocks."""
    chunks = loaded.spec.memory.ffn_chunks
    if chunks is None or chunks == 1:
        return []
    problem = ffn_chunk_width(loaded, chunks)
    if not problem:
        return []
    valid = [str(c) for c in range(2, MAX_CHUNKS + 1) if not ffn_chunk_width(loaded, c)][:8]
    options = f"valid slice counts: {', '.join(valid)}, or 1" if valid else "set 1"
    return [loaded.diagnostic(("memory", "ffn_chunks"), f"{problem}; {options}")]


def ffn_chunks_without_overlap(loaded: LoadedSpec) -> list[Diagnostic]:
    """The overlapped ring already runs its matmuls chunk by chunk over the embedding."""
    spec = loaded.spec
    chunks = spec.memory.ffn_chunks
    overlap = spec.parallelism.overlap_chunks
    if chunks is None or chunks == 1 or overlap == 1:
        return []
    return [
        loaded.diagnostic(
            ("memory", "ffn_chunks"),
            f"ffn_chunks {chunks} with overlap_chunks {overlap}: the overlapped ring slices "
            "the embedding, not the FFN width; set ffn_chunks 1 or overlap_chunks 1",
        )
    ]


def token_chunks_fit(loaded: LoadedSpec) -> list[Diagnostic]:
    """Token chunks split each device's tokens evenly, and do not run with the overlapped
    ring, which already cuts its matmuls another way. They do run with FFN slices: each
    chunk runs the FFN slice by slice."""
    spec = loaded.spec
    chunks = spec.memory.token_chunks
    if chunks is None or chunks == 1:
        return []
    path = ("memory", "token_chunks")
    overlap = spec.parallelism.overlap_chunks
    if isinstance(overlap, int) and overlap > 1:
        return [
            loaded.diagnostic(
                path,
                f"token_chunks {chunks} with overlap_chunks {overlap}: "
                "the overlapped ring already runs its matmuls chunk by chunk; set one of them "
                "to 1",
            )
        ]
    tokens = local_tokens(loaded)
    if tokens % chunks == 0:
        return []
    valid = [str(c) for c in range(2, min(MAX_CHUNKS, tokens) + 1) if tokens % c == 0][:8]
    options = f"valid counts: {', '.join(valid)}, or 1" if valid else "set 1"
    return [
        loaded.diagnostic(
            path,
            f"{tokens} tokens per device do not split into {chunks} equal chunks; {options}",
        )
    ]


def local_tokens(loaded: LoadedSpec) -> int:
    """Tokens per device: the batch over its shards, each sequence over the sequence axis."""
    spec = loaded.spec
    shards = axes_product(spec.mesh.axes, known_batch_axes(loaded))
    return spec.shapes.batch // max(shards, 1) * (spec.shapes.seq_len // spec.sequence_shards)


def weight_casts_per_slice_cast_slices(loaded: LoadedSpec) -> list[Diagnostic]:
    """weight_casts: per_slice rounds float32 FFN slices to bfloat16: it needs pinned FFN
    slices and those two dtypes."""
    spec = loaded.spec
    if spec.memory.weight_casts != "per_slice":
        return []
    problems = []
    if (spec.memory.ffn_chunks or 1) == 1:
        problems.append("memory.ffn_chunks > 1 (write the slices: whole, nothing is sliced)")
    dtypes = (spec.dtypes.params, spec.dtypes.compute)
    if dtypes != ("float32", "bfloat16"):
        problems.append(
            f"dtypes params float32 and compute bfloat16 (here {dtypes[0]} and {dtypes[1]}: "
            "no float32 weight is cast to bfloat16)"
        )
    if not problems:
        return []
    needs = "; and ".join(problems)
    return [
        loaded.diagnostic(("memory", "weight_casts"), f"per_slice needs {needs}; or write once")
    ]


MEMORY_RULES = (
    ffn_chunks_fit,
    ffn_chunks_without_overlap,
    token_chunks_fit,
    weight_casts_per_slice_cast_slices,
)
