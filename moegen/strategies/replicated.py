"""Strategy replicated: every device holds every expert and runs them on its own tokens;
nothing moves between devices (templates/strategies/replicated.jinja)."""

from __future__ import annotations

from moegen.strategies.base import RowRequest, Strategy


def _rows(request: RowRequest) -> tuple[int, int]:
    """Every copy of the device's tokens, over all experts, in one call."""
    return request.kept(request.call_tokens * request.top_k, request.num_experts), 1


REPLICATED = Strategy(
    name="replicated",
    summary="every device runs every expert on its own tokens",
    shards_experts=False,
    rows=_rows,
)
