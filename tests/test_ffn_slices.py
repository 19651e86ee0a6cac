"""memory.ffn_chunks: the expert FFN in slices of its width, run one at a time (lax.scan) and
recomputed in the backward pass, through the whole pipeline: validate, plan, render, and the
verify step's twin parity (forward, aux and every gradient) against the dense reference.

The memory it saves is measured on the TPU compile of the reference spec
(specs/mixtral_8x7b_ep_a2a_v5e.yaml, `moegen build` and bench/RESULTS.md); here, that each
strategy and kernel computes the same layer with slices as without.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from moegen.hardware import hardware
from moegen.load import load_spec_bytes
from moegen.pipeline import generate
from moegen.plan import make_plan
from moegen.validate import validate
from moegen.verify import verify

REPO_ROOT = Path(__file__).resolve().parent.parent
BASE = {
    "version": 1,
    "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48},
    "router": {"top_k": 2},
    "shapes": {"batch": 8, "seq_len": 8},
    "dtypes": {"params": "float32", "compute": "float32"},
    "mesh": {"axes": {"data": 2}},
}

# name -> overrides merged into BASE (each sets memory.ffn_chunks)
CASES: dict[str, dict] = {
    "a2a_fsdp_swiglu_4_slices": {
        "mesh": {"axes": {"fsdp": 2, "expert": 2}},
        "parallelism": {"experts": "ragged_all_to_all"},
        "memory": {"ffn_chunks": 4},
    },
    "replicated_gelu_bias_shared_3_slices": {
        "layer": {
            "num_experts": 8,
            "embed_dim": 32,
            "ffn_dim": 48,
            "activation": "gelu",
            "ffn_bias": True,
            "shared_ffn_dim": 40,
        },
        "mesh": {"axes": {"data": 2, "fsdp": 2}},
        "memory": {"ffn_chunks": 3},
    },
    "ring_geglu_bias_2_slices": {
        "layer": {
            "num_experts": 8,
            "embed_dim": 32,
            "ffn_dim": 48,
            "activation": "geglu",
            "ffn_bias": True,
        },
        "mesh": {"axes": {"expert": 2}},
        "parallelism": {"experts": "ring_of_experts"},
        "memory": {"ffn_chunks": 2},
    },
    "capacity_relu_no_fsdp_6_slices": {
        "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "activation": "relu"},
        "router": {"top_k": 2, "load_balance_loss": 0.01, "capacity": {"factor": 1.0}},
        "memory": {"ffn_chunks": 6},
    },
    "pallas_a2a_bf16_2_slices": {
        "layer": {"num_experts": 8, "embed_dim": 256, "ffn_dim": 512},
        "shapes": {"batch": 8, "seq_len": 64},
        "dtypes": {"params": "float32", "compute": "bfloat16"},
        "mesh": {"axes": {"fsdp": 2, "expert": 2}},
        "parallelism": {"experts": "ragged_all_to_all"},
        "target": {"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"},
        "memory": {"ffn_chunks": 2},
    },
}


def _spec(overrides: dict) -> dict:
    spec = copy.deepcopy(BASE)
    spec.update(copy.deepcopy(overrides))
    return spec


@pytest.mark.parametrize("name", list(CASES))
def test_sliced_ffn_matches_dense_reference(name, tmp_path, monkeypatch):
    spec = _spec(CASES[name])
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    generated = generate(Path(path.name))
    chunks = spec["memory"]["ffn_chunks"]
    source = generated.source
    assert f"FFN_CHUNKS = {chunks}" in source
    assert "jax.lax.scan(add_slice" in source and "@jax.checkpoint" in source
    fsdp = "fsdp" in spec["mesh"]["axes"]
    # sliced weights are gathered per slice (again in the backward pass), never whole
    assert ("FSDP_AXIS,\n            axis=" in source.split("def _weight_slice", 1)[1]) == fsdp
    assert "by _weight_slice" in source.split("def _gather_weights", 1)[1]

    report = verify(generated.loaded, generated.source, run_compiles=False)
    parity = [step for step in report.steps if step["step"].startswith("twin parity")]
    assert parity, report.steps
    for step in parity:
        for case in step["cases"]:
            assert case["max_relative_error"] < (
                1e-5 if step["step"].endswith("(float32)") else 5e-2
            ), (step["step"], case)


def test_whole_ffn_renders_no_slices(tmp_path, monkeypatch):
    path = tmp_path / "whole.yaml"
    path.write_text(yaml.safe_dump(_spec({"memory": {"ffn_chunks": 1}}), sort_keys=False))
    monkeypatch.chdir(tmp_path)
    source = generate(Path(path.name)).source
    assert "FFN_CHUNKS" not in source and "jax.checkpoint" not in source


def _reference_spec(**shapes: int) -> dict:
    spec = yaml.safe_load((REPO_ROOT / "specs/mixtral_8x7b_ep_a2a_v5e.yaml").read_text())
    spec["shapes"].update(shapes)
    return spec


def _plan(spec: dict):
    loaded = load_spec_bytes(yaml.safe_dump(spec).encode(), "spec.yaml", "spec")
    return make_plan(validate(loaded))


def test_plan_slices_only_when_the_whole_layer_does_not_fit() -> None:
    hbm = hardware("tpu-v5e").hbm_bytes_per_device
    small = _reference_spec()
    del small["memory"]
    assert _plan(small).ffn_chunks == 1  # 6 GiB of 16: no recomputation

    large = _reference_spec(batch=32)  # 4x the tokens: the whole FFN needs > 16 GiB
    del large["memory"]
    plan = _plan(large)
    options = {o.chunks: o.train_peak for o in plan.ffn_chunk_options}
    assert options[1] > hbm
    assert plan.ffn_chunks > 1 and plan.memory.train_peak <= hbm
    # the fewest slices that fit
    assert all(peak > hbm for count, peak in options.items() if count < plan.ffn_chunks)
    assert plan.cost.recompute_flops > 0
    assert plan.roofline.passes[1].kernel_flops == (
        3 * plan.roofline.passes[0].kernel_flops + plan.cost.recompute_flops
    )
