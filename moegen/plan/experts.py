"""Expert placement per strategy: worst-case grouped-matmul rows and communication."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from moegen.hardware import hardware
from moegen.load import LoadedSpec
from moegen.plan.combine import CombinePlan
from moegen.plan.costs import DTYPE_BYTES
from moegen.plan.replicas import ReplicaPlan
from moegen.strategies import RowRequest, TrafficRequest, sharding_strategies, strategy


@dataclass(frozen=True)
class ExpertPlan:
    """How experts are spread and how many rows their grouped matmuls see, per device."""

    strategy: str
    axis: str | None  # "expert", or None where experts are not sharded
    shards: int  # devices along the expert axis
    local_experts: int
    group_tokens: int  # tokens of the whole expert group (a gathering strategy's rows)
    ffn_rows: int  # worst-case rows of one grouped-matmul call, before tile padding
    ffn_calls: int  # grouped-matmul calls per projection (ring steps when chunked)
    receive_rows: int  # the certified receive buffer of an exchange (0: the strategy has none)
    overlap_chunks: int
    chunk_width: int  # embedding columns per chunk
    emulates_collective: bool  # XLA:CPU lacks the strategy's collective: an all_gather twin
    communication_bytes: tuple[tuple[str, int], ...]  # forward, per strategy (the chosen first)
    capacity: int | None  # copies each expert keeps per device; None: dropless
    token_chunks: int = 1  # the device's tokens run through the experts in this many chunks
    chunks_tokens: bool = False  # token_chunks > 1
    fences_chunks: bool = False  # the chunks' flat inputs and output pass a fusion barrier
    call_tokens: int = 0  # tokens of one call of the routed experts: a chunk's, or all
    call_rows: int = 0  # their copies: call_tokens * top_k
    reports_received: bool = False  # the call also returns the rows this device received
    tokens_name: str = "LOCAL_TOKENS"  # the module constant of call_tokens
    rows_name: str = "ROUTED_ROWS"  # the module constant of call_tokens * top_k
    # groups of a device's grouped matmul: its experts, and its redundant slots after them
    local_slots: int = 0
    slots_name: str = "LOCAL_EXPERTS"  # the module constant of local_slots
    width_name: str = "EMBED_DIM"  # the module constant of the width the experts run in
    # parallelism.redundant_experts: the replicas' slots, split and weight rounds (none: empty)
    replicas: ReplicaPlan = ReplicaPlan()
    # where the combine weights apply, the permutations' gradients (set by the assembly)
    combine: CombinePlan = CombinePlan()


def capacity_groups(loaded: LoadedSpec, local_tokens: int) -> int:
    """How many groups a device's tokens count their copies in: its sequences under a
    capacity per sequence (no sequence axis splits them), else 1."""
    capacity = loaded.spec.router.capacity
    if capacity is None or capacity.per == "device":
        return 1
    return local_tokens // loaded.spec.shapes.seq_len


def group_capacity(loaded: LoadedSpec, local_tokens: int) -> int | None:
    """Copies each expert keeps of one group's tokens (a device's, or a sequence's): the
    spec's count, or ceil(factor * group tokens * top_k / num_experts)."""
    spec = loaded.spec
    capacity = spec.router.capacity
    if capacity is None:
        return None
    if capacity.copies is not None:
        return capacity.copies
    copies = local_tokens // capacity_groups(loaded, local_tokens) * spec.router.top_k
    # The factor as written (1.1 is 11/10, not the float just above it): exact arithmetic.
    factor = Fraction(repr(capacity.factor))
    return max(1, math.ceil(factor * copies / spec.layer.num_experts))


def expert_capacity(loaded: LoadedSpec, local_tokens: int) -> int | None:
    """Copies each expert keeps of a device's tokens, at most: every group's capacity."""
    per_group = group_capacity(loaded, local_tokens)
    if per_group is None:
        return None
    return capacity_groups(loaded, local_tokens) * per_group


def _row_request(
    loaded: LoadedSpec, call_tokens: int, local_slots: int, capacity: int | None
) -> RowRequest:
    """What the strategy needs to size one call's grouped-matmul rows."""
    spec = loaded.spec
    shards = spec.mesh.axes.get("expert", 1)
    return RowRequest(
        call_tokens=call_tokens,
        group_tokens=call_tokens * shards,
        # A token sends at most min(top_k, local slots) copies to any one device (its slots
        # hold distinct experts): the most rows a device can be asked to process, when every
        # token of the group picks them.
        per_token=min(spec.router.top_k, local_slots),
        top_k=spec.router.top_k,
        num_experts=spec.layer.num_experts,
        local_experts=local_slots,
        shards=shards,
        overlap_chunks=spec.parallelism.overlap_chunks,
        capacity=capacity,
    )


def expert_plan(
    loaded: LoadedSpec, local_tokens: int, token_chunks: int, *, emulate: bool
) -> ExpertPlan:
    """Expert placement, worst-case grouped-matmul rows and communication of the spec's
    strategy, the experts running on `token_chunks` chunks of the device's tokens one after
    another."""
    spec = loaded.spec
    chosen = strategy(spec.parallelism.experts)
    shards = spec.mesh.axes.get("expert", 1)
    local_experts = spec.layer.num_experts // shards
    # redundant slots (a validated spec splits them evenly) hold more experts on each device
    local_slots = local_experts + spec.parallelism.redundant_experts // shards
    top_k = spec.router.top_k
    # With token chunks, every buffer below is one chunk's: the experts run on one at a time.
    call_tokens = local_tokens // token_chunks
    chunks = spec.parallelism.overlap_chunks
    capacity = expert_capacity(loaded, local_tokens)
    rows = _row_request(loaded, call_tokens, local_slots, capacity)
    ffn_rows, calls = chosen.rows(rows)
    embed = spec.layer.routed_dim
    return ExpertPlan(
        strategy=chosen.name,
        axis="expert" if shards > 1 or chosen.shards_experts else None,
        shards=shards,
        local_experts=local_experts,
        group_tokens=rows.group_tokens,
        ffn_rows=ffn_rows,
        ffn_calls=calls,
        receive_rows=ffn_rows if chosen.certifies_receive_buffer else 0,
        overlap_chunks=chunks,
        chunk_width=embed // chunks,
        # XLA:CPU lacks some collectives: CPU twins, and modules for target cpu, emulate them
        emulates_collective=chosen.emulated_on_cpu and (emulate or spec.target.hardware == "cpu"),
        communication_bytes=_communication(loaded, local_tokens, shards)
        if chosen.shards_experts
        else (),
        capacity=capacity,
        token_chunks=token_chunks,
        chunks_tokens=token_chunks > 1,
        fences_chunks=token_chunks > 1 and _compiled_by_libtpu(loaded),
        call_tokens=call_tokens,
        call_rows=call_tokens * top_k,
        reports_received=chosen.reports_received,
        tokens_name="CHUNK_TOKENS" if token_chunks > 1 else "LOCAL_TOKENS",
        rows_name="CHUNK_ROWS" if token_chunks > 1 else "ROUTED_ROWS",
        local_slots=local_slots,
        slots_name="LOCAL_SLOTS" if local_slots > local_experts else "LOCAL_EXPERTS",
        width_name=spec.layer.routed_field.upper(),  # the module constant of the same name
    )


def _compiled_by_libtpu(loaded: LoadedSpec) -> bool:
    """A TPU target, which libtpu compiles. libtpu 0.0.51 can fuse the reshapes
    [TOKEN_CHUNKS, CHUNK_TOKENS, D] <-> [LOCAL_TOKENS, D] around the chunked experts into a
    matmul beside them (the shared expert's output, or the router's input gradient, added to
    the chunks') and then crash generating its code (a failed check, SIGABRT). Found by
    compiling drawn layers: DeepSeek-V3 in 2 and 4 token chunks on tpu7x, OLMoE's ring of
    experts in 4; the same layers at smaller batches compile. A barrier on the reshapes' flat
    side keeps them out of such fusions (tests/verify/test_tpu_chunk_fence.py)."""
    return hardware(loaded.spec.target.hardware).platform == "tpu"


def _communication(
    loaded: LoadedSpec, local_tokens: int, shards: int
) -> tuple[tuple[str, int], ...]:
    """(strategy, bytes one device moves in the forward pass) of every strategy that moves
    tokens, the spec's first: `moegen plan` sets them side by side."""
    spec = loaded.spec
    request = TrafficRequest(
        local_tokens=local_tokens,
        top_k=spec.router.top_k,
        embed_dim=spec.layer.routed_dim,
        shards=shards,
        compute_bytes=DTYPE_BYTES[spec.dtypes.compute],
    )
    traffic = {name: strategy(name).traffic(request) for name in sharding_strategies()}
    return tuple(sorted(traffic.items(), key=lambda item: item[0] != spec.parallelism.experts))
