"""Rules of the mesh roles that split one token's work rather than the batch: tensor (the
experts' FFN width) and sequence (each sequence's tokens)."""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.sizes import nearest_multiples
from moegen.spec import NON_BATCH_AXES


def batch_axes_leave_out_tensor_and_sequence(loaded: LoadedSpec) -> list[Diagnostic]:
    """Every tensor shard must see the same tokens, and the sequence axis splits dimension 1
    of x, not the batch: neither may be a batch axis."""
    listed_axes = loaded.spec.mesh.batch_axes or ()
    return [
        loaded.diagnostic(
            ("mesh", "batch_axes", i),
            f"'{name}' cannot shard the batch: "
            + (
                "the tensor axis splits each expert's FFN width, every tensor shard needs "
                "the same tokens"
                if name == "tensor"
                else "the sequence axis splits each sequence along seq_len"
            )
            + "; remove it from mesh.batch_axes",
        )
        for i, name in enumerate(listed_axes)
        if name in NON_BATCH_AXES
    ]


def ffn_divisible_by_tensor(loaded: LoadedSpec) -> list[Diagnostic]:
    """Each tensor shard holds an equal share of every expert's FFN columns (and the shared
    expert's)."""
    spec = loaded.spec
    tensor = spec.tensor_shards
    if tensor == 1:
        return []
    out = []
    for field, width in (
        ("ffn_dim", spec.layer.ffn_dim),
        ("shared_ffn_dim", spec.layer.shared_ffn_dim),
    ):
        if width is None or width % tensor == 0:
            continue
        nearest = " or ".join(map(str, nearest_multiples(width, tensor)))
        out.append(
            loaded.diagnostic(
                ("layer", field),
                f"{field} = {width} does not split over the tensor axis of {tensor}; "
                f"nearest widths that do: {nearest}",
            )
        )
    return out


def seq_len_divisible_by_sequence(loaded: LoadedSpec) -> list[Diagnostic]:
    """Each sequence shard holds an equal run of every sequence's tokens."""
    spec = loaded.spec
    shards = spec.sequence_shards
    if spec.shapes.seq_len % shards == 0:
        return []
    nearest = " or ".join(map(str, nearest_multiples(spec.shapes.seq_len, shards)))
    return [
        loaded.diagnostic(
            ("shapes", "seq_len"),
            f"seq_len {spec.shapes.seq_len} does not split over the sequence axis of "
            f"{shards}; nearest: {nearest}",
        )
    ]


MESH_ROLE_RULES = (
    batch_axes_leave_out_tensor_and_sequence,
    ffn_divisible_by_tensor,
    seq_len_divisible_by_sequence,
)
