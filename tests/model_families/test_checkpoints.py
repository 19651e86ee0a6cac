"""moegen.checkpoints: published MoE checkpoints loaded into generated layers (issue 18, item 4).

Every covered family: a tiny transformers model (float32, every MoE weight and bias random and
non-zero) is saved by `save_pretrained` (the published layout) and, where transformers'
in-memory names differ, as its state_dict (the fused layout); layer 1 is loaded into a moegen
module rendered from a matching spec, and the module's output is compared with transformers'
own MoE block of that layer on the same input (relative error < 1e-5). Also: a sharded save, a
bfloat16 save, and hand-written Mixtral per-expert and gpt-oss interleaved checkpoints.
Refusals are in test_checkpoint_refusals.py, each device's own reads in
test_checkpoint_regions.py; the helpers all three share in checkpoint_helpers.py.

The transformers comparisons skip without torch and transformers, unless MOEGEN_REQUIRE_ORACLE
is set (then they fail).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from checkpoint_cases import (
    CASES,
    DEEPSEEK_V2_GROUPS,
    FFN,
)
from checkpoint_helpers import (
    MIXTRAL_CONFIG,
    block_output,
    check_family,
    mixtral_tensors,
    module_for,
    one_device_mesh,
    oracle,
    relative_error,
    run,
    save_numpy,
    tiny_model,
)

from moegen.checkpoints import FAMILIES, load_layer_params

# the `checkpoints` extra; every test here writes or reads safetensors files
pytest.importorskip("safetensors", reason="moegen.checkpoints needs moegen[checkpoints]")


@pytest.mark.parametrize("family", sorted(CASES))
def test_family_matches_transformers(family: str, tmp_path: Path) -> None:
    check_family(CASES[family], tmp_path)


def test_deepseek_v2_group_limited_matches_transformers(tmp_path: Path) -> None:
    check_family(DEEPSEEK_V2_GROUPS, tmp_path)


def test_sharded_save_loads_across_shards(tmp_path: Path) -> None:
    torch, transformers = oracle()
    case = CASES["mixtral"]
    module = module_for(case.spec, tmp_path)
    mesh = one_device_mesh(module)
    model = tiny_model(case, torch, transformers, seed=3)
    model.save_pretrained(tmp_path / "ck", max_shard_size="40KB")
    index = json.loads((tmp_path / "ck" / "model.safetensors.index.json").read_text())
    layer_files = {f for k, f in index["weight_map"].items() if k.startswith("model.layers.1.")}
    assert len(layer_files) > 1, "the layer must span several shards"
    x = np.random.default_rng(1).normal(size=module.INPUT_SHAPE).astype(np.float32)
    params = load_layer_params(module, tmp_path / "ck", layer=1, family="mixtral", mesh=mesh)
    assert relative_error(run(module, params, x, mesh), block_output(case, model, x, torch)) < 1e-5


def test_bfloat16_checkpoint(tmp_path: Path) -> None:
    """A bf16 save (numpy has no bfloat16 of its own: ml_dtypes' is used) into float32 params."""
    torch, transformers = oracle()
    case = CASES["qwen3_moe"]
    module = module_for(case.spec, tmp_path)
    mesh = one_device_mesh(module)
    model = tiny_model(case, torch, transformers, seed=4).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "np") as f:
        assert f.get_slice("model.layers.1.mlp.gate.weight").get_dtype() == "BF16"
    model = model.to(torch.float32)  # the same, bf16-rounded, weights
    x = np.random.default_rng(2).normal(size=module.INPUT_SHAPE).astype(np.float32)
    params = load_layer_params(module, tmp_path / "bf16", layer=1, family="qwen3_moe", mesh=mesh)
    assert all(p.dtype == np.float32 for p in params.values())
    assert relative_error(run(module, params, x, mesh), block_output(case, model, x, torch)) < 1e-5


def test_handwritten_mixtral_per_expert(tmp_path: Path) -> None:
    """Mixtral's Hub layout written from the model's tensors by hand, not by transformers."""
    torch, transformers = oracle()
    case = CASES["mixtral"]
    module = module_for(case.spec, tmp_path)
    mesh = one_device_mesh(module)
    model = tiny_model(case, torch, transformers, seed=5)
    experts = model.model.layers[1].mlp.experts
    gate_up = experts.gate_up_proj.detach().numpy()  # [E, 2F, D], gate first
    down = experts.down_proj.detach().numpy()  # [E, D, F]
    prefix = "model.layers.1.block_sparse_moe."
    tensors = {prefix + "gate.weight": model.model.layers[1].mlp.gate.weight.detach().numpy()}
    for i in range(gate_up.shape[0]):
        tensors[f"{prefix}experts.{i}.w1.weight"] = gate_up[i, :FFN]
        tensors[f"{prefix}experts.{i}.w3.weight"] = gate_up[i, FFN:]
        tensors[f"{prefix}experts.{i}.w2.weight"] = down[i]
    path = save_numpy(
        tmp_path / "ck", {k: np.ascontiguousarray(v) for k, v in tensors.items()}, None
    )
    x = np.random.default_rng(3).normal(size=module.INPUT_SHAPE).astype(np.float32)
    params = load_layer_params(module, path, layer=1, family="mixtral", mesh=mesh)
    assert relative_error(run(module, params, x, mesh), block_output(case, model, x, torch)) < 1e-5


def test_handwritten_gpt_oss_interleaved(tmp_path: Path) -> None:
    """gpt-oss's [E, D, 2F] with gate at even and up at odd columns (and the biases alike)."""
    torch, transformers = oracle()
    case = CASES["gpt_oss"]
    module = module_for(case.spec, tmp_path)
    mesh = one_device_mesh(module)
    model = tiny_model(case, torch, transformers, seed=6)
    mlp = model.model.layers[1].mlp
    prefix = "model.layers.1.mlp."
    tensors = {
        prefix + "router.weight": mlp.router.weight,
        prefix + "router.bias": mlp.router.bias,
        prefix + "experts.gate_up_proj": mlp.experts.gate_up_proj,  # [E, D, 2F] interleaved
        prefix + "experts.gate_up_proj_bias": mlp.experts.gate_up_proj_bias,  # [E, 2F] interleaved
        prefix + "experts.down_proj": mlp.experts.down_proj,  # [E, F, D]
        prefix + "experts.down_proj_bias": mlp.experts.down_proj_bias,
    }
    tensors = {k: v.detach().numpy() for k, v in tensors.items()}
    path = save_numpy(
        tmp_path / "ck", {k: np.ascontiguousarray(v) for k, v in tensors.items()}, None
    )
    x = np.random.default_rng(4).normal(size=module.INPUT_SHAPE).astype(np.float32)
    params = load_layer_params(module, path, layer=1, family="gpt_oss", mesh=mesh)
    assert relative_error(run(module, params, x, mesh), block_output(case, model, x, torch)) < 1e-5


def test_every_family_has_a_case() -> None:
    assert set(CASES) == set(FAMILIES)


# -- hand-written checkpoints: values, refusals, hostile input (no torch needed) ------------------


def test_bfloat16_module_from_float32_checkpoint(tmp_path: Path) -> None:
    module = module_for(CASES["mixtral"].spec | {"params_dtype": "bfloat16"}, tmp_path)
    tensors = mixtral_tensors()
    path = save_numpy(tmp_path / "ck", tensors, MIXTRAL_CONFIG)
    params = load_layer_params(module, path, layer=1, mesh=one_device_mesh(module))
    import ml_dtypes

    assert all(p.dtype == ml_dtypes.bfloat16 for p in params.values())
    router = tensors["model.layers.1.block_sparse_moe.gate.weight"].T.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(params["router"]), router)
