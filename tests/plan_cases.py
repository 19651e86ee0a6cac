"""Spec builders, targets and helpers shared by the tests of stage 3, `moegen.plan`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from moegen.load import LoadedSpec, load_spec_bytes
from moegen.plan import Plan, format_plan, make_plan
from moegen.validate import validate

REPO_ROOT = Path(__file__).resolve().parent.parent
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


def spec_text(shape: Shape, axes: dict[str, int], batch_axes: list[str] | None) -> str:
    mesh = "\n".join(f"    {name}: {size}" for name, size in axes.items())
    listed = f"  batch_axes: [{', '.join(batch_axes)}]\n" if batch_axes is not None else ""
    return f"""\
version: 1
description: plan test
layer:
  num_experts: {shape.experts}
  embed_dim: {shape.embed}
  ffn_dim: {shape.ffn}
router:
  top_k: {shape.top_k}
  score: {shape.score}
  renormalize: {"true" if shape.renormalize else "false"}
shapes:
  batch: {shape.batch}
  seq_len: {shape.seq}
dtypes:
  params: {shape.params}
  compute: {shape.compute}
mesh:
  axes:
{mesh}
{listed}"""


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
    tiles: str = "",
) -> LoadedSpec:
    target = f"target:\n  hardware: {hardware}\n  topology: {topology}\n  kernel: {kernel}\n"
    raw = (spec_text(shape, axes, None) + target + tiles).encode()
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
