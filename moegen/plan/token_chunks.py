"""memory.token_chunks: the count the plan chooses when the spec omits it, and the candidates
(each chunk count that splits a device's tokens, alone and with FFN slices) with what each
costs (planned peaks, training FLOPs, communication), for `moegen plan`, `moegen tune` and
bench/maxtext.py. Each is a trade of one shape (`moegen.plan.trades`), never a rewritten
spec planned again."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from moegen.plan.headroom import memory_peak, over_hbm
from moegen.plan.memory import TRADE_HEADROOM, MemoryPlan, fits
from moegen.plan.model import TokenChunkOption, Trade

# Chunk counts `moegen plan` lists (those that split the device's tokens evenly).
LISTED_TOKEN_CHUNKS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class TradeOutcome:
    """What one trade of a shape holds and costs, per device."""

    token_chunks: int
    ffn_chunks: int  # the pinned FFN slices, or those the plan chooses for these chunks
    memory: MemoryPlan
    train_flops: int  # a training step's FLOPs as run (worst-case buffers, recomputation)
    ici_bytes: int
    train_s: float = 0.0  # a training step's estimated seconds (moegen.plan.step_time)

    def option(self) -> TokenChunkOption:
        return TokenChunkOption(
            chunks=self.token_chunks,
            ffn_chunks=self.ffn_chunks,
            forward_peak=self.memory.forward_peak,
            train_peak=self.memory.train_peak,
            train_flops=self.train_flops,
            ici_bytes=self.ici_bytes,
            train_s=self.train_s,
        )


OutcomeOf = Callable[[Trade], TradeOutcome]


def default_token_chunks(
    pinned: Trade, local_tokens: int, overlap_chunks: int, outcome_of: OutcomeOf
) -> int:
    """The token chunks of a shape whose spec omits memory.token_chunks. One chunk when the layer
    fits the target's HBM by the plan with the FFN whole or in the slices the spec pins (whether to
    trade at all allows the ledger's over-estimate, as the refusal does, moegen.fit.refusal: nearer
    HBM than that the compile decides). Else, of the trades that fit with the ledger's headroom
    (TRADE_HEADROOM), the fastest by the plan's step time: one chunk in the FFN slices the plan
    chose (or pinned), or each listed chunk count (a chunked layer's FFN whole, unless pinned); on
    the chip a few token chunks often cost less than the fewest slices that fit (bench/trade_time).
    Else, of the plan's slices and the chunk counts that fit at all, the one planned lowest; else
    one chunk (the refusal then names what would fit)."""
    whole = outcome_of(Trade(None, pinned.ffn_chunks))
    if overlap_chunks != 1:
        return 1
    pinned_slices = pinned.ffn_chunks is not None
    if (whole.ffn_chunks == 1 or pinned_slices) and not over_hbm(whole.memory):
        return 1  # no trade of the plan's own: a layer that fits is left as written
    chunked = [outcome_of(Trade(c, pinned.ffn_chunks)) for c in _chunk_counts(local_tokens)[1:]]
    roomy = [o for o in (whole, *chunked) if fits(o.memory, TRADE_HEADROOM)]
    if roomy:
        return min(roomy, key=_fastest).token_chunks
    # None keeps the headroom: the one planned lowest, where the ledger's error hurts least
    fitting = [o for o in (whole, *chunked) if not over_hbm(o.memory)]
    return min(fitting, key=lambda o: memory_peak(o.memory)).token_chunks if fitting else 1


def _fastest(outcome: TradeOutcome) -> tuple[float, int]:
    """The plan's step time, then fewer chunks (all equal where the target has no chip
    figures: the fewest chunks)."""
    return (outcome.train_s, outcome.token_chunks)


def token_chunk_options(
    pinned: Trade, local_tokens: int, overlap_chunks: int, outcome_of: OutcomeOf
) -> tuple[TokenChunkOption, ...]:
    """Each listed chunk count the shape can take, with the spec's FFN slices (pinned, or the
    plan's); none where token chunks cannot run (the overlapped ring)."""
    if overlap_chunks != 1:
        return ()
    return tuple(
        outcome_of(Trade(chunks, pinned.ffn_chunks)).option()
        for chunks in _chunk_counts(local_tokens)
    )


def sliced_token_chunk_options(
    local_tokens: int, overlap_chunks: int, outcome_of: OutcomeOf, slice_counts: Iterable[int]
) -> tuple[TokenChunkOption, ...]:
    """Every listed chunk count above 1 with every slice count above 1 of `slice_counts`
    (those memory.ffn_chunks lists), both pinned, chunks first."""
    if overlap_chunks != 1:
        return ()
    slices = sorted(s for s in set(slice_counts) if s > 1)
    return tuple(
        outcome_of(Trade(chunks, count)).option()
        for chunks in _chunk_counts(local_tokens)
        if chunks > 1
        for count in slices
    )


def _chunk_counts(local_tokens: int) -> list[int]:
    return [c for c in LISTED_TOKEN_CHUNKS if local_tokens % c == 0]
