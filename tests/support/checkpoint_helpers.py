"""What the checkpoint tests share: tiny transformers models saved as checkpoints, modules
rendered from specs, hand-written tensors and the refusal they raise."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from checkpoint_cases import (
    EMBED,
    FFN,
    SPEC_BASE,
    Case,
)
from oracle_gate import require_oracle
from spec_builder import spec_yaml, validated

from moegen.checkpoints import CheckpointError, load_layer_params, match_checkpoint
from moegen.diagnostics import SpecError
from moegen.plan import make_plan
from moegen.render import render

REPO = Path(__file__).resolve().parents[2]
MODULES: dict[str, Any] = {}


oracle = require_oracle  # the checkpoint tests' name for the one gate


def module_for(spec: dict[str, Any] | str, directory: Path) -> Any:
    """The rendered, imported moegen module of `spec` (spec_builder choices merged into
    SPEC_BASE, or YAML text), cached by its text."""
    text = spec if isinstance(spec, str) else spec_yaml(SPEC_BASE | spec)
    name = "ckpt_" + hashlib.sha256(text.encode()).hexdigest()[:12]
    if name not in MODULES:
        loaded = validated(text, f"specs/{name}.yaml", name)
        assert not isinstance(loaded, SpecError), str(loaded)
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
    module = module_for(case.spec, tmp_path)
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


MIXTRAL_CONFIG = {
    "model_type": "mixtral",
    "num_local_experts": 8,
    "hidden_size": EMBED,
    "intermediate_size": FFN,
    "num_experts_per_tok": 2,
}


def mixtral_tensors(
    layer: int = 1, experts: int = 8, ffn: int = FFN, seed: int = 0
) -> dict[str, np.ndarray]:
    """Mixtral's published layout: a router and per-expert w1 (gate), w3 (up), w2 (down)."""
    rng = np.random.default_rng(seed)
    prefix = f"model.layers.{layer}.block_sparse_moe."
    tensors = {prefix + "gate.weight": rng.normal(size=(experts, EMBED)).astype(np.float32)}
    for i in range(experts):
        tensors[f"{prefix}experts.{i}.w1.weight"] = rng.normal(size=(ffn, EMBED)).astype(np.float32)
        tensors[f"{prefix}experts.{i}.w3.weight"] = rng.normal(size=(ffn, EMBED)).astype(np.float32)
        tensors[f"{prefix}experts.{i}.w2.weight"] = rng.normal(size=(EMBED, ffn)).astype(np.float32)
    return tensors


def deepseek_tensors(
    shared: bool = True, bias: bool = True, seed: int = 0
) -> dict[str, np.ndarray]:
    """DeepSeek-V3's fused layout for layer 1 (16 experts), and a dense layer 0."""
    rng = np.random.default_rng(seed)
    p = "model.layers.1.mlp."
    tensors = {
        p + "gate.weight": rng.normal(size=(16, EMBED)),
        p + "experts.gate_up_proj": rng.normal(size=(16, 2 * FFN, EMBED)),
        p + "experts.down_proj": rng.normal(size=(16, EMBED, FFN)),
        "model.layers.0.mlp.gate_proj.weight": rng.normal(size=(64, EMBED)),
        "model.layers.0.mlp.up_proj.weight": rng.normal(size=(64, EMBED)),
        "model.layers.0.mlp.down_proj.weight": rng.normal(size=(EMBED, 64)),
    }
    if bias:
        tensors[p + "gate.e_score_correction_bias"] = rng.normal(size=(16,))
    if shared:
        tensors[p + "shared_experts.gate_proj.weight"] = rng.normal(size=(FFN, EMBED))
        tensors[p + "shared_experts.up_proj.weight"] = rng.normal(size=(FFN, EMBED))
        tensors[p + "shared_experts.down_proj.weight"] = rng.normal(size=(EMBED, FFN))
    return {k: v.astype(np.float32) for k, v in tensors.items()}


def raw_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> Path:
    """A safetensors file of any dtype (F8_E4M3, U8, ...), written byte by byte."""
    header, offset, data = {}, 0, b""
    for key, (dtype, shape, payload) in tensors.items():
        header[key] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(payload)],
        }
        offset += len(payload)
        data += payload
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


def refusal(module: Any, path: Any, **kwargs: Any) -> str:
    kwargs.setdefault("layer", 1)
    kwargs.setdefault("family", "mixtral")
    with pytest.raises(CheckpointError) as error:
        load_layer_params(module, path, **kwargs)
    message = str(error.value)
    assert "Traceback" not in message and message, message
    return message
