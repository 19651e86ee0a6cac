"""The small specs (targets, layer extras) and float tolerance shared by the roofline tests."""

from __future__ import annotations

from moegen.load import load_spec_bytes
from moegen.plan import Plan, make_plan
from moegen.validate import validate

REL = 1e-12  # the module sums per-transfer seconds: allow float rounding only


def plan_of(
    *,
    axes: dict[str, int],
    target: str,
    experts: str,
    ffn: int = 512,
    top_k: int = 2,
    embed: int = 256,
    seq: int = 64,
    layer_extra: str = "",
    overlap_chunks: int = 1,
) -> Plan:
    """8 experts, batch 8, float32 params, bfloat16 compute (embed 256, seq 64 unless given)."""
    mesh = "".join(f"    {name}: {size}\n" for name, size in axes.items())
    raw = f"""\
version: 1
description: roofline test
layer:
  num_experts: 8
  embed_dim: {embed}
  ffn_dim: {ffn}
{layer_extra}router:
  top_k: {top_k}
shapes:
  batch: 8
  seq_len: {seq}
dtypes:
  params: float32
  compute: bfloat16
mesh:
  axes:
{mesh}parallelism:
  experts: {experts}
  overlap_chunks: {overlap_chunks}
target:
{target}"""
    return make_plan(validate(load_spec_bytes(raw.encode(), "specs/roofline.yaml", "roofline")))


V5E = "  hardware: tpu-v5e\n  topology: 2x2\n  kernel: xla\n"
TPU7X = "  hardware: tpu7x\n  topology: 2x2x1\n  kernel: xla\n"
CPU = "  hardware: cpu\n  kernel: xla\n"
GELU_SHARED = "  activation: gelu\n  shared_ffn_dim: 128\n"
