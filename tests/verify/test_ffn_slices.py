"""memory.ffn_chunks: the expert FFN in slices of its width, run one at a time (lax.scan) and
recomputed in the backward pass, through the whole pipeline: validate, plan, render, and the
verify step's twin parity (forward, aux and every gradient) against the dense reference.

The memory it saves is measured on the TPU compile of the reference spec
(specs/mixtral_8x7b_ep_a2a_v5e.yaml, `moegen build` and bench/RESULTS.md); here, that each
strategy and kernel computes the same layer with slices as without; that every kernel x
strategy x slicing renders (each kernel template defines every macro the others call); and
that a te module in slices computes the layer, with TE's GEMM stood in by ragged_dot.
"""

from __future__ import annotations

import ast
import copy
import os
import re
from pathlib import Path

import jinja2
import jinja2.nodes
import pytest
import yaml
from conftest import assert_twin_parity

import moegen.verify.verification
from moegen.hardware import hardware
from moegen.kernels import KERNEL_NAMES
from moegen.load import load_spec_bytes
from moegen.pipeline import generate
from moegen.plan import make_plan
from moegen.plan.memory import TRADE_HEADROOM
from moegen.render import render
from moegen.validate import validate
from moegen.verify import verify
from moegen.verify.twin import TOLERANCES

REPO_ROOT = Path(__file__).resolve().parents[2]
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
    # a tensor axis: each shard sums its own FFN columns' share (found by bench.population)
    "a2a_tensor_bias_2_slices": {
        "layer": {"num_experts": 8, "embed_dim": 32, "ffn_dim": 48, "ffn_bias": True},
        "mesh": {"axes": {"expert": 2, "tensor": 2}},
        "parallelism": {"experts": "ragged_all_to_all"},
        "memory": {"ffn_chunks": 2},
    },
    "replicated_tensor_fsdp_3_slices": {
        "mesh": {"axes": {"fsdp": 2, "tensor": 2}},
        "memory": {"ffn_chunks": 3, "token_chunks": 2},
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
@pytest.mark.slow
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
    # the forward pass whole where the ledger says so (tests/verify/test_sliced_forward.py)
    assert ("def _whole_forward(" in source) == generated.plan.ffn.whole_forward

    report = verify(generated.loaded, generated.source, run_compiles=False)
    assert_twin_parity(report)


def test_cases_run_the_forward_pass_both_whole_and_in_slices() -> None:
    whole = {name: _plan(_spec(case)).ffn.whole_forward for name, case in CASES.items()}
    assert set(whole.values()) == {True, False}, whole


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
    assert _plan(small).ffn.chunks == 1  # 6 GiB of 16: no recomputation

    large = _reference_spec(batch=32)  # 4x the tokens: the whole FFN needs > 16 GiB
    # one token chunk: left open, 4 token chunks keep the headroom and are faster by the
    # plan's step time (tests/plan/test_token_chunks_default.py), and the plan takes those
    large["memory"] = {"token_chunks": 1}
    plan = _plan(large)
    options = {o.chunks: o.train_peak for o in plan.ffn.chunk_options}
    assert options[1] > hbm
    assert plan.ffn.chunks > 1 and plan.memory.train_peak <= hbm * (1 - TRADE_HEADROOM)
    # the fewest slices that fit with the ledger's headroom
    roomy = hbm * (1 - TRADE_HEADROOM)
    assert all(peak > roomy for count, peak in options.items() if count < plan.ffn.chunks)
    assert plan.cost.recompute_flops > 0
    assert plan.roofline.passes[1].kernel_flops == (
        3 * plan.roofline.passes[0].kernel_flops + plan.cost.recompute_flops
    )


# ---------------------------------------------------------------------------------------
# Every kernel x strategy x FFN slicing renders: the sliced FFN, the ring's overlapped calls
# and the whole FFN each call kernel macros that every kernel template must define.

TEMPLATES = REPO_ROOT / "templates"
# kernel (and quantization) -> an example spec of 8 devices using it
KERNEL_BASES = {
    "xla": "mixtral_small_cpu",
    "pallas": "mixtral_8x7b_v5e",
    "te": "mixtral_8x7b_h100",
    "te-fp8": "mixtral_8x7b_ep_h100_fp8",
    "te-mxfp8": "qwen3_30b_a3b_b200_mxfp8",
}
# strategy -> (mesh axes over the 8 devices, parallelism)
STRATEGIES = {
    "replicated": ({"data": 2, "fsdp": 4}, {"experts": "replicated"}),
    "ragged_all_to_all": ({"fsdp": 2, "expert": 4}, {"experts": "ragged_all_to_all"}),
    "ring_of_experts": ({"fsdp": 2, "expert": 4}, {"experts": "ring_of_experts"}),
    "ring_overlapped": (
        {"fsdp": 2, "expert": 4},
        {"experts": "ring_of_experts", "overlap_chunks": 2},
    ),
}
# activation, ffn_bias: the gated layer (gate and up side by side) and the plain one with biases
LAYERS = {"swiglu": ("swiglu", False), "relu_bias": ("relu", True)}
COMBINATIONS = [
    pytest.param(kernel, strategy, chunks, layer, id=f"{kernel}-{strategy}-{chunks}-{layer}")
    for kernel in KERNEL_BASES
    for strategy in STRATEGIES
    for chunks in (1, 2)
    for layer in LAYERS
    # ffn_chunks_without_overlap: the overlapped ring already slices the embedding
    if not (strategy == "ring_overlapped" and chunks > 1)
]


def _kernel_macros(path: Path) -> set[str]:
    tree = jinja2.Environment().parse(path.read_text(encoding="utf-8"))
    # a macro named with a leading underscore is the kernel's own helper, private to it
    return {m.name for m in tree.find_all(jinja2.nodes.Macro) if not m.name.startswith("_")}


def test_every_kernel_defines_every_macro_the_templates_call() -> None:
    kernels = {path.stem: _kernel_macros(path) for path in (TEMPLATES / "kernels").glob("*.jinja")}
    assert set(kernels) == set(KERNEL_NAMES)
    called = {
        name
        for path in TEMPLATES.rglob("*.jinja")
        for name in re.findall(r"\bkernel\.(\w+)\(", path.read_text(encoding="utf-8"))
    }
    assert "grouped_matmul" in called  # one macro; the result dtype is an argument
    for kernel, macros in kernels.items():
        assert called <= macros, f"kernels/{kernel}.jinja lacks {sorted(called - macros)}"
    assert len({frozenset(macros) for macros in kernels.values()}) == 1, kernels


# The slices' down projection through TE: rounded to the compute dtype by TE's GEMM (its VJP
# returns its inputs' dtype), widened for the float32 sum.
TE_DOWN_SLICE = '_te_grouped_matmul(hidden, weights["w_down"], group_sizes).astype(jnp.float32)'


@pytest.mark.parametrize(("kernel", "strategy", "chunks", "layer"), COMBINATIONS)
def test_every_kernel_strategy_and_slicing_renders(kernel, strategy, chunks, layer) -> None:
    spec = yaml.safe_load((REPO_ROOT / "specs" / f"{KERNEL_BASES[kernel]}.yaml").read_text())
    axes, parallelism = STRATEGIES[strategy]
    activation, ffn_bias = LAYERS[layer]
    spec["layer"].update(activation=activation, ffn_bias=ffn_bias)
    spec["mesh"] = {"axes": axes}
    spec["parallelism"] = parallelism
    spec["memory"] = {"ffn_chunks": chunks}
    plan = _plan(spec)  # every combination listed validates
    assert (plan.kernel.name, plan.experts.strategy, plan.ffn.chunks) == (
        kernel.split("-")[0],
        parallelism["experts"],
        chunks,
    )
    source = render(plan)  # formatted and linted by ruff, or RenderError
    ast.parse(source)
    assert ("FFN_CHUNKS = 2" in source) == (chunks == 2)
    if chunks == 2 and kernel.startswith("te"):
        # the slices' down projections are summed in float32, through TE
        assert TE_DOWN_SLICE in source


# ---------------------------------------------------------------------------------------
# kernel te in FFN slices: the twin parity (kernel xla in TE's place, as `moegen build` runs
# it), and the te module's own code around TE's GEMM against the dense reference, with a
# stand-in Transformer Engine whose grouped_dense is jax.lax.ragged_dot (TE needs a GPU).

FAKE_TE = {
    "transformer_engine/__init__.py": "",
    "transformer_engine/jax/__init__.py": "",
    "transformer_engine/jax/dense.py": '''
import jax


def grouped_dense(x, kernel, group_sizes, preferred_element_type=None, quantizer_set=None):
    """TE's grouped GEMM as the ragged_dot it computes: rows of group g times kernel[g]."""
    return jax.lax.ragged_dot(x, kernel, group_sizes, preferred_element_type=preferred_element_type)
''',
    "transformer_engine/jax/quantize.py": """
class QuantizerSet:
    pass


noop_quantizer_set = QuantizerSet()


class ScalingMode:
    CURRENT_TENSOR_SCALING = "current tensor scaling"
    MXFP8_1D_SCALING = "mxfp8 1d scaling"


class QuantizerFactory:
    @staticmethod
    def create_set(**options):
        return QuantizerSet()  # no quantization: the parity is the float32 one
""",
}


@pytest.mark.slow
def test_te_example_in_ffn_slices_builds_and_its_twin_matches(tmp_path, monkeypatch) -> None:
    spec = yaml.safe_load((REPO_ROOT / "specs/mixtral_8x7b_h100.yaml").read_text())
    spec["memory"] = {"ffn_chunks": 2}
    path = tmp_path / "te_slices.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    generated = generate(Path(path.name))
    assert generated.plan.ffn.chunks == 2 and "FFN_CHUNKS = 2" in generated.source
    report = verify(generated.loaded, generated.source, run_compiles=False)
    parity = [step for step in report.steps if step["step"].startswith("twin parity")]
    assert len(parity) == 2, report.steps  # float32, and bfloat16 compute
    for step in parity:
        bound = (
            TOLERANCES["float32"] if step["step"].endswith("(float32)") else TOLERANCES["bfloat16"]
        )
        assert all(case["max_relative_error"] < bound for case in step["cases"]), step


@pytest.mark.parametrize(
    ("hardware", "quantization", "axes", "strategy"),
    [
        ("gpu-h100", "none", {"fsdp": 8}, "replicated"),
        ("gpu-h100", "fp8", {"fsdp": 2, "expert": 4}, "ragged_all_to_all"),
        ("gpu-b200", "mxfp8", {"data": 2, "fsdp": 4}, "replicated"),
    ],
)
@pytest.mark.slow
def test_te_module_in_ffn_slices_matches_the_dense_reference(
    hardware, quantization, axes, strategy, tmp_path, monkeypatch
) -> None:
    """The te module itself (rows zeroed past the groups, or moved into the group-aligned
    buffer and back, and the float32 down projection of each slice), with TE's GEMM stood in."""
    for name, text in FAKE_TE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    )
    spec = _spec(
        {
            "layer": {"num_experts": 8, "embed_dim": 64, "ffn_dim": 256},
            "shapes": {"batch": 16, "seq_len": 5},
            "mesh": {"axes": axes},
            "parallelism": {"experts": strategy},
            "target": {
                "hardware": hardware,
                "topology": 8,
                "kernel": "te",
                "quantization": quantization,
            },
            "memory": {"ffn_chunks": 2},
        }
    )
    loaded = validate(load_spec_bytes(yaml.safe_dump(spec).encode(), "te.yaml", "te"))
    plan = make_plan(loaded, interpret=True)
    source = render(plan)
    assert "from transformer_engine.jax import dense as te_dense" in source
    assert TE_DOWN_SLICE in source
    # the te module itself as the twin: verify renders it from this spec, kernel te kept
    monkeypatch.setattr(moegen.verify.verification, "_twins", lambda _: [("float32", loaded, 1e-5)])
    report = verify(loaded, source, run_compiles=False)
    [parity] = [step for step in report.steps if step["step"].startswith("twin parity")]
    assert {case["case"] for case in parity["cases"]} == {"random routing", "starved experts"}
    assert all(case["max_relative_error"] < 1e-5 for case in parity["cases"]), parity
