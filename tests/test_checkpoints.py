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

import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from checkpoint_cases import (
    CASES,
    DEEPSEEK_V2_GROUPS,
    EMBED,
    FFN,
    SPEC_BASE,
    Case,
)
from spec_builder import spec_yaml, validated

from moegen.checkpoints import FAMILIES, CheckpointError, load_layer_params, match_checkpoint
from moegen.checkpoints.sources import PARAM_AXES, Source, Split
from moegen.diagnostics import SpecError
from moegen.plan import make_plan
from moegen.render import render

REPO = Path(__file__).resolve().parent.parent
MODULES: dict[str, Any] = {}
# the `checkpoints` extra; every test here writes or reads safetensors files
pytest.importorskip("safetensors", reason="moegen.checkpoints needs moegen[checkpoints]")


def oracle() -> tuple[Any, Any]:
    """torch and transformers; a skip without them unless MOEGEN_REQUIRE_ORACLE is set."""
    if os.environ.get("MOEGEN_REQUIRE_ORACLE"):
        import torch
        import transformers

        return torch, transformers
    return pytest.importorskip("torch"), pytest.importorskip("transformers")


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


@pytest.fixture(scope="module")
def mixtral_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return module_for(CASES["mixtral"].spec, tmp_path_factory.mktemp("modules"))


@pytest.fixture(scope="module")
def deepseek_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return module_for(CASES["deepseek_v3"].spec, tmp_path_factory.mktemp("modules"))


def test_per_expert_values_and_shards(mixtral_module: Any, tmp_path: Path) -> None:
    """Published per-expert tensors, split over 3 shards, become the module's [E, D, F] params."""
    tensors = mixtral_tensors(layer=2)
    path = save_numpy(tmp_path / "ck", tensors, MIXTRAL_CONFIG, shards=3)
    mesh = one_device_mesh(mixtral_module)
    params = load_layer_params(mixtral_module, path, layer=2, family="mixtral", mesh=mesh)
    p = "model.layers.2.block_sparse_moe."
    np.testing.assert_array_equal(params["router"], tensors[p + "gate.weight"].T)
    for i in range(8):
        np.testing.assert_array_equal(params["w_gate"][i], tensors[f"{p}experts.{i}.w1.weight"].T)
        np.testing.assert_array_equal(params["w_up"][i], tensors[f"{p}experts.{i}.w3.weight"].T)
        np.testing.assert_array_equal(params["w_down"][i], tensors[f"{p}experts.{i}.w2.weight"].T)


def test_family_from_config_and_fused_values(deepseek_module: Any, tmp_path: Path) -> None:
    tensors = deepseek_tensors()
    config = {"model_type": "deepseek_v3", "n_routed_experts": 16, "hidden_size": EMBED}
    path = save_numpy(tmp_path / "ck", tensors, config | {"moe_intermediate_size": FFN})
    mesh = one_device_mesh(deepseek_module)  # family from model_type:
    params = load_layer_params(deepseek_module, path, layer=1, mesh=mesh)
    p = "model.layers.1.mlp."
    gate_up, down = tensors[p + "experts.gate_up_proj"], tensors[p + "experts.down_proj"]
    np.testing.assert_array_equal(params["w_gate"], gate_up[:, :FFN].transpose(0, 2, 1))
    np.testing.assert_array_equal(params["w_up"], gate_up[:, FFN:].transpose(0, 2, 1))
    np.testing.assert_array_equal(params["w_down"], down.transpose(0, 2, 1))
    np.testing.assert_array_equal(
        params["routing_bias"], tensors[p + "gate.e_score_correction_bias"]
    )
    np.testing.assert_array_equal(
        params["shared_gate"], tensors[p + "shared_experts.gate_proj.weight"].T
    )
    np.testing.assert_array_equal(
        params["shared_down"], tensors[p + "shared_experts.down_proj.weight"].T
    )


def _drop(key: str) -> Any:
    return lambda t: {k: v for k, v in t.items() if k != key}


def _add(key: str, value: np.ndarray) -> Any:
    return lambda t: t | {key: value}


P1 = "model.layers.1.block_sparse_moe."
# name -> (change to the Mixtral tensors, change to its config.json (None: none), words expected)
MIXTRAL_REFUSALS: dict[str, tuple[Any, Any, list[str]]] = {
    "missing_expert_tensor": (
        _drop(P1 + "experts.3.w2.weight"),
        None,
        [P1 + "experts.3.w2.weight", "missing", "model.safetensors", "params['w_down']"],
    ),
    "wrong_ffn_width": (
        lambda t: mixtral_tensors(ffn=24),
        None,
        [P1 + "experts.0.w1.weight", "[24, 32]", "[16, 32]", "FFN_DIM", "sizes differ"],
    ),
    "config_experts": (
        lambda t: t,
        lambda c: c | {"num_local_experts": 16},
        ["config.json", "num_local_experts is 16", "NUM_EXPERTS = 8", "layer.num_experts: 16"],
    ),
    "config_top_k": (
        lambda t: t,
        lambda c: c | {"num_experts_per_tok": 4},
        ["num_experts_per_tok is 4", "TOP_K = 2", "router.top_k: 4"],
    ),
    "config_embed": (
        lambda t: t,
        lambda c: c | {"hidden_size": 64},
        ["hidden_size is 64", "EMBED_DIM = 32"],
    ),
    "config_ffn": (
        lambda t: t,
        lambda c: c | {"intermediate_size": 8},
        ["intermediate_size is 8", "FFN_DIM = 16"],
    ),
    "config_model_type": (
        lambda t: t,
        lambda c: c | {"model_type": "qwen3_moe"},
        ["model_type is 'qwen3_moe'", "pass family='qwen3_moe'"],
    ),
    "config_value_not_an_integer": (
        lambda t: t,
        lambda c: c | {"num_local_experts": "8"},
        ["num_local_experts must be an integer", "'8'"],
    ),
    "unknown_tensor_in_block": (
        _add(P1 + "experts.0.w1.bias", np.zeros(FFN, np.float32)),
        None,
        [P1 + "experts.0.w1.bias", "would be ignored", "does not fit a moegen layer"],
    ),
    "more_experts_than_the_module": (
        lambda t: t | mixtral_tensors(experts=9),
        None,
        [P1 + "experts.8.", "expert 8", "NUM_EXPERTS = 8"],
    ),
    "mixed_layouts": (
        _add("model.layers.1.mlp.experts.down_proj", np.zeros((8, EMBED, FFN), np.float32)),
        None,
        ["more than one layout", "fused under model.layers.1.mlp.", "published under " + P1],
    ),
    "integer_weights": (
        lambda t: t | {P1 + "gate.weight": np.zeros((8, EMBED), np.int32)},
        None,
        ["quantized", P1 + "gate.weight", "I32", "dequantize"],
    ),
}


@pytest.mark.parametrize("name", sorted(MIXTRAL_REFUSALS))
def test_mixtral_refusals(name: str, mixtral_module: Any, tmp_path: Path) -> None:
    change_tensors, change_config, words = MIXTRAL_REFUSALS[name]
    config = None if change_config is None else change_config(dict(MIXTRAL_CONFIG))
    path = save_numpy(tmp_path / "ck", change_tensors(mixtral_tensors()), config)
    message = refusal(mixtral_module, path)
    for word in words:
        assert word in message, f"{word!r} not in: {message}"


def test_layer_that_is_not_moe_lists_the_moe_layers(deepseek_module: Any, tmp_path: Path) -> None:
    path = save_numpy(tmp_path / "ck", deepseek_tensors(), None)
    message = refusal(deepseek_module, path, layer=0, family="deepseek_v3")
    assert "no DeepSeek-V3 MoE weights for layer 0" in message
    assert "MoE layers are 1" in message and "model.layers.0.mlp.gate_proj.weight" in message


def test_ignored_weights_name_the_spec_fix(tmp_path: Path) -> None:
    """A checkpoint with weights the module has no parameter for: shared expert, selection bias."""
    spec = {k: v for k, v in CASES["deepseek_v3"].spec.items() if k != "shared_ffn"}
    plain = module_for(spec | {"routing_bias": False}, tmp_path)
    assert "shared_gate" not in plain.PARAM_SHAPES and "routing_bias" not in plain.PARAM_SHAPES
    path = save_numpy(tmp_path / "ck", deepseek_tensors(), None)
    message = refusal(plain, path, family="deepseek_v3")
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in message
    assert "router.routing_bias: true" in message
    assert "model.layers.1.mlp.shared_experts.gate_proj.weight" in message
    assert "layer.shared_ffn_dim: 16" in message


def test_expert_biases_need_ffn_bias(tmp_path: Path) -> None:
    """gpt-oss's expert biases, loaded into a module without layer.ffn_bias."""
    module = module_for({"score_after_top_k": True}, tmp_path)
    rng = np.random.default_rng(0)
    p = "model.layers.1.mlp."
    tensors = {
        p + "router.weight": rng.normal(size=(8, EMBED)),
        p + "experts.gate_up_proj": rng.normal(size=(8, EMBED, 2 * FFN)),
        p + "experts.gate_up_proj_bias": rng.normal(size=(8, 2 * FFN)),
        p + "experts.down_proj": rng.normal(size=(8, FFN, EMBED)),
        p + "experts.down_proj_bias": rng.normal(size=(8, EMBED)),
    }
    path = save_numpy(tmp_path / "ck", {k: v.astype(np.float32) for k, v in tensors.items()}, None)
    message = refusal(module, path, family="gpt_oss")
    assert p + "experts.gate_up_proj_bias" in message and "layer.ffn_bias: true" in message
    assert "params['b_gate']" in message and "params['b_down']" in message


def test_module_params_the_family_does_not_have(deepseek_module: Any, tmp_path: Path) -> None:
    """A module with a routing bias and a shared expert cannot be filled from Mixtral."""
    mixtral_like = {"model_type": "mixtral"}
    tensors = mixtral_tensors(experts=16)
    path = save_numpy(tmp_path / "ck", tensors, mixtral_like)
    message = refusal(deepseek_module, path)
    assert (
        "params['routing_bias']" in message
        and "Mixtral checkpoints hold no such weights" in message
    )


def test_mxfp4_gpt_oss_is_refused(tmp_path: Path) -> None:
    module = module_for({"score_after_top_k": True, "ffn_bias": True}, tmp_path)
    p = "model.layers.1.mlp."
    f32 = lambda *shape: ("F32", list(shape), bytes(4 * int(np.prod(shape))))  # noqa: E731
    u8 = lambda *shape: ("U8", list(shape), bytes(int(np.prod(shape))))  # noqa: E731
    path = raw_safetensors(
        tmp_path / "ck" / "model.safetensors",
        {
            p + "router.weight": f32(8, EMBED),
            p + "router.bias": f32(8),
            p + "experts.gate_up_proj_blocks": u8(8, 2 * FFN, 1, 16),
            p + "experts.gate_up_proj_scales": u8(8, 2 * FFN, 1),
            p + "experts.gate_up_proj_bias": f32(8, 2 * FFN),
            p + "experts.down_proj_blocks": u8(8, EMBED, 1, 8),
            p + "experts.down_proj_scales": u8(8, EMBED, 1),
            p + "experts.down_proj_bias": f32(8, EMBED),
        },
    )
    message = refusal(module, path.parent, family="gpt_oss")
    assert "quantized" in message and "MXFP4" in message and "gate_up_proj_blocks" in message
    assert "dequantize first" in message


def test_fp8_deepseek_is_refused(deepseek_module: Any, tmp_path: Path) -> None:
    p = "model.layers.1.mlp."
    tensors = {
        p + "gate.weight": ("F32", [16, EMBED], bytes(4 * 16 * EMBED)),
        p + "gate.e_score_correction_bias": ("F32", [16], bytes(64)),
    }
    for i in range(16):
        for proj, shape in (
            ("gate_proj", [FFN, EMBED]),
            ("up_proj", [FFN, EMBED]),
            ("down_proj", [EMBED, FFN]),
        ):
            tensors[f"{p}experts.{i}.{proj}.weight"] = ("F8_E4M3", shape, bytes(FFN * EMBED))
            tensors[f"{p}experts.{i}.{proj}.weight_scale_inv"] = ("F32", [1, 1], bytes(4))
    path = raw_safetensors(tmp_path / "ck" / "model.safetensors", tensors)
    message = refusal(deepseek_module, path, family="deepseek_v3")
    assert "quantized" in message and "weight_scale_inv" in message and "F32" in message


def test_hash_routed_deepseek_v4_layer_is_refused(tmp_path: Path) -> None:
    case = CASES["deepseek_v4"]
    module = module_for(case.spec, tmp_path)
    rng = np.random.default_rng(0)
    p = "model.layers.1.mlp."
    tensors = {
        p + "gate.weight": rng.normal(size=(8, EMBED)).astype(np.float32),
        p + "gate.tid2eid": np.zeros((64, 2), np.int64),
        p + "experts.gate_up_proj": rng.normal(size=(8, 2 * FFN, EMBED)).astype(np.float32),
        p + "experts.down_proj": rng.normal(size=(8, EMBED, FFN)).astype(np.float32),
    }
    message = refusal(module, save_numpy(tmp_path / "ck", tensors, None), family="deepseek_v4")
    assert "hash-routed" in message and "tid2eid" in message


def test_uncovered_family_lists_the_covered_ones(mixtral_module: Any, tmp_path: Path) -> None:
    path = save_numpy(tmp_path / "ck", mixtral_tensors(), None)
    message = refusal(mixtral_module, path, family="phimoe")
    assert "'phimoe' is not covered" in message
    for family in FAMILIES.values():
        assert family.name in message
    message = refusal(mixtral_module, path, family=None)
    assert "pass family=" in message
    (path / "config.json").write_text(json.dumps({"model_type": "phimoe"}))
    assert "'phimoe' is not a covered family" in refusal(mixtral_module, path, family=None)


def test_hostile_paths_and_json(mixtral_module: Any, tmp_path: Path) -> None:
    good = save_numpy(tmp_path / "good", mixtral_tensors(), MIXTRAL_CONFIG, shards=2)
    index = json.loads((good / "model.safetensors.index.json").read_text())

    def variant(name: str, index_text: str | None = None, config_text: str | None = None) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        for shard in good.glob("*.safetensors"):
            (directory / shard.name).write_bytes(shard.read_bytes())
        (directory / "model.safetensors.index.json").write_text(
            index_text if index_text is not None else json.dumps(index)
        )
        if config_text is not None:
            (directory / "config.json").write_text(config_text)
        return directory

    escaping = {
        "weight_map": dict.fromkeys(index["weight_map"], "../good/model-00001-of-00002.safetensors")
    }
    absolute = {"weight_map": dict.fromkeys(index["weight_map"], "/etc/passwd")}
    missing = {"weight_map": dict.fromkeys(index["weight_map"], "model-00009-of-00009.safetensors")}
    swapped = {
        "weight_map": {
            k: (
                "model-00002-of-00002.safetensors"
                if f.startswith("model-00001")
                else "model-00001-of-00002.safetensors"
            )
            for k, f in index["weight_map"].items()
        }
    }
    cases = {
        "no such file or directory": tmp_path / "nowhere",
        "neither model.safetensors.index.json nor model.safetensors": tmp_path / "empty",
        "cannot read the safetensors index": variant("bad_json", "{not json"),
        "no weight_map object": variant("no_map", "[1, 2]"),
        "not a plain .safetensors file name": variant("escape", json.dumps(escaping)),
        "not a plain .safetensors file name ": variant("absolute", json.dumps(absolute)),
        "the shard is missing": variant("missing", json.dumps(missing)),
        "cannot be read from it": variant("swapped", json.dumps(swapped)),
        "cannot read the config": variant("deep", config_text="[" * 100_000),
        "the config must be a JSON object": variant("list_config", config_text="[]"),
    }
    (tmp_path / "empty").mkdir()
    for words, path in cases.items():
        message = refusal(mixtral_module, path)
        assert words.strip() in message, f"{words!r} not in: {message}"
    corrupt = tmp_path / "corrupt" / "model.safetensors"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"\xff" * 64)
    assert "not a readable safetensors file" in refusal(mixtral_module, corrupt)
    big = variant("big_config", config_text=" " * (5 << 20) + "{}")
    assert "over the" in refusal(mixtral_module, big)


def test_bad_arguments(mixtral_module: Any, tmp_path: Path) -> None:
    path = save_numpy(tmp_path / "ck", mixtral_tensors(), MIXTRAL_CONFIG)
    for layer in (-1, True, "1", 1.0, 1 << 40):
        assert "layer must be an integer" in refusal(mixtral_module, path, layer=layer)
    assert "family must be a name" in refusal(mixtral_module, path, family=3)
    assert "must be a str or a path" in refusal(mixtral_module, 3)
    assert "not a generated moegen module" in refusal(object(), path)
    latent = types.SimpleNamespace(**vars(mixtral_module), LATENT_DIM=16)
    assert "experts run in a latent width (LATENT_DIM = 16" in refusal(latent, path)
    assert "mesh must be a jax.sharding.Mesh" in refusal(mixtral_module, path, mesh="mesh")


def test_the_package_imports_neither_torch_nor_transformers() -> None:
    for path in sorted((REPO / "moegen" / "checkpoints").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name.split(".")[0] not in ("torch", "transformers"), (
                    f"{path.name} imports {name}"
                )


# -- sharded over 8 fake CPU devices: each device reads only its region ---------------------------

CHILD = textwrap.dedent(
    """
    import importlib.util, json, sys
    import jax, numpy as np
    import moegen.checkpoints.loading as checkpoints
    from moegen.checkpoints import reader

    reads, calls, per_param = [], [], {}
    read, make, build = reader.Checkpoint.read, jax.make_array_from_callback, checkpoints._build

    def read_counted(self, key, index):
        out = read(self, key, index)
        reads.append(out.size)
        return out

    def make_counted(shape, sharding, callback):
        def counted(index):
            before = len(reads)
            out = callback(index)
            calls.append((index, sum(reads[before:]), out.size))
            return out
        return make(shape, sharding, counted)

    def build_counted(ckpt, block, name, *rest):
        start = len(calls)
        array = build(ckpt, block, name, *rest)
        per_param[name] = calls[start:]
        return array

    reader.Checkpoint.read = read_counted
    jax.make_array_from_callback = make_counted
    checkpoints._build = build_counted
    for case in json.loads(open(sys.argv[1]).read()):
        spec = importlib.util.spec_from_file_location(case["name"], case["module"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[case["name"]] = module
        spec.loader.exec_module(module)
        mesh = module.make_mesh()
        expected = np.load(case["expected"])
        per_param.clear()
        params = checkpoints.load_layer_params(
            module, case["checkpoint"], layer=1, family=case["family"], mesh=mesh
        )
        assert set(params) == set(expected.files), (sorted(params), expected.files)
        for name, array in params.items():
            assert array.sharding.spec == module.PARAM_SPECS[name], (name, array.sharding)
            assert array.dtype == module.PARAM_DTYPE, name
            np.testing.assert_array_equal(np.asarray(array), expected[name], err_msg=name)
            regions = {tuple((s.start, s.stop) for s in index)
                       for index in array.sharding.devices_indices_map(array.shape).values()}
            # one callback per device (one in all when replicated); devices holding the same
            # region read it once ...
            devices = 1 if array.sharding.is_fully_replicated else len(mesh.devices.flat)
            assert len(per_param[name]) == devices, (name, len(per_param[name]))
            reading = [c for c in per_param[name] if c[1]]
            assert len(reading) == len(regions), (name, len(reading), regions)
            for index, read_elements, shard_elements in reading:
                # ... and read exactly their region of the checkpoint, nothing more
                assert read_elements == shard_elements, (name, index, read_elements, shard_elements)
            print(case["name"], name, len(regions), "regions")
        if case["run"]:
            x = np.random.default_rng(0).normal(size=module.INPUT_SHAPE).astype(np.float32)
            y, _ = module.moe_layer(params, jax.device_put(x, module.input_sharding(mesh)))
            assert np.isfinite(np.asarray(y)).all()
    print("all ok")
    """
)
SHARDED = {"axes": {"fsdp": 2, "expert": 4}, "strategy": "ragged_all_to_all", "batch": 8}


def _sharded_cases(tmp_path: Path) -> list[dict[str, Any]]:
    """Per-expert (Mixtral), merged (DBRX), interleaved (gpt-oss) and fused (DeepSeek-V3)
    checkpoints, written by hand, with each parameter's expected value computed here."""
    rng = np.random.default_rng(7)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    cases = []

    def case(
        name: str, spec: dict, family: str, tensors: dict, expected: dict, run: bool = False
    ) -> None:
        module = module_for(spec_yaml(SPEC_BASE | spec | SHARDED), tmp_path)
        assert module.NUM_DEVICES == 8
        np.savez(tmp_path / f"{name}.npz", **expected)
        cases.append(
            {
                "name": name,
                "module": module.__file__,
                "checkpoint": str(save_numpy(tmp_path / name, tensors, None)),
                "family": family,
                "expected": str(tmp_path / f"{name}.npz"),
                "run": run,
            }
        )

    # Mixtral, per expert
    router, w1, w3, w2 = (
        normal(8, EMBED),
        normal(8, FFN, EMBED),
        normal(8, FFN, EMBED),
        normal(8, EMBED, FFN),
    )
    p = "model.layers.1.block_sparse_moe."
    tensors = {p + "gate.weight": router}
    for i in range(8):
        tensors |= {
            f"{p}experts.{i}.w1.weight": w1[i],
            f"{p}experts.{i}.w3.weight": w3[i],
            f"{p}experts.{i}.w2.weight": w2[i],
        }
    mixtral = {
        "router": router.T,
        "w_gate": w1.transpose(0, 2, 1),
        "w_up": w3.transpose(0, 2, 1),
        "w_down": w2.transpose(0, 2, 1),
    }
    case("mixtral", {"renormalize": True}, "mixtral", tensors, mixtral, run=True)
    # DBRX: experts merged into the rows, [E * F, D], down not transposed
    w1, v1, w2 = normal(8 * FFN, EMBED), normal(8 * FFN, EMBED), normal(8 * FFN, EMBED)
    p = "transformer.blocks.1.ffn."
    tensors = {
        p + "router.layer.weight": router,
        p + "experts.mlp.w1": w1,
        p + "experts.mlp.v1": v1,
        p + "experts.mlp.w2": w2,
    }
    dbrx = {
        "router": router.T,
        "w_gate": w1.reshape(8, FFN, EMBED).transpose(0, 2, 1),
        "w_up": v1.reshape(8, FFN, EMBED).transpose(0, 2, 1),
        "w_down": w2.reshape(8, FFN, EMBED),
    }
    case("dbrx", {"renormalize": True}, "dbrx", tensors, dbrx)
    # gpt-oss: gate and up interleaved in [E, D, 2F] and [E, 2F]
    gate_up, bias, down, down_bias = (
        normal(8, EMBED, 2 * FFN),
        normal(8, 2 * FFN),
        normal(8, FFN, EMBED),
        normal(8, EMBED),
    )
    p = "model.layers.1.mlp."
    tensors = {
        p + "router.weight": router,
        p + "experts.gate_up_proj": gate_up,
        p + "experts.gate_up_proj_bias": bias,
        p + "experts.down_proj": down,
        p + "experts.down_proj_bias": down_bias,
    }
    gpt_oss = {
        "router": router.T,
        "w_gate": gate_up[..., 0::2],
        "w_up": gate_up[..., 1::2],
        "w_down": down,
        "b_gate": bias[:, 0::2],
        "b_up": bias[:, 1::2],
        "b_down": down_bias,
    }
    case("gpt_oss", {"score_after_top_k": True, "ffn_bias": True}, "gpt_oss", tensors, gpt_oss)
    # DeepSeek-V3, fused, with its selection bias and shared expert
    tensors = deepseek_tensors(seed=8)
    p = "model.layers.1.mlp."
    gate_up, down = tensors[p + "experts.gate_up_proj"], tensors[p + "experts.down_proj"]
    deepseek = {
        "router": tensors[p + "gate.weight"].T,
        "routing_bias": tensors[p + "gate.e_score_correction_bias"],
        "w_gate": gate_up[:, :FFN].transpose(0, 2, 1),
        "w_up": gate_up[:, FFN:].transpose(0, 2, 1),
        "w_down": down.transpose(0, 2, 1),
        "shared_gate": tensors[p + "shared_experts.gate_proj.weight"].T,
        "shared_up": tensors[p + "shared_experts.up_proj.weight"].T,
        "shared_down": tensors[p + "shared_experts.down_proj.weight"].T,
    }
    case("deepseek_v3", dict(CASES["deepseek_v3"].spec), "deepseek_v3", tensors, deepseek)
    return cases


@pytest.mark.slow
def test_each_device_reads_only_its_region(tmp_path: Path) -> None:
    cases = _sharded_cases(tmp_path)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "child.py").write_text(CHILD)
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    result = subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), str(tmp_path / "cases.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all ok" in result.stdout
    # the weights really were split: 8 regions for the experts' weights (expert 4 x fsdp 2)
    assert "mixtral w_gate 8 regions" in result.stdout, result.stdout
    assert "gpt_oss b_gate 4 regions" in result.stdout, result.stdout


# -- the region arithmetic, without devices ------------------------------------------------------

SIZES = {"e": 4, "d": 6, "f": 8, "s": 10}


@pytest.mark.parametrize(
    ("source", "param", "full"),
    [
        # transposed router [E, D] -> [D, E]
        (Source("gate.weight", ("e", "d")), "router", lambda t: t.T),
        # fused [E, 2F, D], chunked: up is rows F..2F
        (
            Source("gate_up", ("e", "f", "d"), Split("f", 1)),
            "w_up",
            lambda t: t[:, 8:].transpose(0, 2, 1),
        ),
        # gpt-oss [E, D, 2F], interleaved: gate at even columns
        (
            Source("gate_up", ("e", "d", "f"), Split("f", 0, interleaved=True)),
            "w_gate",
            lambda t: t[..., ::2],
        ),
        # DBRX [E * F, D]: experts merged into the rows
        (Source("w1", ("ef", "d")), "w_gate", lambda t: t.reshape(4, 8, 6).transpose(0, 2, 1)),
        # Qwen2-MoE shared-expert gate [1, D]
        (Source("shared_expert_gate.weight", ("1", "d")), "shared_expert_gate", lambda t: t[0]),
    ],
)
def test_a_region_reads_only_its_source_region(source: Source, param: str, full: Any) -> None:
    tensor = np.arange(np.prod(source.shape(SIZES)), dtype=np.float32).reshape(source.shape(SIZES))
    whole = full(tensor)
    read_elements = []

    def fetch(key: str, index: tuple[slice, ...]) -> np.ndarray:
        assert key == source.key
        out = tensor[index]
        read_elements.append(out.size)
        return out

    axes = PARAM_AXES[param]
    # each half of the parameter along each of its axes, as a device's shard would be
    for axis in axes:
        size = whole.shape[axes.index(axis)]
        for start in range(0, size, size // 2):
            region = {a: (0, whole.shape[i]) for i, a in enumerate(axes)} | {
                axis: (start, start + size // 2)
            }
            read_elements.clear()
            block = source.read(fetch, region, SIZES, axes)
            expected = whole[tuple(slice(*region[a]) for a in axes)]
            np.testing.assert_array_equal(block, expected)
            assert sum(read_elements) == expected.size, (axis, region, read_elements)


def test_per_expert_region_reads_its_experts_only() -> None:
    source = Source("experts.{i}.w2.weight", ("d", "f"))
    tensors = {f"experts.{i}.w2.weight": np.full((6, 8), i, np.float32) for i in range(4)}
    keys = []

    def fetch(key: str, index: tuple[slice, ...]) -> np.ndarray:
        keys.append((key, index))
        return tensors[key][index]

    block = source.read(fetch, {"e": (2, 4), "f": (0, 8), "d": (3, 6)}, SIZES, "efd")
    assert block.shape == (2, 8, 3) and (block[0] == 2).all() and (block[1] == 3).all()
    assert keys == [
        ("experts.2.w2.weight", (slice(3, 6), slice(0, 8))),
        ("experts.3.w2.weight", (slice(3, 6), slice(0, 8))),
    ]


def test_bfloat16_module_from_float32_checkpoint(tmp_path: Path) -> None:
    module = module_for(CASES["mixtral"].spec | {"params_dtype": "bfloat16"}, tmp_path)
    tensors = mixtral_tensors()
    path = save_numpy(tmp_path / "ck", tensors, MIXTRAL_CONFIG)
    params = load_layer_params(module, path, layer=1, mesh=one_device_mesh(module))
    import ml_dtypes

    assert all(p.dtype == ml_dtypes.bfloat16 for p in params.values())
    router = tensors["model.layers.1.block_sparse_moe.gate.weight"].T.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(params["router"]), router)


def test_without_safetensors_the_error_says_what_to_install(
    mixtral_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = save_numpy(tmp_path / "ck", mixtral_tensors(), MIXTRAL_CONFIG)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors -> ImportError
    assert "pip install 'moegen[checkpoints]'" in refusal(mixtral_module, path)
