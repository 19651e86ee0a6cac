"""Rules that bound sizes: what int32 indexing, addressable tensors and the verify step can take.

Besides refusing layers no kernel can run, these bounds keep the work moegen does on a spec
(validation, planning, and the shrunken twin that `moegen build` runs) small whatever values an
untrusted spec holds.
"""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.sizes import INT32_LIMIT, axes_product


def known_batch_axes(loaded: LoadedSpec) -> list[str]:
    """The batch axes that name mesh axes, each once (other rules report the rest)."""
    spec = loaded.spec
    return [a for a in dict.fromkeys(spec.batch_axes) if a in spec.mesh.axes]


def indices_fit_int32(loaded: LoadedSpec) -> list[Diagnostic]:
    """Flat indices into the routed buffers must fit int32 (TE #2908 overflowed silently)."""
    spec = loaded.spec
    shards = axes_product(spec.mesh.axes, known_batch_axes(loaded))
    local_rows = spec.shapes.batch // max(shards, 1) * spec.shapes.seq_len * spec.router.top_k
    width = max(spec.layer.embed_dim, spec.layer.routed_dim, spec.layer.ffn_dim)
    global_rows = spec.shapes.batch * spec.shapes.seq_len * spec.router.top_k
    out = []
    if local_rows * width >= INT32_LIMIT:
        out.append(
            loaded.diagnostic(
                ("shapes", "batch"),
                f"each device routes {local_rows} rows of width {width}: "
                f"{local_rows * width} elements overflow int32 indexing (< 2**31); "
                "shard the batch over more devices, or reduce shapes.batch or shapes.seq_len",
            )
        )
    shared = spec.layer.shared_ffn_dim or 0
    local_tokens = local_rows // spec.router.top_k
    if local_tokens * shared >= INT32_LIMIT:
        out.append(
            loaded.diagnostic(
                ("layer", "shared_ffn_dim"),
                f"the shared expert's hidden activations on each device hold {local_tokens} x "
                f"{shared} = {local_tokens * shared} elements, overflowing int32 indexing "
                "(< 2**31); shard the batch over more devices, or reduce shapes.batch or "
                "shapes.seq_len",
            )
        )
    if global_rows >= INT32_LIMIT:
        out.append(
            loaded.diagnostic(
                ("shapes", "seq_len"),
                f"batch*seq_len*top_k = {global_rows} token slots overflow int32 (< 2**31); "
                "reduce shapes.batch, shapes.seq_len or router.top_k",
            )
        )
    return out


# Beyond this a single parameter would be terabytes: certainly a typo, and big enough to
# overflow size arithmetic in compilers.
MAX_TENSOR_ELEMENTS = 2**40


def parameters_reasonably_sized(loaded: LoadedSpec) -> list[Diagnostic]:
    """An expert weight [num_experts, embed_dim (or latent_dim), ffn_dim], and a latent
    projection [embed_dim, latent_dim], must stay addressable."""
    layer = loaded.spec.layer
    width = layer.routed_field
    expert = layer.num_experts * layer.routed_dim * layer.ffn_dim
    weights = [
        (f"expert weights of num_experts*{width}*ffn_dim", expert),
        ("latent projections of embed_dim*latent_dim", layer.embed_dim * (layer.latent_dim or 0)),
    ]
    return [
        loaded.diagnostic(
            ("layer",),
            at_key=True,
            message=f"{what} = {elements} elements (>= 2**40) per projection; check the sizes",
        )
        for what, elements in weights
        if elements >= MAX_TENSOR_ELEMENTS
    ]


# The twin that `moegen build` verifies keeps every expert (only the widths and the batch
# shrink), and its dense reference runs every token through each of them on CPU: its weights
# and work grow with the expert count alone. Twice the most experts of any published MoE
# layer (Switch-C: 2048) keeps the twin's expert weights near 19 MB (16 x 24 per projection in
# float32); 2**31 experts would need 10 TB.
MAX_EXPERTS = 4096


def experts_within_limit(loaded: LoadedSpec) -> list[Diagnostic]:
    """The verify step's twin keeps every expert: at most MAX_EXPERTS of them."""
    experts = loaded.spec.layer.num_experts
    if experts <= MAX_EXPERTS:
        return []
    return [
        loaded.diagnostic(
            ("layer", "num_experts"),
            f"{experts} experts; at most {MAX_EXPERTS}: the shrunken twin `moegen build` "
            "verifies keeps every expert, and its dense reference runs every token through "
            "each of them on CPU (the largest published MoE layers have 2048, Switch-C)",
        )
    ]


# Each overlap chunk is a step of the ring, written out in the generated code once per expert
# shard, and each FFN slice a scan step whose weights are gathered again; the shrunken twin
# keeps the count, so it rounds its widths up to a multiple of it. Past 64 the pieces are too
# narrow to pay for their step overhead on any target, and the twin grows with the count.
MAX_CHUNKS = 64


def chunks_within_limit(loaded: LoadedSpec) -> list[Diagnostic]:
    """Overlap chunks and FFN slices: at most MAX_CHUNKS each."""
    spec = loaded.spec
    counts = {
        ("parallelism", "overlap_chunks", "overlap chunks"): spec.parallelism.overlap_chunks,
        ("memory", "ffn_chunks", "FFN slices"): spec.memory.ffn_chunks,
    }
    return [
        loaded.diagnostic(
            (section, field),
            f"{count} {what}; at most {MAX_CHUNKS}: each is a step of "
            "the generated layer (and of the twin `moegen build` verifies), and pieces this "
            "narrow cost more in step overhead than they save",
        )
        for (section, field, what), count in counts.items()
        if isinstance(count, int) and count > MAX_CHUNKS
    ]
