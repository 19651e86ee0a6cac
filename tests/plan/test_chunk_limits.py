"""Overlap chunks and FFN slices are bounded (validate/bounds.py): a huge count is refused
at its value, quickly, instead of a twin a million columns wide."""

from __future__ import annotations

import pytest

from moegen.diagnostics import SpecError
from moegen.load import load_spec_bytes
from moegen.validate import validate
from moegen.validate.bounds import MAX_CHUNKS

BASE = """\
version: 1
layer: {{num_experts: 4, embed_dim: 256, ffn_dim: {ffn}}}
router: {{top_k: 1}}
shapes: {{batch: 2, seq_len: 8}}
mesh: {{axes: {{data: 2, expert: 2}}}}
parallelism: {{experts: ring_of_experts, overlap_chunks: {overlap}}}
memory: {{ffn_chunks: {ffn_chunks}}}
"""


def _messages(**values: int) -> list[tuple[int, int, str, str]]:
    text = BASE.format(**({"ffn": 256, "overlap": 1, "ffn_chunks": 1} | values))
    try:
        validate(load_spec_bytes(text.encode(), "spec.yaml", "spec"))
    except SpecError as err:
        return [(d.line, d.column, d.field, d.message) for d in err.diagnostics]
    return []


@pytest.mark.parametrize("count", [MAX_CHUNKS + 1, 2**20, 2**31 - 1])
def test_ffn_slices_past_the_limit_are_refused_at_the_value(count: int) -> None:
    found = _messages(ffn=2**20, ffn_chunks=count)
    limit = [m for m in found if f"at most {MAX_CHUNKS}" in m[3]]
    assert limit == [
        (
            7,
            22,
            "memory.ffn_chunks",
            f"{count} FFN slices; at most {MAX_CHUNKS}: each is a step of the generated layer "
            "(and of the twin `moegen build` verifies), and pieces this narrow cost more in "
            "step overhead than they save",
        )
    ]


@pytest.mark.parametrize("count", [MAX_CHUNKS + 1, 2**31 - 1])
def test_overlap_chunks_past_the_limit_are_refused_at_the_value(count: int) -> None:
    found = _messages(overlap=count)
    assert [(m[0], m[2]) for m in found if f"at most {MAX_CHUNKS}" in m[3]] == [
        (6, "parallelism.overlap_chunks")
    ]


def test_counts_at_the_limit_pass_the_bound() -> None:
    found = _messages(ffn=MAX_CHUNKS * 4, ffn_chunks=MAX_CHUNKS)
    assert not [m for m in found if "at most" in m[3]], found
    found = _messages(overlap=MAX_CHUNKS)
    assert not [m for m in found if "at most" in m[3]], found
