"""Spec choices, targets and helpers shared by the tests of stage 3, `moegen.plan`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spec_builder import spec_yaml

from moegen.load import LoadedSpec, load_spec_bytes
from moegen.plan import Plan, format_plan, make_plan
from moegen.validate import validate

REPO_ROOT = Path(__file__).resolve().parents[2]
BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class Shape:
    experts: int
    embed: int
    ffn: int
    top_k: int
    batch: int
    seq: int
    params: str
    compute: str
    score: str = "softmax"
    renormalize: bool = True


SHAPES = {
    "mixtral-8x7b": Shape(8, 4096, 14336, 2, 16, 4096, "float32", "bfloat16"),
    "qwen3-30b-a3b": Shape(128, 2048, 768, 8, 16, 4096, "bfloat16", "bfloat16"),
    "deepseek-v3-routed": Shape(256, 7168, 2048, 8, 16, 4096, "float32", "bfloat16", "sigmoid"),
    "tiny-top1": Shape(4, 64, 128, 1, 16, 128, "float32", "float32", "sigmoid", False),
}


def shape_choices(shape: Shape) -> dict[str, Any]:
    """The spec_builder choices of a plan test's layer, router, shapes and dtypes."""
    return {
        "description": "plan test",
        "experts": shape.experts,
        "embed": shape.embed,
        "ffn": shape.ffn,
        "top_k": shape.top_k,
        "score": shape.score,
        "renormalize": shape.renormalize,
        "batch": shape.batch,
        "seq_len": shape.seq,
        "params_dtype": shape.params,
        "compute_dtype": shape.compute,
    }


def spec_text(
    shape: Shape, axes: dict[str, int], batch_axes: list[str] | None, **choices: Any
) -> str:
    """The spec of `shape` on a mesh of `axes`, with more spec_builder `choices`."""
    mesh: dict[str, Any] = {"axes": axes}
    if batch_axes is not None:
        mesh["batch_axes"] = batch_axes
    return spec_yaml(shape_choices(shape) | mesh | choices)


def loaded(shape: Shape, axes: dict[str, int], batch_axes: list[str] | None) -> LoadedSpec:
    raw = spec_text(shape, axes, batch_axes).encode()
    return validate(load_spec_bytes(raw, "specs/plan_case.yaml", "plan_case"))


EXAMPLE = "specs/mixtral_small_cpu.yaml"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MOEGEN_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "moegen", *args],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


TPU_EXAMPLE = "specs/mixtral_8x7b_v5e.yaml"


def tpu_spec(
    hardware: str,
    topology: str,
    axes: dict[str, int],
    *,
    kernel: str = "pallas",
    shape: Shape = SHAPES["mixtral-8x7b"],
    tiles: dict[str, list[int]] | None = None,
) -> LoadedSpec:
    target = {"hardware": hardware, "topology": topology, "kernel": kernel}
    if tiles is not None:
        target["tiles"] = tiles
    raw = spec_text(shape, axes, None, **target).encode()
    return validate(load_spec_bytes(raw, "specs/plan_case.yaml", "plan_case"))


# name -> (hardware, topology, mesh axes, libtpu topology name, chips per host)
TPU_TARGETS = {
    "v5e-2x4": ("tpu-v5e", "2x4", {"fsdp": 8}, "v5e:2x4", (2, 4, 1)),
    "v6e-4x4": ("tpu-v6e", "4x4", {"data": 4, "fsdp": 4}, "v6e:4x4", (2, 4, 1)),
    "v5p-2x2x2": ("tpu-v5p", "2x2x2", {"data": 2, "fsdp": 4}, "v5p:2x2x2", (2, 2, 1)),
    "tpu7x-2x2x1": ("tpu7x", "2x2x1", {"fsdp": 8}, "tpu7x:2x2x1", (2, 2, 1)),
}


def tokens_line(plan: Plan) -> str:
    [line] = [
        line for line in format_plan(plan).splitlines() if line.startswith("  tokens/device ")
    ]
    return line


def feature_plan(
    *,
    experts: int = 8,
    embed: int = 64,
    ffn: int = 32,
    top_k: int = 2,
    batch: int = 16,
    seq: int = 64,
    axes: dict[str, int] | None = None,
    layer: dict | None = None,
    router: dict | None = None,
    parallelism: dict | None = None,
    compute: str = "float32",
    memory: dict | None = None,
) -> Plan:
    """The plan of a spec written as JSON (a YAML flow mapping), float32 parameters."""
    data = {
        "version": 1,
        "layer": {"num_experts": experts, "embed_dim": embed, "ffn_dim": ffn, **(layer or {})},
        "router": {"top_k": top_k, **(router or {})},
        "shapes": {"batch": batch, "seq_len": seq},
        "dtypes": {"params": "float32", "compute": compute},
        "mesh": {"axes": axes or {"data": 2}},
    }
    if parallelism:
        data["parallelism"] = parallelism
    if memory:
        data["memory"] = memory
    raw = json.dumps(data).encode()
    return make_plan(validate(load_spec_bytes(raw, "specs/plan_case.yaml", "plan_case")))


def capacity(factor: float, drop: str = "probability") -> dict:
    """Router settings for a capacity, with the load-balancing loss validation asks for."""
    return {"load_balance_loss": 0.01, "capacity": {"factor": factor, "drop": drop}}


A2A = {"experts": "ragged_all_to_all"}
RING = {"experts": "ring_of_experts"}


# name: (shape, local shape, partition, gathered dim, use dtype, init std)
ParamRow = tuple[tuple[int, ...], tuple[int, ...], tuple, int | None, str, float]


def param_rows(plan: Plan) -> dict[str, ParamRow]:
    return {
        p.name: (p.shape, p.local_shape, p.partition, p.gather_axis, p.use_dtype, p.init_scale)
        for p in plan.params
    }
