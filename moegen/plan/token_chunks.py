"""memory.token_chunks candidates: the layer planned with each chunk count that splits a
device's tokens, and what each costs (planned peaks and training FLOPs), for `moegen plan`
and `moegen tune`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from moegen.load import LoadedSpec
from moegen.plan.model import Plan, TokenChunkOption

# Chunk counts `moegen plan` lists (those that split the device's tokens evenly).
LISTED_TOKEN_CHUNKS = (1, 2, 4, 8, 16, 32)


def token_chunk_options(
    loaded: LoadedSpec, local_tokens: int, plan_of: Callable[[LoadedSpec], Plan]
) -> tuple[TokenChunkOption, ...]:
    """Each listed chunk count the spec can take, planned by `plan_of`; none where token
    chunks cannot run (the overlapped ring, FFN slices pinned above 1)."""
    spec = loaded.spec
    if spec.parallelism.overlap_chunks != 1 or (spec.memory.ffn_chunks or 1) > 1:
        return ()
    options = []
    for chunks in LISTED_TOKEN_CHUNKS:
        if local_tokens % chunks:
            continue
        plan = plan_of(with_token_chunks(loaded, chunks))
        options.append(
            TokenChunkOption(
                chunks=chunks,
                forward_peak=plan.memory.forward_peak,
                train_peak=plan.memory.train_peak,
                train_flops=plan.roofline.passes[-1].kernel_flops,
            )
        )
    return tuple(options)


def with_token_chunks(loaded: LoadedSpec, chunks: int) -> LoadedSpec:
    """The spec with memory.token_chunks set to `chunks` (valid where the options list it)."""
    memory = loaded.spec.memory.model_copy(update={"token_chunks": chunks})
    return replace(loaded, spec=loaded.spec.model_copy(update={"memory": memory}))
