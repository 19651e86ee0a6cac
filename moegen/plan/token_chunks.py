"""memory.token_chunks candidates: the layer planned with each chunk count that splits a
device's tokens, alone and with FFN slices, and what each costs (planned peaks, training
FLOPs, communication), for `moegen plan`, `moegen tune` and bench/maxtext.py."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from moegen.load import LoadedSpec
from moegen.plan.fit import cannot_fit, peak
from moegen.plan.memory import TRADE_HEADROOM, fits
from moegen.plan.model import Plan, TokenChunkOption

# Chunk counts `moegen plan` lists (those that split the device's tokens evenly).
LISTED_TOKEN_CHUNKS = (1, 2, 4, 8, 16, 32)

PlanOf = Callable[[LoadedSpec], Plan]


def default_token_chunks(loaded: LoadedSpec, local_tokens: int, plan_of: PlanOf) -> Plan:
    """The plan of a spec that omits memory.token_chunks. One chunk when the layer fits the
    target's HBM by the plan with the FFN whole or in the slices the spec pins (whether to
    trade at all allows the ledger's over-estimate, as the refusal does, plan.fit: nearer HBM
    than that the compile decides), or in the FFN slices the plan chose with the ledger's
    headroom (TRADE_HEADROOM). Else the fewest listed chunks that fit with the headroom;
    else, of the plan's slices and the chunk counts that fit at all, the one planned lowest;
    else one chunk (the refusal then names what would fit)."""
    whole = plan_of(loaded)
    if loaded.spec.parallelism.overlap_chunks != 1:
        return whole
    pinned_slices = loaded.spec.memory.ffn_chunks is not None
    if (whole.ffn.chunks == 1 or pinned_slices) and not cannot_fit(whole):
        return whole  # no trade of the plan's own: a layer that fits is left as written
    if fits(whole.memory, TRADE_HEADROOM):
        return whole  # the FFN slices keep the headroom
    chunked = [
        plan_of(with_memory(loaded, token_chunks=c)) for c in _chunk_counts(local_tokens)[1:]
    ]
    roomy = next((plan for plan in chunked if fits(plan.memory, TRADE_HEADROOM)), None)
    if roomy is not None:
        return roomy
    # None keeps the headroom: the one planned lowest, where the ledger's error hurts least
    fitting = [plan for plan in (whole, *chunked) if not cannot_fit(plan)]
    return min(fitting, key=peak) if fitting else whole


def token_chunk_options(
    loaded: LoadedSpec, local_tokens: int, plan_of: PlanOf
) -> tuple[TokenChunkOption, ...]:
    """Each listed chunk count the spec can take, with the spec's FFN slices (pinned, or the
    plan's), planned by `plan_of`; none where token chunks cannot run (the overlapped ring)."""
    if loaded.spec.parallelism.overlap_chunks != 1:
        return ()
    return tuple(
        _option(plan_of(with_memory(loaded, token_chunks=chunks)))
        for chunks in _chunk_counts(local_tokens)
    )


def sliced_token_chunk_options(
    loaded: LoadedSpec, local_tokens: int, plan_of: PlanOf, slice_counts: Iterable[int]
) -> tuple[TokenChunkOption, ...]:
    """Every listed chunk count above 1 with every slice count above 1 of `slice_counts`
    (those memory.ffn_chunks lists), both pinned, planned by `plan_of`, chunks first."""
    if loaded.spec.parallelism.overlap_chunks != 1:
        return ()
    slices = sorted(s for s in set(slice_counts) if s > 1)
    return tuple(
        _option(plan_of(with_memory(loaded, token_chunks=chunks, ffn_chunks=count)))
        for chunks in _chunk_counts(local_tokens)
        if chunks > 1
        for count in slices
    )


def _chunk_counts(local_tokens: int) -> list[int]:
    return [c for c in LISTED_TOKEN_CHUNKS if local_tokens % c == 0]


def _option(plan: Plan) -> TokenChunkOption:
    return TokenChunkOption(
        chunks=plan.experts.token_chunks,
        ffn_chunks=plan.ffn.chunks,
        forward_peak=plan.memory.forward_peak,
        train_peak=plan.memory.train_peak,
        train_flops=plan.roofline.passes[-1].kernel_flops,
        ici_bytes=plan.network.ici_bytes,
    )


def with_memory(loaded: LoadedSpec, **fields: int) -> LoadedSpec:
    """The spec with memory fields set (token_chunks=, ffn_chunks=: valid where the options
    list them)."""
    memory = loaded.spec.memory.model_copy(update=fields)
    return replace(loaded, spec=loaded.spec.model_copy(update={"memory": memory}))
