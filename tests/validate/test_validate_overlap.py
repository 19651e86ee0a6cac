"""Stage 2, `moegen.validate`: overlap chunks and FFN chunks, and the chunk counts the messages offer."""

from __future__ import annotations

import re

import pytest
from validate_cases import (
    PALLAS_V5E,
    RING,
    VALUE,
    Cases,
    loaded_spec,
    rule_tests,
)

from moegen.validate import check_rules

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "ffn_chunks_fit": [
        ({}, []),  # omitted: the plan decides
        ({"ffn_chunks": 1}, []),
        ({"ffn_chunks": 4}, []),  # 32 columns a slice (xla takes any width)
        ({**PALLAS_V5E, "ffn_chunks": 2, "ffn": 256}, []),  # 128 columns: whole lanes
        (
            {"ffn_chunks": 3},
            [
                (
                    "memory.ffn_chunks",
                    VALUE,
                    (
                        "ffn_dim 128 does not split into 3 equal slices; "
                        "valid slice counts: 2, 4, 8, 16, 32, 64, or 1"
                    ),
                )
            ],
        ),
        # a slice is a megablox output (gate, up) and contraction (down) width
        (
            {**PALLAS_V5E, "ffn_chunks": 2, "ffn": 384},
            [
                (
                    "memory.ffn_chunks",
                    VALUE,
                    (
                        "slices of 192 columns are not whole 128-lane tiles for pallas; "
                        "valid slice counts: 3, or 1"
                    ),
                )
            ],
        ),
    ],
    "weight_casts_per_slice_cast_slices": [
        ({"weight_casts": "once"}, []),
        ({"weight_casts": "per_slice", "ffn_chunks": 2, "params_dtype": "float32"}, []),
        (
            {"weight_casts": "per_slice", "params_dtype": "float32"},  # the FFN runs whole
            [
                (
                    "memory.weight_casts",
                    VALUE,
                    "per_slice needs memory.ffn_chunks > 1 (write the slices: whole, nothing "
                    "is sliced); or write once",
                )
            ],
        ),
        (
            {"weight_casts": "per_slice", "ffn_chunks": 2, "params_dtype": "bfloat16"},
            [
                (
                    "memory.weight_casts",
                    VALUE,
                    "per_slice needs dtypes params float32 and compute bfloat16 (here bfloat16 "
                    "and bfloat16: no float32 weight is cast to bfloat16); or write once",
                )
            ],
        ),
    ],
    "token_chunks_fit": [
        ({}, []),
        ({"token_chunks": 1}, []),
        ({"token_chunks": 4}, []),  # 16 x 32 tokens over data 2 x fsdp 2: 128 per device
        ({"token_chunks": 2, "strategy": "ring_of_experts", "axes": {"data": 2, "expert": 2}}, []),
        (
            {"token_chunks": 3},
            [
                (
                    "memory.token_chunks",
                    VALUE,
                    (
                        "128 tokens per device do not split into 3 equal chunks; valid counts: "
                        "2, 4, 8, 16, 32, 64, or 1"
                    ),
                )
            ],
        ),
        ({"token_chunks": 2, "ffn_chunks": 2}, []),  # each chunk runs the FFN in slices
        (
            {**RING, "token_chunks": 2, "overlap_chunks": 2},
            [
                (
                    "memory.token_chunks",
                    VALUE,
                    (
                        "token_chunks 2 with overlap_chunks 2: the overlapped ring already runs its "
                        "matmuls chunk by chunk; set one of them to 1"
                    ),
                )
            ],
        ),
    ],
    "ffn_chunks_without_overlap": [
        ({**RING, "ffn_chunks": 2}, []),
        ({**RING, "overlap_chunks": 2, "ffn_chunks": 1}, []),
        (
            {**RING, "overlap_chunks": 2, "ffn_chunks": 2},
            [
                (
                    "memory.ffn_chunks",
                    VALUE,
                    (
                        "ffn_chunks 2 with overlap_chunks 2: the overlapped ring slices the "
                        "embedding, not the FFN width; set ffn_chunks 1 or overlap_chunks 1"
                    ),
                )
            ],
        ),
    ],
    "overlap_chunks_fit": [
        ({}, []),  # 1 chunk: no overlap
        ({**RING, "overlap_chunks": 2}, []),
        ({**RING, "overlap_chunks": 64}, []),  # one column a chunk is wasteful, not wrong, for xla
        ({**RING, **PALLAS_V5E, "overlap_chunks": 4, "embed": 512}, []),  # 128 columns a chunk
        ({**RING, **PALLAS_V5E, "overlap_chunks": 3, "embed": 768}, []),  # 256 columns a chunk
        # only ring_of_experts gathers tokens to overlap
        (
            {"overlap_chunks": 2},
            [
                (
                    "parallelism.overlap_chunks",
                    VALUE,
                    (
                        "2 chunks overlap the token all-gather of ring_of_experts; "
                        "experts: replicated has none to overlap; set 1"
                    ),
                )
            ],
        ),
        (
            {"overlap_chunks": 4, "axes": {"expert": 4}, "strategy": "ragged_all_to_all"},
            [
                (
                    "parallelism.overlap_chunks",
                    VALUE,
                    (
                        "4 chunks overlap the token all-gather of ring_of_experts; "
                        "experts: ragged_all_to_all has none to overlap; set 1"
                    ),
                )
            ],
        ),
        # chunks hold equal numbers of columns (MaxText's 7 chunks over 512 drop one)
        (
            {**RING, "overlap_chunks": 7, "embed": 512},
            [
                (
                    "parallelism.overlap_chunks",
                    VALUE,
                    (
                        "embed_dim 512 does not split into 7 equal chunks; "
                        "valid chunk counts: 2, 4, 8, 16, 32, 64, or 1 (no overlap)"
                    ),
                )
            ],
        ),
        (
            {**RING, "overlap_chunks": 5, "embed": 96},
            [
                (
                    "parallelism.overlap_chunks",
                    VALUE,
                    (
                        "embed_dim 96 does not split into 5 equal chunks; "
                        "valid chunk counts: 2, 3, 4, 6, 8, 12, 16, 24, or 1 (no overlap)"
                    ),
                )
            ],
        ),
        # pallas: a chunk is a contraction block of whole 128-lane tiles
        (
            {**RING, **PALLAS_V5E, "overlap_chunks": 4, "embed": 768},
            [
                (
                    "parallelism.overlap_chunks",
                    VALUE,
                    (
                        "chunks of 192 columns are not whole 128-lane tiles for the pallas kernel; "
                        "valid chunk counts: 2, 3, 6, or 1 (no overlap)"
                    ),
                )
            ],
        ),
        (
            {**RING, **PALLAS_V5E, "overlap_chunks": 64, "embed": 4096},
            [
                (
                    "parallelism.overlap_chunks",
                    VALUE,
                    (
                        "chunks of 64 columns are not whole 128-lane tiles for the pallas kernel; "
                        "valid chunk counts: 2, 4, 8, 16, 32, or 1 (no overlap)"
                    ),
                )
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


@pytest.mark.parametrize(
    ("chunks", "embed", "target"),
    [
        pytest.param(7, 512, {}, id="xla-uneven"),
        pytest.param(5, 96, {}, id="xla-uneven-small"),
        pytest.param(4, 768, PALLAS_V5E, id="pallas-unaligned"),
        pytest.param(64, 4096, PALLAS_V5E, id="pallas-unaligned-many"),
        pytest.param(3, 4096, PALLAS_V5E, id="pallas-uneven"),
        pytest.param(5, 768, PALLAS_V5E, id="pallas-uneven-768"),
    ],
)
def test_overlap_chunk_advice_followed_passes(chunks: int, embed: int, target: dict) -> None:
    """Every chunk count the overlap message lists passes every rule when written instead."""
    loaded = loaded_spec({"overlap_chunks": chunks, "embed": embed, **RING, **target})
    [message] = [d.message for d in check_rules(loaded)]
    listed = re.findall(r"\d+", message.rsplit("valid chunk counts: ", 1)[1])
    assert "1" in listed  # no overlap is always a way out
    for count in listed:
        again = loaded_spec({"overlap_chunks": int(count), "embed": embed, **RING, **target})
        assert check_rules(again) == [], (count, message)


@pytest.mark.parametrize(
    ("chunks", "embed", "target"),
    [
        pytest.param(2, 67, {}, id="xla-prime-embed"),
        pytest.param(4, 96, PALLAS_V5E, id="pallas-narrow-embed"),
    ],
)
def test_overlap_chunks_with_no_valid_count_offers_one(
    chunks: int, embed: int, target: dict
) -> None:
    loaded = loaded_spec({"overlap_chunks": chunks, "embed": embed, **RING, **target})
    [message] = [d.message for d in check_rules(loaded)]
    assert "none" not in message
    assert re.search(r"\b1\b", message), message
