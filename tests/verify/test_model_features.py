"""The model-family features of issue 18, each through the whole pipeline and the verify
step's twin parity (forward, aux, gradients of every parameter and the input) against the
dense reference: alone, and combined with every expert strategy and kernel.

The features: clamped / scaled / offset gated activations (`layer.glu`, gpt-oss, DeepSeek-V4),
a router linear bias (gpt-oss), combine weights on the expert input (Llama 4), a sigmoid gate
on the shared expert (Qwen2-MoE), a selection bias on softmax probabilities (ERNIE 4.5), and
group scores by the sum of the best n or the max (DeepSeek-V3, DeepSeek-V2).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import assert_twin_parity
from ruff.__main__ import find_ruff_bin

from moegen.pipeline import generate
from moegen.verify import verify

LAYER = {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48}
BASE = {
    "version": 1,
    "layer": LAYER,
    "router": {"top_k": 2},
    "shapes": {"batch": 8, "seq_len": 8},
    "dtypes": {"params": "float32", "compute": "float32"},
    "mesh": {"axes": {"data": 2}},
}

# feature -> (layer and router fields, code the rendered module must contain)
FEATURES: dict[str, tuple[dict, dict, list[str]]] = {
    "gpt_oss": (
        {"glu": "gpt_oss", "ffn_bias": True},
        {"top_k": 2, "score_after_top_k": True, "linear_bias": True},
        ["def _glu(", "jnp.clip(up, -UP_LIMIT, UP_LIMIT)", 'weights["router_bias"]'],
    ),
    "clamped_swiglu": (
        {"glu": {"gate_limit": 0.5, "up_limit": 0.5}, "shared_ffn_dim": 16},
        {"top_k": 2, "score": "sqrtsoftplus", "renormalize": True},
        ["GATE_LIMIT = 0.5", "_glu(gate, up)"],
    ),
    "geglu_offset": (
        {"activation": "geglu", "glu": {"up_offset": 1.0}},
        {"top_k": 2},
        ["(up + UP_OFFSET)", "_gelu(gate)"],
    ),
    "llama4_input_weighting": (
        {"shared_ffn_dim": 16},
        {"top_k": 1, "score": "sigmoid", "weighting": "input"},
        ["_weigh_rows(", "input_weights"],
    ),
    "input_weighting_top2_biases": (
        {"ffn_bias": True},
        {"top_k": 2, "renormalize": True, "weighting": "input"},
        ["_weigh_rows("],
    ),
    "qwen2_gated_shared_expert": (
        {"shared_ffn_dim": 16, "shared_expert_gate": True},
        {"top_k": 2},
        ['weights["shared_expert_gate"]'],
    ),
    "ernie_softmax_routing_bias": (
        {},
        {"top_k": 2, "routing_bias": True, "renormalize": True},
        ['selection = scores + weights["routing_bias"]'],
    ),
    "deepseek_v2_group_max": (
        {"num_experts": 16},
        {"top_k": 3, "group_limit": {"groups": 4, "keep": 2, "top_per_group": 1}},
        ["group_scores = grouped.max(axis=-1)"],
    ),
    "deepseek_v3_group_top2_keep_not_dividing": (
        {"num_experts": 16},
        {"top_k": 3, "score": "sigmoid", "routing_bias": True,
         "group_limit": {"groups": 4, "keep": 2}},
        ["GROUP_TOP_K = 2"],
    ),
}  # fmt: skip

STRATEGIES = {
    "replicated": ({"data": 2}, {}),
    "ragged_all_to_all": ({"data": 2, "expert": 2}, {"experts": "ragged_all_to_all"}),
    "ring_of_experts": ({"expert": 2}, {"experts": "ring_of_experts"}),
    "ring_overlapped": ({"expert": 2}, {"experts": "ring_of_experts", "overlap_chunks": 2}),
}
# Every feature with every strategy on the portable kernel; every feature once on pallas
# (interpreted on CPU by the twin) and with FFN slices.
CASES = [(feature, strategy, "xla", None) for feature in FEATURES for strategy in STRATEGIES] + [
    (feature, "ragged_all_to_all", "pallas", None) for feature in FEATURES
] + [(feature, "replicated", "xla", 2) for feature in FEATURES]  # fmt: skip


def spec_of(feature: str, strategy: str, kernel: str, ffn_chunks: int | None) -> dict:
    layer, router, _ = FEATURES[feature]
    axes, parallelism = STRATEGIES[strategy]
    spec = dict(BASE)
    spec["layer"] = {**LAYER, **layer}
    spec["router"] = router
    spec["mesh"] = {"axes": axes}
    if parallelism:
        spec["parallelism"] = parallelism
    if kernel != "xla":
        # megablox tiles want 128-lane widths; the twin shrinks the rest
        spec["layer"] = {**spec["layer"], "embed_dim": 256, "ffn_dim": 256}
        spec["target"] = {"kernel": kernel, "hardware": "tpu-v5e", "topology": "2x2"}
        spec["mesh"] = {"axes": {"data": 2, "expert": 2}}
    if ffn_chunks:
        spec["memory"] = {"ffn_chunks": ffn_chunks}
    return spec


def _generate(spec: dict, name: str, tmp_path: Path, monkeypatch):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    return generate(Path(path.name))


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_feature_renders_its_code(feature, tmp_path, monkeypatch):
    generated = _generate(
        spec_of(feature, "replicated", "xla", None), feature, tmp_path, monkeypatch
    )
    for code in FEATURES[feature][2]:
        assert code in generated.source, code
    # the project's own lint (line length included), as for the committed modules
    lint = subprocess.run(
        [find_ruff_bin(), "check", "--isolated", "--select=E,F,W,I,B,UP", "--line-length=100", "-"],
        input=generated.source,
        capture_output=True,
        text=True,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize(("feature", "strategy", "kernel", "ffn_chunks"), CASES)
@pytest.mark.slow
def test_feature_matches_dense_reference(
    feature, strategy, kernel, ffn_chunks, tmp_path, monkeypatch
):
    spec = spec_of(feature, strategy, kernel, ffn_chunks)
    generated = _generate(spec, "layer", tmp_path, monkeypatch)
    report = verify(generated.loaded, generated.source, run_compiles=False)
    assert_twin_parity(report)
