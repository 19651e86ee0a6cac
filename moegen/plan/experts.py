"""Expert placement per strategy: worst-case grouped-matmul rows and communication."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

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
    capacity: int | None  # copies each expert keeps per device; None: dropless
    token_chunks: int = 1  # the device's tokens run through the experts in this many chunks
    chunks_tokens: bool = False  # token_chunks > 1
    call_tokens: int = 0  # tokens of one call of the routed experts: a chunk's, or all
    call_rows: int = 0  # their copies: call_tokens * top_k
    reports_received: bool = False  # the call also returns the rows this device received
    tokens_name: str = "LOCAL_TOKENS"  # the module constant of call_tokens
    rows_name: str = "ROUTED_ROWS"  # the module constant of call_tokens * top_k


def expert_capacity(loaded: LoadedSpec, local_tokens: int) -> int | None:
    """ceil(factor * local_tokens * top_k / num_experts), per expert and device."""
    spec = loaded.spec
    if spec.router.capacity is None:
        return None
    copies = local_tokens * spec.router.top_k
    # The factor as written (1.1 is 11/10, not the float just above it): exact arithmetic.
    factor = Fraction(repr(spec.router.capacity.factor))
    return max(1, math.ceil(factor * copies / spec.layer.num_experts))


def expert_plan(
    loaded: LoadedSpec, local_tokens: int, token_chunks: int, *, emulate: bool
) -> ExpertPlan:
    """Expert placement, worst-case grouped-matmul rows and communication per strategy, the
    experts running on `token_chunks` chunks of the device's tokens one after another."""
    spec = loaded.spec
    strategy = spec.parallelism.experts
    shards = spec.mesh.axes.get("expert", 1)
    local_experts = spec.layer.num_experts // shards
    top_k = spec.router.top_k
    # A token sends at most min(top_k, local_experts) copies to any one device: the most
    # rows a device can be asked to process, when every token of the group picks its experts.
    per_token = min(top_k, local_experts)
    # With token chunks, every buffer below is one chunk's: the experts run on one at a time.
    call_tokens = local_tokens // token_chunks
    group_tokens = call_tokens * shards
    chunks = spec.parallelism.overlap_chunks
    capacity = expert_capacity(loaded, local_tokens)
    # With a capacity, a device keeps at most `capacity` copies of its tokens per expert.

    def kept(rows: int, experts: int) -> int:
        return min(rows, experts * capacity) if capacity else rows

    if strategy == "replicated":
        ffn_rows, calls = kept(call_tokens * top_k, spec.layer.num_experts), 1
    elif strategy == "ring_of_experts" and chunks > 1:
        # one call per ring step, on the copies one device's tokens send to my experts
        ffn_rows, calls = kept(call_tokens * per_token, local_experts), shards
    else:
        ffn_rows, calls = kept(group_tokens * per_token, shards * local_experts), 1
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
        capacity=capacity,
        token_chunks=token_chunks,
        chunks_tokens=token_chunks > 1,
        call_tokens=call_tokens,
        call_rows=call_tokens * top_k,
        reports_received=strategy == "ragged_all_to_all",
        tokens_name="CHUNK_TOKENS" if token_chunks > 1 else "LOCAL_TOKENS",
        rows_name="CHUNK_ROWS" if token_chunks > 1 else "ROUTED_ROWS",
    )
