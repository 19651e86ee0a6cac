"""moegen.checkpoints.load_model_params: every MoE layer of a model at once (issue 29, item 5).

- Tiny transformers models mixing dense and MoE layers (DeepSeek-V3, Qwen2-MoE, Qwen3-MoE,
  Jamba), saved by save_pretrained: all MoE layers load at once into MoELayer.from_params, each
  matching its transformers block, output and input gradient (float32, relative error < 1e-5);
  the stacked form holds the same values.
- Which layers are MoE (every family's rule, from config.json) and the refusals: bad layer
  lists, forged or malformed configs; none reads a weight. On 8 fake CPU devices (a child
  process) each device reads only its region of every layer, in both forms.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from checkpoint_cases import (
    CASES,
    EMBED,
    FFN,
    MULTI_LAYER,
    SPEC_BASE,
    block_and_input_gradient,
    multi_layer_model,
)
from checkpoint_helpers import (
    MIXTRAL_CONFIG,
    deepseek_tensors,
    mixtral_tensors,
    module_for,
    one_device_mesh,
    oracle,
    relative_error,
    save_numpy,
)
from spec_builder import spec_yaml

from moegen.checkpoints import (
    CheckpointError,
    StackedParams,
    find_moe_layers,
    load_model_params,
)
from moegen.checkpoints.reader import Checkpoint

nnx = pytest.importorskip("flax.nnx")
from moegen.nnx import MoELayer  # noqa: E402


def moegen_layer(layer: Any, x: np.ndarray, cotangent: np.ndarray) -> tuple:
    x = jax.device_put(x, layer.module.input_sharding(layer.mesh))
    y = layer(x)[0]
    grad = jax.grad(lambda x: (layer(x)[0] * cotangent).sum())(x)
    return np.asarray(y), np.asarray(grad)


@pytest.mark.parametrize("family", sorted(MULTI_LAYER))
def test_every_moe_layer_matches_transformers(family: str, tmp_path: Path) -> None:
    torch, transformers = oracle()
    case, (_, moe_layers) = CASES[family], MULTI_LAYER[family]
    model = multi_layer_model(family, torch, transformers)
    model.save_pretrained(tmp_path / "ck")
    module = module_for(case.spec, tmp_path)
    mesh = one_device_mesh(module)
    assert find_moe_layers(tmp_path / "ck") == moe_layers
    loaded = load_model_params(module, tmp_path / "ck", mesh=mesh)  # family from model_type
    assert tuple(loaded) == moe_layers
    layers = {i: MoELayer.from_params(module, params, mesh=mesh) for i, params in loaded.items()}
    rng = np.random.default_rng(0)
    for i, layer in layers.items():
        x = rng.normal(size=module.INPUT_SHAPE).astype(np.float32)
        cotangent = rng.normal(size=module.INPUT_SHAPE).astype(np.float32)
        y, grad = moegen_layer(layer, x, cotangent)
        y_ref, grad_ref = block_and_input_gradient(case.block_at(model, i), x, cotangent, torch)
        assert relative_error(y, y_ref) < 1e-5, (family, i, relative_error(y, y_ref))
        assert relative_error(grad, grad_ref) < 1e-5, (family, i, relative_error(grad, grad_ref))
    # the stacked form: the same values, layer by layer along the leading axis
    order = tuple(reversed(moe_layers))
    stacked = load_model_params(module, tmp_path / "ck", mesh=mesh, layers=order, stacked=True)
    assert isinstance(stacked, StackedParams) and stacked.layers == order
    assert set(stacked.params) == set(module.PARAM_SHAPES)
    for name, value in stacked.params.items():
        assert value.shape == (len(order), *module.PARAM_SHAPES[name])
        assert value.sharding.spec == jax.sharding.PartitionSpec(None, *module.PARAM_SPECS[name])
        for k, i in enumerate(order):
            np.testing.assert_array_equal(np.asarray(value[k]), np.asarray(loaded[i][name]))


# -- which layers are MoE: config.json, as transformers reads it ---------------------------------

DEEPSEEK_CONFIG = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "n_routed_experts": 16,
    "hidden_size": EMBED,
    "moe_intermediate_size": FFN,
}


@pytest.fixture(scope="module")
def deepseek_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return module_for(CASES["deepseek_v3"].spec, tmp_path_factory.mktemp("modules"))


@pytest.fixture
def no_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of every weight read (a refusal must come before any)."""
    reads: list[str] = []
    read = Checkpoint.read

    def counted(self: Checkpoint, key: str, index: tuple[slice, ...]) -> np.ndarray:
        reads.append(key)
        return read(self, key, index)

    monkeypatch.setattr(Checkpoint, "read", counted)
    return reads


def refused(module: Any, path: Path, reads: list[str], **kwargs: Any) -> str:
    with pytest.raises(CheckpointError) as error:
        load_model_params(module, path, mesh=one_device_mesh(module), **kwargs)
    assert not reads, f"read {reads[:3]} before refusing"
    return str(error.value)


def with_mtp_layer() -> dict[str, np.ndarray]:
    """DeepSeek-V3's layers 0 (dense) and 1 (MoE), and an MoE multi-token-prediction layer 2."""
    tensors = deepseek_tensors()
    return tensors | {k.replace(".1.", ".2."): v for k, v in tensors.items() if ".1." in k}


# name -> (layers asked for, config.json changes, words expected)
# fmt: off
LAYER_REFUSALS: dict[str, tuple[Any, dict[str, Any], list[str]]] = {
    "dense_layer": ([0, 1], {}, ["layer 0 is a dense layer", "first_k_dense_replace = 1",
                                 "MoE layers are 1"]),
    "out_of_range": ([5], {}, ["layer 5 is out of range", "2 layers (0-1)"]),
    "mtp_layer": ([2], {"num_nextn_predict_layers": 1},
                  ["multi-token-prediction", "load_layer_params"]),
    "config_makes_moe_dense": (None, {"first_k_dense_replace": 2},
                               ["expert weights in layer(s) 1", "makes dense",
                                "first_k_dense_replace = 2"]),
    "config_moe_without_experts": (None, {"first_k_dense_replace": 0},
                                   ["layer(s) 0 MoE layers", "no DeepSeek-V3 expert weights",
                                    "model.layers.0.mlp.experts.0.down_proj.weight"]),
    "too_few_layers": (None, {"num_hidden_layers": 1, "first_k_dense_replace": 0},
                       ["expert weights for layer(s) 1", "gives the model 1 layers"]),
    "count_not_an_integer": (None, {"num_hidden_layers": "2"},
                             ["config.json: num_hidden_layers must be an integer", "'2'"]),
    "count_bool": (None, {"num_hidden_layers": True}, ["num_hidden_layers must be an integer"]),
    "first_k_negative": (None, {"first_k_dense_replace": -1},
                         ["first_k_dense_replace must be an integer in [0,"]),
    "first_k_null": (None, {"first_k_dense_replace": None},
                     ["first_k_dense_replace must be an integer", "None"]),
    "freq_zero": (None, {"moe_layer_freq": 0}, ["moe_layer_freq must be an integer in [1,"]),
    # the layers argument itself, refused before the checkpoint is opened
    "layers_str": ("1", {}, ["layers must be a list of layer indices"]),
    "layers_int": (1, {}, ["layers must be a list of layer indices"]),
    "layers_set": ({1}, {}, ["layers must be a list of layer indices"]),
    "layers_empty": ([], {}, ["layers is empty"]),
    "layers_twice": ([1, 1], {}, ["lists [1] more than once"]),
    "layers_bool": ([True], {}, ["layers must hold integers"]),
    "layers_negative": ([-1], {}, ["layers must hold integers"]),
    "layers_float": ([1.0], {}, ["layers must hold integers"]),
    "layers_huge": ([1 << 40], {}, ["layers must hold integers"]),
}
# fmt: on


@pytest.mark.parametrize("name", sorted(LAYER_REFUSALS))
def test_layer_refusals(
    name: str, deepseek_module: Any, tmp_path: Path, no_reads: list[str]
) -> None:
    layers, change, words = LAYER_REFUSALS[name]
    tensors = with_mtp_layer() if name == "mtp_layer" else deepseek_tensors()
    path = save_numpy(tmp_path / "ck", tensors, DEEPSEEK_CONFIG | change)
    message = refused(deepseek_module, path, no_reads, layers=layers)
    for word in words:
        assert word in message, f"{word!r} not in: {message}"


def test_mtp_layer_is_left_out(deepseek_module: Any, tmp_path: Path) -> None:
    """DeepSeek-V3's multi-token-prediction module (layer num_hidden_layers) is no decoder layer."""
    config = DEEPSEEK_CONFIG | {"num_nextn_predict_layers": 1}
    path = save_numpy(tmp_path / "ck", with_mtp_layer(), config)
    assert find_moe_layers(path) == (1,)
    loaded = load_model_params(deepseek_module, path, mesh=one_device_mesh(deepseek_module))
    assert list(loaded) == [1]


def test_bad_stacked_and_family(deepseek_module: Any, tmp_path: Path, no_reads: list[str]) -> None:
    path = save_numpy(tmp_path / "ck", deepseek_tensors(), DEEPSEEK_CONFIG)
    assert "stacked must be True or False" in refused(deepseek_module, path, no_reads, stacked=1)
    assert "pass family='deepseek_v3'" in refused(deepseek_module, path, no_reads, family="mixtral")


def three_mixtral_layers() -> dict[str, np.ndarray]:
    return {k: v for i in range(3) for k, v in mixtral_tensors(layer=i, seed=i).items()}


def test_a_layer_that_does_not_fit_stops_every_read(tmp_path: Path, no_reads: list[str]) -> None:
    """Layers 0 and 1 fit, layer 2 misses a tensor: nothing of layers 0 and 1 is read either."""
    module = module_for(CASES["mixtral"].spec, tmp_path)
    tensors = three_mixtral_layers()
    del tensors["model.layers.2.block_sparse_moe.experts.3.w1.weight"]
    path = save_numpy(tmp_path / "ck", tensors, MIXTRAL_CONFIG | {"num_hidden_layers": 3})
    message = refused(module, path, no_reads)
    assert "layer 2" in message and "experts.3.w1.weight is missing" in message


def test_without_layer_count_the_tensors_say(tmp_path: Path) -> None:
    """No num_hidden_layers (or no config.json at all): the layers holding experts, in order."""
    module = module_for(CASES["mixtral"].spec, tmp_path)
    tensors = {**mixtral_tensors(layer=3), **mixtral_tensors(layer=1, seed=1)}
    for config in (MIXTRAL_CONFIG, None):
        path = save_numpy(tmp_path / f"ck_{config is None}", tensors, config)
        assert find_moe_layers(path, family="mixtral") == (1, 3)
        loaded = load_model_params(module, path, family="mixtral", mesh=one_device_mesh(module))
        assert list(loaded) == [1, 3]
        router = tensors["model.layers.3.block_sparse_moe.gate.weight"].T
        np.testing.assert_array_equal(np.asarray(loaded[3]["router"]), router)


def _qwen_markers(layers: list[int]) -> dict[str, np.ndarray]:
    """Just the key that makes a layer an MoE layer (enough to find the layers, not to load)."""
    return {
        f"model.layers.{i}.mlp.experts.down_proj": np.zeros((8, EMBED, FFN), np.float32)
        for i in layers
    }


# fmt: off
@pytest.mark.parametrize(("family", "config", "words"), [
    ("qwen2_moe", {"mlp_only_layers": [7]},
     "mlp_only_layers lists 7, which is not the model's 4 layers"),
    ("qwen2_moe", {"mlp_only_layers": "0"}, "mlp_only_layers must be a list of layer indices"),
    ("qwen2_moe", {"mlp_only_layers": [True]}, "mlp_only_layers lists True"),
    ("qwen2_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step must be an integer in [1,"),
    ("llama4", {"moe_layers": [1, -3]}, "moe_layers lists -3"),
    ("deepseek_v4", {"mlp_layer_types": ["moe"]},
     "mlp_layer_types lists 1 layers but the model has 4"),
    ("deepseek_v4", {"mlp_layer_types": ["moe", "dense", "moe", 3]},
     "mlp_layer_types must be a list of strings"),
    ("deepseek_v4", {"mlp_layer_types": ["moe", "sparse", "moe", "moe"]},
     "has ['sparse']; known: moe, hash_moe"),
])
# fmt: on
def test_malformed_layer_lists(
    family: str, config: dict[str, Any], words: str, tmp_path: Path
) -> None:
    path = save_numpy(
        tmp_path / "ck",
        _qwen_markers([0, 1, 2, 3]),
        {"model_type": family, "num_hidden_layers": 4} | config,
    )
    with pytest.raises(CheckpointError) as error:
        find_moe_layers(path)
    assert words in str(error.value) and "config.json" in str(error.value), str(error.value)


def test_hash_routed_layers_are_left_out_and_refused(tmp_path: Path, no_reads: list[str]) -> None:
    module = module_for(CASES["deepseek_v4"].spec, tmp_path)
    config = {"model_type": "deepseek_v4", "num_hidden_layers": 3}
    path = save_numpy(
        tmp_path / "ck",
        _qwen_markers([0, 1, 2]),
        config | {"mlp_layer_types": ["hash_moe", "moe", "moe"]},
    )
    assert find_moe_layers(path) == (1, 2)
    message = refused(module, path, no_reads, layers=[0])
    assert "layer 0 is hash-routed" in message and "top-k layers are 1-2" in message


# -- sharded over 8 fake CPU devices: each device reads only its region of each layer ------------

CHILD = textwrap.dedent(
    """
    import importlib.util, sys
    import jax, numpy as np
    from moegen.checkpoints import load_model_params, reader

    reads, calls = [], []
    read, make = reader.Checkpoint.read, jax.make_array_from_callback

    def read_counted(self, key, index):
        out = read(self, key, index)
        reads.append(out.size)
        return out

    def make_counted(shape, sharding, callback):
        def counted(index):
            before = len(reads)
            out = callback(index)
            calls.append((sum(reads[before:]), out.size))
            return out
        return make(shape, sharding, counted)

    reader.Checkpoint.read = read_counted
    jax.make_array_from_callback = make_counted
    module_path, checkpoint, expected_path = sys.argv[1:]
    spec = importlib.util.spec_from_file_location("sharded", module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sharded"] = module
    spec.loader.exec_module(module)
    mesh = module.make_mesh()
    expected = np.load(expected_path)
    for stacked in (False, True):
        reads.clear(), calls.clear()
        out = load_model_params(module, checkpoint, mesh=mesh, stacked=stacked)
        arrays = out.params if stacked else {
            f"{layer}.{name}": array for layer, params in out.items()
            for name, array in params.items()
        }
        sizes = 0
        for key, array in arrays.items():
            name = key.split(".")[-1]
            spec = module.PARAM_SPECS[name]
            assert array.sharding.spec == (jax.sharding.PartitionSpec(None, *spec) if stacked else spec)
            want = expected[name] if stacked else expected[name][int(key.split(".")[0])]
            np.testing.assert_array_equal(np.asarray(array), want, err_msg=key)
            sizes += array.size
        # each callback that read read exactly its shard, and nothing was read twice
        assert all(read == shard for read, shard in calls if read), calls
        assert sum(reads) == sizes, (sum(reads), sizes)
        print("stacked" if stacked else "by layer", len([c for c in calls if c[0]]), "reads")
    print("all ok")
    """
)


def test_each_device_reads_only_its_region_of_each_layer(tmp_path: Path) -> None:
    sharded = {"axes": {"fsdp": 2, "expert": 4}, "strategy": "ragged_all_to_all", "batch": 8}
    module = module_for(spec_yaml(SPEC_BASE | CASES["mixtral"].spec | sharded), tmp_path)
    assert module.NUM_DEVICES == 8
    tensors = three_mixtral_layers()
    path = save_numpy(tmp_path / "ck", tensors, MIXTRAL_CONFIG | {"num_hidden_layers": 3})
    p = "model.layers.{}.block_sparse_moe."
    stack = lambda key: np.stack([tensors[p.format(i) + key] for i in range(3)])  # noqa: E731
    experts = lambda w: np.stack(  # noqa: E731  [L, E, F, D] -> [L, E, D, F]
        [stack(f"experts.{e}.{w}.weight") for e in range(8)], axis=1
    ).swapaxes(2, 3)
    expected = {"router": stack("gate.weight").swapaxes(1, 2), "w_gate": experts("w1")}
    np.savez(tmp_path / "expected.npz", **expected, w_up=experts("w3"), w_down=experts("w2"))
    (tmp_path / "child.py").write_text(CHILD)
    env = os.environ | {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    args = [str(tmp_path / "child.py"), module.__file__, str(path), str(tmp_path / "expected.npz")]
    result = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert result.returncode == 0 and "all ok" in result.stdout, result.stdout + result.stderr
    # the weights really were split: 8 regions (expert 4 x fsdp 2) of each expert weight and 2
    # (fsdp) of the router, 26 a layer: read once per layer, or once for the stacked arrays
    assert "by layer 78 reads" in result.stdout and "stacked 26 reads" in result.stdout
