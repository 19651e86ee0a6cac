"""Strategy ring_of_experts: every device gathers the expert group's tokens, runs its own
experts on all of them and reduce-scatters the partial outputs in float32; with overlap
chunks, the gather runs around the ring chunk by chunk behind the gate and up matmuls
(templates/strategies/ring_of_experts.jinja)."""

from __future__ import annotations

from moegen.strategies.base import RowRequest, Strategy, TrafficRequest


def _rows(request: RowRequest) -> tuple[int, int]:
    """Overlapped: one call per ring step, on the copies one device's tokens send to my
    experts. Else one call on the whole group's copies to my experts."""
    if request.overlap_chunks > 1:
        rows = request.call_tokens * request.per_token
        return request.kept(rows, request.local_experts), request.shards
    rows = request.group_tokens * request.per_token
    return request.kept(rows, request.shards * request.local_experts), 1


def _traffic(request: TrafficRequest) -> int:
    """Tokens gathered in the compute dtype, partial outputs reduce-scattered in float32."""
    per_token = (request.compute_bytes + 4) * request.embed_dim
    return per_token * request.local_tokens * (request.shards - 1)


RING_OF_EXPERTS = Strategy(
    name="ring_of_experts",
    summary="the group's tokens gathered, partial outputs reduce-scattered",
    shards_experts=True,
    rows=_rows,
    traffic=_traffic,
    collective="gather",
    gathers_group=True,
    overlaps=True,
)
