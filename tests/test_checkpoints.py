"""moegen.checkpoints: published MoE checkpoints loaded into generated layers (issue 18, item 4).

- Every covered family: a tiny transformers model (float32, every MoE weight and bias random
  and non-zero) is saved by `save_pretrained` (the published layout) and, where transformers'
  in-memory names differ, as its state_dict (the fused layout); layer 1 is loaded into a moegen
  module rendered from a matching spec, and the module's output is compared with transformers'
  own MoE block of that layer on the same input (relative error < 1e-5). Also: a sharded save,
  a bfloat16 save, and hand-written Mixtral per-expert and gpt-oss interleaved checkpoints.
- On 8 fake CPU devices (a child process): every parameter is sharded by PARAM_SPECS and each
  device's callback reads only its own region, for the per-expert, fused, merged (DBRX) and
  interleaved (gpt-oss) layouts.
- Refusals, each a CheckpointError naming key, file and fix: missing tensors, wrong shapes,
  weights the module would ignore, config.json disagreeing with the module, uncovered families,
  quantized weights, hash-routed layers, mixed layouts, hostile paths and JSON.

The transformers comparisons skip without torch and transformers, unless MOEGEN_REQUIRE_ORACLE
is set (then they fail).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from checkpoint_cases import CASES, DEEPSEEK_V2_GROUPS, FFN, SPEC_BASE, Case
from spec_builder import spec_yaml, validated

from moegen.checkpoints import FAMILIES, load_layer_params, match_checkpoint
from moegen.diagnostics import SpecError
from moegen.plan import make_plan
from moegen.render import render

REPO = Path(__file__).resolve().parent.parent
MODULES: dict[str, Any] = {}


def oracle() -> tuple[Any, Any]:
    """torch and transformers; a skip without them unless MOEGEN_REQUIRE_ORACLE is set."""
    if os.environ.get("MOEGEN_REQUIRE_ORACLE"):
        import torch
        import transformers

        return torch, transformers
    return pytest.importorskip("torch"), pytest.importorskip("transformers")


def module_for(spec: dict[str, Any] | str, directory: Path, needs: tuple[str, ...] = ()) -> Any:
    """The rendered, imported moegen module of `spec` (choices or YAML), cached by its text."""
    text = spec if isinstance(spec, str) else spec_yaml(SPEC_BASE | spec)
    name = "ckpt_" + hashlib.sha256(text.encode()).hexdigest()[:12]
    if name not in MODULES:
        loaded = validated(text, f"specs/{name}.yaml", name)
        if isinstance(loaded, SpecError):
            if needs:
                pytest.skip(f"the spec needs {', '.join(needs)}: {loaded.diagnostics[0].message}")
            raise AssertionError(str(loaded))
        path = directory / f"{name}.py"
        path.write_text(render(make_plan(loaded)), encoding="utf-8")
        spec_ = importlib.util.spec_from_file_location(name, path)
        assert spec_ is not None and spec_.loader is not None
        module = importlib.util.module_from_spec(spec_)
        sys.modules[name] = module
        spec_.loader.exec_module(module)
        MODULES[name] = module
    return MODULES[name]


def one_device_mesh(module: Any) -> jax.sharding.Mesh:
    return module.make_mesh(jax.devices()[: module.NUM_DEVICES])


def run(module: Any, params: dict[str, jax.Array], x: np.ndarray, mesh: Any) -> np.ndarray:
    y, _ = module.moe_layer(params, jax.device_put(x, module.input_sharding(mesh)))
    return np.asarray(y)


def relative_error(y: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(y - reference).max() / np.abs(reference).max())


def save_numpy(
    directory: Path, tensors: dict[str, np.ndarray], config: dict | None, shards: int = 1
) -> Path:
    """A safetensors checkpoint written by hand: one file, or `shards` files and an index."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"))
    else:
        names = sorted(tensors)
        weight_map = {}
        for shard in range(shards):
            file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: tensors[k] for k in names[shard::shards]}
            save_file(part, str(directory / file))
            weight_map |= dict.fromkeys(part, file)
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": weight_map})
        )
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


# -- against transformers -------------------------------------------------------------------


def tiny_model(case: Case, torch: Any, transformers: Any, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = getattr(transformers, case.model)(case.config(transformers)).eval()
    try:
        model.set_experts_implementation("eager")
    except (ValueError, AttributeError, NotImplementedError):
        pass  # families without the experts interface run their own loop
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        block = case.block(model)
        for name, tensor in [*block.named_parameters(), *block.named_buffers()]:
            if tensor.is_floating_point():
                scale = 0.5 if ("bias" in name or tensor.ndim == 1) else 0.3
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale)
    return model


def block_output(case: Case, model: Any, x: np.ndarray, torch: Any) -> np.ndarray:
    with torch.no_grad():
        out = case.block(model)(torch.from_numpy(x))
    out = out[0] if isinstance(out, tuple) else out
    return out.float().numpy().reshape(x.shape)


def fused_save(model: Any, directory: Path, torch: Any) -> Path:
    """The in-memory names (model.state_dict()), as a single safetensors file."""
    from safetensors.torch import save_file

    model.save_pretrained(directory)  # for config.json
    for path in directory.glob("*.safetensors*"):
        path.unlink()
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def check_family(case: Case, tmp_path: Path) -> None:
    torch, transformers = oracle()
    module = module_for(case.spec, tmp_path, case.needs)
    mesh = one_device_mesh(module)
    model = tiny_model(case, torch, transformers)
    x = np.random.default_rng(0).normal(size=module.INPUT_SHAPE).astype(np.float32)
    reference = block_output(case, model, x, torch)
    model.save_pretrained(tmp_path / "published")
    saves = {"published": tmp_path / "published"}
    if case.fused_differs:
        saves["fused"] = fused_save(model, tmp_path / "fused", torch)
    for layout, path in saves.items():
        found = match_checkpoint(module, path, layer=1, family=case.family)
        assert found.layout.name == layout, (layout, found.layout.name)
        params = load_layer_params(module, path, layer=1, family=case.family, mesh=mesh)
        assert set(params) == set(module.PARAM_SHAPES)
        error = relative_error(run(module, params, x, mesh), reference)
        assert error < 1e-5, f"{case.family} ({layout}): relative error {error:.2e}"


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
    module = module_for(case.spec, tmp_path, case.needs)
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
