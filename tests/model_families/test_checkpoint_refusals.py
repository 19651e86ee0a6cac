"""moegen.checkpoints' refusals, each a CheckpointError naming key, file and fix: missing
tensors, wrong shapes, weights the module would ignore, config.json disagreeing with the module,
uncovered families, quantized weights, hash-routed layers, mixed layouts, hostile paths and
JSON; and the values of the layouts that load (per-expert across shards, fused)."""

from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from checkpoint_cases import (
    CASES,
    EMBED,
    FFN,
)
from checkpoint_helpers import (
    MIXTRAL_CONFIG,
    REPO,
    deepseek_tensors,
    mixtral_tensors,
    module_for,
    one_device_mesh,
    raw_safetensors,
    refusal,
    save_numpy,
)

from moegen.checkpoints import FAMILIES, load_layer_params

# the `checkpoints` extra; every test here writes or reads safetensors files
pytest.importorskip("safetensors", reason="moegen.checkpoints needs moegen[checkpoints]")


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


def test_an_output_norm_no_layout_holds_is_refused_with_its_spec_field(tmp_path: Path) -> None:
    """No family this loader knows keeps an output norm (A.X-K1's checkpoints are not among
    its layouts): the module's output_norm is named, with the spec field that made it."""
    module = module_for(CASES["deepseek_v3"].spec | {"output_norm_eps": 1e-6}, tmp_path)
    path = save_numpy(tmp_path / "ck", deepseek_tensors(), {"model_type": "deepseek_v3"})
    message = refusal(module, path, family="deepseek_v3")
    assert "params['output_norm'] but DeepSeek-V3 checkpoints hold no such weights" in message
    assert "remove layer.output_norm_eps from the spec" in message


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


def test_without_safetensors_the_error_says_what_to_install(
    mixtral_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = save_numpy(tmp_path / "ck", mixtral_tensors(), MIXTRAL_CONFIG)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors -> ImportError
    assert "pip install 'moegen[checkpoints]'" in refusal(mixtral_module, path)
