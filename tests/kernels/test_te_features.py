"""The model-family features (issue 18) on the te kernel: each family's spec, its GPU target
and kernel te, built end to end (twins, which stand ragged_dot in for TE; then the forward
and forward+backward lowered for CUDA with TE's grouped GEMMs). The features live in the
JAX code around the grouped GEMMs, so what this adds over the twins is that they trace and
lower with TE's custom calls and VJP. Needs TE (`make te`); skipped without it, failed
without it under MOEGEN_REQUIRE_TE=1 (`make test-te`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import assert_no_traceback, run_moegen

pytestmark = pytest.mark.gpu_library("te")


GPU = {"hardware": "gpu-h100", "topology": 8, "kernel": "te"}
LAYER = {"num_experts": 16, "embed_dim": 512, "ffn_dim": 512}
SHAPES = {"batch": 8, "seq_len": 256}

# family -> (layer fields, router fields, mesh axes, parallelism, quantization)
FAMILIES = {
    "gpt_oss": (
        {"glu": "gpt_oss", "ffn_bias": True},
        {"top_k": 4, "score_after_top_k": True, "linear_bias": True},
        {"fsdp": 2, "expert": 4},
        {"experts": "ragged_all_to_all"},
        "none",
    ),
    "llama4_fp8": (
        {"shared_ffn_dim": 512},
        {"top_k": 1, "score": "sigmoid", "weighting": "input"},
        {"fsdp": 8},
        {},
        "fp8",
    ),
    "qwen2_moe_ring": (
        {"shared_ffn_dim": 1024, "shared_expert_gate": True},
        {"top_k": 4},
        {"data": 2, "expert": 4},
        {"experts": "ring_of_experts"},
        "none",
    ),
    # Nemotron-H: relu^2 experts in a latent width (TE's grouped GEMMs see L, not D)
    "nemotron_h_latent": (
        {"activation": "relu2", "latent_dim": 256, "latent_bias": True, "shared_ffn_dim": 512},
        {"top_k": 4, "score": "sigmoid", "renormalize": True, "routing_bias": True},
        {"expert": 8},
        {"experts": "ragged_all_to_all"},
        "none",
    ),
    "ernie_deepseek_v2": (
        {"glu": {"gate_limit": 10.0, "up_limit": 10.0}, "shared_ffn_dim": 512},
        {
            "top_k": 3,
            "renormalize": True,
            "routing_bias": True,
            "group_limit": {"groups": 4, "keep": 2, "top_per_group": 1},
        },
        {"expert": 8},
        {"experts": "ragged_all_to_all"},
        "none",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_features_build_and_lower_with_te(family: str, tmp_path: Path) -> None:
    layer, router, axes, parallelism, quantization = FAMILIES[family]
    spec = {
        "version": 1,
        "layer": {**LAYER, **layer},
        "router": router,
        "shapes": SHAPES,
        "mesh": {"axes": axes},
        "parallelism": parallelism,
        "target": {**GPU, "quantization": quantization},
    }
    (tmp_path / f"{family}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_moegen("build", "--out", "out", f"{family}.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_no_traceback(result.stderr)
    lowered = re.search(
        r"lower forward\+backward for cuda .*te_grouped_gemm_ffi x(\d+)", result.stderr
    )
    assert lowered, result.stderr
    assert int(lowered.group(1)) >= 6  # gate/up (one call or two), down; dgrad, wgrad of each
