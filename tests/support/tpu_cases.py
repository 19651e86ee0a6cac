"""Small pallas specs, fake-CPU environments and child-output helpers shared by the TPU target's tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from spec_builder import spec_yaml

FLOAT32_STEP = "twin parity (float32)"


def pallas_yaml(
    *,
    top_k: int = 2,
    score: str = "softmax",
    renormalize: bool = True,
    num_experts: int = 8,
    embed_dim: int = 256,
    ffn_dim: int = 512,
    batch: int = 4,
    seq_len: int = 64,
    axes: dict[str, int] | None = None,
    topology: str = "2x2",
    dtypes: tuple[str, str] = ("float32", "float32"),
    tiles: tuple[list[int], list[int]] | None = None,
) -> str:
    """A small pallas spec on tpu-v5e (2x2, mesh data 2 x fsdp 2 unless told otherwise)."""
    choices: dict[str, Any] = {
        "description": "Small megablox layer for the TPU tests.",
        "experts": num_experts,
        "embed": embed_dim,
        "ffn": ffn_dim,
        "top_k": top_k,
        "score": score,
        "renormalize": renormalize,
        "batch": batch,
        "seq_len": seq_len,
        "params_dtype": dtypes[0],
        "compute_dtype": dtypes[1],
        "axes": axes or {"data": 2, "fsdp": 2},
        "hardware": "tpu-v5e",
        "topology": topology,
        "kernel": "pallas",
    }
    if tiles:
        choices["tiles"] = {"gate_up": tiles[0], "down": tiles[1]}
    return spec_yaml(choices)


def write_spec(root: Path, name: str, text: str) -> Path:
    path = root / "specs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def fake_cpu_env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONIOENCODING"] = "utf-8"
    # As moegen's own worker does: compile-only libtpu, shared with other processes.
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    return env


def last_json(stdout: str) -> dict:
    """The last JSON object a child printed (libraries may print other lines)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in:\n{stdout}")
