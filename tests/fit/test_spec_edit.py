"""Memory fields written into a spec's own text (moegen.fit.spec_edit): replaced where written,
inserted where not, in every layout a user writes (block, flow, none; CRLF, a byte-order
mark, comments, quotes), every other byte kept; a layout it cannot place is refused, not
written wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moegen.fit import CannotEdit, with_memory_fields
from moegen.load import load_spec_bytes

BASE = Path(__file__).resolve().parents[2] / "specs" / "mixtral_8x7b_v5e.yaml"
TRADE = {("memory", "token_chunks"): 4, ("memory", "ffn_chunks"): 2}


def _loaded(text: str):
    return load_spec_bytes(text.encode("utf-8"), "specs/x.yaml", "x", BASE.parent)


def _base() -> str:
    return BASE.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "memory", "expected"),
    [
        ("no memory section", "", "memory:\n  ffn_chunks: 2\n  token_chunks: 4\n"),
        (
            "block, other keys and comments",
            "memory:\n  # why\n  fit_check: plan  # kept\n",
            "memory:\n  # why\n  ffn_chunks: 2\n  token_chunks: 4\n  fit_check: plan  # kept\n",
        ),
        (
            "block, values written (quoted, commented)",
            "memory:\n  token_chunks: 'auto'   # tune me\n  ffn_chunks: 16\n",
            "memory:\n  token_chunks: 4   # tune me\n  ffn_chunks: 2\n",
        ),
        (
            "flow",
            "memory: {fit_check: plan}\n",
            "memory: {ffn_chunks: 2, token_chunks: 4, fit_check: plan}\n",
        ),
        ("flow, empty", "memory: {}\n", "memory: {ffn_chunks: 2, token_chunks: 4}\n"),
        (
            "flow, values written",
            'memory: {token_chunks: 2, ffn_chunks: "auto"}\n',
            "memory: {token_chunks: 4, ffn_chunks: 2}\n",
        ),
    ],
)
def test_the_trade_is_written_and_nothing_else_changes(name, memory, expected):
    base = _base()
    edited = with_memory_fields(_loaded(base + memory), TRADE)
    assert edited.source.text == base + expected, name
    assert (edited.spec.memory.token_chunks, edited.spec.memory.ffn_chunks) == (4, 2)


def test_a_spec_without_a_final_newline_gets_its_section_on_a_line_of_its_own():
    base = _base().rstrip("\n")
    edited = with_memory_fields(_loaded(base), TRADE)
    assert edited.source.text == base + "\nmemory:\n  ffn_chunks: 2\n  token_chunks: 4\n"


def test_crlf_line_ends_stay_crlf():
    base = _base().replace("\n", "\r\n")
    edited = with_memory_fields(_loaded(base + "memory:\r\n  fit_check: plan\r\n"), TRADE)
    assert edited.source.text == base + (
        "memory:\r\n  ffn_chunks: 2\r\n  token_chunks: 4\r\n  fit_check: plan\r\n"
    )


def test_a_byte_order_mark_before_a_first_line_memory_mapping():
    edited = with_memory_fields(_loaded("\ufeffmemory: {ffn_chunks: 8}\n" + _base()), TRADE)
    assert edited.source.text.startswith("\ufeffmemory: {token_chunks: 4, ffn_chunks: 2}\n")


def test_fit_check_is_written_as_a_word():
    edited = with_memory_fields(_loaded(_base()), {("memory", "fit_check"): "compile"})
    assert edited.source.text.endswith("memory:\n  fit_check: compile\n")
    assert edited.spec.memory.fit_check == "compile"


def test_a_layout_it_cannot_place_is_refused():
    as_json = json.dumps(yaml.safe_load(_base()))  # one flow mapping, valid YAML
    with pytest.raises(CannotEdit, match="one flow mapping"):
        with_memory_fields(_loaded(as_json), TRADE)


def test_a_first_key_whose_line_opens_a_flow_mapping_is_not_the_document_one():
    # the first key's row ends with the brace of its own value, not of the document
    layer = "layer:\n  num_experts: 8\n  embed_dim: 4096\n  ffn_dim: 14336\n"
    text = _base().replace(layer, "")
    flow = "layer: {\n  num_experts: 8, embed_dim: 4096,\n  ffn_dim: 14336}\n"
    assert layer in _base()
    edited = with_memory_fields(_loaded(flow + text), TRADE)
    assert edited.source.text == flow + text + "memory:\n  ffn_chunks: 2\n  token_chunks: 4\n"


def test_only_memory_fields_are_written():
    with pytest.raises(CannotEdit, match="not a memory field"):
        with_memory_fields(_loaded(_base()), {("shapes", "batch"): 8})
