"""The small specs (targets, layer extras) and float tolerance shared by the roofline tests."""

from __future__ import annotations

from typing import Any

from spec_builder import spec_yaml

from moegen.load import load_spec_bytes
from moegen.plan import Plan, make_plan
from moegen.validate import validate

REL = 1e-12  # the module sums per-transfer seconds: allow float rounding only


def plan_of(
    *,
    axes: dict[str, int],
    target: dict[str, str],
    experts: str,
    ffn: int = 512,
    top_k: int = 2,
    embed: int = 256,
    seq: int = 64,
    layer_extra: dict[str, Any] | None = None,
    overlap_chunks: int = 1,
) -> Plan:
    """8 experts, batch 8, float32 params, bfloat16 compute (embed 256, seq 64 unless given);
    `target` and `layer_extra` are spec_builder choices."""
    choices = {
        "description": "roofline test",
        "experts": 8,
        "embed": embed,
        "ffn": ffn,
        "top_k": top_k,
        "batch": 8,
        "seq_len": seq,
        "params_dtype": "float32",
        "compute_dtype": "bfloat16",
        "axes": axes,
        "strategy": experts,
        "overlap_chunks": overlap_chunks,
    }
    raw = spec_yaml(choices | (layer_extra or {}) | target)
    return make_plan(validate(load_spec_bytes(raw.encode(), "specs/roofline.yaml", "roofline")))


V5E = {"hardware": "tpu-v5e", "topology": "2x2", "kernel": "xla"}
TPU7X = {"hardware": "tpu7x", "topology": "2x2x1", "kernel": "xla"}
CPU = {"hardware": "cpu", "kernel": "xla"}
GELU_SHARED = {"activation": "gelu", "shared_ffn": 128}
