"""moegen.checkpoints sharded: on 8 fake CPU devices (a child process) every parameter is
sharded by PARAM_SPECS and each device's callback reads only its own region, for the
per-expert, fused, merged (DBRX) and interleaved (gpt-oss) layouts; and each source's region
arithmetic on its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from checkpoint_cases import (
    CASES,
    EMBED,
    FFN,
    SPEC_BASE,
)
from checkpoint_helpers import (
    deepseek_tensors,
    module_for,
    save_numpy,
)
from spec_builder import spec_yaml
from tpu_cases import fake_cpu_env

from moegen.families import PARAM_AXES, Source, Split

# the `checkpoints` extra; every test here writes or reads safetensors files
pytest.importorskip("safetensors", reason="moegen.checkpoints needs moegen[checkpoints]")


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


# Draws float32 normal samples of the given shape, in call order from one seeded generator.
Normal = Callable[..., np.ndarray]
# (checkpoint tensors by key, each moegen parameter's expected value)
Checkpoint = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]


def _sharded_case(
    tmp_path: Path,
    name: str,
    spec: dict,
    family: str,
    checkpoint: Checkpoint,
    run: bool = False,
) -> dict[str, Any]:
    """Render the sharded module of `spec`, save the checkpoint and expected values; CHILD's
    description of the case (`run`: also run the layer on the loaded parameters)."""
    tensors, expected = checkpoint
    module = module_for(spec_yaml(SPEC_BASE | spec | SHARDED), tmp_path)
    assert module.NUM_DEVICES == 8
    np.savez(tmp_path / f"{name}.npz", **expected)
    return {
        "name": name,
        "module": module.__file__,
        "checkpoint": str(save_numpy(tmp_path / name, tensors, None)),
        "family": family,
        "expected": str(tmp_path / f"{name}.npz"),
        "run": run,
    }


def _mixtral_checkpoint(normal: Normal, router: np.ndarray) -> Checkpoint:
    """Mixtral, per expert: w1 (gate), w3 (up), w2 (down), each [out, in]."""
    w1, w3, w2 = normal(8, FFN, EMBED), normal(8, FFN, EMBED), normal(8, EMBED, FFN)
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
    return tensors, mixtral


def _dbrx_checkpoint(normal: Normal, router: np.ndarray) -> Checkpoint:
    """DBRX: experts merged into the rows, [E * F, D], down not transposed."""
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
    return tensors, dbrx


def _gpt_oss_checkpoint(normal: Normal, router: np.ndarray) -> Checkpoint:
    """gpt-oss: gate and up interleaved in [E, D, 2F] and [E, 2F]."""
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
    return tensors, gpt_oss


def _deepseek_v3_checkpoint() -> Checkpoint:
    """DeepSeek-V3, fused, with its selection bias and shared expert."""
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
    return tensors, deepseek


def _sharded_cases(tmp_path: Path) -> list[dict[str, Any]]:
    """Per-expert (Mixtral), merged (DBRX), interleaved (gpt-oss) and fused (DeepSeek-V3)
    checkpoints, written by hand, with each parameter's expected value computed here."""
    rng = np.random.default_rng(7)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    # One router for the three hand-made layouts; the list is built, and the generator drawn,
    # in order: the expected values depend on it.
    router = normal(8, EMBED)
    renormalize = {"renormalize": True}
    gpt_oss_spec = {"score_after_top_k": True, "ffn_bias": True}
    deepseek_spec = dict(CASES["deepseek_v3"].spec)
    return [
        _sharded_case(
            tmp_path,
            "mixtral",
            renormalize,
            "mixtral",
            _mixtral_checkpoint(normal, router),
            run=True,
        ),
        _sharded_case(tmp_path, "dbrx", renormalize, "dbrx", _dbrx_checkpoint(normal, router)),
        _sharded_case(
            tmp_path, "gpt_oss", gpt_oss_spec, "gpt_oss", _gpt_oss_checkpoint(normal, router)
        ),
        _sharded_case(
            tmp_path, "deepseek_v3", deepseek_spec, "deepseek_v3", _deepseek_v3_checkpoint()
        ),
    ]


@pytest.mark.slow
def test_each_device_reads_only_its_region(tmp_path: Path) -> None:
    cases = _sharded_cases(tmp_path)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "child.py").write_text(CHILD)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), str(tmp_path / "cases.json")],
        capture_output=True,
        text=True,
        env=fake_cpu_env(8),
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


def test_a_key_can_climb_from_the_block_to_its_layer() -> None:
    """A.X-K1's checkpoints keep the block's output norm in the decoder layer, beside it."""
    from moegen.families import full_key

    block = "model.language_model.layers.3.mlp."
    assert full_key(block, "experts.0.up_proj.weight") == block + "experts.0.up_proj.weight"
    assert full_key(block, "../post_mlp_layernorm.weight") == (
        "model.language_model.layers.3.post_mlp_layernorm.weight"
    )
