"""Strategy ragged_all_to_all: each token copy travels to the device of its expert with
jax.lax.ragged_all_to_all into a receive buffer certified for the worst case, and its result
travels back the same way (templates/strategies/ragged_all_to_all.jinja)."""

from __future__ import annotations

from moegen.strategies.base import RowRequest, Strategy, TrafficRequest


def _rows(request: RowRequest) -> tuple[int, int]:
    """What a device gets when every token of its expert group sends it min(top_k, local
    experts) copies: the certified receive buffer, one call."""
    rows = request.group_tokens * request.per_token
    return request.kept(rows, request.shards * request.local_experts), 1


def _traffic(request: TrafficRequest) -> int:
    """Each copy leaves for another device and comes back: (shards - 1) / shards of them."""
    copies = request.local_tokens * request.top_k
    return (
        2
        * request.compute_bytes
        * copies
        * request.embed_dim
        * (request.shards - 1)
        // (request.shards)
    )


RAGGED_ALL_TO_ALL = Strategy(
    name="ragged_all_to_all",
    summary="token copies to their experts' devices and back (ragged all-to-all)",
    shards_experts=True,
    rows=_rows,
    traffic=_traffic,
    collective="all-to-all",
    certifies_receive_buffer=True,
    emulated_on_cpu=True,  # XLA:CPU has no ragged all-to-all
    reports_received=True,
    exchanges_rows=True,
    carries_replicas=True,
)
