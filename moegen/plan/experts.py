"""Expert placement per strategy: worst-case grouped-matmul rows and communication."""

from __future__ import annotations

from dataclasses import dataclass

from moegen.load import LoadedSpec
from moegen.plan.costs import DTYPE_BYTES


@dataclass(frozen=True)
class ExpertPlan:
    """How experts are spread and how many rows their grouped matmuls see, per device."""

    strategy: str
    axis: str | None  # "expert" or None (replicated)
    shards: int  # devices along the expert axis
    local_experts: int
    group_tokens: int  # tokens of the whole expert group (ring_of_experts gathers them)
    ffn_rows: int  # worst-case rows of one grouped-matmul call, before tile padding
    ffn_calls: int  # grouped-matmul calls per projection (ring steps when chunked)
    receive_rows: int  # ragged_all_to_all: the certified receive buffer (0 otherwise)
    overlap_chunks: int
    chunk_width: int  # embedding columns per chunk
    emulate_ragged_all_to_all: bool  # XLA:CPU lacks the op: the twin uses an all_gather twin
    communication_bytes: tuple[tuple[str, int], ...]  # forward, per strategy (the chosen first)


def expert_plan(loaded: LoadedSpec, local_tokens: int, *, emulate: bool) -> ExpertPlan:
    """Expert placement, worst-case grouped-matmul rows and communication per strategy."""
    spec = loaded.spec
    strategy = spec.parallelism.experts
    shards = spec.mesh.axes.get("expert", 1)
    local_experts = spec.layer.num_experts // shards
    top_k = spec.router.top_k
    # A token sends at most min(top_k, local_experts) copies to any one device: the most
    # rows a device can be asked to process, when every token of the group picks its experts.
    per_token = min(top_k, local_experts)
    group_tokens = local_tokens * shards
    chunks = spec.parallelism.overlap_chunks
    if strategy == "replicated":
        ffn_rows, calls = local_tokens * top_k, 1
    elif strategy == "ring_of_experts" and chunks > 1:
        ffn_rows, calls = local_tokens * per_token, shards  # one call per ring step
    else:
        ffn_rows, calls = group_tokens * per_token, 1
    compute_bytes = DTYPE_BYTES[spec.dtypes.compute]
    embed = spec.layer.embed_dim
    traffic = {
        "ragged_all_to_all": 2
        * compute_bytes
        * local_tokens
        * top_k
        * embed
        * (shards - 1)
        // shards,
        # tokens gathered in the compute dtype, partial outputs reduce-scattered in float32
        "ring_of_experts": (compute_bytes + 4) * local_tokens * embed * (shards - 1),
    }
    ordered = sorted(traffic.items(), key=lambda item: item[0] != strategy)
    return ExpertPlan(
        strategy=strategy,
        axis="expert" if shards > 1 or strategy != "replicated" else None,
        shards=shards,
        local_experts=local_experts,
        group_tokens=group_tokens,
        ffn_rows=ffn_rows,
        ffn_calls=calls,
        receive_rows=ffn_rows if strategy == "ragged_all_to_all" else 0,
        overlap_chunks=chunks,
        chunk_width=embed // chunks,
        # XLA:CPU has no ragged all-to-all: CPU twins, and modules for target cpu, emulate it
        emulate_ragged_all_to_all=strategy == "ragged_all_to_all"
        and (emulate or spec.target.hardware == "cpu"),
        communication_bytes=tuple(ordered) if strategy != "replicated" else (),
    )
