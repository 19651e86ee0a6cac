"""Spec texts and helpers shared by the tests of stage 1, `moegen.load`."""

from __future__ import annotations

import pytest

from moegen.diagnostics import SpecError
from moegen.load import load_spec_bytes

VALID = """\
version: 1
description: a small layer
layer:
  num_experts: 8
  embed_dim: 64
  ffn_dim: 128
router:
  top_k: 2
  score: sigmoid
  renormalize: true
shapes:
  batch: 8
  seq_len: 16
dtypes:
  params: bfloat16
  compute: float32
mesh:
  axes:
    data: 2
    fsdp: 2
  batch_axes: [data, fsdp]
parallelism:
  experts: replicated
  overlap_chunks: 1
target:
  hardware: cpu
  kernel: xla
"""

MINIMAL = """\
version: 1
layer: {num_experts: 4, embed_dim: 32, ffn_dim: 64}
router: {top_k: 1}
shapes: {batch: 2, seq_len: 8}
mesh: {axes: {fsdp: 2, data: 1}}
"""


def load(text: str | bytes, name: str = "spec"):
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return load_spec_bytes(raw, "spec.yaml", name)


def errors(text: str | bytes, name: str = "spec") -> list[tuple[int, int, str, str]]:
    with pytest.raises(SpecError) as info:
        load(text, name)
    for d in info.value.diagnostics:
        assert d.file == "spec.yaml"
    return [(d.line, d.column, d.field, d.message) for d in info.value.diagnostics]


def tag_message(tag: str) -> str:
    return (
        f"YAML tag {tag!r} is not supported; remove it (a value's type is how it is written: "
        "8, 0.5, true, null, text)"
    )
